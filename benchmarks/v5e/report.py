"""The tables of `benchmarks/results/v5e/v5e.md`, from what `run.py` wrote.

    python benchmarks/v5e/report.py RAW OUT.md

RAW holds the deviceless run's files from the machine without a TPU
(`deviceless.json`, `hlo-deviceless.tar.gz`) and, once the chip has run, the
device's (`device.json`, `deviceless-there.json`, `hlo-device.tar.gz`). Every
figure is read from them (the estimates were made where each program was
compiled, by the static objective's model); nothing is compiled here. Without
the device's files the tables have their deviceless columns only.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
from pathlib import Path

from run import CHIP, VARIANTS, gib, hlo_name, hlo_texts, key  # beside this file

# The commands that wrote the files in benchmarks/results/v5e/raw (the device's
# on a lent machine, $OUT its output folder); change them with the files.
COMMANDS = {
    "deviceless": "python benchmarks/v5e/run.py deviceless benchmarks/results/v5e/raw",
    "device": "python3 benchmarks/v5e/run.py device $OUT",
}
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "peak_memory_in_bytes", "generated_code_size_in_bytes")
SHORT = {"argument_size_in_bytes": "arguments", "output_size_in_bytes": "outputs",
         "alias_size_in_bytes": "aliased", "temp_size_in_bytes": "temporaries",
         "peak_memory_in_bytes": "peak", "generated_code_size_in_bytes": "code"}


def load(raw: Path) -> dict:
    found = {}
    for label in ("deviceless", "deviceless-there", "device"):
        path = raw / f"{label}.json"
        found[label] = json.loads(path.read_text()) if path.exists() else None
    return found


_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
_CONFIG = "backend_config="


def normalized(hlo: str) -> str:
    """The HLO's computations without what says nothing of the program: the
    header's table of Python source lines, each op's `metadata={...}` (the
    line that made it), and the order of keys in `backend_config` JSON
    (which two processes of the same libtpu were seen to print differently).

    Example:
      'ROOT %r = f32[] add(%a, %b), metadata={op_name="x"}, backend_config={"b":1,"a":2}'
      → 'ROOT %r = f32[] add(%a, %b), backend_config={"a": 2, "b": 1}'
    """
    lines = hlo.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("%", "ENTRY"))), 0)
    out = []
    for line in lines[start:]:
        line = _METADATA.sub("", line)
        at = line.find(_CONFIG + "{")
        if at >= 0:
            try:
                config, end = json.JSONDecoder().raw_decode(line, at + len(_CONFIG))
                line = line[:at] + _CONFIG + json.dumps(config, sort_keys=True) + line[end:]
            except ValueError:
                pass  # not JSON: compared as printed
        out.append(line)
    return "\n".join(out)


def seconds(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def variants(found: dict, label: str) -> dict:
    return (found[label] or {}).get("variants", {})


def product(found: dict, label: str) -> dict:
    return (found[label] or {}).get("product", {})


def verdict(rec: dict | None) -> str:
    """What became of one variant's compile (and run): its peak, or why not."""
    if not rec:
        return "not run"
    if rec.get("skipped"):
        return f"skipped ({rec['skipped']})"
    if rec.get("refused"):
        return f"refused: `{rec['refused'].split('RESOURCE_EXHAUSTED: ')[-1][:200]}`"
    if rec.get("stage") in ("compile", "setup"):
        return f"failed: `{rec.get('error', '')[:140]}`"
    return f"fits, peak {gib(rec['memory'].get('peak_memory_in_bytes'))} GiB"


def run_verdict(rec: dict | None) -> str:
    if not rec or "memory" not in rec:
        return "-"
    if rec.get("stage") == "run":
        return f"failed: `{rec.get('error', '')[:140]}`"
    times = rec.get("step_times") or []
    return f"ran {len(times)} steps" if times else "-"


def pipeline_verdict(rec: dict | None) -> str:
    if not rec:
        return "not run"
    if rec.get("error") or rec.get("skipped"):
        return f"error: `{(rec.get('error') or rec.get('skipped'))[:140]}`"
    total = (rec.get("memory") or {}).get("total")
    text = rec["status"] + (f", total {gib(total)} GiB" if total else "")
    return text + (f": {rec['reason'][:240]}" if rec.get("reason") else "")


def about_table(found: dict) -> list[str]:
    lines = ["| figures | where | commit | jax | libtpu | device kind | platform version | mesh |",
             "|---|---|---|---|---|---|---|---|"]
    where = {"deviceless": "this machine, no TPU (JAX_PLATFORMS=cpu)",
             "deviceless-there": "the device's machine, no TPU opened (JAX_PLATFORMS=cpu)",
             "device": "the device's machine, the chip"}
    for label, place in where.items():
        about = (found[label] or {}).get("about")
        if about is None:
            lines.append(f"| {label} | {place} | not run | | | | | |")
            continue
        mesh = about.get("mesh", {})
        version = " ".join(str(mesh.get("platform_version", "-")).split())
        env = about.get("env", {})
        limit = about.get("memory_stats", {}).get("bytes_limit")
        if "target" in mesh:
            shape = f"`target_mesh({CHIP!r}, {{'dp': 1}})`: topology {mesh['target']['topology']}"
        elif "topology" in mesh:  # compiled before 32e99d4, for libtpu's topology directly
            shape = (f"{mesh['topology']}, chips_per_host_bounds "
                     f"{'x'.join(map(str, mesh.get('chips_per_host_bounds', [])))}")
        else:
            shape = (f"jax.devices()[:1] of {mesh.get('device_count')} on a "
                     f"{env.get('TPU_ACCELERATOR_TYPE', '?')} host (chips per host "
                     f"{env.get('TPU_CHIPS_PER_HOST_BOUNDS', '?')}); bytes_limit {gib(limit)} GiB")
        lines.append(f"| {label} | {place} | {(about.get('commit') or '-')[:7]} | "
                     f"{about['versions']['jax']} | "
                     f"{about['versions']['libtpu']} | {mesh.get('device_kind')} | {version} | "
                     f"{shape} |")
    return lines


def fit_table(found: dict) -> list[str]:
    lines = ["| variant | deviceless (here) | deviceless (there) | device: compile | device: "
             "run | allocator's high-water mark GiB | pipeline, deviceless (static) | "
             "pipeline, device (hybrid) |", "|---|---|---|---|---|---|---|---|"]
    seen = 0
    for name, knobs in VARIANTS:
        k = key(name, knobs)
        dev = variants(found, "device").get(k)
        mark = (dev or {}).get("peak_bytes_in_use")
        # The mark is the process's: it says this variant's peak only while it rises.
        mark_text = ("-" if mark is None else gib(mark) if mark > seen else
                     "(an earlier variant's)")
        seen = max(seen, mark or 0)
        lines.append(
            f"| {k} | {verdict(variants(found, 'deviceless').get(k))} | "
            f"{verdict(variants(found, 'deviceless-there').get(k))} | {verdict(dev)} | "
            f"{run_verdict(dev)} | {mark_text} | "
            f"{pipeline_verdict(product(found, 'deviceless').get(k))} | "
            f"{pipeline_verdict(product(found, 'device').get(k))} |")
    return lines


def byte_cell(a: dict | None, b: dict | None, field: str) -> str:
    """`=` with the figure when two memory analyses agree to the byte, else both."""
    x = (a or {}).get("memory", {}).get(field)
    y = (b or {}).get("memory", {}).get(field)
    if x is None or y is None:
        return gib(x if y is None else y)
    if x == y:
        return f"= {gib(x)}"
    change = f" ({y / x - 1:+.2%})" if x else ""
    return f"{gib(x)} / {gib(y)}{change} [{y - x:+d} B]"


def memory_table(found: dict, left: str, right: str) -> list[str]:
    lines = [f"| variant | {' | '.join(SHORT[f] + ' GiB' for f in FIELDS)} |",
             "|---|" + "---|" * len(FIELDS)]
    for name, knobs in VARIANTS:
        k = key(name, knobs)
        a, b = variants(found, left).get(k), variants(found, right).get(k)
        if not (a and "memory" in a and b and "memory" in b):
            continue
        lines.append(f"| {k} | " + " | ".join(byte_cell(a, b, f) for f in FIELDS) + " |")
    return lines


def program_table(found: dict, texts: dict[str, str], left: str, right: str) -> list[str]:
    lines = ["| variant | op kinds that differ (count: left → right) | instructions | XLA flops "
             "| XLA bytes accessed | HLO text equal / without metadata | compile s (CPU s) |",
             "|---|---|---|---|---|---|---|"]
    for name, knobs in VARIANTS:
        k = key(name, knobs)
        a, b = variants(found, left).get(k), variants(found, right).get(k)
        if not (a and "ops" in a and b and "ops" in b):
            continue
        ops_a, ops_b = a["ops"], b["ops"]
        differ = [f"{op} {ops_a.get(op, 0)} → {ops_b.get(op, 0)}"
                  for op in sorted(set(ops_a) | set(ops_b)) if ops_a.get(op, 0) != ops_b.get(op, 0)]
        plain = [op for op in ops_a if ":" not in op]

        def same(x, y) -> str:
            return f"= {x:.4g}" if x == y else f"{x:.4g} / {y:.4g}"

        ta, tb = texts.get(hlo_name(left, k)), texts.get(hlo_name(right, k))
        equal = "-" if ta is None or tb is None else (
            f"{'yes' if ta == tb else 'no'} / "
            f"{'yes' if normalized(ta) == normalized(tb) else 'no'}")
        compile_s = " / ".join(f"{r['compile_seconds']:.1f} ({r.get('compile_cpu_seconds', 0):.0f})"
                               for r in (a, b))
        lines.append(
            f"| {k} | {len(differ)}{': ' + '; '.join(differ[:6]) if differ else ''} | "
            f"{sum(ops_a[op] for op in plain)} / {sum(ops_b.get(op, 0) for op in plain)} | "
            f"{same(a['cost'].get('flops', 0), b['cost'].get('flops', 0))} | "
            f"{same(a['cost'].get('bytes accessed', 0), b['cost'].get('bytes accessed', 0))} | "
            f"{equal} | {compile_s} |")
    return lines


def measured(rec: dict | None) -> list[float]:
    return list((rec or {}).get("step_times") or [])


def time_table(found: dict) -> list[str]:
    lines = ["| variant | measured s/step: median (min–max of n) | estimate s, deviceless "
             "program: total = max(compute, memory) | estimate s, device program | libtpu's "
             "own estimate s (deviceless / device) | measured / estimate (device program) | "
             "pipeline: deviceless static / device hybrid's estimate / its measured median |",
             "|---|---|---|---|---|---|---|"]
    for name, knobs in VARIANTS:
        k = key(name, knobs)
        dl = variants(found, "deviceless").get(k) or {}
        dev = variants(found, "device").get(k) or {}
        times = measured(dev)
        e_dl, e_dev = dl.get("estimate") or {}, dev.get("estimate") or {}
        text = (f"{seconds(statistics.median(times))} ({seconds(min(times))}–"
                f"{seconds(max(times))}, n={len(times)})" if times else
                verdict(dev) if dev else "not run")
        ratio = (f"{statistics.median(times) / e_dev['total']:.2f}"
                 if times and e_dev.get("total") else "-")
        split = (f"{seconds(e_dl.get('total'))} = max({seconds(e_dl.get('compute'))}, "
                 f"{seconds(e_dl.get('memory'))})" if e_dl else "-")
        p_dl = product(found, "deviceless").get(k) or {}
        p_dev = product(found, "device").get(k) or {}
        lines.append(
            f"| {k} | {text} | {split} | {seconds(e_dev.get('total'))} | "
            f"{seconds(e_dl.get('compiler_seconds'))} / {seconds(e_dev.get('compiler_seconds'))} | "
            f"{ratio} | {seconds(p_dl.get('estimate'))} / {seconds(p_dev.get('estimate'))} / "
            f"{seconds(p_dev.get('value'))} |")
    return lines


def order(values: dict[str, float]) -> list[str]:
    return sorted(values, key=lambda k: values[k])


def concordant(a: dict[str, float], b: dict[str, float]) -> str:
    """Pairs two rankings order the same way, of all pairs."""
    pairs = list(itertools.combinations(a, 2))
    same = sum((a[x] - a[y]) * (b[x] - b[y]) > 0 for x, y in pairs)
    return f"{same}/{len(pairs)}"


def rank_table(found: dict) -> list[str]:
    lines = ["| workload | ranked by | order, fastest first (s) | same order as measured? "
             "(pairs agreeing) |", "|---|---|---|---|"]
    for name in dict.fromkeys(n for n, _ in VARIANTS):
        keys = [key(n, knobs) for n, knobs in VARIANTS if n == name]
        dev = variants(found, "device")
        ran = {k: statistics.median(measured(dev.get(k))) for k in keys if measured(dev.get(k))}
        dl = variants(found, "deviceless")
        rankings = {
            "measured on the chip": ran,
            "estimate, deviceless program": {
                k: dl[k]["estimate"]["total"] for k in keys
                if (dl.get(k) or {}).get("estimate")},
            "estimate, device program": {
                k: dev[k]["estimate"]["total"] for k in keys
                if (dev.get(k) or {}).get("estimate")},
            "libtpu's own estimate, deviceless program": {
                k: dl[k]["estimate"]["compiler_seconds"] for k in keys
                if ((dl.get(k) or {}).get("estimate") or {}).get("compiler_seconds")},
            "pipeline: deviceless static": {
                k: r["value"] for k, r in product(found, "deviceless").items()
                if k in keys and r.get("value") is not None},
            "pipeline: device hybrid, measured": {
                k: r["value"] for k, r in product(found, "device").items()
                if k in keys and r.get("value") is not None},
        }
        for how, values in rankings.items():
            if not values:
                continue
            text = " < ".join(f"{k.removeprefix(name).strip() or 'as given'} "
                              f"({seconds(values[k])})" for k in order(values))
            common = {k: values[k] for k in values if k in ran}
            agree = ("-" if how == "measured on the chip" or len(common) < 2 else
                     ("yes" if order(common) == order({k: ran[k] for k in common}) else "no")
                     + f" ({concordant(common, {k: ran[k] for k in common})})")
            lines.append(f"| {name} | {how} | {text} | {agree} |")
    return lines


def main() -> int:
    raw, out = Path(sys.argv[1]), Path(sys.argv[2])
    found = load(raw)
    texts = hlo_texts(raw)
    tables = f"`python {' '.join(sys.argv)}`"
    here = f"`{COMMANDS['deviceless']}` (on the machine without a TPU)"
    there = f"`{COMMANDS['device']}` (on the machine with the chip)"
    device_ran = found["device"] is not None
    lines = [
        f"# One {CHIP}: the deviceless target against the chip", "",
        f"Deviceless: {here}. Device: "
        f"{there if device_ran else 'not yet run'}. Every table below: {tables}, from "
        f"those runs' files in `{raw}`.", "",
        "## Where the figures came from", "", f"From {here} and {there}.", "",
        *about_table(found), "",
        "## Fit: the compiler's verdict deviceless against the chip", "",
        f"From {here} and {there}.", "", *fit_table(found), "",
        "## Memory analyses: deviceless (here) against the device", "",
        f"From {here} and {there}; `=`: equal to the byte; the variants both compiled.", "",
        *(memory_table(found, "deviceless", "device") if device_ran else ["(no device run)"]),
        "",
        "Deviceless on the device's machine (its libtpu) against the device:", "",
        *(memory_table(found, "deviceless-there", "device") if found["deviceless-there"]
          else ["(not run)"]), "",
        "## Programs: deviceless (here) against the device", "",
        f"From {here} and {there}; left: deviceless, right: the device.", "",
        *(program_table(found, texts, "deviceless", "device") if device_ran
          else ["(no device run)"]), "",
        "## Step time: measured against the estimates", "",
        f"From {here} and {there}. Estimates: the static objective's model "
        f"(`HARDWARE[{CHIP!r}].breakdown` of the compiled program, one device); libtpu's "
        "own: the program's `optimal_seconds` with loops counted "
        "(`ProgramCost.compiler_seconds`); the pipeline: `make_context` + `evaluate` on the "
        "replicated plan with the variant's knobs.", "", *time_table(found), "",
        "## Do the estimates rank the knobs as the chip does?", "",
        f"From {here} and {there}; variants that did not compile or run are left out of "
        "each ranking.", "", *rank_table(found), "",
    ]
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
