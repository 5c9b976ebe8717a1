"""A Flax NNX decoder (GQA attention, RMSNorm, SwiGLU) trained with optax AdamW.

The parameters carry logical names (`nnx.with_partitioning`); the search adopts
them and finds a sharding on 8 simulated devices. The plan is exported twice: as
Flax `logical_axis_rules`, which Flax's own `nn.logical_to_mesh` resolves, on
the model's annotations, to the measured spec of every leaf, and as a plan
file, which `shardsearch.flax.apply_plan` places the model by for one training
step.

    python examples/nnx_decoder.py [WORKDIR]
"""

from __future__ import annotations

import json
import time

import _common
import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding

import shardsearch as ss
from shardsearch import flax as ssf

# Parameters are created unsharded; the plan places them afterwards.
flax.config.update("flax_always_shard_variable", False)

VOCAB, D, HEADS, KV_HEADS, HEAD_DIM, MLP, LAYERS = 64, 32, 4, 2, 8, 64, 2
BATCH, SEQ = 8, 16


def dense(n_in, n_out, names, rngs):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), names)
    return nnx.Linear(n_in, n_out, use_bias=False, kernel_init=init, rngs=rngs)


class RMSNorm(nnx.Module):
    def __init__(self, dim):
        self.scale = nnx.Param(jnp.ones((dim,)), out_sharding=("embed",))

    def __call__(self, x):
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        return x * self.scale[...]


class Attention(nnx.Module):
    def __init__(self, rngs):
        self.wq = dense(D, HEADS * HEAD_DIM, ("embed", "heads"), rngs)
        # Grouped KV heads: the dataflow ties them to the query heads, so they
        # carry the same logical name.
        self.wk = dense(D, KV_HEADS * HEAD_DIM, ("embed", "heads"), rngs)
        self.wv = dense(D, KV_HEADS * HEAD_DIM, ("embed", "heads"), rngs)
        self.wo = dense(HEADS * HEAD_DIM, D, ("heads", "embed"), rngs)

    def __call__(self, x):
        b, t, _ = x.shape
        q = self.wq(x).reshape(b, t, HEADS, HEAD_DIM)
        k = jnp.repeat(self.wk(x).reshape(b, t, KV_HEADS, HEAD_DIM), HEADS // KV_HEADS, 2)
        v = jnp.repeat(self.wv(x).reshape(b, t, KV_HEADS, HEAD_DIM), HEADS // KV_HEADS, 2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / HEAD_DIM**0.5
        mask = jnp.tril(jnp.ones((t, t), bool))
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        return self.wo(jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, -1))


class SwiGLU(nnx.Module):
    def __init__(self, rngs):
        self.gate = dense(D, MLP, ("embed", "mlp"), rngs)
        self.up = dense(D, MLP, ("embed", "mlp"), rngs)
        self.down = dense(MLP, D, ("mlp", "embed"), rngs)

    def __call__(self, x):
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    def __init__(self, rngs):
        self.norm1, self.attn = RMSNorm(D), Attention(rngs)
        self.norm2, self.mlp = RMSNorm(D), SwiGLU(rngs)

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Decoder(nnx.Module):
    def __init__(self, rngs):
        init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("vocab", "embed"))
        self.embed = nnx.Embed(VOCAB, D, embedding_init=init, rngs=rngs)
        self.blocks = nnx.List([Block(rngs) for _ in range(LAYERS)])
        self.norm = RMSNorm(D)
        self.head = dense(D, VOCAB, ("embed", "vocab"), rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss_fn(model, tokens, targets):
    logits = model(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def main() -> dict:
    started = time.perf_counter()
    where = _common.workdir()
    model = Decoder(nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ), 0, VOCAB)
    targets = jnp.roll(tokens, -1, axis=1)
    step, args = ssf.train_step(model, optax.adamw(1e-3), loss_fn, tokens, targets)

    # The user's names won: the discovered axes are called what the model says.
    axes = ss.discover_logical_axes(step, args)
    names = {a.name for a in axes.axes}
    assert {"embed", "heads", "mlp", "vocab"} <= names, names

    result = _common.search(step, args, where, "nnx-decoder")
    line = _common.check_against_baselines(result)

    # The plan file back, and Flax rules that Flax itself resolves to the
    # measured specs, on the model's own annotations.
    specs, data, measured, source = _common.export_plans(result, args, where)
    rules = _common.rules(data)
    mesh = _common.mesh()
    logical = nnx.get_partition_spec(args[0])  # the Params' and Adam moments' names
    compared = _common.same_specs(measured, _common.flax_specs(logical, data))

    # One training step with the winner's plan, the model placed by it.
    ssf.apply_plan(model, specs[0]["params"], mesh)
    step_s, args_s = ssf.train_step(model, optax.adamw(1e-3), loss_fn, tokens, targets)
    state = ssf.place(args_s[0], specs[0], mesh)
    batch = [ssf.place(b, s, mesh) for b, s in zip(args_s[1:], specs[1:], strict=True)]
    _, metrics = jax.jit(step_s)(state, *batch)
    placed = [p.sharding.spec for p in jax.tree.leaves(nnx.state(model, nnx.Param))]
    _common.same_specs(jax.tree.leaves(specs[0]["params"], is_leaf=_common.is_spec), placed)
    assert isinstance(model.blocks[0].attn.wq.kernel[...].sharding, NamedSharding)
    seconds = time.perf_counter() - started
    summary = {"example": "nnx_decoder", "winner": result.best_label, "check": line,
               "baselines": _common.baseline_times(result),
               "leaves_compared": compared, "flax_rules_from": source, "rules": rules,
               "loss": float(metrics["loss"]),
               "axes": sorted(names), "seconds": round(seconds, 1)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
