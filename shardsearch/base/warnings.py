"""The `ShardsearchWarning` family: every way shardsearch tells you it guessed.

An analysis that cannot read part of a step or a program goes on (a missing
coupling rule only keeps dims apart; an uncounted loop only lowers a cost), but
it never does so silently: each such place is a *note*, a `"kind: text"`
string, and each kind has its warning class here. `optimize` shows each note
once per study, stores it on the trial that met it (the outcome's `notes`) or
on the study (what discovery met), and plan files carry them; `shardsearch
show` and `explain` print them.

Filter them as a family (`warnings.simplefilter("error", ShardsearchWarning)`)
or one kind at a time.
"""

from __future__ import annotations

import warnings


class ShardsearchWarning(UserWarning):
    """Base class of every warning shardsearch issues."""


class UnhandledPrimitiveWarning(ShardsearchWarning):
    """The step uses primitives the logical-axes analysis has no rule for:
    their dims are kept apart (or, for same-shape operands, assumed
    elementwise), so some logical axes may be split that belong together."""


class MergedAxesWarning(ShardsearchWarning):
    """The dataflow joined dims that may play different roles (a reshape that
    flattens two axes, one leaf carrying an axis on two dims)."""


class UnnamedLeafWarning(ShardsearchWarning):
    """A logical rule met a leaf its table has no logical names for, and left
    it replicated."""


class UncountedCostWarning(ShardsearchWarning):
    """The cost model could not count part of a compiled program: a loop whose
    trip count is unknown (counted once), an instruction it cannot read, or
    HLO text it could not parse. Its estimate is then a lower bound."""


class UngroupedCollectiveWarning(ShardsearchWarning):
    """A collective whose device groups could not be read (no group size, a
    permute without source-target pairs): it was costed as moving nothing."""


class UserNamesConflictWarning(ShardsearchWarning):
    """The logical names a user gave (Flax's boxed parameters) disagree with the
    step's dataflow: two names on dims that must be split alike (the axis keeps
    the first), or names that do not fit their leaf (ignored)."""


class UnreadConstraintWarning(ShardsearchWarning):
    """The step constrains a value with a sharding that names no PartitionSpec
    (a `GSPMDSharding`): the memory predicted before compiling does not follow
    that constraint, and lets the value take what the arguments give it."""


class UnpinnedBatchWarning(ShardsearchWarning):
    """The step names a batch activation, but an expert plan runs without its
    `act_batch` on its batch split (`search.pin_batch`), so XLA's
    propagation places that batch: no `act_batch` value is the plan's split."""


# A note's kind (its text up to the first ":") -> its warning class.
KINDS: dict[str, type[ShardsearchWarning]] = {
    "unhandled": UnhandledPrimitiveWarning,
    "merged": MergedAxesWarning,
    "unnamed": UnnamedLeafWarning,
    "uncounted": UncountedCostWarning,
    "ungrouped": UngroupedCollectiveWarning,
    "conflict": UserNamesConflictWarning,
    "unread": UnreadConstraintWarning,
    "unpinned": UnpinnedBatchWarning,
}


def note(kind: str, text: str) -> str:
    """A note of a known kind, e.g. `note("uncounted", "loop body %b: ...")`.

    Raises:
      ValueError: an unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"note kind {kind!r}; the kinds are {tuple(KINDS)}")
    return f"{kind}: {text}"


def warn_notes(notes: list[str] | tuple[str, ...], shown: set[str] | None = None,
               where: str = "", stacklevel: int = 2) -> None:
    """Issues each note not in `shown` as its kind's warning, once: `shown`
    (kept by the caller for a study) gains it."""
    for text in notes:
        if shown is not None:
            if text in shown:
                continue
            shown.add(text)
        category = KINDS.get(text.partition(":")[0], ShardsearchWarning)
        warnings.warn(category(f"shardsearch{where}: {text}"), stacklevel=stacklevel + 1)
