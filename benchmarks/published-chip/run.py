"""The published plans compiled for their chips: memory and step-time estimates.

For each entry of the `published-chip` suite, the published plan (the
entry's `published.plan` expert plan, the publisher's per-device batch and
our workload's remat) is compiled by the chip's own compiler, deviceless
(`shardsearch.target_mesh`), and estimated as `shardsearch bench` estimates
it (`bench.published.estimate_published`): the static objective's estimate
with its breakdown, and, where the compiler gives one (TPU), the compiler's
own estimate corrected for loop trips. Nothing runs and nothing is fitted.

    python benchmarks/published-chip/run.py [--entries ID,ID] [--out DIR]

writes `DIR/estimates.json` (every figure) and `DIR/estimates.md` (the
table), default DIR `benchmarks/results/published-chip`. Entries already in
`estimates.json` are kept unless `--force`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import shardsearch as ss

ss.use_cpu_devices(1)

import jax  # noqa: E402

from shardsearch.bench import estimate_published, load_suite  # noqa: E402
from shardsearch.search import target_of  # noqa: E402
from shardsearch.workloads import get_workload  # noqa: E402

GiB = 2**30
COMMAND = "python benchmarks/published-chip/run.py"


def estimate_entry(suite, entry) -> dict:
    chip = entry.hardware or suite.hardware
    dims, names = ss.parse_mesh(entry.mesh)
    mesh = ss.target_mesh(chip, dict(zip(names, dims, strict=True)), dcn_axes=entry.dcn_axes)
    workload = get_workload(entry.workload_name)
    start = time.perf_counter()
    record = estimate_published(workload, mesh, entry.published, ss.HARDWARE[chip], entry.dcn_axes)
    record["seconds"] = time.perf_counter() - start
    record["target"] = target_of(mesh).to_json()
    record["chip_memory"] = target_of(mesh).memory_bytes or ss.HARDWARE[chip].memory_bytes
    return record


def _gib(n) -> str:
    return "-" if n is None else f"{n / GiB:.1f}"


def _ratio(r) -> str:
    if r is None:
        return "-"
    side = "over" if r > 1 else "under"
    where = "within ±25%" if 0.75 <= r <= 1.25 else f"{side} by {abs(r - 1):.0%}"
    return f"{r:.2f} ({where})"


def table(records: dict) -> str:
    rows = ["| entry | target | plan | memory/device GiB (chip) | verdict | published s | "
            "estimate s | estimate / published | compiler's estimate s | compiler / published | "
            "bound | compile s |", "|" + "---|" * 12]
    within = 0
    for entry_id, r in records.items():
        t = r["target"]
        mem = r.get("memory_per_device") or {}
        verdict = ("fits" if r.get("status") == "complete" else
                   f"{r.get('status')}: {(r.get('reason') or '')[:90]}")
        ratio = r.get("ratio")
        within += ratio is not None and 0.75 <= ratio <= 1.25
        compiler = r.get("compiler_estimate")
        cratio = compiler / r["published_seconds"] if compiler else None
        parts = r.get("breakdown") or {}
        bound = (max(("compute", "memory"), key=lambda k: parts.get(k) or 0)
                 if parts else "-")
        rows.append(
            f"| {entry_id} | {t['chip']} {t['topology']} | {r['plan']} | "
            f"{_gib(mem.get('total'))} ({_gib(r['chip_memory'])}) | {verdict} | "
            f"{r['published_seconds']:.3g} | "
            f"{'-' if r.get('estimate') is None else format(r['estimate'], '.3g')} | "
            f"{_ratio(ratio)} | {'-' if compiler is None else format(compiler, '.3g')} | "
            f"{_ratio(cratio)} | {bound} | {r['seconds']:.0f} |")
    return "\n".join(rows), within


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--entries")
    p.add_argument("--out", default="benchmarks/results/published-chip")
    p.add_argument("--force", action="store_true")
    a = p.parse_args()
    suite = load_suite("published-chip")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "estimates.json"
    records = json.loads(path.read_text())["entries"] if path.exists() else {}
    for entry in suite.select(a.entries.split(",") if a.entries else None):
        if entry.id in records and not a.force:
            continue
        print(f"{entry.id}: compiling {entry.published.plan} for {entry.hardware} ...",
              flush=True)
        records[entry.id] = estimate_entry(suite, entry)
        r = records[entry.id]
        print(f"  {r.get('status')} in {r['seconds']:.0f} s, estimate {r.get('estimate')}, "
              f"published {r['published_seconds']:.3g}", flush=True)
        order = [e.id for e in suite.entries]
        records = {k: records[k] for k in order if k in records}
        path.write_text(json.dumps({
            "command": COMMAND, "jax": jax.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "entries": records}, indent=1, default=str) + "\n")
    text, within = table(records)
    (out / "estimates.md").write_text(
        "# The published plans compiled for their chips\n\n"
        f"Command: `{COMMAND}` (raw figures in `estimates.json`). Each published plan is "
        "compiled by its chip's own compiler without the chip (libtpu 0.0.42.1 for the TPU "
        "rows, the CUDA plugin 0.10.2 with the shipped gpu-h100 target config for the H100 "
        "rows), with the publisher's per-device batch, the remat the row's spec names "
        "(full for MaxText's rows, selective for Megatron-LM's) and attention in query "
        "blocks of 512 (`attention_chunk`). Memory is the chip "
        "compiler's (`memory_analysis()`: on TPU its peak, on GPU arguments + outputs + "
        "temporaries - aliased; docs/targets.md); a plan it refuses is cut at compile, with "
        "its words. "
        "The estimate is the static objective's (`shardsearch bench`'s published "
        "estimate); the compiler's estimate is TPU's `optimal_seconds` corrected for loop "
        "trips, where it gives a usable one.\n\n"
        f"{text}\n\n{within} of {len(records)} rows within ±25% of the published step "
        "time by our estimate.\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
