"""`shardsearch export`: write the winner (or a chosen trial) of a stored study to a file."""

from __future__ import annotations

import argparse
import sys

from .args import Command, UsageError, add_storage, count, study_name, usage, workload


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study", required=True, type=study_name, metavar="NAME",
                   help="the stored study")
    add_storage(p)
    p.add_argument("--trial", type=count, metavar="N",
                   help="export trial N instead of the study's winner")
    p.add_argument("--workload", metavar="NAME",
                   help="resolve specs on this workload (default: the study's, if built in; "
                        "a study run on a factory needs it named here)")
    p.add_argument("--out", required=True, metavar="FILE", help="file to write")
    p.add_argument("--format",
                   choices=("json", "partition-rules", "logical-axis-rules", "flax-rules"),
                   default="json",
                   help="json: the plan file (default); partition-rules: Python source with "
                        "PARTITION_RULES = [(regex, PartitionSpec), ...]; logical-axis-rules: "
                        "JSON with [logical_name, mesh_axes] pairs and each parameter's "
                        "logical names (a plan of the logical family; load_rule reads it); "
                        "flax-rules: the same, its rules ordered so that Flax's own "
                        "nn.logical_to_mesh_axes gives the measured specs (or an error "
                        "naming the leaves it cannot)")


def run(a: argparse.Namespace) -> int:
    from ..plan.writer import write_config
    from ..search.export import export_config
    from ..search.study.storage import default_storage, open_study

    storage = a.storage or default_storage()
    study = usage(open_study, storage, a.study, create=False)
    chosen = workload(a.workload) if a.workload else None
    try:
        config = export_config(study, workload=chosen, trial=a.trial)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if config["workload"] is None:
        if a.format == "partition-rules":
            raise UsageError(
                f"study {a.study!r} ran on a raw step, so its specs cannot be resolved; "
                "name the workload with --workload to write partition rules")
        print(f"note: study {a.study!r} ran on a raw step; the plan has its rules, mesh and "
              "results but no resolved specs (name the workload with --workload)",
              file=sys.stderr)
    try:
        written = write_config(config, a.out, format=a.format)
    except OSError as err:
        raise UsageError(f"cannot write {a.out}: {err.strerror or err}") from None
    except ValueError as err:  # not logical, or rules Flax cannot resolve alike
        raise UsageError(str(err)) from None
    print(f"wrote {written} ({a.format}): {config['results']['winner']['label']} "
          f"(trial {config['results']['winner']['trial']}) of study {a.study!r}")
    return 0


COMMAND = Command("export", "write the winner (or a chosen trial) of a stored study to a file",
                  add_arguments, run)
