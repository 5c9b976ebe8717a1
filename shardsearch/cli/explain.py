"""`shardsearch explain`: per leaf, its logical axes, its spec, why, and bytes per device.

Works on any plan file (and on a `logical-axis-rules` or `flax-rules` file): the leaves are
the workload's (`--workload`), else those the plan recorded, else (a logical
file) the rule's own table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from .args import Command, UsageError, mesh_option, read_file, usage, workload
from .render import arg_name, axes, spec_text, table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a plan file (optimize/export), or a logical-axis-rules or "
                                "flax-rules file")
    p.add_argument("--workload", metavar="NAME",
                   help="explain the leaves of this workload (default: the leaves the plan "
                        "recorded); also names each leaf's logical axes for plans of other "
                        "kinds")
    p.add_argument("--mesh", metavar="AXES",
                   help="apply on these axis sizes instead of the recorded ones (same axis "
                        "names), e.g. dp=4,tp=8; needs no devices")


def run(a: argparse.Namespace) -> int:
    from ..base.jsonfile import read_json

    mesh = mesh_option(a.mesh, "explain")
    data = read_file(read_json, a.file, a.file)
    state_rule, batch_rule, mesh, recorded = usage(_load, data, mesh, a.file)
    chosen = workload(a.workload) if a.workload else _builtin(recorded_name(data))
    if chosen is not None:
        args = tuple(chosen.abstract())
    elif recorded is not None:
        args = recorded
    else:
        raise UsageError(f"{a.file} records no leaves (its study ran on a raw step); name the "
                         "workload with --workload")
    print(f"{a.file}: state rule {state_rule.kind}, batch rule {batch_rule.kind}, on mesh "
          f"{axes(mesh)}")
    logical = _discovered(chosen, args) if chosen is not None else None
    try:
        lines, total = _explain(mesh, args, (state_rule, batch_rule), logical)
    except ValueError as err:  # a path rule refuses a dim it cannot split
        print(f"the plan does not fit these leaves on mesh {axes(mesh)}: {err}",
              file=sys.stderr)
        return 1
    print("\n".join(lines))
    # What the search and this discovery could not read, and the rules' fallbacks.
    from ..rules.base import argument_notes

    search = data.get("search") if isinstance(data, dict) else None
    notes = [*((search or {}).get("notes") or ()),
             *(logical.notes() if logical is not None else ()),
             *argument_notes(state_rule, batch_rule, args)]
    for text in dict.fromkeys(notes):
        print(f"warning: {text}")
    from ..base.units import format_bytes

    print(f"per device: {format_bytes(total)} of arguments")
    return 0


def recorded_name(data: Any) -> str | None:
    """The workload a plan file resolved its specs on, if it names one."""
    resolved = data.get("workload") if isinstance(data, dict) else None
    return resolved.get("name") if isinstance(resolved, dict) else None


def _builtin(name: str | None) -> Any:
    """The built-in workload `name` (never a factory: a file imports nothing), or None."""
    from ..workloads import get_workload, list_workloads

    return get_workload(name) if name in list_workloads() else None


def _load(data: Any, mesh: Any, where: str) -> tuple[Any, Any, Any, tuple[Any, ...] | None]:
    """The rules, the mesh they are bound to, and the leaves the file records."""
    from ..rules.logical import FLAX_FORMAT, FORMAT, rule_from_logical_axis_rules

    if isinstance(data, dict) and data.get("format") in (FORMAT, FLAX_FORMAT):
        state, batch, mesh = rule_from_logical_axis_rules(data, mesh, where)
        leaves = [_table_tree(state)]
        if batch is None:
            from ..rules.batch import BatchShardingRule

            batch = BatchShardingRule(())
        else:
            leaves.append(_table_tree(batch))
        return state, batch, mesh, tuple(leaves)
    from ..plan.reader import ShardingPlan

    plan = ShardingPlan.from_config(data, mesh, where)
    recorded = None
    if plan.leaves is not None:
        recorded = tuple(_flat_tree((leaf.path, leaf.shape, leaf.dtype) for leaf in arg)
                         for arg in plan.leaves)
    return plan.rule, plan.batch_rule, plan.mesh, recorded


def _table_tree(rule: Any) -> dict[str, Any]:
    return _flat_tree((leaf.path, leaf.shape, "float32")
                      for argument in rule.axes.arguments for leaf in argument)


def _flat_tree(leaves: Any) -> dict[str, Any]:
    # A flat dict keyed by path has its leaves at exactly those paths.
    import jax

    return {path: jax.ShapeDtypeStruct(shape, dtype) if shape is not None else None
            for path, shape, dtype in leaves}


def _discovered(chosen: Any, args: tuple[Any, ...]) -> Any:
    """The workload's logical axes, to name each leaf's axes under any plan."""
    try:
        from ..logical.discover import discover_logical_axes

        return discover_logical_axes(chosen.step, args)
    except Exception as err:  # names are a help here, not what was asked for
        print(f"note: logical axes not discovered ({type(err).__name__}: {err})",
              file=sys.stderr)
        return None


def _explain(mesh: Any, args: Sequence[Any], rules: tuple[Any, Any],
             logical: Any) -> tuple[list[str], int]:
    from ..base.analyzer import ShardingAnalyzer
    from ..base.units import format_bytes
    from ..rules.explain import explain_rule

    analyzer = ShardingAnalyzer(mesh)
    rows = [("path", "shape", "logical", "spec", "bytes/device", "why")]
    notes: list[list[str]] = [[]]
    total = 0
    for i, tree in enumerate(args):
        rule = rules[0] if i == 0 else rules[1]
        explained = explain_rule(rule, tree, 0 if i == 0 else i - 1)
        specs = [e.spec for e in explained]
        import jax

        spec_tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree), specs)
        usage_ = analyzer.estimate_memory_usage(tree, spec_tree)
        total += usage_["size_per_device"]
        known = {} if logical is None or i >= len(logical.arguments) else \
            logical.leaves(i)
        for e in explained:
            names = e.names
            if names is None and e.path in known:
                names = known[e.path].names
            leaf = usage_["leaves"].get(e.path)
            rows.append((
                f"{arg_name(i, len(args))}/{e.path}",
                "-" if e.shape is None else "[" + ",".join(map(str, e.shape)) + "]",
                "-" if not names else ",".join(n or "_" for n in names),
                spec_text(e.spec),
                "-" if leaf is None else format_bytes(leaf["bytes_per_device"]),
                e.source))
            notes.append(list(e.notes))
    out = []
    for line, extra in zip(table(rows, right=(4,)).splitlines(), notes, strict=True):
        out.append(line)
        out += [f"    - {note}" for note in extra]
    return out, total


COMMAND = Command("explain",
                  "per leaf of a plan: its logical axes, its spec and why, and bytes per device",
                  add_arguments, run)
