"""Where a step's time goes on one v5e chip, kernel by kernel, beside the cost model's prices.

The per-kernel model (`HardwareModel.per_op`) ranks most knob settings as
the chip runs them (grid.md), but it prices many microbatches 10-15% over the
chip's step and puts 8 microbatches with selective remat behind selective
remat alone, the other way round from the chip. A whole step's time cannot
say which kernels it misprices; a trace can. On the machine with the chip
(the install line as in `benchmarks/results/v5e/notes.md`):

    PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD python3 benchmarks/v5e/kernels.py device $OUT

compiles each setting of the 400M llama (run.py's shape) for the chip, times
it as run.py does (`compile_variant`), then traces two more steps with
`jax.profiler` and sums the device's events by name per step, for every
line of the TPU's plane (`OUT/kernels.json`, written as it goes, and the
HLO as `OUT/hlo-kernels.tar.gz`). The deviceless HLO is the chip's (run.py's
check), so instruction names match, and the comparison runs here:

    python benchmarks/v5e/kernels.py report benchmarks/results/v5e/raw \\
        benchmarks/results/v5e/kernels.md
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import re
import sys
import time
import traceback
from collections import Counter
from pathlib import Path


def _load(name: str):
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"v5e_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUN = _load("run")
NAME = RUN.LLAMA_NAME
SETTINGS = ({}, {"microbatches": 2}, {"microbatches": 4}, {"microbatches": 8},
            {"remat": "selective"}, {"remat": "selective", "microbatches": 2},
            {"remat": "selective", "microbatches": 8})
TRACED = 2


def trace_steps(compiled, abstract, steps: int) -> dict:
    """`steps` steps of `compiled` under the profiler after one untraced one:
    each device line's events summed by name, per step, in seconds."""
    import glob
    import tempfile

    import jax
    from jax.profiler import ProfileData

    state, batch = RUN.materialize(abstract)
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    folder = tempfile.mkdtemp()
    jax.profiler.start_trace(folder)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    wall = (time.perf_counter() - start) / steps
    jax.profiler.stop_trace()
    del state, batch, metrics
    path = sorted(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True))[-1]
    lines: dict[str, Counter] = {}
    counts: dict[str, Counter] = {}
    planes = []
    for plane in ProfileData.from_file(path).planes:
        planes.append(plane.name)
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            key = f"{plane.name} | {line.name}"
            names, seen = lines.setdefault(key, Counter()), counts.setdefault(key, Counter())
            for event in line.events:
                names[event.name] += event.duration_ns
                seen[event.name] += 1
    return {"traced_seconds_per_step": wall, "planes": planes,
            "lines": {key: {"seconds_per_step": sum(names.values()) / steps / 1e9,
                            "events": {n: [ns / steps / 1e9, counts[key][n] / steps]
                                       for n, ns in names.most_common()}}
                      for key, names in lines.items()}}


@functools.cache  # each setting asks twice; grid.py loads run.py again
def workload(name: str):
    """run.py's 400M llama, one of grid.py's shapes by its name, or a registered workload."""
    grid = _load("grid")
    return grid.workload(name) if name in grid.SHAPES else RUN.get(name)


def device(out: Path, budget: float, name: str, first: int = 0) -> int:
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    whole: dict = {"about": RUN.about(), "settings": {}}
    save = RUN.writer(out / "kernels.json", whole)
    devices = jax.devices()
    whole["about"]["mesh"] = RUN.about_devices(devices)
    mesh = Mesh(np.array(devices[:1]), ("dp",), axis_types=(AxisType.Auto,))
    for knobs in SETTINGS[first:]:
        k = RUN.key(name, knobs)
        if time.time() - start > budget - RUN.MARGIN:
            whole["settings"][k] = {"knobs": knobs, "skipped": "out of time"}
            save()
            continue
        try:
            rec = RUN.compile_variant(name, knobs, mesh, "kernels", out, run=True,
                                      workload=workload(name))
            if rec.get("step_times"):
                fn, abstract = RUN.jitted(workload(name), knobs, mesh)
                rec["trace"] = trace_steps(fn.lower(*abstract).compile(), abstract, TRACED)
        except Exception as err:
            rec = {"knobs": knobs, "error": f"{type(err).__name__}: {err}"[:3000],
                   "traceback": traceback.format_exc()[-3000:]}
        whole["settings"][k] = rec
        save()
        print(k, {x: rec.get(x) for x in ("median_seconds", "error")},
              {line: v["seconds_per_step"]
               for line, v in rec.get("trace", {}).get("lines", {}).items()},
              flush=True)
        jax.clear_caches()
    RUN.pack(out, "hlo-kernels.tar.gz")
    print(f"done in {time.time() - start:.0f} s", flush=True)
    return 0


_NAME = re.compile(r"^%([\w.\-]+) = ")
_DEVICE = "/device:TPU:0 | "
_OPS = _DEVICE + "XLA Ops"
SMALL = 0.02  # seconds: a step this short is mostly the host's dispatch


def traced_settings(raw: Path) -> dict:
    """Every traced setting in RAW's `kernels*.json` (one file per workload), by key."""
    found: dict = {}
    for path in sorted(raw.glob("kernels*.json")):
        found.update(json.loads(path.read_text())["settings"])
    return found


def measured_kernels(rec: dict) -> dict[str, float]:
    """Seconds per step of each traced kernel, by instruction name; the loops
    that hold other kernels (while, call, conditional) left out."""
    found: dict[str, float] = {}
    for text, (seconds, _n) in rec["trace"]["lines"][_OPS]["events"].items():
        name = _NAME.match(text)
        if name and not re.search(r" (while|call|conditional)\(", text):
            found[name[1]] = found.get(name[1], 0.0) + seconds
    return found


@functools.cache  # the report and its what-if read the same programs
def priced(text: str) -> tuple[dict, ...]:
    """Each kernel of the program as the v5e model priced it before it knew
    memory spaces (`memory`: all its bytes over HBM bandwidth; `model`: the
    larger of that and `compute`), with the bytes of its arrays in memory
    space 1 (layouts marked `S(1)`: where the TPU compiler placed them in the
    chip's faster memory) apart, as `kernel_table` splits them."""
    import shardsearch as ss
    from shardsearch.search import kernel_table

    model = ss.HARDWARE[RUN.CHIP]
    rows = []
    for k in kernel_table(text):
        compute = math.fsum(f / model.peak(d) for d, f in k.flops)
        s1 = dict(k.spaces).get(1, 0.0)
        memory = k.bytes / model.memory_bandwidth
        rows.append({"name": k.name, "opcode": k.opcode, "compute": compute, "hbm": k.bytes - s1,
                     "s1": s1, "bandwidth": model.memory_bandwidth,
                     "memory": memory, "model": max(compute, memory)})
    return tuple(rows)


@functools.cache
def shipped(text: str) -> float:
    """The program's kernels priced by the v5e model as the package ships it."""
    import shardsearch as ss
    from shardsearch.search import ProgramCost, Topology

    program = ProgramCost.from_hlo(text, 0.0, 0.0)
    return ss.HARDWARE[RUN.CHIP].breakdown(program, Topology(("dp",), (1,))).kernels


def _ratio(group: list[dict], measured: dict[str, float]) -> str:
    traced = math.fsum(measured[r["name"]] for r in group)
    model = math.fsum(r["model"] for r in group)
    if not group:
        return "none"
    return f"{traced:.4f} / {model:.4f} ({traced / model:.2f})"


def report(raw: Path, out: Path) -> None:
    """`kernels.md`: each setting's traced kernels against the model's."""
    import numpy as np

    data = traced_settings(raw)
    texts = RUN.hlo_texts(raw)
    command = f"python benchmarks/v5e/kernels.py report {raw} {out}"
    lines = ["# One v5e chip, kernel by kernel: where the per-kernel model misprices "
             "microbatches", "",
             f"Made by `{command}` from `kernels.json` and `hlo-kernels.tar.gz` "
             "(`python3 benchmarks/v5e/kernels.py device $OUT`, then `--first 4` for the "
             "three settings the first call ran out of time for), `kernels-gpt-small.json`, "
             "`kernels-llama-150m.json` and `kernels-gpt-200m.json` with their "
             "`hlo-kernels-*.tar.gz` (`python3 "
             "benchmarks/v5e/kernels.py device $OUT --workload gpt:small --budget 420`, then "
             "`--workload llama-150m-s1024-b16 --budget 470` and `--workload gpt-200m-s1024-b16 "
             "--budget 470`); see notes.md. Seconds per "
             "step. *step*: the median timed step; *traced*: the kernels of two traced steps "
             "(loops that hold kernels left out), per step; *model*: the per-kernel "
             "roofline (`HardwareModel.per_op`) of the same HLO with every byte at HBM's "
             "810 GB/s, as the v5e model priced it before this report; then the kernels "
             "both list, split by what bounds them in the model (compute: matmul flops over "
             "peak; memory: bytes over HBM bandwidth), traced / model; *copy-start*: what "
             "the model charges the asynchronous copies, which the trace runs beside the "
             "kernels (its \"Async XLA Ops\" line).", "",
             "| setting | step | traced | model | compute-bound traced / model | "
             "memory-bound traced / model | copy-start in the model |",
             "|---|---|---|---|---|---|---|"]
    fit_x, fit_y = [], []
    for key, rec in data.items():
        if not rec.get("trace"):
            continue
        text = texts[RUN.hlo_name("kernels", key)]
        measured = measured_kernels(rec)
        rows = priced(text)
        both = [r for r in rows if r["name"] in measured and r["opcode"] != "copy-start"]
        compute = [r for r in both if r["compute"] >= r["memory"]]
        memory = [r for r in both if r["compute"] < r["memory"]]
        copies = math.fsum(r["model"] for r in rows if r["opcode"] == "copy-start")

        lines.append(f"| {key} | {rec['median_seconds']:.4f} "
                     f"| {math.fsum(measured.values()):.4f} | "
                     f"{math.fsum(r['model'] for r in rows):.4f} | {_ratio(compute, measured)} | "
                     f"{_ratio(memory, measured)} | {copies:.4f} |")
        fitted_to = memory if rec["workload"] == NAME else ()  # the other shapes test the fit
        for r in fitted_to:
            if r["compute"] < 0.2 * r["memory"] and measured[r["name"]] > 2e-4:
                fit_x.append([r["hbm"], r["s1"]])
                fit_y.append(measured[r["name"]])
    (hbm, s1), *_ = np.linalg.lstsq(np.array(fit_x), np.array(fit_y), rcond=None)
    lines += ["", f"Least squares over the {len(fit_y)} memory-bound kernels (matmul time "
              "under a fifth of their bytes' time, over 0.2 ms a step) of the 400M llama's "
              "settings (the other shapes' kernels are left to test it), "
              "traced time = HBM bytes / a + memory-space-1 bytes / b: "
              f"a = {1 / hbm / 1e9:.0f} GB/s, b = {1 / s1 / 1e9:.0f} GB/s (the model charges "
              f"both at {rows[0]['bandwidth'] / 1e9:.0f} GB/s)."]
    lines += _what_if(raw, data, texts, 1 / hbm, 1 / s1)
    lines += _overhead(data)
    out.write_text("\n".join(lines) + "\n")


def _what_if(raw: Path, data: dict, texts: dict[str, str], hbm: float, s1: float) -> list[str]:
    """Every program timed on the chip (run.py's, grid.py's and these)
    priced as the model does and as it would with the two changes the trace
    suggests: no charge for copy-start, and the fitted bandwidths."""
    import itertools
    import statistics

    programs = []
    for label, name, group in (("device", "device.json", "variants"),
                               ("grid", "grid.json", "variants"), ("kernels", None, None)):
        records = data if name is None else json.loads((raw / name).read_text())[group]
        for k, rec in records.items():
            text = texts.get(RUN.hlo_name(label, k))
            if rec.get("step_times") and text is not None:
                programs.append((label == "kernels", rec["workload"], k,
                                 statistics.median(rec["step_times"]), priced(text),
                                 shipped(text)))
    def fitted(p) -> float:
        return math.fsum(0.0 if r["opcode"] == "copy-start"
                         else max(r["compute"], r["hbm"] / hbm + r["s1"] / s1) for r in p[4])

    # What the kernels leave of a small step: the host's dispatch and wait,
    # the same for every program (median over the steps under 20 ms).
    constant = statistics.median(p[3] - fitted(p) for p in programs if p[3] < SMALL)
    ways = {"every byte at HBM's 810 GB/s, copies charged (the model before 2026-12-06)":
            lambda p: math.fsum(r["model"] for r in p[4]),
            "no copy-start, fitted bandwidths": fitted,
            "the v5e model now (`HARDWARE['tpu-v5e']`: the same, rounded)": lambda p: p[5],
            f"the same + {constant * 1e3:.2f} ms a step": lambda p: p[5] + constant}
    lines = ["", f"The same two changes applied to all {len(programs)} programs timed on the "
             f"chip (run.py's, grid.py's and the {len(data)} traced here; pairs of one shape's "
             "settings 1% or more apart, ordered by the estimate as the chip ran them). The "
             "bandwidths are fitted to the 400M llama's traced kernels and the constant to "
             f"the steps under {SMALL * 1e3:.0f} ms (gpt:small's), so *other shapes* counts "
             "the pairs of run.py's, grid.py's and the other traced shapes' programs, which "
             "neither was fitted to. *chip winner*: whether "
             "8 microbatches with selective remat (the chip's fastest, 482.8 ms) is priced "
             "under selective remat alone (502.2 ms), the pair the deviceless search got "
             "wrong:", "",
             "| pricing | pairs ordered as measured | of them, other shapes | "
             "measured / estimate, min-max | the same, steps over "
             f"{SMALL * 1e3:.0f} ms | worst program | chip winner |",
             "|---|---|---|---|---|---|---|"]
    winner = (RUN.key(NAME, SETTINGS[-1]), RUN.key(NAME, SETTINGS[4]))
    for way, price in ways.items():
        est = [(p, price(p)) for p in programs]
        got = of = out_got = out_of = 0
        for _shape, grp in itertools.groupby(est, key=lambda e: (e[0][0], e[0][1])):
            for (a, ea), (b, eb) in itertools.combinations(list(grp), 2):
                if abs(a[3] - b[3]) >= 0.01 * min(a[3], b[3]):
                    right = (ea < eb) == (a[3] < b[3])
                    of, got = of + 1, got + right
                    if a[1] != NAME and a[3] >= SMALL:
                        out_of, out_got = out_of + 1, out_got + right
        ratios = [(p[3] / e, p[2]) for p, e in est]
        large = [p[3] / e for p, e in est if p[3] >= SMALL]
        worst = max(ratios, key=lambda r: abs(math.log(r[0])))
        by_key = {p[2]: e for p, e in est if p[0]}
        first = "yes" if by_key[winner[0]] < by_key[winner[1]] else "no"
        lines.append(f"| {way} | {got}/{of} | {out_got}/{out_of} | "
                     f"{min(ratios)[0]:.2f}-{max(ratios)[0]:.2f} | "
                     f"{min(large):.2f}-{max(large):.2f} | {worst[1]} "
                     f"({worst[0]:.2f}) | {first} ({by_key[winner[0]] * 1e3:.1f} vs "
                     f"{by_key[winner[1]] * 1e3:.1f} ms) |")
    return lines


def _overhead(data: dict) -> list[str]:
    """Where a small step's time goes: the device's own step against the
    host's timed step."""
    lines = ["", "Where gpt:small's 2 ms go, from the same traces (ms per step): *timed*: "
             "the host's median step; *device step*: the trace's \"Steps\" line; *module*: "
             "its \"XLA Modules\" line (the program running); *kernels*: as *traced* above.",
             "", "| setting | timed | device step | module | kernels |", "|---|---|---|---|---|"]
    for key, rec in data.items():
        if not rec.get("trace") or rec["median_seconds"] > SMALL:
            continue
        line = rec["trace"]["lines"]
        lines.append(f"| {key} | {rec['median_seconds'] * 1e3:.3f} | "
                     f"{line[_DEVICE + 'Steps']['seconds_per_step'] * 1e3:.3f} | "
                     f"{line[_DEVICE + 'XLA Modules']['seconds_per_step'] * 1e3:.3f} | "
                     f"{math.fsum(measured_kernels(rec).values()) * 1e3:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="phase", required=True)
    on = sub.add_parser("device", help="compile, time and trace on the chip")
    on.add_argument("out", type=Path)
    on.add_argument("--budget", type=float, default=480.0)
    on.add_argument("--first", type=int, default=0, help="skip the settings before this index")
    on.add_argument("--workload", default=NAME,
                    help="another workload: a registered name (gpt:small) or a grid.py shape")
    rep = sub.add_parser("report", help="the traced kernels beside the model's prices")
    rep.add_argument("raw", type=Path)
    rep.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.phase == "device":
        return device(args.out, args.budget, args.workload, args.first)
    report(args.raw, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
