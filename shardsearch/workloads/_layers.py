"""Transformer building blocks shared by the gpt, llama and moe workloads.

Plain functions on arrays and parameter dicts. Activations are
`[batch, seq, ...]` so the batch dim the plans shard stays the leading one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..base.activations import activation
from . import _activations


def layer_norm(x: jax.Array, p: dict, eps: float = 1e-5) -> jax.Array:
    """LayerNorm over the last dim with `p = {"scale", "bias"}`."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def rms_norm(x: jax.Array, p: dict, eps: float = 1e-6) -> jax.Array:
    """RMSNorm over the last dim with `p = {"scale"}`."""
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * lax.rsqrt(ms + eps) * p["scale"]


def rotary(x: jax.Array, theta: float = 10000.0) -> jax.Array:
    """Rotary position embedding (rotate-half form) of `x: [B, S, heads, head_dim]`.

    The angles come from an iota inside the trace rather than a numpy table,
    so the compiled module carries no `[seq, head_dim]` literal.
    """
    seq, head_dim = x.shape[1], x.shape[-1]
    half = head_dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos = jnp.cos(angles)[None, :, None, :]
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                     chunk: int | None = None) -> jax.Array:
    """Causal softmax attention with grouped KV heads.

    Args:
        q: `[B, S, H, Dh]` queries.
        k: `[B, S, KV, Dh]` keys, `H % KV == 0` (KV == H is plain multi-head).
        v: `[B, S, KV, Dh]` values.
        chunk: None for the whole `[S, S]` score matrix at once; else queries
            in blocks of `chunk` rows (dividing S), one block's scores at a
            time and recomputed in the backward pass, so a layer never holds
            more than `[chunk, S]` scores per head: the memory of the fused
            (flash) attention MaxText and Megatron-LM train with, the same
            FLOPs (no block is skipped), without their kernels.

    Returns:
        `[B, S, H, Dh]`.

    The query heads are viewed as `[KV, H // KV]` instead of repeating the
    keys: the KV dim then lines up with the key heads, so a heads-sharded
    layout reaches K and V without copying them per query head.
    """
    b, s, h, dh = q.shape
    kv = k.shape[2]
    q = q.reshape(b, s, kv, h // kv, dh)
    if chunk is None or chunk >= s:
        causal = jnp.tril(jnp.ones((s, s), dtype=jnp.bool_))
        return _attend(q, k, v, causal).reshape(b, s, h, dh)
    if s % chunk:
        raise ValueError(f"attention chunk {chunk} does not divide seq {s}; pick a divisor")
    blocks = q.reshape(b, s // chunk, chunk, kv, h // kv, dh).swapaxes(0, 1)
    starts = jnp.arange(s // chunk) * chunk

    def block(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        rows = args[1] + jnp.arange(chunk)[:, None]
        return _attend(args[0], k, v, rows >= jnp.arange(s)[None, :])

    out = lax.map(jax.checkpoint(block), (blocks, starts))
    return out.swapaxes(0, 1).reshape(b, s, h, dh)


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, causal: jax.Array) -> jax.Array:
    """Queries `[B, C, KV, G, Dh]` against every key, where `causal` `[C, S]` allows."""
    dh = q.shape[-1]
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / jnp.sqrt(jnp.float32(dh))
    scores = activation(scores, _activations.SCORES)
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bkgqs,bskd->bqkgd", weights, v)


# What a rematerialised block keeps for the backward pass (`run_layers`):
#   "full": only its input, everything else recomputed (MaxText's
#       remat_policy=full);
#   "selective": also the outputs of matmuls without batch dims (the
#       projections and MLP), recomputing the attention products and the
#       elementwise ops (Megatron-LM's selective activation recompute).
REMAT_POLICIES = {"full": None,
                  "selective": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def run_layers(block: Callable[[jax.Array, Any], tuple[jax.Array, jax.Array]], x: jax.Array,
               layers: Any, *, stacked: bool, remat: bool | str) -> tuple[jax.Array, jax.Array]:
    """Applies `block` once per layer, unrolled or under `lax.scan`.

    Args:
        block: `block(x, layer_params) -> (x, aux)` with `aux` a float32 scalar
            (an auxiliary loss; 0 for dense blocks).
        x: activations.
        layers: a list of per-layer dicts (unrolled) or one dict with a
            leading layer dim (stacked).
        stacked: which of the two layouts `layers` has.
        remat: recompute each block in the backward pass instead of saving
            its activations (the big presets, where saved activations of
            every layer would dominate the memory a plan is judged on): True
            or "full", "selective" (`REMAT_POLICIES`), or False.

    Returns:
        `(x, aux summed over layers)`.
    """
    if remat is True:
        remat = "full"
    fn = jax.checkpoint(block, policy=REMAT_POLICIES[remat]) if remat else block
    if stacked:
        x, aux = lax.scan(fn, x, layers)
        return x, jnp.sum(aux)
    total = jnp.zeros((), jnp.float32)
    for layer in layers:
        x, aux = fn(x, layer)
        total = total + aux
    return x, total
