"""Why a suite's win shrinks when re-timed: the plans timed beside it.

A suite entry times all its plans in one interleaved run (winner,
replicated, default, every expert, in that order); `recheck/run.py` times
only the winner and its reference. This script times the same winner and
reference of one entry, in one process, under several line-ups, each
`--rounds` interleaved rounds, alternating line-ups `--times` times:

- `pair`: the winner and the reference alone (what the recheck does);
- `suite`: every plan the suite timed, in the suite's order;
- `suite, reference first`: the same plans with the reference moved to the
  front (it no longer follows the plan the suite put before it);
- `pair + <plan>`: the pair with one other plan of the suite between them,
  the reference right after it; `..., winner after it`: the winner right
  after it instead (rounds repeat in turn, so the first plan of a round
  follows the last of the one before).

For each it gives the ratio reference / winner (median per-round ratio with
its 95% CI, as the suite reports it). If the ratio depends on the line-up,
the suite's figure measures the neighbours as much as the plans.

    python benchmarks/recheck/neighbours.py --suite cpu-sim8 --results \
        benchmarks/results/logical --entry mlp-small-dp8 [--rounds 20] [--times 2]

writes `<results>/<suite>/neighbours-<entry>.{json,md}`. Run it with nothing
else on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from shardsearch import create_mesh, load_plan, parse_mesh
from shardsearch.bench import format_speedup, load_suite, plan_file_specs, prepare_devices, speedup
from shardsearch.search import (
    Candidate,
    baseline_candidates,
    fingerprint,
    make_context,
    resolve,
    retime,
)
from shardsearch.workloads import get_workload

COMMAND = "python benchmarks/recheck/neighbours.py"


def _row(label: str, timings: dict) -> dict:
    """A plan's timing as `bench.speedup` reads an entry's plan row."""
    t = timings[label]
    return {"label": label, "role": label, "status": "complete", "fingerprint": label,
            "median_seconds": t.median, "times": list(t.times)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", required=True)
    p.add_argument("--results", default="benchmarks/results")
    p.add_argument("--entry", required=True)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--times", type=int, default=2)
    a = p.parse_args()
    suite = load_suite(a.suite)
    folder = Path(a.results) / suite.name
    record = json.loads((folder / "entries" / f"{a.entry}.json").read_text())
    entry = next(e for e in suite.entries if e.id == a.entry)
    prepare_devices(suite)
    dims, names = parse_mesh(entry.mesh)
    mesh = create_mesh(dims, names)
    workload = get_workload(entry.workload_name)
    ctx, _ = make_context(workload, None, mesh, warmup=suite.warmup, repeats=suite.repeats)
    reference = record["speedups"]["vs_best_expert"]["reference"]
    specs, setting, _ = plan_file_specs(workload, Path(record["rule_file"]), mesh,
                                        ctx.abstract_args)
    if fingerprint(specs, setting) != record["plans"][0]["fingerprint"]:
        p.error(f"{record['rule_file']} is not the plan of entry {a.entry}'s winner (another "
                "run wrote it); rerun the entry or restore its plan file")
    plan = load_plan(record["rule_file"], mesh)
    plans = {"winner": resolve(Candidate(plan.rule, plan.batch_rule, "winner"), ctx)[0]}
    baselines = baseline_candidates(workload, mesh)
    # The suite's order, as its entry lists the plans it timed (single_device,
    # on a one-device mesh of its own, left out: it cannot share the rounds).
    for row in record["plans"]:
        label = row["label"]
        if label in baselines and row.get("median_seconds") is not None:
            plans[label] = resolve(baselines[label], ctx)[0]
    others = [k for k in plans if k not in ("winner", reference)]
    suite_order = list(plans)
    lineups = {"pair": ["winner", reference], "suite": suite_order,
               "suite, reference first": [reference] + [k for k in suite_order
                                                        if k != reference]}
    for other in others:
        lineups[f"pair + {other}"] = ["winner", other, reference]
        # The same three with the winner, not the reference, right after it.
        lineups[f"pair + {other}, winner after it"] = [reference, other, "winner"]
    results: dict[str, list] = {name: [] for name in lineups}
    for _ in range(a.times):
        for name, order in lineups.items():
            timings = retime([(k, plans[k]) for k in order], ctx, rounds=a.rounds)
            versus = speedup(_row("winner", timings), _row(reference, timings))
            results[name].append({"speedup": versus, "order": order,
                                  "winner_median": timings["winner"].median,
                                  "reference_median": timings[reference].median,
                                  "medians": {k: t.median for k, t in timings.items()}})
            print(f"{name:<28} {format_speedup(versus)}", flush=True)
    out = {"command": " ".join([COMMAND, *sys.argv[1:]]), "entry": a.entry,
           "reference": reference, "recorded": record["speedups"]["vs_best_expert"],
           "rounds": a.rounds, "times": a.times, "lineups": results}
    (folder / f"neighbours-{a.entry}.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"# {a.entry}: the winner against {reference}, by line-up\n",
             f"Command: `{out['command']}`. Ratio = {reference} / winner, the median "
             "per-round ratio with its 95% CI; each line-up timed in turn, "
             f"{a.times} times, {a.rounds} rounds each, one process.\n",
             "| line-up | " + " | ".join(f"run {i + 1}" for i in range(a.times))
             + " | winner ms | reference ms |", "|---|" + "---|" * (a.times + 2)]
    for name, runs in results.items():
        cells = [format_speedup(r["speedup"]) for r in runs]
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {runs[-1]['winner_median'] * 1e3:.1f}"
                     + f" | {runs[-1]['reference_median'] * 1e3:.1f} |")
    recorded = out["recorded"]
    lines.append(f"\nRecorded in the suite: {recorded['speedup']:.2f}x "
                 f"[{recorded['ratio_ci'][0]:.2f}–{recorded['ratio_ci'][1]:.2f}].")
    (folder / f"neighbours-{a.entry}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
