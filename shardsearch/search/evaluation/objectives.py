"""Objectives: what a candidate that compiled and fits is worth, in seconds.

An objective is one small object. `evaluate` hands it every candidate that
passes stages 1 and 2 (`CompiledCandidate`: its specs, the compiled step and
the compiled program's cost figures) and takes the `Outcome` it returns. What
else differs between objectives is said by class attributes, which the
search reads instead of comparing names:

- `needs_host_args`: it runs the step, so `make_context` builds concrete
  arguments and `evaluate(run=False)` stops before scoring;
- `prunes_while_timing`: its trials report repeats one by one, so the study
  gets the `SlowerThanBest` pruner (else no pruner);
- `confirms`: the finalists are re-timed side by side and the winner's
  outputs checked against the replicated plan's;
- `timed_in`: what exported plan files say the search's numbers came from;
- `uses_hardware`: it scores with the context's hardware model, so the study
  (and the plan file's "hardware" section) names the model;
- `needs_estimates`: it compares a candidate with the estimates the study has
  recorded (`CompiledCandidate.estimates`), so the loop reads them from the
  study before each trial;
- `cuts_behind_leader`: it cuts a searched candidate before timing it when
  its compiled program does clearly more arithmetic than the study's best
  trial's and moves no fewer bytes (`CompiledCandidate.behind_leader`), so
  the loop reads that trial from the study before each trial.

Built in: "measured" (median step time on the mesh), "static" (the
hardware model's estimate from the compiled program; nothing runs) and
"hybrid" (every candidate estimated, only the promising measured). Studies
store the name, `OBJECTIVES` lists every objective by name (the command line's
choices), and `get_objective` turns a name into the object (a name gives the
registered settings; `Hybrid(factor=2.0)` passed as the object gives others).

Every estimate records its breakdown (`Outcome.breakdown`), unless the
model is a subclass that overrides `HardwareModel.estimate(program)`: then
only its number is known (`estimate_program`).

Example:
  >>> class TempBytes(Objective):
  ...     name = "temp-bytes"
  ...     def score(self, candidate, ctx, report):
  ...         return candidate.outcome(COMPLETE, value=float(candidate.program.memory.temp))
  >>> optimize(step, args, mesh=mesh, objective=TempBytes())
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from ...base.units import format_seconds
from ...cost.hardware import HardwareModel
from ...cost.program import ProgramCost
from . import evaluate as _evaluate
from .context import Context
from .evaluate import CompiledCandidate
from .outcome import Outcome
from .stages import COMPLETE, CUT, FAILED, Stage

# The `timed_in` labels of exported results rows.
TIMED_IN = ("search", "estimate")


@dataclasses.dataclass(frozen=True)
class Objective:
    """Scores candidates past stage 2; subclasses set `name` and `score`.

    Attributes (class-level):
      name: what studies, study names and the command line call it.
      needs_host_args: it runs the step, so it needs concrete arguments.
        One that does not only reads the compiled program, which on this
        host's CPU devices is then compiled with LLVM at -O0 and, where
        jaxlib has them, XLA:CPU's legacy fusion emitters
        (`evaluate.compiler_options`).
      prunes_while_timing: its `score` calls `report` after each timed repeat
        and stops when told, so the study prunes (`study.pruner.SlowerThanBest`).
      confirms: the finalists are re-timed interleaved at the end, and the
        winner's outputs compared with the replicated plan's.
      timed_in: where an exported row's number comes from: "search" (timed
        during the search) or "estimate" (computed, nothing ran).
      uses_hardware: it scores with `ctx.hardware_model()`, whose name the
        study records.
      needs_estimates: its `score` reads `candidate.estimates`, which the
        search loop then reads from the study before each trial.
      cuts_behind_leader: its `score` cuts a candidate scored with a `report`
        at `Stage.ESTIMATE` when `candidate.behind_leader()` says why (the
        loop gives it the study's best trial, `standing.Leader`).
    """

    name: ClassVar[str] = ""
    needs_host_args: ClassVar[bool] = False
    prunes_while_timing: ClassVar[bool] = False
    confirms: ClassVar[bool] = False
    timed_in: ClassVar[str] = "estimate"
    uses_hardware: ClassVar[bool] = False
    needs_estimates: ClassVar[bool] = False
    cuts_behind_leader: ClassVar[bool] = False

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
    """The median of timed steps on the mesh (`evaluate.measure`).

    A searched candidate (scored with a `report`) whose compiled program does
    clearly more arithmetic than the study's best trial's and moves no fewer
    bytes is cut at `Stage.ESTIMATE` instead, before its arguments are placed
    (`standing.Leader.behind`).
    """

    name = "measured"
    needs_host_args = True
    prunes_while_timing = True
    confirms = True
    timed_in = "search"
    cuts_behind_leader = True

    def score(self, candidate: CompiledCandidate, ctx: Context,
              report: Callable[[int, float], bool] | None) -> Outcome:
        if report is not None and (why := candidate.behind_leader()) is not None:
            return candidate.outcome(CUT, cut_stage=Stage.ESTIMATE, reason=why)
        # Looked up on the module at call time, so tests can watch `measure`.
        return _evaluate.measure(candidate.compiled, candidate.specs, ctx, report,
                                 candidate.base())


class Static(Objective):
    """The hardware model's estimate from the compiled program; nothing runs.

    The model is `ctx.hardware`, else the built-in one for the mesh's
    platform (`cost.chips.hardware_for`); collectives are charged by the mesh
    axes they span, those in `ctx.dcn_axes` at the network between hosts.
    """

    name = "static"
    uses_hardware = True

    def score(self, candidate: CompiledCandidate, ctx: Context,
              report: Callable[[int, float], bool] | None) -> Outcome:
        try:
            estimate, breakdown = estimate_program(candidate.program, ctx)
        except ValueError as err:
            return candidate.outcome(FAILED, reason=str(err))
        return candidate.outcome(COMPLETE, value=estimate, estimate=estimate,
                                 breakdown=breakdown,
                                 compiler_estimate=candidate.program.compiler_seconds)


@dataclasses.dataclass(frozen=True)
class Hybrid(Objective):
    """Estimates every candidate, and measures only those that look promising.

    A candidate is timed (as by "measured") when its estimate is within
    `factor` times the best estimate the study has recorded, or among the
    `top_k` smallest (counting it); otherwise it is cut at `Stage.ESTIMATE`
    with its estimate and the reason, as is one whose program is clearly
    behind the study's best trial's (as for "measured"). Measurement decides
    the winner and the confirmation re-times the finalists, as for
    "measured"; the estimate only saves the time of candidates it rules out.

    Candidates scored without a `report` (the baselines, hand-picked ones)
    are always measured; their estimates still count. "The best so far" is
    `candidate.estimates`, read from the study before each trial, so a resumed
    study and several processes sharing one decide on every recorded trial.
    A candidate the model cannot estimate (unreadable HLO, axes it has no
    figures for) is measured.

    Attributes:
      factor: measure within this multiple of the best estimate (>= 1).
      top_k: always measure the k smallest estimates (>= 0).

    Example:
      >>> optimize(workload, mesh=mesh, objective=Hybrid(factor=2.0, top_k=5))
      >>> Hybrid(factor=1.5, top_k=1).gate(0.003, (0.001, 0.002))
      'estimate 3 ms is 3.0x the best so far (1 ms); hybrid measures within 1.5x or the best 1'
    """

    name = "hybrid"
    needs_host_args = True
    prunes_while_timing = True
    confirms = True
    timed_in = "search"
    uses_hardware = True
    needs_estimates = True
    cuts_behind_leader = True

    factor: float = 1.5
    top_k: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float) or not (
                math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"Hybrid: factor={self.factor!r}; give a finite number >= 1 "
                             "(the multiple of the best estimate still measured)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"Hybrid: top_k={self.top_k!r}; give a whole number >= 0 (the "
                             "smallest estimates always measured)")

    def gate(self, estimate: float, recorded: Sequence[float]) -> str | None:
        """Why a candidate with this estimate is not timed, or None to time it.

        Args:
          estimate: the candidate's estimate, seconds.
          recorded: the estimates recorded so far (other candidates).
        """
        if not recorded:
            return None
        best = min(recorded)
        if estimate <= self.factor * best:
            return None
        if sum(e < estimate for e in recorded) < self.top_k:
            return None
        ratio = estimate / best if best > 0 else math.inf
        return (f"estimate {format_seconds(estimate)} is {ratio:.1f}x the best so far "
                f"({format_seconds(best)}); hybrid measures within {self.factor:g}x or the best "
                f"{self.top_k}")

    def score(self, candidate: CompiledCandidate, ctx: Context,
              report: Callable[[int, float], bool] | None) -> Outcome:
        try:
            estimate, breakdown = estimate_program(candidate.program, ctx)
        except ValueError:
            # Measurement decides; an estimate that cannot be made rules nothing out.
            estimate, breakdown = None, None
        found: dict[str, Any] = {"estimate": estimate, "breakdown": breakdown}
        if report is not None:
            why = (candidate.behind_leader()
                   or (None if estimate is None else self.gate(estimate, candidate.estimates)))
            if why is not None:
                return candidate.outcome(CUT, cut_stage=Stage.ESTIMATE, reason=why, **found)
        # Looked up on the module at call time, so tests can watch `measure`.
        outcome = _evaluate.measure(candidate.compiled, candidate.specs, ctx, report,
                                    candidate.base())
        return dataclasses.replace(outcome, **found)


def estimate_program(program: ProgramCost, ctx: Context) -> tuple[float, dict[str, Any] | None]:
    """The context's hardware model's seconds for a compiled program, and their parts.

    The parts (`Breakdown.to_json()`) come from `HardwareModel.breakdown` on
    the context's topology (`ctx.topology()`: the mesh, and the axes that
    cross hosts). A subclass that overrides `estimate(program)` (a model
    from outside, written before breakdowns existed) is asked that instead,
    and gives no parts.

    Example:
      >>> estimate_program(candidate.program, ctx)
      (0.0123, {"total": 0.0123, "compute": 0.011, "memory": 0.004, ...})

    Raises:
      ValueError: the compiled HLO could not be read (the estimate would lack
        its communication and loop trips), or the model cannot cost the
        program (e.g. collectives over axes it has no figures for); the
        message names the model.
    """
    if not program.readable:
        raise ValueError(f"cannot read the compiled HLO: {program.hlo_error}")
    hardware = ctx.hardware_model()
    try:
        if type(hardware).estimate is not HardwareModel.estimate:
            return float(hardware.estimate(program)), None
        breakdown = hardware.breakdown(program, ctx.topology())
    except ValueError as err:
        raise ValueError(f"hardware model {hardware.name!r} cannot estimate the program: "
                         f"{err}") from None
    return breakdown.total, breakdown.to_json()


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
register_objective(Hybrid())


def get_objective(objective: str | Objective) -> Objective:
    """The objective of a name, or the objective given.

    An objective passed as an object need not be registered (studies store
    its name), but may not reuse the name of a registered one of another
    class (the same class with other settings, e.g. `Hybrid(factor=2.0)`, is
    that objective).

    Example:
      >>> get_objective("static").needs_host_args
      False

    Raises:
      ValueError: an unknown name (the message lists the choices), or an
        object whose name belongs to another objective.
    """
    if isinstance(objective, Objective):
        known = OBJECTIVES.get(objective.name)
        if known is not None and type(known) is not type(objective):
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
