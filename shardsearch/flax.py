"""Flax NNX to shardsearch and back: the step and arguments from a module, a plan
applied to its state. Needs `pip install 'shardsearch[flax]'`; `import
shardsearch` never imports this module (nor Flax).

    import shardsearch as ss
    from shardsearch import flax as ssf

    step, args = ssf.train_step(model, optax.adamw(3e-4), loss_fn, batch)
    result = ss.optimize(step, args, mesh=mesh, n_trials=20)
    model = ssf.apply_plan(model, result.best_specs[0]["params"], mesh)  # params sharded

The state travels as `{"params": ..., "opt_state": ...}` with the `nnx.Param`
boxes kept, so the logical names the model carries (`nnx.with_partitioning`,
`sharding=`) reach `discover_logical_axes`, which adopts them
(`logical.user`), and the optimizer's state sits under `opt_state/`, where
the search's optimizer-state axes (`opt_state_axes`) look for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from .base.mesh import named_shardings


def train_step(model: nnx.Module, optimizer: Any, loss_fn: Callable[..., Any],
               *batch: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A pure train step for `optimize` and its arguments, from an NNX module.

    Args:
      model: the NNX module (its `nnx.Param`s are trained; other state, such
        as batch statistics, is held fixed).
      optimizer: an optax `GradientTransformation` (e.g. `optax.adamw(3e-4)`).
      loss_fn: `loss_fn(model, *batch) -> scalar loss`.
      batch: one batch of the step's inputs (arrays).

    Returns:
      `(step, (state, *batch))`: `step(state, *batch) -> (state, {"loss": loss})`
      with `state = {"params": params, "opt_state": opt_state}`, the
      `nnx.State` of the params (boxes and their logical names kept) and
      optax's state on it.

    Example:
      >>> step, args = train_step(model, optax.adamw(1e-3), loss, tokens, targets)
      >>> ss.optimize(step, args, mesh=mesh)
    """
    import optax

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def step(state: Any, *batch: Any) -> Any:
        params, opt_state = state["params"], state["opt_state"]

        def loss_of(params: Any) -> Any:
            return loss_fn(nnx.merge(graphdef, params, rest), *batch)

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new = {"params": optax.apply_updates(params, updates), "opt_state": opt_state}
        return new, {"loss": loss}

    step.__name__ = f"{type(model).__name__}_train_step"
    return step, ({"params": params, "opt_state": optimizer.init(params)}, *batch)


def shardings(specs: Any, mesh: Mesh) -> Any:
    """A spec tree (`OptimizeResult.best_specs[i]`, `ShardingPlan.apply(...)[i]`) as
    `NamedSharding`s on `mesh`, the boxes kept."""
    return named_shardings(mesh, specs)


def apply_plan(model: nnx.Module, param_specs: Any, mesh: Mesh) -> nnx.Module:
    """`model` with its parameters placed by a plan: each `nnx.Param` moved to its
    `NamedSharding` (`jax.device_put`); the model is updated in place and returned.

    Args:
      model: the module `train_step` was built from.
      param_specs: the spec tree of the params, e.g.
        `result.best_specs[0]["params"]` (the state is `{"params",
        "opt_state"}`).
      mesh: a concrete mesh with the plan's axis names.
    """
    params = nnx.state(model, nnx.Param)
    placed = jax.device_put(params, shardings(param_specs, mesh))
    nnx.update(model, placed)
    return model


def place(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """`tree` (the state, a batch) moved to the `NamedSharding`s of `specs`."""
    return jax.device_put(tree, shardings(specs, mesh))
