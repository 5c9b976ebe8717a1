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

Activations the model names with Flax's `nn.with_logical_constraint` are
sharding points of the search (`shardsearch.activation`) once
`constraint_points` has been called (`train_step` calls it): a search with
`knobs=True` offers `act_<name>` for each of the model's names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .base import activations
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

    constraint_points()
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


def rules_from_file(path: str | os.PathLike[str]) -> list[tuple[str, Any]]:
    """A flax-rules file (`shardsearch export --format flax-rules`) as the
    pairs Flax takes: its `rules` (a list of mesh axes as a tuple), then
    `(name, PartitionSpec.UNCONSTRAINED)` for each name under `unconstrained`
    (activations the search left to XLA, which Flax would otherwise keep
    whole). Give them to `nn.logical_axis_rules(...)` around the step and to
    `nn.logical_to_mesh_sharding(...)` for its arguments.

    Raises:
      ValueError: the file is not a flax-rules file.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != "flax-rules":
        raise ValueError(f"{path}: not a flax-rules file (write one with shardsearch export "
                         "--format flax-rules)")
    return [*((n, tuple(e) if isinstance(e, list) else e) for n, e in data["rules"]),
            *((n, P.UNCONSTRAINED) for n in data.get("unconstrained", ()))]


def constraint_points(step: Callable[..., Any] | None = None) -> Any:
    """Makes the model's `nn.with_logical_constraint` names sharding points.

    From the first call on, `flax.linen.with_logical_constraint` (what
    `nn.with_logical_constraint(x, names)` calls, in Linen and NNX models
    alike) is a `shardsearch.activation` point while a search traces the
    step: `points` finds the names, and the search's `act_<name>` rules place
    them (a name no rule places is left to XLA). Anywhere else, and wherever
    the call pins its own placement (Flax's `logical_axis_rules` are active,
    or it passes `rules=` or `mesh=`), Flax's own function runs, unchanged.

    Use it as a decorator on a step written by hand, in the module that
    defines it, so that a worker importing the step installs it too
    (`train_step` calls it for its steps).

    Args:
      step: returned as it is (None: nothing).

    Returns:
      `step`.

    Example:
      >>> @ssf.constraint_points
      ... def train_step(state, tokens, targets): ...
      >>> ss.optimize(train_step, args, mesh=mesh, knobs=True)  # act_activation_batch, ...

    A name imported before the first call (`from flax.linen import
    with_logical_constraint`) keeps Flax's function: call it as
    `nn.with_logical_constraint`.
    """
    import flax.linen as nn

    if not getattr(nn.with_logical_constraint, "shardsearch_points", False):
        nn.with_logical_constraint = _as_points(nn.with_logical_constraint)
    return step


def _as_points(flax_constraint: Callable[..., Any]) -> Callable[..., Any]:
    """Flax's `with_logical_constraint`, its unpinned calls made points while a
    search traces (`activations.placing()`)."""
    from flax.core.spmd import get_logical_axis_rules

    def with_logical_constraint(x: Any, logical_axis_resources: Any, rules: Any = None,
                                mesh: Any = None, *fallback: Any, **named: Any) -> Any:
        if (not activations.placing() or logical_axis_resources is None or rules is not None
                or mesh is not None or get_logical_axis_rules()):
            return flax_constraint(x, logical_axis_resources, rules, mesh, *fallback, **named)
        return jax.tree.map(_point, logical_axis_resources, x, is_leaf=_is_names)

    with_logical_constraint.__doc__ = flax_constraint.__doc__
    with_logical_constraint.__wrapped__ = flax_constraint  # type: ignore[attr-defined]
    with_logical_constraint.shardsearch_points = True  # type: ignore[attr-defined]
    return with_logical_constraint


def _is_names(spec: Any) -> bool:
    return spec is None or (isinstance(spec, tuple | P) and all(
        n is None or n is P.UNCONSTRAINED or isinstance(n, str) for n in spec))


def _point(names: Any, x: Any) -> Any:
    """`x` as the point Flax's logical names make of it: a dim named None (or
    past the names) is kept whole, as Flax's rules keep it; one marked
    `P.UNCONSTRAINED` is left to XLA."""
    if names is None:
        return x
    if len(names) > x.ndim:
        raise ValueError(f"nn.with_logical_constraint: names {tuple(names)!r} are more than "
                         f"the {x.ndim} dims of the value (shape {tuple(x.shape)}); give one "
                         "name (or None) per dim")
    return activations.activation(x, (*names, *[None] * (x.ndim - len(names))),
                                  unnamed_whole=True)
