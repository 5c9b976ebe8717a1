"""What may be tried: an Optuna trial → a Candidate (state rule, batch rule).

The space is data. Each `ParamBlock` declares its parameters once, as
`Param`s, and builds its piece of the candidate from the values chosen for
them; `SearchSpace.suggest(trial)` and `SearchSpace.enumerate()` only walk
those declarations, so a new rule family means a new block here and nothing
else: nothing in the search knows what the parameters are. The parameter
model (`Param`, `ParamBlock`, `Draft`) lives in `params.py`; the built-in
blocks and the space that lists them live here.

Example: the auto-rule block declares `auto_order_0 ∈ 0..1`, `auto_join_0 ∈
{False, True}`, ... on a `(dp=2, tp=4)` mesh; `suggest` asks a trial for each
and the block turns `{"auto_order_0": 1, "auto_join_0": False, ...}` into
`AutoShardingRule(axis_names=("tp", "dp"), ...)`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import optuna

from ...base import mesh as _mesh
from ...base.activations import AUTO as ACT_AUTO
from ...base.activations import PREFIX as ACT_PREFIX
from ...base.knobs import Knobs
from ...logical.axes import LogicalAxes
from ...rules.auto import AutoShardingRule
from ...rules.base import ShardingRule
from ...rules.batch import BatchShardingRule
from ...rules.composite import CompositeShardingRule
from ...rules.logical import LogicalAxisRule
from ...rules.memory import MemoryConstrainedShardingRule
from ...rules.optimizer import OptimizerStateRule
from .candidate import Candidate
from .logical import (
    SPACES,
    FamilyBlock,
    LogicalBlock,
    When,
    batch_axis_names,
    group_choices,
    offered_axes,
    parse_key,
)
from .params import Draft, Param, ParamBlock

# Recorded in every study (`search.identity`): a run resumes a study only over
# the same version. Raise it whenever a built-in block's parameter names,
# kinds, ranges or order change, since old trials would no longer fit.
SPACE_VERSION = "1"
# Per family set: "logical" and "both" gained `opt_state_axes` in version 2;
# "rules" is unchanged, so its studies resume.
SPACE_VERSIONS = {"rules": "1", "logical": "2", "both": "2"}


def space_version(space: str) -> str:
    """The version of the space `space` ("rules", "logical", "both")."""
    return SPACE_VERSIONS.get(space, SPACE_VERSION)


def lehmer_decode(code: Sequence[int], items: Sequence[Any]) -> list[Any]:
    """The permutation of `items` whose Lehmer code is `code`.

    `code[i]` picks among the items not yet taken, so `code[i]` ranges over
    `0..len(items)-1-i` and each digit stays meaningful to TPE on its own
    (digit 0 = "who goes first"). `lehmer_decode([1, 0], "abc") == ["b", "a", "c"]`.
    """
    pool = list(items)
    out = [pool.pop(c) for c in code]
    return out + pool


def ordered_subsets(items: Sequence[str]) -> list[tuple[str, ...]]:
    """Every ordered subset of `items`, the empty one first, in a fixed order."""
    out: list[tuple[str, ...]] = []
    for k in range(len(items) + 1):
        out.extend(itertools.permutations(items, k))
    return out


def _key(axes: Sequence[str]) -> str:
    return ",".join(axes) if axes else "-"


def _lehmer_params(prefix: str, n: int) -> tuple[Param, ...]:
    """Digits `<prefix>_0 ∈ 0..n-1`, `<prefix>_1 ∈ 0..n-2`, ... of a permutation of n."""
    return tuple(Param.integer(f"{prefix}_{i}", 0, n - 1 - i) for i in range(n - 1))


@dataclasses.dataclass(frozen=True)
class AutoRuleBlock(ParamBlock):
    """The AutoShardingRule: axis order, axis groups, threshold, direction.

    `auto_order_<i>` is the Lehmer code of the mesh-axis order; `auto_join_<i>`
    puts axis i+1 (in that order) in axis i's group, so that e.g. `('dp', 'tp')`
    together split one dim (FSDP over all devices); `auto_min_shard_size` takes
    log-spaced choices; `auto_reverse` flips which dims go first. The decoded
    order is noted as the readable `auto_order` ("tp,dp", `Candidate.readable`).
    """

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        n = len(space.axes)
        return (*_lehmer_params("auto_order", n),
                *(Param.categorical(f"auto_join_{i}", [False, True]) for i in range(n - 1)),
                Param.categorical("auto_min_shard_size", space.min_shard_sizes),
                Param.categorical("auto_reverse", [False, True]))

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        axes = space.axes
        order = lehmer_decode([values[f"auto_order_{i}"] for i in range(len(axes) - 1)], axes)
        groups: list[list[str]] = []
        for i, axis in enumerate(order):
            if i and values[f"auto_join_{i - 1}"]:
                groups[-1].append(axis)
            else:
                groups.append([axis])
        draft = draft.with_readable("auto_order", ",".join(order))
        return draft.with_rule("auto", AutoShardingRule(
            space.mesh,
            axis_names=tuple(tuple(g) if len(g) > 1 else g[0] for g in groups),
            min_shard_size=values["auto_min_shard_size"],
            reverse=values["auto_reverse"],
        ))


@dataclasses.dataclass(frozen=True)
class MemoryRuleBlock(ParamBlock):
    """The MemoryConstrainedShardingRule, on or off, and its per-device limit.

    `memory_rule` switches it on; `memory_fraction` (asked only then) sets the
    limit as a fraction of `space.reference_bytes`.
    """

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return (Param.categorical("memory_rule", [False, True]),
                Param.categorical("memory_fraction", space.memory_fractions,
                                  when={"memory_rule": True}))

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        if not values["memory_rule"]:
            return draft
        limit = max(1, int(values["memory_fraction"] * space.reference_bytes))
        return draft.with_rule("memory", MemoryConstrainedShardingRule(limit, space.mesh))


@dataclasses.dataclass(frozen=True)
class ExtraRulesBlock(ParamBlock):
    """The user's rules, each switched on or off by `extra_<name>`."""

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return tuple(Param.categorical(f"extra_{name}", [False, True])
                     for name in space.extra_rules)

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        for name, rule in space.extra_rules.items():
            if values[f"extra_{name}"]:
                draft = draft.with_rule(name, rule)
        return draft


@dataclasses.dataclass(frozen=True)
class CompositionBlock(ParamBlock):
    """The state rule: the rules switched on so far, in a searched priority.

    `priority_<i>` is the Lehmer code of an order of `space.rule_names()`;
    rules switched off drop out of it. Comes after every block that switches
    rules on. The decoded order, switched-off rules included, is noted as
    the readable `priority` ("memory,auto", `Candidate.readable`).
    """

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return _lehmer_params("priority", len(space.rule_names()))

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        names = space.rule_names()
        enabled = dict(draft.rules)
        unknown = [n for n in enabled if n not in names]
        if unknown:
            raise ValueError(f"CompositionBlock: rules {unknown} are not in "
                             f"SearchSpace.rule_names()={names}; list them there so a "
                             "priority code can order them")
        code = [values[f"priority_{i}"] for i in range(len(names) - 1)]
        priority = lehmer_decode(code, names)
        ordered = [enabled[n] for n in priority if n in enabled]
        return dataclasses.replace(draft.with_readable("priority", ",".join(priority)),
                                   state_rule=CompositeShardingRule(*ordered))


@dataclasses.dataclass(frozen=True)
class BatchBlock(ParamBlock):
    """The batch rule: `batch_axes`, the ordered subset of axes splitting the batch dim.

    Choices are keys like `"dp,tp"`, with `"-"` for no axis (replicated batch).
    """

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return (Param.categorical("batch_axes", [_key(s) for s in ordered_subsets(space.axes)]),)

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        batch = values["batch_axes"]
        axes = () if batch == "-" else tuple(batch.split(","))
        return dataclasses.replace(draft, batch_rule=BatchShardingRule(axes))


@dataclasses.dataclass(frozen=True)
class OptimizerStateBlock(ParamBlock):
    """`opt_state_axes`: the mesh axes the optimizer state is also split over.

    `"-"` keeps each optimizer leaf where the family put it (with its
    parameter); a group like `"dp"` wraps the state rule in an
    `OptimizerStateRule`, which adds those axes to every optimizer leaf's
    largest dim they divide: ZeRO-1/2, Megatron-LM's distributed optimizer,
    XLA gathering the updated parameters. The last block, after the family
    built the state rule; in the space only where the state has optimizer
    leaves (`SearchSpace.optimizer_state`).
    """

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        return (Param.categorical("opt_state_axes", group_choices(space.axes)),)

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        entry = parse_key(values["opt_state_axes"])
        if entry is None:
            return draft
        axes = (entry,) if isinstance(entry, str) else entry
        return dataclasses.replace(
            draft, state_rule=OptimizerStateRule(draft.state_rule, axes, mesh=space.mesh))


# The value an activation knob takes to follow the candidate's logical
# assignment: the point's name placed as the parameters' axis of that name is.
JOINT = "logical"


@dataclasses.dataclass(frozen=True)
class KnobBlock(ParamBlock):
    """`knob_<name>`: a value for each of the step's knobs that has a choice
    (`base.knobs.Knobs`: remat policy, microbatches, or a user factory's
    keywords), in declaration order; the candidate compiles the step they
    build (`Candidate.knobs`). The last block, in every family; in the space
    only when the search chooses knobs (`SearchSpace.knobs`).

    An activation knob (`act_<name>`) whose name is also a logical axis of the
    arguments takes one value more, `"logical"`: the activations of that name
    go where the candidate's logical assignment puts the parameters' axis
    (Flax's one placement per name), resolved here to that value, or to
    `"auto"` in a candidate of the rules family or where it is no value of the
    knob (a group that does not divide the activation).
    """

    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        joint = space.joint_knobs()
        return tuple(Param.categorical(f"knob_{name}", (*values, JOINT) if name in joint
                                       else values)
                     for name, values in space.knobs.searched().items())

    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        chosen = {name: values[f"knob_{name}"] for name in space.knobs.searched()}
        placed = _assigned(draft)
        for name, value in chosen.items():
            if value == JOINT:
                # A name the assignment leaves out keeps the parameters' axis whole.
                text = ACT_AUTO if placed is None else placed.get(name[len(ACT_PREFIX):], "-")
                chosen[name] = text if text in space.knobs.choices[name] else ACT_AUTO
        return dataclasses.replace(draft, knobs=space.knobs.setting(chosen))


def _assigned(draft: Draft) -> dict[str, str] | None:
    """The draft's logical assignment as knob values (`"tp"`, `"dp,tp"`, `"-"`);
    None when its rules are not logical."""
    rules = [r.rule if isinstance(r, OptimizerStateRule) else r
             for r in (draft.state_rule, draft.batch_rule)]
    if not any(isinstance(r, LogicalAxisRule) for r in rules):
        return None
    out: dict[str, str] = {}
    for rule in rules:
        for name, entry in rule.assignment if isinstance(rule, LogicalAxisRule) else ():
            out.setdefault(name, "-" if entry is None else entry if isinstance(entry, str)
                           else ",".join(entry))
    return out


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The parameters the search explores, over one mesh.

    The parameters are those the blocks of `blocks()` declare, in block order:
    `auto_order_<i>`, `auto_join_<i>`, `auto_min_shard_size`, `auto_reverse`
    (AutoRuleBlock); `memory_rule`, `memory_fraction` (MemoryRuleBlock);
    `extra_<name>` (ExtraRulesBlock); `priority_<i>` (CompositionBlock);
    `batch_axes` (BatchBlock). Stored studies and TPE's seeded samples depend
    on these names, their ranges and this order: keep them when editing.

    To add a block, return it from `blocks()` (a subclass may override it);
    `suggest` and `enumerate` need no edit. A block that switches a state
    rule on goes before the CompositionBlock and its rule's name goes in
    `rule_names()`.

    `space` picks the families (issue 13's logical axes, `logical_block.py`):
    "rules" is the list above, unchanged, so existing studies resume;
    "logical" is `batch_axes` then one `logical_<name>` per offered logical
    axis (`LogicalBlock`); "both" asks `family ∈ {"rules", "logical"}` first,
    then the rules blocks' parameters (asked only when family == "rules"),
    `batch_axes` (always), and the logical block's (only when family ==
    "logical"). The logical family's candidate holds one assignment's
    `LogicalAxisRule`s, for the state and for the batch (`batch_axes` gives
    the batch's logical axes their mesh axes).

    Args:
      mesh: the mesh (concrete or abstract) the rules are built for.
      reference_bytes: what `memory_fraction` is a fraction of: the memory
        budget, or the state's total bytes when there is no budget.
      max_leaf_size: the state's largest leaf, in elements; bounds the
        `min_shard_size` choices.
      extra_rules: user rules by name, each switched on or off by the search.
      memory_fractions: the `memory_fraction` choices.
      space: "rules", "logical" or "both" (see above).
      logical: the step's logical axes (`discover_logical_axes`); needed for
        "logical" and "both".
      logical_max_axes: at most this many logical axes are offered, largest
        first (`logical_block.offered_axes`).
      optimizer_state: the state has optimizer leaves (paths like
        `opt/mu/...`, `rules.optimizer.OPTIMIZER_PATHS`): "logical" and
        "both" then end with `opt_state_axes` (`OptimizerStateBlock`).
      knobs: the step's knobs the search chooses (`base.knobs.Knobs`): every
        family then ends with one `knob_<name>` per knob with a choice
        (`KnobBlock`). None: the step as given.

    Example:
      `SearchSpace(mesh, 1 << 30, 1 << 20).suggest(optuna.trial.FixedTrial(
      {"auto_order_0": 1, ..., "batch_axes": "dp"}))` → a Candidate whose batch
      rule splits the batch over `dp`.
    """

    mesh: _mesh.AnyMesh
    reference_bytes: int
    max_leaf_size: int
    extra_rules: Mapping[str, ShardingRule] = dataclasses.field(default_factory=dict)
    memory_fractions: tuple[float, ...] = (0.02, 0.05, 0.1, 0.25, 0.5)
    space: str = "rules"
    logical: LogicalAxes | None = None
    logical_max_axes: int = 6
    optimizer_state: bool = False
    knobs: Knobs | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_rules", dict(self.extra_rules))
        if self.space not in SPACES:
            raise ValueError(f"SearchSpace: space={self.space!r}; choose one of {SPACES}")
        if self.space != "rules" and not isinstance(self.logical, LogicalAxes):
            raise ValueError(
                f"SearchSpace: space={self.space!r} needs the step's logical axes, got "
                f"logical={type(self.logical).__name__}; pass "
                "logical=discover_logical_axes(step, args) or use space='rules'")
        if isinstance(self.logical_max_axes, bool) or not isinstance(
                self.logical_max_axes, int) or self.logical_max_axes < 0:
            raise ValueError(f"SearchSpace: logical_max_axes must be an int >= 0, got "
                             f"{self.logical_max_axes!r}")
        for name, rule in self.extra_rules.items():
            if not isinstance(rule, ShardingRule):
                raise TypeError(
                    f"extra rule {name!r} is a {type(rule).__name__}, not a ShardingRule")
            if not name.isidentifier():
                raise ValueError(
                    f"extra rule name {name!r} must be an identifier (it names an Optuna "
                    "parameter); rename it")
        if self.reference_bytes <= 0 or self.max_leaf_size < 0:
            raise ValueError(
                f"SearchSpace: reference_bytes={self.reference_bytes} and "
                f"max_leaf_size={self.max_leaf_size} must be positive")

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh axes that split something (size > 1), in mesh order."""
        sizes = _mesh.axis_sizes(self.mesh)
        return tuple(a for a in self.mesh.axis_names if sizes[a] > 1)

    @property
    def min_shard_sizes(self) -> tuple[int, ...]:
        """Log-spaced thresholds from the device count to past the largest leaf.

        The last one exceeds every leaf, so "AutoShardingRule splits nothing"
        (state replicated, as in plain data parallelism) is in the space.
        """
        n = _mesh.device_count(self.mesh)
        out = [n]
        size = 4 ** math.ceil(math.log(max(n, 1) + 1, 4))
        while size <= self.max_leaf_size:
            if size > out[-1]:
                out.append(size)
            size *= 4
        out.append(max(size, out[-1] + 1))
        return tuple(out)

    def rule_names(self) -> tuple[str, ...]:
        """Every rule the composition may hold, in the order priorities refer to."""
        return ("memory", "auto", *self.extra_rules)

    def logical_axes(self) -> tuple[str, ...]:
        """The logical axes the logical family offers (none for "rules")."""
        if self.space == "rules" or self.logical is None:
            return ()
        return offered_axes(self.logical, self.mesh, self.logical_max_axes)

    def joint_knobs(self) -> frozenset[str]:
        """The activation knobs that may follow the logical assignment (`JOINT`):
        those of a name the logical family assigns (none for "rules")."""
        if self.knobs is None or not self.logical_axes():
            return frozenset()
        names = {*self.logical_axes(), *batch_axis_names(self.logical)}
        return frozenset(n for n in self.knobs.searched()
                         if n.startswith(ACT_PREFIX) and n[len(ACT_PREFIX):] in names)

    def blocks(self) -> tuple[ParamBlock, ...]:
        """The parameter blocks, in the order their parameters are asked."""
        rules = (AutoRuleBlock(), MemoryRuleBlock(), ExtraRulesBlock(), CompositionBlock())
        knobs = (KnobBlock(),) if self.knobs is not None and self.knobs.searched() else ()
        if self.space == "rules":
            return (*rules, BatchBlock(), *knobs)
        optimizer = (OptimizerStateBlock(),) if self.optimizer_state else ()
        if self.space == "logical":
            return (BatchBlock(), LogicalBlock(), *optimizer, *knobs)
        return (FamilyBlock(), *(When(b, "rules") for b in rules), BatchBlock(),
                When(LogicalBlock(), "logical"), *optimizer, *knobs)

    def params(self) -> tuple[Param, ...]:
        """Every block's parameters, in the order a trial is asked for them.

        Raises:
          ValueError: two parameters share a name, or a condition refers to a
            parameter not declared before it or to a value it cannot take.
        """
        out: list[Param] = []
        seen: dict[str, Param] = {}
        for block in self.blocks():
            for param in block.params(self):
                where = f"{type(block).__name__}: parameter {param.name!r}"
                if param.name in seen:
                    raise ValueError(f"{where} is declared twice; rename one")
                for name, value in param.when:
                    if name not in seen or value not in seen[name].values():
                        raise ValueError(
                            f"{where} is asked when {name}={value!r}, but no parameter "
                            f"{name!r} declared before it takes that value; declare it "
                            "earlier or fix the condition")
                seen[param.name] = param
                out.append(param)
        return tuple(out)

    def suggest(self, trial: optuna.trial.BaseTrial) -> Candidate:
        """Asks `trial` for every parameter, in order, and builds the candidate."""
        values: dict[str, Any] = {}
        for param in self.params():
            if param.applies(values):
                values[param.name] = param.suggest(trial)
        return self.build(values)

    def build(self, values: Mapping[str, Any]) -> Candidate:
        """The candidate for chosen parameter values (conditional ones may be absent)."""
        draft = Draft()
        for block in self.blocks():
            draft = block.build(self, values, draft)
        return draft.candidate()

    def enumerate(self) -> list[dict[str, Any]]:
        """Every parameter combination of the space (for the efficiency study).

        Returns a list of parameter dicts that `optuna.trial.FixedTrial` can
        replay through `suggest`: the product of every parameter's values in
        declaration order (the last varying fastest), a conditional parameter
        appearing only where its condition holds.
        """
        return list(_combinations(self.params(), {}))


def _combinations(params: Sequence[Param], chosen: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if not params:
        yield dict(chosen)
        return
    param, rest = params[0], params[1:]
    if not param.applies(chosen):
        yield from _combinations(rest, chosen)
        return
    for value in param.values():
        chosen[param.name] = value
        yield from _combinations(rest, chosen)
        del chosen[param.name]
