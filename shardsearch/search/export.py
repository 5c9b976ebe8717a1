"""Exporting a search: its winner (or a chosen trial) as a schema-1 plan file.

`export_config` gathers the winning rules, the mesh, the workload's leaves
with their resolved specs, the results, the hardware and the versions;
`write_config` writes them as JSON or as Python partition rules. `_plan`
reads them back.

Everything outside "results" is a function of the search's inputs and its
seed, so two runs of the same search write files that differ only under
"results" (where the measured numbers live) and plan files diff cleanly.
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
from ..plan.reader import SCHEMA, ShardingPlan, leaf_info, leaves_hash
from ..rules.builtin import BatchShardingRule, ShardingRule, rule_from_config
from .confirm import median_ci
from .result import OptimizeResult, TrialRecord, summarize
from .space import Candidate

FORMATS = ("json", "partition-rules")
# Baselines that are reference points rather than plans an expert would write.
NOT_EXPERT = ("replicated", "default", "search")


def export_config(
    source: OptimizeResult | optuna.Study,
    *,
    workload: Any = None,
    args: Sequence[Any] | None = None,
    trial: int | None = None,
) -> dict[str, Any]:
    """The schema-1 plan of a search's winner (or of one trial), as JSON-ready data.

    The specs are resolved on abstract arguments with an abstract mesh built
    from the study's axes, so no devices are needed.

    Args:
      source: what `optimize` returned, or a stored study (`optuna.load_study`).
      workload: the `Workload` to resolve specs on. Default: the study's own
        workload when it is a built-in ("gpt:tiny"); a study run on a user
        factory or a raw step needs `workload` or `args`, because a stored
        study never makes shardsearch import code by itself.
      args: `(state, *batch)` (arrays or ShapeDtypeStructs) instead of a workload.
      trial: export this trial number instead of the winner.

    Returns:
      The plan as a dict; without a workload or args, `"workload"` is None (the
      rules, mesh and results are still there).

    Raises:
      ValueError: the study has no such trial, no completed trial, no
        shardsearch attributes, or names a workload factory and none was given.

    Example:
      >>> write_config(export_config(result), "plan.json")
    """
    study, records, summary = _gather(source)
    attrs = study.user_attrs
    where = f"study {study.study_name!r}"
    if "mesh" not in attrs or not records:
        raise ValueError(
            f"{where} has no shardsearch trials; export studies that shardsearch.optimize "
            "(or `shardsearch optimize`) ran")
    best = _best_record(records, summary, where)
    chosen = best if trial is None else _trial(records, trial, where)
    mesh_axes = {str(k): int(v) for k, v in dict(attrs["mesh"]).items()}
    mesh = _mesh.abstract_mesh(tuple(mesh_axes.values()), tuple(mesh_axes))
    state_rule = rule_from_config(chosen.state_rule, mesh, f"{where} trial {chosen.number} "
                                  "state_rule")
    batch_rule = rule_from_config(chosen.batch_rule, mesh, f"{where} trial {chosen.number} "
                                  "batch_rule")
    name = attrs.get("workload")
    if workload is None and args is None and name is not None:
        workload = _builtin_workload(name, where)
    config = plan_config(state_rule, batch_rule, mesh, args=args, workload=workload)
    is_best = chosen.number == best.number
    return {
        **config,
        "search": {"study": study.study_name, "workload": name,
                   "objective": attrs.get("objective"), "seed": attrs.get("seed"),
                   "sampler": attrs.get("sampler"), "budget": attrs.get("budget")},
        "hardware": attrs.get("hardware"),
        "versions": versions(),
        "results": _results(chosen, records, summary, is_best, attrs.get("objective"),
                            "best" if trial is None else "trial"),
    }


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
        specs = Candidate(rule, batch_rule).specs(args)
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
        `partition_rules_source`).

    Raises:
      ValueError: unknown format, or a config that would not load back.
    """
    if format not in FORMATS:
        raise ValueError(f"write_config: format={format!r}; choose one of {FORMATS}")
    path = Path(path)
    config = _finite(dict(config))
    ShardingPlan.from_config(config, where=f"plan for {path}")
    text = _dumps(config) + "\n" if format == "json" else partition_rules_source(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


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
        out.append(f"    ({literal}, {spec_source(leaf['spec'])}),")
    out.append("]")
    return out


def spec_source(spec_json: Sequence[Any]) -> str:
    """A spec's JSON form as Python source: `[null, "tp"]` → `P(None, "tp")`."""
    entries = []
    for entry in spec_json:
        if entry is None:
            entries.append("None")
        elif entry == "<unconstrained>":
            entries.append("P.UNCONSTRAINED")
        elif isinstance(entry, str):
            entries.append(json.dumps(entry))
        else:
            names = ", ".join(json.dumps(a) for a in entry)
            entries.append(f"({names},)" if len(entry) == 1 else f"({names})")
    return f"P({', '.join(entries)})"


def _gather(source: Any) -> tuple[optuna.Study, list[TrialRecord], dict[str, Any] | None]:
    """The study, its trial records, and optimize's summary (None if unfinished)."""
    if isinstance(source, OptimizeResult):
        summary = source.to_json()
        del summary["trials"]
        return source.study, list(source.trials), summary
    if isinstance(source, optuna.Study):
        records = [r for t in source.get_trials(deepcopy=False)
                   if (r := TrialRecord.from_trial(t)) is not None]
        return source, records, source.user_attrs.get("result")
    raise TypeError(
        f"export_config: source must be an OptimizeResult or an optuna.Study, got "
        f"{type(source).__name__}")


def _best_record(records: list[TrialRecord], summary: Mapping[str, Any] | None,
                 where: str) -> TrialRecord:
    complete = [r for r in records if r.outcome.status == "complete"]
    if not complete:
        raise ValueError(
            f"{where} has no completed trial to export; run more trials or raise the budget")
    if summary is not None:
        best = summary["best"]
        same = [r for r in complete if r.label == best["label"]
                and r.state_rule == best["state_rule"] and r.batch_rule == best["batch_rule"]]
        # The confirmation names finalists "trial N"; prefer the record it re-timed.
        timed = [r for r in same if _name(r) in summary.get("confirmation", {})]
        if timed or same:
            return (timed or same)[0]
    # An interrupted study has no summary: its lowest value wins, earliest on ties.
    return min(complete, key=lambda r: (r.outcome.value, r.number))


def _trial(records: list[TrialRecord], number: int, where: str) -> TrialRecord:
    for record in records:
        if record.number == number:
            return record
    numbers = [r.number for r in records]
    raise ValueError(
        f"{where} has no shardsearch trial number {number}; its trials run from "
        f"{min(numbers)} to {max(numbers)}")


def _name(record: TrialRecord) -> str:
    return record.label if record.label != "search" else f"trial {record.number}"


def _builtin_workload(name: str, where: str) -> Any:
    from ..workloads import get_workload, list_workloads

    if name not in list_workloads():
        raise ValueError(
            f"{where} ran on workload factory {name!r}; pass that workload explicitly "
            f"(--workload {name}) to resolve the specs — a stored study never makes "
            "shardsearch import code by itself")
    return get_workload(name)


def _leaf_json(tree: Any, specs: Any) -> list[dict[str, Any]]:
    _pairs, spec_leaves = _tree.specs_for_leaves(tree, specs)
    return [{**info, "spec": _spec.spec_to_json(_spec.canonical(spec))}
            for info, spec in zip(leaf_info(tree), spec_leaves, strict=True)]


def _batch_spec_json(rule: ShardingRule) -> list[Any] | None:
    if isinstance(rule, BatchShardingRule):
        return _spec.spec_to_json(P(rule.entry) if rule.entry else P())
    return None


def _results(chosen: TrialRecord, records: list[TrialRecord],
             summary: Mapping[str, Any] | None, is_best: bool, objective: str | None,
             selected: str) -> dict[str, Any]:
    """Every measured number: the exported candidate against each baseline.

    The verdict and output check are about the study's winner, so another
    trial gets null for them; a study that never finished has no verdict.
    """
    summary = summary or {}
    confirmation = dict(summary.get("confirmation") or {})
    rows: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.label != "search":
            rows.setdefault(record.label, _row(record, confirmation, objective))
    winner = _row(chosen, confirmation, objective)
    experts = {k: v["median_seconds"] for k, v in rows.items()
               if k not in NOT_EXPERT and v["median_seconds"] is not None}
    best_expert = min(experts, key=lambda k: (experts[k], k)) if experts else None
    replicated = rows.get("replicated", {}).get("median_seconds")
    for row in (winner, *rows.values()):
        row["speedup_vs_replicated"] = _ratio(replicated, row["median_seconds"])
        row["speedup_vs_best_expert"] = _ratio(experts.get(best_expert), row["median_seconds"])
    return {
        "selected": selected,
        "winner": winner,
        "baselines": list(rows.values()),  # a list keeps trial order through sort_keys
        "best_expert": best_expert,
        "verdict": summary.get("verdict", "unconfirmed") if is_best else None,
        "outputs_match": summary.get("outputs_match") if is_best else None,
        "max_relative_error": summary.get("max_relative_error") if is_best else None,
        "trials": summarize(records),
        "compiles": summary.get("compiles"),
    }


def _row(record: TrialRecord, confirmation: Mapping[str, Any],
         objective: str | None) -> dict[str, Any]:
    o = record.outcome
    median = ci = timed_in = None
    if _name(record) in confirmation:
        timing = confirmation[_name(record)]
        median, ci, timed_in = timing["median"], list(timing["ci"]), "confirmation"
    elif o.status == "complete":
        median = o.value
        if objective == "static":
            timed_in = "estimate"
        else:
            ci, timed_in = list(median_ci(o.step_times)), "search"
    return {"label": record.label, "trial": record.number, "status": o.status,
            "cut_stage": {1: "check", 2: "compile", 3: "measure"}.get(o.cut_stage),
            "reason": o.reason or None, "median_seconds": median, "ci_seconds": ci,
            "timed_in": timed_in, "memory_per_device": dict(sorted(o.memory.items()))}


def _ratio(reference: float | None, value: float | None) -> float | None:
    if reference is None or not value:
        return None
    return reference / value


def _finite(data: Any) -> Any:
    """NaN and infinities as null, so the file is strict JSON."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data
