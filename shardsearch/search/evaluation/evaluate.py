"""Candidate → Outcome: resolve specs, check, compile, then measure or estimate.

Each stage can end the evaluation, cheapest first:
  1. check   — the analyzer on the abstract arguments: invalid specs, or the
               arguments alone over the per-device budget; then the bytes
               the step's jaxpr keeps live (`cost.footprint`), scaled by what
               the study's compiled candidates showed, over the memory limit.
               Nothing compiles.
  2. compile — XLA's memory analysis (arguments + outputs + temporaries −
               aliased bytes) over the budget. Nothing runs.
  3. measure — timed repeats reported one by one; the caller's `report`
               callback may stop it once the candidate is clearly slower.
Between 2 and 3 an objective that times steps may cut a candidate at
`Stage.ESTIMATE`: its compiled program does clearly more arithmetic than the
study's best trial's and no less of anything else (`standing.Leader.behind`),
or (the "hybrid" objective) its estimate is too far behind the best the study
has recorded to be timed.
A compile that raises or overruns `compile_timeout` is a failed candidate, and
so is a step that raises, or whose outputs hold NaN or Inf after the warm-up
("non-finite loss"). The stages and statuses are defined once, in
`search.stages`. A candidate past stage 2 goes to the context's objective
(`search.objectives`): the measured one runs stage 3, the static one
estimates from the compiled program, the hybrid one estimates and runs stage
3 on the promising.

Stage 1 always runs here, in the study process. Stages 2 and 3 run where the
context's executor says (`search.execution`): here, or in a worker process
that runs this same code (`compile_and_score`), so a candidate that crashes
or hangs takes down only the worker, or in every process of a multi-process
mesh. Either way XLA's log lines of a candidate are caught and counted in its
`Outcome` (`evaluation.logs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ...base.activations import BATCH, BATCH_KNOB, split_setting
from ...base.knobs import setting_text
from ...base.mesh import axis_sizes
from ...base.monitor import create_monitored_function
from ...base.target import uncached
from ...base.warnings import ShardsearchWarning, note
from ...cost import footprint as _footprint
from ...cost.program import ProgramCost, XlaMemory
from ...logical.axes import unhandled_note
from ..space.candidate import Candidate
from . import logs as _logs
from .context import Context, progress
from .outcome import (
    NONFINITE,
    PREDICTED,
    PREDICTION_SAMPLES,
    Outcome,
    fingerprint,
)
from .stages import COMPLETE, CUT, FAILED, Stage, Status
from .standing import NO_STANDING, Standing

CLEAR_CACHES_EVERY = 20


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
      standing: the study as of this trial (`standing.Standing`): its
        recorded estimates, its best trial's program costs.
    """

    fingerprint: str
    specs: tuple[Any, ...]
    compiled: Any
    program: ProgramCost
    compile_seconds: float
    memory: dict[str, int]
    standing: Standing = NO_STANDING

    @property
    def estimates(self) -> tuple[float, ...]:
        """The study's recorded estimates as of this trial, ascending (what the
        "hybrid" objective compares this candidate with)."""
        return self.standing.estimates

    def behind_leader(self) -> str | None:
        """Why this program is clearly slower than the study's best trial's, or
        None (`standing.Leader.behind`; None without a leader)."""
        leader = self.standing.leader
        if leader is None:
            return None
        return leader.behind(self.program.flops, self.program.link_bytes,
                             self.program.bytes_accessed)

    def base(self) -> dict[str, Any]:
        """The `Outcome` fields every outcome from here on shares."""
        return dict(fingerprint=self.fingerprint, compile_seconds=self.compile_seconds,
                    memory=dict(self.memory), flops=self.program.flops,
                    collective_bytes=self.program.link_bytes,
                    bytes_accessed=self.program.bytes_accessed, notes=self.program.notes())

    def outcome(self, status: Status | str, **fields: Any) -> Outcome:
        """An `Outcome` of this candidate, e.g. `outcome(COMPLETE, value=0.012)`."""
        return Outcome(status=status, **self.base(), **fields)


def resolve(candidate: Candidate, ctx: Context) -> tuple[tuple[Any, ...] | None, str]:
    """Spec trees of `candidate` for the context's arguments, and their fingerprint.

    Returns `(None, reason)` when a rule refuses the arguments (e.g. a path
    rule whose spec does not divide a dim).
    """
    try:
        specs = candidate.specs(ctx.abstract_args)
    except (ValueError, TypeError) as err:
        return None, f"rules could not be applied: {err}"
    return specs, fingerprint(specs, candidate.knobs)


def check(specs: Sequence[Any], fp: str, ctx: Context, ratios: Sequence[float] = (),
          borrowed: bool = False) -> tuple[Outcome | None, dict[str, int]]:
    """Stage 1: `(None, memory)` when the specs pass, else `(the cut Outcome,
    memory)`; `memory` holds the argument bytes per device ("arguments") once
    the specs are valid, and the jaxpr's prediction ("predicted", unless the
    context's `memory_prediction` is "off" or the step cannot be traced for it).

    Args:
      ratios: XLA's total over the prediction, for the study's compiled
        candidates of this one's pool (`prediction_pool`,
        `study.record.memory_ratios`). With
        `PREDICTION_SAMPLES` of them or more, a candidate whose prediction times
        the smallest is over the memory limit by more than the square root of
        their spread is cut here (`over_by_prediction`): it would need more
        than the limit even if XLA packed it tighter, relative to the
        prediction, than any candidate it compiled so far, by half as much
        again (in log terms) as they differed.
      borrowed: the ratios are those of every compiled candidate whose
        activations' batch is placed, its pool holding too few
        (`pool_ratios`); the cut's reason says so.
    """
    analyzer = ctx.analyzer
    issues = analyzer.validate_partition_specs(tuple(ctx.abstract_args), tuple(specs))
    if issues:
        more = f" (+{len(issues) - 1} more)" if len(issues) > 1 else ""
        return Outcome(fp, CUT, Stage.CHECK, f"invalid specs: {issues[0]}{more}"), {}
    args_bytes = analyzer.estimate_memory_usage(
        tuple(ctx.abstract_args), tuple(specs))["size_per_device"]
    memory = {"arguments": args_bytes}
    if ctx.budget is not None and args_bytes > ctx.budget:
        return Outcome(
            fp, CUT, Stage.CHECK,
            f"arguments need {args_bytes} bytes per device, over the budget of {ctx.budget}",
            memory=memory), memory
    predicted = predicted_bytes(specs, ctx)
    if predicted is None:
        return None, memory
    memory["predicted"] = predicted
    limit = ctx.memory_limit()
    if (ctx.memory_prediction == "cut" and limit is not None
            and len(ratios) >= PREDICTION_SAMPLES and over_by_prediction(predicted, ratios, limit)):
        scale = min(ratios)
        among = (f"compiled candidates whose activations' batch is placed, fewer than "
                 f"{PREDICTION_SAMPLES} sharing its step knobs" if borrowed else
                 "compiled candidates with its step knobs and batch placement")
        return Outcome(
            fp, CUT, Stage.CHECK,
            f"{PREDICTED} to need {int(predicted * scale)} bytes per device "
            f"(its arguments and the step's live values, {predicted}, times {scale:.2f}: "
            f"the least XLA needed per predicted byte among the study's {len(ratios)} "
            f"{among}), over {_limit_text(ctx, limit)} "
            f"by more than {stage_margin(ratios):.2f}x (the square root of those ratios' "
            "spread)",
            memory=memory), memory
    return None, memory


def over_by_prediction(predicted: int, ratios: Sequence[float], limit: int,
                       margin: float | None = None) -> bool:
    """Stage 1's verdict on a prediction: scaled by the least ratio XLA total /
    prediction seen, it is over the limit times the margin, by default
    `stage_margin(ratios)`: the less alike XLA and the prediction have been,
    the further over it must be.

    Example:
      >>> over_by_prediction(200, (0.5, 1.0, 2.0), 50)    # 100 > 50 * 2
      False
      >>> over_by_prediction(250, (0.5, 1.0, 2.0), 50)    # 125 > 100
      True
    """
    margin = stage_margin(ratios) if margin is None else margin
    return predicted * min(ratios) > limit * margin


def prediction_pool(setting: Iterable[tuple[str, Any]] | Mapping[str, Any]
                    ) -> tuple[tuple[str, Any], ...]:
    """Which compiled candidates' ratios XLA total / prediction scale a
    candidate's prediction (its pool): those with its step knobs (remat,
    microbatches, ...) whose activations' batch is placed (`act_batch` set),
    or left to XLA, as its is. Where the other activation points go does not
    split a pool: the prediction follows a placed point, and keyed by the
    whole setting, the studies of `published` and `cpu-static64-knobs`,
    whose candidates place the points apart, rarely had three compiled
    candidates of one setting, and stage 1 cut none of theirs
    (`benchmarks/results/prediction/pools.md`). Whether the batch is placed
    does: left to XLA, it is kept whole by the prediction where XLA splits it
    (XLA needed 0.55 of a prediction there, 1.2-1.9 beside it).

    Example:
      >>> prediction_pool((("remat", "full"), ("act_mlp", "tp"), ("act_batch", "dp")))
      (('act_batch', True), ('remat', 'full'))
    """
    own, rules = split_setting(tuple(setting.items() if isinstance(setting, Mapping)
                                     else setting))
    return tuple(sorted((*own, (BATCH_KNOB, BATCH in rules))))


def pool_ratios(by_pool: Mapping[tuple[tuple[str, Any], ...], Sequence[float]],
                setting: Iterable[tuple[str, Any]] | Mapping[str, Any]
                ) -> tuple[tuple[float, ...], bool]:
    """The ratios XLA total / prediction that scale the prediction of a
    candidate with knob `setting`, from the compiled candidates' ratios by
    pool (`prediction_pool`), and whether they are borrowed.

    Its own pool's, once it holds `PREDICTION_SAMPLES`. Before that, a
    candidate whose activations' batch is placed borrows the ratios of every
    compiled candidate whose batch is placed, whatever their step knobs: the
    prediction follows remat and microbatches, and the margin widens with
    the spread the borrowed ratios bring. A candidate whose batch is left to
    XLA borrows nothing: XLA may split what the prediction keeps whole.
    Replayed on 36 studies of five suites, stage 1 cut 46 candidates the
    compiler put over the limit with borrowing, 36 without, none that fit
    either way; borrowing for a batch left to XLA too cut one that fit (a
    MaxText 32B candidate predicted at 147.7 GiB where XLA needed 80.6,
    under a 95 GiB budget; `benchmarks/results/prediction/borrowed.md`).

    Example:
      >>> pool_ratios({(("act_batch", True),): (1.2, 1.3, 1.5)},
      ...             (("act_batch", "dp"), ("remat", "full")))
      ((1.2, 1.3, 1.5), True)
    """
    pool = prediction_pool(setting)
    own = tuple(by_pool.get(pool, ()))
    if len(own) >= PREDICTION_SAMPLES or not dict(pool)[BATCH_KNOB]:
        return own, False
    placed = tuple(r for key, values in by_pool.items() if dict(key)[BATCH_KNOB]
                   for r in values)
    return (placed, True) if len(placed) >= PREDICTION_SAMPLES else (own, False)


def stage_margin(ratios: Sequence[float]) -> float:
    """Stage 1's margin over the limit: the square root of the spread of the
    ratios seen (largest over least). Replayed on the studies of four
    suites, the spread itself cut 4 of the 58 candidates XLA found over the
    limit (on cpu-static256 one for which XLA needed 5x its prediction
    widened it past any prediction), its square root 16, neither any that
    fit (`benchmarks/results/prediction/margins.md`).

    Example:
      >>> stage_margin((0.5, 1.0, 2.0))
      2.0
    """
    return math.sqrt(max(ratios) / min(ratios))


def _limit_text(ctx: Context, limit: int) -> str:
    if ctx.budget is not None and limit == ctx.budget:
        return f"the budget of {limit}"
    return f"{ctx.target.chip if ctx.target else 'the chip'}'s memory of {limit}"


def predicted_bytes(specs: Sequence[Any], ctx: Context) -> int | None:
    """The step's predicted bytes per device under `specs` (`cost.footprint`),
    tracing the step once per knob setting; None when the context's
    `memory_prediction` is "off", or when the prediction cannot be made for
    this step (said once per knob setting, with a `ShardsearchWarning`: its
    candidates are then judged by the compiler alone). Primitives the walk has
    no rule for are the outcome's notes (`prediction_notes`)."""
    if ctx.memory_prediction == "off":
        return None
    traced = (ctx.root or ctx).traced
    if ctx.setting not in traced:
        try:
            traced[ctx.setting] = _footprint.trace_program(ctx.step, ctx.abstract_args)
        except Exception as err:  # a step it cannot walk keeps the compiler's word only
            _unpredicted(ctx, err)
            traced[ctx.setting] = None
    program = traced[ctx.setting]
    if program is None:
        return None
    try:
        return _footprint.predict_footprint(program, specs, axis_sizes(ctx.mesh)).total
    except Exception as err:
        _unpredicted(ctx, err)
        traced[ctx.setting] = None
        return None


def prediction_notes(ctx: Context) -> tuple[str, ...]:
    """What the prediction for the context's knob setting could not read, as
    notes (`base.warnings`): the primitives its walk has no rule for, whose
    outputs it may split less than XLA does, and the step's sharding
    constraints that name no PartitionSpec. The search warns of each note
    once (`loop`), the setup's logical axes' notes counting as shown."""
    program = (ctx.root or ctx).traced.get(ctx.setting)
    if program is None:
        return ()
    notes = []
    if unhandled := program.graph.unhandled_names():
        notes.append(unhandled_note(unhandled))
    if unread := program.graph.unread_constraints():
        notes.append(note("unread", f"sharding constraints of the step with no PartitionSpec "
                                    f"({', '.join(unread)}) are not followed by the memory "
                                    "predicted before compiling: the values they constrain "
                                    "take the arguments' axes there (XLA still applies them)"))
    return tuple(notes)


def _unpredicted(ctx: Context, err: BaseException) -> None:
    warnings.warn(
        f"shardsearch: the memory of the step{_setting_words(ctx.setting)} cannot be predicted "
        f"before compiling ({error_line(err)}); its candidates are judged by the compiler "
        "alone (memory_prediction='off' does not try)", ShardsearchWarning, stacklevel=3)


def _setting_words(setting: Sequence[Any]) -> str:
    return f" with {setting_text(setting)}" if setting else ""


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

    @property
    def input_shardings(self) -> Any:
        return self.executable.input_shardings

    def cost_analysis(self) -> Any:
        return self.executable.cost_analysis()

    def as_text(self) -> str:
        return self.executable.as_text()


# What a program compiled for XLA:CPU only to be read is compiled with: LLVM
# at -O0. LLVM runs after XLA's HLO passes and buffer assignment, so the
# optimized HLO the cost model prices, the memory analysis the budget is
# checked against and XLA's cost analysis are the same as at the default
# level (compared in tests/test_stages_objectives.py), for 1.3-1.8x less
# compile time on llama:7b and gpt:1.5b over 64 devices (docs/search.md).
READ_ONLY_CPU_OPTIONS = {"xla_backend_optimization_level": 0}
# And, where XLA:CPU still has them (jaxlib before 0.11), its legacy fusion
# emitters, which generate each fusion's code more cheaply than the default
# ones. They form a few fusions differently, so the HLO text is not the
# default's; on cpu-static64's 16 programs the memory analysis stayed within
# 128 bytes of the default's and the `tpu` model's estimate within 0.13% of
# it, for about 2x less compile time again
# (benchmarks/results/compile-level/emitters-cpu-static64.md).
LEGACY_EMITTERS = {"xla_cpu_use_fusion_emitters": False}


@functools.cache
def _read_only_cpu_options() -> tuple[tuple[str, Any], ...]:
    options = dict(READ_ONLY_CPU_OPTIONS)
    if jax.__version_info__ < (0, 11):
        if _cpu_compiler_accepts(LEGACY_EMITTERS):
            options.update(LEGACY_EMITTERS)
        else:
            warnings.warn(f"shardsearch: XLA:CPU refused {LEGACY_EMITTERS}; programs compiled "
                          "only to be read are compiled with the default fusion emitters, "
                          "about 2x slower", ShardsearchWarning, stacklevel=2)
    return tuple(options.items())


def _cpu_compiler_accepts(options: dict[str, Any]) -> bool:
    """Whether XLA:CPU compiles a one-op program with `options` (a jaxlib
    whose XLA no longer knows an option refuses it with an error)."""
    cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    lowered = jax.jit(lambda x: x + 1).lower(jax.ShapeDtypeStruct((), jnp.float32, sharding=cpu))
    try:
        lowered.compile(options)
    except Exception:  # any refusal means: compile without them
        return False
    return True


def compiler_options(ctx: Context) -> dict[str, Any] | None:
    """XLA options for the context's compiles: `READ_ONLY_CPU_OPTIONS` (and
    `LEGACY_EMITTERS` where this jaxlib has them) when the program is
    compiled for this host's CPU devices by an objective that never runs it
    ("static"), else None (XLA's defaults: a measured step runs the code it
    times, and a chip's compiler has its own levels)."""
    if ctx.objective.needs_host_args or ctx.target is not None:
        return None
    if ctx.mesh.devices.flat[0].platform != "cpu":
        return None
    return dict(_read_only_cpu_options())


def monitored_step(specs: Sequence[Any], ctx: Context,
                   options: dict[str, Any] | None) -> Callable[..., Any]:
    """The step wrapped for timing as a training loop runs it: the state is
    donated and comes back with its input sharding, the metrics replicated;
    compiled with XLA `options` (None: XLA's defaults)."""
    return create_monitored_function(
        ctx.step, tuple(specs), ctx.analyzer, out_specs=(specs[0], PartitionSpec()),
        donate_argnums=(0,), compile_timeout=ctx.compile_timeout, compiler_options=options)


def compile_step(specs: Sequence[Any], ctx: Context) -> tuple[CompiledStep, float]:
    """Lowers and compiles the step on the abstract arguments (nothing is
    allocated); raises TimeoutError past `ctx.compile_timeout`.

    A compile with the read-only options (`compiler_options`) that raises is
    made again at XLA's defaults, with a `ShardsearchWarning`, so that a
    failure of those options alone never fails a candidate; the seconds
    returned are both compiles'."""
    progress(ctx, "compiling")
    options = compiler_options(ctx)
    monitored = monitored_step(specs, ctx, options)
    start = time.perf_counter()
    try:
        with uncached() if ctx.target is not None else contextlib.nullcontext():
            try:
                executable, seconds = monitored.compile(*ctx.abstract_args)
            except Exception as err:
                if options is None or isinstance(err, TimeoutError):
                    raise
                warnings.warn(
                    f"shardsearch: a compile with the read-only options {options} failed "
                    f"({error_line(err)}); this candidate is compiled again at XLA's "
                    "defaults", ShardsearchWarning, stacklevel=2)
                monitored = monitored_step(specs, ctx, None)
                executable, _ = monitored.compile(*ctx.abstract_args)
                seconds = time.perf_counter() - start
    finally:
        ctx.count_compiles()
        if (ctx.root or ctx).compiles % CLEAR_CACHES_EVERY == 0:
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
    standing: Standing = NO_STANDING,
    ratios: Sequence[float] = (),
    borrowed: bool = False,
) -> Outcome:
    """Runs stages 1 and 2 on resolved specs, then the objective; says what happened.

    Stage 1 runs here; stage 2 and the objective run where the context's
    executor runs them (`search.execution`: here, in a worker process, or in
    lockstep across processes), by `compile_and_score`.

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
      standing: the study as of this trial (`standing.Standing`): the
        estimates it has recorded (what the "hybrid" objective compares this
        candidate with) and its best trial's program costs (what a timed
        candidate's program is held against before it runs). They belong to
        this trial, so they travel with it (`CompiledCandidate.standing`).
      ratios: XLA's total over the predicted memory for the study's compiled
        candidates of this one's pool, or `borrowed` from every candidate
        whose activations' batch is placed (`pool_ratios`, `check`), which
        travel with the trial too.
    """
    cut, memory = check(specs, fp, ctx, ratios, borrowed)
    if cut is not None:
        return dataclasses.replace(cut, notes=cut.notes + prediction_notes(ctx))
    outcome, log = ctx.executor.evaluate(ctx, specs, fp, memory, report, run, standing)
    if ctx.verbose:
        _logs.echo(log.text, f"candidate {fp}")
    return dataclasses.replace(outcome, log_count=log.count, log_first=log.first,
                               notes=outcome.notes + prediction_notes(ctx))


def compile_and_score(
    specs: Sequence[Any],
    fp: str,
    ctx: Context,
    memory: dict[str, int],
    report: Callable[[int, float], bool] | None = None,
    run: bool = True,
    standing: Standing = NO_STANDING,
) -> Outcome:
    """Stage 2 and the objective, in whichever process runs the candidate.

    A compile or a step that raises is the candidate's failure, not the
    study's: it comes back as a FAILED outcome with the error.
    """
    memory = dict(memory)
    try:
        compiled, compile_seconds = compile_step(specs, ctx)
    except Exception as err:  # any compile error is the candidate's, not the study's
        refusal = over_chip_memory(err)
        if refusal is not None:
            # The compiler of a chip (deviceless or real) refuses a program
            # over its memory: a verdict on the candidate, like a budget's.
            chip = (ctx.target.chip if ctx.target is not None
                    else ctx.mesh.devices.flat[0].device_kind)
            return Outcome(fp, CUT, Stage.COMPILE, f"over the chip's memory: "
                           f"{chip}'s compiler refused it ({refusal})", memory=memory)
        return Outcome(fp, FAILED, None, f"compile failed: {type(err).__name__}: {err}",
                       memory=memory)
    program = ProgramCost.from_compiled(compiled)
    memory.update(program.memory.to_json())
    candidate = CompiledCandidate(fp, tuple(specs), compiled, program, compile_seconds, memory,
                                  standing)
    chip_memory = ctx.chip_memory()
    if chip_memory is not None and memory["total"] > chip_memory:
        # The GPU compiler only warns about a program over the device's
        # memory; the chip's memory is a limit no budget can raise.
        return candidate.outcome(
            CUT, cut_stage=Stage.COMPILE,
            reason=f"over the chip's memory: {ctx.target.chip}'s compiler needs "
                   f"{_needs(memory)}, over its {chip_memory}")
    if ctx.budget is not None and memory["total"] > ctx.budget:
        return candidate.outcome(CUT, cut_stage=Stage.COMPILE,
                                 reason=f"XLA needs {_needs(memory)}, over the budget of "
                                        f"{ctx.budget}")
    if not run and ctx.objective.needs_host_args:
        return candidate.outcome(COMPLETE)
    try:
        return ctx.objective.score(candidate, ctx, report)
    except Exception as err:  # a step that raises on the devices fails this candidate only
        return candidate.outcome(FAILED, reason=f"step raised while measuring: {error_line(err)}")


def _needs(memory: dict[str, int]) -> str:
    """XLA's memory figures as a compile-stage cut states them."""
    parts = (f"arguments {memory['argument']} + outputs {memory['output']} + temporaries "
             f"{memory['temp']} - aliased {memory['alias']}")
    if memory.get("peak"):
        return (f"{memory['total']} bytes per device at its peak (its memory analysis lists "
                f"{parts})")
    return f"{memory['total']} bytes per device ({parts})"


def over_chip_memory(err: BaseException) -> str | None:
    """The chip compiler's words when it refused a program for not fitting
    the chip's memory (libtpu: `RESOURCE_EXHAUSTED: Ran out of memory on
    HBM ...`), else None.

    Example:
      >>> over_chip_memory(RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM: "
      ...     "temporaries (17.74G) exceed HBM (15.75G).\nmore"))
      'Ran out of memory on HBM: temporaries (17.74G) exceed HBM (15.75G)'
    """
    text = str(err)
    if "RESOURCE_EXHAUSTED" not in text or "memory" not in text.lower():
        return None
    line = next((ln for ln in text.splitlines() if "RESOURCE_EXHAUSTED" in ln), text)
    return line.split("RESOURCE_EXHAUSTED:", 1)[-1].strip().rstrip(".")


def error_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message.

    A message that quotes a Python traceback (a host callback's error, as
    XLA reports it) also gives the traceback's last line: the error itself.

    Example:
      >>> error_line(ValueError("bad shape (2, 4)\nmore"))
      'ValueError: bad shape (2, 4)'
      >>> error_line(RuntimeError("CpuCallback error: Traceback (most recent call "
      ...                         "last):\n  File ...\nValueError: bad shape"))
      'RuntimeError: CpuCallback error: Traceback (most recent call last): … ValueError: bad shape'
    """
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(lines) > 1 and "Traceback (most recent call last)" in str(err):
        text = f"{text} … {lines[-1]}"
    return f"{type(err).__name__}: {text}".rstrip(": ")


class NonFinite(ValueError):
    """The step's outputs hold NaN or Inf (`time_steps` raises it, `measure` records it)."""


def measure(
    compiled: Any,
    specs: Sequence[Any],
    ctx: Context,
    report: Callable[[int, float], bool] | None,
    base: dict[str, Any],
) -> Outcome:
    """Stage 3: times the compiled step on fresh buffers, state donated.

    A candidate whose outputs hold NaN or Inf after the warm-up (or after
    the timed steps) fails with a reason that starts with `NONFINITE`. One
    that `report` stops is cut; its reason counts its steady steps (those
    `time_steps` reports: the warm-ups after the first, then the timed ones).
    """
    if ctx.host_args is None:
        raise ValueError("the measured objective needs concrete arguments")
    warmups: list[float] = []
    try:
        times = time_steps(compiled, specs, ctx, ctx.repeats, report, warmups)
    except NonFinite as err:
        return Outcome(status=FAILED, reason=f"{NONFINITE}: {err}",
                       warmup_times=tuple(warmups), **base)
    if len(times) < ctx.repeats:
        steady = [*warmups[1:], *times]
        return Outcome(
            status=CUT, cut_stage=Stage.MEASURE, step_times=tuple(times),
            warmup_times=tuple(warmups),
            reason=f"significantly slower than the best so far after {len(steady)} steady "
                   f"step{'s' if len(steady) != 1 else ''} (median "
                   f"{statistics.median(steady):.4g} s)", **base)
    return Outcome(status=COMPLETE, value=statistics.median(times), step_times=tuple(times),
                   warmup_times=tuple(warmups), **base)


def place(specs: Sequence[Any], ctx: Context) -> list[Any]:
    """Fresh device buffers for the arguments, placed with the candidate's specs."""
    progress(ctx, "running")
    shardings = tuple(
        jax.tree.map(lambda s: NamedSharding(ctx.mesh, s), tree,
                     is_leaf=lambda s: isinstance(s, PartitionSpec))
        for tree in specs)
    if jax.process_count() > 1:
        # A mesh across processes (`search.distributed`): each places its own
        # shards of the same host arrays, with no cross-process comparison of
        # the values (device_put's, a collective per leaf) for every candidate.
        return list(jax.tree.map(
            lambda x, s: jax.make_array_from_callback(np.shape(x), s,
                                                      lambda i: np.asarray(x)[i]),
            ctx.host_args(), shardings))
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
    warmups: list[float] | None = None,
) -> list[float]:
    """Runs warm-ups then up to `repeats` timed steps through the monitored
    wrapper. The state output feeds the next step, as in training. Each
    warm-up's seconds are appended to `warmups` when given: they are steps
    too, untimed by design (the first also finishes what the runtime does on
    an executable's first run).

    `report(i, seconds)` is told each steady step, numbered from 0: the
    warm-ups after the first, then the timed steps; when it returns True the
    run stops there (with no timed step, if a warm-up stopped it). A steady
    warm-up is a step like a timed one (on cpu-sim8's gpt and llama a median
    1.01-1.03x of the timed steps' median; on mlp's 24-40 ms steps 1.12x),
    so a candidate that the timing cut would stop after its second timed
    step stops a step earlier.

    Raises:
      NonFinite: the outputs hold NaN or Inf after the warm-ups or at the end.
    """
    monitored = compiled.monitored
    args = tuple(place(specs, ctx))
    result = None
    for k in range(ctx.warmup):
        result, metrics = monitored(*args)
        if warmups is not None:
            warmups.append(metrics["execution_time"])
        args = next_step(result, args)
        progress(ctx, "step")
        if k and report is not None and report(k - 1, metrics["execution_time"]):
            return []
    if result is not None:
        check_finite(result, f"after {ctx.warmup} warm-up step(s)")
    steady = max(ctx.warmup - 1, 0)  # the warm-ups reported before the timed steps

    def on_repeat(i: int, metrics: dict[str, Any]) -> bool:
        progress(ctx, "step")
        return report is not None and bool(report(steady + i, metrics["execution_time"]))

    result, timed = monitored.repeat(*args, repeats=repeats, warmup=0, feed=next_step,
                                     on_repeat=on_repeat)
    if timed:
        check_finite(result, f"after {ctx.warmup + len(timed)} step(s)")
    return [m["execution_time"] for m in timed]


def to_host(tree: Any) -> Any:
    """Host copies of a tree of arrays, whole even where they span several
    processes (a multi-process search, `search.distributed`): there every
    process must call it, in the same order, as for any collective."""
    if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree)):
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


@jax.jit
def _all_finite(leaves: list[Any]) -> Any:
    # One small program over every float leaf: the state stays on the devices,
    # only one bool per leaf comes back.
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def check_finite(result: Any, when: str, state: bool = False) -> None:
    """Raises NonFinite naming the first leaf of the step's metrics (and, with
    `state`, of its new state) that holds NaN or Inf.

    Candidates check the metrics only: they come to the host for free, while
    scanning the state on the devices costs a compile per sharding (about a
    tenth of a gpt:tiny candidate's). A state that turned non-finite shows in
    the next step's loss, which the check after the timed steps sees. The
    replicated plan's check before the search scans the state too.

    Example: a step whose loss overflowed raises
    `NonFinite("metrics['loss'] is nan after 2 warm-up step(s)")`.
    """
    pair = isinstance(result, tuple | list) and len(result) == 2
    metrics, new_state = (result[1], result[0]) if pair else (result, None)
    host = jax.device_get(metrics)
    for path, leaf in jax.tree_util.tree_flatten_with_path(host)[0]:
        value = np.asarray(leaf)
        if _inexact(value) and not np.all(np.isfinite(value)):
            where = f"metrics{jax.tree_util.keystr(path)}"
            if value.size == 1:
                raise NonFinite(f"{where} is {float(value.reshape(()))} {when}")
            raise NonFinite(f"{where} holds NaN or Inf {when}")
    if not state or new_state is None:
        return
    found = [(p, x) for p, x in jax.tree_util.tree_flatten_with_path(new_state)[0]
             if _inexact(x)]
    if not found:
        return
    ok = np.asarray(_all_finite([x for _p, x in found]))
    for (path, _leaf), finite in zip(found, ok, strict=True):
        if not finite:
            raise NonFinite(f"state{jax.tree_util.keystr(path)} holds NaN or Inf {when}")


def _inexact(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and bool(jnp.issubdtype(dtype, jnp.inexact))


def preflight(ctx: Context, replicated: Sequence[Any] | None) -> None:
    """What `optimize` does before its first trial, once the context's
    executor has started: runs the replicated plan's first steps.

    Raises:
      ValueError: the step's outputs hold NaN or Inf under the replicated plan.
    """
    problem = nonfinite_under(replicated, ctx)
    if problem is not None:
        raise ValueError(
            f"optimize: the step gives non-finite values under the replicated plan "
            f"({problem}), so the step itself is broken, not a sharding; fix the step or "
            "its arguments before searching")


def nonfinite_under(specs: Sequence[Any] | None, ctx: Context) -> str | None:
    """Runs the warm-up steps under `specs` and says where NaN or Inf appear.

    What `optimize` asks of the replicated plan before searching: a step
    that gives non-finite values even there is broken itself. Returns None
    when the outputs are finite, and also when the plan cannot tell (it does
    not fit the budget, fails to compile or raises: the search records that
    on its own trial). Runs where the context's executor runs jobs.
    """
    if specs is None or not ctx.objective.needs_host_args:
        return None
    return ctx.executor.nonfinite_under(ctx, specs)


def first_steps(specs: Sequence[Any], ctx: Context) -> str | None:
    """`nonfinite_under` in the process that runs the step.

    Raises:
      Exception: whatever compiling or running the step raised.
    """
    cut, _memory = check(specs, "", ctx)
    if cut is not None:
        return None
    compiled, _seconds = compile_step(specs, ctx)
    total = XlaMemory.from_compiled(compiled).total
    if ctx.budget is not None and total > ctx.budget:
        return None
    args = tuple(place(specs, ctx))
    steps = max(ctx.warmup, 1)
    for _ in range(steps):
        result, _metrics = compiled.monitored(*args)
        args = next_step(result, args)
        progress(ctx, "step")
    try:
        check_finite(result, f"after {steps} step(s)", state=True)
    except NonFinite as err:
        return str(err)
    return None
