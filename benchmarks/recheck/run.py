"""Recheck a suite's verdicts: re-time recorded winners against a reference, again and again.

A suite entry compares its plans in one interleaved run. On a noisy machine
(simulated devices sharing two cores) plans a few percent apart can swap
places between runs, so a "faster" or "slower" verdict from one run says
little about the next. This script takes the recorded entries of a suite,
loads each winner from its exported rule file (`rules/<suite>/<id>.json`,
the file a user would load) and the reference plan (by default the entry's
best expert plan that fits), and re-times the pair interleaved `--times`
times, each a fresh run of `--rounds` rounds. Every repetition gets its own
ratio, 95% CI and paired Wilcoxon verdict, computed as the suite's report
computes them.

By default it rechecks the entries whose winner is not the best expert plan
itself (a "same plan" entry has nothing to recheck). Output: `recheck.json`
(every time) and `recheck.md` (one row per entry) in the suite's results
folder, or `--out`; there, a recheck of some entries keeps the others'
earlier rechecks, and the suite's `results.md` is rewritten to show each
beside its entry's headline ratio.

Run from the repository root (the default `--results` folder and the rule
files recorded in the entries are relative to it), with nothing else running,
shardsearch installed (`pip install -e .`):

    python benchmarks/recheck/run.py --suite cpu-sim8
    python benchmarks/recheck/run.py --suite cpu-sim8 --entries mlp-small-dp8 --times 5
    python benchmarks/recheck/run.py --suite cpu-sim8 --against replicated   # any baseline
    python benchmarks/recheck/run.py --suite cpu-sim8 --against dp_do --entries moe-small-dp8

`--against` may also name a plan no suite runs (`NAMED_ONLY_PLANS`: dp_do,
data parallelism with the Adam moments split, ZeRO-1; megatron_do): it is
built for the entry's mesh, with its activations' batch pinned to its batch
split as the suite pins its expert plans, a winner with its very specs (and
knobs) is reported as the same plan (nothing to time), one over the entry's
budget (the analyzer, then XLA's figures) is reported as not fitting, and
the output goes to `versus-<plan>/` in the suite's folder, apart from the
rechecks the suite's report shows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path
from typing import Any

from shardsearch import create_mesh, parse_mesh
from shardsearch.bench import (
    format_speedup,
    load_suite,
    plan_file_specs,
    plan_row,
    prepare_devices,
    speedup,
    write_report,
)
from shardsearch.search import (
    Candidate,
    baseline_candidates,
    fingerprint,
    make_context,
    pin_batch,
    retime,
)
from shardsearch.workloads import NAMED_ONLY_PLANS, expert_plan, get_workload

BEST_EXPERT = "best_expert"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", required=True, help="suite name or file (as for `bench`)")
    p.add_argument("--suites-dir", help="look suite names up in this folder instead of the "
                   "suites shipped with shardsearch (as for `bench`)")
    p.add_argument("--results", default="benchmarks/results",
                   help="where the suite's results are (default benchmarks/results)")
    p.add_argument("--entries", help="comma-separated entry ids (default: every entry whose "
                   "winner differs from its reference)")
    p.add_argument("--against", default=BEST_EXPERT,
                   help="the reference plan: best_expert (default), a baseline's name "
                   "(replicated, default, dp, fsdp, ...) or a plan built by name (dp_do, "
                   "megatron_do)")
    p.add_argument("--times", type=int, default=3, help="repetitions per entry (default 3)")
    p.add_argument("--rounds", type=int, default=20,
                   help="interleaved rounds per repetition (default 20)")
    p.add_argument("--out", help="output folder (default: the suite's results folder)")
    p.add_argument("--rerender", action="store_true",
                   help="re-time nothing: recompute every ratio, CI and verdict of the "
                   "existing recheck.json from the times it holds (and the entries' "
                   "recorded figures), and rewrite recheck.json and recheck.md")
    a = p.parse_args(argv)
    if a.rerender:
        return rerender(Path(a.results) / Path(a.suite).stem)
    if a.times < 1 or a.rounds < 6:
        p.error("--times must be at least 1 and --rounds at least 6 (the paired test "
                "needs 6 rounds)")

    try:
        suite = load_suite(a.suite, a.suites_dir)
        prepare_devices(suite)
        folder = Path(a.results) / suite.name
        records = _records(folder, suite, a.entries.split(",") if a.entries else None,
                           a.against)
        # Every plan file checked before anything is timed.
        prepared = {record["entry"]["id"]: prepare(suite, record, reference)
                    for record, reference in records}
    except ValueError as err:
        p.error(str(err))
    if not records:
        print(f"nothing to recheck in {folder}/entries (no entry whose winner differs from "
              f"its {a.against})", file=sys.stderr)
        return 1
    # A plan the suite did not run gets its own folder: the suite's report
    # shows the rechecks against the plans it compared.
    out = (Path(a.out) if a.out else folder / f"versus-{a.against}"
           if a.against in NAMED_ONLY_PLANS else folder)
    command = " ".join(["python", "benchmarks/recheck/run.py",
                        *(sys.argv[1:] if argv is None else argv)])
    results = []
    for record, reference in records:
        entry_id = record["entry"]["id"]
        print(f"{entry_id}: winner against {reference}, {a.times} x {a.rounds} rounds",
              flush=True)
        result = recheck(record, reference, prepared[entry_id], times=a.times,
                         rounds=a.rounds)
        for i, rep in enumerate(result["repetitions"], 1):
            print(f"  {i}: {format_speedup(rep)}", flush=True)
        results.append({**result, "command": command, "finished_at": _now()})
    summary = {"suite": suite.name, "times": a.times, "rounds": a.rounds,
               "against": a.against, "command": command, "finished_at": _now(),
               "entries": _merged(out / "recheck.json", results, suite)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "recheck.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "recheck.md").write_text(markdown(summary), encoding="utf-8")
    print(f"wrote {out / 'recheck.md'}")
    if out.resolve() == folder.resolve():
        # The suite's report shows each recheck beside the entry's headline.
        notes = write_report(suite, folder)
        print(f"rewrote {folder / 'results.md'}" + "".join(f"; {n}" for n in notes))
    return 0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _merged(path: Path, results: list[dict[str, Any]], suite: Any) -> list[dict[str, Any]]:
    """This run's rechecks, with the earlier ones of `path` for the entries it
    did not recheck (each keeping the command and time that made it), in
    suite order: a recheck of some entries does not drop the others'."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        earlier = {}
    done = {r["entry"] for r in results}
    kept = [{"command": earlier.get("command"), "finished_at": earlier.get("finished_at"), **e}
            for e in earlier.get("entries", []) if e["entry"] not in done]
    order = [e.id for e in suite.entries]
    return sorted(kept + results, key=lambda e: (
        order.index(e["entry"]) if e["entry"] in order else len(order), e["entry"]))


def _records(folder: Path, suite: Any, ids: list[str] | None,
             against: str) -> list[tuple[dict[str, Any], str]]:
    """The entry records to recheck, each with its reference plan's name."""
    wanted = [e.id for e in suite.select(ids)]
    out = []
    for entry_id in wanted:
        path = folder / "entries" / f"{entry_id}.json"
        if not path.exists():
            if ids:
                raise ValueError(f"{path} does not exist; run the entry first "
                                 f"(shardsearch bench --suite {suite.name} --entries {entry_id})")
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["objective"] != "measured":
            continue
        plans = {p["label"]: p for p in record["plans"]}
        if against == BEST_EXPERT:
            reference = record["speedups"]["vs_best_expert"]["reference"]
        else:
            reference = against
            if against not in plans and against not in NAMED_ONLY_PLANS:
                raise ValueError(f"entry {entry_id} has no plan {against!r}; its plans are "
                                 f"{', '.join(plans)}, and the plans built by name "
                                 f"{', '.join(NAMED_ONLY_PLANS)}")
        if reference not in plans:
            # Built by name at the recheck, which tells a same plan.
            if reference is not None:
                out.append((record, reference))
            continue
        if not plans[reference]["fits"]:
            continue
        if plans[reference]["fingerprint"] == plans["winner"]["fingerprint"]:
            if ids:
                raise ValueError(f"entry {entry_id}'s winner is the plan {reference!r} "
                                 "itself: nothing to recheck; name another with --against")
            continue
        out.append((record, reference))
    return out


def prepare(suite: Any, record: dict[str, Any], reference: str) -> dict[str, Any]:
    """What `recheck` times for an entry: its context, the plan rows, and the
    winner's and the reference's spec trees, the winner's checked to be the
    recorded one. Raises ValueError (before anything is timed) when the plan
    file is another run's, or the reference does not apply."""
    import jax

    entry = suite.select([record["entry"]["id"]])[0]
    dims, names = parse_mesh(entry.mesh)
    mesh = create_mesh(dims, names, devices=jax.devices()[:math.prod(dims)])
    workload = get_workload(entry.workload_name)
    # The entry's knobs, as the suite searched them: a plan's step knobs and
    # activation pins (`act_*`) build its own step (`Context.with_setting`).
    ctx, _ = make_context(workload, None, mesh, memory_budget=record["budget"]["bytes"],
                          objective="measured", seed=entry.seed, warmup=suite.warmup,
                          repeats=suite.repeats, knobs=entry.knobs)
    plans = {p["label"]: p for p in record["plans"]}
    winner_specs, setting, _ = plan_file_specs(workload, Path(record["rule_file"]), mesh,
                                               ctx.abstract_args)
    if fingerprint(winner_specs, setting) != plans["winner"]["fingerprint"]:
        raise ValueError(f"entry {record['entry']['id']}: {record['rule_file']} gives specs "
                         f"of fingerprint {fingerprint(winner_specs, setting)}, the entry's "
                         f"winner has {plans['winner']['fingerprint']}: the file is another "
                         "run's plan; rerun the entry or restore its plan file")
    settings = {"winner": setting}
    if reference in plans:
        reference_specs = baseline_candidates(workload, mesh)[reference].specs(
            ctx.abstract_args)
        recorded = speedup(plans["winner"], plans[reference])
        recorded = {k: recorded[k] for k in ("speedup", "ratio_ci", "verdict")}
        settings[reference] = tuple((plans[reference].get("knobs") or {}).items())
    else:
        # A plan the suite did not run (`NAMED_ONLY_PLANS`): built here, with
        # no recorded figure; the same specs as the winner's are no contest.
        # It must fit the entry's budget as the suite's plans did: the
        # analyzer, then XLA's figures after a compile.
        # Pinned as the suite pins its expert plans (`pin_batch`: the
        # activations' batch on the plan's batch split, where the step names
        # one), so a pinned winner is not set against an unpinned plan.
        plan = expert_plan(workload, mesh, reference)
        built = pin_batch({reference: Candidate(plan.state_rule, plan.batch_rule, reference)},
                          ctx.builds, ctx.abstract_args,
                          dict(mesh.shape))[reference]
        reference_specs = built.specs(ctx.abstract_args)
        settings[reference] = built.knobs
        fp = fingerprint(reference_specs, built.knobs)
        if fp == plans["winner"]["fingerprint"]:  # the winner's own plan: its fit is on record
            row = {"label": reference, "role": "expert", "fingerprint": fp, "fits": True}
        else:
            row = plan_row(reference, "expert", reference_specs, ctx.with_setting(built.knobs),
                           {}, knobs=built.knobs)
        plans[reference] = {**row, "knobs": dict(built.knobs)}
        recorded = None
    return {"ctx": ctx, "plans": plans, "recorded": recorded,
            "specs": {"winner": winner_specs, reference: reference_specs},
            "contexts": {label: ctx.with_setting(knobs) for label, knobs in settings.items()}}


def recheck(record: dict[str, Any], reference: str, prepared: dict[str, Any], *, times: int,
            rounds: int) -> dict[str, Any]:
    """Re-times an entry's exported winner against `reference`, `times` runs
    (`prepared`: what `prepare` gave for them)."""
    ctx, plans, specs = prepared["ctx"], prepared["plans"], prepared["specs"]
    result = {"entry": record["entry"]["id"], "winner": plans["winner"].get("source"),
              # The run re-timed, so a report can tell a recheck of an earlier run.
              "entry_finished_at": record.get("finished_at"),
              "winner_fingerprint": plans["winner"]["fingerprint"],
              "reference": reference,
              "reference_fingerprint": plans[reference]["fingerprint"],
              "rule_file": record["rule_file"],
              "recorded": prepared["recorded"], "repetitions": []}
    if plans[reference]["fingerprint"] == plans["winner"]["fingerprint"]:
        return {**result, "same_plan": True}
    if not plans[reference]["fits"]:  # nothing to time against
        return {**result, "reference_status": plans[reference]["status"],
                "reference_reason": plans[reference]["reason"],
                "reference_memory": plans[reference]["memory_per_device"]}
    finalists = [(label, specs[label], prepared["contexts"].get(label, ctx))
                 for label in ("winner", reference)]
    for _ in range(times):
        timings = retime(finalists, ctx, rounds)
        # Plan rows as the suite records them, so the ratio, CI and verdict
        # are the report's own.
        win, ref = ({**plans[label], "times": list(timings[label].times),
                     "median_seconds": timings[label].median} for label in ("winner", reference))
        result["repetitions"].append({**speedup(win, ref),
                                      "winner_seconds": win["median_seconds"],
                                      "reference_seconds": ref["median_seconds"],
                                      "winner_times": win["times"],
                                      "reference_times": ref["times"]})
    return result


def rerender(folder: Path) -> int:
    """Recomputes a recheck from its stored times with today's `speedup`."""
    path = folder / "recheck.json"
    summary = json.loads(path.read_text(encoding="utf-8"))
    for e in summary["entries"]:
        record = json.loads((folder / "entries" / f"{e['entry']}.json").read_text(
            encoding="utf-8"))
        plans = {p["label"]: p for p in record["plans"]}
        if e["reference"] in plans:
            recorded = speedup(plans["winner"], plans[e["reference"]])
            e["recorded"] = {k: recorded[k] for k in ("speedup", "ratio_ci", "verdict")}
        else:  # built by name: the suite has no figure
            plans[e["reference"]] = {"label": e["reference"], "role": "expert",
                                     "fingerprint": e["reference_fingerprint"]}
        for i, r in enumerate(e["repetitions"]):
            win = {**plans["winner"], "times": r["winner_times"],
                   "median_seconds": r["winner_seconds"]}
            ref = {**plans[e["reference"]], "times": r["reference_times"],
                   "median_seconds": r["reference_seconds"]}
            e["repetitions"][i] = {**r, **speedup(win, ref)}
    summary["rerendered"] = ("ratios recomputed from the stored times: "
                             "python benchmarks/recheck/run.py --suite "
                             f"{summary['suite']} --rerender")
    path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (folder / "recheck.md").write_text(markdown(summary), encoding="utf-8")
    print(f"wrote {folder / 'recheck.md'}")
    return 0


def markdown(summary: dict[str, Any]) -> str:
    n = max(max(len(e["repetitions"]), 1) for e in summary["entries"])
    against = "best expert" if summary["against"] == BEST_EXPERT else summary["against"]
    lines = [
        f"# Recheck of `{summary['suite']}`", "",
        f"Each entry's exported winner re-timed against its reference "
        f"({against}), {n} separate interleaved runs of "
        f"{summary['rounds']} rounds, after the suite. Ratio = the median per-round ratio "
        "reference / winner (above 1x: the winner is faster) with its 95% CI; \"faster\" "
        "when the paired Wilcoxon test says so and the interval is wholly above 1.", "",
        _commands(summary), "",
        "| entry | winner | reference | in the suite | "
        + " | ".join(f"run {i}" for i in range(1, n + 1)) + " |",
        "|" + "---|" * (4 + n),
    ]
    for e in summary["entries"]:
        runs = (["same plan: nothing to time"] if e.get("same_plan") else
                [f"{e['reference']} {e['reference_status']}: {e['reference_reason']}"]
                if e.get("reference_status") else
                [format_speedup(r) for r in e["repetitions"]])
        recorded = format_speedup(e["recorded"]) if e["recorded"] else "not run by the suite"
        lines.append("| " + " | ".join([e["entry"], str(e["winner"]), e["reference"],
                                        recorded, *runs, *["-"] * (n - len(runs))]) + " |")
    return "\n".join(lines) + "\n"


def _commands(summary: dict[str, Any]) -> str:
    """The command line(s) that made the rechecks, each with when it finished
    and, when there are several, the entries it rechecked."""
    by: dict[str, list[str]] = {}
    last: dict[str, str] = {}
    for e in summary["entries"]:
        command = e.get("command") or summary["command"]
        by.setdefault(command, []).append(e["entry"])
        last[command] = max(last.get(command, ""), e.get("finished_at")
                            or summary["finished_at"])
    rerendered = f"; {summary['rerendered']}" if summary.get("rerendered") else ""
    if len(by) == 1:
        command, = by
        return f"Command: `{command}` ({last[command]}){rerendered}"
    return "Commands: " + "; ".join(f"`{command}` ({last[command]}: {', '.join(ids)})"
                                    for command, ids in by.items()) + rerendered


if __name__ == "__main__":
    sys.exit(main())
