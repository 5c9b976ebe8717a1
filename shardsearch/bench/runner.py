"""Running a benchmark suite: search each entry, then time every plan in one run.

A suite (`suite.Suite`: the hardware it is for and its entries) is run entry
by entry. For each entry the runner

  1. runs `optimize` (its study stored under the output folder, so a killed
     entry resumes), whose own interleaved confirmation of its top candidates
     and closest baselines, as many rounds as the comparison below, picks the
     winner exactly as a user's run would (recorded under `search`),
  2. checks every plan — the winner, replicated, the original design's default
     rule, each expert plan — against the budget (analyzer, then XLA),
  3. re-times the plans that fit, plus a 1-device reference on simulated CPU
     meshes, interleaved in ONE `search.confirm.retime` run, so every comparison of
     the entry is measured under the same conditions,
  4. writes `<out>/<suite>/entries/<id>.json` and exports the winner to
     `<rules>/<suite>/<id>.json`.

Finished entries are kept and skipped on the next run, which is how a suite
that takes hours resumes. `report` turns the entry files into tables and plots.
Both output folders are the caller's (the command line's are relative to the
current folder); nothing here assumes a repository layout.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import optuna

from ..base import mesh as _mesh
from ..base.activations import AUTO
from ..base.activations import PREFIX as ACTIVATION_KNOB
from ..base.analyzer import ShardingAnalyzer
from ..base.target import target_mesh, target_of
from ..base.units import parse_bytes
from ..cost.chips import HARDWARE, hardware_for
from ..cost.program import XlaMemory
from ..plan.reader import load_plan
from ..plan.writer import plan_config, strict_json, write_config
from ..search.evaluation import confirm as _confirm
from ..search.evaluation import evaluate as _evaluate
from ..search.evaluation.objectives import get_objective
from ..search.evaluation.stages import COMPLETE, CUT, FAILED, Stage
from ..search.export import export_config
from ..search.loop import optimize
from ..search.setup import make_context
from ..search.space.baselines import START_PREFIX, baseline_candidates
from ..search.space.differences import plan_differences
from ..search.study.record import TrialRecord, prediction_summary
from ..search.study.storage import open_study
from ..workloads import expert_plan, expert_plans, get_workload
from . import published as _published
from . import report as _report
from .suite import PUBLISHED, QUARTER, Entry, Suite


@dataclasses.dataclass(frozen=True)
class SuiteRun:
    """What `run_suite` did: entry ids finished now, skipped (already done), failed."""

    folder: Path
    finished: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: dict[str, str]
    notes: tuple[str, ...]


def run_suite(
    suite: Suite,
    *,
    out: str | Path,
    rules_dir: str | Path,
    entries: Sequence[str] | None = None,
    force: bool = False,
    trials: int | None = None,
    repeats: int | None = None,
    rounds: int | None = None,
    quiet: bool = True,
    command: str = "",
    log: Callable[[str], None] = lambda line: None,
    start_from: str | Path | None = None,
    memory_prediction: str = "cut",
) -> SuiteRun:
    """Runs the suite's entries that have no result yet, then rewrites the report.

    Call `suite.prepare_devices(suite)` first. An entry that fails is reported and
    left without a result (the next run tries it again); the others go on.

    Args:
      suite: the suite.
      out: results go to `<out>/<suite>/`.
      rules_dir: winners are exported to `<rules_dir>/<suite>/<id>.json`.
      entries: ids to run (default all).
      force: rerun entries that already have a result (their studies resume).
      trials, repeats, rounds: override the suite's (for quick checks).
      quiet: no progress bar during searches.
      command: the command line, recorded in machine.json.
      log: called with one line per step.
      start_from: a folder of plan files, `<start_from>/<suite>/<id>.json`
        (another run's `rules_dir`): an entry with one evaluates it beside
        the baselines (`optimize(start_from=...)`), so its winner is never
        worse than that plan in this run's search. Entries without one run
        as usual.
      memory_prediction: what stage 1 does with a candidate's predicted memory
        (`optimize(memory_prediction=...)`); recorded in each entry.
    """
    if start_from is not None and not Path(start_from).is_dir():
        raise ValueError(f"start plans: {start_from} is not a folder; give a folder of "
                         "<suite>/<entry>.json plan files (another run's rules folder)")
    if rounds is not None:
        _confirm.check_rounds(rounds, "bench: rounds", zero_ok=False)
    selected = suite.select(entries)
    folder = Path(out) / suite.name
    (folder / "entries").mkdir(parents=True, exist_ok=True)
    machine = _report.machine_info(command)
    _write_json(folder / "machine.json", machine)
    finished, skipped, failed = [], [], {}
    for i, entry in enumerate(selected, 1):
        target = folder / "entries" / f"{entry.id}.json"
        tag = f"[{i}/{len(selected)}] {entry.id}"
        if target.exists() and not force:
            log(f"{tag}: done already ({target}); --force reruns it")
            skipped.append(entry.id)
            continue
        log(f"{tag}: {entry.workload_name} on {entry.mesh}, {entry.objective}, budget "
            f"{entry.budget or 'none'}")
        try:
            record = run_entry(suite, entry, folder, Path(rules_dir), trials=trials,
                               repeats=repeats, rounds=rounds, quiet=quiet, log=log,
                               previous=_report._read(target),
                               start_from=None if start_from is None else Path(start_from),
                               memory_prediction=memory_prediction)
        except (RuntimeError, ValueError) as err:  # this entry's, not the suite's
            failed[entry.id] = f"{type(err).__name__}: {err}"
            log(f"{tag}: FAILED: {failed[entry.id]}")
            continue
        record["machine"] = machine
        _write_json(target, record)
        finished.append(entry.id)
        log(f"{tag}: {_report.entry_line(record)}")
        _report.write_report(suite, folder)
    notes = _report.write_report(suite, folder)
    return SuiteRun(folder, tuple(finished), tuple(skipped), failed, tuple(notes))


def resolve_budget(entry: Entry, workload: Any, mesh: Any, *,
                   published: Mapping[str, Any] | None = None,
                   hardware: Any = None) -> dict[str, Any]:
    """The entry's budget in bytes (`"bytes"`, None for none) and how it was set.

    "published" is the larger of `hardware`'s memory and the published plan's
    XLA total per device (`published`: `published.estimate_published`'s
    record): a plan needing no more than the one that ran on the chip.

    "quarter" is a quarter of the replicated plan's XLA total per device
    (arguments + outputs + temporaries - aliased), the figure the search's
    compile-stage cut compares with the budget. A quarter of its arguments
    alone (the analyzer's estimate, also recorded) is below every plan's XLA
    total for the transformer workloads, whose activations outweigh their
    parameters, so no plan at all would fit.
    """
    out: dict[str, Any] = {"spec": entry.budget, "bytes": None}
    if entry.budget == QUARTER:
        ctx, _ = make_context(workload, None, mesh, memory_budget=None, objective="static")
        replicated = baseline_candidates(None, mesh)["replicated"].specs(ctx.abstract_args)
        out["replicated_arguments"] = ShardingAnalyzer(mesh).estimate_memory_usage(
            tuple(ctx.abstract_args), replicated)["size_per_device"]
        compiled, _seconds = _evaluate.compile_step(replicated, ctx)
        out["replicated_total"] = XlaMemory.from_compiled(compiled).total
        out["bytes"] = out["replicated_total"] // 4
    elif entry.budget == PUBLISHED and target_of(mesh) is not None:
        # Compiled by the chip's compiler: its memory is the limit, whatever
        # the published plan needs (it fits, or the compiler says it does not).
        out["chip_bytes"] = out["bytes"] = (target_of(mesh).memory_bytes
                                            or getattr(hardware, "memory_bytes", None))
    elif entry.budget == PUBLISHED:
        chip = getattr(hardware, "memory_bytes", None)
        need = ((published or {}).get("memory_per_device") or {}).get("total")
        out.update(chip_bytes=chip, published_total=need)
        known = [x for x in (chip, need) if x is not None]
        out["bytes"] = max(known) if known else None
    elif entry.budget is not None:
        out["bytes"] = parse_bytes(entry.budget)
    return out


def _published_plan_file(entry: Entry, workload: Any, mesh: Any, folder: Path
                         ) -> Path | None:
    """The entry's published plan as a plan file for the search to start from,
    where it is not one of the expert baselines every search runs (Megatron-LM's
    `megatron_do`): `<folder>/published-plans/<id>/<plan>.json`, labelled
    `plan:<plan>` in the search. None when there is no published run, or its
    plan is an expert baseline already.

    Without it the search would never evaluate the plan it is compared with,
    and a winner could be reported against the published plan's estimate
    without having met it under the same budget and knobs.
    """
    if entry.published is None or entry.published.plan in expert_plans(workload, mesh).plans:
        return None
    plan = expert_plan(workload, mesh, entry.published.plan)
    path = folder / "published-plans" / entry.id / f"{entry.published.plan}.json"
    return write_config(plan_config(plan.state_rule, plan.batch_rule, mesh), path)


def entry_mesh(suite: Suite, entry: Entry) -> jax.sharding.Mesh:
    """The mesh an entry runs on: its chip's compile-only devices for a target
    suite (`target_mesh`, with the entry's `dcn_axes`), else this host's first
    devices."""
    dims, names = _mesh.parse_mesh(entry.mesh)
    if suite.target:
        return target_mesh(entry.hardware or suite.hardware,
                           dict(zip(names, dims, strict=True)), dcn_axes=entry.dcn_axes)
    return _mesh.create_mesh(dims, names, devices=jax.devices()[:math.prod(dims)])


def run_entry(suite: Suite, entry: Entry, folder: Path, rules_dir: Path, *,
              trials: int | None = None, repeats: int | None = None,
              rounds: int | None = None, quiet: bool = True,
              log: Callable[[str], None] = lambda line: None,
              previous: Mapping[str, Any] | None = None,
              start_from: Path | None = None,
              memory_prediction: str = "cut") -> dict[str, Any]:
    """Searches one entry, compares every plan in one interleaved run, exports
    the winner; returns the entry's record (what `entries/<id>.json` holds).

    `previous` is the entry's record from an earlier run (`--force`): the cost
    of the searches recorded there is kept under `search.earlier_runs`, since
    a rerun over a finished study runs no trial and could not tell it.

    `start_from`: a folder; `<start_from>/<suite>/<id>.json`, where it exists,
    is evaluated beside the baselines (`run_suite`)."""
    # Each entry starts without the executables the previous ones left in
    # JAX's caches: a suite would otherwise grow to tens of GB in one process.
    jax.clear_caches()
    workload = get_workload(entry.workload_name)
    chip = entry.hardware or suite.hardware
    mesh = entry_mesh(suite, entry)
    repeats = repeats or suite.repeats
    n_trials = trials or entry.trials
    hardware = HARDWARE[chip] if chip else None
    published = None
    if entry.published is not None:
        log(f"  published run: estimating its plan {entry.published.plan!r} without a budget")
        published = _published.estimate_published(workload, mesh, entry.published, hardware,
                                                   entry.dcn_axes)
    budget = resolve_budget(entry, workload, mesh, published=published, hardware=hardware)
    storage = f"sqlite:///{(folder / 'studies.db').resolve()}"
    # A study searched another space is another study: the rules-only entries
    # recorded before logical axes existed keep their own.
    study_name = f"bench/{suite.name}/{entry.id}" + (
        "" if entry.space == "rules" else f"/{entry.space}")
    before = _finished_trials(storage, study_name)
    start_plan = None if start_from is None else start_from / suite.name / f"{entry.id}.json"
    if start_plan is not None:
        if start_plan.is_file():
            log(f"  starting from {start_plan} (label plan:{entry.id})")
        else:
            log(f"  no start plan {start_plan}: the search starts from the baselines only")
            start_plan = None
    starts = [start_plan] if start_plan is not None else []
    published_start = _published_plan_file(entry, workload, mesh, folder)
    if published_start is not None:
        log(f"  the published plan {entry.published.plan!r} is not an expert baseline: the "
            f"search starts from it too ({published_start})")
        starts.append(published_start)
    start = time.perf_counter()
    result = optimize(
        workload, mesh=mesh, n_trials=max((n_trials or 10**6) - before, 0),
        timeout=entry.timeout, memory_budget=budget["bytes"], objective=entry.objective,
        storage=storage, study_name=study_name, seed=entry.seed, warmup=suite.warmup,
        repeats=repeats, confirm_rounds=rounds or suite.rounds,
        hardware=hardware, quiet=quiet, space=entry.space, dcn_axes=entry.dcn_axes,
        knobs=entry.knobs, memory_prediction=memory_prediction, start_from=starts)
    wall = time.perf_counter() - start
    log(f"  search: {len(result.trials)} trials ({before} from an earlier run), "
        f"{wall:.0f} s; comparing the plans")
    # The search's own context and baselines, evaluating in this process.
    setup = result.setup
    ctx = setup.local_context()
    known = {r.outcome.fingerprint: r.outcome for r in result.trials
             if r.outcome.fingerprint and not r.outcome.cache_hit}
    # A winner with knobs off their defaults is timed with the step they build.
    setting = (ctx.builds.setting(result.best_knobs)
               if ctx.builds is not None and result.best_knobs else ())
    win_fp = _evaluate.fingerprint(result.best_specs, setting)
    win_trial = min((r.number for r in result.trials
                     if r.outcome.fingerprint == win_fp and r.outcome.status == COMPLETE),
                    default=None)
    winner_ctx = ctx.with_setting(setting)
    plans = [plan_row("winner", "winner", result.best_specs, winner_ctx, known, knobs=setting)]
    if setting:
        plans[0]["context"] = winner_ctx
    if result.best_knobs:
        plans[0]["knobs"] = dict(result.best_knobs)
    plans[0]["source"] = (f"search (trial {win_trial})" if result.best_label == "search"
                          else result.best_label)
    plans[0]["family"] = "logical" if result.best_rule.kind == "logical" else "rules"
    hand_written = tuple(expert_plans(workload, mesh).plans)
    published_label = (None if published_start is None
                       else START_PREFIX + published_start.stem)
    compared = dict(setup.baselines)
    if published_label is not None:  # compared as the expert plan it is
        compared[published_label] = setup.starts[published_label]
    for label, candidate in compared.items():
        specs, fp = _evaluate.resolve(candidate, ctx)
        # Plans the tool derives itself (from the step's logical axes) are
        # timed beside the experts' but are not counted as expert plans.
        role = (label if label in ("replicated", "default")
                else "expert" if label in hand_written or label == published_label
                else "derived")
        # An expert plan with the batch of its activations pinned runs the
        # step built for that (`space.baselines.pin_batch`).
        own = ctx.with_setting(candidate.knobs)
        plans.append(plan_row(label, role, specs, own, known, invalid=fp,
                              knobs=candidate.knobs))
        if candidate.knobs:
            plans[-1]["context"], plans[-1]["knobs"] = own, dict(candidate.knobs)
    one_ctx = None
    objective = get_objective(entry.objective)
    if suite.simulated and objective.needs_host_args:
        one = _mesh.create_mesh((1,), ("x",), devices=jax.devices()[:1])
        one_ctx = dataclasses.replace(ctx, mesh=one, budget=None, compiles=0)
        # The replicated specs name no mesh axis, so they run on any mesh.
        single = next(p["specs"] for p in plans if p["label"] == "replicated")
        plans.append(plan_row("single_device", "single_device", single, one_ctx, {}))
        plans[-1]["context"] = one_ctx
    rounds = rounds or suite.rounds
    if objective.confirms:
        _time_plans(plans, ctx, rounds)
    compare = time.perf_counter() - start - wall
    plans[0]["differs"] = _differs(plans, ctx, setting)
    config = export_config(result)
    rule_file = write_config(config, rules_dir / suite.name / f"{entry.id}.json")
    cut = [r for r in result.trials if r.outcome.status == CUT]
    trial_seconds = sum(r.seconds for r in result.trials)
    cut_seconds = sum(r.seconds for r in cut)
    for plan in plans:
        plan.pop("specs"), plan.pop("context", None)
    extra = {}
    if published is not None:
        extra["published"] = _published.compare(entry, published, result, known, setting)
    return extra | {
        "schema": 1,
        "suite": suite.name,
        "entry": entry.to_json(),
        "workload": entry.workload_name,
        "mesh": _mesh.axis_sizes(mesh),
        "objective": entry.objective,
        "hardware_model": (hardware_for(mesh.devices.flat[0].platform, hardware).name
                           if objective.timed_in == "estimate" else None),
        **({"target": target_of(mesh).to_json()} if target_of(mesh) is not None else {}),
        "budget": budget,
        "timing": {"warmup": suite.warmup, "repeats": repeats, "rounds": rounds,
                   "trials": n_trials, "overridden": trials is not None},
        "plans": plans,
        "experts_skipped": dict(expert_plans(workload, mesh).skipped),
        "speedups": _report.speedups(plans),
        "search": {
            "study": study_name, "storage": "studies.db",
            "sampler": result.study.user_attrs.get("sampler"), "wall_seconds": wall,
            "compare_seconds": compare,
            "compare_compiles": ctx.compiles + (one_ctx.compiles if one_ctx else 0),
            "trials_before": before, "trial_seconds": trial_seconds,
            "earlier_runs": _earlier_runs(previous),
            "cut_seconds": cut_seconds,
            "cut_share": cut_seconds / trial_seconds if trial_seconds else None,
            "memory_prediction": memory_prediction,
            "prediction": prediction_summary(result.trials, ctx.memory_limit()),
            "compiles": result.compiles, "trials": result.summary(),
            "winner": {"label": result.best_label, "trial": win_trial,
                       "search_seconds": known[win_fp].value if win_fp in known else None},
            "confirmation": {
                "rounds": rounds if result.confirmation else 0, "verdict": result.verdict,
                "timings": {name: t.to_json() for name, t in result.confirmation.items()}},
            "outputs_match": result.outputs_match,
            "max_relative_error": result.max_relative_error,
        },
        "rule_file": str(rule_file),
        "start_plan": None if start_plan is None else str(start_plan),
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _differs(plans: Sequence[dict[str, Any]], ctx: Any,
             setting: tuple[tuple[str, Any], ...]) -> dict[str, Any] | None:
    """What the winner changes against the best expert plan that fits (the
    report's reference, `report.speedups`), by dimension
    (`plan_differences`); None when no expert plan fits."""
    best = _report.best_expert(plans)
    if best is None:
        return None
    return _changes(ctx.abstract_args, plans[0]["specs"], setting, best["label"], best["specs"],
                    ctx.builds.defaults if ctx.builds is not None else {},
                    tuple((best.get("knobs") or {}).items()))


def _changes(args: Sequence[Any], specs: Any, setting: tuple[tuple[str, Any], ...],
             reference: str, reference_specs: Any, defaults: Mapping[str, Any],
             reference_setting: tuple[tuple[str, Any], ...] = ()) -> dict[str, Any]:
    """A winner row's `differs`: the reference's label and the dimensions the
    winner changes against it (the reference runs at `reference_setting`,
    the knobs' defaults otherwise)."""
    return {"reference": reference,
            "dimensions": plan_differences(args, specs, reference_specs, setting,
                                           reference_setting, defaults=defaults)}


def record_differences(suite: Suite, folder: Path, rules_root: Path = Path("."),
                       ) -> tuple[list[str], dict[str, str]]:
    """Adds to each entry recorded under `folder/entries` without it what its
    winner changes against the best expert plan (`plan_differences`, the
    report's *winner changes*), from the winner's exported plan file (its
    `rule_file`, relative to `rules_root`) and the expert plan rebuilt on the
    entry's mesh; nothing is compiled or timed. An entry whose plan file
    gives specs of another fingerprint than its recorded winner (the file was
    overwritten by another run) is left as it is.

    Returns:
      `(changed, skipped)`: the names of the entry files given their winner's
      changes (then rewrite the report: `report.write_report`), and those left
      as they are, each with the reason.

    Raises:
      ValueError: an entry's plan file is missing.
    """
    changed, skipped = [], {}
    ids = {e.id for e in suite.entries}
    for path in sorted((folder / "entries").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        winner = record["plans"][0]
        if "differs" in winner or record["entry"]["id"] not in ids:
            continue
        entry = suite.select([record["entry"]["id"]])[0]
        best = _report.best_expert(record["plans"])
        if best is None:
            winner["differs"] = None
        else:
            mesh = entry_mesh(suite, entry)
            workload = get_workload(entry.workload_name)
            args = workload.abstract()
            rule_file = rules_root / record["rule_file"]
            if not rule_file.is_file():
                raise ValueError(f"{path}: its winner's plan file {rule_file} is missing; "
                                 "pass the folder the entry's rule_file is relative to")
            specs, setting, defaults = plan_file_specs(workload, rule_file, mesh, args)
            found = _evaluate.fingerprint(specs, setting)
            if found != winner["fingerprint"]:
                skipped[path.name] = (f"{rule_file} gives specs of fingerprint {found}, the "
                                      f"entry's winner has {winner['fingerprint']}: not its plan")
                continue
            reference = baseline_candidates(workload, mesh)[best["label"]].specs(args)
            winner["differs"] = _changes(args, specs, setting, best["label"], reference,
                                         defaults, tuple((best.get("knobs") or {}).items()))
        _write_json(path, record)
        changed.append(path.name)
    return changed, skipped


def plan_file_specs(workload: Any, path: Path, mesh: Any, args: Sequence[Any]
                    ) -> tuple[Any, tuple[tuple[str, Any], ...], dict[str, Any]]:
    """A winner's exported plan file read as the runner recorded the winner.

    Returns:
      `(specs, setting, defaults)`: the file's spec trees for `args`, the
      knob setting a fingerprint counts (`fingerprint(specs, setting)` is
      the recorded winner's if the file is its plan) and each knob's
      default: the step's own knobs as the workload declares them, the
      activation points "auto" unless the file places them.
    """
    plan = load_plan(path, mesh=mesh)
    knobs = workload.knobs
    points = {n: v for n, v in plan.knobs.items() if n.startswith(ACTIVATION_KNOB)}
    own = {n: v for n, v in plan.knobs.items() if n not in points}
    setting = ((knobs.setting(own) if knobs is not None else ())
               + tuple((n, v) for n, v in points.items() if v != AUTO))
    defaults = {**(knobs.defaults if knobs is not None else {}),
                **dict.fromkeys(points, AUTO)}
    return plan.apply(args), setting, defaults


def _earlier_runs(previous: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The search cost of every earlier run of an entry, oldest first."""
    if not previous or "search" not in previous:
        return []
    s = previous["search"]
    return [*s.get("earlier_runs", []), {
        "finished_at": previous.get("finished_at"), "wall_seconds": s["wall_seconds"],
        "compiles": s["compiles"], "trials_before": s.get("trials_before") or 0,
        "new_trials": s["trials"]["trials"] - (s.get("trials_before") or 0)}]


def _finished_trials(storage: str, study_name: str) -> int:
    """Trials an earlier run of this entry recorded (0 for a new study)."""
    try:
        if study_name not in optuna.study.get_all_study_names(storage):
            return 0
    except Exception:  # a missing or new database: optimize reports real problems
        return 0
    study = open_study(storage, study_name, create=False)
    return sum(TrialRecord.from_trial(t) is not None for t in study.get_trials(deepcopy=False))


def plan_row(label: str, role: str, specs: Any, ctx: Any, known: Mapping[str, Any],
             invalid: str = "", knobs: tuple[tuple[str, Any], ...] = ()) -> dict[str, Any]:
    """A plan's row as an entry records it, with its fit and memory: from the
    search's record of its specs when `known` (fingerprint → `Outcome`) has
    it, else checked here against `ctx`'s budget (analyzer, then a compile
    for XLA's numbers); `fits` False with `status` "does not fit" or
    "failed" and the `reason` when it does not. `knobs`: the step's knob
    setting `ctx` was built for (`Context.with_setting`)."""
    row: dict[str, Any] = {"label": label, "role": role, "specs": specs, "fits": False,
                           "status": None, "reason": None, "median_seconds": None,
                           "ci_seconds": None, "times": [], "timed_as": None}
    if specs is None:
        return {**row, "fingerprint": None, "status": "invalid", "reason": invalid,
                "memory_per_device": {}}
    fp = _evaluate.fingerprint(specs, knobs)
    row["fingerprint"] = fp
    outcome = known.get(fp)
    if outcome is None or (ctx.objective.needs_host_args and "total" not in outcome.memory
                           and outcome.cut_stage != Stage.CHECK):
        outcome = _evaluate.evaluate(specs, fp, ctx, run=False)  # stages 1-2 (+ estimate)
    row["memory_per_device"] = dict(sorted(outcome.memory.items()))
    if outcome.status == FAILED or outcome.cut_stage in (Stage.CHECK, Stage.COMPILE):
        row["status"] = "failed" if outcome.status == FAILED else "does not fit"
        row["reason"] = outcome.reason
        return row
    row["fits"] = True
    if ctx.objective.timed_in == "estimate":
        row.update(status="estimated", median_seconds=outcome.value)
    return row


def _time_plans(plans: list[dict[str, Any]], ctx: Any, rounds: int) -> None:
    """Every distinct plan that fits, timed in one interleaved run; twins share."""
    first: dict[str, str] = {}
    finalists: list[tuple[Any, ...]] = []
    for plan in plans:
        if not plan["fits"]:
            continue
        key = plan["fingerprint"] if plan["role"] != "single_device" else "single_device"
        if key in first:
            plan["timed_as"] = first[key]
            continue
        first[key] = plan["label"]
        own = (plan["context"],) if "context" in plan else ()
        finalists.append((plan["label"], plan["specs"], *own))
    timings = _confirm.retime(finalists, ctx, rounds)
    for plan in plans:
        timing = timings.get(plan["timed_as"] or plan["label"])
        if timing is not None:
            plan.update(status="timed", median_seconds=timing.median, ci_seconds=list(timing.ci),
                        times=list(timing.times))


def _write_json(path: Path, data: Any) -> None:
    """Whole or not at all, keys sorted, strict JSON (NaN as null)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(strict_json(data), indent=1, sort_keys=True, allow_nan=False) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
