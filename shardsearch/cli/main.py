"""The `shardsearch` command line: parse, call the library, print.

Each command lives in its own module (`optimize`, `export`, `show`, `bench`),
which registers its options and its run function as a `Command`; this module
assembles them and turns their errors into exit codes.

Exit codes: 0 success; 1 the work failed (no candidate completed, a plan that
does not fit the workload); 2 a usage error (bad option, unknown workload,
unreadable storage or file), reported as one line on stderr; 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._version import __version__
from . import bench, export, optimize, show
from .args import Command, UsageError, WorkFailed


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


EXIT_CODES = "exit codes: 0 success, 1 the work failed, 2 usage error"
COMMANDS: tuple[Command, ...] = (optimize.COMMAND, export.COMMAND, show.COMMAND, bench.COMMAND)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: one subcommand per entry of `COMMANDS`."""
    parser = _Parser(
        prog="shardsearch",
        description="Search-based sharding optimizer for JAX: finds PartitionSpecs by "
        "compiling and timing the real step on the real mesh.",
        epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"shardsearch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, epilog=EXIT_CODES,
                           description=command.help[0].upper() + command.help[1:] + ".")
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI with `argv` (default `sys.argv[1:]`); returns the exit code.

    Example: `main(["show", "plan.json"])` prints the plan and returns 0.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version and usage errors end here
        return int(done.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    prog = f"shardsearch {args.command}"
    try:
        return args.run(args)
    except UsageError as err:
        return _fail(prog, err, 2)
    except WorkFailed as err:
        return _fail(prog, err, 1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; finished trials are kept in the study, the same "
              "command resumes it", file=sys.stderr)
        return 130


def _fail(prog: str, err: Exception, code: int) -> int:
    message = " | ".join(line.strip() for line in str(err).splitlines() if line.strip())
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def main_entry() -> None:
    """The console script `shardsearch`: `main()`, then exit with its code."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (`| head`) left; what it did not read is not an error of ours.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
