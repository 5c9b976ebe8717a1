"""The mesh's shape searched for the published GPU rows, compiled for the chip.

For each chosen entry of the `published-chip` suite (default: the three
Megatron-LM H100 rows), the same workload is searched twice over, all of it
compiled by the chip's own compiler without the chip and estimated by the
static objective (`shardsearch.optimize(..., devices=N, axes=...)`):

- the published plan on the published mesh (`bench.estimate_published`);
- every split of the row's GPUs over its axes that the GPU can lay out (the
  tensor axis inside one host of 8), each split's own search, the splits'
  winners compared by estimate, under the chip's memory. The published plan
  is a start plan of every split (`start_from`, labelled
  `plan:<entry>.<plan>.json`): the search starts from what the experts ran
  and must beat it.

The workload is the row's without `activation_sharding`, for both: that key
pins the activations to one mesh shape (`workloads._activations`), so a
search over shapes cannot carry it; the published plan is estimated on the
same workload, so the ratio compares like with like. Nothing runs: the
ratios are the model's, and whether they hold on H100s needs H100s.

    python benchmarks/shapes/run.py [--entries ID,ID] [--trials N] [--out DIR]

writes `DIR/shapes.json` (every figure) and `DIR/shapes.md`, default DIR
`benchmarks/results/shapes`. Entries already there are kept unless `--force`.
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
from shardsearch.search import plan_config  # noqa: E402
from shardsearch.workloads import expert_plan, get_workload  # noqa: E402

COMMAND = "python benchmarks/shapes/run.py"
GPU_ROWS = ("megatron-7.1b-h100-96-tp2", "megatron-16b-h100-192-tp4",
            "megatron-32b-h100-384-tp8")
GiB = 2**30


def run_entry(entry, trials: int, out: Path) -> dict:
    chip = entry.hardware
    dims, names = ss.parse_mesh(entry.mesh)
    spec = {k: v for k, v in dict(entry.spec).items() if k != "activation_sharding"}
    workload = get_workload(f"{entry.workload}:custom", **spec)
    published_mesh = ss.target_mesh(chip, dict(zip(names, dims, strict=True)),
                                    dcn_axes=entry.dcn_axes)
    start = time.perf_counter()
    published = estimate_published(workload, published_mesh, entry.published,
                                   ss.HARDWARE[chip], entry.dcn_axes)
    published_seconds = time.perf_counter() - start
    # The published plan as a start plan of every shape: the search starts
    # from what the experts ran and has to beat it (`start_from`).
    plan = expert_plan(workload, published_mesh, entry.published.plan)
    start_plan = ss.write_config(
        plan_config(plan.state_rule, plan.batch_rule, published_mesh),
        out / f"{entry.id}.{entry.published.plan}.json")
    start = time.perf_counter()
    result = ss.optimize(
        workload, devices=published_mesh.devices.size, axes=names,
        make_mesh=lambda shape: ss.target_mesh(chip, shape, dcn_axes=entry.dcn_axes),
        objective="static", n_trials=trials, dcn_axes=entry.dcn_axes, quiet=True,
        isolate=False, storage=f"sqlite:///{out / 'studies.db'}", study_name=entry.id,
        seed=entry.seed, start_from=[start_plan])
    search_seconds = time.perf_counter() - start
    return {
        "published_plan": entry.published.plan, "published_mesh": entry.mesh,
        "published_estimate": published.get("estimate"),
        "published_memory": (published.get("memory_per_device") or {}).get("total"),
        "published_status": published.get("status"),
        "published_step_seconds": published["published_seconds"],
        "winner": {"shape": result.shapes["chosen"], "label": result.best_label,
                   "estimate": result.best_time, "memory": result.best_memory},
        "shapes": result.shapes, "trials": trials,
        "seconds": {"published": published_seconds, "search": search_seconds},
        "chip_memory": ss.HARDWARE[chip].memory_bytes,
    }


def time_on_cut(storage: str, row: str) -> dict:
    """Seconds of the row's trials by how they ended, over every shape's study:
    complete, cut before compiling (stage 1), cut after it (over the chip's
    memory by its compiler, or slower), and the share of the cut ones."""
    import optuna

    from shardsearch.search import TrialRecord

    seconds = {"complete": 0.0, "cut before compiling": 0.0, "cut after compiling": 0.0,
               "failed": 0.0}
    for name in optuna.get_all_study_names(storage):
        if not name.startswith(f"{row}/"):
            continue
        for trial in optuna.load_study(study_name=name, storage=storage).get_trials():
            record = TrialRecord.from_trial(trial)
            if record is None:
                continue
            status = str(getattr(record.outcome.status, "value", record.outcome.status))
            stage = str(getattr(record.outcome.cut_stage, "name", record.outcome.cut_stage))
            key = ("complete" if status == "complete" else "failed" if status == "failed"
                   else "cut before compiling" if "check" in stage.lower()
                   else "cut after compiling")
            seconds[key] += record.seconds
    total = sum(seconds.values())
    cut = seconds["cut before compiling"] + seconds["cut after compiling"]
    return {**seconds, "cut share": cut / total if total else None}


def _share(seconds: dict | None) -> str:
    if not seconds or seconds.get("cut share") is None:
        return "-"
    return (f"{seconds['cut share']:.0%} ({seconds['cut after compiling']:.0f} s after "
            "compiling)")


def _gib(n) -> str:
    return "-" if n is None else f"{n / GiB:.1f}"


def table(records: dict) -> str:
    rows = ["| entry | published plan (mesh) | its estimate s | its memory GiB | winner (shape) "
            "| its estimate s | its memory GiB | published / winner | shapes searched (pruned) "
            "| search s | time on cut trials |", "|" + "---|" * 11]
    for entry_id, r in records.items():
        w, pub = r["winner"], r["published_estimate"]
        ratio = "-" if not pub or not w["estimate"] else f"{pub / w['estimate']:.2f}x"
        shapes = r["shapes"]
        rows.append(
            f"| {entry_id} | {r['published_plan']} ({r['published_mesh']}) | "
            f"{'-' if pub is None else format(pub, '.3g')} | {_gib(r['published_memory'])} | "
            f"{w['label']} ({w['shape']}) | {w['estimate']:.3g} | {_gib(w['memory'])} | "
            f"{ratio} | {len(shapes['searched'])} ({len(shapes['pruned'])}) | "
            f"{r['seconds']['search']:.0f} | {_share(r.get('seconds_by_end'))} |")
    return "\n".join(rows)


def per_shape(records: dict) -> str:
    lines = []
    for entry_id, r in records.items():
        lines += [f"\n### {entry_id}\n", "| shape | winner | estimate s | trials |",
                  "|---|---|---|---|"]
        for text, row in r["shapes"]["searched"].items():
            mark = " (chosen)" if text == r["shapes"]["chosen"] else ""
            lines.append(f"| {text}{mark} | {row['best_label']} | {row['best_time']:.3g} | "
                         f"{row['trials']} |")
        for text, why in r["shapes"].get("failed", {}).items():
            lines.append(f"| {text} | nothing completed: {why[:150]} | - | - |")
        for text, why in r["shapes"]["pruned"].items():
            lines.append(f"| {text} | pruned: {why[:120]} | - | - |")
    return "\n".join(lines)


def save(path: Path, a: argparse.Namespace, records: dict) -> None:
    path.write_text(json.dumps({
        "command": f"{COMMAND} --entries {a.entries} --trials {a.trials}",
        "jax": jax.__version__, "python": platform.python_version(),
        "entries": records}, indent=1, default=str) + "\n")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--entries", default=",".join(GPU_ROWS))
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--out", default="benchmarks/results/shapes")
    p.add_argument("--force", action="store_true")
    a = p.parse_args()
    suite = load_suite("published-chip")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "shapes.json"
    records = json.loads(path.read_text())["entries"] if path.exists() else {}
    for entry in suite.select(a.entries.split(",")):
        if entry.id in records and not a.force:
            if "seconds_by_end" not in records[entry.id] and (out / "studies.db").exists():
                records[entry.id]["seconds_by_end"] = time_on_cut(
                    f"sqlite:///{out / 'studies.db'}", entry.id)
            continue
        print(f"{entry.id}: the shape of {entry.mesh} searched, {a.trials} trials ...",
              flush=True)
        records[entry.id] = run_entry(entry, a.trials, out)
        records[entry.id]["seconds_by_end"] = time_on_cut(
            f"sqlite:///{out / 'studies.db'}", entry.id)
        save(path, a, records)
        print(table({entry.id: records[entry.id]}), flush=True)
    save(path, a, records)
    (out / "shapes.md").write_text(
        "# The mesh's shape searched for the published GPU rows\n\n"
        f"Command: `{COMMAND} --entries {a.entries} --trials {a.trials}` (raw figures in "
        "`shapes.json`; what it does: the script's docstring). Every figure is the static "
        "objective's estimate of a program compiled by the H100's compiler (the CUDA "
        "plugin, the shipped gpu-h100 target config), under the chip's memory; nothing "
        "ran. The workload is each row's without `activation_sharding`, for the "
        "published plan too; the published plan is a start plan of every split.\n\n"
        + table(records) + "\n" + per_shape(records) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
