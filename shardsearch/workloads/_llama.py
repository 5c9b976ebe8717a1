"""Llama style decoder-only transformer workload.

Token embedding (no position table), pre-RMSNorm blocks of causal
grouped-query attention with rotary embeddings and a SwiGLU MLP, no biases, a
final RMSNorm and an untied output head.

Parameter paths (unrolled; stacked drops the layer index and adds a leading
`[n_layers]` dim):

    params/embed/tokens        [vocab, d_model]
    params/layers/3/ln1/scale  [d_model]                       (and ln2/scale)
    params/layers/3/attn/wq    [d_model, n_heads * head_dim]
    params/layers/3/attn/wk    [d_model, n_kv_heads * head_dim] (and wv)
    params/layers/3/attn/wo    [n_heads * head_dim, d_model]
    params/layers/3/mlp/w_gate [d_model, d_ff]                  (and w_up)
    params/layers/3/mlp/w_down [d_ff, d_model]
    params/ln_f/scale          [d_model]
    params/head                [d_model, vocab]
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..base.activations import activation
from . import _activations, _layers, _precision, _train, _workload
from ._params import Param


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Sizes and training settings of a Llama workload.

    Args:
        batch: global batch (sequences per step).
        seq: tokens per sequence.
        vocab: vocabulary size.
        d_model: model width; divisible by `n_heads` (unless `explicit_head_dim`).
        n_layers: number of blocks.
        n_heads: query heads; divisible by `n_kv_heads`.
        n_kv_heads: key/value heads (grouped-query attention).
        d_ff: SwiGLU hidden width.
        rope_theta: rotary base.
        stacked: stack the layers under `lax.scan`.
        remat: recompute blocks in the backward pass (True or "full"; "selective"
            keeps the projections' outputs, `_layers.REMAT_POLICIES`).
        learning_rate: Adam step size.
        abstract_only: refuse `init()` (real-size presets).
        explicit_head_dim: width of one head when it is not `d_model //
            n_heads` (MaxText uses 128 whatever the width: d_model 4096 with
            64 heads gives queries 8192 wide); None: `d_model // n_heads`.
        compute_dtype: "float32" (the default) or "bfloat16": the parameters
            stay float32 (as do the Adam moments and the update) and are cast
            to this dtype inside the step, as mixed-precision training does.
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
    n_kv_heads: int
    d_ff: int
    rope_theta: float = 10000.0
    stacked: bool = False
    remat: bool | str = False
    learning_rate: float = 1e-3
    abstract_only: bool = False
    explicit_head_dim: int | None = None
    compute_dtype: str = "float32"
    activation_sharding: _activations.ActivationSharding | None = None
    attention_chunk: int | None = None
    loss_chunk: int | None = None

    def __post_init__(self):
        owner = type(self).__name__
        _workload.check_positive(
            owner, batch=self.batch, seq=self.seq, vocab=self.vocab, d_model=self.d_model,
            n_layers=self.n_layers, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
            d_ff=self.d_ff)
        if self.explicit_head_dim is None:
            _workload.check_divides(owner, "d_model", self.d_model, "n_heads", self.n_heads)
        else:
            _workload.check_positive(owner, explicit_head_dim=self.explicit_head_dim)
        _precision.check_compute_dtype(owner, self.compute_dtype)
        _workload.check_divides(owner, "n_heads", self.n_heads, "n_kv_heads", self.n_kv_heads)
        # Rotary embeddings rotate pairs of the head dim.
        _workload.check_divides(owner, "head_dim", self.head_dim, "2", 2)

    @property
    def head_dim(self) -> int:
        if self.explicit_head_dim is not None:
            return self.explicit_head_dim
        return self.d_model // self.n_heads


def attention_spec(cfg: LlamaConfig) -> dict:
    """`Param`s of one grouped-query attention (also used by the moe block)."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {"wq": Param((d, q)), "wk": Param((d, kv)), "wv": Param((d, kv)),
            "wo": Param((q, d))}


def attention_params(cfg: LlamaConfig) -> int:
    """Parameters of one attention, see `attention_spec`."""
    return 2 * cfg.d_model * cfg.head_dim * (cfg.n_heads + cfg.n_kv_heads)


def attention(cfg: LlamaConfig, x: jax.Array, p: dict) -> jax.Array:
    """Rotary grouped-query causal self-attention of `x: [B, S, d_model]`."""
    b, s, _ = x.shape
    h, kv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q = activation(_layers.rotary((x @ p["wq"]).reshape(b, s, h, dh), cfg.rope_theta),
                   _activations.HEADS)
    k = activation(_layers.rotary((x @ p["wk"]).reshape(b, s, kv, dh), cfg.rope_theta),
                   _activations.KV)
    if x.dtype != jnp.float32:
        # The rotary tables are float32 and would promote q and k back to it.
        q, k = q.astype(x.dtype), k.astype(x.dtype)
    v = activation((x @ p["wv"]).reshape(b, s, kv, dh), _activations.KV)
    out = _layers.causal_attention(q, k, v, cfg.attention_chunk)
    if x.dtype != jnp.float32:
        # The softmax runs in float32; its output goes back to the compute dtype.
        out = out.astype(x.dtype)
    return out.reshape(b, s, h * dh) @ p["wo"]


def attention_flops(cfg: LlamaConfig, tokens: int) -> float:
    """Forward+backward flops of the `QK^T` and `AV` products of one layer.

    `12 * tokens * seq * n_heads * head_dim`: two products of 2 flops per
    multiply-add over the full `seq x seq` score matrix, times 3 for the
    backward pass. KV heads are shared, so the query heads set the cost.
    """
    return 12.0 * tokens * cfg.seq * cfg.n_heads * cfg.head_dim


def param_spec(cfg: LlamaConfig) -> dict:
    """The parameter tree as `Param`s, layers unrolled."""
    d, f = cfg.d_model, cfg.d_ff
    layer = {
        "ln1": {"scale": Param((d,), "ones")},
        "attn": attention_spec(cfg),
        "ln2": {"scale": Param((d,), "ones")},
        "mlp": {"w_gate": Param((d, f)), "w_up": Param((d, f)), "w_down": Param((f, d))},
    }
    return model_spec(cfg, layer)


def model_spec(cfg: LlamaConfig, layer: dict) -> dict:
    """The whole parameter tree around one block's `Param`s (unrolled layers,
    RMSNorm before the untied head); shared with the MoE variant."""
    d = cfg.d_model
    return {
        "embed": {"tokens": Param((cfg.vocab, d))},
        "layers": [layer] * cfg.n_layers,
        "ln_f": {"scale": Param((d,), "ones")},
        "head": Param((d, cfg.vocab)),
    }


def n_params(cfg: LlamaConfig) -> int:
    """Analytic parameter count.

    `2*vocab*d` (embedding and head) `+ n_layers * (2*d*head_dim*(n_heads +
    n_kv_heads)` (attention) `+ 3*d*d_ff` (SwiGLU) `+ 2*d)` (norms) `+ d`.
    Llama-2 7B sizes give 6,738,415,616.
    """
    d = cfg.d_model
    per_layer = attention_params(cfg) + 3 * d * cfg.d_ff + 2 * d
    return 2 * cfg.vocab * d + cfg.n_layers * per_layer + d


def flops_per_step(cfg: LlamaConfig) -> float:
    """Analytic forward+backward flops of one step.

    `6 * tokens * N_matmul + n_layers * attention_flops`, with `tokens =
    batch * seq` and `N_matmul = n_layers * (attention weights + 3*d*d_ff) +
    d*vocab` (the embedding is a lookup, norms are negligible).
    """
    tokens = cfg.batch * cfg.seq
    n_matmul = cfg.n_layers * (attention_params(cfg) + 3 * cfg.d_model * cfg.d_ff)
    n_matmul += cfg.d_model * cfg.vocab
    return float(6 * tokens * n_matmul + cfg.n_layers * attention_flops(cfg, tokens))


def _block(cfg: LlamaConfig, x: jax.Array, p: dict) -> tuple[jax.Array, jax.Array]:
    x = activation(x, _activations.RESIDUAL)
    x = x + attention(cfg, _layers.rms_norm(x, p["ln1"]), p["attn"])
    m = p["mlp"]
    y = _layers.rms_norm(x, p["ln2"])
    y = activation(jax.nn.silu(y @ m["w_gate"]) * (y @ m["w_up"]), _activations.HIDDEN)
    y = y @ m["w_down"]
    return x + y, jnp.zeros((), jnp.float32)


def hidden(cfg: LlamaConfig, params: dict, tokens: jax.Array,
           block=_block) -> tuple[jax.Array, jax.Array]:
    """The final normed hidden states `[B, S, d_model]` (the head's input)
    and the blocks' summed auxiliary loss.

    `block(cfg, x, layer) -> (x, aux)` is swappable: the moe workload passes
    its own block and reuses everything else.
    """
    with _activations.placed(cfg.activation_sharding):
        x = activation(jnp.take(params["embed"]["tokens"], tokens, axis=0),
                       _activations.RESIDUAL)
        x, aux = _layers.run_layers(lambda h, p: block(cfg, h, p), x, params["layers"],
                                    stacked=cfg.stacked, remat=cfg.remat)
        return _layers.rms_norm(x, params["ln_f"]), aux


def logits(cfg: LlamaConfig, params: dict, tokens: jax.Array,
           block=_block) -> tuple[jax.Array, jax.Array]:
    """Next-token logits `[B, S, vocab]` and the blocks' summed auxiliary loss."""
    x, aux = hidden(cfg, params, tokens, block)
    return x @ params["head"], aux


def loss_fn(cfg: LlamaConfig, params: dict, batch: dict) -> tuple[jax.Array, dict]:
    """Next-token cross-entropy of `batch = {"tokens", "targets"}`."""
    params = _precision.cast_params(params, cfg.compute_dtype)
    x, _ = hidden(cfg, params, batch["tokens"])
    return _train.token_cross_entropy(x, params["head"], batch["targets"],
                                      cfg.loss_chunk), {}


def dims(cfg: LlamaConfig) -> dict:
    """Named sizes for the expert plans' divisibility checks."""
    return {"batch": cfg.batch, "seq": cfg.seq, "vocab": cfg.vocab, "d_model": cfg.d_model,
            "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
            "head_dim": cfg.head_dim, "d_ff": cfg.d_ff}


def build(name: str, cfg: LlamaConfig) -> _workload.Workload:
    """The `Workload` for one Llama configuration."""
    return _workload.token_workload(name, cfg, param_spec(cfg), loss_fn, n_params(cfg),
                                    flops_per_step(cfg), dims(cfg))
