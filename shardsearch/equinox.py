"""Equinox to shardsearch and back: the step and arguments from a module, a plan
applied to it. Needs `pip install 'shardsearch[equinox]'`; `import shardsearch`
never imports this module (nor Equinox).

    step, args = sse.train_step(model, optax.adamw(1e-3), loss_fn, x, y)
    result = ss.optimize(step, args, mesh=mesh, n_trials=20)
    model = sse.apply_plan(model, result.best_specs[0]["params"], mesh)

The state is `{"params": ..., "opt_state": ...}`: the module's arrays
(`eqx.filter(model, eqx.is_array)`, a module with None where the static
parts are) and optax's state on them, under `opt_state/` where the search's
optimizer-state axes look for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
from jax.sharding import Mesh

from .base.mesh import named_shardings


def train_step(model: Any, optimizer: Any, loss_fn: Callable[..., Any],
               *batch: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A pure train step for `optimize` and its arguments, from an Equinox module.

    Args:
      model: the module; its array leaves are trained, the rest held fixed.
      optimizer: an optax `GradientTransformation`.
      loss_fn: `loss_fn(model, *batch) -> scalar loss`.
      batch: one batch of the step's inputs.

    Returns:
      `(step, ({"params": params, "opt_state": opt_state}, *batch))`,
      `step(state, *batch) -> (state, {"loss": loss})`.
    """
    import optax

    params, static = eqx.partition(model, eqx.is_array)

    def step(state: Any, *batch: Any) -> Any:
        params, opt_state = state["params"], state["opt_state"]

        def loss_of(params: Any) -> Any:
            return loss_fn(eqx.combine(params, static), *batch)

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new = {"params": optax.apply_updates(params, updates), "opt_state": opt_state}
        return new, {"loss": loss}

    step.__name__ = f"{type(model).__name__}_train_step"
    return step, ({"params": params, "opt_state": optimizer.init(params)}, *batch)


def shardings(specs: Any, mesh: Mesh) -> Any:
    """A spec tree as `NamedSharding`s on `mesh`."""
    return named_shardings(mesh, specs)


def apply_plan(model: Any, param_specs: Any, mesh: Mesh) -> Any:
    """A copy of `model` whose arrays sit on the `NamedSharding`s of `param_specs`
    (`result.best_specs[0]["params"]`: the params of the state)."""
    params, static = eqx.partition(model, eqx.is_array)
    return eqx.combine(jax.device_put(params, shardings(param_specs, mesh)), static)


def place(tree: Any, specs: Any, mesh: Mesh) -> Any:
    """`tree` (the state, a batch) moved to the `NamedSharding`s of `specs`."""
    return jax.device_put(tree, shardings(specs, mesh))
