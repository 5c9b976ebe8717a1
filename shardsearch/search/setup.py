"""What `optimize` does before its first trial, as values: the settings of a
search, the checked context, and the study's setup.

- `SearchSettings`: every option of `optimize`, frozen and checked when built.
- `make_context`: the step, arguments and mesh checked, the evaluation
  `Context` built, with its executor (`search.execution`). Public so
  benchmarks and studies can evaluate hand-picked candidates the same way.
- `StudySetup`: what is fixed for one study once the context exists (the
  space, the baselines, the replicated reference, the study's name), built
  once by `prepare` and carried to `finish`, the result and the benchmarks,
  so none of them re-traces the step or rebuilds the baselines.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ..base import activations as _activations
from ..base import mesh as _mesh
from ..base import tree as _tree
from ..base.knobs import GRAD_GROUPS, Knobs
from ..base.target import Target, target_of
from ..base.units import parse_bytes
from ..base.warnings import ShardsearchWarning, warn_notes
from ..cost.chips import HARDWARE
from ..cost.hardware import HardwareModel
from ..rules.base import ShardingRule
from .evaluation import confirm as _confirm
from .evaluation import evaluate as _evaluate
from .evaluation.context import EXECUTE_TIMEOUT, Context
from .evaluation.objectives import OBJECTIVES, Objective, get_objective
from .execution.distributed import Distributed
from .execution.inprocess import InProcess
from .space.baselines import baseline_candidates, make_space, pin_batch, pin_notes
from .space.candidate import Candidate
from .space.logical import SPACES, group_choices
from .space.searchspace import SearchSpace
from .study.storage import check_study_name

if TYPE_CHECKING:
    from ..workloads import Workload


# What stage 1 does with the memory a candidate's jaxpr predicts
# (`Context.memory_prediction`).
MEMORY_PREDICTIONS = ("cut", "record", "off")


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    """How one search runs: every option of `optimize`, checked when built.

    `optimize(step, mesh=mesh, n_trials=20)` builds one from its keywords;
    `optimize(step, mesh=mesh, settings=s)` takes one whole, and keywords
    given beside it replace its fields (`dataclasses.replace`). The fields
    and their meaning are `optimize`'s arguments of the same names.

    Example:
      >>> s = SearchSettings(n_trials=8, objective="static", dcn_axes=["dp"])
      >>> s.dcn_axes, dataclasses.replace(s, seed=1).seed
      (('dp',), 1)

    Raises:
      ValueError: a field out of range (`n_trials < 0`, `timeout <= 0`, an
        empty study name, an unknown space or memory prediction, `dcn_axes`
        that are not names,
        `execute_timeout <= 0`, negative warmup or confirm rounds, repeats < 1).
    """

    n_trials: int = 40
    timeout: float | None = None
    memory_budget: int | str | None = None
    objective: str | Objective = "measured"
    storage: str | None = None
    study_name: str | None = None
    seed: int = 0
    warm_start: bool = True
    start_from: tuple[str | os.PathLike[str], ...] = ()
    extra_rules: Mapping[str, ShardingRule] | None = None
    warmup: int = 2
    repeats: int = 7
    confirm_rounds: int = 10
    compile_timeout: float = 600.0
    hardware: HardwareModel | str | None = None
    compile_cache: str | os.PathLike[str] | None = None
    quiet: bool = False
    space: str = "both"
    isolate: bool | None = None
    execute_timeout: float = EXECUTE_TIMEOUT
    verbose: bool = False
    dcn_axes: tuple[str, ...] = ()
    distributed: Distributed | None = None
    knobs: bool | tuple[str, ...] | None = None
    memory_prediction: str = "cut"

    def __post_init__(self) -> None:
        if self.n_trials < 0 or (self.timeout is not None and self.timeout <= 0):
            raise ValueError(f"optimize: need n_trials >= 0 and timeout > 0, got "
                             f"n_trials={self.n_trials}, timeout={self.timeout}")
        if self.study_name is not None:
            check_study_name(self.study_name)  # before the default could stand in for ""
        if self.space not in SPACES:
            raise ValueError(f"space={self.space!r}; choose one of {SPACES}")
        if self.memory_prediction not in MEMORY_PREDICTIONS:
            raise ValueError(f"optimize: memory_prediction={self.memory_prediction!r}; choose "
                             f"one of {MEMORY_PREDICTIONS}")
        if not self.execute_timeout > 0:
            raise ValueError(f"optimize: execute_timeout must be a positive number of "
                             f"seconds, got {self.execute_timeout!r}")
        if self.warmup < 0 or self.repeats < 1 or self.confirm_rounds < 0:
            raise ValueError(
                f"optimize: need warmup >= 0, repeats >= 1 and confirm_rounds >= 0, got "
                f"warmup={self.warmup}, repeats={self.repeats}, "
                f"confirm_rounds={self.confirm_rounds}")
        _confirm.check_rounds(self.confirm_rounds, "optimize: confirm_rounds")
        if isinstance(self.hardware, str):
            if self.hardware not in HARDWARE:
                raise ValueError(f"optimize: hardware={self.hardware!r} is not a named chip; "
                                 f"known: {', '.join(HARDWARE)}, or pass a HardwareModel")
            object.__setattr__(self, "hardware", HARDWARE[self.hardware])
        dcn = self.dcn_axes
        if isinstance(dcn, str) or not all(isinstance(a, str) for a in dcn):
            raise ValueError(f"optimize: dcn_axes={dcn!r}; give a sequence of mesh axis "
                             f"names, e.g. ('dp',)")
        # A single path is one plan file, not a sequence of characters.
        starts = self.start_from
        starts = (starts,) if isinstance(starts, str | os.PathLike) else tuple(starts)
        object.__setattr__(self, "start_from", starts)
        object.__setattr__(self, "dcn_axes", tuple(dcn))
        knobs = self.knobs
        if isinstance(knobs, str):
            knobs = tuple(k for k in knobs.split(",") if k)
        if not (knobs is None or isinstance(knobs, bool) or (
                isinstance(knobs, tuple | list) and all(isinstance(k, str) for k in knobs))):
            raise ValueError(f"optimize: knobs={self.knobs!r}; give True (every knob the step "
                             "declares), False, or the names of the knobs to search, e.g. "
                             "('remat', 'microbatches')")
        object.__setattr__(self, "knobs", tuple(knobs) if isinstance(knobs, list) else knobs)

    @classmethod
    def build(cls, settings: SearchSettings | None, options: Mapping[str, Any],
              **defaults: Any) -> SearchSettings:
        """`settings` with `options` replacing its fields, or new settings from
        `defaults` and `options`.

        Raises:
          TypeError: an option that is not a field, as Python says of an
            unknown keyword.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise TypeError(f"optimize() got unexpected keyword argument(s) {unknown}; the "
                            f"settings are {sorted(fields)}")
        if settings is None:
            return cls(**(defaults | dict(options)))
        return dataclasses.replace(settings, **options) if options else settings


@dataclasses.dataclass(frozen=True)
class StudySetup:
    """What is fixed for one study once its context is built.

    Attributes:
      context: the checked step, arguments, mesh, budget and executor.
      workload: the `Workload` searched, or None for a plain step.
      settings: the search's settings.
      space: the search space (its logical axes discovered once, here).
      baselines: every warm-start baseline by label (`baseline_plans`), in
        order: replicated first; whether they run is `settings.warm_start`.
      starts: the start plans (`optimize(start_from=...)`) by label.
      reference_specs: the replicated plan's spec trees on the context's
        arguments: the reference the first steps and the winner's outputs
        are checked against.
      study_name: the study's name (given, or derived from the step, mesh,
        objective, shapes and space).
      notes: what the setup could not read or do (`base.warnings` notes: the
        logical axes' unhandled primitives and merges, plans whose
        activations' batch is left unpinned), shown once by `prepare` and
        stored in the study.
    """

    context: Context
    workload: Workload | None
    settings: SearchSettings
    space: SearchSpace
    baselines: Mapping[str, Candidate]
    starts: Mapping[str, Candidate]
    reference_specs: tuple[Any, ...]
    study_name: str
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The workload's name, or the step function's."""
        if self.workload is not None:
            return self.workload.name
        return getattr(self.context.step, "__name__", "step")

    def run_order(self) -> dict[str, Candidate]:
        """The baselines this search runs, in order: replicated (the reference),
        then the start plans (asked for by name, so they run even when the
        trials end before the experts do), then the rest when warm-starting."""
        if not self.settings.warm_start:
            return dict(self.starts)
        reference = {k: c for k, c in self.baselines.items() if k == "replicated"}
        return reference | dict(self.starts) | dict(self.baselines)

    def local_context(self) -> Context:
        """The context with its compile count reset, evaluating in this process
        (what a benchmark uses to time plans beside the search's winner)."""
        return dataclasses.replace(self.context, executor=InProcess(), compiles=0)


def prepare(ctx: Context, workload: Workload | None, settings: SearchSettings,
            starts: Mapping[str, Candidate]) -> StudySetup:
    """The study's setup on a built context: discovers the logical axes once
    (when the space needs them), builds the baselines and the reference, and
    names the study."""
    abstract_args, mesh = ctx.abstract_args, ctx.mesh
    space = make_space(mesh, abstract_args[0], ctx.budget, settings.extra_rules,
                       space=settings.space, step=ctx.step, args=abstract_args,
                       knobs=ctx.knobs)
    experts = baseline_candidates(workload, mesh, abstract_args, space.logical)
    axis_sizes = _mesh.axis_sizes(mesh)
    baselines = pin_batch(experts, ctx.builds, abstract_args, axis_sizes)
    reference = _evaluate.resolve(baselines["replicated"], ctx)[0]
    label = workload.name if workload is not None else getattr(ctx.step, "__name__", "step")
    name = settings.study_name or (
        study_name(label, mesh, ctx.objective.name, abstract_args)
        + ("" if space.space == "rules" else f"/{space.space}"))
    notes = space.logical.notes() if space.logical is not None else ()
    warn_notes(notes, where=" (the step's logical axes)", stacklevel=3)
    unpinned = pin_notes(experts, ctx.builds, abstract_args, axis_sizes)
    warn_notes(unpinned, where=" (the plans' activations)", stacklevel=3)
    notes = (*notes, *unpinned)
    return StudySetup(ctx, workload, settings, space, baselines, dict(starts), reference, name,
                      notes)


def study_name(label: str, mesh: Any, objective: str, abstract_args: Any) -> str:
    """The default study name: `<label>@<axes>/<objective>/<hash of the shapes>`."""
    from .evaluation.outcome import fingerprint

    shapes = jax.tree.map(lambda x: f"{_tree.leaf_shape(x)}:{_tree.leaf_dtype(x)}",
                          abstract_args)
    axes = _mesh.axes_text(_mesh.axis_sizes(mesh))
    return f"{label}@{axes}/{objective}/{fingerprint((shapes,))[:8]}"


def start_executor(ctx: Context) -> None:
    """Starts the context's executor before the first trial; one that cannot
    start (a worker, when isolation was not forced) gives way to `InProcess`.

    Raises:
      ValueError: a forced worker did not start.
    """
    if not ctx.executor.start():
        ctx.executor = InProcess()


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
    """The budget when none is given: a target's memory (`Context.chip_memory`);
    for an objective that runs nothing, the hardware model's memory (a named
    chip's HBM) when it states one, since the plan is for that chip; else the
    memory JAX reports for the devices at hand."""
    chip = ctx.chip_memory()
    if chip is not None:
        return chip
    if not ctx.objective.needs_host_args:
        try:
            model = ctx.hardware_model()
        except ValueError:  # no model for this platform: the objective says so itself
            model = None
        if model is not None and model.memory_bytes is not None:
            return model.memory_bytes
    return _mesh.device_memory(ctx.mesh)


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


def _check_mesh(mesh: Any) -> tuple[jax.sharding.Mesh, Target | None]:
    """The mesh, and the chip it compiles for when it is a target's."""
    if not isinstance(mesh, jax.sharding.Mesh):
        raise ValueError(
            f"optimize needs a concrete Mesh to compile on, got {type(mesh).__name__}; build "
            "one with shardsearch.create_mesh (simulate devices with use_cpu_devices(n)), or "
            "shardsearch.target_mesh for a chip this machine does not have")
    try:
        target = target_of(mesh)
    except ValueError as err:
        raise ValueError(f"optimize: {err}") from None
    if target is not None:
        return mesh, target
    available = {d.id for d in jax.devices()}
    missing = [d.id for d in mesh.devices.flat if d.id not in available]
    if missing:
        raise ValueError(
            f"the mesh uses devices {missing} that this process does not have "
            f"({len(available)} devices); build the mesh from jax.devices()")
    return mesh, None


def _check_target(target: Target, scorer: Objective, dcn_axes: tuple[str, ...]) -> None:
    if scorer.needs_host_args:
        raise ValueError(
            f"optimize: objective {scorer.name!r} runs the step, and the mesh is {target.chip}'s "
            "compile-only devices, which run nothing; use objective 'static' (each candidate "
            "compiled by the chip's compiler and priced), or a mesh of devices you have")
    if dcn_axes and tuple(dcn_axes) != target.dcn_axes:
        raise ValueError(
            f"optimize: dcn_axes={dcn_axes} but the target mesh was made with dcn_axes="
            f"{target.dcn_axes}; give them to target_mesh only")


def make_context(
    step: Any,
    args: Sequence[Any] | None,
    mesh: jax.sharding.Mesh,
    settings: SearchSettings | None = None,
    **options: Any,
) -> tuple[Context, Any]:
    """Checks a step, its arguments and a mesh, and builds the evaluation context.

    What `optimize` does before its first trial, available on its own to
    evaluate hand-picked candidates (benchmarks, studies) the same way.
    `settings` (or `SearchSettings` fields as keywords) are as for
    `optimize` (the default budget, `hardware` and `dcn_axes` included);
    without `settings`, `isolate` defaults to False here. With a worker the
    context owns a process; `ctx.close()` (or `with ctx:`) stops it.

    Returns:
      `(context, workload)`; workload is None when `step` is a plain function.

    Raises:
      ValueError: as listed for `optimize`.
    """
    from ..workloads import Workload

    settings = SearchSettings.build(settings, options, isolate=False)
    workload = step if isinstance(step, Workload) else None
    by_default = isinstance(step, Knobs)  # a Knobs step's knobs are searched unless told
    declared = step if by_default else (workload.knobs if workload is not None else None)
    if workload is not None:
        step = workload.step
        args = workload.abstract() if args is None else args
    elif isinstance(step, Knobs):
        step = step.step(())
    if args is None or not isinstance(args, tuple | list) or len(args) < 1:
        raise ValueError("optimize: args must be the tuple (state, *batch) the step takes")
    try:
        scorer = get_objective(settings.objective)
    except ValueError as err:
        raise ValueError(f"optimize: {err}") from None
    mesh, target = _check_mesh(mesh)
    if target is not None:
        _check_target(target, scorer, settings.dcn_axes)
    args = tuple(args)
    abstract_args = _as_abstract(args)
    try:
        # The check that it traces, and where it passes named activations.
        found, named = _activations.trace_points(step, abstract_args)
    except Exception as err:
        raise ValueError(
            f"optimize: the step cannot be traced with these arguments: "
            f"{type(err).__name__}: {err}") from None
    dcn_axes = _check_dcn_axes(settings.dcn_axes or (target.dcn_axes if target else ()), mesh)
    points = _activation_choices(found, mesh)
    offered = points if _wants_activations(settings.knobs) else {}
    if _wants_activations(settings.knobs):
        _say_unoffered(found, offered, settings.knobs, mesh)
    if declared is not None:
        groups = group_sizes(mesh)
        declared = declared.narrowed(GRAD_GROUPS, lambda v: v in groups)
    axes = tuple(_mesh.axis_sizes(mesh).items())
    # The step's own knobs and every point's: what the study can build.
    full = (_activations.with_activation_knobs(declared, step, points, axes) if points
            else declared)
    knobs = searched_knobs(full if offered else declared, settings.knobs, by_default,
                           places_points=bool(found) and _wants_activations(settings.knobs))
    knobs = holding_batch(knobs, full)
    builds = buildable(knobs, full, points)
    ctx = Context(step, abstract_args, mesh, None, None, scorer, settings.warmup,
                  settings.repeats, settings.compile_timeout, settings.hardware,
                  executor=InProcess(), execute_timeout=settings.execute_timeout,
                  verbose=settings.verbose, dcn_axes=dcn_axes, target=target,
                  knobs=knobs, builds=builds,
                  steps=builds.step if builds is not None else None,
                  flax_points=tuple(names for names, whole in named.items() if whole),
                  memory_prediction=settings.memory_prediction)
    if scorer.uses_hardware:
        try:
            ctx.hardware_model()
        except ValueError as err:
            raise ValueError(f"optimize: objective {scorer.name!r} estimates with a hardware "
                             f"model: {err}") from None
    budget = (parse_bytes(settings.memory_budget) if settings.memory_budget is not None
              else _default_budget(ctx))
    n_devices = _mesh.device_count(mesh)
    minimum = _minimum_footprint(abstract_args, n_devices)
    if budget is not None and budget < minimum:
        raise ValueError(
            f"optimize: memory_budget={budget} bytes per device is below the smallest "
            f"possible footprint of the arguments, {minimum} bytes (everything split over "
            f"all {n_devices} devices); raise the budget or use more devices")
    host_args = (_host_args(workload, args, settings.seed, scorer) if scorer.needs_host_args
                 else None)
    ctx.host_args, ctx.budget = host_args, budget
    if settings.isolate is not False:
        from .execution.isolate import Isolation

        isolation = Isolation.prepare(ctx, workload, forced=settings.isolate is True)
        if isolation is not None:
            ctx.executor = isolation
    return ctx, workload


def searched_knobs(declared: Knobs | None, chosen: bool | tuple[str, ...] | None,
                   by_default: bool, places_points: bool = False) -> Knobs | None:
    """The knobs a search chooses of those `declared` (a `Knobs` step's, or a
    workload's, with the activation knobs when asked), as `chosen` picks them:
    None searches them when `by_default` (a `Knobs` step) and none of a
    workload's (its defaults are the published setups); True all; names
    those knobs, the others at their defaults. None when nothing is left
    with more than one value. `places_points`: the step names activations,
    the search was asked to place them, and the mesh can split none (else
    `declared` holds their knobs).

    Raises:
      ValueError: knobs asked of a step that declares none, or a name it
        does not declare.
    """
    if chosen is False or (chosen is None and not by_default):
        return None
    if declared is None and places_points:
        raise ValueError(
            f"optimize: knobs={chosen!r}, but the step declares no knobs and the mesh can "
            "split none of its named activations; pass the step as "
            "shardsearch.Knobs(make_step, {'remat': (...), 'microbatches': (...)}) to search "
            "its other settings, or search without knobs")
    if declared is None:
        raise ValueError(
            f"optimize: knobs={chosen!r}, but the step declares no knobs and places no "
            "activations; pass the step as shardsearch.Knobs(make_step, {'remat': (...), "
            "'microbatches': (...)}), its factory and the values each keyword may take, or "
            "name its activations with shardsearch.activation(x, names)")
    try:
        knobs = declared if chosen in (None, True) else declared.only(chosen)
    except ValueError as err:
        raise ValueError(f"optimize: {err}") from None
    return knobs if knobs.searched() else None


def holding_batch(knobs: Knobs | None, full: Knobs | None) -> Knobs | None:
    """The knobs a search chooses, with `act_batch` held at all its values
    (`Knobs.holding`) where it chooses others but not it and the step names
    a batch activation (`full` has the knob): its expert plans and proposals
    then carry their pins (`space.baselines.pin_batch`) through the knob
    rounds, which change each knob of a plan's own setting. `knobs` itself
    otherwise."""
    batch = _activations.BATCH_KNOB
    if knobs is None or not _activations.names_batch(full) or batch in knobs.searched():
        return knobs
    return full.only(knobs.searched()).holding(batch, full.choices[batch])


def buildable(knobs: Knobs | None, full: Knobs | None, points: Mapping[str, Any]
              ) -> Knobs | None:
    """Every knob setting a study builds steps for (`Context.builds`): the
    knobs it searches (`knobs`), every other knob of `full` (the step's own
    and its named points' `act_<name>`) at its default, except the points'
    (`points`), which keep all their values, searched or not: an expert plan
    pins the batch dim of the activations to the batch's axes as its authors
    write it (`space.baselines.pin_batch`). None when the step has neither
    knobs searched nor points.
    """
    if full is None or (knobs is None and not points):
        return None
    searched = set(knobs.searched()) if knobs is not None else set()
    return full.only([n for n in full.choices if n in searched or n in points])


def group_sizes(mesh: jax.sharding.Mesh) -> frozenset[int]:
    """The device counts of the groups of the mesh's axes (of size > 1): the
    `grad_groups` a search offers, those that can be a batch split's devices."""
    sizes = {a: n for a, n in _mesh.axis_sizes(mesh).items() if n > 1}
    return frozenset(math.prod(sizes[a] for a in key.split(","))
                     for key in group_choices(list(sizes)) if key != "-")


def _wants_activations(chosen: bool | tuple[str, ...] | None) -> bool:
    """Whether `knobs=chosen` asks for activation knobs (True, or an `act_` name)."""
    return chosen is True or (isinstance(chosen, tuple) and any(
        n.startswith(_activations.PREFIX) for n in chosen))


def _activation_choices(found: Mapping[str, tuple[int, ...]],
                        mesh: jax.sharding.Mesh) -> dict[str, tuple[str, ...]]:
    """The `act_<name>` knobs for the points `found` (`activations.points`), over
    the mesh's axes of size > 1 (the same groups as a logical axis's choices)."""
    axes = tuple(_mesh.axis_sizes(mesh).items())
    groups = group_choices([a for a, size in axes if size > 1])
    return _activations.activation_choices(found, groups, axes)


def _say_unoffered(found: Mapping[str, tuple[int, ...]], offered: Mapping[str, Any],
                   chosen: Any, mesh: jax.sharding.Mesh) -> None:
    """The points a search asked to place that get no knob, and why: an error
    for one asked by name, a warning for `knobs=True`."""
    axes = ", ".join(f"{a}={n}" for a, n in _mesh.axis_sizes(mesh).items())
    one_device = _mesh.device_count(mesh) == 1
    left = {_activations.PREFIX + name: (
        "its name is not an identifier" if not name.isidentifier() else
        f"the mesh ({axes}) has one device: there is nothing to split it over" if one_device
        else f"no group of the mesh's axes ({axes}) divides its sizes {list(sizes)}")
        for name, sizes in found.items() if _activations.PREFIX + name not in offered}
    asked = [n for n in (chosen if isinstance(chosen, tuple) else ()) if n in left]
    if asked:
        raise ValueError(f"optimize: knobs {asked} cannot be offered: " + "; ".join(
            f"{n}: {left[n]}" for n in asked))
    # On one device (planning remat and microbatches for one chip) no point
    # can be placed whatever the model: only a bad name is worth a warning.
    unplaced = {n: why for n, why in left.items()
                if not (one_device and n.removeprefix(_activations.PREFIX).isidentifier())}
    if chosen is True and unplaced:
        warnings.warn(ShardsearchWarning(
            "optimize: activation points get no knob (XLA places them): " + "; ".join(
                f"{n}: {why}" for n, why in unplaced.items())), stacklevel=4)


def _host_args(workload: Workload | None, args: tuple[Any, ...], seed: int,
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
