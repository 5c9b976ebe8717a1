"""Pytree helpers shared by the rules and the analyzer: leaf paths and shapes."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P


def path_str(path: tuple[Any, ...]) -> str:
    """`/`-joined key path of a leaf: `layers/3/attn/wq`; `""` for the root."""
    return jax.tree_util.keystr(path, simple=True, separator="/")


def leaf_shape(leaf: Any) -> tuple[int, ...] | None:
    """The shape of an array-like leaf (anything with `.shape` and `.dtype`).

    Python scalars count as 0-d arrays. Returns None for leaves that are not
    arrays at all (strings, objects), which every rule leaves replicated.
    """
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return tuple(int(d) for d in leaf.shape)
    if isinstance(leaf, bool | int | float | complex | np.generic):
        return ()
    return None


def leaf_dtype(leaf: Any) -> np.dtype | None:
    """The dtype JAX would give the leaf on device, or None for non-arrays."""
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return np.dtype(leaf.dtype)
    if isinstance(leaf, bool | int | float | complex | np.generic):
        # Python scalars become weakly typed 32-bit values unless x64 is on.
        return np.dtype(jax.dtypes.canonicalize_dtype(np.asarray(leaf).dtype))
    return None


def leaf_size(leaf: Any) -> int:
    """Number of elements of an array-like leaf; 0 for non-arrays."""
    shape = leaf_shape(leaf)
    return 0 if shape is None else math.prod(shape)


def map_with_path(fn: Callable[[str, Any], Any], tree: Any) -> Any:
    """`jax.tree.map` that hands `fn` the leaf's `/`-joined path too."""
    return jax.tree_util.tree_map_with_path(lambda p, x: fn(path_str(p), x), tree)


def specs_for_leaves(tree: Any, specs: Any) -> tuple[list[tuple[str, Any]], list[Any]]:
    """Pairs each leaf of `tree` with its entry in the spec tree `specs`.

    `specs` must have `tree`'s structure with a PartitionSpec (or None, meaning
    replicated) where `tree` has a leaf.

    Returns:
      `([(path, leaf), ...], [spec, ...])` in leaf order.

    Raises:
      ValueError: the structures differ; the message shows both.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    try:
        spec_leaves = treedef.flatten_up_to(specs)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"the spec tree does not match the array tree: expected structure "
            f"{treedef}, got {jax.tree_util.tree_structure(specs, is_leaf=_is_spec)}; "
            "produce specs with rule.apply(tree) on the same tree") from err
    pairs = [(path_str(p), x) for p, x in leaves]
    return pairs, [P() if s is None else s for s in spec_leaves]


def _is_spec(x: Any) -> bool:
    return isinstance(x, P) or x is None


def leaf_specs(specs: Any) -> list[tuple[str, P]]:
    """`(path, spec)` for every PartitionSpec in a spec tree, in leaf order."""
    flat = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda s: isinstance(s, P))[0]
    return [(path_str(p), s) for p, s in flat]
