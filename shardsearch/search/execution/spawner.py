"""Workers forked from a helper process that has already imported JAX.

A worker started with `python -c` pays for an interpreter and for importing
JAX, NumPy and shardsearch before it can load its study: 2-5 s on a small
host. It pays again at every restart, and a worker is replaced after every
candidate whose step raised, crashed or hung. On Linux a `Spawner` pays once
per study process and environment: one helper process imports what a worker
needs, without starting JAX's backend, and forks each worker from itself.

A forked worker then starts as a `python -c` one would: the same
environment (the helper's, which is the one a worker would have been given),
JAX's options set from the study's payload before its backend starts, the
user's modules imported only then, a session of its own, its output in its
log file, the study process's current folder.

- **One helper per environment.** JAX reads some options from the
  environment when it is imported, so a study process whose environment
  changed gets another helper (`spawn` compares them).
- **Exit statuses.** The helper is the workers' parent: it reaps them and
  reports each status, so a worker killed by a signal reads as before
  ("worker killed by SIGSEGV"). If the helper itself is gone, a worker's
  status is lost: `LOST_STATUS`.
- **Lifetime.** The helper runs in a session of its own (Ctrl-C is for the
  study process) and exits when the study process closes its socket or
  dies; its workers then exit within a second (`worker._exit_with_parent`
  watches their parent).
- **Where it does not apply.** Not on Linux, with
  `SHARDSEARCH_FORK_WORKERS=0`, or when the helper cannot start or dies,
  `spawn` returns None and the caller starts the worker with `python -c`;
  the last two with a `SpawnerWarning` saying why.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from typing import Any

from ...base.warnings import ShardsearchWarning

# Seconds the helper may take to import JAX and shardsearch and say it is ready.
START_TIMEOUT = 300.0

# The exit status of a worker whose helper died before reporting it.
LOST_STATUS = 255

# The environment variable that turns forking off ("0").
SWITCH = "SHARDSEARCH_FORK_WORKERS"

class SpawnerWarning(ShardsearchWarning):
    """A worker could not be forked (its helper did not start, or is gone):
    it starts as a new interpreter instead, paying the imports again."""


# Helpers of this process, newest last, by the environment their workers get.
_HELPERS: list[Spawner] = []
_DISOWNED: list[Spawner] = []
_LOCK = threading.Lock()

_MESSAGE = 1 << 16


def spawn(env: dict[str, str], read_fd: int, write_fd: int, log_fd: int,
          payload: str) -> Forked | None:
    """Forks a worker (`worker.main` on the given pipe ends and payload, its
    output on `log_fd`) from the helper for `env`, starting the helper if
    needed; None where forking does not apply or failed, so the caller
    starts the worker another way. The caller keeps and closes its fds."""
    helper = _helper(env)
    if helper is None:
        return None
    forked = helper.fork(read_fd, write_fd, log_fd, payload)
    if forked is None:
        warnings.warn(f"shardsearch: starting the worker as a new interpreter: its helper "
                      f"{helper.failure}", SpawnerWarning, stacklevel=3)
    return forked


def prestart(env: dict[str, str]) -> None:
    """Starts the helper for `env` now, without waiting for it: its imports
    then overlap whatever the study process does before its first worker."""
    _helper(env)


def _helper(env: dict[str, str]) -> Spawner | None:
    if sys.platform != "linux" or os.environ.get(SWITCH, "1") == "0":
        return None
    with _LOCK:
        if any(h.owner != os.getpid() for h in _HELPERS):
            # This process was forked from the one whose helpers these are.
            for helper in _HELPERS:
                helper.disown()
            _DISOWNED.extend(_HELPERS)  # kept: their `Popen`s are not this process's
            _HELPERS.clear()
        helper = next((h for h in _HELPERS if h.env == env and not h.lost), None)
        if helper is None:
            _forget_idle()
            helper = Spawner(env)
            _HELPERS.append(helper)
    return helper


@atexit.register
def _close_all() -> None:
    """At exit: each helper exits, and any worker still running after it."""
    with _LOCK:
        while _HELPERS:
            helper = _HELPERS.pop()
            if helper.owner == os.getpid():
                helper.close()


def _forget_idle() -> None:
    """Closes the helpers no worker needs any more (lost ones, or those of an
    environment this process left with no worker of theirs alive)."""
    for helper in list(_HELPERS):
        if helper.lost or not helper.live():
            helper.close()
            _HELPERS.remove(helper)


class Spawner:
    """The study process's end of one helper process.

    Attributes:
      env: the environment the helper and its workers run with.
      lost: the helper is gone or did not start; nothing more is forked.
      failure: why it did not start or stopped forking, or "".
    """

    def __init__(self, env: dict[str, str]):
        self.env, self.owner = dict(env), os.getpid()
        self.lost, self.failure = False, ""
        self.statuses: dict[int, int] = {}
        self.children: set[int] = set()
        self._lock = threading.RLock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = "from shardsearch.search.execution.spawner import serve; raise SystemExit(serve())"
        try:
            self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-c", code, str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), env=self.env, start_new_session=True)
        except OSError as err:
            self.process, self.lost, self.failure = None, True, str(err)
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False  # the helper said so (`wait_ready`)

    def wait_ready(self) -> bool:
        """Waits for the helper to finish its imports; False (and `failure`
        says why) when it cannot."""
        with self._lock:
            if self.ready or self.lost:
                return self.ready
            try:
                reply = self._next(START_TIMEOUT)
            except BaseException:  # Ctrl-C while it imports
                self.close()
                raise
            if reply is None or reply[0] != "ready":
                self.failure = (f"failed to start: {reply[1]}" if reply
                                else "exited before it was ready" if self.lost
                                else f"gave no answer within {START_TIMEOUT:g} s")
                self.close()
            self.ready = not self.lost
            return self.ready

    def fork(self, read_fd: int, write_fd: int, log_fd: int, payload: str) -> Forked | None:
        """A worker forked by the helper; None if the helper is lost."""
        with self._lock:
            if not self.wait_ready():
                return None
            try:
                socket.send_fds(self.sock, [pickle.dumps(("fork", payload, os.getcwd()))],
                                [read_fd, write_fd, log_fd])
                reply = self._next(START_TIMEOUT)
            except OSError:  # its end of the socket is closed
                reply, self.lost = None, True
            except BaseException:
                # Ctrl-C mid-request: an answer left unread would answer the
                # next request, so this helper serves no more (it exits, and
                # the worker it may have forked follows it).
                self.close()
                raise
            if reply is None or reply[0] != "forked":
                gone = self.lost
                self.close()
                self.failure = (f"is gone ({_ended(self.process)})" if gone else
                                f"gave no answer to a fork within {START_TIMEOUT:g} s, and "
                                "was stopped" if reply is None else
                                f"answered {reply[0]!r} to a fork, and was stopped")
                return None
            self.children.add(reply[1])
            return Forked(self, reply[1])

    def live(self) -> bool:
        """Some worker of this helper has not been reported ended."""
        with self._lock:
            self._drain(0.0)
            return bool(self.children - set(self.statuses))

    def status(self, pid: int, timeout: float | None) -> int | None:
        """The exit status of worker `pid` (negative: killed by that signal),
        waiting up to `timeout` seconds (None: as long as it takes); None if
        it still runs then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if pid in self.statuses:
                    return self.statuses[pid]
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not self.lost:
                    self._drain(left if left is not None else 1.0, until=pid)
                    if pid in self.statuses:
                        return self.statuses[pid]
                elif not _exists(pid):
                    return LOST_STATUS
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if self.lost:
                time.sleep(0.05)

    def disown(self) -> None:
        """In a process forked from the owner: drops this process's copy of
        the socket, leaving the helper to the owner."""
        self.lost = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def close(self) -> None:
        """Closes the socket; the helper exits, and its workers after it."""
        self.lost = True
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            if self.process.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def _next(self, timeout: float) -> tuple[Any, ...] | None:
        """The next reply that is not an exit report (those are recorded),
        or None when none comes within `timeout` or the helper is gone."""
        deadline = time.monotonic() + timeout
        while True:
            message = self._read(max(0.0, deadline - time.monotonic()))
            if message is None or message[0] != "exit":
                return message

    def _drain(self, timeout: float, until: int | None = None) -> None:
        """Records the exit reports that arrive within `timeout` seconds (the
        first wait only; then what is already there), stopping early once
        `until` is reported."""
        while not self.lost:
            message = self._read(timeout)
            if message is None:
                return
            if message[0] == "exit" and message[1] == until:
                return
            timeout = 0.0

    def _read(self, timeout: float) -> tuple[Any, ...] | None:
        try:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return None
            data = self.sock.recv(_MESSAGE)
        except (OSError, ValueError):
            data = b""
        if not data:
            self.lost = True
            return None
        message = pickle.loads(data)
        if message[0] == "exit":  # recorded whoever reads it
            self.statuses[message[1]] = message[2]
        return message


class Forked:
    """A worker forked by a `Spawner`, with the part of `subprocess.Popen`'s
    interface `isolate._Worker` uses: `pid`, `returncode`, `poll`, `wait`."""

    def __init__(self, helper: Spawner, pid: int):
        self.helper, self.pid = helper, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.helper.status(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.helper.status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        return self.returncode


def _ended(process: subprocess.Popen[bytes] | None) -> str:
    """How the helper's process ended, e.g. "killed by SIGKILL"."""
    code = None if process is None else process.poll()
    if code is None:
        return "no process" if process is None else "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def _exists(pid: int) -> bool:
    """Process `pid` runs (a zombie no one reaps counts as ended: an orphaned
    worker's new parent may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


# ---------------------------------------------------------------------- the helper


def serve(argv: list[str] | None = None) -> int:
    """The helper process: imports what a worker needs, then forks a worker
    for each request until the study process closes the socket."""
    sock = socket.socket(fileno=int((sys.argv[1:] if argv is None else argv)[0]))
    try:
        _preload()
    except BaseException as err:  # every failure is the answer
        with contextlib.suppress(OSError):
            sock.send(pickle.dumps(("failed", f"{type(err).__name__}: {err}".splitlines()[0])))
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    try:
        sock.send(pickle.dumps(("ready", os.getpid())))
        while True:
            ready, _, _ = select.select([sock, wake_r], [], [])
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
            _reap(sock)
            if sock in ready:
                data, fds, _flags, _addr = socket.recv_fds(sock, _MESSAGE, 3)
                if not data:
                    return 0
                try:
                    _kind, payload, cwd = pickle.loads(data)
                    pid = _fork(fds, payload, cwd, sock, (wake_r, wake_w))
                finally:
                    for fd in fds:
                        os.close(fd)
                sock.send(pickle.dumps(("forked", pid)))
    except OSError:  # the study process is gone
        return 0


def _preload() -> None:
    """Imports what a worker imports, and checks that JAX's backend did not start."""
    import jax  # noqa: F401
    import numpy  # noqa: F401

    # JAX's own flag (`jax._src`); without it there is no forking.
    from jax._src.xla_bridge import backends_are_initialized

    from ... import workloads  # noqa: F401
    from ...base import activations, mesh, monitor  # noqa: F401
    from ..evaluation import confirm, context, evaluate, stages  # noqa: F401
    from . import inprocess, transport, worker  # noqa: F401

    if backends_are_initialized():
        raise RuntimeError("importing shardsearch started JAX's backend; a forked worker "
                           "could not set its options")


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))


def _fork(fds: list[int], payload: str, cwd: str, sock: socket.socket,
          own: tuple[int, ...]) -> int:
    read_fd, write_fd, log_fd = fds
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in own:
            os.close(fd)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.chdir(cwd)
        from .worker import main

        code = main([str(read_fd), str(write_fd), payload])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # printed to the worker's log
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
