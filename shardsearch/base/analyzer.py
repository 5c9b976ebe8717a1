"""Checking spec trees against a mesh and counting the bytes each device holds."""

from __future__ import annotations

import math
from typing import Any

from jax.sharding import PartitionSpec as P

from . import mesh as _mesh
from . import spec as _spec
from . import tree as _tree


class ShardingAnalyzer:
    """Validates spec trees and estimates per-device memory, exactly.

    Args:
      mesh: a Mesh or AbstractMesh; None means the in-context mesh at each call.

    Example: on `{'dp': 2, 'tp': 4}`, a `[8, 16]` f32 leaf with `P('dp', 'tp')`
    holds 512 bytes in total and 64 bytes per device.
    """

    def __init__(self, mesh: _mesh.AnyMesh | None = None) -> None:
        self.mesh = mesh if mesh is None else _mesh.resolve_mesh(mesh)

    def _sizes(self) -> dict[str, int]:
        return _mesh.axis_sizes(_mesh.resolve_mesh(self.mesh))

    def validate_partition_specs(self, pytree: Any, specs: Any) -> list[str]:
        """Every problem with `specs` for `pytree`, one message each.

        Checks per leaf: axis not in the mesh, axis used twice in one spec, spec
        longer than the leaf's rank, dim not divisible by the product of the
        sizes of the axes its entry names. Tuple entries and
        `PartitionSpec.UNCONSTRAINED` are valid.

        Returns:
          Messages naming the leaf path, dim, axis and sizes; `[]` when valid.
        """
        sizes = self._sizes()
        pairs, spec_leaves = _tree.specs_for_leaves(pytree, specs)
        problems: list[str] = []
        for (path, leaf), spec in zip(pairs, spec_leaves, strict=True):
            problems.extend(_leaf_problems(path or "<root>", leaf, spec, sizes))
        return problems

    def estimate_memory_usage(self, pytree: Any, specs: Any) -> dict[str, Any]:
        """Exact bytes of the tree, unsharded and per device.

        A sharded dim of size `n` over axes of total size `k` holds `ceil(n/k)`
        rows per device (XLA pads uneven shards), so the figure matches
        `compiled.memory_analysis().argument_size_in_bytes` for the placed tree.
        Unconstrained entries count as unsharded.

        Returns:
          `{"total_size": bytes of the whole unsharded tree,
            "size_per_device": bytes one device holds,
            "leaves": {path: {"shape", "dtype", "spec", "bytes",
                              "bytes_per_device"}}}`.
        """
        sizes = self._sizes()
        pairs, spec_leaves = _tree.specs_for_leaves(pytree, specs)
        total = per_device = 0
        leaves: dict[str, dict[str, Any]] = {}
        for (path, leaf), spec in zip(pairs, spec_leaves, strict=True):
            shape = _tree.leaf_shape(leaf)
            if shape is None:
                continue
            itemsize = _tree.leaf_dtype(leaf).itemsize
            local = _local_shape(shape, spec, sizes)
            nbytes = math.prod(shape) * itemsize
            local_bytes = math.prod(local) * itemsize
            total += nbytes
            per_device += local_bytes
            leaves[path or "<root>"] = {
                "shape": shape, "dtype": str(_tree.leaf_dtype(leaf)), "spec": spec,
                "bytes": nbytes, "bytes_per_device": local_bytes,
            }
        return {"total_size": total, "size_per_device": per_device, "leaves": leaves}


def _local_shape(shape: tuple[int, ...], spec: P, sizes: dict[str, int]) -> list[int]:
    local = list(shape)
    for d, entry in enumerate(spec):
        if d >= len(local):
            break
        n = math.prod(sizes.get(a, 1) for a in _spec.entry_axes(entry))
        local[d] = -(-local[d] // n)
    return local


def _leaf_problems(path: str, leaf: Any, spec: Any, sizes: dict[str, int]) -> list[str]:
    if not isinstance(spec, P):
        return [f"{path}: spec {spec!r} is a {type(spec).__name__}, not a PartitionSpec"]
    shape = _tree.leaf_shape(leaf)
    shape = () if shape is None else shape
    problems = []
    if len(spec) > len(shape):
        problems.append(
            f"{path}: spec {spec} has {len(spec)} entries but the leaf has rank "
            f"{len(shape)} (shape {shape}); drop the extra entries")
    seen: list[str] = []
    for d, entry in enumerate(spec):
        try:
            axes = _spec.entry_axes(entry)
        except TypeError as err:
            problems.append(f"{path}: dim {d}: {err}")
            continue
        known = True
        for axis in axes:
            if axis not in sizes:
                problems.append(
                    f"{path}: dim {d} uses axis {axis!r}, which is not in the mesh "
                    f"{tuple(sizes)}; use one of those names")
                known = False
            elif axis in seen:
                problems.append(
                    f"{path}: axis {axis!r} is used twice in spec {spec}; a mesh axis may "
                    "split one dim only")
            seen.append(axis)
        if known and axes and d < len(shape):
            n = math.prod(sizes[a] for a in axes)
            if shape[d] % n:
                what = f"axis {axes[0]!r}" if len(axes) == 1 else f"axes {axes}"
                problems.append(
                    f"{path}: dim {d} has size {shape[d]}, not divisible by mesh {what} of "
                    f"size {n}; use a different axis or pad the dim")
    return problems
