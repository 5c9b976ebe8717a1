"""Logical axes: named roles of array dims ("embed", "heads", ...), per leaf.

A `LogicalAxes` says, for every leaf of every argument of a step, which
logical axis each of its dims carries. Dims that carry the same logical axis
must be split alike for the step to run without resharding (a weight's output
dim and the next weight's input dim, a parameter and its Adam moments).
`discover_logical_axes` (`logical.discover`) finds them from the step's
dataflow; `LogicalAxisRule` (`rules.logical`) maps them onto mesh axes.

The JSON form (`to_json`) is what plan files store:

    {"axes": [{"name": "heads", "size": 4, "role": "heads"}, ...],
     "arguments": [[{"path": "params/layers/0/attn/wq", "shape": [64, 64],
                     "names": ["embed", "heads"]}, ...], ...],
     "merges": ["..."], "unhandled": ["..."]}
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..base.warnings import note

# Roles a discovered axis may be named after, when its role is recognised.
ROLES = ("batch", "seq", "embed", "mlp", "heads", "kv_heads", "head_dim", "vocab", "experts",
         "layers")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class LogicalAxis:
    """One logical axis.

    Attributes:
      name: unique within its `LogicalAxes`; an identifier (it names a search
        parameter), e.g. "heads", "vocab_2", "d256".
      size: the number of units the axis splits: the smallest size among the
        dims that carry it. A merged dim (`wq`'s output, heads × head_dim)
        carries the heads axis, and only a mesh size that divides the number
        of heads keeps whole heads on each device.
      role: the recognised role (one of `ROLES`), or None.
    """

    name: str
    size: int
    role: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"logical axis name {self.name!r} must be an identifier")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"logical axis {self.name!r}: size must be a positive int, "
                             f"got {self.size!r}")
        if self.role is not None and self.role not in ROLES:
            raise ValueError(f"logical axis {self.name!r}: role {self.role!r} is not one of "
                             f"{ROLES}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "role": self.role}


@dataclasses.dataclass(frozen=True)
class LeafAxes:
    """The logical axes of one leaf.

    Attributes:
      path: the leaf's `/`-joined key path within its argument.
      shape: its shape; None for a non-array leaf.
      names: one logical axis name per dim, None for a dim on no axis (size-1
        dims); () for a non-array leaf.
    """

    path: str
    shape: tuple[int, ...] | None
    names: tuple[str | None, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", None if self.shape is None else tuple(self.shape))
        object.__setattr__(self, "names", tuple(self.names))
        rank = 0 if self.shape is None else len(self.shape)
        if len(self.names) != rank:
            raise ValueError(f"{self.path}: {len(self.names)} logical names for a leaf of "
                             f"rank {rank} (shape {self.shape})")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "shape": None if self.shape is None else list(self.shape),
                "names": list(self.names)}


@dataclasses.dataclass(frozen=True)
class LogicalAxes:
    """The logical axes of a step's arguments.

    Attributes:
      axes: every axis, in order of first appearance (argument, leaf, dim).
      arguments: per argument of the step (the state first), its leaves in
        leaf order.
      merges: notes on places where the dataflow joined dims that may play
        different roles (a flatten of two large dims, one leaf carrying an
        axis on two dims), so the result is never silently wrong.
      unhandled: primitives of the step that couple no dims because the
        analysis has no rule for them (their dims stay apart).
      conflicts: where the user's own logical names (Flax's boxed
        parameters, `logical.user`) disagree with the dataflow: two names on
        dims the dataflow couples, or names that do not fit their leaf.
    """

    axes: tuple[LogicalAxis, ...]
    arguments: tuple[tuple[LeafAxes, ...], ...]
    merges: tuple[str, ...] = ()
    unhandled: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "conflicts", tuple(self.conflicts))
        object.__setattr__(self, "axes", tuple(self.axes))
        object.__setattr__(self, "arguments", tuple(tuple(a) for a in self.arguments))
        object.__setattr__(self, "merges", tuple(self.merges))
        object.__setattr__(self, "unhandled", tuple(self.unhandled))
        names = [a.name for a in self.axes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"logical axes named twice: {twice}")
        for argument in self.arguments:
            for leaf in argument:
                unknown = [n for n in leaf.names if n is not None and n not in names]
                if unknown:
                    raise ValueError(f"{leaf.path}: logical axis {unknown[0]!r} is not among "
                                     f"the axes {tuple(names)}")

    @property
    def sizes(self) -> dict[str, int]:
        """Axis name → size, in axis order."""
        return {a.name: a.size for a in self.axes}

    def axis(self, name: str) -> LogicalAxis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(f"no logical axis {name!r}; the axes are "
                       f"{tuple(a.name for a in self.axes)}")

    def leaves(self, argument: int) -> dict[str, LeafAxes]:
        """Path → `LeafAxes` for one argument (0 is the state)."""
        return {leaf.path: leaf for leaf in self.arguments[argument]}

    def describe(self) -> str:
        """A few lines for people: each axis with its size, role and the number
        of leaves that carry it, then the merges and the unhandled primitives.

        Example:
            heads     size 4    role heads   24 leaves
        """
        counts = dict.fromkeys(self.sizes, 0)
        for argument in self.arguments:
            for leaf in argument:
                for name in dict.fromkeys(n for n in leaf.names if n is not None):
                    counts[name] += 1
        width = max((len(a.name) for a in self.axes), default=0)
        lines = [f"{a.name:<{width}}  size {a.size:<6} "
                 f"{'role ' + a.role if a.role else 'no role':<15} "
                 f"{counts[a.name]} {'leaf' if counts[a.name] == 1 else 'leaves'}"
                 for a in self.axes]
        lines += [f"merge: {m}" for m in self.merges]
        lines += [f"conflict: {c}" for c in self.conflicts]
        if self.unhandled:
            lines.append(f"unhandled primitives (no coupling rule): "
                         f"{', '.join(self.unhandled)}")
        return "\n".join(lines)

    def notes(self) -> tuple[str, ...]:
        """What the analysis could not read, as notes (`base.warnings`): one
        for the unhandled primitives, one per merge, one per conflict with the
        user's names.

        Example: `("unhandled: primitives with no coupling rule: my_op ...",)`.
        """
        out = [note("merged", m) for m in self.merges]
        out += [note("conflict", c) for c in self.conflicts]
        if self.unhandled:
            out.insert(0, unhandled_note(self.unhandled))
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        out = {
            "axes": [a.to_json() for a in self.axes],
            "arguments": [[leaf.to_json() for leaf in arg] for arg in self.arguments],
            "merges": list(self.merges),
            "unhandled": list(self.unhandled),
        }
        if self.conflicts:  # absent when empty: the form of axes found before it existed
            out["conflicts"] = list(self.conflicts)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "logical axes") -> LogicalAxes:
        """The inverse of `to_json`; a ValueError names `where` on bad data."""
        try:
            if not isinstance(data, Mapping):
                raise TypeError(f"expected an object, got {type(data).__name__}")
            axes = tuple(LogicalAxis(a["name"], a["size"], a.get("role"))
                         for a in _list(data["axes"], "axes"))
            arguments = tuple(
                tuple(LeafAxes(leaf["path"],
                               None if leaf["shape"] is None else tuple(leaf["shape"]),
                               tuple(leaf["names"]))
                      for leaf in _list(arg, f"arguments[{i}]"))
                for i, arg in enumerate(_list(data["arguments"], "arguments")))
            return cls(axes, arguments, tuple(data.get("merges", ())),
                       tuple(data.get("unhandled", ())), tuple(data.get("conflicts", ())))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: malformed logical axes ({err})") from None


def _list(value: Any, what: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"{what} must be a list, got {type(value).__name__}")
    return value


def unhandled_note(primitives: Sequence[str]) -> str:
    """The note (`base.warnings`) for primitives the dataflow walk has no rule for."""
    return note("unhandled", f"primitives with no coupling rule: {', '.join(primitives)} "
                "(same-shape ones taken as elementwise, the others couple nothing; add a "
                "rule in logical/primitives.py)")
