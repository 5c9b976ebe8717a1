"""Mixture-of-experts workload: the Llama block with a top-2 routed SwiGLU MLP.

Routing is GShard style and fully dense, so every step is an einsum the
partitioner can shard: each sequence is its own routing group; a softmax
router picks each token's top-2 experts; tokens take slots in their expert's
buffer of `capacity` slots in sequence order (second choices after all first
choices) and tokens past capacity are dropped for that expert; one-hot
`dispatch` / weighted `combine` tensors `[B, S, experts, capacity]` move
tokens to `[experts, B, capacity, d_model]` and back. A Switch-style
load-balancing loss is added to the cross-entropy.

Parameter paths are the Llama ones with `mlp/...` replaced by

    params/layers/3/moe/router  [d_model, experts]
    params/layers/3/moe/w_gate  [experts, d_model, d_ff]  (and w_up)
    params/layers/3/moe/w_down  [experts, d_ff, d_model]

The expert dim leads, which is the dim an expert mesh axis shards.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from ..base.activations import activation
from . import _activations, _layers, _llama, _train, _workload
from ._params import Param

TOP_K = 2


@dataclasses.dataclass(frozen=True)
class MoEConfig(_llama.LlamaConfig):
    """A `LlamaConfig` plus the mixture-of-experts settings.

    Args:
        n_experts: experts per layer (at least 2, for top-2 routing).
        capacity_factor: each expert's buffer holds
            `ceil(capacity_factor * 2 * seq / n_experts)` tokens per sequence.
        aux_loss_weight: weight of the load-balancing loss.
    """

    n_experts: int = 4
    capacity_factor: float = 1.25
    aux_loss_weight: float = 0.01

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.n_experts, bool) or not isinstance(self.n_experts, int) or (
                self.n_experts < TOP_K):
            raise ValueError(f"MoEConfig: n_experts must be an int >= {TOP_K} for top-{TOP_K} "
                             f"routing, got {self.n_experts=}")
        if not self.capacity_factor > 0:
            raise ValueError(f"MoEConfig: capacity_factor must be > 0, got "
                             f"{self.capacity_factor=}")
        if not self.aux_loss_weight >= 0:
            raise ValueError(f"MoEConfig: aux_loss_weight must be >= 0, got "
                             f"{self.aux_loss_weight=}")

    @property
    def capacity(self) -> int:
        return max(1, math.ceil(self.capacity_factor * TOP_K * self.seq / self.n_experts))


def param_spec(cfg: MoEConfig) -> dict:
    """The parameter tree as `Param`s, layers unrolled."""
    d, f, e = cfg.d_model, cfg.d_ff, cfg.n_experts
    layer = {
        "ln1": {"scale": Param((d,), "ones")},
        "attn": _llama.attention_spec(cfg),
        "ln2": {"scale": Param((d,), "ones")},
        "moe": {"router": Param((d, e)), "w_gate": Param((e, d, f)),
                "w_up": Param((e, d, f)), "w_down": Param((e, f, d))},
    }
    return _llama.model_spec(cfg, layer)


def n_params(cfg: MoEConfig) -> int:
    """Analytic parameter count: Llama's with the MLP replaced by
    `d*experts` (router) `+ 3*experts*d*d_ff` (experts)."""
    d, e = cfg.d_model, cfg.n_experts
    per_layer = _llama.attention_params(cfg) + d * e + 3 * e * d * cfg.d_ff + 2 * d
    return 2 * cfg.vocab * d + cfg.n_layers * per_layer + d


def flops_per_step(cfg: MoEConfig) -> float:
    """Analytic forward+backward flops of one step, counting active parameters.

    `6 * tokens * N_active + n_layers * attention_flops`, where `N_active =
    n_layers * (attention weights + d*experts + 2 * 3*d*d_ff) + d*vocab`:
    each token uses its top-2 experts. The dispatch/combine einsums and the
    padding of expert buffers to `capacity` are overhead and not counted, as
    in the usual model-flops convention.
    """
    tokens = cfg.batch * cfg.seq
    d = cfg.d_model
    n_active = cfg.n_layers * (_llama.attention_params(cfg) + d * cfg.n_experts
                               + TOP_K * 3 * d * cfg.d_ff) + d * cfg.vocab
    return float(6 * tokens * n_active + cfg.n_layers * _llama.attention_flops(cfg, tokens))


def moe_mlp(cfg: MoEConfig, x: jax.Array, p: dict) -> tuple[jax.Array, jax.Array]:
    """Top-2 routed SwiGLU experts of `x: [B, S, d]`; returns `(y, aux_loss)`."""
    e, c = cfg.n_experts, cfg.capacity
    probs = jax.nn.softmax(jnp.einsum("bsd,de->bse", x, p["router"]), axis=-1)
    # Successive argmax instead of top_k keeps every choice a one-hot [B,S,E]
    # mask, which shards like `probs`.
    first = jax.nn.one_hot(jnp.argmax(probs, -1), e, dtype=jnp.int32)
    masked = jnp.where(first > 0, -jnp.inf, probs)
    second = jax.nn.one_hot(jnp.argmax(masked, -1), e, dtype=jnp.int32)
    gate1 = jnp.sum(probs * first, -1)
    gate2 = jnp.sum(probs * second, -1)
    norm = gate1 + gate2
    gate1, gate2 = gate1 / norm, gate2 / norm

    # Slot of each token in its expert's buffer. Second choices queue behind
    # every first choice so a capacity overflow drops second choices first.
    slot1 = jnp.cumsum(first, axis=1) - first
    slot2 = jnp.cumsum(second, axis=1) - second + jnp.sum(first, axis=1, keepdims=True)
    # one_hot of a slot >= capacity is all zeros: that is the drop.
    disp1 = first[..., None] * jax.nn.one_hot(slot1, c, dtype=jnp.int32)
    disp2 = second[..., None] * jax.nn.one_hot(slot2, c, dtype=jnp.int32)
    dispatch = (disp1 + disp2).astype(x.dtype)
    combine = gate1[..., None, None] * disp1 + gate2[..., None, None] * disp2

    xe = jnp.einsum("bsd,bsec->ebcd", x, dispatch)
    h = jax.nn.silu(jnp.einsum("ebcd,edf->ebcf", xe, p["w_gate"]))
    h = h * jnp.einsum("ebcd,edf->ebcf", xe, p["w_up"])
    ye = jnp.einsum("ebcf,efd->ebcd", h, p["w_down"])
    y = jnp.einsum("ebcd,bsec->bsd", ye, combine)

    # Switch-Transformer balance loss: experts * sum_e(share of first choices
    # * mean router probability), 1.0 when routing is uniform.
    share = jnp.mean(first.astype(jnp.float32), axis=1)
    mean_prob = jnp.mean(probs, axis=1)
    aux = e * jnp.mean(jnp.sum(share * mean_prob, axis=-1))
    return y, cfg.aux_loss_weight * aux


def _block(cfg: MoEConfig, x: jax.Array, p: dict) -> tuple[jax.Array, jax.Array]:
    x = activation(x, _activations.RESIDUAL)
    x = x + _llama.attention(cfg, _layers.rms_norm(x, p["ln1"]), p["attn"])
    y, aux = moe_mlp(cfg, _layers.rms_norm(x, p["ln2"]), p["moe"])
    return x + y, aux


def loss_fn(cfg: MoEConfig, params: dict, batch: dict) -> tuple[jax.Array, dict]:
    """Cross-entropy plus the weighted balance loss; both also reported."""
    out, aux = _llama.logits(cfg, params, batch["tokens"], block=_block)
    ce = _train.cross_entropy(out, batch["targets"])
    return ce + aux, {"cross_entropy": ce, "aux_loss": aux}


def build(name: str, cfg: MoEConfig) -> _workload.Workload:
    """The `Workload` for one MoE configuration."""
    return _workload.token_workload(
        name, cfg, param_spec(cfg), loss_fn, n_params(cfg), flops_per_step(cfg),
        {**_llama.dims(cfg), "n_experts": cfg.n_experts, "capacity": cfg.capacity})
