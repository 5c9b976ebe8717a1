"""The monitored step: compile once, time honestly, validate once; and a barrier."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec

from . import mesh as _mesh
from . import spec as _spec
from . import tree as _tree
from .analyzer import ShardingAnalyzer
from .warnings import ShardsearchWarning


class ShardingWarning(ShardsearchWarning):
    """A spec tree has problems; the step still runs (XLA decides what to do)."""


def _spec_key(specs: Any) -> tuple[Any, ...]:
    spec_leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))
    return tuple(_spec.canonical(s) for s in spec_leaves)


def _placed(leaves: list[Any], targets: list[Any] | None) -> bool:
    """Whether every leaf is already an array with its target sharding (so a
    `device_put` would hand it back as it is)."""
    return targets is not None and all(
        getattr(x, "sharding", None) == s for x, s in zip(leaves, targets, strict=True))


_named = _mesh.named_shardings


def compile_within(lowered: Callable[[], Any], timeout: float | None) -> tuple[Any, float]:
    """Runs `lowered()` (lower + compile) and returns `(executable, seconds)`.

    XLA offers no way to cancel a compile, so past `timeout` seconds the
    compile is left running in a daemon thread and TimeoutError is raised.

    Raises:
      TimeoutError: the compile ran past `timeout`.
    """
    if timeout is None:
        start = time.perf_counter()
        compiled = lowered()
        return compiled, time.perf_counter() - start
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["compiled"] = lowered()
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    start = time.perf_counter()
    thread = threading.Thread(target=work, daemon=True, name="shardsearch-compile")
    thread.start()
    thread.join(timeout)
    seconds = time.perf_counter() - start
    if thread.is_alive():
        raise TimeoutError(f"compile ran past compile_timeout={timeout} s")
    if "error" in box:
        raise box["error"]
    return box["compiled"], seconds


def create_monitored_function(
    fn: Callable[..., Any],
    partition_specs: Any,
    analyzer: ShardingAnalyzer,
    *,
    out_specs: Any = None,
    donate_argnums: tuple[int, ...] = (),
    compile_timeout: float | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """Wraps `fn` so each call returns `(result, metrics)`.

    The wrapped call places the arguments with `partition_specs` (a spec tree
    for the tuple of positional arguments, or for the single argument when
    there is one) on the analyzer's mesh (arguments that already carry those
    shardings, such as the state the step returned, are passed as they are),
    compiles `fn` once per distinct
    (shapes, specs) signature, and times only the execution, blocking until
    the result is ready. Problems found by the analyzer are reported once per
    signature as a `ShardingWarning`; then the arguments are passed as they
    are and XLA chooses the layout.

    The search times candidates through this same wrapper, so a step timed
    here and by `optimize` is measured the same way. What a training loop
    needs is available as options and two methods:

    - `out_specs` (a spec tree for the result) and `donate_argnums` are given
      to `jax.jit`, so a train step can hand back its state with the input
      sharding and reuse the donated buffers; `compiler_options` (XLA debug
      options by name, e.g. `{"xla_backend_optimization_level": 0}`) to
      every compile, as `jax.stages.Lowered.compile` takes them;
    - `monitored.compile(*args)` compiles for the signature of `args`
      (arrays or ShapeDtypeStructs: nothing needs allocating) without running,
      and returns `(executable, seconds)`; later calls with that signature use
      it. Past `compile_timeout` seconds it raises TimeoutError;
    - `monitored.repeat(*args, repeats=..., warmup=..., feed=..., on_repeat=...)`
      makes `warmup` untimed then up to `repeats` timed calls, each through
      the wrapper. `feed(result, args)` gives the next call's arguments (for
      a train step, the new state with the same batch); `on_repeat(i,
      metrics)` returning True stops early. Returns the last result and the
      timed calls' metrics.

    Example:
      >>> step = create_monitored_function(train_step, (state_specs, batch_specs),
      ...     analyzer, out_specs=(state_specs, P()), donate_argnums=(0,))
      >>> (state, loss), metrics = step(state, batch)

    Returns:
      A function whose result is `(fn(*args), metrics)` with
      `execution_time` (seconds, never including compilation),
      `compile_time` (seconds spent compiling in this call; 0.0 when cached),
      `memory_usage` (the analyzer's estimate), `validation_issues` (list).
    """
    cache: dict[tuple[Any, ...], dict[str, Any]] = {}
    # A copy: the caller's dict changed later does not change what compiled.
    options = dict(compiler_options) if compiler_options else None
    donate = tuple(donate_argnums)
    # Where this function jits `fn`, the arguments' shardings go to jit as
    # `in_shardings`, not onto the abstract arguments: JAX caches a trace by
    # the function and its arguments' types, and a sharding on an abstract
    # argument is part of its type, so each spec tree would trace the step
    # anew; this way every spec tree of one step (and stage 1's trace of it,
    # `logical.discover`) shares one trace. jit inside jit is inlined, so an
    # already-jitted `fn` gets the options too; an already-jitted `fn` given
    # without options is lowered as it is, its abstract arguments carrying
    # the shardings. `make_jitted` returns the jitted function and whether it
    # took the shardings.
    if out_specs is not None or donate:
        def make_jitted(mesh: Any, shardings: Any) -> tuple[Any, bool]:
            return jax.jit(fn, donate_argnums=donate, **_given(shardings),
                           out_shardings=None if out_specs is None
                           else _named(mesh, out_specs)), True
    else:
        def make_jitted(mesh: Any, shardings: Any) -> tuple[Any, bool]:
            if hasattr(fn, "lower"):
                return fn, False
            return jax.jit(fn, **_given(shardings)), True

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
        mesh = _mesh.resolve_mesh(analyzer.mesh)
        shardings = None
        if not issues:
            if not isinstance(mesh, jax.sharding.Mesh):
                raise TypeError(
                    "create_monitored_function: the analyzer's mesh is abstract; running "
                    "a step needs a concrete Mesh (shardsearch.create_mesh)")
            shardings = _named(mesh, specs)
        else:
            warnings.warn(
                f"{len(issues)} sharding problem(s); running with the arguments as they "
                "are:\n  " + "\n  ".join(issues), ShardingWarning, stacklevel=4)
        return {"issues": issues, "memory": memory, "shardings": shardings, "compiled": None,
                "mesh": mesh}

    # The specs and their part of the signature depend only on the arguments'
    # tree structure: found once per structure, not on every call.
    by_structure: dict[Any, tuple[Any, tuple[Any, ...]]] = {}

    def entry_for(args: tuple[Any, ...]) -> tuple[dict[str, Any], list[Any]]:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        known = by_structure.get(treedef)
        if known is None:
            specs = specs_for(args)
            known = by_structure[treedef] = (specs, _spec_key(specs))
        specs, spec_key = known
        key = (treedef, tuple((_tree.leaf_shape(x), _tree.leaf_dtype(x)) for x in leaves),
               spec_key)
        entry = cache.get(key)
        if entry is None:
            entry = cache[key] = prepare(args, specs)
            entry["targets"] = None
            if entry["shardings"] is not None:
                # Else device_put on every call: it knows how to place them.
                with contextlib.suppress(ValueError, TypeError):
                    entry["targets"] = treedef.flatten_up_to(entry["shardings"])
        return entry, leaves

    def compile_entry(entry: dict[str, Any], args: tuple[Any, ...]) -> float:
        if entry["compiled"] is not None:
            return 0.0
        jitted, placed = make_jitted(entry["mesh"], _positional(entry["shardings"]))
        if entry["shardings"] is not None and not placed:
            # Abstract leaves carry their sharding, so lowering needs no devices' data.
            leaves, treedef = jax.tree_util.tree_flatten(args)
            shardings = treedef.flatten_up_to(entry["shardings"])
            args = treedef.unflatten([
                jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                if isinstance(x, jax.ShapeDtypeStruct) and s is not None else x
                for x, s in zip(leaves, shardings, strict=True)])
        entry["compiled"], seconds = compile_within(
            lambda: (jitted.lower(*args).compile(options) if options
                     else jitted.lower(*args).compile()), compile_timeout)
        return seconds

    def monitored(*args: Any) -> tuple[Any, dict[str, Any]]:
        entry, leaves = entry_for(args)
        if entry["shardings"] is not None and not _placed(leaves, entry["targets"]):
            args = jax.device_put(args, entry["shardings"])
        compile_time = compile_entry(entry, args)
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

    def compile(*args: Any) -> tuple[Any, float]:
        entry, _ = entry_for(args)
        seconds = compile_entry(entry, args)
        return entry["compiled"], seconds

    def repeat(
        *args: Any,
        repeats: int,
        warmup: int = 0,
        feed: Callable[[Any, tuple[Any, ...]], tuple[Any, ...]] | None = None,
        on_repeat: Callable[[int, dict[str, Any]], bool] | None = None,
    ) -> tuple[Any, list[dict[str, Any]]]:
        if repeats < 0 or warmup < 0:
            raise ValueError(f"repeat: need repeats >= 0 and warmup >= 0, got {repeats=}, "
                             f"{warmup=}")
        result, timed = None, []
        for i in range(warmup + repeats):
            result, metrics = monitored(*args)
            if feed is not None:
                args = tuple(feed(result, args))
            if i < warmup:
                continue
            timed.append(metrics)
            if on_repeat is not None and on_repeat(i - warmup, metrics):
                break
        return result, timed

    monitored.__wrapped__ = fn  # type: ignore[attr-defined]
    monitored.compile = compile  # type: ignore[attr-defined]
    monitored.repeat = repeat  # type: ignore[attr-defined]
    return monitored


def _given(shardings: Any) -> dict[str, Any]:
    """jit's `in_shardings` keyword, where there are shardings to give."""
    return {} if shardings is None else {"in_shardings": shardings}


def _positional(shardings: Any) -> Any:
    """`shardings` as jit's `in_shardings`: a tuple with one entry per
    positional argument (`specs_for` matched them to the arguments, wrapping
    a single argument's), or as they are when None or one sharding for every
    leaf (a prefix)."""
    return tuple(shardings) if isinstance(shardings, tuple | list) else shardings


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
