"""The `memory` rule: split only the leaves too big for one device, just enough."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import spec as _spec
from ..base import tree as _tree
from ..base.units import parse_bytes
from .axes import (
    AxisEntry,
    axis_names_from_json,
    axis_names_to_json,
    mesh_entries,
    normalise_axis_names,
)
from .base import ShardingRule


@dataclasses.dataclass(frozen=True)
class MemoryConstrainedShardingRule(ShardingRule):
    """Splits only the leaves too big for one device's budget, just enough.

    A leaf whose bytes fit `max_memory_per_device` stays replicated. Otherwise
    mesh axes are taken largest first (ties in `axis_names` order); each goes
    to the dim with the largest per-device extent that it divides (a dim may
    take several axes), until the per-device shard fits or the axes run out.

    Example: budget 1 MiB on `{'dp': 2, 'tp': 4}`: a 4 MiB `[1024, 1024]` f32
    weight gives `P('tp')` (1 MiB per device); a 512 KiB one stays `P()`.

    Args:
      max_memory_per_device: bytes (int) or a size string like "16GiB".
      mesh: a Mesh or AbstractMesh; None means the in-context mesh at apply.
      axis_names: axes it may use; default all.
    """

    max_memory_per_device: int | float | str
    mesh: _mesh.AnyMesh | None = None
    axis_names: tuple[AxisEntry, ...] | None = None
    kind: ClassVar[str] = "memory"

    def __post_init__(self) -> None:
        where = "MemoryConstrainedShardingRule"
        try:
            budget = parse_bytes(self.max_memory_per_device)
        except ValueError as err:
            raise ValueError(
                f"{where}: max_memory_per_device must be a positive number, got "
                f"{self.max_memory_per_device!r} ({err})"
            ) from None
        object.__setattr__(self, "max_memory_per_device", budget)
        object.__setattr__(self, "axis_names", normalise_axis_names(self.axis_names, where))

    def apply(self, pytree: Any) -> Any:
        mesh = _mesh.resolve_mesh(self.mesh)
        entries = mesh_entries(mesh, self.axis_names, "MemoryConstrainedShardingRule")
        # Largest first; sorted() is stable, so ties keep axis_names order.
        entries = sorted(entries, key=lambda e: -e[1])
        budget = self.max_memory_per_device

        def one(path: str, leaf: Any) -> P:
            shape = _tree.leaf_shape(leaf)
            if not shape or math.prod(shape) == 0:
                return P()
            itemsize = _tree.leaf_dtype(leaf).itemsize
            local = list(shape)
            if math.prod(local) * itemsize <= budget:
                return P()
            assigned: list[list[str]] = [[] for _ in shape]
            for entry, size in entries:
                if math.prod(local) * itemsize <= budget:
                    break
                fits = [d for d in range(len(local)) if local[d] % size == 0]
                if not fits:
                    continue
                d = min(fits, key=lambda d: (-local[d], d))
                assigned[d].extend(_spec.entry_axes(entry))
                local[d] //= size
            return _spec.canonical(P(*(tuple(a) if a else None for a in assigned)))

        return _tree.map_with_path(one, pytree)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "max_memory_per_device": self.max_memory_per_device,
            "axis_names": axis_names_to_json(self.axis_names),
        }

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None, where: str,
    ) -> MemoryConstrainedShardingRule:
        return cls(config["max_memory_per_device"], mesh=mesh,
                   axis_names=axis_names_from_json(config.get("axis_names")))
