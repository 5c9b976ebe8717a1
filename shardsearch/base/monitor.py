"""The monitored step: compile once, time honestly, validate once; and a barrier."""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from . import mesh as _mesh
from . import spec as _spec
from . import tree as _tree
from .analyzer import ShardingAnalyzer


class ShardingWarning(UserWarning):
    """A spec tree has problems; the step still runs (XLA decides what to do)."""


def _signature(args: tuple[Any, ...], specs: Any) -> tuple[Any, ...]:
    leaves, treedef = jax.tree_util.tree_flatten(args)
    shapes = tuple((_tree.leaf_shape(x), str(_tree.leaf_dtype(x))) for x in leaves)
    spec_leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    return treedef, shapes, tuple(_spec.canonical(s) for s in spec_leaves)


def create_monitored_function(
    fn: Callable[..., Any],
    partition_specs: Any,
    analyzer: ShardingAnalyzer,
) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """Wraps `fn` so each call returns `(result, metrics)`.

    The wrapped call places the arguments with `partition_specs` (a spec tree
    for the tuple of positional arguments, or for the single argument when
    there is one) on the analyzer's mesh, compiles `fn` once per distinct
    (shapes, specs) signature, and times only the execution, blocking until
    the result is ready. Problems found by the analyzer are reported once per
    signature as a `ShardingWarning`; then the arguments are passed as they
    are and XLA chooses the layout.

    Returns:
      A function whose result is `(fn(*args), metrics)` with
      `execution_time` (seconds, never including compilation),
      `compile_time` (seconds spent compiling in this call; 0.0 when cached),
      `memory_usage` (the analyzer's estimate), `validation_issues` (list).
    """
    cache: dict[tuple[Any, ...], dict[str, Any]] = {}

    def specs_for(args: tuple[Any, ...]) -> Any:
        try:
            _tree.specs_for_leaves(args, partition_specs)
            return partition_specs
        except ValueError:
            if len(args) != 1:
                raise
            _tree.specs_for_leaves(args[0], partition_specs)
            return (partition_specs,)

    def prepare(args: tuple[Any, ...], specs: Any) -> dict[str, Any]:
        issues = analyzer.validate_partition_specs(args, specs)
        memory = analyzer.estimate_memory_usage(args, specs) if not issues else {}
        shardings = None
        if not issues:
            mesh = _mesh.resolve_mesh(analyzer.mesh)
            if not isinstance(mesh, jax.sharding.Mesh):
                raise TypeError(
                    "create_monitored_function: the analyzer's mesh is abstract; running "
                    "a step needs a concrete Mesh (shardsearch.create_mesh)")
            shardings = jax.tree.map(
                lambda s: NamedSharding(mesh, s), specs,
                is_leaf=lambda s: isinstance(s, PartitionSpec))
        else:
            warnings.warn(
                f"{len(issues)} sharding problem(s); running with the arguments as they "
                "are:\n  " + "\n  ".join(issues), ShardingWarning, stacklevel=3)
        return {"issues": issues, "memory": memory, "shardings": shardings, "compiled": None}

    def monitored(*args: Any) -> tuple[Any, dict[str, Any]]:
        specs = specs_for(args)
        key = _signature(args, specs)
        entry = cache.get(key)
        if entry is None:
            entry = cache[key] = prepare(args, specs)
        if entry["shardings"] is not None:
            args = jax.device_put(args, entry["shardings"])
        compile_time = 0.0
        if entry["compiled"] is None:
            jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
            start = time.perf_counter()
            entry["compiled"] = jitted.lower(*args).compile()
            compile_time = time.perf_counter() - start
        jax.block_until_ready(args)
        start = time.perf_counter()
        result = jax.block_until_ready(entry["compiled"](*args))
        elapsed = time.perf_counter() - start
        return result, {
            "execution_time": elapsed,
            "compile_time": compile_time,
            "memory_usage": entry["memory"],
            "validation_issues": list(entry["issues"]),
        }

    monitored.__wrapped__ = fn  # type: ignore[attr-defined]
    return monitored


_barrier_ids = itertools.count()


def barrier_sync(timeout: float = 200) -> None:
    """Waits until every JAX process reaches this point.

    Returns at once in a single-process run. Each call uses a fresh barrier
    name, so successive barriers never match each other.

    Raises:
      ValueError: `timeout` is not positive.
      TimeoutError: the other processes did not arrive within `timeout` seconds.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(
            f"barrier_sync: timeout must be a positive number of seconds, got {timeout!r}")
    name = f"shardsearch_barrier_{next(_barrier_ids)}"
    if jax.process_count() == 1:
        return
    failure: list[BaseException] = []

    def wait() -> None:
        try:
            multihost_utils.sync_global_devices(name)
        except BaseException as err:  # surfaced in the caller's thread below
            failure.append(err)

    thread = threading.Thread(target=wait, name=name, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(
            f"barrier {name!r}: not all {jax.process_count()} processes arrived within "
            f"{timeout} s; check that every process runs the same code path")
    if failure:
        raise failure[0]
