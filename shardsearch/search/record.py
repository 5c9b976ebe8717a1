"""One trial as the study records it: what was proposed and what happened."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna

from .evaluate import Outcome
from .ownership import INTERRUPTED, LABEL_ATTR, REASON_ATTR
from .stages import COMPLETE, FAILED, Stage


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One trial of the study: what was proposed and what happened to it.

    Attributes:
      number: Optuna's trial number.
      label: "search", or the baseline's name.
      params: the Optuna parameters (empty for baselines).
      outcome: the evaluation (`Outcome`), `cache_hit` set when reused.
      state_rule, batch_rule: the candidate's rules in their JSON form.
      seconds: wall time the trial took, proposal to record (the search's
        cost of this candidate; near zero for cache hits).
    """

    number: int
    label: str
    params: dict[str, Any]
    outcome: Outcome
    state_rule: dict[str, Any]
    batch_rule: dict[str, Any]
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "label": self.label, "params": self.params,
                "outcome": self.outcome.to_json(), "state_rule": self.state_rule,
                "batch_rule": self.batch_rule, "seconds": self.seconds}

    @classmethod
    def from_trial(cls, trial: optuna.trial.FrozenTrial) -> TrialRecord | None:
        """Rebuilds a record from a stored trial, or None for foreign trials.

        A trial whose run stopped before recording it ("reason": "interrupted")
        becomes a failed record with that reason and no rules.
        """
        attrs = trial.user_attrs
        if "outcome" not in attrs:
            if trial.state != optuna.trial.TrialState.FAIL or \
                    attrs.get(REASON_ATTR) != INTERRUPTED:
                return None
            return cls(trial.number, attrs.get(LABEL_ATTR, "search"), dict(trial.params),
                       Outcome("", FAILED, reason=INTERRUPTED), {}, {})
        return cls(trial.number, attrs.get("label", "search"), dict(trial.params),
                   Outcome.from_json(attrs["outcome"]), attrs["state_rule"],
                   attrs["batch_rule"], attrs.get("seconds", 0.0))


def summarize(records: list[TrialRecord]) -> dict[str, int]:
    """Counts trials by outcome: completed, cut at each stage, failed, cache hits,
    and, only when there are some, those interrupted before they recorded an
    outcome (not counted as failed).

    Example:
      >>> summarize(records)
      {"trials": 9, "completed": 5, "cut_check": 2, "cut_compile": 1, "cut_measure": 1,
       "failed": 0, "cache_hits": 1}
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
