"""Candidate → Outcome: resolve specs, check, compile, then measure or estimate.

Each stage can end the evaluation, cheapest first:
  1. check   — the analyzer on the abstract arguments: invalid specs, or the
               arguments alone over the per-device budget. Nothing compiles.
  2. compile — XLA's memory analysis (arguments + outputs + temporaries −
               aliased bytes) over the budget. Nothing runs.
  3. measure — timed repeats reported one by one; the caller's `report`
               callback may stop it once the candidate is clearly slower.
A compile that raises or overruns `compile_timeout` is a failed candidate.
The stages and statuses are defined once, in `search.stages`. A candidate
past stage 2 goes to the context's objective (`search.objectives`): the
measured one runs stage 3, the static one estimates from the compiled program.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..base import spec as _spec
from ..base import tree as _tree
from ..base.analyzer import ShardingAnalyzer
from ..base.monitor import create_monitored_function
from ..cost.hardware import HardwareModel
from ..cost.program import ProgramCost
from .candidate import Candidate
from .stages import COMPLETE, CUT, FAILED, Stage, Status

CLEAR_CACHES_EVERY = 20


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one candidate.

    Attributes:
      fingerprint: hash of the resolved spec trees ("" when they could not be
        resolved).
      status: a `Status`: "complete", "cut" or "failed" (a string given is
        converted).
      cut_stage: the `Stage` that cut the candidate (stored as its int: 1
        check, 2 compile, 3 measure); None unless cut.
      reason: why it was cut or failed; "" when complete.
      value: the objective in seconds (median measured step, or the static
        estimate); None unless complete.
      compile_seconds: lower + compile wall time; 0 when not compiled.
      step_times: every timed repeat, in order.
      memory: per-device bytes: "arguments" (analyzer estimate) and, once
        compiled, XLA's "argument", "output", "temp", "alias" and "total".
      flops: flops per device per step: XLA's count with the matmul flops of
        the loop trips it leaves out added back (`ProgramCost.flops`); XLA's
        own count when the HLO text could not be read; None before compiling.
      collective_bytes: bytes moved by collectives per device per step.
      cache_hit: the result was reused from an earlier identical fingerprint.

    Example:
      >>> Outcome("ab12", "cut", 1, "invalid specs: ...").cut_stage
      <Stage.CHECK: 1>
    """

    fingerprint: str
    status: Status
    cut_stage: Stage | None = None
    reason: str = ""
    value: float | None = None
    compile_seconds: float = 0.0
    step_times: tuple[float, ...] = ()
    memory: dict[str, int] = dataclasses.field(default_factory=dict)
    flops: float | None = None
    collective_bytes: float | None = None
    cache_hit: bool = False

    def __post_init__(self) -> None:
        # Stored outcomes come back with the plain string and int.
        try:
            status = Status(self.status)
            stage = None if self.cut_stage is None else Stage(self.cut_stage)
        except ValueError:
            raise ValueError(
                f"Outcome {self.fingerprint!r}: status={self.status!r}, cut_stage="
                f"{self.cut_stage!r}; the statuses are {tuple(s.value for s in Status)} and "
                f"the stages {tuple(int(s) for s in Stage)}") from None
        if (status == CUT) != (stage is not None):
            raise ValueError(
                f"Outcome {self.fingerprint!r}: status={status.value!r} with cut_stage="
                f"{self.cut_stage!r}; a cut outcome names the stage that cut it, no other does")
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "cut_stage", stage)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        out["cut_stage"] = None if self.cut_stage is None else int(self.cut_stage)
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

    Built by `search.context.make_context`, which checks them.

    Attributes:
      step: `step(state, *batch) -> (state, metrics)`, not jitted.
      abstract_args: `(state, *batch)` as ShapeDtypeStructs.
      mesh: a concrete Mesh (compiling needs devices).
      host_args: a function giving fresh host copies of the arguments (needed
        by objectives that run the step), or None.
      budget: per-device bytes, or None for no memory limit.
      objective: the `search.objectives.Objective` that scores candidates past
        stage 2 (`objective.name` is what studies store).
      warmup, repeats: untimed and timed calls per measured candidate.
      compile_timeout: seconds before a compile counts as failed.
      hardware: the model behind the static objective (default by platform).
      compiles: how many compiles this context has run (for tests and reports).
    """

    step: Callable[..., Any]
    abstract_args: tuple[Any, ...]
    mesh: jax.sharding.Mesh
    host_args: Callable[[], tuple[Any, ...]] | None
    budget: int | None
    # Not annotated with its class: `search.objectives` imports this module
    # (an objective scores with `measure`), so this one cannot import it back.
    objective: Any
    warmup: int = 2
    repeats: int = 7
    compile_timeout: float = 600.0
    hardware: HardwareModel | None = None
    compiles: int = 0

    @property
    def analyzer(self) -> ShardingAnalyzer:
        return ShardingAnalyzer(self.mesh)


@dataclasses.dataclass(frozen=True)
class CompiledCandidate:
    """A candidate that passed stages 1 and 2: what an objective scores.

    Attributes:
      fingerprint: hash of its spec trees.
      specs: the spec trees for `(state, *batch)`.
      compiled: the compiled step (`CompiledStep`), ready to run.
      program: its cost figures, read once (`cost.program.ProgramCost`).
      compile_seconds: lower + compile wall time.
      memory: per-device bytes: the analyzer's "arguments" and XLA's figures.
    """

    fingerprint: str
    specs: tuple[Any, ...]
    compiled: Any
    program: ProgramCost
    compile_seconds: float
    memory: dict[str, int]

    def base(self) -> dict[str, Any]:
        """The `Outcome` fields every outcome from here on shares."""
        return dict(fingerprint=self.fingerprint, compile_seconds=self.compile_seconds,
                    memory=dict(self.memory), flops=self.program.flops,
                    collective_bytes=self.program.link_bytes)

    def outcome(self, status: Status | str, **fields: Any) -> Outcome:
        """An `Outcome` of this candidate, e.g. `outcome(COMPLETE, value=0.012)`."""
        return Outcome(status=status, **self.base(), **fields)


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


def check(specs: Sequence[Any], fp: str, ctx: Context) -> tuple[Outcome | None, int | None]:
    """Stage 1: `(None, argument bytes per device)` when the specs pass, else
    `(the cut Outcome, bytes or None)`."""
    analyzer = ctx.analyzer
    issues = analyzer.validate_partition_specs(tuple(ctx.abstract_args), tuple(specs))
    if issues:
        more = f" (+{len(issues) - 1} more)" if len(issues) > 1 else ""
        return Outcome(fp, CUT, Stage.CHECK, f"invalid specs: {issues[0]}{more}"), None
    args_bytes = analyzer.estimate_memory_usage(
        tuple(ctx.abstract_args), tuple(specs))["size_per_device"]
    if ctx.budget is not None and args_bytes > ctx.budget:
        return Outcome(
            fp, CUT, Stage.CHECK,
            f"arguments need {args_bytes} bytes per device, over the budget of {ctx.budget}",
            memory={"arguments": args_bytes}), args_bytes
    return None, args_bytes


@dataclasses.dataclass(frozen=True)
class CompiledStep:
    """A candidate's step, compiled through the monitored wrapper that times it.

    Stage 2 reads XLA's analyses from `executable`; stage 3 and the
    confirmation call `monitored`, the same `create_monitored_function`
    wrapper a user times a plan with, which already holds `executable`.
    """

    monitored: Callable[..., tuple[Any, dict[str, Any]]]
    executable: Any

    def memory_analysis(self) -> Any:
        return self.executable.memory_analysis()

    def cost_analysis(self) -> Any:
        return self.executable.cost_analysis()

    def as_text(self) -> str:
        return self.executable.as_text()


def monitored_step(specs: Sequence[Any], ctx: Context) -> Callable[..., Any]:
    """The step wrapped for timing as a training loop runs it: the state is
    donated and comes back with its input sharding, the metrics replicated."""
    return create_monitored_function(
        ctx.step, tuple(specs), ctx.analyzer, out_specs=(specs[0], PartitionSpec()),
        donate_argnums=(0,), compile_timeout=ctx.compile_timeout)


def compile_step(specs: Sequence[Any], ctx: Context) -> tuple[CompiledStep, float]:
    """Lowers and compiles the step on the abstract arguments (nothing is
    allocated); raises TimeoutError past `ctx.compile_timeout`."""
    monitored = monitored_step(specs, ctx)
    try:
        executable, seconds = monitored.compile(*ctx.abstract_args)
    finally:
        ctx.compiles += 1
        if ctx.compiles % CLEAR_CACHES_EVERY == 0:
            # JAX keeps every executable it compiled for a jitted function in its
            # in-process caches; a long study compiles hundreds of distinct ones
            # and runs out of memory (seen: LLVM "Cannot allocate memory", then a
            # segfault, after ~250 gpt:tiny compiles). Executables still referenced
            # by the caller stay valid.
            jax.clear_caches()
    return CompiledStep(monitored, executable), seconds


def evaluate(
    specs: Sequence[Any],
    fp: str,
    ctx: Context,
    report: Callable[[int, float], bool] | None = None,
    run: bool = True,
) -> Outcome:
    """Runs stages 1 and 2 on resolved specs, then the objective; says what happened.

    Args:
      specs: spec trees for `(state, *batch)`.
      fp: their fingerprint.
      ctx: the study's context; `ctx.objective.score` gives the outcome of a
        candidate that passes stage 2 (measured: `measure`, static: the
        hardware model's estimate).
      report: called after each timed repeat with `(index, seconds)`; when it
        returns True the candidate is cut at stage 3.
      run: False stops a candidate that passed stage 2 before an objective
        that runs the step runs it (complete, with no value): enough to know
        whether a plan fits. Objectives that run nothing still score it.
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
    program = ProgramCost.from_compiled(compiled)
    memory.update(program.memory.to_json())
    candidate = CompiledCandidate(fp, tuple(specs), compiled, program, compile_seconds, memory)
    if ctx.budget is not None and memory["total"] > ctx.budget:
        return candidate.outcome(
            CUT, cut_stage=Stage.COMPILE,
            reason=f"XLA needs {memory['total']} bytes per device (arguments "
                   f"{memory['argument']} + outputs {memory['output']} + temporaries "
                   f"{memory['temp']} - aliased {memory['alias']}), over the budget of "
                   f"{ctx.budget}")
    if not run and ctx.objective.needs_host_args:
        return candidate.outcome(COMPLETE)
    return ctx.objective.score(candidate, ctx, report)


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
            status=CUT, cut_stage=Stage.MEASURE, step_times=tuple(times),
            reason=f"significantly slower than the best so far after {len(times)} repeats "
                   f"(median {statistics.median(times):.4g} s)", **base)
    return Outcome(status=COMPLETE, value=statistics.median(times), step_times=tuple(times),
                   **base)


def place(specs: Sequence[Any], ctx: Context) -> list[Any]:
    """Fresh device buffers for the arguments, placed with the candidate's specs."""
    shardings = tuple(
        jax.tree.map(lambda s: NamedSharding(ctx.mesh, s), tree,
                     is_leaf=lambda s: isinstance(s, PartitionSpec))
        for tree in specs)
    return list(jax.device_put(ctx.host_args(), shardings))


def next_step(result: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A train step's next arguments: the new state, the same batch."""
    return (result[0], *args[1:])


def time_steps(
    compiled: CompiledStep,
    specs: Sequence[Any],
    ctx: Context,
    repeats: int,
    report: Callable[[int, float], bool] | None = None,
) -> list[float]:
    """Runs warm-ups then up to `repeats` timed steps through the monitored
    wrapper; stops early when `report` says so. The state output feeds the
    next step, as in training."""
    def on_repeat(i: int, metrics: dict[str, Any]) -> bool:
        return report is not None and bool(report(i, metrics["execution_time"]))

    _result, timed = compiled.monitored.repeat(
        *place(specs, ctx), repeats=repeats, warmup=ctx.warmup, feed=next_step,
        on_repeat=on_repeat)
    return [m["execution_time"] for m in timed]
