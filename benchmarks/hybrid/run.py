"""Hybrid against measured-only: the same entries searched both ways in one run.

For each chosen entry of a suite (default: a few `cpu-sim8` entries), on the
suite's simulated devices:

1. `optimize(objective="measured")` and `optimize(objective=Hybrid(...))` with
   the calibrated model of the entry's mesh (`--calibration DIR`, the
   `cpu-<mesh>.json` files `shardsearch calibrate` writes), each in a fresh
   study of the same seed, trials, budget, warmup, repeats and confirmation
   rounds. Which one runs first alternates from entry to entry, so a drift of
   the machine does not favour one. JAX's caches are cleared before each.
2. The two winners are compared: the same spec trees ("same plan"), or else
   both re-timed interleaved (`retime`, `--rounds` rounds) and called a tie
   when neither is significantly faster (`faster_than`).
3. Wall time of each search (confirmation included), trials, compiles, how
   many candidates hybrid cut at the estimate stage.

Results: `results.json` and `results.md` (with the command) in `--out`.

Run from the repository root with nothing else on the machine:

    python benchmarks/hybrid/run.py --calibration /path/to/calibrations
    python benchmarks/hybrid/run.py --calibration cal --entries mlp-small-dp2-tp4 \
        --trials 6 --out /tmp/hyb                          # a quick check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from shardsearch import HardwareModel, Hybrid, create_mesh, optimize, parse_mesh
from shardsearch.bench import load_suite, machine_info, prepare_devices, resolve_budget
from shardsearch.search import faster_than, make_context, retime
from shardsearch.workloads import get_workload

DEFAULT_ENTRIES = ("mlp-small-dp2-tp4", "gpt-small-dp2-tp4", "llama-small-dp8",
                   "moe-small-dp8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="cpu-sim8", help="the suite whose entries run (cpu-sim8)")
    p.add_argument("--entries", default=",".join(DEFAULT_ENTRIES),
                   help=f"comma-separated entry ids (default {','.join(DEFAULT_ENTRIES)})")
    p.add_argument("--calibration", metavar="DIR",
                   help="folder of calibrated models, cpu-<mesh>.json")
    p.add_argument("--factor", type=float, default=1.5, help="hybrid's factor (1.5)")
    p.add_argument("--top-k", type=int, default=3, help="hybrid's top k (3)")
    p.add_argument("--trials", type=int, help="trials per search (default: the entry's)")
    p.add_argument("--rounds", type=int, default=20,
                   help="interleaved rounds when the winners differ (20)")
    p.add_argument("--out", default="benchmarks/results/hybrid", help="results folder")
    p.add_argument("--report-only", action="store_true",
                   help="search nothing; rewrite results.md from the folder's results.json")
    a = p.parse_args(argv)
    if a.report_only:
        report = json.loads((Path(a.out) / "results.json").read_text(encoding="utf-8"))
        (Path(a.out) / "results.md").write_text(markdown(report), encoding="utf-8")
        print(f"wrote {Path(a.out) / 'results.md'}")
        return 0
    suite = load_suite(a.suite)
    by_id = {e.id: e for e in suite.entries}
    ids = [i.strip() for i in a.entries.split(",") if i.strip()]
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        print(f"run.py: error: {a.suite} has no entry {unknown[0]!r}; its entries: "
              f"{', '.join(by_id)}", file=sys.stderr)
        return 2
    if a.calibration is None:
        print("run.py: error: --calibration DIR is required to search", file=sys.stderr)
        return 2
    models = {}
    for i in ids:
        path = Path(a.calibration) / f"cpu-{_slug(by_id[i].mesh)}.json"
        try:
            models[i] = HardwareModel.load(path)
        except (OSError, ValueError) as err:
            print(f"run.py: error: {err}", file=sys.stderr)
            return 2
    prepare_devices(suite)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    rows = []
    start = time.perf_counter()
    for index, entry_id in enumerate(ids):
        entry = by_id[entry_id]
        rows.append(run_entry(suite, entry, models[entry_id], a, index, out))
        print(_line(rows[-1]), flush=True)
    report = {"command": command, "machine": machine_info(command), "suite": suite.name,
              "factor": a.factor, "top_k": a.top_k, "rounds": a.rounds,
              "wall_seconds": time.perf_counter() - start, "entries": rows}
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / "results.md").write_text(markdown(report), encoding="utf-8")
    print(f"wrote {out / 'results.md'}")
    return 0


def run_entry(suite: Any, entry: Any, model: HardwareModel, a: argparse.Namespace,
              index: int, out: Path) -> dict[str, Any]:
    import jax

    workload = get_workload(entry.workload_name)
    dims, names = parse_mesh(entry.mesh)
    mesh = create_mesh(dims, names, devices=jax.devices()[:math.prod(dims)])
    budget = resolve_budget(entry, workload, mesh)["bytes"]
    stamp = time.strftime("%Y%m%dT%H%M%S")
    runs: dict[str, Any] = {}
    order = ("measured", "hybrid") if index % 2 == 0 else ("hybrid", "measured")
    for kind in order:
        jax.clear_caches()
        objective = Hybrid(factor=a.factor, top_k=a.top_k) if kind == "hybrid" else kind
        began = time.perf_counter()
        result = optimize(
            workload, mesh=mesh, n_trials=a.trials or entry.trials,
            memory_budget=budget, objective=objective,
            storage=f"sqlite:///{(out / 'studies.db').resolve()}",
            study_name=f"hybrid-bench/{entry.id}/{kind}/{stamp}", seed=entry.seed,
            warmup=suite.warmup, repeats=suite.repeats, confirm_rounds=suite.rounds,
            hardware=model if kind == "hybrid" else None, quiet=True, space=entry.space)
        wall = time.perf_counter() - began
        runs[kind] = {"wall_seconds": wall, "winner": result.best_label,
                      "winner_time": result.best_time, "verdict": result.verdict,
                      "plan": _plan_hash(result), "summary": result.summary(),
                      "compiles": result.compiles, "result": result}
    same = runs["measured"]["plan"] == runs["hybrid"]["plan"]
    versus = None
    if not same:
        ctx, _ = make_context(workload, None, mesh, memory_budget=budget,
                              seed=entry.seed, warmup=suite.warmup, repeats=suite.repeats)
        with ctx:
            timings = retime([("measured", runs["measured"]["result"].best_specs),
                              ("hybrid", runs["hybrid"]["result"].best_specs)], ctx, a.rounds)
        m, h = timings["measured"], timings["hybrid"]
        versus = {"measured": m.to_json(), "hybrid": h.to_json(),
                  "hybrid_slower": faster_than(m.times, h.times),
                  "hybrid_faster": faster_than(h.times, m.times)}
    for run in runs.values():
        run.pop("result")
    return {"id": entry.id, "order": list(order), "runs": runs, "same_plan": same,
            "retimed": versus, "time_ratio": runs["hybrid"]["wall_seconds"]
            / runs["measured"]["wall_seconds"], "found": same or (
                versus is not None and not versus["hybrid_slower"])}


def _found(row: dict[str, Any]) -> str:
    if row["same_plan"]:
        return "same plan"
    if not row["found"]:
        return "no: hybrid's winner is slower"
    if row["retimed"]["hybrid_faster"]:
        return "hybrid's winner significantly faster in re-timing"
    return "tie in re-timing"


def _plan_hash(result: Any) -> str:
    specs = result.to_json()["best"]["specs"]
    return hashlib.sha256(json.dumps(specs, sort_keys=True).encode()).hexdigest()[:16]


def _slug(mesh: str) -> str:
    return mesh.replace("=", "").replace(",", "-")


def _line(row: dict[str, Any]) -> str:
    m, h = row["runs"]["measured"], row["runs"]["hybrid"]
    return (f"{row['id']}: measured {m['wall_seconds']:.0f} s ({m['winner']}), hybrid "
            f"{h['wall_seconds']:.0f} s ({h['winner']}, "
            f"{h['summary'].get('cut_estimate', 0)} cut at estimate): "
            f"{row['time_ratio']:.2f}x the time, "
            + _found(row))


def markdown(report: dict[str, Any]) -> str:
    lines = ["# Hybrid against measured-only search", "",
             f"Command: `{report['command']}`", "",
             f"Suite {report['suite']}; hybrid factor {report['factor']:g}, top k "
             f"{report['top_k']}; each entry searched both ways in this one run (the order "
             "alternates), fresh studies, the same seed and trials.", "",
             "| entry | measured: wall s, winner | hybrid: wall s, winner | cut at estimate "
             "| hybrid / measured time | same winner? |",
             "|---|---|---|---|---|---|"]
    for row in report["entries"]:
        m, h = row["runs"]["measured"], row["runs"]["hybrid"]
        found = _found(row)
        lines.append(f"| {row['id']} | {m['wall_seconds']:.0f}, {m['winner']} "
                     f"| {h['wall_seconds']:.0f}, {h['winner']} "
                     f"| {h['summary'].get('cut_estimate', 0)} of {h['summary']['trials']} "
                     f"| {row['time_ratio']:.2f}x | {found} |")
    ratios = [r["time_ratio"] for r in report["entries"]]
    found = sum(r["found"] for r in report["entries"])
    lines += ["", f"Median time ratio {statistics.median(ratios):.2f}x; hybrid found the "
              f"measured-only winner or one at least as fast (same plan, a tie, or faster in "
              f"re-timing) on {found} of {len(ratios)} entries. Total "
              f"{report['wall_seconds'] / 60:.0f} min.", ""]
    for row in report["entries"]:
        if row["retimed"]:
            m, h = row["retimed"]["measured"], row["retimed"]["hybrid"]
            lines.append(f"- {row['id']}: winners re-timed interleaved: measured's "
                         f"{m['median'] * 1e3:.1f} ms [{m['ci'][0] * 1e3:.1f}, "
                         f"{m['ci'][1] * 1e3:.1f}], hybrid's {h['median'] * 1e3:.1f} ms "
                         f"[{h['ci'][0] * 1e3:.1f}, {h['ci'][1] * 1e3:.1f}] (95% CI).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
