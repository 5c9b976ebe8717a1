"""The candidates every search starts from: replicated, the default rule, the
expert plans, start plans from files, and the space over the state tree.

`make_space` discovers the step's logical axes once per study when the space
needs them; `baseline_plans` says which experts apply and why the others do not.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ...base import mesh as _mesh
from ...base import spec as _spec
from ...base import tree as _tree
from ...base.activations import BATCH_KNOB, PREFIX, names_batch
from ...base.knobs import Knobs
from ...base.warnings import ShardsearchWarning, note
from ...logical.axes import LogicalAxes
from ...plan.reader import load_start
from ...rules.auto import AutoShardingRule
from ...rules.base import ShardingRule
from ...rules.batch import BatchShardingRule
from ...rules.composite import CompositeShardingRule
from ...rules.optimizer import has_optimizer_state
from .candidate import Candidate
from .logical import SPACES, batch_axis_names, split_rules
from .searchspace import SearchSpace

if TYPE_CHECKING:
    from ...workloads import Workload


def baseline_candidates(
    workload: Workload | None, mesh: Any, args: Sequence[Any] | None = None,
    logical: LogicalAxes | None = None,
) -> dict[str, Candidate]:
    """The warm-start baselines: `baseline_plans(...)`'s candidates."""
    return baseline_plans(workload, mesh, args, logical)[0]


def baseline_plans(
    workload: Workload | None, mesh: Any, args: Sequence[Any] | None = None,
    logical: LogicalAxes | None = None,
) -> tuple[dict[str, Candidate], dict[str, str]]:
    """The baselines every search starts from, and why the others do not apply.

    - `replicated`, and `default` (the original design's one AutoShardingRule
      on every argument): always.
    - A `Workload`'s expert plans (`workloads.expert_plans`: dp, fsdp,
      megatron, fsdp_tp, ep where they apply).
    - A plain step (no workload) with its `args` (`(state, *batch)`): `dp`
      (batch over all axes, state replicated) and `fsdp` (every state leaf on
      its largest dim divisible by all axes, the batch too), built by the same
      code as the workloads' versions.
    - With `logical` axes and a tensor-like mesh axis (named tp, tensor,
      model or mp, as `MeshRoles.from_mesh` reads them): `logical_megatron`
      (built by the function of that name).

    Returns:
      `(candidates, skipped)`: baselines by label, in that order, and a
      one-line reason for each baseline that does not apply.

    Example:
      >>> baseline_plans(None, mesh, (state, batch))[0].keys()
      dict_keys(['replicated', 'default', 'dp', 'fsdp'])
    """
    out = {
        "replicated": Candidate(CompositeShardingRule(), BatchShardingRule(()), "replicated"),
        # The original design applied one AutoShardingRule to every argument.
        "default": Candidate(AutoShardingRule(mesh), AutoShardingRule(mesh), "default"),
    }
    skipped: dict[str, str] = {}
    if workload is not None:
        from ...workloads import expert_plans

        plans = expert_plans(workload, mesh)
        skipped.update(plans.skipped)
        for name, plan in plans.plans.items():
            if name in out:
                continue
            out[name] = Candidate(plan.state_rule, plan.batch_rule, name)
    elif args is not None:
        from ...workloads import PlanNotApplicable, expert_plan

        as_workload = _plain_workload(tuple(args))
        for name in PLAIN_PLANS:
            try:
                plan = expert_plan(as_workload, mesh, name)
            except PlanNotApplicable as err:
                skipped[name] = str(err)
                continue
            out[name] = Candidate(plan.state_rule, plan.batch_rule, name)
    if logical is not None:
        try:
            out[LOGICAL_MEGATRON] = logical_megatron(mesh, logical)
        except ValueError as err:
            skipped[LOGICAL_MEGATRON] = str(err)
    return out, skipped


# The baselines that are no expert's plan, and so are not pinned.
UNPINNED = ("replicated", "default")


def pin_batch(baselines: Mapping[str, Candidate], builds: Knobs | None,
              args: Sequence[Any], axis_sizes: Mapping[str, int]) -> dict[str, Candidate]:
    """The expert plans as their authors write them: each with the batch dim
    of the step's named activations (`act_batch`) on the mesh axes that split
    its batch, as MaxText's `activation_batch` rule or a
    `with_sharding_constraint` on the residual stream does.

    Given only its arguments' specs, XLA's propagation may take those axes
    from the batch: at an embedding lookup whose table and tokens ask for the
    same axes it gives them to the larger table, and the activations after it
    hold the whole batch on every device (gpt:1.5b's FSDP on 64 CPU devices:
    27.6 GiB per device and 33x the estimate, against 1.7 GiB pinned). An
    expert plan that only XLA's propagation places would be a baseline no
    expert runs.

    Args:
      baselines: by label (`baseline_candidates`).
      builds: every setting the study builds (`Context.builds`).
      args: `(state, *batch)`, abstract.
      axis_sizes: the mesh's axes.

    Returns:
      The baselines, those pinned with `knobs` set. A plan is left as it is
      when the step names no batch activation, the plan does not split the
      batch, or no `act_batch` value is that split (its axes in that order).
    """
    if not names_batch(builds):
        return dict(baselines)
    return {label: candidate if label in UNPINNED else pinned(candidate, builds, args,
                                                              axis_sizes)
            for label, candidate in baselines.items()}


def pin_notes(baselines: Mapping[str, Candidate], builds: Knobs | None,
              args: Sequence[Any], axis_sizes: Mapping[str, int]) -> tuple[str, ...]:
    """What `pin_batch` left to XLA's propagation, for a step that names a
    batch activation: each expert plan whose batch is split over axes no
    `act_batch` value names, in one `"unpinned: ..."` note
    (`base.warnings.UnpinnedBatchWarning`); `()` when there is none.

    Example:
      an `act_batch` without `"dp,tp"` on a dp=2,tp=4 mesh →
      `("unpinned: no act_batch value names the batch split of dp (batch over dp,tp), ...",)`
    """
    if not names_batch(builds):
        return ()
    values = builds.choices[BATCH_KNOB]
    left = []
    for label, candidate in baselines.items():
        split = _batch_split(candidate, args, axis_sizes)
        if label not in UNPINNED and split and split not in values:
            left.append(f"{label} (batch over {split})")
    if not left:
        return ()
    return (note("unpinned", (
        f"no {BATCH_KNOB} value names the batch split of {', '.join(left)}: its activations' "
        f"batch is left to XLA's propagation ({BATCH_KNOB} offers {', '.join(values)}: the "
        "groups of mesh axes that divide the batch of every named activation)")),)


def pinned(candidate: Candidate, builds: Knobs | None, args: Sequence[Any],
           axis_sizes: Mapping[str, int]) -> Candidate:
    """`candidate` with `act_batch` on the mesh axes that split its batch
    (`pin_batch`); itself when the step names no batch activation
    (`builds` declares no `act_batch`), the batch is not split, or no
    `act_batch` value is that split. A search that does not choose
    `act_batch` pins its proposals so too (`loop._Runner._proposal`): left to XLA, a proposal's
    program could hold the whole batch where stage 1's prediction and the
    experts keep it split (on cpu-static64's 16 GiB entries 49-70% of trial
    time went to candidates XLA then cut for memory; pinned, 19-26%)."""
    if not names_batch(builds):
        return candidate
    value = _batch_split(candidate, args, axis_sizes)
    if not value or value not in builds.choices[BATCH_KNOB]:
        return candidate
    return dataclasses.replace(candidate,
                               knobs=builds.setting({**dict(candidate.knobs), BATCH_KNOB: value}))


def _batch_split(candidate: Candidate, args: Sequence[Any], axis_sizes: Mapping[str, int]
                 ) -> str:
    """The mesh axes that split `candidate`'s batch, as an `act_batch` value
    names them (`"dp,tp"`; axes of size 1 left out); `""` when none do."""
    return ",".join(a for a in candidate.batch_axes(args)[1] if axis_sizes.get(a, 1) > 1)


# A start plan's label: this prefix, then its file's name without ".json".
START_PREFIX = "plan:"


def start_candidates(paths: Sequence[str | os.PathLike[str]], mesh: Any,
                     knobs: Knobs | None = None, flax_names: Sequence[str] = ()
                     ) -> dict[str, Candidate]:
    """Plan files (`shardsearch export`, `optimize --out`) as candidates to start from.

    Each file's state and batch rules (`plan.reader.load_start`: a plan file,
    a logical-axis-rules or flax-rules file with the batch's names, or a
    MaxText-style rules list), bound to `mesh` (same axis names; sizes may
    differ), labelled `plan:<file name without .json>`, with the knobs it
    sets that the search varies (`knobs`): a plan file's own, and the pairs
    of a rules list that name the step's Flax constraints (`act_<name>`: Flax
    places them by the same rules). A search
    evaluates them beside the baselines, so its answer is never worse than
    the best of them: a plan found earlier, by another space, on a smaller
    model of the same architecture, or the rules an expert wrote.

    Args:
      paths: the files.
      mesh: the search's mesh.
      knobs: the knobs the search varies (`Context.knobs`), or None.
      flax_names: the names of the step's Flax constraints (`Context.flax_points`).

    Warns:
      StartPlanWarning: naming the file, a plan file's knobs the search does
        not vary (or a value it does not offer), and a rules list's pairs for
        the step's Flax constraints the search does not place so (the plan
        then runs without them).

    Raises:
      ValueError: naming the file: it cannot be read, is not a plan file (or a
        logical-axis-rules file without the batch's names), was found on a
        mesh with other axis names, or two files give one label.

    Example:
      >>> start_candidates(["rules/cpu-sim8/gpt-small-dp8.json"], mesh).keys()
      dict_keys(['plan:gpt-small-dp8'])
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]  # one file, not its characters
    out: dict[str, Candidate] = {}
    for path in paths:
        name = Path(path).name.removesuffix(".json")
        label = START_PREFIX + name
        if label in out:
            raise ValueError(
                f"start plan {str(path)!r}: a second file named {name!r} (labels come from "
                "file names); rename one of them")
        try:
            state_rule, batch_rule, own, pairs = load_start(path, mesh)
        except OSError as err:
            raise ValueError(f"start plan {str(path)!r}: cannot read it "
                             f"({err.strerror or err}); give an existing plan file") from None
        except ValueError as err:
            raise ValueError(f"start plan: {err}") from None
        setting = _start_setting(str(path), knobs, own, pairs, flax_names)
        out[label] = Candidate(state_rule, batch_rule, label, knobs=setting)
    return out


class StartPlanWarning(ShardsearchWarning):
    """A start plan runs without some of what its file sets."""


def _start_setting(path: str, knobs: Knobs | None, own: Mapping[str, Any],
                   pairs: Mapping[str, str], flax_names: Sequence[str]) -> tuple[Any, ...]:
    """The knob setting a start plan runs with: its file's knobs that `knobs`
    declares with that value; a rules list's pairs for the step's Flax
    constraints likewise (its other pairs are the parameters'). What is left
    out, warned."""
    declared = knobs.choices if knobs is not None else {}
    offered = {n: v for n, v in pairs.items() if n[len(PREFIX):] in flax_names}
    take, left = {}, []
    for name, value in [*own.items(), *offered.items()]:
        if name in take:
            continue
        if name in declared and value in declared[name]:
            take[name] = value
        else:
            left.append(f"{name}={value}")
    if left:
        varied = ", ".join(f"{n} {list(c)}" for n, c in declared.items()) or "none"
        warnings.warn(StartPlanWarning(
            f"start plan {path!r}: runs without {', '.join(left)}, which this search does not "
            f"vary with that value (its knobs: {varied}); search them (knobs=True or "
            "knobs=[names], --knobs) to start from them"), stacklevel=4)
    return knobs.setting(take) if knobs is not None else ()


# The expert plans that need no names: they apply to any step.
PLAIN_PLANS = ("dp", "fsdp")
LOGICAL_MEGATRON = "logical_megatron"
# Axis names MeshRoles.from_mesh reads as tensor axes (workloads/_plans.py).
TENSOR_NAMES = ("tp", "tensor", "model", "mp")


def _plain_workload(args: tuple[Any, ...]) -> Any:
    """A plain step's arguments as a `Workload`, for the expert plans' builders.

    Several batch arguments travel as one tuple: the plans treat every batch
    leaf alike. The step and init are never called.
    """
    from ...workloads import Workload

    state, *batch = args
    batch_tree = batch[0] if len(batch) == 1 else tuple(batch)

    def never(*_: Any) -> Any:
        raise RuntimeError("the baselines only read the arguments' shapes")

    return Workload("step", never, never, lambda: (state, batch_tree), 0.0, 0)


def tensor_axes(mesh: Any) -> tuple[str, ...]:
    """The mesh's tensor-parallel axes of size > 1 (named one of `TENSOR_NAMES`),
    in mesh order."""
    sizes = _mesh.axis_sizes(mesh)
    return tuple(a for a in mesh.axis_names if a in TENSOR_NAMES and sizes[a] > 1)


def logical_megatron(mesh: Any, logical: LogicalAxes) -> Candidate:
    """The Megatron-style logical baseline, `logical_megatron`.

    The "inner" axes are those the weights put opposite the model width
    (`_inner_axes`: heads, the MLP's hidden width and the vocabulary in a
    transformer; every other hidden width of an MLP chain, the first one
    after the input included). Inner axes go on the tensor axes (in mesh order),
    the batch's logical axes on the other axes of size > 1; the rule's
    divisibility checks leave what does not divide unsharded (KV heads fewer
    than the tensor ranks, an odd vocabulary).

    Example: gpt:tiny on `(dp=2, tp=4)`: heads, mlp and the vocab axes on
    `tp`, the batch on `dp`; `wq` gives `P(None, 'tp')`, `wo` `P('tp')`.

    Raises:
      ValueError: no tensor-like axis, no inner axis, or nothing the tensor
        axes divide; the message says which.
    """
    sizes = _mesh.axis_sizes(mesh)
    tensor = tensor_axes(mesh)
    if not tensor:
        raise ValueError(
            f"{LOGICAL_MEGATRON} needs a tensor axis of size > 1 (named one of "
            f"{TENSOR_NAMES}); mesh axes are {tuple(sizes)}")
    inner = _inner_axes(logical)
    if not inner:
        raise ValueError(
            f"{LOGICAL_MEGATRON}: no logical axis sits opposite the model width in a weight "
            "(the inner dim of a column- then row-parallel pair) in this step's state")
    rest = tuple(a for a in mesh.axis_names if a not in tensor and sizes[a] > 1)
    assignment: dict[str, Any] = {name: tensor if len(tensor) > 1 else tensor[0]
                                  for name in inner}
    batch = None if not rest else rest if len(rest) > 1 else rest[0]
    for name in batch_axis_names(logical):
        assignment[name] = batch
    state_rule, batch_rule = split_rules(mesh, logical, assignment)
    explained = state_rule.explain(_leaf_structs(logical.arguments[0]))
    if not any(set(_spec.spec_axes(e.spec)) & set(tensor) for e in explained):
        size = math.prod(sizes[a] for a in tensor)
        raise ValueError(
            f"{LOGICAL_MEGATRON}: the tensor axes {tensor} (size {size}) divide none of the "
            f"inner axes {inner} (sizes "
            f"{tuple(logical.axis(n).size for n in inner)}) on any state leaf")
    return Candidate(state_rule, batch_rule, LOGICAL_MEGATRON)


def _inner_axes(logical: LogicalAxes) -> tuple[str, ...]:
    """The axes Megatron splits: every other axis along the chains of weights.

    The weights' last two dims (rank >= 2 state leaves, the batch's axes left
    out) link logical axes into a graph. Starting from the model width (the
    axes named "embed"; without one, the axes the batch's features carry;
    without those, the most linked axis), axes alternate outer / inner along
    it (breadth first, in axis order): in a transformer every weight links
    the width to heads, mlp or vocab; in an MLP chain d_in → h1 → h2 → classes,
    h1 and the classes are inner. Inner axes whose role is seq, batch,
    layers or experts are left out (a position table, a router).
    """
    if not logical.arguments:
        return ()
    order = [a.name for a in logical.axes]
    roles = {a.name: a.role for a in logical.axes}
    batch = set(batch_axis_names(logical))
    links: dict[str, list[str]] = {n: [] for n in order}
    for leaf in logical.arguments[0]:
        a, b = (leaf.names[-2:] if len(leaf.names) >= 2 else (None, None))
        if a is None or b is None or a == b or a in batch or b in batch:
            continue
        for x, y in ((a, b), (b, a)):
            if y not in links[x]:
                links[x].append(y)
    linked = [n for n in order if links[n]]
    if not linked:
        return ()
    features = [n for argument in logical.arguments[1:] for leaf in argument
                for n in leaf.names[1:] if n in linked]
    seeds = ([n for n in linked if roles[n] == "embed"] or
             [n for n in linked if n in features] or
             [max(linked, key=lambda n: (len(links[n]), -order.index(n)))])
    side = {n: 0 for n in seeds}
    queue = list(seeds)
    while queue:
        node = queue.pop(0)
        for other in sorted(links[node], key=order.index):
            if other not in side:
                side[other] = 1 - side[node]
                queue.append(other)
    return tuple(n for n in order if side.get(n) == 1
                 and roles[n] not in ("seq", "batch", "layers", "experts"))


def _leaf_structs(leaves: Sequence[Any]) -> dict[str, Any]:
    # A flat dict keyed by path has leaves at exactly those paths.
    return {leaf.path: jax.ShapeDtypeStruct(leaf.shape, np.float32) for leaf in leaves
            if leaf.shape is not None}


def make_space(
    mesh: Any,
    state: Any,
    budget: int | None = None,
    extra_rules: Mapping[str, ShardingRule] | None = None,
    *,
    space: str = "rules",
    step: Any = None,
    args: Sequence[Any] | None = None,
    logical: LogicalAxes | None = None,
    knobs: Knobs | None = None,
) -> SearchSpace:
    """The search space `optimize` explores for a state tree on a mesh.

    Memory fractions refer to the budget, or to the state's total bytes when
    there is none; `min_shard_size` choices run up past the largest leaf. The
    mesh may be abstract (enough to enumerate and replay the space).

    Args:
      mesh, state, budget, extra_rules: as above.
      space: "rules" (today's space, the default here), "logical" or "both"
        (what `optimize` defaults to); see `SearchSpace`.
      step, args: the step and `(state, *batch)`, from which the logical axes
        are discovered once (`discover_logical_axes`) when `space` needs them
        and `logical` is not given.
      logical: the logical axes, already discovered.
      knobs: the step's knobs the search chooses too (`KnobBlock`), or None.

    Raises:
      ValueError: "logical" or "both" without `logical` or `step` and
        `args`, or the discovery failing on the step (for "logical"; for
        "both" the space falls back to "rules" with a `LogicalAxesWarning`).
    """
    leaves = [x for x in jax.tree.leaves(state) if _tree.leaf_shape(x)]
    state_bytes = sum(math.prod(_tree.leaf_shape(x)) * _tree.leaf_dtype(x).itemsize
                      for x in leaves)
    if space != "rules" and logical is None:
        logical = discover(step, args, space)
        if logical is None:
            space = "rules"
    return SearchSpace(mesh, budget or max(state_bytes, 1),
                       max((math.prod(_tree.leaf_shape(x)) for x in leaves), default=1),
                       extra_rules or {}, space=space, logical=logical,
                       optimizer_state=has_optimizer_state(state), knobs=knobs)


class LogicalAxesWarning(ShardsearchWarning):
    """The step's logical axes could not be discovered; the search uses the rules
    family only."""


def discover(step: Any, args: Sequence[Any] | None, space: str) -> LogicalAxes | None:
    """The step's logical axes for a space that needs them.

    Returns None (with a `LogicalAxesWarning`) when `space` is "both" and the
    discovery fails, so a step the analysis cannot read still gets the rules
    family; for "logical" the failure is a ValueError.
    """
    if space not in SPACES:
        raise ValueError(f"space={space!r}; choose one of {SPACES}")
    if step is None or args is None:
        raise ValueError(
            f"space={space!r} needs the step's logical axes: pass step= and args= (to "
            "discover them) or logical=; or use space='rules'")
    from ...logical.discover import discover_logical_axes

    try:
        return discover_logical_axes(step, tuple(args))
    except Exception as err:  # the analysis of a user's step may fail in any way
        message = (f"the step's logical axes could not be discovered "
                   f"({type(err).__name__}: {err})")
        if space == "logical":
            raise ValueError(f"{message}; use space='rules'") from None
        warnings.warn(LogicalAxesWarning(f"{message}; searching the rules family only"),
                      stacklevel=3)
        return None
