"""What optimize() returns: the winner and everything needed to trust it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from ..base import spec as _spec
from ..base.tree import leaf_specs
from ..plan.writer import write_config
from ..rules.base import ShardingRule
from .evaluation.confirm import Timing
from .export import export_config
from .study.record import TrialRecord, summarize

if TYPE_CHECKING:
    from .setup import StudySetup


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
        "unconfirmed" (no re-timing: an objective that does not confirm, such
        as "static", or a single finalist).
      outputs_match: the winner's step computes the replicated plan's metrics
        to relative 1e-5 (None when not checked); `max_relative_error` says how
        close all outputs came.
      trials: one `TrialRecord` per trial, in order.
      study: the Optuna study.
      objective, budget, mesh_axes: how the search was set up (the objective
        by name, as the study stores it).
      compiles: how many compiles this call ran.
      confirmed_by: who re-timed the finalists when the objective re-times
        them and workers share the study (`search.claims`): "the last worker
        to finish", or that this worker left it to another; None otherwise.
      best_memory: the winner's bytes per device as its trial recorded them
        (None where unknown).
      shapes: when the mesh's shape was searched too (`optimize(...,
        devices=N, axes=...)`, `search.shapes`): the devices and axes, the
        chosen shape and its verdict, and per shape searched its study, its
        winner and its re-timing; the shapes pruned and those where nothing
        completed, with the reason; the trials asked, and those in the
        studies of the shapes that completed a candidate ("run"; a failed
        shape's trials are not counted). None
        for a search on one mesh.
      best_knobs: every knob of the step and its value in the winner
        (`base.knobs.Knobs.values`: the defaults filled in), when the search
        chose the step's knobs; otherwise the knobs the winner sets (an
        expert plan's `act_batch`, `space.baselines.pin_batch`), or `{}`.
      setup: the study's `StudySetup` (its context, space, baselines and
        replicated reference), so that a benchmark or an export reuses them
        rather than tracing the step again; None for a result rebuilt
        elsewhere (`shardsearch confirm`).
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
    confirmed_by: str | None = None
    best_memory: int | None = None
    shapes: dict[str, Any] | None = None
    best_knobs: dict[str, Any] = dataclasses.field(default_factory=dict)
    setup: StudySetup | None = dataclasses.field(default=None, repr=False)

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
                     "batch_rule": self.best_batch_rule.to_config(), "specs": specs,
                     **({"knobs": self.best_knobs} if self.best_knobs else {})},
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
            **({"confirmed_by": self.confirmed_by} if self.confirmed_by is not None else {}),
            **({"shapes": self.shapes} if self.shapes is not None else {}),
            "trials": [t.to_json() for t in self.trials],
        }

    def export(self, path: str | Path, format: str = "json") -> Path:
        """Writes the winner as a schema-1 plan file (see `write_config`)."""
        return write_config(export_config(self), path, format=format)
