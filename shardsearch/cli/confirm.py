"""`shardsearch confirm`: re-time a stored study's finalists and record its winner."""

from __future__ import annotations

import argparse

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
    from ..plan.writer import write_config
    from ..search.export import export_config
    from ..search.reconfirm import confirm_study
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
    except RuntimeError as err:  # no candidate completed
        raise WorkFailed(str(err)) from None
    print(f"study {a.study!r}: {result.best_label} wins ({result.verdict}, "
          f"{result.best_time * 1e3:.3f} ms); recorded as confirmed by `shardsearch confirm`")
    if a.out:
        try:
            written = write_config(export_config(result, workload=chosen), a.out)
        except OSError as err:
            raise WorkFailed(f"cannot write {a.out}: {err.strerror or err}") from None
        print(f"wrote {written}")
    return 0


COMMAND = Command("confirm", "re-time a stored study's finalists (after its workers) and "
                  "record the winner", add_arguments, run)
