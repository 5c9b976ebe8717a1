"""What optimize() returns: the winner and everything needed to trust it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna

from ..base import spec as _spec
from ..base.tree import leaf_specs
from ..rules.builtin import ShardingRule
from .confirm import Timing
from .evaluate import STAGES as CUT_STAGES
from .evaluate import Outcome


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
        """Rebuilds a record from a stored trial, or None for foreign trials."""
        attrs = trial.user_attrs
        if "outcome" not in attrs:
            return None
        return cls(trial.number, attrs.get("label", "search"), dict(trial.params),
                   Outcome.from_json(attrs["outcome"]), attrs["state_rule"],
                   attrs["batch_rule"], attrs.get("seconds", 0.0))


def summarize(records: list[TrialRecord]) -> dict[str, int]:
    """Counts trials by outcome: completed, cut at each stage, failed, cache hits."""
    out = {"trials": len(records), "completed": 0, "cut_check": 0, "cut_compile": 0,
           "cut_measure": 0, "failed": 0, "cache_hits": 0}
    for record in records:
        o = record.outcome
        out["cache_hits"] += bool(o.cache_hit)
        if o.status == "complete":
            out["completed"] += 1
        elif o.status == "failed":
            out["failed"] += 1
        else:
            out[f"cut_{CUT_STAGES[o.cut_stage]}"] += 1
    return out


@dataclasses.dataclass
class OptimizeResult:
    """The winner of a search and the evidence for it.

    Attributes:
      best_rule: the winning rule for the state (a `ShardingRule`).
      best_batch_rule: the winning rule for the other arguments.
      best_label: "search" or the baseline that won (a searched plan wins
        only when significantly faster than the best baseline re-timed with it).
      best_specs: spec trees for every argument, `(state, *batch)`.
      best_time: the winner's median seconds (confirmation run when there was
        one, else the study's; the static estimate for objective="static").
      baselines: baseline name → its median seconds measured in this study.
      confirmation: label → `Timing` from the interleaved re-timing.
      verdict: "faster" (significantly faster than the runner-up), "tie", or
        "unconfirmed" (no re-timing: static objective or a single finalist).
      outputs_match: the winner's step computes the replicated plan's metrics
        to relative 1e-5 (None when not checked); `max_relative_error` says how
        close all outputs came.
      trials: one `TrialRecord` per trial, in order.
      study: the Optuna study.
      objective, budget, mesh_axes: how the search was set up.
      compiles: how many compiles this call ran.
    """

    best_rule: ShardingRule
    best_batch_rule: ShardingRule
    best_label: str
    best_specs: tuple[Any, ...]
    best_time: float
    baselines: dict[str, float]
    confirmation: dict[str, Timing]
    verdict: str
    outputs_match: bool | None
    max_relative_error: float | None
    trials: list[TrialRecord]
    study: optuna.Study
    objective: str
    budget: int | None
    mesh_axes: dict[str, int]
    compiles: int

    def summary(self) -> dict[str, int]:
        """Trials by outcome: completed, cut at each stage, failed, cache hits."""
        return summarize(self.trials)

    def to_json(self) -> dict[str, Any]:
        """Everything above as JSON-ready data (the study itself excepted)."""
        specs = [
            {path: _spec.spec_to_json(s) for path, s in leaf_specs(tree)}
            for tree in self.best_specs]
        return {
            "best": {"label": self.best_label, "time": self.best_time,
                     "state_rule": self.best_rule.to_config(),
                     "batch_rule": self.best_batch_rule.to_config(), "specs": specs},
            "baselines": self.baselines,
            "confirmation": {k: v.to_json() for k, v in self.confirmation.items()},
            "verdict": self.verdict,
            "outputs_match": self.outputs_match,
            "max_relative_error": self.max_relative_error,
            "summary": self.summary(),
            "objective": self.objective,
            "budget": self.budget,
            "mesh": self.mesh_axes,
            "study_name": self.study.study_name,
            "compiles": self.compiles,
            "trials": [t.to_json() for t in self.trials],
        }

    def export(self, path: str | Path, format: str = "json") -> Path:
        """Writes the winner as a schema-1 plan file (see `write_config`)."""
        from .export import export_config, write_config

        return write_config(export_config(self), path, format=format)
