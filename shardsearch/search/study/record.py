"""One trial as the study records it: what was proposed and what happened.

A trial's user attributes: "label", "seconds", "outcome" (`Outcome.to_json`),
"state_rule", "batch_rule", and, for an estimated candidate, "estimate" (the
hardware model's seconds) and "breakdown" (their parts,
`cost.breakdown.Breakdown.to_json()`; absent when the model gave only a
number). The last two are attributes of their own, so the "outcome" of
studies recorded before them keeps its form (`outcome_attrs`).

Beside them, for readers other than shardsearch (optuna-dashboard's tables
and plots): the outcome's figures as numbers ("status", "cut_stage",
"value_seconds", "compile_seconds", "memory_total_bytes", "flops",
"collective_bytes", "bytes_accessed", `figure_attrs`) and the coded parameters decoded
("readable_auto_order" = "tp,dp", `readable_attrs`). They copy what the
record holds; `TrialRecord.from_trial` does not read them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import optuna

from ..evaluation.evaluate import over_by_prediction, pool_ratios, prediction_pool
from ..evaluation.outcome import PREDICTED, PREDICTION_SAMPLES, Outcome
from ..evaluation.stages import COMPLETE, CUT, FAILED, Stage
from ..evaluation.standing import Leader
from . import attrs as _attrs
from .ownership import INTERRUPTED, LABEL_ATTR, REASON_ATTR

ESTIMATE_ATTR, BREAKDOWN_ATTR = _attrs.ESTIMATE, _attrs.BREAKDOWN


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One trial of the study: what was proposed and what happened to it.

    Attributes:
      number: Optuna's trial number.
      label: "search", or the baseline's name.
      params: the Optuna parameters; a baseline's only where the space's
        parameters build its very program (`space.express`), else empty.
      outcome: the evaluation (`Outcome`), `cache_hit` set when reused.
      state_rule, batch_rule: the candidate's rules in their JSON form.
      seconds: wall time the trial took, proposal to record (the search's
        cost of this candidate; near zero for cache hits).
      knobs: the step's knob setting (`Candidate.knobs`); `()` the default.
    """

    number: int
    label: str
    params: dict[str, Any]
    outcome: Outcome
    state_rule: dict[str, Any]
    batch_rule: dict[str, Any]
    seconds: float = 0.0
    knobs: tuple[tuple[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The record as JSON; "estimate", "breakdown" and "knobs" only when it has them."""
        out = {"number": self.number, "label": self.label, "params": self.params,
               "outcome": self.outcome.to_json(), "state_rule": self.state_rule,
               "batch_rule": self.batch_rule, "seconds": self.seconds}
        return out | _estimated(self.outcome) | _knobs(self.knobs)

    @classmethod
    def from_trial(cls, trial: optuna.trial.FrozenTrial) -> TrialRecord | None:
        """Rebuilds a record from a stored trial, or None for foreign trials.

        A trial whose run stopped before recording it whole ("reason":
        "interrupted") becomes a failed record with that reason and no rules; a
        trial still being recorded gives None.
        """
        attrs = trial.user_attrs
        # The attributes go in one by one (`record_attrs`), then the trial is
        # told: a run that died (or was stopped) anywhere before the tell left
        # it failed as "interrupted", its outcome or rules written or not, and
        # it reads as the study holds it. One that another run is recording
        # has an outcome without its rules, and is not recorded yet.
        if trial.state == optuna.trial.TrialState.FAIL and attrs.get(REASON_ATTR) == INTERRUPTED:
            return cls(trial.number, attrs.get(LABEL_ATTR, "search"), dict(trial.params),
                       Outcome("", FAILED, reason=INTERRUPTED), {}, {})
        if not all(key in attrs for key in (_attrs.OUTCOME, _attrs.STATE_RULE,
                                            _attrs.BATCH_RULE)):
            return None
        outcome = dataclasses.replace(Outcome.from_json(attrs[_attrs.OUTCOME]),
                                      estimate=attrs.get(ESTIMATE_ATTR),
                                      breakdown=attrs.get(BREAKDOWN_ATTR))
        return cls(trial.number, attrs.get(_attrs.LABEL, "search"), dict(trial.params), outcome,
                   attrs[_attrs.STATE_RULE], attrs[_attrs.BATCH_RULE],
                   attrs.get(_attrs.SECONDS, 0.0),
                   tuple((attrs.get(_attrs.KNOBS) or {}).items()))


def store_result(study: optuna.Study, summary: dict[str, Any]) -> bool:
    """Writes a finished search's summary as the study's result, unless that
    would replace a confirmed result (one whose finalists were re-timed) with
    an unconfirmed one: a worker that left the confirmation to another, or a
    run with `confirm_rounds=0`, finishing after the one that confirmed.
    Returns whether it wrote.

    Optuna has no compare-and-set on attributes: the check reads the stored
    result just before writing, so only two runs finishing within the same
    instant could still race (the claims in `study.claims` make one of them
    the confirming one).
    """
    current = study.user_attrs.get(_attrs.RESULT)
    if _confirmed(current) and not _confirmed(summary):
        return False
    study.set_user_attr(_attrs.RESULT, summary)
    return True


def _confirmed(summary: Any) -> bool:
    return isinstance(summary, dict) and bool(summary.get("confirmation"))


def record_attrs(record: TrialRecord,
                 readable: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """The trial attributes that store a record: its seconds, label, outcome
    (`outcome_attrs`) and rules, then its figures (`figure_attrs`) and the
    candidate's decoded parameters (`readable`, `Candidate.readable`;
    `readable_attrs`)."""
    return {_attrs.SECONDS: record.seconds, _attrs.LABEL: record.label,
            **outcome_attrs(record.outcome), _attrs.STATE_RULE: record.state_rule,
            _attrs.BATCH_RULE: record.batch_rule, **_knobs(record.knobs),
            **figure_attrs(record.outcome), **readable_attrs(readable)}


def _knobs(knobs: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {_attrs.KNOBS: dict(knobs)} if knobs else {}


def figure_attrs(outcome: Outcome) -> dict[str, Any]:
    """The outcome's figures as plain attributes, each one a number or a short
    string; a figure the outcome does not have is left out.

    Example:
      >>> figure_attrs(Outcome("ab12", "complete", value=0.01, compile_seconds=0.5))
      {'status': 'complete', 'compile_seconds': 0.5, 'value_seconds': 0.01}
    """
    out: dict[str, Any] = {_attrs.STATUS: outcome.status.value,
                           _attrs.COMPILE_SECONDS: float(outcome.compile_seconds)}
    if outcome.cut_stage is not None:
        out[_attrs.CUT_STAGE] = outcome.cut_stage.value
    figures = ((_attrs.VALUE_SECONDS, outcome.value),
               (_attrs.MEMORY_TOTAL_BYTES, outcome.memory.get("total")),
               (_attrs.FLOPS, outcome.flops),
               (_attrs.COLLECTIVE_BYTES, outcome.collective_bytes),
               (_attrs.BYTES_ACCESSED, outcome.bytes_accessed))
    out.update((key, value) for key, value in figures if value is not None)
    return out


def readable_attrs(readable: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Decoded parameters as attributes, each name after `attrs.READABLE_PREFIX`.

    Example:
      >>> readable_attrs([("auto_order", "tp,dp")])
      {'readable_auto_order': 'tp,dp'}
    """
    return {f"{_attrs.READABLE_PREFIX}{name}": text for name, text in readable}


def outcome_attrs(outcome: Outcome) -> dict[str, Any]:
    """The trial attributes that store an outcome: "outcome", plus "estimate"
    and "breakdown" when it has them.

    Example:
      >>> outcome_attrs(Outcome("ab12", "complete", value=0.01, estimate=0.01))
      {'outcome': {...}, 'estimate': 0.01}
    """
    return {_attrs.OUTCOME: outcome.to_json()} | _estimated(outcome)


def _estimated(outcome: Outcome) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if outcome.estimate is not None:
        out[ESTIMATE_ATTR] = outcome.estimate
    if outcome.breakdown is not None:
        out[BREAKDOWN_ATTR] = outcome.breakdown
    return out


def recorded_estimates(trials: Iterable[optuna.trial.FrozenTrial]) -> tuple[float, ...]:
    """The estimates a study's trials recorded, one per distinct candidate, ascending.

    What the "hybrid" objective compares a candidate with (`Context.estimates`).
    A candidate evaluated again (a cache hit, or the same specs reached by
    another trial) counts once, so repeats do not fill its top k.

    Example:
      >>> recorded_estimates(study.get_trials(deepcopy=False))
      (0.0009, 0.0012, 0.0031)
    """
    by_candidate: dict[str, float] = {}
    for trial in trials:
        estimate = trial.user_attrs.get(ESTIMATE_ATTR)
        if estimate is None:
            continue
        outcome = trial.user_attrs.get(_attrs.OUTCOME) or {}
        key = outcome.get("fingerprint") or f"trial {trial.number}"
        by_candidate.setdefault(key, float(estimate))
    return tuple(sorted(by_candidate.values()))


def recorded_leader(trials: Iterable[optuna.trial.FrozenTrial]) -> Leader | None:
    """The study's best completed trial (the least value; the first on a
    tie) with its program's costs, or None when no trial completed or the best
    recorded no flops (a plan that did not compile here, a study from before
    they were kept): what a timed candidate's program is held against before
    it runs (`evaluation.standing.Leader.behind`).

    Example:
      >>> recorded_leader(study.get_trials(deepcopy=False))
      Leader(trial=15, value=0.781, flops=6.97e9, collective_bytes=5.26e7, bytes_accessed=...)
    """
    best = min((t for t in trials if t.state == optuna.trial.TrialState.COMPLETE
                and t.value is not None),
               key=lambda t: (t.value, t.number), default=None)
    if best is None:
        return None
    outcome = best.user_attrs.get(_attrs.OUTCOME) or {}
    if not outcome.get("flops"):
        return None
    return Leader(best.number, float(best.value), float(outcome["flops"]),
                  outcome.get("collective_bytes"), outcome.get("bytes_accessed"))


def leader_notes(trials: Iterable[optuna.trial.FrozenTrial], leader: Leader | None,
                 ) -> tuple[str, ...]:
    """What the cut on program costs cannot use for `recorded_leader`'s
    answer, as notes the search warns about once: the study's best trial
    without flops on record (nothing is cut before it runs), or without bytes
    accessed (candidates are held against its flops and collective bytes
    only). Both happen only for trials stored before those were kept.
    """
    if leader is None:
        if any(t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
               for t in trials):
            return ("the study's best trial has no flops on record (stored before they "
                    "were kept), so no searched candidate is cut before it runs until a "
                    "compiled one beats it",)
        return ()
    if leader.bytes_accessed is None:
        return ("the study's best trial has no bytes accessed on record (stored before "
                "they were kept), so candidates are held against its flops and collective "
                "bytes only",)
    return ()


def memory_ratios(trials: Iterable[optuna.trial.FrozenTrial],
                  setting: Iterable[tuple[str, Any]] = ()) -> tuple[tuple[float, ...], bool]:
    """XLA's total bytes per device over stage 1's prediction, for the
    trials whose candidate compiled, one per distinct candidate: those of the
    pool of a candidate of this knob setting (`evaluation.evaluate.prediction_pool`),
    or borrowed from every pool whose activations' batch is placed while its
    own holds too few (`evaluation.evaluate.pool_ratios`): what stage 1
    scales a prediction by (`evaluation.evaluate.check`), and whether they
    are borrowed.

    Example:
      >>> memory_ratios(study.get_trials(deepcopy=False), (("remat", "full"),))
      ((0.71, 0.93, 1.04), False)
    """
    by_candidate: dict[str, tuple[tuple[tuple[str, Any], ...], float]] = {}
    for trial in trials:
        outcome = trial.user_attrs.get(_attrs.OUTCOME) or {}
        memory = outcome.get("memory") or {}
        total, predicted = memory.get("total"), memory.get("predicted")
        if not total or not predicted:
            continue
        key = outcome.get("fingerprint") or f"trial {trial.number}"
        by_candidate.setdefault(key, (prediction_pool(trial.user_attrs.get(_attrs.KNOBS)
                                                      or {}), total / predicted))
    by_pool: dict[tuple[tuple[str, Any], ...], list[float]] = {}
    for pool, ratio in by_candidate.values():
        by_pool.setdefault(pool, []).append(ratio)
    return pool_ratios(by_pool, setting)


def prediction_summary(records: Iterable[TrialRecord], limit: int | None,
                       margin: float | None = None) -> dict[str, int]:
    """How stage 1's memory prediction did in a study, against XLA's verdicts.

    Each compiled candidate (a distinct one, in trial order) is judged as
    stage 1 would have judged it then: its prediction times the least ratio
    of XLA's total to the prediction among the compiled candidates before it
    in its pool, or borrowed as stage 1 borrows them
    (`evaluation.evaluate.pool_ratios`), once there are
    `PREDICTION_SAMPLES` of them, over
    the limit times `margin` (None: stage 1's, the square root of the spread
    of those ratios; `evaluation.evaluate.stage_margin`). With
    `memory_prediction="record"` nothing was cut on it, so every candidate
    the rule would have cut was compiled and `false_cuts` counts those XLA
    said fit; with "cut" those were cut instead (`cut_before_compile`) and
    `missed` counts what XLA still found over the limit.

    Returns:
      `cut_before_compile` (trials stage 1 cut on the prediction), `judged`
      (compiled candidates with enough samples before them), `over` (of those,
      XLA's total over the limit), `flagged` (the prediction over it),
      `agree`, `false_cuts` (flagged, XLA said fits) and `missed` (over, not
      flagged). All zero without a limit.
    """
    out = dict.fromkeys(("cut_before_compile", "judged", "over", "flagged", "agree",
                         "false_cuts", "missed"), 0)
    seen: dict[str, None] = {}
    by_pool: dict[tuple[tuple[str, Any], ...], list[float]] = {}
    for record in sorted(records, key=lambda r: r.number):
        outcome = record.outcome
        if outcome.cache_hit or not outcome.fingerprint or outcome.fingerprint in seen:
            continue
        seen[outcome.fingerprint] = None
        if outcome.status == CUT and outcome.reason.startswith(PREDICTED):
            out["cut_before_compile"] += 1
        total, predicted = outcome.memory.get("total"), outcome.memory.get("predicted")
        if limit is None or not total or not predicted:
            continue
        earlier, _ = pool_ratios(by_pool, record.knobs)
        if len(earlier) >= PREDICTION_SAMPLES:
            over = total > limit
            flagged = over_by_prediction(predicted, earlier, limit, margin)
            out["judged"] += 1
            out["over"] += over
            out["flagged"] += flagged
            out["agree"] += over == flagged
            out["false_cuts"] += flagged and not over
            out["missed"] += over and not flagged
        by_pool.setdefault(prediction_pool(record.knobs), []).append(total / predicted)
    return out


def summarize(records: list[TrialRecord]) -> dict[str, int]:
    """Counts trials by outcome: completed, cut at each stage, failed, cache hits,
    and, only when there are some, those interrupted before they recorded an
    outcome (not counted as failed).

    Example:
      >>> summarize(records)
      {"trials": 9, "completed": 5, "cut_check": 2, "cut_compile": 1, "cut_estimate": 0,
       "cut_measure": 1, "failed": 0, "cache_hits": 1}
    """
    out = {"trials": len(records), "completed": 0,
           **{stage.summary_key: 0 for stage in Stage}, "failed": 0, "cache_hits": 0}
    for record in records:
        o = record.outcome
        out["cache_hits"] += bool(o.cache_hit)
        if o.status == COMPLETE:
            out["completed"] += 1
        elif o.status == FAILED and o.reason == INTERRUPTED:
            out["interrupted"] = out.get("interrupted", 0) + 1
        elif o.status == FAILED:
            out["failed"] += 1
        else:
            out[o.cut_stage.summary_key] += 1
    return out
