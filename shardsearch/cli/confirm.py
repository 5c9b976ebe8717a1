"""`shardsearch confirm`: re-time a stored study's finalists and record its winner."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .args import (
    Command,
    UsageError,
    WorkFailed,
    add_storage,
    count,
    device_count,
    positive_int,
    positive_rounds,
    study_name,
    usage,
    workload,
)

if TYPE_CHECKING:
    from ..search.result import OptimizeResult
    from ..workloads import Workload


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study", "--study-name", dest="study", required=True, type=study_name,
                   metavar="NAME", help="the stored study (its workers have finished)")
    add_storage(p)
    p.add_argument("--workload", metavar="NAME",
                   help="the study's workload (default: the study's, if built in)")
    p.add_argument("--devices", type=device_count, metavar="N",
                   help="simulate N CPU devices (the study's mesh must fit)")
    p.add_argument("--rounds", type=positive_rounds, default=10, metavar="N",
                   help="interleaved re-timing rounds of the finalists (default 10)")
    p.add_argument("--warmup", type=count, default=2, metavar="N",
                   help="untimed steps of the output check (default 2)")
    p.add_argument("--repeats", type=positive_int, default=7, metavar="N",
                   help="timed steps of the output check (default 7)")
    p.add_argument("--out", metavar="FILE", help="also write the winner's plan file here")


def run(a: argparse.Namespace) -> int:
    from .optimize import make_mesh, simulate_devices

    if a.devices is not None:
        simulate_devices(a.devices)  # before anything asks JAX for devices
    from ..base.secrets import redact_url
    from ..search.reconfirm import NotRecorded, confirm_study
    from ..search.study.storage import default_storage, open_study

    storage = a.storage or default_storage()
    study = usage(open_study, storage, a.study, create=False)
    axes = dict(study.user_attrs.get("mesh") or {})
    if not axes:
        raise UsageError(f"study {a.study!r} in {redact_url(storage)} has no shardsearch "
                         "attributes; confirm studies that `shardsearch optimize` ran")
    mesh = make_mesh([int(v) for v in axes.values()], [str(k) for k in axes])
    chosen = workload(a.workload) if a.workload else None
    try:
        result = confirm_study(storage, a.study, mesh=mesh, workload=chosen, rounds=a.rounds,
                               warmup=a.warmup, repeats=a.repeats)
    except ValueError as err:
        raise UsageError(str(err)) from None
    except NotRecorded as err:  # the re-timing ran: keep it in the plan file
        _write(err.result, chosen, a.out)
        raise WorkFailed(str(err) + ("" if a.out else "; --out FILE keeps the re-timing in a "
                                     "plan file")) from None
    except RuntimeError as err:  # no candidate completed
        raise WorkFailed(str(err)) from None
    print(f"study {a.study!r}: {result.best_label} wins ({result.verdict}, "
          f"{result.best_time * 1e3:.3f} ms); recorded as confirmed by `shardsearch confirm`")
    _write(result, chosen, a.out)
    return 0


def _write(result: OptimizeResult, workload: Workload | None, out: str | None) -> None:
    """The winner's plan file at `out` (nothing without one)."""
    from ..plan.writer import write_config
    from ..search.export import export_config

    if not out:
        return
    try:
        written = write_config(export_config(result, workload=workload), out)
    except OSError as err:
        raise WorkFailed(f"cannot write {out}: {err.strerror or err}") from None
    print(f"wrote {written}", flush=True)


COMMAND = Command("confirm", "re-time a stored study's finalists (after its workers) and "
                  "record the winner", add_arguments, run)
