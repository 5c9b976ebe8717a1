"""Isolated evaluation: candidates compile and run in a supervised worker process.

A candidate can take its process down: a step that raises on one device of
a multi-device CPU mesh leaves the others waiting in a collective until XLA
aborts (SIGABRT after about a minute), a custom call can segfault, a host
callback can hang. Kernel autotuners run candidates apart for the same
reason. `Isolation` keeps one worker process per study (`search.worker`),
reused between candidates, and watches it:

- a worker that dies (any signal) fails the candidate it was running
  ("worker killed by SIGSEGV while measuring");
- a worker that finishes no step within `execute_timeout` seconds is killed
  ("no step finished within 30 s"), and one that compiles past
  `compile_timeout` plus a grace period too;
- a step that raises fails its candidate ("step raised while measuring: ...");
- the next candidate gets a fresh worker, and the study goes on.

Stage 1 (the analyzer's checks) stays in the study process; the worker runs
stage 2, the objective, the confirmation's re-timing and the output check,
with the same code the study process runs without isolation
(`evaluate.compile_and_score`, `confirm.retime`, `confirm.compare_outputs`),
so every measured number still goes through `create_monitored_function`.

How the step reaches the worker is `search.transport`'s part: a `jax.export`
program, else a reference, else not at all (then `isolate=None` evaluates
in-process with an `IsolationWarning`, and `isolate=True` raises ValueError).

The objective and hardware model are pickled (by reference for classes, so
a user's objective must be importable too). The host arguments are saved
once per study in a temporary folder, with the export; the worker reads
them and places a fresh copy for each candidate. The worker starts with the
study process's JAX configuration (platforms, CPU device count, x64, the
persistent compilation cache, which the worker always has: the study's, or
a temporary one shared by this process's workers) and `XLA_FLAGS`, in a new
session, so Ctrl-C reaches only the study process, which stops it.

On GPUs, the study process should not preallocate device memory
(`XLA_PYTHON_CLIENT_PREALLOCATE=false` before JAX starts; the command line
sets it), or the worker finds most of it taken.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ...base.knobs import Setting, setting_text
from ...base.warnings import ShardsearchWarning
from ..evaluation import logs as _logs
from ..evaluation.context import Context
from ..evaluation.evaluate import error_line
from ..evaluation.outcome import Outcome
from ..evaluation.stages import FAILED
from ..evaluation.standing import NO_STANDING, Standing
from .base import Base
from .spawner import Forked, prestart, spawn
from .transport import package_step, travels

if TYPE_CHECKING:
    from ...workloads import Workload

# Seconds a new worker may take to import JAX, load the step and say it is ready.
START_TIMEOUT = 300.0

# Seconds past `compile_timeout` before a worker still compiling is stopped; the
# worker's own timeout fires first unless XLA holds on to the interpreter.
COMPILE_GRACE = 60.0

# The JAX options a worker copies from the study process.
CONFIG = ("jax_platforms", "jax_num_cpu_devices", "jax_enable_x64",
          "jax_default_matmul_precision", "jax_use_shardy_partitioner",
          "jax_threefry_partitionable", "jax_default_prng_impl",
          "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")

# What a worker is doing, by job and by the last event it reported, as the
# reasons of failed candidates say it.
PHASES = {
    "evaluate": {"compiling": "compiling", "running": "measuring"},
    "nonfinite": {"compiling": "compiling the replicated plan",
                  "running": "running the replicated plan"},
    "retime": {"compiling": "compiling a finalist", "running": "confirming"},
    "compare": {"compiling": "compiling for the output check",
                "running": "checking outputs"},
    "steps": {"compiling": "loading the step of a knob setting",
              "running": "loading the step of a knob setting"},
}


class IsolationWarning(ShardsearchWarning):
    """Candidates are evaluated in the study process: the step cannot reach a worker."""


class WorkerLost(RuntimeError):
    """The worker died, hung, raised or could not start; the message says which.

    Attributes:
      log: what the worker printed during the lost job (`logs.LogLines`).
    """

    def __init__(self, reason: str, log: _logs.LogLines | None = None):
        super().__init__(reason)
        self.log = log or _logs.LogLines()


_SHARED_CACHE: list[Path] = []


def _worker_cache() -> str:
    """The compilation cache of workers whose study process has none: one
    temporary folder per study process, so a restarted worker, and the next
    study's, compile from disk."""
    if not _SHARED_CACHE:
        path = Path(tempfile.mkdtemp(prefix="shardsearch-jax-cache-"))
        atexit.register(shutil.rmtree, path, True)
        _SHARED_CACHE.append(path)
    return str(_SHARED_CACHE[0])


def _jax_config() -> dict[str, Any]:
    config = {}
    for name in CONFIG:
        with contextlib.suppress(AttributeError):
            config[name] = getattr(jax.config, name)
    if not config.get("jax_compilation_cache_dir"):
        config["jax_compilation_cache_dir"] = _worker_cache()
        # Everything, however quick: the cache is there to make restarts cheap.
        config["jax_persistent_cache_min_compile_time_secs"] = 0.0
    return config


def _save_host_args(host_args: Callable[[], Any], folder: Path) -> tuple[str, list[Any]]:
    """Writes the host arguments' leaves as raw bytes (keeps bfloat16 and
    friends, which .npz would not) and returns the file and `(shape, dtype)`s."""
    leaves = jax.tree.leaves(host_args())
    path = folder / "host_args.npz"
    np.savez(path, **{f"a{i}": np.ascontiguousarray(x).reshape(-1).view(np.uint8)
                      for i, x in enumerate(leaves)})
    return str(path), [(tuple(x.shape), x.dtype.name) for x in leaves]


class Isolation(Base):
    """The worker process of one study and what it needs to start: an
    `Executor` (`execution.base`).

    Built by `make_context(isolate=...)` through `prepare`; `evaluate`,
    `retime`, `compare_outputs` and `nonfinite_under` reach it through the
    context's `executor`. The worker starts on first use (or `start`), is reused between
    candidates, and is replaced after it dies, hangs or a candidate fails in
    it. `close` stops it; the folder goes when the object does.

    Attributes:
      forced: `isolate=True` (errors) rather than None (falls back, warns).
      transport: how the step travels: "export", "workload" or "function".
      starts: how many workers have started (1 + restarts).
    """

    def __init__(self, folder: Path, transport: str, forced: bool,
                 workload: Workload | None = None):
        self.folder, self.transport, self.forced = folder, transport, forced
        self.workload = workload
        # Knob settings' steps as packed for a worker, and why one cannot travel.
        self.programs: dict[Setting, tuple[Any, ...] | str] = {}
        self.starts = 0
        self._live: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _cleanup, folder, self._live)

    @classmethod
    def prepare(cls, ctx: Context, workload: Workload | None, forced: bool) -> Isolation | None:
        """Packs the context's step, arguments and settings for a worker.

        Returns None, with an `IsolationWarning`, when they cannot travel and
        isolation was not `forced`; None without a warning in a multi-process
        run (`jax.process_count() > 1`) and on TPU chips this process holds
        (libtpu lets one process open them), where candidates run in-process.

        Raises:
          ValueError: `forced` and they cannot travel.
        """
        if jax.process_count() > 1:
            # A worker would not join the other processes' runtime (their devices,
            # their collectives): multi-process runs evaluate in-process, as documented.
            if forced:
                raise ValueError("optimize: isolate=True is not supported in a multi-process "
                                 f"run ({jax.process_count()} JAX processes); pass "
                                 "isolate=None or False")
            return None
        device = ctx.mesh.devices.flat[0]
        if device.platform == "tpu" and device in jax.devices():
            # libtpu lets one process hold a host's chips: a worker could not
            # open them while this process does (measured on a v5e: "Unable to
            # initialize backend 'tpu': ... libtpu multi-process lockfile").
            if forced:
                raise ValueError("optimize: isolate=True, but this process holds the TPU "
                                 "and a worker process cannot open it while it does; pass "
                                 "isolate=None or False (--no-isolate)")
            return None
        program, why = package_step(ctx.step, workload, ctx.abstract_args, device.platform,
                                    ctx.builds)
        why = "; ".join(w for w in (why, travels(ctx.objective),
                                    travels(ctx.hardware) if ctx.hardware else "") if w)
        folder = None
        if not why:
            folder = Path(tempfile.mkdtemp(prefix="shardsearch-worker-"))
            try:
                _write_payload(folder, ctx, program)
            except Exception as err:  # a tree or setting that does not pickle
                shutil.rmtree(folder, ignore_errors=True)
                why = f"the study's settings cannot be saved for a worker ({error_line(err)})"
        if why:
            if forced:
                raise ValueError(
                    f"optimize: isolate=True, but the step cannot run in a worker process: "
                    f"{why}; make it exportable or importable, or pass isolate=False")
            warnings.warn(f"shardsearch: evaluating candidates in this process, without a "
                          f"worker to survive crashes: {why}", IsolationWarning, stacklevel=4)
            return None
        # The helper that forks workers imports JAX while this process goes
        # on setting the study up.
        prestart(_worker_env())
        return cls(folder, program[0], forced, workload)

    @property
    def pid(self) -> int | None:
        """The running worker's process id, or None."""
        return self._live[0].pid if self._live and self._live[0].alive() else None

    def start(self) -> bool:
        """Starts the worker now (`optimize` does so before its first trial).

        Returns False, with an `IsolationWarning`, when it cannot start and
        isolation was not forced: the caller then evaluates in-process.

        Raises:
          ValueError: it cannot start and isolation was forced.
        """
        try:
            self._worker()
            return True
        except WorkerLost as lost:
            self.close()
            if self.forced:
                raise ValueError(f"optimize: the evaluation worker did not start: {lost}; "
                                 "pass isolate=False to evaluate in this process") from None
            warnings.warn(f"shardsearch: evaluating candidates in this process: the worker "
                          f"did not start: {lost}", IsolationWarning, stacklevel=3)
            return False

    def close(self) -> None:
        """Stops the worker, if one runs."""
        while self._live:
            self._live.pop().stop(graceful=True)

    # ------------------------------------------------------------------ jobs

    def evaluate(self, ctx: Context, specs: Sequence[Any], fp: str, memory: dict[str, int],
                 report: Callable[[int, float], bool] | None, run: bool,
                 standing: Standing = NO_STANDING) -> tuple[Outcome, _logs.LogLines]:
        """Stage 2 and the objective in the worker; a lost worker fails the candidate."""
        # The study's standing changes with every trial, so it travels with
        # the job rather than in the payload written once.
        job = ("evaluate", ctx.setting, tuple(specs), fp, dict(memory), run,
               report is not None, standing)
        try:
            return self._request(ctx, job, report, (ctx,))
        except WorkerLost as lost:
            return Outcome(fp, FAILED, None, str(lost), memory=dict(memory)), lost.log

    def nonfinite_under(self, ctx: Context, specs: Sequence[Any]) -> str | None:
        """`evaluate.nonfinite_under` in the worker; None when the worker is lost."""
        try:
            problem, log = self._request(ctx, ("nonfinite", ctx.setting, tuple(specs)),
                                         contexts=(ctx,))
        except WorkerLost as lost:
            problem, log = None, lost.log
        if ctx.verbose:
            _logs.echo(log.text, "the replicated plan")
        return problem

    def retime(self, ctx: Context, finalists: Sequence[tuple[str, Sequence[Any]]],
               rounds: int) -> dict[str, Any]:
        """`confirm.retime` in the worker.

        Raises:
          RuntimeError: the worker was lost.
        """
        own = [f[2] if len(f) > 2 else ctx for f in finalists]
        job = ("retime", [(f[0], tuple(f[1]), c.setting) for f, c in zip(finalists, own,
                                                                        strict=True)], rounds)
        return self._finishing(ctx, job, "the finalists' re-timing", own)

    def compare_outputs(self, ctx: Context, specs: Sequence[Any],
                        reference_specs: Sequence[Any], rtol: float) -> tuple[bool, float]:
        """`confirm.compare_outputs` in the worker.

        Raises:
          RuntimeError: the worker was lost.
        """
        job = ("compare", ctx.setting, tuple(specs), tuple(reference_specs), rtol)
        return self._finishing(ctx, job, "the output check", (ctx,))

    def _finishing(self, ctx: Context, job: tuple[Any, ...], what: str,
                   contexts: Sequence[Context]) -> Any:
        try:
            result, log = self._request(ctx, job, contexts=contexts)
        except WorkerLost as lost:
            if ctx.verbose:
                _logs.echo(lost.log.text, what)
            raise RuntimeError(f"{what} failed: {lost}") from None
        if ctx.verbose:
            _logs.echo(log.text, what)
        return result

    # ------------------------------------------------------------------ supervision

    def _worker(self) -> _Worker:
        if self._live and self._live[0].alive():
            return self._live[0]
        self.close()
        self.starts += 1
        worker = _Worker(self.folder, self.starts)
        self._live.append(worker)
        try:
            worker.wait_ready(START_TIMEOUT)
        except WorkerLost:
            self.close()
            raise
        return worker

    def _request(self, ctx: Context, job: tuple[Any, ...],
                 report: Callable[[int, float], bool] | None = None,
                 contexts: Sequence[Context] = ()) -> tuple[Any, _logs.LogLines]:
        """Sends one job and supervises it; `(result, log lines)`. The steps
        of the knob settings of `contexts` go first, to a worker that lacks
        them.

        Raises:
          WorkerLost: the worker died, hung or raised (it is stopped; the
            next job starts another), or a setting's step cannot travel.
        """
        for attempt in (1, 2):
            worker = self._worker()
            missing = {c.setting: self._program(c) for c in contexts
                       if c.setting not in worker.settings}
            try:
                if missing:
                    self._exchange(ctx, worker, ("steps", missing), None)
                    worker.settings.update(missing)
                result, restart = self._exchange(ctx, worker, job, report)
            except _Gone:
                # Gone before it took the job (it had idled out, or died
                # between jobs): the job never ran, so a fresh worker gets it.
                worker.stop()
                if attempt == 2:
                    raise WorkerLost("the worker exited before taking the job",
                                     worker.take_log()) from None
                continue
            except WorkerLost as lost:
                worker.stop()
                lost.log = worker.take_log()
                raise
            except BaseException:  # Ctrl-C, or a report callback that raised
                worker.stop()  # mid-job: it cannot serve another
                raise
            log = worker.take_log()
            if restart:
                # A step that raised can leave errors queued in the runtime,
                # and a timed-out compile keeps running in its thread.
                worker.stop()
            return result, log
        raise AssertionError("unreachable")

    def _exchange(self, ctx: Context, worker: _Worker, job: tuple[Any, ...],
                  report: Callable[[int, float], bool] | None) -> tuple[Any, bool]:
        phases = PHASES[job[0]]
        event, started = "compiling", False
        try:
            worker.send(job)
        except OSError:
            raise _Gone() from None
        worker.busy = True  # until it answers: Ctrl-C meanwhile kills it at once
        while True:
            wait = (ctx.compile_timeout + COMPILE_GRACE if event == "compiling"
                    else ctx.execute_timeout)
            if not worker.poll(wait):
                worker.stop()
                if event == "compiling":
                    raise WorkerLost(f"no answer within {wait:g} s while {phases[event]} "
                                     f"(compile_timeout={ctx.compile_timeout:g} s)")
                raise WorkerLost(f"no step finished within {ctx.execute_timeout:g} s"
                                 + ("" if job[0] == "evaluate" else f" while {phases[event]}"))
            try:
                message = worker.recv()
            except (EOFError, OSError):
                if not started:
                    raise _Gone() from None
                raise WorkerLost(f"{worker.death()} while {phases[event]}") from None
            kind = message[0]
            if kind == "started":
                started = True
            elif kind == "event":
                event = "compiling" if message[1] == "compiling" else "running"
            elif kind == "report":
                _index, seconds = message[1], message[2]
                worker.send(("prune", bool(report(_index, seconds)) if report else False))
            elif kind == "done":
                _, result, compiles, restart = message
                ctx.count_compiles(compiles)
                worker.busy = False
                return result, restart
            elif kind == "error":
                ctx.count_compiles(message[2])
                worker.busy = False
                raise WorkerLost(f"the worker raised while {phases[event]}: {message[1]}")
            else:
                raise WorkerLost(f"the worker sent {kind!r}, which the study process does "
                                 "not know; are both the same shardsearch version?")


    def _program(self, ctx: Context) -> tuple[Any, ...]:
        """The step of `ctx`'s knob setting packed for a worker (once per setting).

        Raises:
          WorkerLost: it cannot travel (say why).
        """
        setting = ctx.setting
        if setting not in self.programs:
            device = ctx.mesh.devices.flat[0]
            program, why = package_step(ctx.step, self.workload, ctx.abstract_args,
                                        device.platform, (ctx.root or ctx).builds, setting)
            self.programs[setting] = program if program is not None else why
        packed = self.programs[setting]
        if isinstance(packed, str):
            raise WorkerLost(f"the step with knobs {setting_text(setting)} cannot reach the "
                             f"worker: {packed}")
        return packed


class _Gone(Exception):
    """The worker was gone before it took the job."""


def _write_payload(folder: Path, ctx: Context, program: tuple[str, Any]) -> None:
    """What a worker loads: JAX's options first (plain values, set before its
    backend starts), then the study (unpickled after)."""
    host = _save_host_args(ctx.host_args, folder) if ctx.host_args is not None else None
    mesh = ctx.mesh
    leaves, treedef = jax.tree.flatten(tuple(ctx.abstract_args))
    body = {
        "program": program,
        "treedef": treedef,
        "avals": [(tuple(x.shape), np.dtype(x.dtype).name) for x in leaves],
        "host": host,
        "mesh": ([d.id for d in mesh.devices.flat], mesh.devices.shape,
                 tuple(mesh.axis_names), tuple(mesh.axis_types)),
        "budget": ctx.budget, "objective": ctx.objective, "warmup": ctx.warmup,
        "repeats": ctx.repeats, "compile_timeout": ctx.compile_timeout,
        "hardware": ctx.hardware, "dcn_axes": tuple(ctx.dcn_axes), "target": ctx.target,
    }
    config = _jax_config()
    # What a worker removes if this process dies without cleaning up (kill -9).
    leftovers = [str(folder)] + [c for c in map(str, _SHARED_CACHE)
                                 if c == config["jax_compilation_cache_dir"]]
    payload = {"config": config, "body": pickle.dumps(body), "leftovers": leftovers}
    (folder / "payload.pkl").write_bytes(pickle.dumps(payload))


def _worker_env() -> dict[str, str]:
    # Unbuffered, so what a crashing worker printed is in the log.
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": _python_path()}


def _python_path() -> str:
    entries = [os.getcwd() if p == "" else p for p in sys.path]
    return os.pathsep.join(dict.fromkeys(p for p in entries if isinstance(p, str)))


class _Worker:
    """One worker process: its pipes, its log file, and how it ended."""

    def __init__(self, folder: Path, number: int):
        self.log_path = folder / f"worker-{number}.log"
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        env = _worker_env()
        code = "from shardsearch.search.execution.worker import main; raise SystemExit(main())"
        payload = str(folder / "payload.pkl")
        try:
            with open(self.log_path, "ab") as log:
                # Forked from a process that has imported JAX already where it
                # can be (`spawner`), else a new interpreter.
                self.process: subprocess.Popen[bytes] | Forked = spawn(
                    env, to_worker_r, from_worker_w, log.fileno(), payload
                ) or subprocess.Popen(
                    [sys.executable, "-c", code, str(to_worker_r), str(from_worker_w), payload],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    pass_fds=(to_worker_r, from_worker_w), env=env,
                    start_new_session=True)  # Ctrl-C is for the study process
        finally:
            os.close(to_worker_r)
            os.close(from_worker_w)
        self.outbox = Connection(to_worker_w, readable=False)
        self.inbox = Connection(from_worker_r, writable=False)
        self.pid: int | None = None
        self.offset = 0
        self.busy = False  # between sending a job and its answer
        self.settings: set[Setting] = {()}  # the knob settings whose steps it has

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float) -> None:
        if not self.inbox.poll(timeout):
            self.stop()
            raise WorkerLost(f"the worker did not start within {timeout:g} s")
        try:
            message = self.inbox.recv()
        except (EOFError, OSError):
            last = _last_line(self.log_path.read_text("utf-8", "replace"))
            raise WorkerLost(f"the worker could not start ({self.death()})"
                             + (f": {last}" if last else "")) from None
        if message[0] != "ready":
            self.stop()
            raise WorkerLost(f"the worker could not start: {message[1]}")
        self.pid = message[1]
        # What JAX prints while starting belongs to no candidate.
        self.offset = self.log_path.stat().st_size

    def send(self, message: tuple[Any, ...]) -> None:
        self.outbox.send(message)

    def poll(self, timeout: float) -> bool:
        return self.inbox.poll(timeout)

    def recv(self) -> Any:
        return self.inbox.recv()

    def take_log(self) -> _logs.LogLines:
        """What the worker printed since the last call."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return _logs.LogLines()
        self.offset += len(data)
        return _logs.LogLines.of(data.decode("utf-8", "replace"))

    def death(self) -> str:
        """How the process ended, e.g. "worker killed by SIGABRT"."""
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.stop()
            code = self.process.returncode
        if code is not None and code < 0:
            try:
                return f"worker killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"worker killed by signal {-code}"
        return f"worker exited with status {code}"

    def stop(self, graceful: bool = False) -> None:
        """Kills the worker's process group (an idle worker asked to exit
        first when `graceful`) and closes the pipes."""
        if graceful and self.alive() and not self.busy:
            with contextlib.suppress(OSError):
                self.outbox.send(("exit",))
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=2)
        if self.alive():
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for end in (self.outbox, self.inbox):
            with contextlib.suppress(OSError):
                end.close()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _cleanup(folder: Path, live: list[_Worker]) -> None:
    while live:
        live.pop().stop(graceful=True)
    shutil.rmtree(folder, ignore_errors=True)
