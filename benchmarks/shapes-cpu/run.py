"""The mesh's shape searched on 8 simulated CPU devices, against every expert plan on every split.

For each workload (default the `cpu-sim8` suite's four models, "small"),
`shardsearch.optimize(workload, devices=8, axes=("dp", "tp"))` searches
every split of the 8 devices and the sharding on each (measured objective).
Then, in one interleaved run in this process (`shardsearch.search.retime`,
each plan on its own mesh), the winner is timed against every expert plan
on every split (dp=1,tp=8 .. dp=8,tp=1: the suite's fixed meshes dp=8,
dp=2,tp=4 and dp=4,tp=2 among them), and `shardsearch.bench.speedup`
compares it with the fastest of them: the median of the per-round ratios,
its 95% interval (order statistics) and a verdict. From the same run it
also compares the winner with the fastest expert on each split, the
comparison a user who fixed that mesh would make (`vs_split_best`), and
keeps every plan's rounds (`times`).

    python benchmarks/shapes-cpu/run.py [--workloads mlp:small,...] [--trials N] [--rounds R]
    python benchmarks/shapes-cpu/run.py --recheck

The first writes `DIR/shapes-cpu.json` and `.md` (default DIR
`benchmarks/results/shapes-cpu`) and the winners' plan files; `--recheck`
times each winner (from its plan file) against that best expert again, in
this fresh process, and adds the recheck to both files; the best expert of
each split is timed beside them, so the per-split comparisons are rechecked
in the same run. Each entry records the command that searched it.

Simulated devices share the machine's cores: a step's time is mostly the
total work over the 8 devices, and communication is nearly free, so a
shape's advantage here is what it saves in work, not in links.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import shardsearch as ss

ss.use_cpu_devices(8)

import jax  # noqa: E402

from shardsearch.bench import format_speedup, speedup  # noqa: E402
from shardsearch.search import Candidate, fingerprint, make_context, resolve, retime  # noqa: E402
from shardsearch.workloads import expert_plans, get_workload  # noqa: E402

COMMAND = "python benchmarks/shapes-cpu/run.py"
WORKLOADS = ("mlp:small", "gpt:small", "llama:small", "moe:small")
SHAPES = ({"dp": 1, "tp": 8}, {"dp": 2, "tp": 4}, {"dp": 4, "tp": 2}, {"dp": 8, "tp": 1})


def text(shape) -> str:
    return ",".join(f"{a}={s}" for a, s in shape.items())


def mesh_of(shape):
    return ss.create_mesh(tuple(shape.values()), tuple(shape))


def experts(workload, seed: int) -> list[tuple[str, tuple, object]]:
    """Every expert plan on every split (replicated left out): `(label, specs,
    context)`, each context evaluating in this process on its own mesh."""
    out = []
    for shape in SHAPES:
        ctx, _ = make_context(workload, None, mesh_of(shape), objective="measured",
                              isolate=False, seed=seed)
        for name, plan in expert_plans(workload, ctx.mesh).plans.items():
            if name == "replicated":  # the reference, not an expert's plan
                continue
            specs, _ = resolve(Candidate(plan.state_rule, plan.batch_rule, name), ctx)
            if specs is not None:
                out.append((f"{name}@{text(shape)}", specs, ctx))
    return out


def split_of(label: str) -> str:
    """The split a label names: "fsdp@dp=2,tp=4" -> "dp=2,tp=4"."""
    return label.rpartition("@")[2]


def fastest_per_split(medians: dict[str, float]) -> dict[str, str]:
    """The label of the fastest plan on each split, from `{label: median}`."""
    fastest: dict[str, str] = {}
    for label, median in medians.items():
        split = split_of(label)
        if split not in fastest or median < medians[fastest[split]]:
            fastest[split] = label
    return fastest


def row(label: str, role: str, timing, plan: str) -> dict:
    return {"label": label, "role": role, "status": "complete", "fingerprint": plan,
            "median_seconds": timing.median, "times": list(timing.times)}


def compare(winner: tuple, others: list[tuple], rounds: int) -> dict:
    """One interleaved run of the winner and `others`; the winner against the
    fastest of them, and against the fastest of them on each split.

    A plan's fingerprint is its split and its specs, so an expert with the
    winner's specs on the winner's split is "same plan", not a timed tie.
    """
    timings = retime([winner, *others], winner[2], rounds)
    rows = [row(label, "winner" if label == winner[0] else "expert", timings[label],
                f"{split_of(label)}:{fingerprint(specs)}")
            for label, specs, _ in [winner, *others]]
    best = min(rows[1:], key=lambda r: r["median_seconds"])
    by_label = {r["label"]: r for r in rows[1:]}
    per_split = {split: by_label[label] for split, label in fastest_per_split(
        {label: r["median_seconds"] for label, r in by_label.items()}).items()}
    return {"winner": rows[0]["label"], "best_expert": best["label"],
            "medians": {r["label"]: r["median_seconds"] for r in rows},
            "times": {r["label"]: r["times"] for r in rows},
            "vs_best_expert": speedup(rows[0], best),
            "vs_split_best": {split: speedup(rows[0], r) for split, r in per_split.items()}}


def search(name: str, trials: int, rounds: int, out: Path) -> dict:
    workload = get_workload(name)
    start = time.perf_counter()
    result = ss.optimize(workload, devices=8, axes=("dp", "tp"), n_trials=trials,
                         confirm_rounds=rounds, quiet=True, seed=0,
                         storage=f"sqlite:///{out / 'studies.db'}", study_name=name)
    seconds = time.perf_counter() - start
    plan_path = result.export(out / f"{name.replace(':', '-')}.plan.json")
    winner_ctx = result.setup.local_context()
    label = f"winner {result.best_label}@{text(result.mesh_axes)}"
    comparison = compare((label, result.best_specs, winner_ctx), experts(workload, 0), rounds)
    return {"command": f"{COMMAND} --workloads {name} --trials {trials} --rounds {rounds}",
            "search_seconds": seconds, "shape": text(result.mesh_axes),
            "label": result.best_label, "plan": plan_path.name, "shapes": result.shapes,
            "trials": trials, "rounds": rounds, **comparison}


def recheck(name: str, record: dict, rounds: int, out: Path) -> dict:
    """The winner (from its plan file) against the recorded best expert and
    the recorded best expert of each split, timed again in this process."""
    workload = get_workload(name)
    shape = dict(part.split("=") for part in record["shape"].split(","))
    mesh = mesh_of({a: int(s) for a, s in shape.items()})
    ctx, _ = make_context(workload, None, mesh, objective="measured", isolate=False)
    plan = ss.load_plan(out / record["plan"])
    specs = tuple(plan.apply(ctx.abstract_args))
    fastest = fastest_per_split({label: m for label, m in record["medians"].items()
                                 if label != record["winner"]})
    wanted = {record["best_expert"], *fastest.values()}
    return compare((record["winner"], specs, ctx),
                   [e for e in experts(workload, 0) if e[0] in wanted], rounds)


def interval(s: dict | None) -> str:
    """A comparison as the suites' reports show it; "-" when there is none."""
    return "-" if s is None else format_speedup(s)


def table(records: dict) -> str:
    lines = ["| workload | winner (shape) | best expert (shape) | winner / expert median ms "
             "| speedup [95% CI] verdict | recheck speedup [95% CI] verdict | search s |",
             "|" + "---|" * 7]
    for name, r in records.items():
        lines.append(
            f"| {name} | {r['label']} ({r['shape']}) | {r['best_expert']} | "
            f"{r['medians'][r['winner']] * 1e3:.2f} / "
            f"{r['medians'][r['best_expert']] * 1e3:.2f} | {interval(r['vs_best_expert'])} | "
            f"{interval(r.get('recheck', {}).get('vs_best_expert'))} | "
            f"{r['search_seconds']:.0f} |")
    return "\n".join(lines)


def split_table(records: dict) -> str:
    """The winner against the fastest expert of each split: in the search's
    run and in the recheck (either may lack it: records before the per-split
    comparison, or not yet rechecked)."""
    lines = ["| workload | split | its fastest expert | speedup [95% CI] verdict | "
             "recheck: its fastest expert, speedup [95% CI] verdict |", "|" + "---|" * 5]
    for name, r in records.items():
        here = r.get("vs_split_best", {})
        again = r.get("recheck", {}).get("vs_split_best", {})
        for split in [text(shape) for shape in SHAPES]:
            if split not in here and split not in again:
                continue
            mine, theirs = here.get(split), again.get(split)
            lines.append(
                f"| {name} | {split} | {mine['reference'] if mine else '-'} | {interval(mine)} "
                f"| {(theirs['reference'] + ', ') if theirs else ''}{interval(theirs)} |")
    return "\n".join(lines)


def save(out: Path, records: dict) -> None:
    (out / "shapes-cpu.json").write_text(json.dumps({
        "jax": jax.__version__, "python": platform.python_version(), "entries": records},
        indent=1, default=str) + "\n")
    commands = "\n".join(
        f"- {name}: `{r['command']}`"
        + (f", then `{r['recheck']['command']}`" if "command" in r.get("recheck", {}) else "")
        for name, r in records.items())
    (out / "shapes-cpu.md").write_text(
        "# The mesh's shape searched on 8 simulated CPU devices\n\n"
        "Commands (the recheck in a fresh process; raw figures in `shapes-cpu.json`; what "
        f"they do: the script's docstring):\n\n{commands}\n\n"
        "The winner of the shape search against the fastest expert plan on any split of the "
        "8 devices, in one interleaved run: speedup = the median of per-round ratios "
        "expert / winner, with its 95% interval.\n\n" + table(records) + "\n\n"
        "The same winner against the fastest expert of each split, from the same "
        "interleaved runs: what a user who fixed that mesh would get from the experts "
        "(the `cpu-sim8` suite fixes dp=8, dp=2,tp=4 and dp=4,tp=2).\n\n"
        + split_table(records) + "\n")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--trials", type=int, default=60)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", default="benchmarks/results/shapes-cpu")
    p.add_argument("--recheck", action="store_true")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "shapes-cpu.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    records = data.get("entries", {})
    for record in records.values():
        # Records from before each entry kept its command: the file's one.
        record.setdefault("command", data.get("command"))
    for name in a.workloads.split(","):
        if a.recheck:
            if name not in records:
                continue
            records[name]["recheck"] = recheck(name, records[name], a.rounds, out)
            records[name]["recheck"]["command"] = (
                f"{COMMAND} --recheck --workloads {name} --rounds {a.rounds}")
        elif name not in records:
            print(f"{name}: searching the shape ...", flush=True)
            records[name] = search(name, a.trials, a.rounds, out)
        else:
            continue
        save(out, records)
        print(table({name: records[name]}) + "\n\n" + split_table({name: records[name]}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
