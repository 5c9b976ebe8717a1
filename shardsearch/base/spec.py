"""PartitionSpec helpers: what an entry names, whether a spec shards, a canonical form."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jax.sharding import PartitionSpec as P

UNCONSTRAINED = P.UNCONSTRAINED


def entry_axes(entry: Any) -> tuple[str, ...]:
    """Mesh axes one spec entry names: `None` → `()`, `'tp'` → `('tp',)`,
    `('fsdp', 'sp')` → `('fsdp', 'sp')`, `P.UNCONSTRAINED` → `()`."""
    if entry is None or entry is UNCONSTRAINED:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, tuple | list):
        return tuple(entry)
    raise TypeError(
        f"spec entry {entry!r} is not None, an axis name, a tuple of axis names or "
        "PartitionSpec.UNCONSTRAINED")


def dim_axes(spec: P, rank: int) -> tuple[tuple[str, ...] | None, ...]:
    """Per dim of a rank-`rank` value, the mesh axes `spec` splits it over:
    `()` for a whole dim (None, or past the spec's end), None where the spec
    leaves the dim to XLA (`P.UNCONSTRAINED`).

    Example: `dim_axes(P('dp', P.UNCONSTRAINED), 3)` → `(('dp',), None, ())`.
    """
    entries = list(spec)[:rank]
    return tuple(None if e is UNCONSTRAINED else entry_axes(e) for e in entries) + (
        ((),) * (rank - len(entries)))


def spec_axes(spec: P) -> tuple[str, ...]:
    """All axes a spec names, in order: `P(('a','b'), 'c')` → `('a','b','c')`."""
    return tuple(a for entry in spec for a in entry_axes(entry))


def shards_nothing(spec: P | None, sizes: dict[str, int] | None = None) -> bool:
    """True when `spec` splits no dim: `P()`, `P(None, None)`, only unconstrained
    entries, or (given the mesh's `sizes`) only size-1 axes."""
    if spec is None:
        return True
    axes = spec_axes(spec)
    if sizes is not None:
        axes = tuple(a for a in axes if sizes.get(a, 2) > 1)
    return not axes


def canonical(spec: P | None) -> P:
    """One spelling per meaning: trailing `None`s dropped, 1-tuples unwrapped,
    empty tuples as `None`. `P(('dp',), None)` → `P('dp')`."""
    if spec is None:
        return P()
    entries: list[Any] = []
    for entry in spec:
        if isinstance(entry, tuple | list):
            entry = None if not entry else (entry[0] if len(entry) == 1 else tuple(entry))
        entries.append(entry)
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def spec_to_json(spec: P) -> list[Any]:
    """JSON form of a spec: a list whose items are null, a name, a list of names,
    or the string `"<unconstrained>"`."""
    out: list[Any] = []
    for entry in spec:
        if entry is UNCONSTRAINED:
            out.append("<unconstrained>")
        elif isinstance(entry, tuple | list):
            out.append(list(entry))
        else:
            out.append(entry)
    return out


def spec_from_json(data: Any, where: str = "spec") -> P:
    """Inverse of `spec_to_json`; raises ValueError naming `where` on bad data."""
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a list of spec entries, got {data!r}")
    entries: list[Any] = []
    for i, item in enumerate(data):
        if item == "<unconstrained>":
            entries.append(UNCONSTRAINED)
        elif item is None or isinstance(item, str):
            entries.append(item)
        elif isinstance(item, list) and all(isinstance(a, str) for a in item):
            entries.append(tuple(item))
        else:
            raise ValueError(
                f"{where}: entry {i} is {item!r}; expected null, an axis name or a list "
                "of axis names")
    return P(*entries)


def spec_source(spec_json: Sequence[Any]) -> str:
    """A spec's JSON form as Python source: `[null, "tp"]` → `P(None, "tp")`."""
    entries = []
    for entry in spec_json:
        if entry is None:
            entries.append("None")
        elif entry == "<unconstrained>":
            entries.append("P.UNCONSTRAINED")
        elif isinstance(entry, str):
            entries.append(json.dumps(entry))
        else:
            names = ", ".join(json.dumps(a) for a in entry)
            entries.append(f"({names},)" if len(entry) == 1 else f"({names})")
    return f"P({', '.join(entries)})"
