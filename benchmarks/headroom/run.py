"""How much faster than the best expert plan can a step on a simulated mesh get?

Issue 24 asks for searched plans 1.15x faster than the best expert on a
quarter of `cpu-sim8`'s entries, "or say so from the numbers" if simulated
devices cannot show it. This script measures the room there is. For each
recorded entry of a measured suite it times, in one interleaved run
(`retime`, as the suite times its plans):

- the entry's winner (from its exported rule file, checked as the recheck
  checks it) and its best expert plan (pinned as the suite pins it);
- `dp`, data parallelism (pinned), whose one collective is the gradients'
  all-reduce;
- `floor`: the step with no collective at all. The step runs under
  `jax.shard_map` on every device at once, each device on its own share of
  the batch (split over all mesh axes) with the whole state, and nothing is
  reduced: data parallelism without its all-reduce, a program whose results
  are wrong and whose work is each device's share of the batch;
- `opt_full` and `opt_split`: an Adam-shaped update of the state alone
  (built-in workloads' `params`/`opt` layout), with the state whole on every
  device and split as FSDP splits it. Their difference is the optimizer work
  `floor` repeats on every device that a plan splitting the optimizer state
  does not.

Per entry it reports the best expert over `floor` (the median of per-round
ratios with its 95% CI, as the suite's report computes speedups): the
speedup a plan would have if it removed every collective and kept data
parallelism's work. `floor` less the repeated optimizer work gives a second,
derived figure (medians only, no CI). What a plan can remove is less than all
of that: splitting the batch over devices needs the gradients reduced, and
`dp` - `floor` is what that one all-reduce costs here. The floor is one
decomposition of the work, not a bound over all of them: a plan that
computes less per device than data parallelism does (where the weights
dominate, as in the mlp) can be faster than it.

Groups the entries by workload and mesh; each group is one interleaved run
(a plan two entries share is timed once). Run from the repository root with
nothing else running:

    python benchmarks/headroom/run.py --suite cpu-sim8 --out benchmarks/results/headroom
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardsearch.bench import format_speedup, load_suite, prepare_devices, speedup
from shardsearch.search import baseline_candidates, fingerprint, pin_batch, retime
from shardsearch.workloads import get_workload

_RECHECK = Path(__file__).resolve().parents[1] / "recheck" / "run.py"
_spec = importlib.util.spec_from_file_location("recheck_run", _RECHECK)
recheck = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recheck)

__all__ = ["floor_step", "main", "optimizer_step"]


def floor_step(step: Callable[..., Any], mesh: Any, n_batch: int) -> Callable[..., Any]:
    """`step(state, *batch)` on every device at once with no collective: each
    device its share of every batch leaf's dim 0 (split over all of `mesh`'s
    axes) and the whole state, its results kept as they are (no reduction)."""
    import jax
    from jax.sharding import PartitionSpec as P

    batch = P(tuple(mesh.axis_names))
    return jax.shard_map(step, mesh=mesh, in_specs=(P(), *([batch] * n_batch)),
                         out_specs=(P(), P()), check_vma=False)


def optimizer_step(state: dict, *batch: Any) -> tuple[dict, dict]:
    """An Adam-shaped update of a built-in workload's state with the
    parameters standing in for the gradients: the optimizer's elementwise
    work and nothing else. Raises KeyError for another state layout."""
    import jax
    import jax.numpy as jnp

    params, opt = state["params"], state["opt"]
    mu = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, opt["mu"], params)
    nu = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["nu"], params)
    params = jax.tree_util.tree_map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8),
                                    params, mu, nu)
    return ({"params": params, "opt": {**opt, "mu": mu, "nu": nu, "count": opt["count"] + 1}},
            {"loss": jnp.zeros((), jnp.float32)})


def _group(suite: Any, workload: Any, records: list[dict[str, Any]],
           rounds: int) -> list[dict[str, Any]]:
    """One interleaved run for entries of one workload and mesh; a row each."""
    import jax
    from jax.sharding import PartitionSpec as P

    prepared = []
    for record in records:
        reference = record["speedups"]["vs_best_expert"]["reference"]
        prepared.append((record, reference, recheck.prepare(suite, record, reference)))
    ctx = prepared[0][2]["ctx"]
    mesh = ctx.mesh
    finalists: list[tuple[str, Any, Any]] = []
    label_of: dict[str, str] = {}  # fingerprint -> the label it is timed as

    def add(label: str, specs: Any, own: Any, fp: str) -> str:
        if fp not in label_of:
            # Two programs of one name (an entry's expert recorded unpinned,
            # another's pinned) are two finalists, labelled apart.
            taken = set(label_of.values())
            label_of[fp] = next(f"{label} ({n})" for n in range(1, len(taken) + 2)
                                if f"{label} ({n})" not in taken) if label in taken else label
            finalists.append((label_of[fp], specs, own))
        return label_of[fp]

    roles = []
    for record, reference, prep in prepared:
        entry = record["entry"]["id"]
        timed = {}
        for role in ("winner", reference):
            fp = prep["plans"][role]["fingerprint"]
            name = reference if role == reference else f"{entry} winner"
            timed[role] = add(name, prep["specs"][role], prep["contexts"].get(role, ctx), fp)
        roles.append((record, reference, timed, prep))
    baselines = baseline_candidates(workload, mesh)
    dp = pin_batch({"dp": baselines["dp"]}, ctx.builds, ctx.abstract_args,
                   dict(mesh.shape))["dp"]
    dp_specs = dp.specs(ctx.abstract_args)
    dp_label = add("dp", dp_specs, ctx.with_setting(dp.knobs), fingerprint(dp_specs, dp.knobs))
    bare = dataclasses.replace(ctx, budget=None, compiles=0, steps=None, builds=None,
                               knobs=None, setting=())
    state, *batch = ctx.abstract_args
    whole = (jax.tree_util.tree_map(lambda _: P(), state),
             *(jax.tree_util.tree_map(lambda _: P(tuple(mesh.axis_names)), b) for b in batch))
    finalists.append(("floor", whole, dataclasses.replace(
        bare, step=floor_step(ctx.step, mesh, len(batch)))))
    finalists.append(("opt_full", whole, dataclasses.replace(
        bare, step=floor_step(optimizer_step, mesh, len(batch)))))
    fsdp = baselines["fsdp"].specs(ctx.abstract_args)
    finalists.append(("opt_split", fsdp, dataclasses.replace(bare, step=optimizer_step)))
    timings = retime(finalists, ctx, rounds)

    def row(label: str) -> dict[str, Any]:
        t = timings[label]
        return {"label": label, "role": "timed", "status": "timed", "fingerprint": label,
                "median_seconds": t.median, "times": list(t.times)}

    excess = timings["opt_full"].median - timings["opt_split"].median
    derived = timings["floor"].median - excess
    out = []
    for record, reference, timed, prep in roles:
        best, winner, floor = row(timed[reference]), row(timed["winner"]), row("floor")
        out.append({
            "entry": record["entry"]["id"], "best_expert": reference,
            "best_expert_knobs": prep["plans"][reference].get("knobs") or {},
            "winner_source": next(p.get("source") for p in record["plans"]
                                  if p["label"] == "winner"),
            "seconds": {"best_expert": best["median_seconds"],
                        "winner": winner["median_seconds"],
                        "dp": timings[dp_label].median,
                        "floor": timings["floor"].median,
                        "opt_full": timings["opt_full"].median,
                        "opt_split": timings["opt_split"].median},
            "times": {k: list(timings[v].times) for k, v in
                      (("best_expert", timed[reference]), ("winner", timed["winner"]),
                       ("floor", "floor"))},
            "winner_vs_best": (speedup(winner, best) if timed["winner"] != timed[reference]
                               else {"speedup": 1.0, "ratio_ci": None, "verdict": "same plan"}),
            "floor_vs_best": speedup(floor, best),
            "derived_floor": derived,
            "derived_ceiling": best["median_seconds"] / derived,
            "allreduce": timings[dp_label].median - timings["floor"].median,
            "timed_as": dict(timed)})
    return out


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# Room below the best expert: `{summary['suite']}`", "",
        f"Command: `{summary['command']}` ({summary['finished_at']}, {summary['rounds']} "
        "interleaved rounds per group of entries with the same workload and mesh).", "",
        "Seconds are medians of one step. *floor*: the step on every device with no "
        "collective (data parallelism without its all-reduce); *best / floor*: the median "
        "per-round ratio with its 95% CI, the speedup over the best expert of a plan that "
        "removed every collective and kept data parallelism's work; *derived*: floor less "
        "the optimizer work it repeats on every device (opt_full - opt_split), medians "
        "only; *all-reduce*: dp - floor, what reducing the gradients costs data "
        "parallelism here; *winner / best*: this run's re-timing of the entry's winner.",
        "",
        "| entry | best expert s | winner s | winner / best | dp s | floor s | best / floor "
        "| optimizer repeated s | best / derived floor | all-reduce s |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["entries"]:
        s = r["seconds"]
        lines.append(
            f"| {r['entry']} | {r['best_expert']} {s['best_expert']:.4f} | "
            f"{s['winner']:.4f} | {format_speedup(r['winner_vs_best'])} | {s['dp']:.4f} | "
            f"{s['floor']:.4f} | {format_speedup(r['floor_vs_best'])} | "
            f"{s['opt_full'] - s['opt_split']:.4f} | {r['derived_ceiling']:.2f}x | "
            f"{r['allreduce']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="cpu-sim8", help="suite name or file (as for `bench`)")
    p.add_argument("--results", default="benchmarks/results",
                   help="where the suite's results are (default benchmarks/results)")
    p.add_argument("--entries", help="comma-separated entry ids (default: every measured "
                   "entry recorded)")
    p.add_argument("--rounds", type=int, default=10,
                   help="interleaved rounds per group (default 10; at least 6)")
    p.add_argument("--out", default="benchmarks/results/headroom", help="output folder")
    a = p.parse_args(argv)
    if a.rounds < 6:
        p.error("--rounds must be at least 6 (the paired test needs 6 rounds)")
    try:
        suite = load_suite(a.suite)
        prepare_devices(suite)
        folder = Path(a.results) / suite.name / "entries"
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for entry in suite.select(a.entries.split(",") if a.entries else None):
            path = folder / f"{entry.id}.json"
            if not path.exists():
                if a.entries:
                    raise ValueError(f"{path} does not exist; run the entry first")
                continue
            record = json.loads(path.read_text(encoding="utf-8"))
            if record["objective"] == "measured":
                groups.setdefault((entry.workload_name, entry.mesh), []).append(record)
    except ValueError as err:
        p.error(str(err))
    command = " ".join(["python", "benchmarks/headroom/run.py",
                        *(sys.argv[1:] if argv is None else argv)])
    rows = []
    for (workload, mesh), records in groups.items():
        print(f"{workload} on {mesh}: {', '.join(r['entry']['id'] for r in records)}",
              flush=True)
        for r in _group(suite, get_workload(workload), records, a.rounds):
            print(f"  {r['entry']}: best/floor {format_speedup(r['floor_vs_best'])}, "
                  f"winner/best {format_speedup(r['winner_vs_best'])}", flush=True)
            rows.append(r)
    summary = {"suite": suite.name, "rounds": a.rounds, "command": command,
               "finished_at": datetime.datetime.now(datetime.UTC).isoformat(
                   timespec="seconds"), "entries": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{suite.name}.json").write_text(json.dumps(summary, indent=1) + "\n",
                                            encoding="utf-8")
    (out / f"{suite.name}.md").write_text(markdown(summary), encoding="utf-8")
    print(f"wrote {out / (suite.name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
