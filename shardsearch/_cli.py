"""The `shardsearch` command line: parse, call the library, print."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._version import __version__


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="shardsearch",
        description="Search-based sharding optimizer for JAX: finds PartitionSpecs by "
        "compiling and timing the real step on the real mesh.")
    parser.add_argument("--version", action="version", version=f"shardsearch {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI with `argv` (default `sys.argv[1:]`); returns the exit code."""
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return 0


def main_entry() -> None:
    sys.exit(main())
