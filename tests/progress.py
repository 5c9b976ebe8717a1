"""Watching a `shardsearch optimize` subprocess's progress bar from a test."""

import os
import re
import select
import time


def after_trials(process, n, trials, settle=0.0, limit=300.0):
    """Reads `process`'s progress bar (stderr) until it shows `n` of `trials`
    finished, then waits `settle` seconds (so that the next trial is under
    way: it asks, claims and compiles for far longer); returns what was read.
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
            time.sleep(settle)
            return seen
    process.kill()
    process.communicate()
    raise AssertionError(f"no {n} finished trials in time; stderr: {seen[-3000:]!r}")
