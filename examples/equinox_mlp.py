"""An Equinox MLP regression trained with optax AdamW.

Equinox modules carry no logical names: the search discovers the axes from the
dataflow, finds a sharding on 8 simulated devices and exports the plan file;
`shardsearch.equinox` places the module's arrays by the plan read back, for
one training step.

    python examples/equinox_mlp.py [WORKDIR]
"""

from __future__ import annotations

import json
import time

import _common
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

import shardsearch as ss
from shardsearch import equinox as sse

D_IN, WIDTH, DEPTH, D_OUT, BATCH = 32, 256, 3, 8, 64


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def main() -> dict:
    started = time.perf_counter()
    where = _common.workdir()
    model = eqx.nn.MLP(D_IN, D_OUT, WIDTH, DEPTH, activation=jax.nn.gelu, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (BATCH, D_IN))
    y = jax.random.normal(jax.random.key(2), (BATCH, D_OUT))
    optimizer = optax.adamw(1e-3)
    step, args = sse.train_step(model, optimizer, loss_fn, x, y)

    result = _common.search(step, args, where, "equinox-mlp")
    line = _common.check_against_baselines(result)

    # The plan file read back gives the measured specs (checked in export_plans);
    # Equinox places the module by them.
    plan = ss.load_plan(result.export(where / "plan.json"))
    specs = plan.apply(args)
    compared = _common.same_specs(result.best_specs, specs)
    mesh = _common.mesh()
    model = sse.apply_plan(model, specs[0]["params"], mesh)
    placed = [leaf.sharding.spec for leaf in jax.tree.leaves(eqx.filter(model, eqx.is_array))]
    _common.same_specs(jax.tree.leaves(specs[0]["params"], is_leaf=_common.is_spec), placed)

    # One training step on the placed model, its state and batch as the plan says.
    step_s, args_s = sse.train_step(model, optimizer, loss_fn, x, y)
    state = sse.place(args_s[0], specs[0], mesh)
    batch = [sse.place(b, s, mesh) for b, s in zip(args_s[1:], specs[1:], strict=True)]
    new_state, metrics = eqx.filter_jit(step_s)(state, *batch)
    weight = new_state["params"].layers[0].weight
    want = specs[0]["params"].layers[0].weight
    assert isinstance(weight.sharding, NamedSharding)
    assert weight.sharding.is_equivalent_to(NamedSharding(mesh, want), weight.ndim)
    axes = ss.discover_logical_axes(step, args)
    seconds = time.perf_counter() - started
    summary = {"example": "equinox_mlp", "winner": result.best_label, "check": line,
               "baselines": _common.baseline_times(result),
               "leaves_compared": compared, "loss": float(metrics["loss"]),
               "axes": sorted(a.name for a in axes.axes), "seconds": round(seconds, 1)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
