"""The stages an evaluation passes through, and how it can end.

A candidate goes through the stages in pipeline order, cheapest first; any of
them can cut it (see `search.evaluate`). Every record of a cut names its
stage, in three stored forms that this module alone defines:

- the int in `Outcome.cut_stage`, as Optuna studies store it (`Stage.CHECK`
  is 1);
- the label in plan files' results rows (`"check"`);
- the key of the trial counts in summaries (`"cut_check"`).

Adding a stage is one line in `Stage`, placed where it runs in the pipeline,
with an int no stored study has used; the labels, summary keys and progress
counts follow. Iterate `Stage` for the pipeline order: the ints are storage
ids, not an order (a stage added between two others gets the next free int).
"""

from __future__ import annotations

import enum


class Stage(enum.IntEnum):
    """A stage of the evaluation, in pipeline order.

    Example:
      >>> Stage(1), Stage.parse("compile"), Stage.MEASURE.label
      (<Stage.CHECK: 1>, <Stage.COMPILE: 2>, 'measure')
      >>> [s.summary_key for s in Stage]
      ['cut_check', 'cut_compile', 'cut_estimate', 'cut_measure']
    """

    CHECK = 1
    """The analyzer on the abstract arguments: invalid specs, or the arguments
    alone over the per-device budget. Nothing compiles."""
    COMPILE = 2
    """XLA's memory analysis over the budget. Nothing runs."""
    ESTIMATE = 4
    """The hardware model's estimate of the compiled program too far behind the
    best estimates the study has recorded to be worth timing (the "hybrid"
    objective). Nothing runs."""
    MEASURE = 3
    """Timed repeats, stopped once the candidate is clearly slower."""

    @property
    def label(self) -> str:
        """The name plan files and reports use, e.g. "check"."""
        return self.name.lower()

    @property
    def summary_key(self) -> str:
        """The key counting the trials cut here in a summary, e.g. "cut_check"."""
        return f"cut_{self.label}"

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


def stage_label(stage: int | None) -> str | None:
    """The label of a stored stage int, None for None (outcomes not cut).

    Example:
      >>> stage_label(2), stage_label(None)
      ('compile', None)
    """
    return None if stage is None else Stage(stage).label
