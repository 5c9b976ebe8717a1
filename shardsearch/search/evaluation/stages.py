"""The stages an evaluation passes through, and how it can end.

A candidate goes through the stages in pipeline order, cheapest first; any of
them can cut it (see `search.evaluation.evaluate`). Every record of a cut
names its stage, in three stored forms that this module alone defines:

- the id in `Outcome.cut_stage` as Optuna studies store it (`Stage.CHECK.id`
  is 1);
- the label in plan files' results rows (`"check"`);
- the key of the trial counts in summaries (`"cut_check"`).

Adding a stage is one member of `Stage`, placed where it runs in the
pipeline, with an id no stored study has used; the labels, summary keys and
progress counts follow. The order of the members is the pipeline order
(`Stage.order`, and `<` compares by it); the ids are storage keys only, and
a stage added between two others gets the next free id (`estimate`, id 4,
runs before `measure`, id 3).
"""

from __future__ import annotations

import enum
import functools

# The id each stage is stored under: never reuse or renumber one.
_IDS = {"check": 1, "compile": 2, "estimate": 4, "measure": 3}


@functools.total_ordering
class Stage(enum.Enum):
    """A stage of the evaluation; members are listed in pipeline order.

    Example:
      >>> Stage.from_id(1), Stage.parse("compile"), Stage.MEASURE.id
      (<Stage.CHECK: 'check'>, <Stage.COMPILE: 'compile'>, 3)
      >>> [s.summary_key for s in Stage], Stage.ESTIMATE < Stage.MEASURE
      (['cut_check', 'cut_compile', 'cut_estimate', 'cut_measure'], True)
    """

    CHECK = "check"
    """The analyzer on the abstract arguments: invalid specs, or the arguments
    alone over the per-device budget. Nothing compiles."""
    COMPILE = "compile"
    """XLA's memory analysis over the budget. Nothing runs."""
    ESTIMATE = "estimate"
    """The compiled program judged too far behind the study's best before it
    is timed: it does clearly more arithmetic than the best trial's program
    and moves no fewer bytes (objectives that time steps), or the hardware
    model's estimate is too far behind the best estimates recorded (the
    "hybrid" objective). Nothing runs."""
    MEASURE = "measure"
    """Timed repeats, stopped once the candidate is clearly slower."""

    @property
    def id(self) -> int:
        """The int studies store for this stage, e.g. 1 for "check"."""
        return _IDS[self.value]

    @property
    def order(self) -> int:
        """Its place in the pipeline, from 0 ("check")."""
        return list(Stage).index(self)

    @property
    def label(self) -> str:
        """The name plan files and reports use, e.g. "check"."""
        return self.value

    @property
    def summary_key(self) -> str:
        """The key counting the trials cut here in a summary, e.g. "cut_check"."""
        return f"cut_{self.label}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Stage):
            return NotImplemented
        return self.order < other.order

    @classmethod
    def from_id(cls, stored: int) -> Stage:
        """The stage stored as `stored`; a ValueError lists the ids otherwise."""
        for stage in cls:
            if stage.id == stored and not isinstance(stored, bool):
                return stage
        raise ValueError(
            f"no evaluation stage stored as {stored!r}; the stored ids are "
            f"{tuple(s.id for s in cls)}")

    @classmethod
    def parse(cls, label: str) -> Stage:
        """The stage with this label; a ValueError lists the labels otherwise."""
        for stage in cls:
            if stage.label == label:
                return stage
        raise ValueError(
            f"no evaluation stage labelled {label!r}; the stages are "
            f"{tuple(s.label for s in cls)}")


class Status(enum.StrEnum):
    """How an evaluation ended; stored as the string ("complete", ...)."""

    COMPLETE = "complete"
    """Every stage passed: the outcome has the objective's value (unless the
    caller stopped before a run)."""
    CUT = "cut"
    """A stage ended it on purpose (`Outcome.cut_stage` says which)."""
    FAILED = "failed"
    """Something broke: the compile raised or timed out, or the objective
    could not score the program."""


COMPLETE, CUT, FAILED = Status.COMPLETE, Status.CUT, Status.FAILED


def stage_label(stage: Stage | int | None) -> str | None:
    """The label of a stage or its stored id, None for None (outcomes not cut).

    Example:
      >>> stage_label(2), stage_label(None)
      ('compile', None)
    """
    return None if stage is None else (
        stage if isinstance(stage, Stage) else Stage.from_id(stage)).label
