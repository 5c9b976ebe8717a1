"""What is fixed for one study: the checked step, arguments, mesh and budget, the
space over them, and the baseline candidates every search starts from.

`make_context` is what `optimize` does before its first trial; it is public
so benchmarks and studies can evaluate hand-picked candidates the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ..base import mesh as _mesh
from ..base import tree as _tree
from ..base.units import parse_bytes
from ..cost.hardware import HardwareModel
from ..rules.auto import AutoShardingRule
from ..rules.base import ShardingRule
from ..rules.batch import BatchShardingRule
from ..rules.composite import CompositeShardingRule
from .candidate import Candidate
from .evaluate import Context
from .objectives import OBJECTIVES, Objective, get_objective
from .space import SearchSpace


def baseline_candidates(workload: Any, mesh: Any) -> dict[str, Candidate]:
    """Replicated, the original design's default rule, and the workload's expert plans."""
    out = {
        "replicated": Candidate(CompositeShardingRule(), BatchShardingRule(()), "replicated"),
        # The original design applied one AutoShardingRule to every argument.
        "default": Candidate(AutoShardingRule(mesh), AutoShardingRule(mesh), "default"),
    }
    if workload is not None:
        from ..workloads import expert_plans

        for name, plan in expert_plans(workload, mesh).plans.items():
            if name in out:
                continue
            out[name] = Candidate(plan.state_rule, plan.batch_rule, name)
    return out


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


def _default_budget(mesh: jax.sharding.Mesh) -> int | None:
    stats = mesh.devices.flat[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


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


def make_space(
    mesh: Any,
    state: Any,
    budget: int | None = None,
    extra_rules: Mapping[str, ShardingRule] | None = None,
) -> SearchSpace:
    """The search space `optimize` explores for a state tree on a mesh.

    Memory fractions refer to the budget, or to the state's total bytes when
    there is none; `min_shard_size` choices run up past the largest leaf. The
    mesh may be abstract (enough to enumerate and replay the space).
    """
    leaves = [x for x in jax.tree.leaves(state) if _tree.leaf_shape(x)]
    state_bytes = sum(math.prod(_tree.leaf_shape(x)) * _tree.leaf_dtype(x).itemsize
                      for x in leaves)
    return SearchSpace(mesh, budget or max(state_bytes, 1),
                       max((math.prod(_tree.leaf_shape(x)) for x in leaves), default=1),
                       extra_rules or {})


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
) -> tuple[Context, Any]:
    """Checks a step, its arguments and a mesh, and builds the evaluation context.

    What `optimize` does before its first trial, available on its own to
    evaluate hand-picked candidates (benchmarks, studies) the same way.

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
    budget = (parse_bytes(memory_budget) if memory_budget is not None
              else _default_budget(mesh))
    n_devices = _mesh.device_count(mesh)
    minimum = _minimum_footprint(abstract_args, n_devices)
    if budget is not None and budget < minimum:
        raise ValueError(
            f"optimize: memory_budget={budget} bytes per device is below the smallest "
            f"possible footprint of the arguments, {minimum} bytes (everything split over "
            f"all {n_devices} devices); raise the budget or use more devices")
    host_args = _host_args(workload, args, seed, scorer) if scorer.needs_host_args else None
    ctx = Context(step, abstract_args, mesh, host_args, budget, scorer, warmup, repeats,
                  compile_timeout, hardware)
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
