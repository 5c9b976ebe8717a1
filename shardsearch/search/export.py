"""Exporting a search: its winner (or a chosen trial) as a schema-1 plan file.

`export_config` gathers the winning rules, the mesh, the workload's leaves
with their resolved specs, the results, the hardware and the versions;
`plan.writer.write_config` writes them and `plan.reader` reads them back.

Everything outside "results" is a function of the search's inputs and its
seed, so two runs of the same search write files that differ only under
"results" (where the measured numbers live) and plan files diff cleanly.

A results row of an estimated trial ("static", "hybrid") also carries
"estimate_seconds" and, when the model gave its parts, "breakdown"
(`cost.breakdown.Breakdown.to_json()`); rows without an estimate, and plan
files written before, have neither key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import optuna

from ..base import mesh as _mesh
from ..plan.writer import plan_config, versions
from ..rules.base import rule_from_config
from .evaluation.confirm import median_ci
from .evaluation.objectives import OBJECTIVES
from .evaluation.outcome import Outcome
from .evaluation.stages import COMPLETE, stage_label
from .space.baselines import START_PREFIX
from .space.candidate import is_variant
from .study import attrs as _attrs
from .study.identity import check_workload
from .study.ownership import INTERRUPTED
from .study.record import TrialRecord, summarize

if TYPE_CHECKING:
    from ..workloads import Workload
    from .result import OptimizeResult

# Baselines that are reference points rather than plans an expert would write.
NOT_EXPERT = ("replicated", "default", "search")


def export_config(
    source: OptimizeResult | optuna.Study,
    *,
    workload: Workload | None = None,
    args: Sequence[Any] | None = None,
    trial: int | None = None,
) -> dict[str, Any]:

    """The schema-1 plan of a search's winner (or of one trial), as JSON-ready data.

    The specs are resolved on abstract arguments with an abstract mesh built
    from the study's axes, so no devices are needed.

    Args:
      source: what `optimize` returned, or a stored study (`optuna.load_study`).
      workload: the `Workload` to resolve specs on. Default: the study's own
        workload when it is a built-in ("gpt:tiny"), else the arguments an
        `OptimizeResult` searched on; a stored study run on a user factory
        or a raw step needs `workload` or `args`, because a stored study
        never makes shardsearch import code by itself.
      args: `(state, *batch)` (arrays or ShapeDtypeStructs) instead of a workload.
      trial: export this trial number instead of the winner.

    Returns:
      The plan as a dict; without a workload or args, `"workload"` is None (the
      rules, mesh and results are still there).

    Raises:
      ValueError: the study has no such trial (or it was interrupted before
        it recorded anything), no completed trial, no shardsearch attributes,
        names a workload factory and none was given, or searched another
        workload than the one given (or arguments with other leaves).

    Example:
      >>> write_config(export_config(result), "plan.json")
    """
    study, records, summary = _gather(source)
    attrs = study.user_attrs
    where = f"study {study.study_name!r}"
    if _attrs.MESH not in attrs or not records:
        raise ValueError(
            f"{where} has no shardsearch trials; export studies that shardsearch.optimize "
            "(or `shardsearch optimize`) ran")
    check_workload(study, workload, args)
    best = _best_record(records, summary, where)
    chosen = best if trial is None else _trial(records, trial, where)
    mesh_axes = {str(k): int(v) for k, v in dict(attrs[_attrs.MESH]).items()}
    mesh = _mesh.abstract_mesh(tuple(mesh_axes.values()), tuple(mesh_axes))
    # The winner of an OptimizeResult is exported from the rule objects the
    # search evaluated; a stored study (or another trial) only has them as JSON.
    own = (getattr(source, "best_rule", None), getattr(source, "best_batch_rule", None))
    if trial is None and not isinstance(source, optuna.Study) and None not in own and (
            own[0].to_config(), own[1].to_config()) == (chosen.state_rule, chosen.batch_rule):
        state_rule, batch_rule = own
    else:
        state_rule = rule_from_config(chosen.state_rule, mesh,
                                      f"{where} trial {chosen.number} state_rule")
        batch_rule = rule_from_config(chosen.batch_rule, mesh,
                                      f"{where} trial {chosen.number} batch_rule")
    name = attrs.get(_attrs.WORKLOAD)
    if workload is None and args is None and name is not None:
        workload = _builtin_workload(name, where)
    setup = getattr(source, "setup", None)
    if workload is None and args is None and setup is not None:
        # A result of a raw step carries the arguments it searched on.
        args = setup.context.abstract_args
    config = plan_config(state_rule, batch_rule, mesh, args=args, workload=workload)
    points = attrs.get(_attrs.FLAX_POINTS)
    is_best = chosen.number == best.number
    # What the search could not read (the study's setup, the chosen trial): only
    # when there is something, so other plan files keep their form.
    notes = list(dict.fromkeys([*(attrs.get(_attrs.NOTES) or ()), *chosen.outcome.notes]))
    # Every knob when the result knows the declaration, else those the trial
    # changed from their defaults; absent when the search chose no knobs.
    knobs = (dict(source.best_knobs) if trial is None and getattr(source, "best_knobs", None)
             else dict(chosen.knobs))
    return {
        **config,
        **({"knobs": knobs} if knobs else {}),
        **({"flax_points": points} if points else {}),
        "search": {"study": study.study_name, "workload": name,
                   "objective": attrs.get(_attrs.OBJECTIVE), "seed": attrs.get(_attrs.SEED),
                   "sampler": attrs.get(_attrs.SAMPLER), "budget": attrs.get(_attrs.BUDGET),
                   **({"notes": notes} if notes else {})},
        "hardware": attrs.get(_attrs.HARDWARE),
        "versions": versions(),
        "results": _results(chosen, records, summary, is_best, attrs.get(_attrs.OBJECTIVE),
                            "best" if trial is None else "trial"),
    }


def _gather(
    source: OptimizeResult | optuna.Study,
) -> tuple[optuna.Study, list[TrialRecord], dict[str, Any] | None]:
    """The study, its trial records, and optimize's summary (None if unfinished)."""
    if isinstance(source, optuna.Study):
        records = [r for t in source.get_trials(deepcopy=False)
                   if (r := TrialRecord.from_trial(t)) is not None]
        return source, records, source.user_attrs.get(_attrs.RESULT)
    # An OptimizeResult, recognised by what it carries: `search.result` imports
    # this module for `OptimizeResult.export`, so this one cannot import it back.
    if isinstance(getattr(source, "study", None), optuna.Study) and hasattr(source, "trials"):
        summary = source.to_json()
        del summary["trials"]
        return source.study, list(source.trials), summary
    raise TypeError(
        f"export_config: source must be an OptimizeResult or an optuna.Study, got "
        f"{type(source).__name__}")


def _best_record(records: list[TrialRecord], summary: Mapping[str, Any] | None,
                 where: str) -> TrialRecord:
    complete = [r for r in records if r.outcome.status == COMPLETE]
    if not complete:
        raise ValueError(
            f"{where} has no completed trial to export; run more trials or raise the budget")
    if summary is not None:
        best = summary["best"]
        same = [r for r in complete if r.label == best["label"]
                and r.state_rule == best["state_rule"] and r.batch_rule == best["batch_rule"]]
        # The confirmation names finalists "trial N"; prefer the record it re-timed.
        timed = [r for r in same if _name(r) in summary.get("confirmation", {})]
        if timed or same:
            return (timed or same)[0]
    # An interrupted study has no summary: its lowest value wins, earliest on ties.
    return min(complete, key=lambda r: (r.outcome.value, r.number))


def _trial(records: list[TrialRecord], number: int, where: str) -> TrialRecord:
    for record in records:
        if record.number == number and not record.state_rule:  # interrupted
            raise ValueError(
                f"{where}: trial {number} was interrupted before it recorded its candidate; "
                "export another trial (or the winner)")
        if record.number == number:
            return record
    numbers = [r.number for r in records]
    raise ValueError(
        f"{where} has no shardsearch trial number {number}; its trials run from "
        f"{min(numbers)} to {max(numbers)}")


def _name(record: TrialRecord) -> str:
    return record.label if record.label != "search" else f"trial {record.number}"


def _builtin_workload(name: str, where: str) -> Any:
    from ..workloads import get_workload, list_workloads
    from ..workloads._custom import is_custom_name

    # A custom shape's name spells the whole shape: rebuilding it imports nothing.
    if name not in list_workloads() and not is_custom_name(name):
        raise ValueError(
            f"{where} ran on workload factory {name!r}; pass that workload explicitly "
            f"(--workload {name}) to resolve the specs — a stored study never makes "
            "shardsearch import code by itself")
    return get_workload(name)


def _results(chosen: TrialRecord, records: list[TrialRecord],
             summary: Mapping[str, Any] | None, is_best: bool, objective: str | None,
             selected: str) -> dict[str, Any]:
    """Every measured number: the exported candidate against each baseline.

    The verdict and output check are about the study's winner, so another
    trial gets null for them; a study that never finished has no verdict.
    """
    summary = summary or {}
    confirmation = dict(summary.get("confirmation") or {})
    # The re-timing is by name, one name per compiled program: a trial whose
    # fingerprint is a finalist's (a cache hit: another expert that gives the
    # same specs) ran that very program, so its row carries that re-timing
    # rather than an older search number beside it.
    twins = {r.outcome.fingerprint: _name(r) for r in records
             if r.outcome.status == COMPLETE and _name(r) in confirmation}
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.label == "search":
            continue
        earlier = rows.get(record.label)
        # A baseline interrupted in one run and evaluated in a later one: the later row.
        if earlier is None or (_interrupted(earlier) and record.outcome.reason != INTERRUPTED):
            rows[record.label] = _row(record, confirmation, twins, objective)
    winner = _row(chosen, confirmation, twins, objective)
    # A start plan (`optimize(start_from=...)`) is an earlier answer, not an expert's.
    experts = {k: v["median_seconds"] for k, v in rows.items()
               if k not in NOT_EXPERT and not k.startswith(START_PREFIX)
               and not is_variant(k) and v["median_seconds"] is not None}
    # On a tie, a row timed as itself before one showing its twin's timing.
    best_expert = (min(experts, key=lambda k: (experts[k], "timing_of" in rows[k], k))
                   if experts else None)
    replicated = rows.get("replicated", {}).get("median_seconds")
    for row in (winner, *rows.values()):
        row["speedup_vs_replicated"] = _ratio(replicated, row["median_seconds"])
        row["speedup_vs_best_expert"] = _ratio(experts.get(best_expert), row["median_seconds"])
    return {
        "selected": selected,
        "winner": winner,
        "baselines": list(rows.values()),  # a list keeps trial order through sort_keys
        "best_expert": best_expert,
        "verdict": summary.get("verdict", "unconfirmed") if is_best else None,
        "outputs_match": summary.get("outputs_match") if is_best else None,
        "max_relative_error": summary.get("max_relative_error") if is_best else None,
        "trials": summarize(records),
        "compiles": summary.get("compiles"),
        # Workers sharing a study: who re-timed the finalists (`search.claims`).
        **({"confirmed_by": summary["confirmed_by"]} if "confirmed_by" in summary else {}),
    }


def _row(record: TrialRecord, confirmation: Mapping[str, Any], twins: Mapping[str, str],
         objective: str | None) -> dict[str, Any]:
    """A results row; `twins` names the confirmed finalist of each
    fingerprint, whose re-timing a completed trial of that fingerprint shows
    (with `timing_of` naming it when it is another trial's)."""
    o = record.outcome
    median = ci = timed_in = None
    twin = twins.get(o.fingerprint) if o.status == COMPLETE else None
    timed_as = _name(record) if _name(record) in confirmation else twin
    if timed_as is not None:
        timing = confirmation[timed_as]
        median, ci, timed_in = timing["median"], list(timing["ci"]), "confirmation"
    elif o.status == COMPLETE:
        median, timed_in = o.value, _timed_in(objective, o)
        if o.step_times:
            ci = list(median_ci(o.step_times))
    row = {"label": record.label, "trial": record.number, "status": o.status.value,
           "cut_stage": stage_label(o.cut_stage),
           "reason": o.reason or None, "median_seconds": median, "ci_seconds": ci,
           "timed_in": timed_in, "memory_per_device": dict(sorted(o.memory.items())),
           # XLA's log lines while it compiled and ran (e.g. rematerialization warnings).
           "log_lines": o.log_count, "log_first": o.log_first or None}
    if timed_as is not None and timed_as != _name(record):
        row["timing_of"] = timed_as
    if o.estimate is not None:
        row["estimate_seconds"] = o.estimate
    if o.breakdown is not None:
        row["breakdown"] = o.breakdown
    return row


def _interrupted(row: Mapping[str, Any]) -> bool:
    return row["status"] == "failed" and row["reason"] == INTERRUPTED


def _timed_in(objective: str | None, outcome: Outcome) -> str:
    """Where a completed trial's number came from: the objective's `timed_in`.

    A study records its objective by name; one this process has not
    registered (a user's objective, run elsewhere) is judged by the outcome
    itself: timed repeats mean "search", none "estimate". Studies from before
    objectives were recorded were measured.
    """
    if objective is None:
        return "search"
    if objective in OBJECTIVES:
        return OBJECTIVES[objective].timed_in
    return "search" if outcome.step_times else "estimate"


def _ratio(reference: float | None, value: float | None) -> float | None:
    if reference is None or not value:
        return None
    return reference / value


