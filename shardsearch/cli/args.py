"""What every command shares: its registration, its errors, option types and helpers.

A command module defines `COMMAND = Command(name, help, add_arguments, run)`;
`main.build_parser` turns each into a subcommand. A command's `run` raises
`UsageError` (exit code 2) or `WorkFailed` (exit code 1) with one message;
`main.main` prints it as one line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """The user asked for something that cannot be done: exit code 2."""


class WorkFailed(Exception):
    """The request was sound but the work did not succeed: exit code 1."""


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: its name, one-line help, its options and what runs it.

    Example: `Command("show", "print a plan file", add_arguments, run)` becomes
    `shardsearch show ...`, calling `run(namespace)` for its exit code.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --------------------------------------------------------------------------- options


STORAGE_HELP = "Optuna storage URL (default sqlite:///./.shardsearch/studies.db)"


def add_storage(p: argparse.ArgumentParser) -> None:
    """`--storage URL`, as `optimize` and `export` take it."""
    p.add_argument("--storage", metavar="URL", help=STORAGE_HELP)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 ("8" → 8; "0" is refused)."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def count(text: str) -> int:
    """An argparse type: a whole number >= 0 ("0" → 0; "-1", "x" are refused)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def rounds(text: str) -> int:
    """An argparse type: re-timing rounds, 0 (none) or enough for the paired
    test to call a plan faster ("10" → 10; "5" is refused, with the reason:
    a searched plan could never win; see `confirm.check_rounds`)."""
    return _rounds(count(text), zero_ok=True)


def positive_rounds(text: str) -> int:
    """An argparse type: `rounds`, at least one ("0" is refused too)."""
    return _rounds(positive_int(text), zero_ok=False)


def _rounds(value: int, zero_ok: bool) -> int:
    from ..search.evaluation.confirm import check_rounds

    try:
        check_rounds(value, zero_ok=zero_ok)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def device_count(text: str) -> int:
    """An argparse type: simulated devices, 1 to `limits.MAX_SIMULATED_DEVICES`.

    Checked while parsing, before JAX starts: "8" → 8; "100000" is refused
    with the reason instead of minutes of silence.
    """
    from ..base.limits import check_simulated_devices

    try:
        return check_simulated_devices(positive_int(text), "simulated devices")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def study_name(text: str) -> str:
    """An argparse type: a study name, non-empty and printable on one line.

    Example: "gpt-dp2" → "gpt-dp2"; "" and "a\nb" are refused.
    """
    from ..search.study.storage import check_study_name

    try:
        return check_study_name(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 ("2.5" → 2.5; "0", "inf" are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


# --------------------------------------------------------------------------- helpers


def usage(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls a library function on user input; its ValueError/TypeError is a usage error.

    Example: `usage(parse_mesh, "dp=2,tp")` raises `UsageError("mesh 'dp=2,tp': ...")`.
    """
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None


def mesh_option(text: str | None, verb: str) -> Any:
    """The abstract mesh `--mesh AXES` names (None without the option): a plan
    is applied on it with no devices, so every size must be given."""
    if text is None:
        return None
    from ..base.mesh import abstract_mesh, parse_mesh

    dims, names = usage(parse_mesh, text)
    if -1 in dims:
        raise UsageError(f"--mesh {text}: give every size (no -1) to {verb} a plan")
    return usage(abstract_mesh, dims, names)


def read_file(fn: Callable[..., Any], path: str, *args: Any) -> Any:
    """`fn(path, *args)` on a file the user named; an unreadable or malformed
    file is a usage error naming it."""
    try:
        return fn(path, *args)
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror or err}") from None
    except ValueError as err:
        raise UsageError(str(err)) from None


def workload(name: str) -> Any:
    """The workload `--workload NAME` names; any failure to build it is a usage error."""
    from ..workloads import get_workload

    # As under `python -m`, a factory module in the current folder is importable.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return get_workload(name)
    except (Exception, SystemExit) as err:  # a user factory may do anything; it is input
        message = str(err) if isinstance(err, ValueError | TypeError) else \
            f"workload {name!r} could not be built: {type(err).__name__}: {err}"
        raise UsageError(message) from None
