"""The worker process: evaluates one study's candidates for its study process.

Started by `search.isolate` as `python -c "...worker import main..." READ_FD
WRITE_FD PAYLOAD`, or forked with the same arguments from the helper of
`search.execution.spawner`, which has imported JAX already. It sets JAX's
options from the payload before its backend starts, loads the step (a
`jax.export` program, a workload rebuilt by name, or an imported function),
the host arguments and the study's settings, builds the same `Context` the
study process would evaluate with, says "ready", then serves jobs until told
to exit, until its study process goes away, or after `IDLE_EXIT` idle
seconds.

Messages (pickled, over two pipes):
  study → worker: ("evaluate", setting, specs, fp, memory, run, reports, standing),
    ("nonfinite", specs), ("retime", finalists, rounds),
    ("compare", specs, reference_specs, rtol), ("prune", bool) answering a
    report, ("exit",);
  worker → study: ("ready", pid) or ("failed", reason) once; then per job
    ("started",), any number of ("event", "compiling" | "running" | "step")
    and ("report", index, seconds), and last ("done", result, compiles,
    restart) or ("error", reason, compiles).

Its stdout and stderr are the study's log file for this worker: XLA's lines
land there, and the study process reads them per job.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..evaluation.standing import Standing

# Seconds an idle worker waits for work before it exits on its own, so a
# study abandoned by an exception does not leave it behind for long.
IDLE_EXIT = 600.0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the worker; returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    inbox = Connection(int(argv[0]), writable=False)
    outbox = Connection(int(argv[1]), readable=False)
    try:
        payload = pickle.loads(Path(argv[2]).read_bytes())
        _exit_with_parent(payload.get("leftovers", ()))
        ctx = _load(payload, outbox)
    except BaseException as err:  # every failure to start is reported, SystemExit too
        traceback.print_exc()
        outbox.send(("failed", f"{type(err).__name__}: {err}".splitlines()[0]))
        return 1
    outbox.send(("ready", os.getpid()))
    try:
        return serve(ctx, inbox, outbox)
    except (EOFError, BrokenPipeError):
        # The study process is gone (its ends of the pipes closed with it)
        # without cleaning up: what it would have removed goes now.
        _remove(payload.get("leftovers", ()))
        return 0


def _remove(leftovers: Sequence[str]) -> None:
    for folder in leftovers:
        shutil.rmtree(folder, ignore_errors=True)


def _exit_with_parent(leftovers: Sequence[str]) -> None:
    # The worker runs in its own session, so no terminal signal reaches it; a
    # study process killed with -9 must not leave it running a hung step, nor
    # its temporary folders behind. (Its parent is the study process, or the
    # spawner's helper, which exits when the study process does.)
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                _remove(leftovers)
                os._exit(0)

    threading.Thread(target=watch, name="shardsearch-parent-watch", daemon=True).start()


def _load(payload: dict[str, Any], outbox: Connection) -> Any:
    """The study's `Context`, built from the payload the study process wrote."""
    import jax

    for name, value in payload["config"].items():
        if value is not None:
            jax.config.update(name, value)
    # Only now (JAX's backend not started yet) may user modules be imported.
    body = pickle.loads(payload["body"])
    import numpy as np

    from ..evaluation.context import Context
    from .inprocess import InProcess

    abstract_args = jax.tree.unflatten(
        body["treedef"], [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in body["avals"]])
    ids, grid, names, types = body["mesh"]
    step = _step(body["program"], abstract_args, tuple(zip(names, grid, strict=True)))
    target = body["target"]
    # A target's compile-only devices are made by its compiler here, as there.
    devices = {d.id: d for d in (target.devices() if target is not None else jax.devices())}
    missing = [i for i in ids if i not in devices]
    if missing:
        raise RuntimeError(f"the worker has no devices {missing} ({len(devices)} devices); "
                           "check XLA_FLAGS and jax_num_cpu_devices")
    mesh = jax.sharding.Mesh(np.array([devices[i] for i in ids], dtype=object).reshape(grid),
                             names, axis_types=types)
    host_args = None
    if body["host"] is not None:
        file, meta = body["host"]
        with np.load(file) as data:
            leaves = [data[f"a{i}"].view(np.dtype(dtype)).reshape(shape)
                      for i, (shape, dtype) in enumerate(meta)]
        host = jax.tree.unflatten(body["treedef"], leaves)

        def host_args() -> Any:
            return host

    def progress(event: str) -> None:
        outbox.send(("event", event))

    # The steps of other knob settings arrive with the jobs that need them ("steps").
    steps = {(): step}
    ctx = Context(step, abstract_args, mesh, host_args, body["budget"], body["objective"],
                  body["warmup"], body["repeats"], body["compile_timeout"], body["hardware"],
                  executor=InProcess(), progress=progress, dcn_axes=body["dcn_axes"],
                  target=target, steps=steps.__getitem__,
                  # Stage 1 and its prediction are the study process's.
                  memory_prediction="off")
    ctx.programs = steps  # type: ignore[attr-defined]  # filled by the "steps" job
    return ctx


def _step(program: tuple[Any, ...], abstract_args: Any,
          axes: tuple[tuple[str, int], ...]) -> Callable[..., Any]:
    import jax

    from ...base.activations import split_setting, under_rules
    from .transport import jaxpr_digest

    kind, data, *rest = program
    if kind == "export":
        return jax.export.deserialize(bytearray(data)).call
    if kind == "function":
        step, rules = data, rest[1]
    elif kind == "factory":
        step, rules = data(**rest[1]), rest[2]
    else:
        from ...workloads import get_workload

        workload = get_workload(data)
        own, rules = split_setting(rest[1] if len(rest) > 1 else ())
        step = workload.knobs.step(own) if own else workload.step
    step = under_rules(step, rules, axes)
    if jaxpr_digest(jax.make_jaxpr(step)(*abstract_args)) != rest[0]:
        raise RuntimeError(
            f"the step rebuilt in the worker ({data if kind == 'workload' else kind}) traces to "
            "another program than the study's; give the study a step that `jax.export` can "
            "export, or one that its name rebuilds exactly")
    return step


def serve(ctx: Any, inbox: Connection, outbox: Connection) -> int:
    """Answers jobs until told to exit; an error in a job ends the worker."""
    from ...base import monitor  # noqa: F401 - loaded before the first job's clock starts
    from ...base.mesh import axis_sizes
    from ..evaluation import confirm as _confirm
    from ..evaluation import evaluate as _evaluate
    from ..evaluation.stages import FAILED

    def reporter() -> Callable[[int, float], bool]:
        def report(index: int, seconds: float) -> bool:
            outbox.send(("report", index, seconds))
            return bool(inbox.recv()[1])

        return report

    def evaluate(setting: Any, specs: Any, fp: str, memory: dict[str, int], run: bool,
                 reports: bool, standing: Standing) -> tuple[Any, bool]:
        outcome = _evaluate.compile_and_score(specs, fp, ctx.with_setting(setting), memory,
                                              reporter() if reports else None, run, standing)
        # After a raise or a timed-out compile the worker is not to be trusted
        # with the next candidate; NaN leaves nothing behind.
        return outcome, (outcome.status == FAILED
                         and not outcome.reason.startswith(_evaluate.NONFINITE))

    def nonfinite(setting: Any, specs: Any) -> tuple[str | None, bool]:
        try:
            return _evaluate.first_steps(specs, ctx.with_setting(setting)), False
        except Exception:  # the replicated baseline's own trial records it
            traceback.print_exc()
            return None, True

    jobs: dict[str, Callable[..., tuple[Any, bool]]] = {
        "evaluate": evaluate,
        "nonfinite": nonfinite,
        "steps": lambda programs: (_install(programs), False),
        "retime": lambda finalists, rounds: (_confirm.retime(
            [(label, specs, ctx.with_setting(setting)) for label, specs, setting in finalists],
            ctx, rounds), False),
        "compare": lambda setting, specs, reference, rtol: (
            _confirm.compare_outputs(specs, reference, ctx.with_setting(setting), rtol), False),
    }

    def _install(programs: dict[Any, Any]) -> None:
        axes = tuple(axis_sizes(ctx.mesh).items())
        for setting, program in programs.items():
            ctx.programs[setting] = _step(program, ctx.abstract_args, axes)

    while inbox.poll(IDLE_EXIT):
        kind, *args = inbox.recv()  # EOFError: the study process is gone (`main`)
        if kind == "exit":
            return 0
        outbox.send(("started",))
        before = ctx.compiles
        try:
            result, restart = jobs[kind](*args)
        except Exception as err:
            traceback.print_exc()
            outbox.send(("error", f"{type(err).__name__}: {err}".splitlines()[0],
                         ctx.compiles - before))
            return 1
        outbox.send(("done", result, ctx.compiles - before, restart))
    return 0
