"""Candidate → Outcome: resolve specs, check, compile, then measure or estimate.

Each stage can end the evaluation, cheapest first:
  1. check   — the analyzer on the abstract arguments: invalid specs, or the
               arguments alone over the per-device budget. Nothing compiles.
  2. compile — XLA's memory analysis (arguments + outputs + temporaries −
               aliased bytes) over the budget. Nothing runs.
  3. measure — timed repeats reported one by one; the caller's `report`
               callback may stop it once the candidate is clearly slower.
A compile that raises or overruns `compile_timeout` is a failed candidate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..base import spec as _spec
from ..base import tree as _tree
from ..base.analyzer import ShardingAnalyzer
from ..cost import hlo as _hlo
from ..cost import model as _cost
from .space import Candidate

COMPLETE, CUT, FAILED = "complete", "cut", "failed"
STAGES = {1: "check", 2: "compile", 3: "measure"}
CLEAR_CACHES_EVERY = 20


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one candidate.

    Attributes:
      fingerprint: hash of the resolved spec trees ("" when they could not be
        resolved).
      status: "complete", "cut" or "failed".
      cut_stage: 1 (check), 2 (compile) or 3 (measure) for cut candidates.
      reason: why it was cut or failed; "" when complete.
      value: the objective in seconds (median measured step, or the static
        estimate); None unless complete.
      compile_seconds: lower + compile wall time; 0 when not compiled.
      step_times: every timed repeat, in order.
      memory: per-device bytes: "arguments" (analyzer estimate) and, once
        compiled, XLA's "argument", "output", "temp", "alias" and "total".
      flops: flops per device per step: XLA's count with the matmul flops of
        the loop trips it leaves out added back (see `_cost.loop_aware`); XLA's
        own count when the HLO text could not be read; None before compiling.
      collective_bytes: bytes moved by collectives per device per step.
      cache_hit: the result was reused from an earlier identical fingerprint.
    """

    fingerprint: str
    status: str
    cut_stage: int | None = None
    reason: str = ""
    value: float | None = None
    compile_seconds: float = 0.0
    step_times: tuple[float, ...] = ()
    memory: dict[str, int] = dataclasses.field(default_factory=dict)
    flops: float | None = None
    collective_bytes: float | None = None
    cache_hit: bool = False

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["step_times"] = list(self.step_times)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        data = dict(data)
        data["step_times"] = tuple(data.get("step_times", ()))
        return cls(**data)


@dataclasses.dataclass
class Context:
    """Everything fixed for one study: the step, its arguments, the mesh, limits.

    Attributes:
      step: `step(state, *batch) -> (state, metrics)`, not jitted.
      abstract_args: `(state, *batch)` as ShapeDtypeStructs.
      mesh: a concrete Mesh (compiling needs devices).
      host_args: a function giving fresh host copies of the arguments (needed
        by the measured objective), or None.
      budget: per-device bytes, or None for no memory limit.
      objective: "measured" or "static".
      warmup, repeats: untimed and timed calls per measured candidate.
      compile_timeout: seconds before a compile counts as failed.
      hardware: the model behind the static objective.
      compiles: how many compiles this context has run (for tests and reports).
    """

    step: Callable[..., Any]
    abstract_args: tuple[Any, ...]
    mesh: jax.sharding.Mesh
    host_args: Callable[[], tuple[Any, ...]] | None
    budget: int | None
    objective: str = "measured"
    warmup: int = 2
    repeats: int = 7
    compile_timeout: float = 600.0
    hardware: _cost.HardwareModel | None = None
    compiles: int = 0

    @property
    def analyzer(self) -> ShardingAnalyzer:
        return ShardingAnalyzer(self.mesh)


def fingerprint(specs: Sequence[Any]) -> str:
    """Stable hash of spec trees: same specs, same string, in any process."""
    digest = hashlib.sha256()
    for i, tree in enumerate(specs):
        for path, spec in _tree.leaf_specs(tree):
            digest.update(f"{i}:{path}={_spec.canonical(spec)};".encode())
    return digest.hexdigest()[:16]


def resolve(candidate: Candidate, ctx: Context) -> tuple[tuple[Any, ...] | None, str]:
    """Spec trees of `candidate` for the context's arguments, and their fingerprint.

    Returns `(None, reason)` when a rule refuses the arguments (e.g. a path
    rule whose spec does not divide a dim).
    """
    try:
        specs = candidate.specs(ctx.abstract_args)
    except (ValueError, TypeError) as err:
        return None, f"rules could not be applied: {err}"
    return specs, fingerprint(specs)


def shardings_for(specs: Sequence[Any], mesh: jax.sharding.Mesh) -> tuple[Any, ...]:
    return tuple(
        jax.tree.map(lambda s: NamedSharding(mesh, s), tree,
                     is_leaf=lambda s: isinstance(s, PartitionSpec))
        for tree in specs)


def check(specs: Sequence[Any], fp: str, ctx: Context) -> tuple[Outcome | None, int | None]:
    """Stage 1: `(None, argument bytes per device)` when the specs pass, else
    `(the cut Outcome, bytes or None)`."""
    analyzer = ctx.analyzer
    issues = analyzer.validate_partition_specs(tuple(ctx.abstract_args), tuple(specs))
    if issues:
        more = f" (+{len(issues) - 1} more)" if len(issues) > 1 else ""
        return Outcome(fp, CUT, 1, f"invalid specs: {issues[0]}{more}"), None
    args_bytes = analyzer.estimate_memory_usage(
        tuple(ctx.abstract_args), tuple(specs))["size_per_device"]
    if ctx.budget is not None and args_bytes > ctx.budget:
        return Outcome(
            fp, CUT, 1,
            f"arguments need {args_bytes} bytes per device, over the budget of {ctx.budget}",
            memory={"arguments": args_bytes}), args_bytes
    return None, args_bytes


def jit_step(step: Callable[..., Any], shardings: Sequence[Any], mesh: Any) -> Any:
    """The step jitted with the candidate's shardings; the state is donated and
    comes back with its input sharding so steps can be chained."""
    return jax.jit(
        step,
        in_shardings=tuple(shardings),
        out_shardings=(shardings[0], NamedSharding(mesh, PartitionSpec())),
        donate_argnums=(0,),
    )


def compile_step(specs: Sequence[Any], ctx: Context) -> tuple[Any, float]:
    """Lowers and compiles the step; raises TimeoutError past compile_timeout."""
    shardings = shardings_for(specs, ctx.mesh)
    jitted = jit_step(ctx.step, shardings, ctx.mesh)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["compiled"] = jitted.lower(*ctx.abstract_args).compile()
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    start = time.perf_counter()
    # XLA offers no way to cancel a compile; past the timeout the thread is
    # abandoned (daemon) and the candidate recorded as failed.
    thread = threading.Thread(target=work, daemon=True, name="shardsearch-compile")
    thread.start()
    thread.join(ctx.compile_timeout)
    seconds = time.perf_counter() - start
    ctx.compiles += 1
    if ctx.compiles % CLEAR_CACHES_EVERY == 0:
        # JAX keeps every executable it compiled for a jitted function in its
        # in-process caches; a long study compiles hundreds of distinct ones
        # and runs out of memory (seen: LLVM "Cannot allocate memory", then a
        # segfault, after ~250 gpt:tiny compiles). Executables still referenced
        # by the caller stay valid.
        jax.clear_caches()
    if thread.is_alive():
        raise TimeoutError(f"compile ran past compile_timeout={ctx.compile_timeout} s")
    if "error" in box:
        raise box["error"]
    return box["compiled"], seconds


def xla_memory(compiled: Any) -> dict[str, int]:
    """Per-device bytes from XLA: argument, output, temp, alias and their total.

    The total is argument + output + temp − alias; on CPU the reported "peak"
    is not a peak, so it is not used.
    """
    stats = compiled.memory_analysis()
    out = {
        "argument": int(stats.argument_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
    }
    out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def evaluate(
    specs: Sequence[Any],
    fp: str,
    ctx: Context,
    report: Callable[[int, float], bool] | None = None,
    run: bool = True,
) -> Outcome:
    """Runs stages 1–3 on resolved specs and says what happened.

    Args:
      specs: spec trees for `(state, *batch)`.
      fp: their fingerprint.
      ctx: the study's context.
      report: called after each timed repeat with `(index, seconds)`; when it
        returns True the candidate is cut at stage 3.
      run: False stops a measured candidate that passed stage 2 before it
        runs (complete, with no value): enough to know whether a plan fits.
    """
    cut, args_bytes = check(specs, fp, ctx)
    if cut is not None:
        return cut
    memory = {"arguments": args_bytes}
    try:
        compiled, compile_seconds = compile_step(specs, ctx)
    except Exception as err:  # any compile error is the candidate's, not the study's
        return Outcome(fp, FAILED, None, f"compile failed: {type(err).__name__}: {err}",
                       memory=memory)
    memory.update(xla_memory(compiled))
    flops, bytes_accessed = _cost.cost_numbers(compiled)
    try:
        collectives, hlo_cost = _hlo.parse_hlo(compiled.as_text())
    except ValueError as err:
        # HLO text we cannot read costs the static objective its comm term and
        # its loop trips; a measured candidate needs neither, so only the former fails.
        if ctx.objective == "static":
            return Outcome(fp, FAILED, None, f"cannot read the compiled HLO: {err}",
                           compile_seconds=compile_seconds, memory=memory, flops=flops)
        link_bytes: float | None = None
    else:
        link_bytes = collectives.transferred_bytes()
        flops, bytes_accessed = _cost.loop_aware(flops, bytes_accessed, hlo_cost)
    base = dict(fingerprint=fp, compile_seconds=compile_seconds, memory=memory,
                flops=flops, collective_bytes=link_bytes)
    if ctx.budget is not None and memory["total"] > ctx.budget:
        return Outcome(
            status=CUT, cut_stage=2,
            reason=f"XLA needs {memory['total']} bytes per device (arguments "
                   f"{memory['argument']} + outputs {memory['output']} + temporaries "
                   f"{memory['temp']} - aliased {memory['alias']}), over the budget of "
                   f"{ctx.budget}", **base)
    if ctx.objective == "static":
        hardware = _cost.hardware_for(ctx.mesh.devices.flat[0].platform, ctx.hardware)
        value = hardware.seconds(flops, bytes_accessed, link_bytes)
        return Outcome(status=COMPLETE, value=value, **base)
    if not run:
        return Outcome(status=COMPLETE, **base)
    return measure(compiled, specs, ctx, report, base)


def measure(
    compiled: Any,
    specs: Sequence[Any],
    ctx: Context,
    report: Callable[[int, float], bool] | None,
    base: dict[str, Any],
) -> Outcome:
    """Stage 3: times the compiled step on fresh buffers, state donated."""
    if ctx.host_args is None:
        raise ValueError("the measured objective needs concrete arguments")
    times = time_steps(compiled, specs, ctx, ctx.repeats, report)
    if len(times) < ctx.repeats:
        return Outcome(
            status=CUT, cut_stage=3, step_times=tuple(times),
            reason=f"significantly slower than the best so far after {len(times)} repeats "
                   f"(median {statistics.median(times):.4g} s)", **base)
    return Outcome(status=COMPLETE, value=statistics.median(times), step_times=tuple(times),
                   **base)


def place(specs: Sequence[Any], ctx: Context) -> list[Any]:
    """Fresh device buffers for the arguments, placed with the candidate's specs."""
    return list(jax.device_put(ctx.host_args(), shardings_for(specs, ctx.mesh)))


def time_steps(
    compiled: Any,
    specs: Sequence[Any],
    ctx: Context,
    repeats: int,
    report: Callable[[int, float], bool] | None = None,
) -> list[float]:
    """Runs warm-ups then up to `repeats` timed steps; stops early when `report`
    says so. The state output feeds the next step, as in training."""
    state, *batch = place(specs, ctx)
    for _ in range(ctx.warmup):
        state, _metrics = jax.block_until_ready(compiled(state, *batch))
    times: list[float] = []
    for i in range(repeats):
        start = time.perf_counter()
        state, _metrics = jax.block_until_ready(compiled(state, *batch))
        times.append(time.perf_counter() - start)
        if report is not None and report(i, times[-1]):
            break
    return times
