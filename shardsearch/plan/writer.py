"""Writing a plan: rules, mesh and resolved specs as schema-1 JSON or Python source.

`plan_config` turns rules chosen by hand (or by a search, see
`search.export`) into the plan's data; `write_config` checks that it loads
back and writes it whole, as JSON with sorted keys (equal plans are equal
bytes) or as `PARTITION_RULES` Python source. `plan.reader` reads it back.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import optuna
from jax.sharding import PartitionSpec as P

from .._version import __version__
from ..base import mesh as _mesh
from ..base import spec as _spec
from ..base import tree as _tree
from ..rules.base import ShardingRule, argument_specs, rule_from_config
from ..rules.batch import BatchShardingRule
from .reader import SCHEMA, ShardingPlan, leaf_info, leaves_hash

FORMATS = ("json", "partition-rules", "logical-axis-rules", "flax-rules")


def plan_config(
    rule: ShardingRule,
    batch_rule: ShardingRule,
    mesh: _mesh.AnyMesh,
    *,
    args: Sequence[Any] | None = None,
    workload: Any = None,
) -> dict[str, Any]:
    """The schema-1 plan of rules chosen by hand: no search, no results.

    Args:
      rule: the state rule.
      batch_rule: the rule for every other argument.
      mesh: the mesh (or AbstractMesh) whose axis names and sizes the plan
        records; the rules are applied with it.
      args: `(state, *batch)` to resolve and record the specs on.
      workload: a `Workload` instead of `args` (its `abstract()` is used and its
        name recorded).

    Returns:
      A dict that `write_config` writes and `ShardingPlan.from_config` reads.

    Example:
      >>> rule = CompositeShardingRule(AutoShardingRule(mesh, axis_names=("tp",)))
      >>> write_config(plan_config(rule, BatchShardingRule(("dp",)), mesh), "plan.json")
    """
    for name, value in (("rule", rule), ("batch_rule", batch_rule)):
        if not isinstance(value, ShardingRule):
            raise TypeError(f"plan_config: {name} must be a ShardingRule, got "
                            f"{type(value).__name__}")
    mesh = _mesh.resolve_mesh(mesh)
    sizes = _mesh.axis_sizes(mesh)
    # The rules may be bound to another mesh (or none); the plan's mesh decides.
    rule = rule_from_config(rule.to_config(), mesh, "plan_config rule")
    batch_rule = rule_from_config(batch_rule.to_config(), mesh, "plan_config batch_rule")
    if workload is not None and args is None:
        args = workload.abstract()
    resolved = None
    if args is not None:
        args = tuple(args)
        specs = argument_specs(rule, batch_rule, args)
        arguments = [_leaf_json(tree, tree_specs)
                     for tree, tree_specs in zip(args, specs, strict=True)]
        resolved = {"name": workload.name if workload is not None else None,
                    "arguments": arguments, "hash": leaves_hash(arguments)}
    return {
        "schema": SCHEMA,
        "mesh": {"axis_names": list(sizes), "axis_sizes": list(sizes.values())},
        "state_rule": rule.to_config(),
        "batch_rule": batch_rule.to_config(),
        "batch_spec": _batch_spec_json(batch_rule),
        "workload": resolved,
    }


def versions() -> dict[str, str]:
    """The versions a plan was found with: shardsearch, jax, jaxlib, optuna, Python."""
    try:
        jaxlib = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        jaxlib = "unknown"
    return {"shardsearch": __version__, "jax": jax.__version__, "jaxlib": jaxlib,
            "optuna": optuna.__version__, "python": platform.python_version()}


def write_config(config: Mapping[str, Any], path: str | os.PathLike[str],
                 format: str = "json") -> Path:
    """Writes a plan to `path` and returns the path.

    The plan is checked first (it must load back), then written whole or not
    at all (a temporary file renamed into place), so a reader never sees half
    a file.

    Args:
      config: what `export_config` returned.
      path: the file to write; parent folders are created.
      format: "json" (the plan file; keys sorted, so equal plans are equal
        bytes) or "partition-rules" (Python source with `PARTITION_RULES`, see
        `partition_rules_source`), or "logical-axis-rules" (JSON: the logical
        → mesh axes pairs and each parameter's logical names, for a plan whose
        state rule is a `LogicalAxisRule`; see `logical_axis_rules_config`;
        `load_rule` reads it back), or "flax-rules" (the same, with `rules`
        ordered so that Flax's own `nn.logical_to_mesh_axes` gives every
        leaf the spec the search measured; see `flax_rules_config`).

    Raises:
      ValueError: unknown format, a config that would not load back, or
        "logical-axis-rules" or "flax-rules" for a plan whose state rule is
        not logical; for "flax-rules", leaves Flax's resolution cannot give
        their measured specs (`rules.logical.FlaxRulesMismatch`, naming them).
    """
    if format not in FORMATS:
        raise ValueError(f"write_config: format={format!r}; choose one of {FORMATS}")
    path = Path(path)
    config = strict_json(dict(config))
    ShardingPlan.from_config(config, where=f"plan for {path}")
    if format == "logical-axis-rules":
        text = _dumps(logical_axis_rules_config(config)) + "\n"
    elif format == "flax-rules":
        text = _dumps(flax_rules_config(config)) + "\n"
    else:
        text = _dumps(config) + "\n" if format == "json" else partition_rules_source(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def flax_rules_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A plan's logical rules as Flax `logical_axis_rules` that give its specs.

    `logical_axis_rules_config`'s form with `"format": "flax-rules"` and
    `rules` ordered (and nulled where no leaf is split) so that Flax's
    `nn.logical_to_mesh_axes(names, rules)` gives each leaf of the rules'
    tables, and each leaf the plan recorded (its `workload` specs), the spec
    the search measured (`rules.logical.flax_pairs`). Where the plan records
    the step's Flax constraints (`flax_points`: its `nn.with_logical_constraint`
    calls, which Flax places with the same rules), pairs for their names
    follow (`rules.logical.flax_activation_pairs`) and `unconstrained` lists
    the names to pair with `PartitionSpec.UNCONSTRAINED`
    (`shardsearch.flax.rules_from_file` adds them).

    Raises:
      ValueError: the state rule is not logical; `FlaxRulesMismatch` (a
        ValueError) naming each leaf (or Flax constraint) no order of the
        pairs gets right.
    """
    from ..base.activations import name_from_json, split_setting
    from ..rules.logical import (
        FlaxRulesMismatch,
        entry_to_json,
        flax_activation_pairs,
        flax_resolve,
        flax_rules_json,
    )

    data = logical_axis_rules_config(config, convert=flax_rules_json)
    resolved = config.get("workload")
    if resolved:
        # The recorded specs too: each leaf's names from the table, its spec
        # through Flax's resolution, against what was measured.
        names, sizes = config["mesh"]["axis_names"], config["mesh"]["axis_sizes"]
        mesh = _mesh.abstract_mesh(tuple(sizes), tuple(names))
        rules = [rule_from_config(config[k], mesh, f"plan {k}")
                 for k in ("state_rule", "batch_rule")]
        pairs = [(n, e) for n, e in data["rules"]]
        pairs = [(n, tuple(e) if isinstance(e, list) else e) for n, e in pairs]
        differ = []
        for i, argument in enumerate(resolved["arguments"]):
            rule = rules[min(i, 1)]
            if not hasattr(rule, "explain") or rule.kind != "logical":
                continue
            # A flat dict keyed by path has leaves at exactly those paths.
            tree = {leaf["path"]: jax.ShapeDtypeStruct(tuple(leaf["shape"]), "float32")
                    for leaf in argument if leaf["shape"]}
            measured = {leaf["path"]: leaf["spec"] for leaf in argument}
            for why in rule.explain(tree, None if i == 0 else i - 1):
                if why.names is None:
                    continue
                got = flax_resolve(why.names, pairs)
                want = _spec.canonical(_spec.spec_from_json(measured[why.path], why.path))
                if got != want:
                    differ.append(f"argument {i} leaf {why.path!r}: Flax gives {got}, "
                                  f"measured {want}")
        if differ:
            raise FlaxRulesMismatch(
                f"Flax's resolution of the exported rules differs from the measured specs on "
                f"{len(differ)} leaves: {'; '.join(differ[:5])}")
    points = config.get("flax_points")
    if points:
        # The step's own nn.with_logical_constraint calls: Flax places them with
        # these rules too, so the rules must place them as the search traced them.
        placed = split_setting(tuple((config.get("knobs") or {}).items()))[1]
        pairs = [(n, tuple(e) if isinstance(e, list) else e) for n, e in data["rules"]]
        extra, loose = flax_activation_pairs(
            [tuple(name_from_json(n) for n in names) for names in points], placed, pairs)
        data["rules"] = [*data["rules"], *([n, entry_to_json(e)] for n, e in extra)]
        data["unconstrained"] = loose
    return data


def logical_axis_rules_config(config: Mapping[str, Any],
                              convert: Any = None) -> dict[str, Any]:
    """A plan's logical rules in the form flax and MaxText users know.

    `[logical_name, mesh_axes or null]` pairs plus each parameter's logical
    names (`rules.logical.logical_axis_rules_json`); `load_rule` reads the
    file back into the `LogicalAxisRule`.

    Raises:
      ValueError: the plan's state rule is not a `LogicalAxisRule`.
    """
    from ..rules.logical import LogicalAxisRule, logical_axis_rules_json

    convert = convert or logical_axis_rules_json
    names, sizes = config["mesh"]["axis_names"], config["mesh"]["axis_sizes"]
    mesh = _mesh.abstract_mesh(tuple(sizes), tuple(names))
    rule = rule_from_config(config["state_rule"], mesh, "plan state_rule")
    if not isinstance(rule, LogicalAxisRule) and isinstance(
            getattr(rule, "rule", None), LogicalAxisRule):
        raise ValueError(
            "the plan splits the optimizer state over more mesh axes than its parameters "
            f"({list(rule.axes)}: an 'optimizer-state' rule around a logical one), which "
            "logical-axis rules cannot say (one mesh placement per logical name); export a "
            "trial whose opt_state_axes is '-' (export_config(result, trial=N), or --trial "
            "N), or write format 'json'")
    if not isinstance(rule, LogicalAxisRule):
        raise ValueError(
            f"the plan's state rule is a {rule.kind!r} rule, not 'logical', so it has no "
            "logical-axis rules; export a trial of the logical family (one whose "
            "state_rule kind is 'logical': export_config(result, trial=N), or --trial N), "
            "search with space 'logical', or write format 'json'")
    batch_rule = rule_from_config(config["batch_rule"], mesh, "plan batch_rule")
    return convert(rule, dict(zip(names, sizes, strict=True)), batch_rule)


def _dumps(data: Any, indent: str = "", width: int = 96) -> str:
    """JSON with sorted keys, each value on one line when it fits `width`.

    A leaf record or a shape stays on one line, so a plan reads (and diffs)
    one leaf per line.
    """
    flat = json.dumps(data, sort_keys=True, allow_nan=False, separators=(", ", ": "))
    if len(indent) + len(flat) <= width or not isinstance(data, dict | list) or not data:
        return flat
    inner = indent + "  "
    if isinstance(data, dict):
        items = [f"{inner}{json.dumps(k)}: {_dumps(data[k], inner, width)}" for k in sorted(data)]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    items = [f"{inner}{_dumps(v, inner, width)}" for v in data]
    return "[\n" + ",\n".join(items) + f"\n{indent}]"


def partition_rules_source(config: Mapping[str, Any]) -> str:
    """The winner as Python source: ordered `(regex, PartitionSpec)` pairs.

    One anchored pattern per leaf of the train state, in leaf order, in the
    form EasyDeL- and Flax-style training code takes:

        from jax.sharding import PartitionSpec as P

        PARTITION_RULES = [
            (r"^params/layers/0/attn/wq$", P(None, "tp")),
            ...
        ]

    plus `BATCH_PARTITION_RULES` for a single batch argument.
    `PathShardingRule(PARTITION_RULES)` reproduces the winner's state specs.

    Raises:
      ValueError: the plan has no resolved specs (`"workload": null`).
    """
    resolved = config.get("workload")
    if not resolved:
        raise ValueError(
            "partition rules need the winner's resolved specs, which this plan lacks "
            "(its study ran on a raw step); export it with a workload (--workload)")
    search = config.get("search") or {}
    axes = ",".join(f"{a}={s}" for a, s in zip(config["mesh"]["axis_names"],
                                                config["mesh"]["axis_sizes"], strict=True))
    lines = [
        f"# Written by shardsearch {__version__} from study {search.get('study')!r}: "
        f"workload {resolved.get('name')!r}, mesh {axes}.",
        "# One (regex, PartitionSpec) pair per leaf of the train state; the first pattern",
        "# that matches a leaf's '/'-joined key path wins. Generated: edit the search, not",
        "# this file.",
        "from jax.sharding import PartitionSpec as P",
        "",
        *_pairs_source("PARTITION_RULES", resolved["arguments"][0]),
    ]
    batch = resolved["arguments"][1:]
    if len(batch) == 1:
        lines += ["", "# The batch argument's leaves, the same way.",
                  *_pairs_source("BATCH_PARTITION_RULES", batch[0])]
    return "\n".join(lines) + "\n"


def _pairs_source(name: str, leaves: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [f"{name} = ["]
    for leaf in leaves:
        pattern = "^" + re.escape(leaf["path"]) + "$"
        literal = (f'r"{pattern}"' if pattern.isprintable() and '"' not in pattern
                   else repr(pattern))
        out.append(f"    ({literal}, {_spec.spec_source(leaf['spec'])}),")
    out.append("]")
    return out


def _leaf_json(tree: Any, specs: Any) -> list[dict[str, Any]]:
    _pairs, spec_leaves = _tree.specs_for_leaves(tree, specs)
    return [{**info, "spec": _spec.spec_to_json(_spec.canonical(spec))}
            for info, spec in zip(leaf_info(tree), spec_leaves, strict=True)]


def _batch_spec_json(rule: ShardingRule) -> list[Any] | None:
    if isinstance(rule, BatchShardingRule):
        return _spec.spec_to_json(P(rule.entry) if rule.entry else P())
    return None


def strict_json(data: Any) -> Any:
    """NaN and infinities as null, so the file is strict JSON."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: strict_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [strict_json(v) for v in data]
    return data
