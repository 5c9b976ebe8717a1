"""The `shardsearch` command line: parse, call the library, print.

Each command lives in its own module (`optimize`, `export`, `show`, `explain`,
`bench`, `calibrate`, `confirm`, `launch`, `dashboard`), which registers its
options and its run function as a `Command`; this module assembles them and
turns their errors into exit codes.

Exit codes: 0 success; 1 the work failed (no candidate completed, a plan that
does not fit the workload); 2 a usage error (bad option, unknown workload,
unreadable storage or file), reported as one line on stderr; 130 interrupted
(Ctrl-C, SIGINT); 143 terminated (SIGTERM). Both signals end a command the
same way: the exception unwinds through the library, which marks the running
trial failed ("interrupted") and closes the storage; a compile still running
in a thread makes the console script leave without Python's shutdown (see
`main_entry`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from .._version import __version__
from ..base.interrupts import Terminated, handle_signals
from . import bench, calibrate, confirm, dashboard, explain, export, launch, optimize, show
from .args import Command, UsageError, WorkFailed


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


EXIT_CODES = ("exit codes: 0 success, 1 the work failed, 2 usage error, 130 interrupted, 143 "
              "terminated")
COMMANDS: tuple[Command, ...] = (optimize.COMMAND, export.COMMAND, show.COMMAND,
                                 explain.COMMAND, bench.COMMAND, calibrate.COMMAND,
                                 confirm.COMMAND, launch.COMMAND, dashboard.COMMAND)
# The shell's convention, 128 + the signal's number.
INTERRUPTED, TERMINATED = 128 + signal.SIGINT, 128 + signal.SIGTERM


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
        # What was asked, as given: a command may rerun itself in a child (`supervise`).
        args.argv = list(sys.argv[1:] if argv is None else argv)
    except SystemExit as done:  # --help, --version and usage errors end here
        return int(done.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    prog = f"shardsearch {args.command}"
    try:
        with handle_signals():
            return args.run(args)
    except UsageError as err:
        return _fail(prog, err, 2)
    except WorkFailed as err:
        return _fail(prog, err, 1)
    except KeyboardInterrupt as stop:
        # A command may say what became of its work (optimize: is the study kept?).
        note = str(stop) or "finished trials are kept in the study, the same command resumes it"
        terminated = isinstance(stop, Terminated)
        print(f"{prog}: {'terminated' if terminated else 'interrupted'}; {note}",
              file=sys.stderr)
        return TERMINATED if terminated else INTERRUPTED


def _fail(prog: str, err: Exception, code: int) -> int:
    message = " | ".join(line.strip() for line in str(err).splitlines() if line.strip())
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def main_entry() -> None:
    """The console script `shardsearch`: `main()`, then exit with its code.

    While a thread of ours is still inside XLA (a compile that an interrupt,
    or its timeout, left running), or when one of several JAX processes ends
    with an error, the process leaves with `os._exit` once the output is
    flushed: Python's shutdown would stop such a thread when it comes back
    from C++ (or wait at JAX's shutdown barrier for peers that left), and
    the runtime then aborts ("terminate called after throwing ...", exit
    134) instead of exiting with our code. Everything worth keeping was
    committed (the study) or written (files) before; only exit handlers are
    skipped.
    """
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (`| head`) left; what it did not read is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    if _threads_in_flight() or (code != 0 and _still_joined()):
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _still_joined() -> bool:
    # One of several JAX processes leaving on an error or an interrupt: JAX's
    # exit handler would wait at its shutdown barrier for peers that already
    # left (they were told, `search.distributed.announce_exit`), then abort.
    # A clean end passed that barrier in `optimize` already.
    module = sys.modules.get("jax._src.distributed")
    return module is not None and getattr(module.global_state, "client", None) is not None


def _threads_in_flight() -> bool:
    # Ours are named "shardsearch-..." (compiles, heartbeats); only they call
    # into XLA or the storage from a second thread. Listed is enough, alive or
    # not: a compile thread whose join was interrupted still has to take the
    # interpreter's lock once more on its way out, which Python's shutdown
    # turns into the abort.
    return any(t.name.startswith("shardsearch-") for t in threading.enumerate())
