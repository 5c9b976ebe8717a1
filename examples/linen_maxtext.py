"""A Flax Linen decoder with MaxText-style logical annotations, trained with optax.

Its parameters carry MaxText's logical names (`nn.with_logical_partitioning`:
embed, heads, kv, mlp, vocab); the step takes Linen's boxed variables as they
come from `init`, so the names reach the search, which adopts them. The plan
comes back as a flax-rules file, and the state and batch are sharded with
Flax's own `nn.logical_to_mesh_sharding` and those rules, as a MaxText
training loop would, for one step.

    python examples/linen_maxtext.py [WORKDIR]
"""

from __future__ import annotations

import json
import time

import _common
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

import shardsearch as ss

VOCAB, D, HEADS, HEAD_DIM, MLP, LAYERS = 64, 32, 4, 8, 64, 2
BATCH, SEQ = 8, 16


def init(names, scale=None):
    base = nn.initializers.normal(scale) if scale else nn.initializers.lecun_normal()
    return nn.with_logical_partitioning(base, names)


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones,
                                                                 ("embed",)), (D,))
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


class Attention(nn.Module):
    @nn.compact
    def __call__(self, x):
        def proj(name):
            return nn.DenseGeneral((HEADS, HEAD_DIM), use_bias=False, name=name,
                                   kernel_init=init(("embed", "heads", "kv")))(x)

        q, k, v = proj("query"), proj("key"), proj("value")
        t = x.shape[1]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / HEAD_DIM**0.5
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return nn.DenseGeneral(D, axis=(-2, -1), use_bias=False, name="out",
                               kernel_init=init(("heads", "kv", "embed")))(out)


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(MLP, use_bias=False, kernel_init=init(("embed", "mlp")), name="wi")(x)
        return nn.Dense(D, use_bias=False, kernel_init=init(("mlp", "embed")),
                        name="wo")(nn.gelu(h))


class Decoder(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, D, embedding_init=init(("vocab", "embed"), 0.02),
                     name="token_embedder")(tokens)
        for i in range(LAYERS):
            x = x + Attention(name=f"layers_{i}_attention")(RMSNorm(name=f"layers_{i}_pre")(x))
            x = x + Mlp(name=f"layers_{i}_mlp")(RMSNorm(name=f"layers_{i}_post")(x))
        x = RMSNorm(name="decoder_norm")(x)
        return nn.Dense(VOCAB, use_bias=False, kernel_init=init(("embed", "vocab")),
                        name="logits_dense")(x)


MODEL = Decoder()
OPTIMIZER = optax.adamw(1e-3)


def loss_fn(params, tokens, targets):
    logits = MODEL.apply({"params": params}, tokens)  # Linen unboxes the params
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def train_step(state, tokens, targets):
    """A MaxText-like step on `(params, opt_state)`, the params boxed by Linen."""
    params, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), {"loss": loss}


def main() -> dict:
    started = time.perf_counter()
    where = _common.workdir()
    tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ), 0, VOCAB)
    targets = jnp.roll(tokens, -1, axis=1)
    params = MODEL.init(jax.random.key(0), tokens)["params"]  # LogicallyPartitioned boxes
    args = ((params, OPTIMIZER.init(params)), tokens, targets)  # Adam's moments keep the boxes

    # MaxText's names won: the discovered axes are called what the model says.
    axes = ss.discover_logical_axes(train_step, args)
    names = {a.name for a in axes.axes}
    assert {"embed", "heads", "kv", "mlp", "vocab"} <= names, names
    assert not axes.conflicts, axes.conflicts

    result = _common.search(train_step, args, where, "linen-maxtext")
    line = _common.check_against_baselines(result)

    # The flax-rules file, loaded as a MaxText user would: the state's boxes and
    # the batch's logical names, through Flax's own resolution.
    _, data, measured, source = _common.export_plans(result, args, where)  # plan file checked too
    rules = _common.rules(data)
    mesh = _common.mesh()
    state_shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(args[0]), mesh, rules)
    batch_names = [argument[0][2] for argument in data["batch"]]  # one leaf per batch argument
    batch_shardings = [nn.logical_to_mesh_sharding(P(*n), mesh, rules) for n in batch_names]
    flax_specs = (jax.tree.map(lambda s: s.spec, state_shardings),
                  *[s.spec for s in batch_shardings])
    assert flax_specs == _common.flax_specs(nn.get_partition_spec(args[0]), data)
    compared = _common.same_specs(measured, flax_specs)

    # One step with Flax's shardings, the state staying where Flax put it.
    state = jax.device_put(args[0], state_shardings)
    batch = [jax.device_put(b, s) for b, s in zip(args[1:], batch_shardings, strict=True)]
    (new_params, _), metrics = jax.jit(train_step, donate_argnums=0)(state, *batch)
    kernel = new_params["layers_0_mlp"]["wi"]["kernel"].value
    want = state_shardings[0]["layers_0_mlp"]["wi"]["kernel"]
    assert kernel.sharding.is_equivalent_to(want, kernel.ndim), (kernel.sharding, want)
    seconds = time.perf_counter() - started
    summary = {"example": "linen_maxtext", "winner": result.best_label, "check": line,
               "baselines": _common.baseline_times(result),
               "leaves_compared": compared, "flax_rules_from": source, "rules": rules,
               "loss": float(metrics["loss"]),
               "axes": sorted(names), "seconds": round(seconds, 1)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
