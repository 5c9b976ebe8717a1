"""The published plans with the step's knobs changed, compiled for their chips.

For each chosen entry of the `published-chip` suite, the published plan is
compiled by the chip's own compiler (deviceless, as `published-chip/run.py`
does) once per knob setting asked for: the step as published, then with
gradient accumulation over `k` microbatches or another remat policy
(`Workload.knobs`). What is compared is what the chip's compiler says of
memory and what the static objective estimates, per setting; nothing runs.

    python benchmarks/knobs/run.py --entries maxtext-22b-v4-64-fsdp \
        --settings microbatches=2 --settings microbatches=4 [--plan NAME] [--out DIR]

writes `DIR/knobs.json` (every figure, appended per entry and setting) and
`DIR/knobs.md`, default DIR `benchmarks/results/knobs`.

    python benchmarks/knobs/run.py --entries megatron-7.1b-h100-96-tp2 --search 40

searches instead, on the published mesh: `optimize(..., knobs=True)` with
the static objective under the chip's memory, the published plan as a start
plan (so the search must beat what the experts ran, knobs as published),
and writes `DIR/search.json` and `DIR/search.md`: the published plan's
estimate against the winner's, with the winner's knobs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import shardsearch as ss

ss.use_cpu_devices(1)

from shardsearch.bench import entry_mesh, load_suite  # noqa: E402
from shardsearch.search import (  # noqa: E402
    Candidate,
    evaluate,
    fingerprint,
    make_context,
    plan_config,
    resolve,
)
from shardsearch.workloads import expert_plan, get_workload  # noqa: E402

GiB = 2**30
COMMAND = "python benchmarks/knobs/run.py"


def parse_setting(text: str) -> dict:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        out[name] = int(value) if value.isdigit() else value
    return out


def compile_entry(suite, entry, setting: dict, plan_name: str | None = None) -> dict:
    chip = entry.hardware or suite.hardware
    mesh = entry_mesh(suite, entry)
    workload = get_workload(entry.workload_name)
    plan_name = plan_name or entry.published.plan
    plan = expert_plan(workload, mesh, plan_name)
    ctx, _ = make_context(workload, None, mesh, objective="static", hardware=ss.HARDWARE[chip],
                          dcn_axes=entry.dcn_axes, knobs=tuple(setting) or False)
    knobs = ctx.knobs.setting(setting) if ctx.knobs is not None else ()
    candidate = Candidate(plan.state_rule, plan.batch_rule, plan_name, knobs=knobs)
    specs, fp = resolve(candidate, ctx)
    start = time.perf_counter()
    outcome = evaluate(specs, fp, ctx.with_setting(knobs))
    return {"entry": entry.id, "chip": chip, "plan": plan_name,
            "knobs": setting, "status": outcome.status.value,
            "cut_stage": outcome.cut_stage.value if outcome.cut_stage else None,
            "reason": outcome.reason, "estimate": outcome.estimate,
            "collective_bytes": outcome.collective_bytes,
            "memory": outcome.memory, "chip_memory": ctx.chip_memory(),
            "budget": ctx.budget, "seconds": time.perf_counter() - start,
            "command": " ".join([COMMAND, *sys.argv[1:]])}


def search_entry(suite, entry, trials: int, out: Path, tag: str) -> dict:
    chip = entry.hardware or suite.hardware
    dims, names = ss.parse_mesh(entry.mesh)
    mesh = ss.target_mesh(chip, dict(zip(names, dims, strict=True)), dcn_axes=entry.dcn_axes)
    workload = get_workload(entry.workload_name)
    plan = expert_plan(workload, mesh, entry.published.plan)
    start_plan = ss.write_config(plan_config(plan.state_rule, plan.batch_rule, mesh),
                                 out / f"{entry.id}.{entry.published.plan}.json")
    start = time.perf_counter()
    result = ss.optimize(workload, mesh=mesh, objective="static", n_trials=trials,
                         hardware=ss.HARDWARE[chip], dcn_axes=entry.dcn_axes, knobs=True,
                         quiet=True, isolate=False, storage=f"sqlite:///{out / 'studies.db'}",
                         study_name=f"{entry.id}/{tag}", seed=entry.seed,
                         start_from=[start_plan])
    label = f"plan:{start_plan.stem}"
    published = next((t for t in result.trials if t.label == label), None)
    # The study's knobs: the workload's and its activation points' (`act_<name>`).
    best = fingerprint(result.best_specs, result.setup.context.knobs.setting(result.best_knobs))
    winner = next(t for t in result.trials if t.outcome.fingerprint == best)
    return {"entry": entry.id, "chip": chip, "mesh": entry.mesh, "trials": trials,
            "published_plan": entry.published.plan,
            "published_estimate": published.outcome.value if published else None,
            "published_memory": published.outcome.memory.get("total") if published else None,
            "published_step_seconds": None,
            "winner": {"label": result.best_label, "trial": winner.number,
                       "knobs": result.best_knobs, "estimate": result.best_time,
                       "memory": result.best_memory},
            "summary": result.summary(), "chip_memory": ctx_memory(result),
            "seconds": time.perf_counter() - start,
            "command": " ".join([COMMAND, *sys.argv[1:]])}


def ctx_memory(result) -> int | None:
    return result.setup.context.chip_memory() if result.setup is not None else None


def search_table(rows: list[dict]) -> str:
    lines = ["| entry | published plan | its estimate s | its memory GiB | winner | its knobs | "
             "its estimate s | its memory GiB | published / winner | trials (completed, cut) |",
             "|" + "---|" * 10]
    for r in rows:
        w, pub = r["winner"], r["published_estimate"]
        ratio = "-" if not pub or not w["estimate"] else f"{pub / w['estimate']:.2f}x"
        knobs = ", ".join(f"{k}={v}" for k, v in w["knobs"].items())
        cut = sum(v for k, v in r["summary"].items() if k.startswith("cut"))
        lines.append(
            f"| {r['entry']} | {r['published_plan']} | {pub:.3g} | "
            f"{r['published_memory'] / GiB:.1f} | {w['label']} (trial {w['trial']}) | {knobs} | "
            f"{w['estimate']:.3g} | {w['memory'] / GiB:.1f} | {ratio} | {r['trials']} "
            f"({r['summary'].get('completed', 0)}, {cut}) |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| entry | plan | knobs | status | memory GiB (args + temps; TPU: the compiler's "
             "peak, args and temps as listed) | chip GiB | collectives GB | estimate s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["memory"]
        parts = f"{m.get('argument', 0) / GiB:.1f} + {m.get('temp', 0) / GiB:.1f}"
        if "peak" in m:
            parts = f"peak; listed {parts}"
        mem = f"{m['total'] / GiB:.1f} ({parts})" if "total" in m else "-"
        knobs = ", ".join(f"{k}={v}" for k, v in r["knobs"].items()) or "as published"
        est = f"{r['estimate']:.2f}" if r["estimate"] is not None else "-"
        status = r["status"] + (f" at {r['cut_stage']}" if r["cut_stage"] else "")
        moved = r.get("collective_bytes")
        moved = "-" if moved is None or r["estimate"] is None else f"{moved / 1e9:.1f}"
        lines.append(f"| {r['entry']} | {r['plan']} | {knobs} | {status} | {mem} | "
                     f"{r['chip_memory'] / GiB:.1f} | {moved} | {est} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", required=True)
    p.add_argument("--settings", action="append", default=[])
    p.add_argument("--plan", help="compile this expert plan (megatron_do, fsdp_tp, ...) "
                   "instead of the published one")
    p.add_argument("--search", type=int, metavar="TRIALS",
                   help="search the knobs with the sharding instead (see above)")
    p.add_argument("--study-tag", default="knobs",
                   help="the studies are named ENTRY/TAG in DIR/studies.db; a new tag starts "
                        "afresh where the knobs declared changed (the activation points')")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "knobs"))
    a = p.parse_args()
    suite = load_suite("published-chip")
    by_id = {e.id: e for e in suite.entries}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "knobs.json"
    if a.search:
        path = out / "search.json"
        rows = json.loads(path.read_text()) if path.exists() else []
        for entry_id in a.entries.split(","):
            row = search_entry(suite, by_id[entry_id], a.search, out, a.study_tag)
            print(search_table([row]), flush=True)
            rows = [r for r in rows if r["entry"] != entry_id] + [row]
            path.write_text(json.dumps(rows, indent=1) + "\n")
        (out / "search.md").write_text(
            "# The step's knobs searched with the sharding, on the published mesh "
            "(compiled for the chip)\n\n" + search_table(rows)
            + "\n\nEach row's command is in search.json. Estimates of the static objective; "
            "nothing ran.\n")
        return 0
    rows = json.loads(path.read_text()) if path.exists() else []
    for entry_id in a.entries.split(","):
        for text in ["", *a.settings]:
            setting = parse_setting(text) if text else {}
            row = compile_entry(suite, by_id[entry_id], setting, a.plan)
            print(json.dumps({k: row[k] for k in ("entry", "plan", "knobs", "status", "reason",
                                                  "estimate", "seconds")}), flush=True)
            rows = [r for r in rows
                    if (r["entry"], r["plan"], r["knobs"]) != (entry_id, row["plan"], setting)
                    ] + [row]
            path.write_text(json.dumps(rows, indent=1) + "\n")
    (out / "knobs.md").write_text(
        "# The published plans with the step's knobs changed (compiled for the chip)\n\n"
        + table(rows) + "\n\nEach row's command is in knobs.json.\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
