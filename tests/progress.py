"""Watching a `shardsearch optimize` subprocess from a test: its progress
bar, and signals timed to land while it runs a trial."""

import os
import re
import select
import signal
import time

import sqlalchemy
from optuna.trial import TrialState

from shardsearch.search.study.ownership import OWNER_ATTR


def after_trials(process, n, trials, limit=300.0):
    """Reads `process`'s progress bar (stderr) until it shows `n` of `trials`
    finished; returns what was read.
    Kills the process and fails the test when that takes over `limit` seconds."""
    seen, deadline = b"", time.monotonic() + limit
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 1.0)
        if not ready:
            continue
        chunk = os.read(process.stderr.fileno(), 1 << 16)
        if not chunk:
            break
        seen += chunk
        if max((int(k) for k in re.findall(rb"\| *(\d+)/%d " % trials, seen)), default=0) >= n:
            return seen
    process.kill()
    process.communicate()
    raise AssertionError(f"no {n} finished trials in time; stderr: {seen[-3000:]!r}")


def signal_mid_trial(process, read_trials, sig=signal.SIGKILL, tries=500, pause=0.01):
    """Sends `sig` to `process` while a trial that names it as its owner is
    RUNNING; that trial's number.

    The process is frozen (SIGSTOP) while `read_trials()` reads the study,
    so the trial cannot end between the look and the signal: a fixed wait
    after the progress bar once let a trial finish and the next not start
    yet on a loaded CI machine, and kill -9 caught no trial. A caught signal
    is handled when the process wakes. A read refused because the frozen
    process holds SQLite's write lock counts as not seen. Between looks the
    process runs at least as long as the last look froze it: a PostgreSQL
    read takes far longer than `pause`, and a process frozen nearly all the
    time barely reaches its next trial, while the other worker of a test
    runs freely and can finish all of its trials, leaving none to end the
    killed one's (seen once on CI: the killed trial stayed RUNNING).
    """
    for _ in range(tries):
        process.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            running = [t.number for t in read_trials() if t.state == TrialState.RUNNING
                       and (t.user_attrs.get(OWNER_ATTR) or {}).get("pid") == process.pid]
        except sqlalchemy.exc.OperationalError:
            running = []
        if running:
            process.send_signal(sig)
            process.send_signal(signal.SIGCONT)
            return running[0]
        process.send_signal(signal.SIGCONT)
        time.sleep(max(pause, time.monotonic() - frozen))
    process.kill()
    process.communicate()
    raise AssertionError(f"pid {process.pid} was never caught running a trial "
                         f"({tries} looks)")
