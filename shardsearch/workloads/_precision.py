"""Mixed precision: float32 parameters, computed in a narrower dtype inside the step.

MaxText and Megatron-LM keep float32 master weights (and float32 Adam moments)
and run the forward and backward passes in bfloat16. A config's
`compute_dtype` says which; the step casts the parameters once, at the top of
the loss, so the gradients flow back to the float32 leaves through the cast
and the optimizer update stays float32.

Example:
    >>> cast_params({"w": jnp.ones((2, 2))}, "bfloat16")["w"].dtype
    dtype(bfloat16)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

COMPUTE_DTYPES = ("float32", "bfloat16")


def check_compute_dtype(owner: str, compute_dtype: Any) -> None:
    """Raises ValueError unless `compute_dtype` is one of `COMPUTE_DTYPES`."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"{owner}: compute_dtype={compute_dtype!r}; choose one of "
                         f"{COMPUTE_DTYPES} (parameters stay float32 either way)")


def cast_params(params: Any, compute_dtype: str) -> Any:
    """`params` with every float32 leaf cast to `compute_dtype`; unchanged (the
    same object, no operation traced) for "float32", so the full-precision
    workloads trace exactly the program they always did."""
    if compute_dtype == "float32":
        return params
    dtype = jnp.dtype(compute_dtype)
    return jax.tree_util.tree_map(
        lambda p: p.astype(dtype) if p.dtype == jnp.float32 else p, params)
