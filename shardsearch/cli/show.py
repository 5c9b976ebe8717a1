"""`shardsearch show`: print a plan file; with a workload, every leaf's spec and bytes."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from .args import Command, mesh_option, read_file, workload
from .render import arg_name, axes, leaf_table, plan_header, results_table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a plan file written by optimize or export")
    p.add_argument("--workload", metavar="NAME",
                   help="also list every leaf's spec and bytes per device on this workload")
    p.add_argument("--mesh", metavar="AXES",
                   help="apply on these axis sizes instead of the recorded ones (same axis "
                        "names), e.g. dp=4,tp=8; needs no devices")


def run(a: argparse.Namespace) -> int:
    from ..plan.reader import PlanMismatchWarning, load_plan

    mesh = mesh_option(a.mesh, "show")
    plan = read_file(load_plan, a.file, mesh)
    config = read_json(a.file)
    print(plan_header(a.file, config, plan))
    search = config.get("search") if isinstance(config.get("search"), dict) else {}
    for text in search.get("notes") or ():
        print(f"warning: {text}")
    if plan.results is not None:
        try:
            print(results_table(config))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            # Loading needs only the rules; a hand-edited results section is not fatal.
            print(f"note: {a.file}: the 'results' section is not as `optimize` writes it; "
                  "not shown", file=sys.stderr)
    if a.workload is None:
        return 0
    chosen = workload(a.workload)
    args = chosen.abstract()
    fit = f"the plan does not fit {chosen.name} on mesh {axes(plan.mesh)}"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PlanMismatchWarning)
            specs = plan.apply(args)
    except ValueError as err:  # a path rule refuses a dim it cannot split
        print(f"{fit}: {err}", file=sys.stderr)
        return 1
    for w in caught:
        print(f"note: {w.message}", file=sys.stderr)
    print(leaf_table(plan.mesh, args, specs))
    from ..base.analyzer import ShardingAnalyzer

    analyzer = ShardingAnalyzer(plan.mesh)
    problems = [f"{arg_name(i, len(args))}/{problem}"
                for i, (tree, tree_specs) in enumerate(zip(args, specs, strict=True))
                for problem in analyzer.validate_partition_specs(tree, tree_specs)]
    if problems:
        print(f"{fit}: {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    return 0


def read_json(path: str) -> dict[str, Any]:
    """The plan file's JSON, for the sections to print."""
    from ..base.jsonfile import read_json as read

    # load_plan has checked the file already; this only gets the sections to print.
    return read(path)


COMMAND = Command("show",
                  "print a plan file; with --workload, every leaf's spec and bytes per device",
                  add_arguments, run)
