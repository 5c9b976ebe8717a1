"""Axis names as rules take them: checked, frozen, matched to a mesh, as JSON.

A rule's `axis_names` lists mesh axes in priority order; an entry may be one
name or a tuple of names that act as one axis of their product size. These
helpers are shared by the rules that hand out axes (`auto`, `memory`,
`batch`); they are not part of the public front.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..base import mesh as _mesh
from ..base import spec as _spec

AxisEntry = str | tuple[str, ...]


def normalise_axis_names(names: Iterable[Any] | None, where: str) -> tuple[AxisEntry, ...] | None:
    """Checks `axis_names` (names or groups of names) and freezes it to tuples.

    Example: `["dp", ["fsdp", "sp"], ("tp",)]` → `("dp", ("fsdp", "sp"), "tp")`.

    Raises:
      TypeError: a bare string, or an entry that is not a name or a non-empty
        group of names.
      ValueError: an axis listed twice.
    """
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError(
            f"{where}: axis_names must be a sequence of axis names, got the string "
            f"{names!r}; write ({names!r},)")
    out: list[AxisEntry] = []
    seen: list[str] = []
    for entry in names:
        if isinstance(entry, list | tuple):
            group = tuple(entry)
            if not group or not all(isinstance(a, str) for a in group):
                raise TypeError(
                    f"{where}: axis group {entry!r} must be a non-empty tuple of axis names")
            entry = group[0] if len(group) == 1 else group
        elif not isinstance(entry, str):
            raise TypeError(
                f"{where}: axis name {entry!r} must be a string or a tuple of strings")
        for axis in _spec.entry_axes(entry):
            if axis in seen:
                raise ValueError(
                    f"{where}: axis {axis!r} is listed twice in axis_names="
                    f"{tuple(names)!r}; list each mesh axis once")
            seen.append(axis)
        out.append(entry)
    return tuple(out)


def mesh_entries(
    mesh: _mesh.AnyMesh, names: tuple[AxisEntry, ...] | None, where: str,
) -> list[tuple[AxisEntry, int]]:
    """`(entry, size)` for every usable axis entry, checked against the mesh.

    Size-1 axes split nothing, so entries whose size is 1 are dropped rather
    than allowed to use up a dim.

    Example: on `{'dp': 2, 'tp': 4, 'pp': 1}`, `names=None` gives
    `[('dp', 2), ('tp', 4)]`.
    """
    sizes = _mesh.axis_sizes(mesh)
    entries = tuple(mesh.axis_names) if names is None else names
    unknown = [a for e in entries for a in _spec.entry_axes(e) if a not in sizes]
    if unknown:
        raise ValueError(
            f"{where}: axis {unknown[0]!r} is not in the mesh, whose axes are "
            f"{tuple(sizes)}; fix the name or pass a mesh that has it")
    out = []
    for entry in entries:
        size = math.prod(sizes[a] for a in _spec.entry_axes(entry))
        if size > 1:
            out.append((entry, size))
    return out


def axis_names_to_json(names: tuple[AxisEntry, ...] | None) -> list[Any] | None:
    """JSON form of `axis_names`: groups become lists; `None` stays null."""
    if names is None:
        return None
    return [list(e) if isinstance(e, tuple) else e for e in names]


def axis_names_from_json(data: Any) -> tuple[AxisEntry, ...] | None:
    """Inverse of `axis_names_to_json` (checking is left to `normalise_axis_names`)."""
    if data is None:
        return None
    if not isinstance(data, list):
        # A bare string would otherwise be split into one-letter axis names.
        raise TypeError(f"axis_names must be a list of axis names, got {data!r}")
    return tuple(tuple(e) if isinstance(e, list) else e for e in data)
