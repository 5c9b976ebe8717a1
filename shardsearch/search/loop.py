"""optimize(): propose with Optuna, evaluate each candidate, record in the study.

The three steps stay apart so that a multi-process run can have one process
propose and record while every process evaluates the same candidate:
  propose  — `SearchSpace.suggest(trial)` or a warm-start baseline;
  evaluate — `_evaluate.resolve` / `_evaluate.evaluate`, pure in the candidate;
  record   — the fingerprint cache and `study.tell`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optuna

from ..base import activations as _activations
from ..base import mesh as _mesh
from ..base.interrupts import interruptible, interrupts_deferred, raise_if_signalled
from ..base.knobs import Knobs, Setting
from ..base.warnings import ShardsearchWarning, warn_notes
from .evaluation import evaluate as _evaluate
from .evaluation.outcome import Outcome
from .evaluation.stages import COMPLETE, CUT, Stage
from .evaluation.standing import Standing
from .execution import distributed as _distributed
from .execution.lockstep import Lockstep
from .finish import finish
from .result import OptimizeResult
from .setup import SearchSettings, StudySetup, make_context, prepare, start_executor
from .shapes import search_shapes
from .space.baselines import UNPINNED, pinned, start_candidates, tensor_axes
from .space.candidate import (
    UNBUILDABLE,
    Candidate,
    GroupingProbe,
    grouping_probe,
    knob_combinations,
    knob_variants,
    plan_moves,
)
from .space.express import readings, rule_readings
from .study import attrs
from .study.claims import CONFIRM_LEFT, CONFIRMED_ELSEWHERE, CompileClaims, Roster
from .study.identity import IdentityMismatch, bind_study, identity_of, trial_values
from .study.ownership import (
    BaselineClaims,
    Heartbeat,
    fail_stale_trials,
    mark_interrupted,
)
from .study.pruner import SlowerThanBest
from .study.record import (
    TrialRecord,
    leader_notes,
    memory_ratios,
    record_attrs,
    recorded_estimates,
    recorded_leader,
    store_result,
)
from .study.storage import (
    SAMPLER,
    close_storage,
    make_sampler,
    open_study,
    use_compile_cache,
)


def optimize(
    step: Any,
    args: Sequence[Any] | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    settings: SearchSettings | None = None,
    devices: int | None = None,
    axes: Sequence[str] | None = None,
    make_mesh: Callable[[Mapping[str, int]], jax.sharding.Mesh] | None = None,
    **options: Any,
) -> OptimizeResult | None:
    """Searches rule parameters for the fastest sharding of `step` on `mesh`,
    or on the best split of `devices` over `axes`.

    Every option is a field of `SearchSettings`: pass them as keywords
    (`optimize(step, mesh=mesh, n_trials=20)`), or whole (`settings=`), or
    both (the keywords replace the settings' fields).

    Args:
      step: `step(state, *batch) -> (state, metrics)`, or a `Workload` (then
        `args` is taken from it and its expert plans join the warm start).
      args: `(state, *batch)`: arrays, or ShapeDtypeStructs for an objective
        that runs nothing ("static").
      mesh: the concrete mesh to compile and run on; or none, and
      devices, axes: search the mesh's shape too: every split of `devices`
        (default: all of this process's) over the named `axes` that shards
        something, each searched as its own study, the shapes' winners then
        compared (`search.shapes`); the result's `shapes` says what each gave.
      make_mesh: with `axes`, builds the mesh of a shape `{axis: size}`
        (default: this process's first `devices` devices), e.g.
        `lambda shape: shardsearch.target_mesh("tpu-v5p", shape)`.
      settings: a `SearchSettings`; the fields below are its fields.
      n_trials: new trials to run in this call (warm-start baselines included).
      timeout: seconds; the search stops at whichever limit comes first.
      memory_budget: per-device bytes or a string like "16GiB"; default:
        for an objective that runs nothing ("static"), the hardware model's
        `memory_bytes` when it has one (a named chip's memory, e.g.
        "tpu-v5e": 16 GiB); else the device's memory where JAX reports it,
        else no limit.
      objective: "measured" (median step seconds on the mesh), "static"
        (estimated from the compiled executable; nothing runs) or "hybrid"
        (every candidate estimated, only those near the best estimates
        measured; `search.objectives.Hybrid(factor, top_k)` for other
        settings): a name in `search.objectives.OBJECTIVES`, or an
        `Objective`. The study stores its name.
      storage: an Optuna storage URL; default an SQLite file under
        ./.shardsearch/, so a killed run resumes by study name.
      study_name: default derived from the step, mesh, objective and shapes.
      seed: seeds the sampler (and the workload's init).
      warm_start: evaluate replicated, the default rule and the expert plans
        first, so the answer is never worse than the best of them.
      start_from: plan files (`shardsearch export`, `optimize --out`) to
        evaluate right after replicated (with or without `warm_start`),
        labelled `plan:<file name>`: a winner found earlier, by another
        space, or on a smaller model of the same architecture. They count
        toward `n_trials`; a resumed study skips those it has.
      extra_rules: named user rules the search may switch on.
      warmup, repeats: untimed and timed steps per measured candidate.
      confirm_rounds: interleaved re-timing rounds at the end (0 to skip).
      compile_timeout: seconds after which a compile counts as failed.
      hardware: the model behind the objectives that estimate ("static",
        "hybrid"): a `HardwareModel`, e.g. `shardsearch.HARDWARE["tpu-v5e"]`
        or `HardwareModel.load("calibration.json")`; default by platform.
        The study and the plan file's "hardware" section name it.
      compile_cache: a folder for JAX's persistent compilation cache, so a
        resumed study or a re-run compiles its candidates from disk. This sets
        the process-wide `jax_compilation_cache_dir` unless one is already
        set. None leaves JAX's configuration alone. Compiles served from it
        record their (short) real compile seconds.
      quiet: no progress bar.
      isolate: compile and run candidates in a worker process that this one
        supervises (`search.isolate`), so one that crashes, hangs or raises
        fails alone. None (the default): isolated when the step can reach a
        worker (exportable with `jax.export`, or importable), else here with
        an `IsolationWarning`; True: isolated or a ValueError; False: here.
      execute_timeout: seconds an isolated candidate may go without
        finishing a step before its worker is stopped and it fails.
      verbose: print each candidate's XLA log lines (always counted in its
        outcome: `log_count`, `log_first`).
      dcn_axes: the mesh axes that cross hosts (e.g. ("dp",)): the hardware
        model charges collectives over them at the network between hosts,
        the others at the links inside a slice or node.
      distributed: how to run when the mesh spans several JAX processes
        (`search.distributed`: call its `initialize` first thing in every
        process, then `optimize` with the same arguments in each); default
        `Distributed()` there. Process 0 searches and records; the others
        compile and run the same candidates in lockstep and get None back.
        Across processes `isolate` must not be True (None means False).
      space: the families searched: "rules" (the seed rules; a study started
        before logical axes existed resumes only with this), "logical" (one
        logical-axis assignment for state and batch) or "both" (a `family`
        parameter picks one per trial). The step's logical axes are
        discovered once, here; for "both", a step they cannot be discovered
        for is searched with "rules" (with a `LogicalAxesWarning`). The
        default study name gains `/<space>` for "logical" and "both".
      memory_prediction: "cut" (default): stage 1 predicts each candidate's
        bytes per device from the step's jaxpr (`cost.footprint`: arguments
        and live values under its specs and knobs), and once three compiled
        candidates with the same step knobs and batch placement
        (`evaluation.evaluate.prediction_pool`) showed how XLA's total
        compares with the prediction, cuts before compiling those that, scaled by the
        smallest ratio seen, are over the budget (or the chip's memory) by more
        than the square root of the ratios' spread; "record": predict and
        record only (`memory["predicted"]`), so every candidate compiles and
        the prediction can be checked against XLA; "off": no prediction.

    Returns:
      An `OptimizeResult`; None in processes other than 0 of a
      multi-process search.

    Raises:
      ValueError: an unusable mesh, a start plan that cannot be read or was
        found on a mesh with other axis names, arguments the step cannot be
        traced with, a budget below the smallest possible per-device footprint, a bad
        objective, a step whose outputs hold NaN or Inf under the replicated
        plan, a storage that cannot be opened, or a study that searched
        another workload (a raw step: other argument leaves), mesh, objective
        or space (`search.identity`) — all before any trial, and the last two
        before anything is written to the study; with `axes`: bad devices or
        axes, or no split of the devices that shards anything.
      NothingCompleted: no candidate completed (within the budget): no
        winner (with `axes`: on no split).
      KeyboardInterrupt: Ctrl-C (or the CLI's SIGTERM); the running trial is
        first failed with the reason "interrupted" and the storage closed.
    """
    settings = SearchSettings.build(settings, options)
    if mesh is None or devices is not None or axes is not None or make_mesh is not None:
        if mesh is not None:
            raise ValueError("optimize: give mesh= (one shape) or devices=/axes= (search the "
                             "shape), not both")
        if axes is None:
            raise ValueError("optimize: give mesh=, or axes= (with devices=) to search the "
                             "mesh's shape too")
        return search_shapes(step, args, len(jax.devices()) if devices is None else devices,
                             axes, settings, make_mesh, optimize)
    if settings.compile_cache is not None:
        use_compile_cache(settings.compile_cache)
    lockstep = _distributed.settings(settings.distributed, settings.isolate)
    if lockstep is not None:
        settings = dataclasses.replace(settings, isolate=False)
    ctx, workload = make_context(step, args, mesh, settings)
    # A bad file fails before anything runs; a start plan takes the knobs it sets
    # that this search varies.
    starts = start_candidates(settings.start_from, mesh,
                              ctx.knobs if ctx.knobs is not None else ctx.builds,
                              [n for names in ctx.flax_points for n in names if isinstance(n, str)])
    if lockstep is not None:
        # Process 0 runs the search; the others run its jobs until it ends.
        ctx.executor = Lockstep(ctx, lockstep)
        if not ctx.executor.leader:
            with ctx:
                ctx.executor.follow(ctx)
            return None
    # The worker process, if one starts, ends with the search, however it ends.
    with ctx:
        start_executor(ctx)
        setup = prepare(ctx, workload, settings, starts)
        # A step that gives NaN or Inf even under the replicated plan is broken
        # itself, and no trial should run.
        _evaluate.preflight(ctx, setup.reference_specs)
        study, setup = _open(setup)
        runner = _Runner(study, setup)
        # The workers sharing the study: the last one to finish confirms.
        roster = (Roster(study) if ctx.objective.confirms and settings.confirm_rounds
                  else None)
        try:
            with roster or contextlib.nullcontext():
                _search(runner, setup, roster)
                confirmed_by = roster.turn() if roster is not None else None
            runner.add_others()  # what other workers recorded meanwhile
            rounds = (0 if confirmed_by in (CONFIRM_LEFT, CONFIRMED_ELSEWHERE)
                      else settings.confirm_rounds)
            result = finish(setup, study, runner.records, rounds, runner.specs,
                            runner.candidates)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from the CLI: the process is ending
            close_storage(study)
            raise
    result.confirmed_by = confirmed_by
    summary = result.to_json()
    del summary["trials"]  # every trial already carries its own record
    if confirmed_by != CONFIRMED_ELSEWHERE:  # that worker writes the result
        store_result(study, summary)
    return result


def _search(runner: _Runner, setup: StudySetup, roster: Roster | None) -> None:
    """The trials: the baselines in order, then the searched ones.

    When the search chooses the step's knobs, the best baseline's knob
    variants (`knob_variants`: each knob changed alone) run between the two,
    and those of every expert plan tied with it (`variant_bases`): the plans
    people trust, tuned one knob at a time as they would tune them, which
    the sampler's first random trials would rarely reach. Then their
    combinations (`knob_combinations`): the changes that helped alone,
    together, and the ones over the memory limit with a change that saves
    memory. Then, from the best plan so far, each activation point moved
    alone (`plan_moves`: to one axis, to several, kept whole, a tier at a
    time), and the moves that helped, together; again from the best plan
    after them as soon as a tier finds one, and as long as a round does. From
    the second round on, a round first changes each other knob alone (remat,
    microbatches; a tier of its own): the move that made the plan may have
    freed the memory that decided them. They count toward `n_trials`; the sampler has what is left
    (on the seven `published-chip` rows it ran 54 trials: 47 cut, 4 failed,
    3 completed, none faster than the best plan before them).
    """
    settings, knobs = setup.settings, setup.context.knobs
    order = setup.run_order()
    if knobs is None or not settings.warm_start:
        runner.run(order, settings.n_trials, settings.timeout, roster)
        return
    start = time.perf_counter()

    def time_left() -> float | None:
        return (None if settings.timeout is None
                else max(settings.timeout - (time.perf_counter() - start), 0.0))

    first = min(len(order), settings.n_trials)
    runner.run(order, first, settings.timeout, roster)
    mesh = setup.context.mesh
    bases = variant_bases(runner.records, order)
    variants: dict[str, dict[str, Candidate]] = {}
    for base in bases:
        rows, devices = order[base.label].batch_split(setup.context.abstract_args,
                                                      _mesh.axis_sizes(mesh))
        variants[base.label] = knob_variants(order[base.label], knobs, tensor_axes(mesh),
                                             devices, rows)
    left = settings.n_trials - first
    known: dict[str, Candidate] = dict(order)

    def run(candidates: Mapping[str, Candidate]) -> None:
        nonlocal left
        now = min(len(candidates), left)
        if now:
            known.update(candidates)
            runner.run(candidates, now, time_left(), roster)
            left -= now

    for base in bases:
        # A plan's gradient-grouping variants past the one most likely to
        # help only if it did (`GroupingProbe`).
        probe = grouping_probe(variants[base.label])
        held = set(probe.others) if probe else set()
        run({label: c for label, c in variants[base.label].items() if label not in held})
        if probe and _grouping_helped(runner.records, probe):
            run({label: variants[base.label][label] for label in probe.others})
    # Each base's changes that helped, together: first those of the base
    # whose best plan (itself or a variant) is now the fastest.
    for base in sorted(bases, key=lambda b: _best_of(runner.records, b, variants[b.label])):
        if left:
            run(_combinations(runner.records, order[base.label], base, variants[base.label],
                              knobs))
    moved_from: set[str] = set()
    while left:
        # Again from each new best plan, while a round of moves finds one.
        start_of_moves = _incumbent(runner.records, known)
        if start_of_moves is None or start_of_moves.label in moved_from:
            break
        plan = known[start_of_moves.label]
        rows, devices = plan.batch_split(setup.context.abstract_args, _mesh.axis_sizes(mesh))
        # From the second round on, the plan came from a move: its other
        # knobs are tuned again first.
        tiers = plan_moves(plan, knobs, [c.knobs for c in known.values()
                                         if c.same_sharding(plan)],
                           retune=bool(moved_from), batch_rows=rows, batch_devices=devices)
        moved_from.add(start_of_moves.label)
        for moves in tiers:
            if not left:
                break
            run(moves)
            if left:
                run(_moves_together(runner.records, plan, start_of_moves, moves, knobs))
            if _incumbent(runner.records, known).label != start_of_moves.label:
                break  # a better plan: the next round moves from it
    if left:
        runner.run({}, left, time_left(), roster)


# Expert plans within this share of the fastest baseline's value tie with
# it: each gets its knob variants (`variant_bases`).
TIE = 1e-3


def variant_bases(records: Sequence[TrialRecord], order: Mapping[str, Candidate]
                  ) -> list[TrialRecord]:
    """The baselines whose knob variants run: the fastest that completed and
    every expert plan (not `UNPINNED`) that ties with it (within `TIE`),
    fastest first. Which of two tied plans is faster says nothing of which
    tunes better: on the 64B v5p row, pinned FSDP beat FSDP×TP by 7 parts
    per million, and its variants (3 microbatches of its 4 rows per device)
    reached 1.15x the published plan where FSDP×TP's had reached 1.24x.
    When none completed (none fits), the one closest to fitting: the least
    XLA total among those compiled and cut over the memory limit, which a
    person would tune with microbatches or remat before giving up on it (the
    22B v4 row: every expert plan over 32 GiB by 6 GiB). Empty when neither
    exists."""
    fastest = _incumbent(records, order)
    if fastest is not None:
        tied = sorted((r for r in records if r.label in order and r.label not in UNPINNED
                       and r.label != fastest.label and r.outcome.status == COMPLETE
                       and r.outcome.value - fastest.outcome.value
                       <= TIE * abs(fastest.outcome.value)),
                      key=lambda r: r.outcome.value)
        return [fastest, *tied]
    over = [r for r in records if r.label in order and r.outcome.status == CUT
            and r.outcome.cut_stage == Stage.COMPILE and r.outcome.memory.get("total")]
    return [min(over, key=lambda r: r.outcome.memory["total"])] if over else []


def _grouping_helped(records: Sequence[TrialRecord], probe: GroupingProbe) -> bool:
    """Whether `probe`'s variant completed, faster than its sibling or where
    the sibling did not complete."""
    ended = {r.label: r.outcome for r in records if r.label in (probe.label, probe.sibling)}
    tried, sibling = ended.get(probe.label), ended.get(probe.sibling)
    if tried is None or tried.status != COMPLETE:
        return False
    return sibling is None or sibling.status != COMPLETE or tried.value < sibling.value


def _best_of(records: Sequence[TrialRecord], base: TrialRecord,
             variants: Mapping[str, Candidate]) -> float:
    """The best value of `base` and its variants that completed (infinite
    when none did: a base closest to fitting)."""
    ran = [base, *(r for r in records if r.label in variants)]
    values = [r.outcome.value for r in ran if r.outcome.status == COMPLETE]
    return min(values, default=float("inf"))


def _combinations(records: Sequence[TrialRecord], candidate: Candidate, best: TrialRecord,
                  variants: Mapping[str, Candidate], knobs: Knobs) -> dict[str, Candidate]:
    """`knob_combinations` of the best baseline, from how its variants ended.

    A variant has the baseline's specs, which passed, so a variant cut before
    or at compile that its factory did build was cut for memory (its
    arguments, its prediction or XLA's total over the limit)."""
    ended = {r.label: r.outcome for r in records if r.label in variants}
    completed = {_change(knobs, candidate, variants[label]): (o.value, o.memory.get("total"))
                 for label, o in ended.items() if o.status == COMPLETE}
    over = [_change(knobs, candidate, variants[label]) for label, o in ended.items()
            if o.status == CUT and o.cut_stage in (Stage.CHECK, Stage.COMPILE)
            and not o.reason.startswith(UNBUILDABLE)]
    return knob_combinations(candidate, knobs, (best.outcome.value,
                                                best.outcome.memory.get("total")),
                             completed, over)


def _incumbent(records: Sequence[TrialRecord], known: Mapping[str, Candidate]
               ) -> TrialRecord | None:
    """The fastest completed record of a plan in `known` (None: none completed)."""
    done = [r for r in records if r.label in known and r.outcome.status == COMPLETE]
    return min(done, key=lambda r: r.outcome.value, default=None)


def _moves_together(records: Sequence[TrialRecord], plan: Candidate, ran: TrialRecord,
                    moves: Mapping[str, Candidate], knobs: Knobs) -> dict[str, Candidate]:
    """The moves of `plan` (run as `ran`; a tier of `plan_moves`) that were
    faster than it, together (`knob_combinations`, each move as the one
    change it made)."""
    completed = {_change(knobs, plan, moves[r.label]): (r.outcome.value,
                                                        r.outcome.memory.get("total"))
                 for r in records if r.label in moves and r.outcome.status == COMPLETE}
    return knob_combinations(plan, knobs, (ran.outcome.value, ran.outcome.memory.get("total")),
                             completed, ())


def _change(knobs: Knobs, plan: Candidate, variant: Candidate) -> Setting:
    """The knobs `variant` sets otherwise than `plan` (a pinned expert's
    variants share its `act_batch`, which is no change of theirs)."""
    own, moved = knobs.values(plan.knobs), knobs.values(variant.knobs)
    return tuple((n, v) for n, v in moved.items() if own[n] != v)


def _open(setup: StudySetup) -> tuple[optuna.Study, StudySetup]:
    """Opens (or creates) the study, checks that it searched what this run
    searches, and records what `shardsearch export` needs.

    A default-named study that searched the same step with other values (a
    budget, a hardware model, timing settings, another host) is left alone:
    this run opens `<name>~<hash of its values>` instead, so runs that differ
    only there never share trials. A name the user gave is refused then.
    """
    ctx, settings, space = setup.context, setup.settings, setup.space
    scorer, mesh = ctx.objective, ctx.mesh
    pruner = SlowerThanBest() if scorer.prunes_while_timing else optuna.pruners.NopPruner()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    identity = identity_of(setup.workload, ctx.abstract_args, mesh, scorer.name, space.space,
                           trial_values(ctx))
    study = open_study(settings.storage, setup.study_name, make_sampler(settings.seed), pruner)
    # Before any write: a study resumes only the search that started it.
    try:
        bind_study(study, identity)
    except IdentityMismatch:
        if settings.study_name is not None:
            raise
        setup = dataclasses.replace(
            setup, study_name=f"{setup.study_name}~{identity.values_hash()}")
        study = open_study(settings.storage, setup.study_name, make_sampler(settings.seed),
                           pruner)
        bind_study(study, identity)
    fail_stale_trials(study)  # the RUNNING trials of runs that died become "interrupted"
    device = mesh.devices.flat[0]
    hardware = {"platform": device.platform, "device_kind": device.device_kind,
                "device_count": _mesh.device_count(mesh)}
    if scorer.uses_hardware:
        # Which model the estimates came from, and the axes it took as crossing hosts.
        hardware |= {"model": ctx.hardware_model().name, "dcn_axes": list(ctx.dcn_axes)}
    if ctx.target is not None:
        # Compiled by the chip's own compiler, deviceless: for what, by which release.
        hardware["target"] = ctx.target.to_json()
    # What `shardsearch export` needs to rebuild the plan without this process.
    for key, value in {
        attrs.WORKLOAD: setup.workload.name if setup.workload is not None else None,
        attrs.MESH: _mesh.axis_sizes(mesh), attrs.OBJECTIVE: scorer.name,
        attrs.BUDGET: ctx.budget, attrs.SPACE: space.space, attrs.SEED: settings.seed,
        attrs.SAMPLER: SAMPLER, attrs.HARDWARE: hardware,
    }.items():
        study.set_user_attr(key, value)
    study.set_user_attr(attrs.NOTES, list(setup.notes))
    if ctx.flax_points:
        study.set_user_attr(attrs.FLAX_POINTS, [
            [_activations.name_to_json(n) for n in names] for names in ctx.flax_points])
    # A run that dies before finishing must not leave an older run's winner
    # looking current to `shardsearch export`.
    study.set_user_attr(attrs.RESULT, None)
    return study, setup


class TrialTakenWarning(ShardsearchWarning):
    """A trial this run evaluated was closed meanwhile by another run."""


class _Runner:
    """The propose → evaluate → record loop over one study."""

    def __init__(self, study: optuna.Study, setup: StudySetup):
        self.study, self.setup = study, setup
        self.ctx, self.space, self.quiet = setup.context, setup.space, setup.settings.quiet
        self.cache: dict[str, Outcome] = {}
        # What this run evaluated (spec trees by fingerprint, candidates by trial):
        # the finish re-times and returns these instead of rebuilding them from
        # the rules the study stores.
        self.specs: dict[str, tuple[Any, ...]] = {}
        self.candidates: dict[int, Candidate] = {}  # by trial number
        self.records: list[TrialRecord] = []
        self._recording = threading.Lock()
        self.shown: set[str] = set(setup.notes)  # `prepare` has shown the setup's notes
        self._recorded: dict[int, TrialRecord] = {}
        # A fingerprint is compiled once across the workers sharing the study.
        self.claims = CompileClaims(study, wait=2 * self.ctx.compile_timeout)
        for trial in study.get_trials(deepcopy=False):
            record = TrialRecord.from_trial(trial)
            if record is not None:
                self.records.append(record)
                if record.outcome.fingerprint and not record.outcome.cache_hit:
                    self.cache.setdefault(record.outcome.fingerprint, record.outcome)

    def run(self, baselines: Mapping[str, Candidate], n_trials: int,
            timeout: float | None, roster: Roster | None = None) -> None:
        # Baselines this study already has, or another run is running, are skipped.
        claims = BaselineClaims(self.study, list(baselines))
        start = time.perf_counter()
        progress = _progress(n_trials, self.quiet)
        try:
            for _ in range(n_trials):
                if timeout is not None and time.perf_counter() - start > timeout:
                    break
                # Storage work is never cut short by a signal: it is raised
                # while the candidate compiles or runs, or at a check point.
                with interrupts_deferred():
                    if self.claims.shared:
                        # A worker killed mid-trial leaves it RUNNING: the others end it.
                        fail_stale_trials(self.study)
                    self.one(claims, baselines)
                    progress(self.records)
                    if roster is not None:
                        roster.touch()
        finally:
            progress(None)
        if self.claims.shared:
            fail_stale_trials(self.study)

    def add_others(self) -> None:
        """Adds the records other runs made while this one ran (workers sharing
        the study), in trial order."""
        known = {r.number for r in self.records}
        for trial in self.study.get_trials(deepcopy=False):
            record = None if trial.number in known else TrialRecord.from_trial(trial)
            if record is not None:
                self.records.append(record)
        self.records.sort(key=lambda r: r.number)

    def one(self, claims: BaselineClaims, baselines: Mapping[str, Candidate]) -> TrialRecord:
        trial = None
        try:
            # A trial is never left without its owner; signals come through
            # while its candidate is evaluated, or at `record`.
            with interrupts_deferred():
                raise_if_signalled()
                trial, name = claims.ask()
                with Heartbeat(trial) as beat:
                    record = self._one(trial, baselines[name] if name is not None else None)
            beat.check()  # a storage gone for a minute ends the run here, with one line
            return record
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM: close the trial rather than leave it RUNNING.
            if trial is not None:
                try:
                    mark_interrupted(self.study, trial)
                except Exception as err:  # the interrupt must stay one
                    warnings.warn(
                        f"shardsearch: trial {trial.number} could not be marked interrupted "
                        f"({type(err).__name__}: {err}); the next run on the study will",
                        RuntimeWarning, stacklevel=2)
            raise
        except BaseException:
            # An error of ours: close the trial rather than leave it RUNNING
            # (none when asking for it failed: its owner's death ends it).
            # Already closed (recorded, or by a run that took this one for
            # dead): the error that got here is the one to report.
            if trial is not None:
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    self.study.tell(trial, state=optuna.trial.TrialState.FAIL,
                                    skip_if_finished=True)
            raise

    def _one(self, trial: optuna.Trial, baseline: Candidate | None) -> TrialRecord:
        start = time.perf_counter()
        candidate = baseline or self._proposal(trial)                  # propose
        specs, fp = _evaluate.resolve(candidate, self.ctx)              # evaluate
        if baseline is not None and specs is not None:
            self._express(trial, baseline, specs, fp)
        if specs is None:
            outcome = Outcome("", CUT, Stage.CHECK, fp)
        elif fp in self.cache:
            outcome = _reuse(self.cache[fp])
        elif (refused := self._refused(candidate)) is not None:
            outcome = self.cache[fp] = Outcome(fp, CUT, Stage.CHECK, refused)
        elif (other := self.claims.acquire(fp, trial.number)) is not None:
            outcome = _reuse(other)  # another worker evaluated it
            self.cache[fp] = other
        else:
            report = None if baseline else _reporter(trial)
            # From the study, not this process's records: a resumed study and
            # the other processes sharing it count too.
            scales = self.ctx.memory_prediction == "cut" and self.ctx.memory_limit()
            objective = self.ctx.objective
            leads = objective.cuts_behind_leader and report is not None
            trials = (self.study.get_trials(deepcopy=False)
                      if scales or objective.needs_estimates or leads else ())
            leader = recorded_leader(trials) if leads else None
            if leads:
                warn_notes(leader_notes(trials, leader), self.shown)
            standing = Standing(
                recorded_estimates(trials) if objective.needs_estimates else (), leader)
            ratios, borrowed = memory_ratios(trials, candidate.knobs) if scales else ((), False)
            # Recorded by the executor if it ends stuck in this candidate.
            with interruptible(), self.ctx.executor.guard(
                    lambda failed: self.record(trial, candidate, failed, start)):
                outcome = _evaluate.evaluate(specs, fp, self.ctx.with_setting(candidate.knobs),
                                             report, standing=standing, ratios=ratios,
                                             borrowed=borrowed)
            notes = candidate.notes(self.ctx.abstract_args)
            if notes:
                outcome = dataclasses.replace(outcome, notes=notes + outcome.notes)
            self.cache[fp] = outcome
        # Each note once per run, however many candidates meet it.
        warn_notes(outcome.notes, self.shown)
        if specs is not None:
            self.specs.setdefault(fp, specs)
        self.candidates[trial.number] = candidate
        return self.record(trial, candidate, outcome, start)            # record

    def _express(self, trial: optuna.Trial, baseline: Candidate, specs: Sequence[Any],
                 fp: str) -> None:
        """Records on a baseline's trial the space's parameters whose proposal
        compiles the baseline's very program (the same fingerprint), where
        some do (`space.express`): TPE then learns from the baselines too."""
        if not hasattr(trial, "_fixed_params"):
            warn_notes([f"the baselines' parameters are not recorded, so TPE does not "
                        f"learn from them: Optuna {optuna.__version__}'s trials have no "
                        "_fixed_params, through which shardsearch asks a trial for fixed "
                        "values"], self.shown)
            return
        knobs = dict(baseline.knobs)
        for values in itertools.chain(readings(self.space, specs, knobs),
                                      rule_readings(self.space, specs, knobs)):
            try:
                proposal = self._proposal(optuna.trial.FixedTrial(values))
            except ValueError:  # a value the space's blocks refuse
                continue
            if _evaluate.resolve(proposal, self.ctx)[1] == fp:
                # Asked through the trial as a proposal is, with its values fixed.
                trial._fixed_params = values
                self.space.suggest(trial)
                return

    def _proposal(self, trial: optuna.Trial) -> Candidate:
        """The space's candidate for `trial`; where the search does not choose
        `act_batch`, with its activations' batch on its batch split, as the
        expert plans run (`pinned`)."""
        candidate = self.space.suggest(trial)
        if not self.ctx.pins_proposals:
            return candidate
        return pinned(candidate, self.ctx.builds, self.ctx.abstract_args,
                      _mesh.axis_sizes(self.ctx.mesh))

    def _refused(self, candidate: Candidate) -> str | None:
        """Why the step's factory will not build the candidate's knobs (a
        combination it refuses, such as `grad_groups` that does not divide a
        microbatch), or None when it builds."""
        try:
            self.ctx.with_setting(candidate.knobs)
        except (ValueError, TypeError) as err:
            return f"{UNBUILDABLE} {candidate.knobs_text}: {err}"
        return None

    def record(self, trial: optuna.Trial, candidate: Candidate, outcome: Outcome,
               start: float) -> TrialRecord:
        """Stores the trial's record and tells the study how it ended, once:
        the executor's watchdog and this thread may both try (a lockstep peer
        lost while the candidate ran), and the first one records it.

        A trial another run has already closed (it took this run for dead) is
        left as that run wrote it, with a `TrialTakenWarning`; the outcome
        stays in this run's cache, so the candidate is not evaluated again.
        """
        # A signal held or swallowed while the trial ran: it ends as interrupted.
        raise_if_signalled()
        with self._recording:
            if trial.number in self._recorded:
                return self._recorded[trial.number]
            record = TrialRecord(trial.number, candidate.label, dict(trial.params), outcome,
                                 candidate.state_rule.to_config(),
                                 candidate.batch_rule.to_config(), time.perf_counter() - start,
                                 candidate.knobs)
            self._recorded[trial.number] = record
        try:
            for key, value in (record_attrs(record, candidate.readable)
                               | self.ctx.executor.trial_attrs(outcome)).items():
                trial.set_user_attr(key, value)
            # Closed by another run between the writes and here: left as it is.
            if outcome.status == COMPLETE:
                self.study.tell(trial, outcome.value, skip_if_finished=True)
            elif outcome.status == CUT:
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED,
                                skip_if_finished=True)
            else:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL,
                                skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            warnings.warn(TrialTakenWarning(
                f"trial {trial.number} was closed by another run that took this one for "
                f"dead (a storage outage, or a heartbeat that did not land); its outcome "
                f"({outcome.status.value}) is kept in this run only"), stacklevel=2)
            return record
        self.records.append(record)
        return record


def _reuse(outcome: Outcome) -> Outcome:
    return dataclasses.replace(outcome, cache_hit=True, compile_seconds=0.0)


def _reporter(trial: optuna.Trial) -> Callable[[int, float], bool]:
    def report(i: int, seconds: float) -> bool:
        with interrupts_deferred():
            trial.report(seconds, i)
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
        # Counts per stage in pipeline order, e.g. "cut 3/1/0/0"
        # (check/compile/estimate/measure).
        cuts = "/".join(str(sum(r.outcome.cut_stage == s for r in records)) for s in Stage)
        bar.set_postfix_str(
            f"best {min(values) * 1e3:.2f} ms, cut {cuts}" if values else f"cut {cuts}")
        bar.update(1)

    return update


