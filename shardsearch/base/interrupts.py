"""Ctrl-C and SIGTERM as exceptions, raised where a run can stop cleanly.

A Python signal handler runs between any two bytecodes of the main thread,
and its exception lands wherever that is. Two places lose it (both seen
when a handler raised at random points of a study, `tests/test_interrupts.py`):

- a finalizer or weakref callback (SQLAlchemy's `InstanceState._cleanup`,
  JAX's `_xla_gc_callback`): CPython prints "Exception ignored in" and the
  run goes on as if no signal had come;
- the middle of a storage operation: the session's cursor is left open and
  holds SQLite's lock, so the write that marks the trial interrupted is
  refused ("database is locked") and the trial stays RUNNING.

So: `handle_signals` remembers each signal it turns into an exception, and
`raise_if_signalled` raises it again at a check point when something
swallowed it; `interrupts_deferred` holds signals back during storage
work, and `interruptible` lets them through inside it for the long parts
(compiling, timing), where nothing is half-written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = ["Terminated", "handle_signals", "interruptible", "interrupts_deferred",
           "raise_if_signalled"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The signals `handle_signals` turned into exceptions, first first.
_received: list[int] = []
# The open blocks, innermost last: an `interrupts_deferred` block as the
# handlers it replaced and the signals it holds; an `interruptible` one as None.
_open: list[tuple[dict[int, object], list[int]] | None] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt,
    so that whatever cleans up after Ctrl-C cleans up after SIGTERM too."""


def _exception(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _set_handlers(handlers: dict[int, object]) -> None:
    for sig, handler in handlers.items():
        # None: a handler set outside Python, which Python cannot put back.
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # type: ignore[arg-type]


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """While inside: SIGINT raises KeyboardInterrupt and SIGTERM `Terminated`
    in the main thread. A second signal, while the first one's cleanup runs,
    ends the process at once with the first one's exit code (128 + its
    number). A signal whose exception something swallowed is raised again
    at the next `raise_if_signalled`, and at the latest when the block ends.
    Elsewhere than in the main thread (where Python cannot set handlers) it
    changes nothing.

    Example:
      >>> with handle_signals():
      ...     run()   # `kill PID` raises Terminated here
    """
    if not _main_thread():
        yield
        return

    def on_signal(signum: int, frame: object) -> None:
        if _received:
            sys.stderr.write("shardsearch: interrupted again; stopping without cleaning up\n")
            sys.stderr.flush()
            os._exit(128 + _received[0])
        _received.append(signum)
        raise _exception(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS}
    try:
        yield
        raise_if_signalled()  # the block ended as if no signal had come
    finally:
        _set_handlers(previous)
        _received.clear()


def raise_if_signalled() -> None:
    """A check point where the run can stop cleanly: raises the exception of
    the first signal `handle_signals` caught, if something swallowed it, or
    delivers the signal an `interrupts_deferred` block holds. Does nothing
    outside the main thread, or when no signal came."""
    if not _main_thread():
        return
    _raise_received()
    if _open and _open[-1] is not None and _open[-1][1]:
        with interruptible():
            pass


def _raise_received() -> None:
    if _received:
        raise _exception(_received[0])


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Holds SIGINT and SIGTERM back inside the block and delivers the first
    one after it, to the handler there was before (at the block's
    `raise_if_signalled` or `interruptible`, if it meets one first).

    For storage work: creating a trial and naming its owner must not be split
    (the trial would stay RUNNING with no owner, and only the grace period
    would tell it was abandoned), and a write cut short leaves its session
    holding the database. Directly inside another such block it adds
    nothing. Outside the main thread (where Python runs no signal handlers)
    it changes nothing.

    Example:
      >>> with interrupts_deferred():
      ...     trial = study.ask()   # a Ctrl-C here raises after the block
    """
    if not _main_thread() or (_open and _open[-1] is not None):
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, _holder(held)) for sig in _SIGNALS}
    _open.append((previous, held))
    try:
        yield
    finally:
        _open.pop()
        _set_handlers(previous)
        if held:
            signal.raise_signal(held[0])


def _holder(held: list[int]) -> Callable[[int, object], None]:
    return lambda signum, frame: held.append(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Inside `interrupts_deferred`: lets signals through for the block, to
    the handler the deferral replaced, for long work that leaves nothing
    half-written (compiling, timing); storage work inside it can be
    deferred again. A signal held before the block is raised at its start;
    one whose exception something in the block swallowed, at its end.
    Outside a deferral it only adds those two check points.

    Example:
      >>> with interrupts_deferred():
      ...     trial = study.ask()
      ...     with interruptible():
      ...         outcome = compile_and_time(trial)   # Ctrl-C raises here
      ...     study.tell(trial, outcome)
    """
    if not _main_thread():
        yield
        return
    _raise_received()
    deferral = _open[-1] if _open else None
    if deferral is not None:
        _set_handlers(deferral[0])
    _open.append(None)
    try:
        if deferral is not None and deferral[1]:
            signal.raise_signal(deferral[1].pop(0))
        yield
    finally:
        _open.pop()
        if deferral is not None:
            _set_handlers(dict.fromkeys(_SIGNALS, _holder(deferral[1])))
    _raise_received()
