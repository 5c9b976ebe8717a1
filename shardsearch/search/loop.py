"""optimize(): propose with Optuna, evaluate each candidate, record in the study.

The three steps stay apart so that a multi-process run can have one process
propose and record while every process evaluates the same candidate:
  propose  — `SearchSpace.suggest(trial)` or a warm-start baseline;
  evaluate — `_evaluate.resolve` / `_evaluate.evaluate`, pure in the candidate;
  record   — the fingerprint cache and `study.tell`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optuna

from ..base import mesh as _mesh
from ..base import tree as _tree
from ..base.units import parse_bytes
from ..cost import model as _cost
from ..rules.builtin import (
    AutoShardingRule,
    BatchShardingRule,
    CompositeShardingRule,
    ShardingRule,
    rule_from_config,
)
from . import confirm as _confirm
from . import evaluate as _evaluate
from .evaluate import Context, Outcome
from .record import TrialRecord
from .result import OptimizeResult
from .space import Candidate, SearchSpace

OBJECTIVES = ("measured", "static")
DEFAULT_DIR = Path(".shardsearch")


def default_storage() -> str:
    """An SQLite file under `./.shardsearch/`, created on demand."""
    DEFAULT_DIR.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(DEFAULT_DIR / 'studies.db').resolve()}"


# Baselines whose search time is within this factor of the best are re-timed
# with the finalists.
CONFIRM_WITHIN = 1.5

# The search's sampler is Optuna's TPE with these options on top of its
# defaults (none: `benchmarks/efficiency` replays it against the grouped
# multivariate variant, random and grid sampling on tables of whole spaces
# timed beforehand, and over 20 seeds the grouped variant was no better; see
# `benchmarks/results/efficiency/summary.md`).
SAMPLER_OPTIONS: dict[str, Any] = {}

# Recorded with each study (and in exported files and bench entries), so a
# result says which sampler found it; derived from the options above.
SAMPLER = "TPESampler(" + ", ".join(f"{k}={v!r}" for k, v in SAMPLER_OPTIONS.items()) + ")"


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """The search's sampler (`SAMPLER`), seeded."""
    return optuna.samplers.TPESampler(seed=seed, **SAMPLER_OPTIONS)


def open_study(storage: str | None, study_name: str, sampler: Any = None,
               pruner: Any = None, create: bool = True) -> optuna.Study:
    """Creates or resumes a study; a storage that cannot be opened is a ValueError."""
    url = storage or default_storage()
    try:
        if create:
            return optuna.create_study(
                storage=url, study_name=study_name, sampler=sampler, pruner=pruner,
                direction="minimize", load_if_exists=True)
        return optuna.load_study(storage=url, study_name=study_name, sampler=sampler,
                                 pruner=pruner)
    except KeyError:
        raise ValueError(
            f"no study named {study_name!r} in storage {url!r}; list them with "
            "optuna.get_all_study_summaries or check the name") from None
    except Exception as err:
        if isinstance(err, ValueError) and "study" in str(err).lower():
            raise
        raise ValueError(
            f"cannot open storage {url!r}: {type(err).__name__}: {err}; give an Optuna "
            "storage URL such as sqlite:///path/to/studies.db") from None


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


def _study_name(label: str, mesh: Any, objective: str, abstract_args: Any) -> str:
    fp = _evaluate.fingerprint((_as_specs_of_shapes(abstract_args),))
    axes = ",".join(f"{a}={s}" for a, s in _mesh.axis_sizes(mesh).items())
    return f"{label}@{axes}/{objective}/{fp[:8]}"


def _as_specs_of_shapes(tree: Any) -> Any:
    # A tree of shape strings hashed like specs gives a stable id of the arguments.
    return jax.tree.map(lambda x: f"{_tree.leaf_shape(x)}:{_tree.leaf_dtype(x)}", tree)


def use_compile_cache(folder: str | Path) -> Path:
    """Turns on JAX's persistent compilation cache in `folder`, unless the
    process already has one; returns the folder in use."""
    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path.resolve()))
    # JAX's default threshold (1 s) would skip most small-model compiles.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path


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
    objective: str = "measured",
    seed: int = 0,
    warmup: int = 2,
    repeats: int = 7,
    compile_timeout: float = 600.0,
    hardware: _cost.HardwareModel | None = None,
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
    if objective not in OBJECTIVES:
        raise ValueError(f"optimize: objective={objective!r}; choose one of {OBJECTIVES}")
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
    host_args = _host_args(workload, args, seed) if objective == "measured" else None
    ctx = Context(step, abstract_args, mesh, host_args, budget, objective, warmup, repeats,
                  compile_timeout, hardware)
    return ctx, workload


def optimize(
    step: Any,
    args: Sequence[Any] | None = None,
    *,
    mesh: jax.sharding.Mesh,
    n_trials: int = 40,
    timeout: float | None = None,
    memory_budget: int | str | None = None,
    objective: str = "measured",
    storage: str | None = None,
    study_name: str | None = None,
    seed: int = 0,
    warm_start: bool = True,
    extra_rules: Mapping[str, ShardingRule] | None = None,
    warmup: int = 2,
    repeats: int = 7,
    confirm_rounds: int = 10,
    compile_timeout: float = 600.0,
    hardware: _cost.HardwareModel | None = None,
    compile_cache: str | Path | None = None,
    quiet: bool = False,
) -> OptimizeResult:
    """Searches rule parameters for the fastest sharding of `step` on `mesh`.

    Args:
      step: `step(state, *batch) -> (state, metrics)`, or a `Workload` (then
        `args` is taken from it and its expert plans join the warm start).
      args: `(state, *batch)`: arrays, or ShapeDtypeStructs for objective
        "static".
      mesh: the concrete mesh to compile and run on.
      n_trials: new trials to run in this call (warm-start baselines included).
      timeout: seconds; the search stops at whichever limit comes first.
      memory_budget: per-device bytes or a string like "16GiB"; default the
        device's memory where JAX reports it, else no limit.
      objective: "measured" (median step seconds on the mesh) or "static"
        (estimated from the compiled executable; nothing runs).
      storage: an Optuna storage URL; default an SQLite file under
        ./.shardsearch/, so a killed run resumes by study name.
      study_name: default derived from the step, mesh, objective and shapes.
      seed: seeds the sampler (and the workload's init).
      warm_start: evaluate replicated, the default rule and the expert plans
        first, so the answer is never worse than the best of them.
      extra_rules: named user rules the search may switch on.
      warmup, repeats: untimed and timed steps per measured candidate.
      confirm_rounds: interleaved re-timing rounds at the end (0 to skip).
      compile_timeout: seconds after which a compile counts as failed.
      hardware: the model behind objective "static" (default by platform).
      compile_cache: a folder for JAX's persistent compilation cache, so a
        resumed study or a re-run compiles its candidates from disk. This sets
        the process-wide `jax_compilation_cache_dir` unless one is already
        set. None leaves JAX's configuration alone. Compiles served from it
        record their (short) real compile seconds.
      quiet: no progress bar.

    Returns:
      An `OptimizeResult`.

    Raises:
      ValueError: an unusable mesh, arguments the step cannot be traced with,
        a budget below the smallest possible per-device footprint, a bad
        objective, or a storage that cannot be opened — all before any trial.
    """
    if n_trials < 0 or (timeout is not None and timeout <= 0):
        raise ValueError(f"optimize: need n_trials >= 0 and timeout > 0, got {n_trials=}, "
                         f"{timeout=}")
    if compile_cache is not None:
        use_compile_cache(compile_cache)
    ctx, workload = make_context(
        step, args, mesh, memory_budget=memory_budget, objective=objective, seed=seed,
        warmup=warmup, repeats=repeats, compile_timeout=compile_timeout, hardware=hardware)
    step, abstract_args, budget = ctx.step, ctx.abstract_args, ctx.budget
    n_devices = _mesh.device_count(mesh)

    space = make_space(mesh, abstract_args[0], budget, extra_rules)
    label = workload.name if workload is not None else getattr(step, "__name__", "step")
    name = study_name or _study_name(label, mesh, objective, abstract_args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        pruner = (optuna.pruners.WilcoxonPruner(p_threshold=0.1, n_startup_steps=2)
                  if objective == "measured" else optuna.pruners.NopPruner())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(storage, name, make_sampler(seed), pruner)
    device = mesh.devices.flat[0]
    # What `shardsearch export` needs to rebuild the plan without this process.
    for key, value in {
        "workload": workload.name if workload is not None else None,
        "mesh": _mesh.axis_sizes(mesh), "objective": objective, "budget": budget,
        "seed": seed, "sampler": SAMPLER, "hardware": {"platform": device.platform,
                                   "device_kind": device.device_kind,
                                   "device_count": n_devices},
    }.items():
        study.set_user_attr(key, value)
    # A run that dies before finishing must not leave an older run's winner
    # looking current to `shardsearch export`.
    study.set_user_attr("result", None)

    runner = _Runner(study, ctx, space, quiet)
    baselines = baseline_candidates(workload, mesh) if warm_start else {}
    runner.run(baselines, n_trials, timeout)
    result = _finish(runner, workload, mesh, confirm_rounds)
    summary = result.to_json()
    del summary["trials"]  # every trial already carries its own record
    study.set_user_attr("result", summary)
    return result


def _host_args(workload: Any, args: tuple[Any, ...], seed: int) -> Callable[[], Any]:
    if _is_concrete(args):
        host = jax.device_get(args)
    elif workload is not None:
        host = jax.device_get(tuple(workload.init(seed)))
    else:
        raise ValueError(
            "optimize: objective 'measured' runs the step, so args must be concrete arrays "
            "(or pass a Workload, whose init makes them); use objective='static' for "
            "ShapeDtypeStructs")
    host = jax.tree.map(np.asarray, host)
    return lambda: host


class _Runner:
    """The propose → evaluate → record loop over one study."""

    def __init__(self, study: optuna.Study, ctx: Context, space: SearchSpace, quiet: bool):
        self.study, self.ctx, self.space, self.quiet = study, ctx, space, quiet
        self.cache: dict[str, Outcome] = {}
        self.specs: dict[str, tuple[Any, ...]] = {}
        self.records: list[TrialRecord] = []
        for trial in study.get_trials(deepcopy=False):
            record = TrialRecord.from_trial(trial)
            if record is not None:
                self.records.append(record)
                if record.outcome.fingerprint and not record.outcome.cache_hit:
                    self.cache.setdefault(record.outcome.fingerprint, record.outcome)

    def run(self, baselines: Mapping[str, Candidate], n_trials: int,
            timeout: float | None) -> None:
        done_labels = {r.label for r in self.records}
        queue = [c for name, c in baselines.items() if name not in done_labels]
        start = time.perf_counter()
        progress = _progress(n_trials, self.quiet)
        try:
            for i in range(n_trials):
                if timeout is not None and time.perf_counter() - start > timeout:
                    break
                self.one(queue[i] if i < len(queue) else None)
                progress(self.records)
        finally:
            progress(None)

    def one(self, baseline: Candidate | None) -> TrialRecord:
        trial = self.study.ask()
        try:
            return self._one(trial, baseline)
        except BaseException:
            # Ctrl-C or an error of ours: close the trial rather than leave it
            # RUNNING in the storage forever.
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise

    def _one(self, trial: optuna.Trial, baseline: Candidate | None) -> TrialRecord:
        start = time.perf_counter()
        candidate = baseline or self.space.suggest(trial)              # propose
        specs, fp = _evaluate.resolve(candidate, self.ctx)              # evaluate
        if specs is None:
            outcome = Outcome("", _evaluate.CUT, 1, fp)
        elif fp in self.cache:
            outcome = _reuse(self.cache[fp])
        else:
            report = None if baseline else _reporter(trial)
            outcome = _evaluate.evaluate(specs, fp, self.ctx, report)
            self.cache[fp] = outcome
        if specs is not None:
            self.specs.setdefault(fp, specs)
        return self.record(trial, candidate, outcome, start)            # record

    def record(self, trial: optuna.Trial, candidate: Candidate, outcome: Outcome,
               start: float) -> TrialRecord:
        record = TrialRecord(trial.number, candidate.label, dict(trial.params), outcome,
                             candidate.state_rule.to_config(), candidate.batch_rule.to_config(),
                             time.perf_counter() - start)
        trial.set_user_attr("seconds", record.seconds)
        trial.set_user_attr("label", record.label)
        trial.set_user_attr("outcome", outcome.to_json())
        trial.set_user_attr("state_rule", record.state_rule)
        trial.set_user_attr("batch_rule", record.batch_rule)
        if outcome.status == _evaluate.COMPLETE:
            self.study.tell(trial, outcome.value)
        elif outcome.status == _evaluate.CUT:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.records.append(record)
        return record


def _reuse(outcome: Outcome) -> Outcome:
    return dataclasses.replace(outcome, cache_hit=True, compile_seconds=0.0)


def _reporter(trial: optuna.Trial) -> Callable[[int, float], bool]:
    def report(i: int, seconds: float) -> bool:
        trial.report(seconds, i)
        with warnings.catch_warnings():
            # The Wilcoxon pruner warns while it has too few paired steps.
            warnings.simplefilter("ignore")
            return trial.should_prune()

    return report


def _progress(total: int, quiet: bool) -> Callable[[list[TrialRecord] | None], None]:
    if quiet:
        return lambda records: None
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="shardsearch", unit="trial", leave=False)

    def update(records: list[TrialRecord] | None) -> None:
        if records is None:
            bar.close()
            return
        values = [r.outcome.value for r in records if r.outcome.value is not None]
        cuts = [sum(r.outcome.cut_stage == s for r in records) for s in (1, 2, 3)]
        bar.set_postfix_str(
            f"best {min(values) * 1e3:.2f} ms, cut {cuts[0]}/{cuts[1]}/{cuts[2]}"
            if values else f"cut {cuts[0]}/{cuts[1]}/{cuts[2]}")
        bar.update(1)

    return update


def _finish(runner: _Runner, workload: Any, mesh: Any, rounds: int) -> OptimizeResult:
    ctx, records = runner.ctx, runner.records
    complete = [r for r in records if r.outcome.status == _evaluate.COMPLETE]
    if not complete:
        raise RuntimeError(
            f"no candidate completed in study {runner.study.study_name!r}: "
            + "; ".join(sorted({r.outcome.reason for r in records})[:3])
            + " — raise the budget, n_trials or compile_timeout")
    by_fp: dict[str, TrialRecord] = {}
    for r in sorted(complete, key=lambda r: r.outcome.value):
        by_fp.setdefault(r.outcome.fingerprint, r)
    baselines: dict[str, float] = {}
    for r in complete:
        if r.label != "search":
            baselines.setdefault(r.label, r.outcome.value)
    ranked = list(by_fp.values())
    finalists = ranked[:3]
    base_records = sorted((r for r in complete if r.label != "search"),
                          key=lambda r: r.outcome.value)
    # The best baseline and every other one close to the best time: values
    # from the search were measured minutes apart, and a plan 20% behind
    # there can come out ahead when timed side by side.
    seen = {f.outcome.fingerprint for f in finalists}
    for i, r in enumerate(base_records):
        if r.outcome.fingerprint not in seen and (
                i == 0 or r.outcome.value <= ranked[0].outcome.value * CONFIRM_WITHIN):
            finalists.append(r)
            seen.add(r.outcome.fingerprint)
    for r in finalists:
        runner.specs.setdefault(r.outcome.fingerprint, _respecs(r, mesh, ctx))
    confirmation: dict[str, Any] = {}
    verdict = "unconfirmed"
    winner = finalists[0]
    if ctx.objective == "measured" and rounds > 0 and len(finalists) > 1:
        labelled = [(_name(r), runner.specs[r.outcome.fingerprint]) for r in finalists]
        confirmation = _confirm.retime(labelled, ctx, rounds)
        base_fps = {r.outcome.fingerprint for r in base_records}
        winner, verdict = pick_winner(
            [(r, confirmation[_name(r)].times, r.outcome.fingerprint in base_fps,
              r.outcome.memory.get("total")) for r in finalists])
    best_specs = runner.specs[winner.outcome.fingerprint]
    outputs_match = worst = None
    if ctx.objective == "measured":
        reference = _evaluate.resolve(baseline_candidates(None, mesh)["replicated"], ctx)[0]
        outputs_match, worst = _confirm.compare_outputs(best_specs, reference, ctx)
    best_time = (confirmation[_name(winner)].median if confirmation else winner.outcome.value)
    return OptimizeResult(
        best_rule=rule_from_config(winner.state_rule, mesh),
        best_batch_rule=rule_from_config(winner.batch_rule, mesh),
        best_label=winner.label, best_specs=best_specs, best_time=best_time,
        baselines=baselines, confirmation=confirmation, verdict=verdict,
        outputs_match=outputs_match, max_relative_error=worst, trials=records,
        study=runner.study, objective=ctx.objective, budget=ctx.budget,
        mesh_axes=_mesh.axis_sizes(mesh), compiles=ctx.compiles)


def pick_winner(
    finalists: Sequence[tuple[Any, Sequence[float], bool] | tuple[Any, Sequence[float], bool,
                                                                  int | None]],
) -> tuple[Any, str]:
    """The winner of the interleaved re-timing, and its verdict.

    Args:
      finalists: `(item, paired times, is_baseline[, bytes per device])`; at
        least two, each with the same number of rounds.

    The fastest median wins, except that

    - a searched plan must be significantly faster (one-sided paired
      Wilcoxon, at 5% divided by the number of searched finalists) than the
      fastest baseline among the finalists to take its place: picking the
      lowest of a few noisy medians favours whichever got lucky, and on a tie
      the plan a person already knows is the better answer;
    - when the winner is a baseline, the baselines it is not significantly
      faster than tie with it, and of those the one with the smallest
      per-device memory wins (unknown memory counts as largest): the same
      speed with more headroom, and a choice that does not flip between two
      runs with the noise (data parallel against FSDP on a simulated mesh).

    Verdict: "faster" when the winner is significantly faster than the
    fastest of the others, else "tie".
    """
    order = sorted(finalists, key=lambda f: statistics.median(f[1]))
    winner = order[0]
    base = next((f for f in order if f[2]), None)
    searched = sum(not f[2] for f in finalists)
    # The fastest of several searched plans is tested, so the level is split
    # among them (Bonferroni): the best of three noisy medians beats a
    # baseline at 5% far more often than one plan that is no faster does.
    if not winner[2] and base is not None and not _confirm.faster_than(
            winner[1], base[1], alpha=_confirm.ALPHA / searched):
        winner = base
    if winner[2]:
        tied = [f for f in order if f[2] and (f is winner or not _confirm.faster_than(
            winner[1], f[1]))]
        winner = min(tied, key=_footprint)  # stable: the faster on equal memory
    runner_up = next(f for f in order if f is not winner)
    return winner[0], "faster" if _confirm.faster_than(winner[1], runner_up[1]) else "tie"


def _footprint(finalist: tuple[Any, ...]) -> float:
    memory = finalist[3] if len(finalist) > 3 else None
    return math.inf if memory is None else memory


def _name(record: TrialRecord) -> str:
    return record.label if record.label != "search" else f"trial {record.number}"


def _respecs(record: TrialRecord, mesh: Any, ctx: Context) -> tuple[Any, ...]:
    """Spec trees of a stored trial (a resumed study has only its rules)."""
    candidate = Candidate(rule_from_config(record.state_rule, mesh),
                          rule_from_config(record.batch_rule, mesh), record.label)
    return candidate.specs(ctx.abstract_args)
