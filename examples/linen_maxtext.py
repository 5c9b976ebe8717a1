"""A Flax Linen decoder with MaxText-style logical annotations, trained with optax.

Its parameters carry MaxText's logical names (`nn.with_logical_partitioning`:
embed, heads, kv, mlp, vocab), and its activations MaxText's activation names
(`nn.with_logical_constraint`: activation_batch, activation_length, ...). The
step takes Linen's boxed variables as they come from `init`, so the
parameters' names reach the search, which adopts them; `constraint_points`
makes the activations' names sharding points the search places (`knobs=True`:
`act_activation_length`, ...). The plan comes back as a flax-rules file, and
one step runs as a MaxText training loop would run it: the state and batch
sharded by Flax's own `nn.logical_to_mesh_sharding`, the step traced under
`nn.logical_axis_rules` with those rules, so that Flax places the
activations too.

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
from shardsearch import flax as ssf

VOCAB, D, HEADS, HEAD_DIM, MLP, LAYERS = 64, 32, 4, 8, 64, 2
BATCH, SEQ = 8, 16


def init(names, scale=None, **axes):
    base = nn.initializers.normal(scale) if scale else nn.initializers.lecun_normal(**axes)
    return nn.with_logical_partitioning(base, names)


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones,
                                                                 ("embed",)), (D,))
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


class Attention(nn.Module):
    """Projections as MaxText writes them, a kernel per dim of (embed, heads, kv)
    (Linen's DenseGeneral cannot be traced under a mesh with 3-name kernels: its
    shape check unboxes the flat 2-d kernel it initialises)."""

    @nn.compact
    def __call__(self, x):
        def proj(name):
            kernel = self.param(name, init(("embed", "heads", "kv"), in_axis=0, out_axis=(1, 2)),
                                (D, HEADS, HEAD_DIM))
            return jnp.einsum("btd,dhk->bthk", x, kernel)

        names = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
        q, k, v = (nn.with_logical_constraint(proj(n), names) for n in ("query", "key", "value"))
        t = x.shape[1]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / HEAD_DIM**0.5
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        wo = self.param("out", init(("heads", "kv", "embed"), in_axis=(0, 1), out_axis=2),
                        (HEADS, HEAD_DIM, D))
        return jnp.einsum("bthk,hkd->btd", out, wo)


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(MLP, use_bias=False, kernel_init=init(("embed", "mlp")), name="wi")(x)
        h = nn.with_logical_constraint(h, ("activation_batch", "activation_length",
                                           "activation_mlp"))
        return nn.Dense(D, use_bias=False, kernel_init=init(("mlp", "embed")),
                        name="wo")(nn.gelu(h))


class Decoder(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, D, embedding_init=init(("vocab", "embed"), 0.02),
                     name="token_embedder")(tokens)
        for i in range(LAYERS):
            x = nn.with_logical_constraint(x, ("activation_batch", "activation_length",
                                               "activation_embed"))
            x = x + Attention(name=f"layers_{i}_attention")(RMSNorm(name=f"layers_{i}_pre")(x))
            x = x + Mlp(name=f"layers_{i}_mlp")(RMSNorm(name=f"layers_{i}_post")(x))
        x = RMSNorm(name="decoder_norm")(x)
        return nn.Dense(VOCAB, use_bias=False, kernel_init=init(("embed", "vocab")),
                        name="logits_dense")(x)


MODEL = Decoder()
# MaxText's base.yml style: the parameters' names, then the activations'.
MAXTEXT_RULES = [["batch", "dp"], ["vocab", "tp"], ["embed", None], ["heads", "tp"],
                 ["kv", None], ["mlp", "tp"], ["activation_batch", "dp"],
                 ["activation_length", None], ["activation_embed", None],
                 ["activation_heads", "tp"], ["activation_kv", None], ["activation_mlp", "tp"]]
OPTIMIZER = optax.adamw(1e-3)


def loss_fn(params, tokens, targets):
    logits = MODEL.apply({"params": params}, tokens)  # Linen unboxes the params
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


@ssf.constraint_points  # the nn.with_logical_constraint names: points the search places
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

    # MaxText's own rules, its activations' pairs included, are a start plan: the
    # expert's plan, measured beside what the search finds.
    expert = where / "maxtext-rules.json"
    expert.write_text(json.dumps(MAXTEXT_RULES))
    result = _common.search(train_step, args, where, "linen-maxtext", knobs=True,
                            start_from=[expert], n_trials=10)
    acts = {"act_activation_batch", "act_activation_length", "act_activation_embed",
            "act_activation_heads", "act_activation_kv", "act_activation_mlp"}
    assert acts <= set(result.best_knobs), result.best_knobs
    expert_trial = next(t for t in result.trials if t.label == "plan:maxtext-rules")
    assert dict(expert_trial.knobs) == {  # null in the list: the dim kept whole, "-"
        "act_activation_batch": "dp", "act_activation_length": "-", "act_activation_embed": "-",
        "act_activation_heads": "tp", "act_activation_kv": "-", "act_activation_mlp": "tp"}
    line = _common.check_against_baselines(result)

    # The flax-rules file, loaded as a MaxText user would: the state's boxes and
    # the batch's logical names, through Flax's own resolution. From a trial that
    # placed some activations, where one did.
    _, data, measured, source = _common.export_plans(  # plan file checked too
        result, args, where, prefer=lambda t: any(
            n in acts and v != "auto" for n, v in t.knobs))
    rules = _common.rules(data)
    mesh = _common.mesh()
    state_shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(args[0]), mesh, rules)
    batch_names = [argument[0][2] for argument in data["batch"]]  # one leaf per batch argument
    batch_shardings = [nn.logical_to_mesh_sharding(P(*n), mesh, rules) for n in batch_names]
    flax_specs = (jax.tree.map(lambda s: s.spec, state_shardings),
                  *[s.spec for s in batch_shardings])
    assert flax_specs == _common.flax_specs(nn.get_partition_spec(args[0]), data)
    compared = _common.same_specs(measured, flax_specs)

    # A MaxText loop runs the step on the unboxed state, under the mesh and the
    # rules; Flax then places the model's nn.with_logical_constraint calls, which
    # must be as the search traced them for that trial (its act_ knobs).
    plain = jax.tree.map(lambda b: b.value if _common.is_box(b) else b, args[0],
                         is_leaf=_common.is_box)
    pairs = ssf.rules_from_file(where / "rules.json")
    trial = ss.load_plan(_common.trial_plan(result, source["trial"], where), mesh=mesh)
    traced = _common.constraint_specs(trial.build_step(train_step), *args)
    with jax.set_mesh(mesh), nn.logical_axis_rules(pairs):
        by_flax = _common.constraint_specs(train_step, plain, *args[1:])
        assert by_flax == traced, (by_flax, traced)

        # One step with Flax's shardings, the new state kept where Flax put the old
        # (as a MaxText loop jits its step).
        state = jax.device_put(plain, state_shardings)
        batch = [jax.device_put(b, s) for b, s in zip(args[1:], batch_shardings, strict=True)]
        _, metrics = jax.jit(train_step, out_shardings=(state_shardings, None),
                             donate_argnums=0)(state, *batch)
    seconds = time.perf_counter() - started
    summary = {"example": "linen_maxtext", "winner": result.best_label, "check": line,
               "baselines": _common.baseline_times(result),
               "leaves_compared": compared, "flax_rules_from": source, "rules": rules,
               "constraints_compared": len(by_flax),
               "trial_knobs": {n: v for n, v in trial.knobs.items() if n in acts},
               "loss": float(metrics["loss"]),
               "axes": sorted(names), "seconds": round(seconds, 1)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
