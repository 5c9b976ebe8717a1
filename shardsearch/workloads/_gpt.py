"""GPT-2 style decoder-only transformer workload.

Learned token and position embeddings, pre-LayerNorm blocks of causal
multi-head attention and a GELU MLP, a final LayerNorm and an untied output
head, trained with next-token cross-entropy and Adam. The linear layers have
no biases (nanoGPT's `bias=False`, as most current GPTs): on CPU every extra
parameter leaf costs compiled kernels in the backward pass and in Adam, and
biases change nothing about how a plan shards the model.

Parameter paths (unrolled; stacked drops the layer index and adds a leading
`[n_layers]` dim):

    params/embed/tokens        [vocab, d_model]
    params/embed/positions     [seq, d_model]
    params/layers/3/ln1/scale  [d_model]          (and ln1/bias, ln2/...)
    params/layers/3/attn/wq    [d_model, d_model] (and wk, wv)
    params/layers/3/attn/wo    [d_model, d_model]
    params/layers/3/mlp/w_up   [d_model, d_ff]
    params/layers/3/mlp/w_down [d_ff, d_model]
    params/ln_f/scale          [d_model]          (and ln_f/bias)
    params/head                [d_model, vocab]
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from ..base.activations import activation
from . import _activations, _layers, _precision, _train, _workload
from ._params import Param


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Sizes and training settings of a GPT workload.

    Args:
        batch: global batch (sequences per step).
        seq: tokens per sequence.
        vocab: vocabulary size.
        d_model: model width; divisible by `n_heads`.
        n_layers: number of blocks.
        n_heads: attention heads.
        d_ff: MLP hidden width.
        stacked: stack the layers under `lax.scan`.
        remat: recompute blocks in the backward pass (True or "full"; "selective"
            keeps the projections' outputs, `_layers.REMAT_POLICIES`).
        learning_rate: Adam step size.
        abstract_only: refuse `init()` (real-size presets).
        compute_dtype: "float32" (the default) or "bfloat16": parameters
            stay float32 and are cast inside the step (mixed precision, as
            Megatron-LM trains).
        attention_chunk: queries per block of memory-bounded attention
            (`_layers.causal_attention`'s `chunk`); None: the whole score
            matrix at once.
        loss_chunk: positions per block of the loss
            (`_train.token_cross_entropy`'s `chunk`); None: all the logits
            at once.
        activation_sharding: pins the activations' batch dim to mesh axes
            (`_activations.ActivationSharding`); None: XLA decides.
    """

    batch: int
    seq: int
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    stacked: bool = False
    remat: bool | str = False
    learning_rate: float = 1e-3
    abstract_only: bool = False
    compute_dtype: str = "float32"
    activation_sharding: _activations.ActivationSharding | None = None
    attention_chunk: int | None = None
    loss_chunk: int | None = None

    def __post_init__(self):
        _workload.check_positive(
            "GPTConfig", batch=self.batch, seq=self.seq, vocab=self.vocab,
            d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff)
        _precision.check_compute_dtype("GPTConfig", self.compute_dtype)
        _workload.check_divides("GPTConfig", "d_model", self.d_model, "n_heads", self.n_heads)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def param_spec(cfg: GPTConfig) -> dict:
    """The parameter tree as `Param`s, layers unrolled."""
    d, f = cfg.d_model, cfg.d_ff
    # GPT-2 scales the projections that write into the residual stream by
    # 1/sqrt(2 * n_layers) so the residual variance does not grow with depth.
    out_std = 0.02 / math.sqrt(2 * cfg.n_layers)

    def norm():
        return {"scale": Param((d,), "ones"), "bias": Param((d,), "zeros")}

    layer = {
        "ln1": norm(),
        "attn": {"wq": Param((d, d)), "wk": Param((d, d)), "wv": Param((d, d)),
                 "wo": Param((d, d), std=out_std)},
        "ln2": norm(),
        "mlp": {"w_up": Param((d, f)), "w_down": Param((f, d), std=out_std)},
    }
    return {
        "embed": {"tokens": Param((cfg.vocab, d)), "positions": Param((cfg.seq, d), std=0.01)},
        "layers": [layer] * cfg.n_layers,
        "ln_f": norm(),
        "head": Param((d, cfg.vocab)),
    }


def n_params(cfg: GPTConfig) -> int:
    """Analytic parameter count.

    `vocab*d + seq*d` (embeddings) `+ n_layers * (4*d*d` (attention) `+
    2*d*d_ff` (MLP) `+ 4*d)` (two LayerNorms) `+ 2*d` (final LayerNorm)
    `+ d*vocab` (head).
    """
    d, f = cfg.d_model, cfg.d_ff
    per_layer = 4 * d * d + 2 * d * f + 4 * d
    return cfg.vocab * d + cfg.seq * d + cfg.n_layers * per_layer + 2 * d + d * cfg.vocab


def flops_per_step(cfg: GPTConfig) -> float:
    """Analytic forward+backward flops of one step.

    `6 * tokens * N_matmul + 12 * n_layers * tokens * seq * d_model`, where
    `tokens = batch * seq` and `N_matmul = n_layers * (4*d*d + 2*d*d_ff) +
    d*vocab` counts the weights used in matrix products (embeddings are
    lookups; norms are negligible). The second term is the two
    attention products `QK^T` and `AV` over the full (unmasked) `seq x seq`
    score matrix, 2 flops per multiply-add, times 3 for the backward pass.
    """
    d, f = cfg.d_model, cfg.d_ff
    tokens = cfg.batch * cfg.seq
    n_matmul = cfg.n_layers * (4 * d * d + 2 * d * f) + d * cfg.vocab
    return float(6 * tokens * n_matmul + 12 * cfg.n_layers * tokens * cfg.seq * d)


def _block(cfg: GPTConfig, x: jax.Array, p: dict) -> tuple[jax.Array, jax.Array]:
    x = activation(x, _activations.RESIDUAL)
    b, s, _ = x.shape
    h, dh = cfg.n_heads, cfg.head_dim
    a = p["attn"]
    y = _layers.layer_norm(x, p["ln1"])
    q = activation((y @ a["wq"]).reshape(b, s, h, dh), _activations.HEADS)
    k = activation((y @ a["wk"]).reshape(b, s, h, dh), _activations.KV)
    v = activation((y @ a["wv"]).reshape(b, s, h, dh), _activations.KV)
    out = _layers.causal_attention(q, k, v, cfg.attention_chunk)
    if x.dtype != jnp.float32:
        # The softmax runs in float32; its output goes back to the compute dtype.
        out = out.astype(x.dtype)
    x = x + out.reshape(b, s, h * dh) @ a["wo"]
    y = _layers.layer_norm(x, p["ln2"])
    y = activation(jax.nn.gelu(y @ p["mlp"]["w_up"]), _activations.HIDDEN)
    y = y @ p["mlp"]["w_down"]
    return x + y, jnp.zeros((), jnp.float32)


def loss_fn(cfg: GPTConfig, params: dict, batch: dict) -> tuple[jax.Array, dict]:
    """Next-token cross-entropy of `batch = {"tokens", "targets"}`."""
    with _activations.placed(cfg.activation_sharding):
        return _loss(cfg, params, batch)


def _loss(cfg: GPTConfig, params: dict, batch: dict) -> tuple[jax.Array, dict]:
    params = _precision.cast_params(params, cfg.compute_dtype)
    tokens = batch["tokens"]
    x = jnp.take(params["embed"]["tokens"], tokens, axis=0)
    x = x + params["embed"]["positions"][None, : tokens.shape[1]]
    x = activation(x, _activations.RESIDUAL)
    x, _ = _layers.run_layers(lambda h, p: _block(cfg, h, p), x, params["layers"],
                              stacked=cfg.stacked, remat=cfg.remat)
    x = _layers.layer_norm(x, params["ln_f"])
    return _train.token_cross_entropy(x, params["head"], batch["targets"],
                                      cfg.loss_chunk), {}


def build(name: str, cfg: GPTConfig) -> _workload.Workload:
    """The `Workload` for one GPT configuration."""
    return _workload.token_workload(
        name, cfg, param_spec(cfg), loss_fn, n_params(cfg), flops_per_step(cfg),
        {"batch": cfg.batch, "seq": cfg.seq, "vocab": cfg.vocab, "d_model": cfg.d_model,
         "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_heads,
         "head_dim": cfg.head_dim, "d_ff": cfg.d_ff})
