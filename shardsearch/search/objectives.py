"""Objectives: what a candidate that compiled and fits is worth, in seconds.

An objective is one small object. `evaluate` hands it every candidate that
passes stages 1 and 2 (`CompiledCandidate`: its specs, the compiled step and
the compiled program's cost figures) and takes the `Outcome` it returns. What
else differs between objectives is said by four class attributes, which the
search reads instead of comparing names:

- `needs_host_args`: it runs the step, so `make_context` builds concrete
  arguments and `evaluate(run=False)` stops before scoring;
- `prunes_while_timing`: its trials report repeats one by one, so the study
  gets Optuna's Wilcoxon pruner (else no pruner);
- `confirms`: the finalists are re-timed side by side and the winner's
  outputs checked against the replicated plan's;
- `timed_in`: what exported plan files say the search's numbers came from.

Built in: "measured" (median step time on the mesh) and "static" (the
hardware model's estimate from the compiled program; nothing runs). Studies
store the name, `OBJECTIVES` lists every objective by name (the command line's
choices), and `get_objective` turns a name into the object.

Example:
  >>> class TempBytes(Objective):
  ...     name = "temp-bytes"
  ...     def score(self, candidate, ctx, report):
  ...         return candidate.outcome(COMPLETE, value=float(candidate.program.memory.temp))
  >>> optimize(step, args, mesh=mesh, objective=TempBytes())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

from ..cost.chips import hardware_for
from . import evaluate as _evaluate
from .evaluate import CompiledCandidate, Context, Outcome
from .stages import COMPLETE, FAILED

# The `timed_in` labels of exported results rows.
TIMED_IN = ("search", "estimate")


@dataclasses.dataclass(frozen=True)
class Objective:
    """Scores candidates past stage 2; subclasses set `name` and `score`.

    Attributes (class-level):
      name: what studies, study names and the command line call it.
      needs_host_args: it runs the step, so it needs concrete arguments.
      prunes_while_timing: its `score` calls `report` after each timed repeat
        and stops when told, so the study prunes with Optuna's Wilcoxon test.
      confirms: the finalists are re-timed interleaved at the end, and the
        winner's outputs compared with the replicated plan's.
      timed_in: where an exported row's number comes from: "search" (timed
        during the search) or "estimate" (computed, nothing ran).
    """

    name: ClassVar[str] = ""
    needs_host_args: ClassVar[bool] = False
    prunes_while_timing: ClassVar[bool] = False
    confirms: ClassVar[bool] = False
    timed_in: ClassVar[str] = "estimate"

    def __post_init__(self) -> None:
        kind = type(self).__name__
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"objective {kind} has no name; set the class attribute `name`")
        if self.timed_in not in TIMED_IN:
            raise ValueError(f"objective {self.name!r}: timed_in={self.timed_in!r}; choose "
                             f"one of {TIMED_IN}")

    def score(
        self,
        candidate: CompiledCandidate,
        ctx: Context,
        report: Callable[[int, float], bool] | None,
    ) -> Outcome:
        """The candidate's outcome: complete with its value, or cut, or failed.

        Args:
          candidate: a candidate that compiled and fits the budget;
            `candidate.outcome(status, ...)` builds the Outcome with what
            stages 1-2 found.
          ctx: the study's context.
          report: for objectives that time repeats: call it after each with
            `(index, seconds)` and stop (cut at `Stage.MEASURE`) when it
            returns True. None for baselines, which are never pruned.
        """
        raise NotImplementedError(f"objective {self.name!r} must define score()")


class Measured(Objective):
    """The median of timed steps on the mesh (`evaluate.measure`)."""

    name = "measured"
    needs_host_args = True
    prunes_while_timing = True
    confirms = True
    timed_in = "search"

    def score(self, candidate: CompiledCandidate, ctx: Context,
              report: Callable[[int, float], bool] | None) -> Outcome:
        # Looked up on the module at call time, so tests can watch `measure`.
        return _evaluate.measure(candidate.compiled, candidate.specs, ctx, report,
                                 candidate.base())


class Static(Objective):
    """The hardware model's estimate from the compiled program; nothing runs.

    The model is `ctx.hardware`, else the built-in one for the mesh's
    platform (`cost.hardware.hardware_for`).
    """

    name = "static"

    def score(self, candidate: CompiledCandidate, ctx: Context,
              report: Callable[[int, float], bool] | None) -> Outcome:
        program = candidate.program
        if not program.readable:
            # Without the HLO the estimate would lack its communication and
            # loop trips; a measured candidate needs neither, so only this fails.
            return candidate.outcome(
                FAILED, reason=f"cannot read the compiled HLO: {program.hlo_error}")
        hardware = hardware_for(ctx.mesh.devices.flat[0].platform, ctx.hardware)
        return candidate.outcome(COMPLETE, value=hardware.estimate(program))


OBJECTIVES: dict[str, Objective] = {}


def register_objective(objective: Objective) -> Objective:
    """Adds an objective under its name, so that name works wherever one is taken.

    Raises:
      ValueError: another kind of objective already has the name.
    """
    if not isinstance(objective, Objective):
        raise TypeError(f"register_objective: expected an Objective, got "
                        f"{type(objective).__name__}")
    known = OBJECTIVES.get(objective.name)
    if known is not None and known != objective:
        raise ValueError(
            f"objective name {objective.name!r} is taken by {type(known).__name__}; give "
            f"{type(objective).__name__} another name")
    OBJECTIVES[objective.name] = objective
    return objective


register_objective(Measured())
register_objective(Static())


def get_objective(objective: str | Objective) -> Objective:
    """The objective of a name, or the objective given.

    An objective passed as an object need not be registered (studies store
    its name), but may not reuse the name of a different registered one.

    Example:
      >>> get_objective("static").needs_host_args
      False

    Raises:
      ValueError: an unknown name (the message lists the choices), or an
        object whose name belongs to another objective.
    """
    if isinstance(objective, Objective):
        known = OBJECTIVES.get(objective.name)
        if known is not None and known != objective:
            raise ValueError(
                f"objective={objective!r} has the name of the registered "
                f"{type(known).__name__}; give it another name")
        return objective
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}; choose one of {tuple(OBJECTIVES)}")
    return OBJECTIVES[objective]



def is_estimate(name: str | None) -> bool:
    """Whether the objective of this recorded name scores by estimate (nothing
    timed): reports mark its numbers "(est.)". False for names this process
    does not know."""
    known = OBJECTIVES.get(name) if isinstance(name, str) else None
    return known is not None and known.timed_in == "estimate"
