"""The `auto` rule: each large dim gets the first unused mesh axis that divides it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import spec as _spec
from ..base import tree as _tree
from .axes import (
    AxisEntry,
    axis_names_from_json,
    axis_names_to_json,
    mesh_entries,
    normalise_axis_names,
)
from .base import ShardingRule


@dataclasses.dataclass(frozen=True)
class AutoShardingRule(ShardingRule):
    """Gives each large dim the first unused mesh axis that divides it.

    Leaves with fewer than `min_shard_size` elements (default: the mesh's
    device count) stay replicated. Otherwise dims are visited from largest to
    smallest (smallest first with `reverse=True`; equal sizes in dim order) and
    each takes the first still-unused entry of `axis_names` whose size divides
    it, until the entries run out. An entry may be a tuple of axes, which then
    acts as one axis of their product size. Size-1 axes are skipped.

    Example: on mesh `{'dp': 2, 'tp': 4}`, a `[1024, 512]` weight gives
    `P('dp', 'tp')`; with `axis_names=('tp', 'dp')` it gives `P('tp', 'dp')`.

    Args:
      mesh: a Mesh or AbstractMesh; None means the in-context mesh at apply.
      axis_names: entries to hand out, in priority order; default all axes.
      min_shard_size: smallest leaf (in elements) worth splitting.
      reverse: visit dims smallest first.
    """

    mesh: _mesh.AnyMesh | None = None
    axis_names: tuple[AxisEntry, ...] | None = None
    min_shard_size: int | None = None
    reverse: bool = False
    kind: ClassVar[str] = "auto"

    def __post_init__(self) -> None:
        where = "AutoShardingRule"
        object.__setattr__(self, "axis_names", normalise_axis_names(self.axis_names, where))
        if self.min_shard_size is not None:
            if isinstance(self.min_shard_size, bool) or not isinstance(self.min_shard_size, int):
                raise TypeError(
                    f"{where}: min_shard_size must be an int, got {self.min_shard_size!r}")
            if not self.min_shard_size > 0:
                raise ValueError(
                    f"{where}: min_shard_size must be a positive number, got "
                    f"{self.min_shard_size!r}")
        if not isinstance(self.reverse, bool):
            raise TypeError(f"{where}: reverse must be a bool, got {self.reverse!r}")

    def apply(self, pytree: Any) -> Any:
        mesh = _mesh.resolve_mesh(self.mesh)
        entries = mesh_entries(mesh, self.axis_names, "AutoShardingRule")
        min_size = self.min_shard_size or _mesh.device_count(mesh)

        def one(path: str, leaf: Any) -> P:
            shape = _tree.leaf_shape(leaf)
            if not shape or math.prod(shape) < min_size:
                return P()
            if self.reverse:
                order = sorted(range(len(shape)), key=lambda d: (shape[d], d))
            else:
                order = sorted(range(len(shape)), key=lambda d: (-shape[d], d))
            out: list[Any] = [None] * len(shape)
            unused = list(entries)
            for d in order:
                if not unused:
                    break
                for k, (entry, size) in enumerate(unused):
                    if shape[d] % size == 0:
                        out[d] = entry
                        del unused[k]
                        break
            return _spec.canonical(P(*out))

        return _tree.map_with_path(one, pytree)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "axis_names": axis_names_to_json(self.axis_names),
            "min_shard_size": self.min_shard_size,
            "reverse": self.reverse,
        }

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None, where: str,
    ) -> AutoShardingRule:
        return cls(
            mesh=mesh, axis_names=axis_names_from_json(config.get("axis_names")),
            min_shard_size=config.get("min_shard_size"), reverse=config.get("reverse", False))
