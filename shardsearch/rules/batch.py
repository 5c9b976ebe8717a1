"""The `batch` rule: the leading dim of every input leaf over a group of axes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import tree as _tree
from .axes import AxisEntry, normalise_axis_names
from .base import ShardingRule


@dataclasses.dataclass(frozen=True)
class BatchShardingRule(ShardingRule):
    """Splits the leading (batch) dim of every leaf over a group of axes.

    Leaves of rank 0 and non-arrays stay replicated. The axes act as one group
    of their product size, in the order given; `axes=()` replicates. A batch
    dim the group does not divide still gets the spec, so the analyzer reports
    it instead of the plan silently changing.

    Example: `BatchShardingRule(("dp", "tp"))` gives `P(('dp', 'tp'))` for a
    `[16, 128]` token batch; `BatchShardingRule(("dp",))` gives `P('dp')`.
    """

    axes: tuple[str, ...] = ()
    kind: ClassVar[str] = "batch"

    def __post_init__(self) -> None:
        axes = normalise_axis_names(self.axes, "BatchShardingRule") or ()
        if any(isinstance(a, tuple) for a in axes):
            raise TypeError(
                f"BatchShardingRule: axes={self.axes!r} must be a flat tuple of axis names")
        object.__setattr__(self, "axes", axes)

    @property
    def entry(self) -> AxisEntry | None:
        """The spec entry for the batch dim: None, a name, or a tuple of names."""
        if not self.axes:
            return None
        return self.axes[0] if len(self.axes) == 1 else self.axes

    def apply(self, pytree: Any) -> Any:
        entry = self.entry
        return _tree.map_with_path(
            lambda path, leaf: P(entry) if entry and _tree.leaf_shape(leaf) else P(), pytree)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "axes": list(self.axes)}

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None, where: str,
    ) -> BatchShardingRule:
        # The batch rule needs no mesh: its spec is the same on any mesh.
        if not isinstance(config["axes"], list):
            raise TypeError(f"axes must be a list of axis names, got {config['axes']!r}")
        return cls(tuple(config["axes"]))
