"""A baseline in the space's own parameters, so that the sampler learns from it.

The warm start's baselines are candidates built outside the space (an
expert's path rules or logical assignment). A trial that ran one carries no
Optuna parameters, and TPE models only the trials that carry the parameter
it samples: the experts, usually the best plans of the study, told it
nothing, and the searched trials after them were as good as random (on the
README's job the 13 searched trials came out 1.5-2.6 times slower than the
best expert).

`readings(space, specs, knobs)` reads the logical family's values off a
baseline's spec trees: each offered logical axis takes the mesh axes that
most of the state's dims of that name carry (optimizer leaves aside), the
batch's axes those most of the batch arguments' leading dims carry, and the knobs the
baseline's own. It gives one set of values per `opt_state_axes` choice, "-"
first. `rule_readings` then gives the rules family's: every
`AutoShardingRule` of the space alone (each axis order, grouping, threshold
and direction; no memory rule, no extra rule) with the same batch axes and
knobs, which is how FSDP, each weight split on its own largest dim, is
found. A reading is a guess: the caller keeps the first whose candidate
resolves to the baseline's fingerprint, that is, compiles the very program
the baseline ran (`search.loop`), and records those values on the
baseline's trial. A baseline no set of values reproduces (a leaf split
another way than either family splits it, an axis the space does not
offer) keeps a trial without parameters, as before.
"""

from __future__ import annotations

import collections
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...base.spec import entry_axes
from ...base.tree import leaf_specs
from ...logical.axes import LeafAxes
from ...rules.optimizer import OPTIMIZER_PATHS
from .logical import axes_key, batch_axis_names, group_choices

if TYPE_CHECKING:
    from .searchspace import SearchSpace


def readings(space: SearchSpace, specs: Sequence[Any],
             knobs: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Parameter values of the logical family that may build `specs`, the
    spec trees `(state, *batch)` of a candidate with knob values `knobs`;
    nothing where the space has no logical family, or a knob value or an
    axis the space does not offer.

    Example: gpt:tiny's megatron on `(dp=2, tp=4)` reads as `{"family":
    "logical", "batch_axes": "dp", "logical_vocab": "tp", "logical_mlp":
    "tp", "logical_embed": "-", "logical_seq": "-", "logical_heads": "tp",
    "opt_state_axes": "-"}` (and then the other `opt_state_axes` choices).
    """
    if not space.logical_axes() or space.logical is None:
        return
    params = {p.name: p for p in space.params()}
    state = _votes(space.logical.arguments[0], specs[0], skip=OPTIMIZER_PATHS)
    batch_names = batch_axis_names(space.logical)
    values: dict[str, Any] = {}
    if "family" in params:
        values["family"] = "logical"
    values["batch_axes"] = _batch_key(specs)
    offered = set(space.logical_axes())
    if any(n not in offered and n not in batch_names for n, seen in state.items()
           if any(key != "-" for key in seen)):
        return  # the baseline splits an axis the family cannot split
    for name in space.logical_axes():
        values[f"logical_{name}"] = _split(state[name])
    values.update(_knob_values(space, params, knobs))
    if any(n not in params or v not in params[n].values() for n, v in values.items()):
        return
    if "opt_state_axes" not in params:
        yield values
        return
    for choice in group_choices(space.axes):
        yield {**values, "opt_state_axes": choice}


def rule_readings(space: SearchSpace, specs: Sequence[Any],
                  knobs: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Parameter values of the rules family that may build `specs` (see the
    module docstring): the space's `AutoShardingRule` alone, every order,
    grouping, threshold and direction, with the batch axes most of the batch
    arguments' leading dims carry and the knobs `knobs` (defaults filled in);
    nothing where the space has no rules family or cannot take those values.

    Example: gpt:tiny's fsdp on `(dp=2, tp=4)` reads, among others, as
    `{"family": "rules", "auto_order_0": 0, "auto_join_0": True,
    "auto_min_shard_size": 8, "auto_reverse": False, "memory_rule": False,
    "priority_0": 0, "batch_axes": "dp,tp", "opt_state_axes": "-"}`.
    """
    if space.space == "logical":
        return
    params = space.params()
    named = {p.name: p for p in params}
    fixed = {"family": "rules", "memory_rule": False, "batch_axes": _batch_key(specs),
             "opt_state_axes": "-", **_knob_values(space, named, knobs)}
    fixed.update({p.name: False for p in params if p.name.startswith("extra_")})
    # With the auto rule alone, the composition's order changes nothing.
    fixed.update({p.name: 0 for p in params if p.name.startswith("priority_")})
    fixed = {n: v for n, v in fixed.items() if n in named}
    if any(v not in named[n].values() for n, v in fixed.items()):
        return
    free = [p for p in params if p.name.startswith("auto_")]
    for chosen in itertools.product(*(p.values() for p in free)):
        yield {**fixed, **dict(zip((p.name for p in free), chosen, strict=True))}


def _knob_values(space: SearchSpace, params: Mapping[str, Any],
                 knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The `knob_<name>` values of `knobs`, the space's knobs that it
    searches at their defaults where `knobs` sets none; the others (a
    pinned `act_batch`) are the proposal's to reproduce, which the
    fingerprint checks."""
    filled = space.knobs.values(tuple(knobs.items())) if space.knobs is not None else knobs
    return {f"knob_{n}": v for n, v in filled.items() if f"knob_{n}" in params}


def _batch_key(specs: Sequence[Any]) -> str:
    """The `batch_axes` value of spec trees `(state, *batch)`: the mesh-axis
    group most of the batch arguments' leading dims carry (`_split`)."""
    seen: collections.Counter[str] = collections.Counter()
    for tree in specs[1:]:
        for _, spec in leaf_specs(tree):
            seen[axes_key(entry_axes(spec[0] if len(spec) else None))] += 1
    return _split(seen)


def _votes(leaves: Sequence[LeafAxes], tree: Any,
           skip: str) -> dict[str, collections.Counter[str]]:
    """Per logical name, how often each mesh-axis group (`axes_key`) splits a
    dim of that name in the spec tree of one argument (leaves whose path
    matches `skip` left out)."""
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    specs = dict(leaf_specs(tree))
    for leaf in leaves:
        spec = specs.get(leaf.path)
        if spec is None or re.search(skip, leaf.path):
            continue
        for d, name in enumerate(leaf.names):
            if name is not None:
                out[name][axes_key(entry_axes(spec[d] if d < len(spec) else None))] += 1
    return out


def _split(seen: collections.Counter[str]) -> str:
    """The most frequent group, a split before "-" (a dim the rules could not
    split, for its size or an axis taken, reads "-" whatever was asked);
    "-" when none is split."""
    split = [(count, key) for key, count in seen.items() if key != "-"]
    return max(split)[1] if split else "-"
