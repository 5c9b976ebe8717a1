"""What may be tried: an Optuna trial → a Candidate (state rule, batch rule).

The space is data. `SearchSpace.suggest(trial)` asks the trial for every
parameter and builds the rules; nothing else in the search knows what the
parameters are, so a new rule family means a new parameter block here only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from ..base import mesh as _mesh
from ..rules.builtin import (
    AutoShardingRule,
    BatchShardingRule,
    CompositeShardingRule,
    MemoryConstrainedShardingRule,
    ShardingRule,
    argument_specs,
)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One sharding to try: a rule for the state and one for the other arguments.

    Attributes:
      state_rule: applied to the first argument (the train state).
      batch_rule: applied to every other argument (the batch).
      label: "search" for proposals, or the baseline's name ("replicated",
        "default", "fsdp", ...).
    """

    state_rule: ShardingRule
    batch_rule: ShardingRule
    label: str = "search"

    def __post_init__(self) -> None:
        for name in ("state_rule", "batch_rule"):
            if not isinstance(getattr(self, name), ShardingRule):
                raise TypeError(
                    f"Candidate.{name} must be a ShardingRule, got "
                    f"{type(getattr(self, name)).__name__}")

    def specs(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """Spec trees for `(state, *batch)`."""
        return argument_specs(self.state_rule, self.batch_rule, args)


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


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The parameters the search explores, over one mesh.

    Parameters asked of each trial:
      `auto_order_<i>`: Lehmer code of the mesh-axis order for AutoShardingRule;
      `auto_join_<i>`: whether axis i+1 (in that order) joins axis i's group, so
        that e.g. `('dp', 'tp')` together split one dim (FSDP over all devices);
      `auto_reverse`, `auto_min_shard_size` (log-spaced choices);
      `memory_rule` (on/off) and `memory_fraction` of the reference bytes;
      `extra_<name>` (on/off) for each user rule;
      `priority_<i>`: Lehmer code of the composition order of all rules
        (disabled ones drop out);
      `batch_axes`: the ordered subset of axes splitting the batch dim.

    Args:
      mesh: the mesh (concrete or abstract) the rules are built for.
      reference_bytes: what `memory_fraction` is a fraction of: the memory
        budget, or the state's total bytes when there is no budget.
      max_leaf_size: the state's largest leaf, in elements; bounds the
        `min_shard_size` choices.
      extra_rules: user rules by name, each switched on or off by the search.
    """

    mesh: _mesh.AnyMesh
    reference_bytes: int
    max_leaf_size: int
    extra_rules: Mapping[str, ShardingRule] = dataclasses.field(default_factory=dict)
    memory_fractions: tuple[float, ...] = (0.02, 0.05, 0.1, 0.25, 0.5)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_rules", dict(self.extra_rules))
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

    def suggest(self, trial: optuna.trial.BaseTrial) -> Candidate:
        """Asks `trial` for every parameter and builds the candidate."""
        axes = self.axes
        code = [trial.suggest_int(f"auto_order_{i}", 0, len(axes) - 1 - i)
                for i in range(len(axes) - 1)]
        order = lehmer_decode(code, axes)
        groups: list[list[str]] = []
        for i, axis in enumerate(order):
            if i and trial.suggest_categorical(f"auto_join_{i - 1}", [False, True]):
                groups[-1].append(axis)
            else:
                groups.append([axis])
        auto = AutoShardingRule(
            self.mesh,
            axis_names=tuple(tuple(g) if len(g) > 1 else g[0] for g in groups),
            min_shard_size=trial.suggest_categorical(
                "auto_min_shard_size", list(self.min_shard_sizes)),
            reverse=trial.suggest_categorical("auto_reverse", [False, True]),
        )
        enabled: dict[str, ShardingRule] = {}
        if trial.suggest_categorical("memory_rule", [False, True]):
            fraction = trial.suggest_categorical("memory_fraction", list(self.memory_fractions))
            enabled["memory"] = MemoryConstrainedShardingRule(
                max(1, int(fraction * self.reference_bytes)), self.mesh)
        enabled["auto"] = auto
        for name, rule in self.extra_rules.items():
            if trial.suggest_categorical(f"extra_{name}", [False, True]):
                enabled[name] = rule
        names = self.rule_names()
        priority = [trial.suggest_int(f"priority_{i}", 0, len(names) - 1 - i)
                    for i in range(len(names) - 1)]
        ordered = [enabled[n] for n in lehmer_decode(priority, names) if n in enabled]
        batch = trial.suggest_categorical(
            "batch_axes", [_key(s) for s in ordered_subsets(axes)])
        batch_axes = () if batch == "-" else tuple(batch.split(","))
        return Candidate(CompositeShardingRule(*ordered), BatchShardingRule(batch_axes))

    def enumerate(self) -> list[dict[str, Any]]:
        """Every parameter combination of the space (for the efficiency study).

        Returns a list of parameter dicts that `optuna.trial.FixedTrial` can
        replay through `suggest`; conditional parameters appear only where used.
        """
        axes = self.axes
        n_rules = len(self.rule_names())
        orders = itertools.product(*(range(len(axes) - i) for i in range(len(axes) - 1)))
        joins = list(itertools.product([False, True], repeat=max(len(axes) - 1, 0)))
        prios = list(itertools.product(*(range(n_rules - i) for i in range(n_rules - 1))))
        batches = [_key(s) for s in ordered_subsets(axes)]
        extras = list(itertools.product([False, True], repeat=len(self.extra_rules)))
        memory = [(False, None)] + [(True, f) for f in self.memory_fractions]
        out = []
        for order, join, mss, rev, (mem, frac), extra, prio, batch in itertools.product(
            list(orders), joins, self.min_shard_sizes, [False, True], memory, extras, prios,
            batches,
        ):
            params: dict[str, Any] = {f"auto_order_{i}": c for i, c in enumerate(order)}
            params.update({f"auto_join_{i}": j for i, j in enumerate(join)})
            params.update(auto_min_shard_size=mss, auto_reverse=rev, memory_rule=mem)
            if mem:
                params["memory_fraction"] = frac
            params.update({f"extra_{n}": e for n, e in zip(self.extra_rules, extra, strict=True)})
            params.update({f"priority_{i}": p for i, p in enumerate(prio)})
            params["batch_axes"] = batch
            out.append(params)
        return out
