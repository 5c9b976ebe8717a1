"""The logical-axis family of the space: which mesh axes each logical axis takes.

`LogicalBlock` declares one categorical parameter per offered logical axis,
`logical_<name>`, whose choices are `"-"` (unsharded), each mesh axis, and
ordered groups of mesh axes (`"dp,tp"`, the same key form as `batch_axes`),
those whose size divides the axis's units (4 heads are not offered 8 ways).
The offered axes are those of the state whose size (units) is at least the
smallest mesh axis, capped to the `SearchSpace.logical_max_axes` largest
(ties by name), so that TPE can still learn the space.

The batch: the logical axes on the batch arguments' leading dims (usually one,
`batch`) are not offered here; they take the value of the `batch_axes`
parameter, which means what it means in the rules family ("the mesh axes
that split the batch dim"). One assignment, the block's choices plus the batch
axes, then shards the state (the candidate's state rule) and the batch
arguments (its batch rule) alike, so a batch-like axis the state carries too
follows the same mesh axes.

`FamilyBlock` and `When` combine both families in one space (`space="both"`):
a `family` parameter picks the rules family or the logical family, and each
family's parameters are asked only when it is picked, so TPE learns which
family wins and `enumerate()` lists each family's combinations once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...base import mesh as _mesh
from ...logical.axes import LogicalAxes
from ...rules.axes import AxisEntry
from ...rules.logical import LogicalAxisRule
from .params import Draft, Param, ParamBlock

if TYPE_CHECKING:
    from .searchspace import SearchSpace

FAMILIES = ("rules", "logical")
SPACES = ("rules", "logical", "both")


def axes_key(axes: Sequence[str]) -> str:
    """A group of mesh axes as a choice: `("dp", "tp")` → `"dp,tp"`, `()` → `"-"`."""
    return ",".join(axes) if axes else "-"


def parse_key(key: str) -> AxisEntry | None:
    """The inverse of `axes_key`, as an assignment entry: `"dp,tp"` → `("dp", "tp")`,
    `"tp"` → `"tp"`, `"-"` → None."""
    if key == "-":
        return None
    axes = tuple(key.split(","))
    return axes[0] if len(axes) == 1 else axes


def group_choices(axes: Sequence[str]) -> tuple[str, ...]:
    """The choices for one logical axis, over the mesh axes of size > 1.

    Unsharded, each single axis, every group of two or more in mesh order,
    then all of them in reverse order (the other device layout of the whole
    mesh). On `("dp", "tp")`: `("-", "dp", "tp", "dp,tp", "tp,dp")`.
    """
    out = ["-", *axes]
    for k in range(2, len(axes) + 1):
        out += [axes_key(c) for c in itertools.combinations(axes, k)]
    if len(axes) > 1:
        out.append(axes_key(tuple(reversed(axes))))
    return tuple(out)


def batch_axis_names(logical: LogicalAxes) -> tuple[str, ...]:
    """The logical axes on the leading dim of the batch arguments' leaves, in
    axis order: what `batch_axes` decides in the logical family."""
    lead = {leaf.names[0] for argument in logical.arguments[1:] for leaf in argument
            if leaf.names and leaf.names[0] is not None}
    return tuple(a.name for a in logical.axes if a.name in lead)


def offered_axes(logical: LogicalAxes, mesh: _mesh.AnyMesh, cap: int) -> tuple[str, ...]:
    """The logical axes the block offers, largest first (ties by name).

    Those the state carries, except the batch's, whose size is at least the
    smallest mesh axis of size > 1, at most `cap` of them.

    Example: gpt:tiny on `(dp=2, tp=4)` offers its vocab, mlp, embed, seq and
    heads axes (sizes 256, 256, 64, 32, 4), largest first.
    """
    sizes = [s for s in _mesh.axis_sizes(mesh).values() if s > 1]
    if not sizes or not logical.arguments:
        return ()
    batch = batch_axis_names(logical)
    state = {n for leaf in logical.arguments[0] for n in leaf.names if n is not None}
    fits = [a for a in logical.axes
            if a.name in state and a.name not in batch and a.size >= min(sizes)]
    fits.sort(key=lambda a: (-a.size, a.name))
    return tuple(a.name for a in fits[:cap])


def split_rules(mesh: _mesh.AnyMesh, logical: LogicalAxes,
                assignment: Mapping[str, Any]) -> tuple[LogicalAxisRule, LogicalAxisRule]:
    """One assignment as the candidate's two rules: the state rule holds the
    state's leaves (argument 0), the batch rule the other arguments', each
    with the axes its leaves carry and its part of the assignment.

    Example: `split_rules(mesh, axes, {"heads": "tp", "batch": "dp"})` →
    a state rule with `heads → tp` and a batch rule with `batch → dp`.
    """
    return (_sub_rule(mesh, logical, logical.arguments[:1], assignment),
            _sub_rule(mesh, logical, logical.arguments[1:], assignment))


def _sub_rule(mesh: _mesh.AnyMesh, logical: LogicalAxes, arguments: Sequence[Any],
              assignment: Mapping[str, Any]) -> LogicalAxisRule:
    used = {n for argument in arguments for leaf in argument for n in leaf.names
            if n is not None}
    axes = LogicalAxes(tuple(a for a in logical.axes if a.name in used), tuple(arguments))
    return LogicalAxisRule(mesh, axes, {n: e for n, e in assignment.items() if n in used})


@dataclasses.dataclass(frozen=True)
class FamilyBlock(ParamBlock):
    """`family ∈ {"rules", "logical"}`: which family builds the state rule."""

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return (Param.categorical("family", FAMILIES),)

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        return draft


@dataclasses.dataclass(frozen=True)
class When(ParamBlock):
    """Another block, asked and built only when `family` has the value `family`.

    Its parameters keep their names, kinds and choices; each gains the
    condition `family == <family>` (before its own conditions).
    """

    block: ParamBlock
    family: str

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return tuple(dataclasses.replace(p, when=(("family", self.family), *p.when))
                     for p in self.block.params(space))

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        if values.get("family") != self.family:
            return draft
        return self.block.build(space, values, draft)


@dataclasses.dataclass(frozen=True)
class LogicalBlock(ParamBlock):
    """`logical_<name>` per offered logical axis; builds both rules of the candidate.

    Comes after the `BatchBlock`: it reads `batch_axes` for the batch's
    logical axes and replaces the draft's state and batch rules with one
    assignment's `LogicalAxisRule`s (`split_rules`).
    """

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        # A group whose size does not divide the axis's units would leave it
        # whole (`LogicalAxisRule`), the "-" candidate again: not offered.
        choices = group_choices(space.axes)
        sizes = _mesh.axis_sizes(space.mesh)
        units = {a.name: a.size for a in space.logical.axes}
        return tuple(Param.categorical(f"logical_{name}", tuple(
            c for c in choices if c == "-" or units[name] % math.prod(
                sizes[a] for a in c.split(",")) == 0))
            for name in space.logical_axes())

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        logical = space.logical
        assignment: dict[str, Any] = {
            name: parse_key(values[f"logical_{name}"]) for name in space.logical_axes()}
        batch = parse_key(values["batch_axes"])
        for name in batch_axis_names(logical):
            assignment[name] = batch
        state_rule, batch_rule = split_rules(space.mesh, logical, assignment)
        return dataclasses.replace(draft, state_rule=state_rule, batch_rule=batch_rule)
