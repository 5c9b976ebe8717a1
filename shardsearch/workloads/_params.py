"""Parameter trees: one description, two forms (concrete numpy, abstract shapes).

A model describes its parameters once, as a tree of `Param` leaves with the
layers unrolled (a list of per-layer dicts). `materialize` draws concrete
arrays from it, `abstract` turns it into `jax.ShapeDtypeStruct`s without
allocating, and `stack_layers` converts either form to the stacked layout used
under `lax.scan` (one leading layer dim per leaf).

Drawing always happens per layer in the unrolled order, so the stacked
parameters of a seed are exactly the unrolled ones stacked: the two layouts of
one model compute the same loss, which the tests rely on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

_INITS = ("normal", "zeros", "ones")


@dataclasses.dataclass(frozen=True)
class Param:
    """How to create one float32 parameter.

    Args:
        shape: the parameter's shape, e.g. `(d_model, n_heads * head_dim)`.
        init: "normal" (N(0, std²)), "zeros" or "ones".
        std: standard deviation for "normal"; ignored otherwise.

    Example:
        >>> Param((256, 1024), std=0.02)  # a [d_model, d_ff] weight
    """

    shape: tuple[int, ...]
    init: str = "normal"
    std: float = 0.02

    def __post_init__(self):
        shape = tuple(self.shape)
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ValueError(
                f"Param shape must be positive ints, got shape={self.shape!r}; "
                "check the model config's sizes")
        object.__setattr__(self, "shape", shape)
        if self.init not in _INITS:
            raise ValueError(f"Param init must be one of {_INITS}, got init={self.init!r}")
        if self.init == "normal" and not self.std > 0:
            raise ValueError(f"Param std must be > 0 for a normal init, got std={self.std!r}")


def _is_param(x: Any) -> bool:
    return isinstance(x, Param)


def materialize(spec: Any, rng: np.random.Generator) -> Any:
    """Draws concrete float32 numpy arrays for a tree of `Param`s.

    Args:
        spec: a pytree whose leaves are `Param`.
        rng: the generator every normal draw comes from, in the tree's
            flattening order (dict keys sorted, lists in order).

    Returns:
        The same tree with numpy float32 arrays as leaves.
    """

    def draw(p: Param) -> np.ndarray:
        if p.init == "zeros":
            return np.zeros(p.shape, np.float32)
        if p.init == "ones":
            return np.ones(p.shape, np.float32)
        return (rng.standard_normal(p.shape, dtype=np.float32) * np.float32(p.std))

    return jax.tree_util.tree_map(draw, spec, is_leaf=_is_param)


def abstract(spec: Any) -> Any:
    """Turns a tree of `Param`s into float32 `jax.ShapeDtypeStruct`s."""
    return jax.tree_util.tree_map(
        lambda p: jax.ShapeDtypeStruct(p.shape, np.float32), spec, is_leaf=_is_param)


def count(spec: Any) -> int:
    """Number of scalars in a tree of `Param`s (or of arrays / shape structs)."""
    leaves = jax.tree_util.tree_leaves(spec, is_leaf=_is_param)
    return sum(int(np.prod(x.shape, dtype=np.int64)) for x in leaves)


def stack_layers(layers: list[Any]) -> Any:
    """Stacks a list of identical per-layer trees along a new leading dim.

    Works on numpy arrays (`np.stack`) and on `jax.ShapeDtypeStruct`s (the
    shape gains a leading `len(layers)`), so both `init` and `abstract` share
    it.

    Args:
        layers: per-layer trees with the same structure and shapes.

    Returns:
        One tree whose leaves have shape `(len(layers), *leaf.shape)`.

    Raises:
        ValueError: when `layers` is empty.
    """
    if not layers:
        raise ValueError("stack_layers needs at least one layer; got an empty list")

    def stack(*xs):
        if isinstance(xs[0], jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct((len(xs), *xs[0].shape), xs[0].dtype)
        return np.stack(xs)

    return jax.tree_util.tree_map(stack, *layers)
