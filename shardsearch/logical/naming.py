"""Readable names for discovered logical axes, from the evidence the walk saw.

The coupling (which dims share an axis) comes from the dataflow alone; the
names here are guesses on top of it. A wrong guess costs a readable name,
never the coupling. Each role is decided by one key, in this order, and an
axis keeps the first role it gets:

1. `batch`: the axis on dim 0 of the most leaves of the batch arguments (all
   arguments after the first, the state).
2. `seq`: the axis on dim 1 of the most batch leaves that are integer of rank
   2 (token ids) or of rank 3 (`[batch, seq, features]`; not images, which
   have rank 4).
3. `layers`: a scan's stacked dim that is dim 0 of a state leaf.
4. `experts`: the leading dim of a state leaf of rank 3 or more (not
   counting `layers`) that a dot_general takes as a batch dim of that leaf
   itself (stacked expert weights, `ebcd,edf->ebcf`).
5. `vocab`: a state leaf's dim that a gather indexes (an embedding table) or
   that a one-hot of integer labels compares against (an output head).
6. `heads`: a dot_general batch dim on state leaves (attention batches its
   products over heads); the one on most leaves, any other `kv_heads`.
7. `embed`: the axis on the most state leaves (the residual stream), when no
   other is on as many.
8. `head_dim`: an axis contracted by a dot_general batched over `heads`
   (when a weight keeps it as its own dim, `wq: [embed, heads, head_dim]`).
9. `mlp`: an axis on a state leaf beside `embed` (`w_up: [embed, mlp]`).

Anything else is named by its size (`d256`), and a second axis with one role
or size gets `_2`, `_3`, ... in order of first appearance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .graph import DOT_BATCH, GATHER_INDEX, ONE_HOT, SCAN_LENGTH, WEIGHT_BATCH


@dataclasses.dataclass(frozen=True)
class LeafFacts:
    """One argument leaf as the naming sees it.

    Attributes:
      argument: which argument of the step (0 is the state).
      shape: the leaf's shape.
      integer: whether its dtype is an integer or bool type.
      axes: per dim, the index of the axis it carries, or None.
    """

    argument: int
    shape: tuple[int, ...]
    integer: bool
    axes: tuple[int | None, ...]


@dataclasses.dataclass(frozen=True)
class AxisFacts:
    """One discovered axis: its size and the evidence kinds seen on it."""

    size: int
    evidence: frozenset[str]


def name_axes(axes: Sequence[AxisFacts], leaves: Sequence[LeafFacts],
              dots: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]
              ) -> list[tuple[str, str | None]]:
    """Names and roles for axes listed in order of first appearance.

    Args:
      axes: the axes, in order of first appearance.
      leaves: every array leaf of every argument, in order.
      dots: per dot_general, the axes of its batch dims and of its contracting
        dims (indices into `axes`).

    Returns:
      `(name, role)` per axis; role is None for size-named axes.

    Example:
      An axis on dim 0 of both batch leaves `tokens: [8, 32]` and
      `targets: [8, 32]` is `("batch", "batch")`; an unrecognised axis of
      size 256 is `("d256", None)`.
    """
    roles: list[str | None] = [None] * len(axes)
    state = [leaf for leaf in leaves if leaf.argument == 0]
    batch = [leaf for leaf in leaves if leaf.argument > 0]

    def free(i: int | None) -> bool:
        return i is not None and roles[i] is None

    def on_state(i: int) -> int:
        return sum(i in leaf.axes for leaf in state)

    def most(candidates: Sequence[int | None]) -> int | None:
        counts: dict[int, int] = {}
        for i in candidates:
            if free(i):
                counts[i] = counts.get(i, 0) + 1
        return max(counts, key=lambda i: (counts[i], -i)) if counts else None

    def assign(i: int | None, role: str) -> None:
        if free(i):
            roles[i] = role

    assign(most([leaf.axes[0] for leaf in batch if leaf.axes]), "batch")
    assign(most([leaf.axes[1] for leaf in batch
                 if len(leaf.shape) == 3 or (len(leaf.shape) == 2 and leaf.integer)]), "seq")
    for leaf in state:
        if leaf.axes and free(leaf.axes[0]) and SCAN_LENGTH in axes[leaf.axes[0]].evidence:
            assign(leaf.axes[0], "layers")
    for leaf in state:
        inner = [i for i in leaf.axes if i is None or roles[i] != "layers"]
        if len(inner) >= 3 and free(inner[0]) and WEIGHT_BATCH in axes[inner[0]].evidence:
            assign(inner[0], "experts")
    for i, axis in enumerate(axes):
        if free(i) and on_state(i) and axis.evidence & {GATHER_INDEX, ONE_HOT}:
            assign(i, "vocab")
    heads = sorted((i for i, axis in enumerate(axes)
                    if free(i) and on_state(i) and DOT_BATCH in axis.evidence),
                   key=lambda i: (-on_state(i), i))
    for rank, i in enumerate(heads):
        assign(i, "heads" if rank == 0 else "kv_heads")
    counts = sorted(((on_state(i), i) for i in range(len(axes)) if free(i) and on_state(i)),
                    key=lambda c: (-c[0], c[1]))
    embed = None
    if counts and (len(counts) == 1 or counts[0][0] > counts[1][0]):
        embed = counts[0][1]
        assign(embed, "embed")
    if "heads" in roles:
        head = roles.index("heads")
        for batch_axes, contracting in dots:
            if head in batch_axes:
                for i in contracting:
                    assign(i, "head_dim")
    if embed is not None:
        for leaf in state:
            if embed in leaf.axes:
                for i in leaf.axes:
                    assign(i, "mlp")
    return _names(axes, roles)


def _names(axes: Sequence[AxisFacts], roles: Sequence[str | None]
           ) -> list[tuple[str, str | None]]:
    """`role`, `role_2`, ... (or `d<size>`, `d<size>_2`, ...) by first appearance."""
    seen: dict[str, int] = {}
    out = []
    for axis, role in zip(axes, roles, strict=True):
        base = role if role is not None else f"d{axis.size}"
        seen[base] = seen.get(base, 0) + 1
        out.append((base if seen[base] == 1 else f"{base}_{seen[base]}", role))
    return out
