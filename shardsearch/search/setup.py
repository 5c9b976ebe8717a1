"""What `optimize` does before its first trial: check the step, arguments and
mesh, and build the evaluation context.

`make_context` is public so benchmarks and studies can evaluate hand-picked
candidates the same way the search does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ..base import mesh as _mesh
from ..base import tree as _tree
from ..base.units import parse_bytes
from ..cost.hardware import HardwareModel
from .evaluation.context import EXECUTE_TIMEOUT, Context
from .evaluation.objectives import OBJECTIVES, Objective, get_objective


def _as_abstract(tree: Any) -> Any:
    def one(x: Any) -> Any:
        shape = _tree.leaf_shape(x)
        if shape is None:
            return x
        return jax.ShapeDtypeStruct(shape, _tree.leaf_dtype(x))

    return jax.tree.map(one, tree)


def _is_concrete(tree: Any) -> bool:
    return all(not isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def _minimum_footprint(abstract_args: Sequence[Any], n_devices: int) -> int:
    """Per-device bytes if every leaf were split evenly over all devices."""
    total = 0
    for leaf in jax.tree.leaves(tuple(abstract_args)):
        shape = _tree.leaf_shape(leaf)
        if shape is not None:
            total += -(-math.prod(shape) // n_devices) * _tree.leaf_dtype(leaf).itemsize
    return total


def _default_budget(ctx: Context) -> int | None:
    """The budget when none is given: for an objective that runs nothing, the
    hardware model's memory (a named chip's HBM) when it states one, since
    the plan is for that chip; else the memory JAX reports for the devices at
    hand."""
    if not ctx.objective.needs_host_args:
        try:
            model = ctx.hardware_model()
        except ValueError:  # no model for this platform: the objective says so itself
            model = None
        if model is not None and model.memory_bytes is not None:
            return model.memory_bytes
    # A device of this process: in a mesh across processes the others' have no stats here.
    here = [d for d in ctx.mesh.devices.flat if d.process_index == jax.process_index()]
    stats = (here or list(ctx.mesh.devices.flat))[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


def _check_dcn_axes(dcn_axes: Any, mesh: jax.sharding.Mesh) -> tuple[str, ...]:
    if isinstance(dcn_axes, str) or not all(isinstance(a, str) for a in dcn_axes):
        raise ValueError(f"optimize: dcn_axes={dcn_axes!r}; give a sequence of mesh axis "
                         f"names, e.g. ('dp',)")
    axes = tuple(dcn_axes)
    unknown = [a for a in axes if a not in mesh.axis_names]
    if unknown or len(set(axes)) != len(axes):
        what = (f"{unknown} are not axes of the mesh" if unknown
                else "names an axis twice; the mesh's axes are")
        raise ValueError(f"optimize: dcn_axes={axes}: {what} {tuple(mesh.axis_names)}; name "
                         "the mesh axes whose devices sit on different hosts")
    return axes


def _check_mesh(mesh: Any) -> jax.sharding.Mesh:
    if not isinstance(mesh, jax.sharding.Mesh):
        raise ValueError(
            f"optimize needs a concrete Mesh to compile on, got {type(mesh).__name__}; build "
            "one with shardsearch.create_mesh (simulate devices with use_cpu_devices(n))")
    available = {d.id for d in jax.devices()}
    missing = [d.id for d in mesh.devices.flat if d.id not in available]
    if missing:
        raise ValueError(
            f"the mesh uses devices {missing} that this process does not have "
            f"({len(available)} devices); build the mesh from jax.devices()")
    return mesh


def make_context(
    step: Any,
    args: Sequence[Any] | None,
    mesh: jax.sharding.Mesh,
    *,
    memory_budget: int | str | None = None,
    objective: str | Objective = "measured",
    seed: int = 0,
    warmup: int = 2,
    repeats: int = 7,
    compile_timeout: float = 600.0,
    hardware: HardwareModel | None = None,
    isolate: bool | None = False,
    execute_timeout: float = EXECUTE_TIMEOUT,
    verbose: bool = False,
    dcn_axes: Sequence[str] = (),
) -> tuple[Context, Any]:
    """Checks a step, its arguments and a mesh, and builds the evaluation context.

    What `optimize` does before its first trial, available on its own to
    evaluate hand-picked candidates (benchmarks, studies) the same way.
    The options are as for `optimize` (the default budget, `hardware` and
    `dcn_axes` included); `isolate` defaults to False here: with isolation
    the context owns a worker process; `ctx.close()` (or `with ctx:`) stops it.

    Returns:
      `(context, workload)`; workload is None when `step` is a plain function.

    Raises:
      ValueError: as listed for `optimize`.
    """
    from ..workloads import Workload

    workload = step if isinstance(step, Workload) else None
    if workload is not None:
        step = workload.step
        args = workload.abstract() if args is None else args
    if args is None or not isinstance(args, tuple | list) or len(args) < 1:
        raise ValueError("optimize: args must be the tuple (state, *batch) the step takes")
    try:
        scorer = get_objective(objective)
    except ValueError as err:
        raise ValueError(f"optimize: {err}") from None
    mesh = _check_mesh(mesh)
    args = tuple(args)
    abstract_args = _as_abstract(args)
    try:
        jax.eval_shape(step, *abstract_args)
    except Exception as err:
        raise ValueError(
            f"optimize: the step cannot be traced with these arguments: "
            f"{type(err).__name__}: {err}") from None
    dcn_axes = _check_dcn_axes(dcn_axes, mesh)
    ctx = Context(step, abstract_args, mesh, None, None, scorer, warmup, repeats,
                  compile_timeout, hardware, execute_timeout=execute_timeout, verbose=verbose,
                  dcn_axes=dcn_axes)
    if scorer.uses_hardware:
        try:
            ctx.hardware_model()
        except ValueError as err:
            raise ValueError(f"optimize: objective {scorer.name!r} estimates with a hardware "
                             f"model: {err}") from None
    budget = (parse_bytes(memory_budget) if memory_budget is not None
              else _default_budget(ctx))
    n_devices = _mesh.device_count(mesh)
    minimum = _minimum_footprint(abstract_args, n_devices)
    if budget is not None and budget < minimum:
        raise ValueError(
            f"optimize: memory_budget={budget} bytes per device is below the smallest "
            f"possible footprint of the arguments, {minimum} bytes (everything split over "
            f"all {n_devices} devices); raise the budget or use more devices")
    host_args = _host_args(workload, args, seed, scorer) if scorer.needs_host_args else None
    if not execute_timeout > 0:
        raise ValueError(f"optimize: execute_timeout must be a positive number of seconds, "
                         f"got {execute_timeout!r}")
    ctx.host_args, ctx.budget = host_args, budget
    if isolate is not False:
        from .execution.isolate import Isolation

        ctx.isolation = Isolation.prepare(ctx, workload, forced=isolate is True)
    return ctx, workload


def _host_args(workload: Any, args: tuple[Any, ...], seed: int,
               objective: Objective) -> Callable[[], Any]:
    if _is_concrete(args):
        host = jax.device_get(args)
    elif workload is not None:
        host = jax.device_get(tuple(workload.init(seed)))
    else:
        runs_nothing = tuple(n for n, o in OBJECTIVES.items() if not o.needs_host_args)
        raise ValueError(
            f"optimize: objective {objective.name!r} runs the step, so args must be concrete "
            "arrays (or pass a Workload, whose init makes them); for ShapeDtypeStructs use "
            f"an objective that runs nothing: {runs_nothing}")
    host = jax.tree.map(np.asarray, host)
    return lambda: host
