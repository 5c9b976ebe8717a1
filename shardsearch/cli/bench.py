"""`shardsearch bench`: run a benchmark suite, entry by entry, and write its report."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from .._version import __version__
from .args import (
    Command,
    UsageError,
    WorkFailed,
    device_count,
    positive_int,
    positive_rounds,
    usage,
)

# The suites shipped in shardsearch/bench/suites/, named in --help without
# importing the benchmark code (a test checks the list against the files).
BUILTIN_SUITES = ("cpu-sim8", "cpu-sim8-activations", "cpu-sim8-knobs", "cpu-static256",
                  "cpu-static64", "cpu-static64-knobs", "gpu-1", "gpu-8", "published",
                  "published-chip", "tpu-v5e-8")


class _WholeNames(argparse.HelpFormatter):
    """Wraps help between words only, so a suite name such as cpu-static256
    is never split at its hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = _WholeNames
    p.add_argument("--suite", required=True, metavar="NAME|FILE",
                   help=f"a suite shipped with shardsearch ({', '.join(BUILTIN_SUITES)}), a "
                        "name looked up in --suites-dir, or a path to a suite file")
    p.add_argument("--suites-dir", metavar="DIR",
                   help="look suite names up in DIR (its <name>.json files) instead of the "
                        "suites shipped with shardsearch")
    p.add_argument("--out", default="benchmarks/results", metavar="DIR",
                   help="results go to DIR/<suite>/, relative to the current folder (default "
                        "benchmarks/results)")
    p.add_argument("--rules", default="rules", metavar="DIR",
                   help="winners are exported to DIR/<suite>/<entry>.json, relative to the "
                        "current folder (default rules)")
    p.add_argument("--start-from", metavar="DIR",
                   help="evaluate DIR/<suite>/<entry>.json (another run's --rules folder) "
                        "beside each entry's baselines, where it exists: the winner is then "
                        "never worse than that plan in the search")
    p.add_argument("--entries", metavar="ID,ID",
                   help="run only these entries (default all; see --list)")
    p.add_argument("--devices", type=device_count, metavar="N",
                   help="simulate N CPU devices (default: the suite's count when it "
                        "simulates its devices)")
    p.add_argument("--force", action="store_true",
                   help="rerun entries that already have a result (their studies resume)")
    p.add_argument("--list", action="store_true", help="list the suite's entries and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar during searches")
    quick = p.add_argument_group("overrides for quick checks (recorded in each entry)")
    quick.add_argument("--trials", type=positive_int, metavar="N",
                       help="trials per entry instead of the suite's")
    quick.add_argument("--repeats", type=positive_int, metavar="N",
                       help="timed steps per candidate in the search")
    quick.add_argument("--rounds", type=positive_rounds, metavar="N",
                       help="interleaved rounds of the comparison run")
    quick.add_argument("--memory-prediction", choices=("cut", "record", "off"),
                       default="cut",
                       help="what stage 1 does with each candidate's memory predicted from the "
                            "jaxpr (optimize --memory-prediction; default cut); record compiles "
                            "every candidate, so the report counts the cuts that would be wrong")


def run(a: argparse.Namespace) -> int:
    from ..bench.runner import run_suite
    from ..bench.suite import load_suite, prepare_devices

    _existing_folder("--suites-dir", a.suites_dir, "<name>.json suite files")
    _existing_folder("--start-from", a.start_from,
                     "<suite>/<entry>.json plan files (another run's --rules folder)")
    suite = usage(load_suite, a.suite, a.suites_dir)
    ids = [i.strip() for i in a.entries.split(",") if i.strip()] if a.entries else None
    selected = usage(suite.select, ids)
    if a.list:
        for e in suite.entries:
            limit = " ".join(x for x in (f"{e.trials} trials" if e.trials else "",
                                         f"{e.timeout:g} s" if e.timeout else "") if x)
            print(f"{e.id}: {e.workload_name} on {e.mesh}, {e.objective}, {limit}, budget "
                  f"{e.budget or 'none'}")
        return 0
    # Before anything asks JAX for devices: the count is fixed at backend start.
    usage(prepare_devices, suite, a.devices)
    command = command_line(a)
    print(f"shardsearch {__version__}: suite {suite.name} ({suite.path}), {len(selected)} "
          f"entries, results in {Path(a.out) / suite.name}", flush=True)
    done = run_suite(suite, out=a.out, rules_dir=a.rules, entries=ids, force=a.force,
                     trials=a.trials, repeats=a.repeats, rounds=a.rounds, quiet=a.quiet,
                     command=command, log=lambda line: print(line, flush=True),
                     start_from=a.start_from, memory_prediction=a.memory_prediction)
    for note in done.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {done.folder / 'results.md'}: {len(done.finished)} entries run, "
          f"{len(done.skipped)} already done, {len(done.failed)} failed")
    if done.failed:
        raise WorkFailed(f"{len(done.failed)} entries failed ({', '.join(done.failed)}); "
                         "the same command retries them")
    return 0


def _existing_folder(option: str, value: str | None, holding: str) -> None:
    """A folder option that was given must name a folder; one line if not."""
    if value is not None and not Path(value).is_dir():
        where = "" if Path(value).is_absolute() else f" (in {Path.cwd()})"
        raise UsageError(f"{option} {value}{where}: no such folder; give a folder of "
                         f"{holding}")


def command_line(a: argparse.Namespace) -> str:
    """The command line that repeats this run, for machine.json.

    Example: `shardsearch bench --suite cpu-sim8 --entries mlp-small-dp8 --force`.
    """
    import shlex

    parts = ["shardsearch", "bench", "--suite", a.suite]
    for flag in ("suites_dir", "out", "rules", "start_from", "entries", "devices", "trials",
                 "repeats", "rounds"):
        value = getattr(a, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}", str(value)]
    parts += [f"--{f}" for f in ("force", "quiet") if getattr(a, f)]
    if a.memory_prediction != "cut":
        parts += ["--memory-prediction", a.memory_prediction]
    return shlex.join(parts)


COMMAND = Command("bench",
                  "run a benchmark suite: search each entry, compare with every expert plan",
                  add_arguments, run)
