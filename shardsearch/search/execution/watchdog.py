"""The thread of a lockstep process that watches the others and ends this one when it must.

A process of a multi-process search (`search.lockstep`) waits on the others
in two ways: on the key-value store, where its main thread notices a lost
peer by itself (`PeerLost`), and inside XLA, in a collective, where nothing
can interrupt it. The watchdog covers both. Every `BEAT_SECONDS` it

- beats a key of its own, so the others know it lives;
- reads the others' beats and exit notes (`distributed.announce_exit`): a
  peer whose beat stopped for `timeout` seconds, or that left, is lost;
- while the main thread runs a step, reads the others' failure notes for
  that job: a peer whose step failed will not enter the collectives this
  process waits in, so when this process's step makes no progress for
  `NOTICE_GRACE` seconds after such a note, it is stuck for good;
- ends a step that runs longer than `execute_timeout`.

A lost peer is first left to the main thread to notice (it does within a
second when it waits on the store); a process stuck in XLA is ended at once,
with exit code 1 and one line on stderr, after the `on_stuck` hook (process
0 records the candidate as failed there) and a note to the others.

Example:
  >>> watch = Watchdog(client, "shardsearch/0", index=1, count=2, timeout=120,
  ...                  execute_timeout=600)
  >>> watch.running_since = time.monotonic()   # the main thread starts a step
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .distributed import EXIT_KEY, announce_exit

# How often each process beats and looks at the others.
BEAT_SECONDS = 1.0

# Seconds the watchdog gives the main thread to notice a lost peer by itself
# before ending the process, and the seconds a step must stand still after a
# peer's failure note before this process counts as stuck (a step that was
# finishing when the note came gets that long to finish).
NOTICE_GRACE = 5.0


class Watchdog:
    """Beats, watches the other processes, and ends this one when it is stuck.

    The main thread sets `job` and `running_since` (None while it is not in
    a step) and `noticed` (it raised `PeerLost` itself); it reads `lost`.

    Args:
      client: JAX's distributed runtime client (its key-value store).
      prefix: the search's keys' prefix, the same in every process.
      index: this process's index.
      count: the number of processes.
      timeout: seconds of silence after which a peer is lost.
      execute_timeout: seconds a step may run.
    """

    def __init__(self, client: Any, prefix: str, index: int, count: int, timeout: float,
                 execute_timeout: float):
        self.client, self.prefix, self.index, self.count = client, prefix, index, count
        self.timeout, self.execute_timeout = timeout, execute_timeout
        self.job = 0
        self.running_since: float | None = None
        self.lost: str | None = None
        self.noticed = False
        # Called in this thread with the reason ("process 1: ...") just before
        # a stuck process ends (process 0 records the candidate there).
        self.on_stuck: Callable[[str], None] | None = None
        self._stop = threading.Event()
        # The last words must reach the terminal even while a candidate's
        # stderr is being caught (`logs.capture_stderr`).
        self._stderr = os.dup(2)
        self._beat = 0
        self._seen: dict[int, tuple[bytes | None, float]] = {}
        self._started = time.monotonic()
        self._failure: tuple[int, str, float, float] | None = None  # q, note, step, seen
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="shardsearch-lockstep")
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """Ends the watch (the search is over)."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            self._beat += 1
            # The coordinator's absence shows in the main thread's waits.
            with contextlib.suppress(Exception):
                self.client.key_value_set_bytes(f"{self.prefix}/beat/{self.index}",
                                                str(self._beat).encode(), allow_overwrite=True)
            now = time.monotonic()
            running = self.running_since
            lost = self._peer_lost(now)
            stuck = running is not None and lost is None and self._stuck_after_failure(
                now, running)
            if stuck:
                q, note = self._failure[0], self._failure[1]
                lost = (f"process {q} failed while running the step ({note}); this process "
                        "is inside a collective with it, which cannot be cancelled, so the "
                        "search stops (restart every process to resume it; the candidate is "
                        "recorded as failed)")
                if self.on_stuck is not None:
                    with contextlib.suppress(Exception):  # the exit must happen
                        self.on_stuck(f"process {q}: {note}")
            elif lost is None and running is not None and now - running > self.execute_timeout:
                lost = (f"no step finished within {self.execute_timeout:g} s in process "
                        f"{self.index}: the processes are stuck in a collective (a peer "
                        "failed or hangs), which cannot be cancelled; restart every process "
                        "to resume the search")
            if lost is not None and self.lost is None:
                self.lost = lost
                self._end_unless_noticed(lost, in_step=running is not None)
                return

    def _peer_lost(self, now: float) -> str | None:
        for q in range(self.count):
            if q == self.index:
                continue
            gone = self._try_get(f"{EXIT_KEY}/{q}")
            if gone is not None:
                return (f"process {q} stopped ({gone.decode(errors='replace')}), so the "
                        "search stops (restart every process to resume it)")
            value = self._try_get(f"{self.prefix}/beat/{q}")
            last_value, last_change = self._seen.get(q, (None, self._started))
            if value != last_value:
                self._seen[q] = (value, now)
            elif now - last_change > self.timeout:
                return (f"process {q} sent no heartbeat for {self.timeout:g} s: it died or "
                        "its machine is unreachable, so the search stops (restart every "
                        "process to resume it)")
        return None

    def _stuck_after_failure(self, now: float, running: float) -> bool:
        """Whether a peer failed its step in this job and this process's step
        has stood still for `NOTICE_GRACE` seconds since that was seen."""
        failure = self._failure
        if failure is None or failure[2] != running:
            failure = None
            for q in range(self.count):
                note = None if q == self.index else self._try_get(
                    f"{self.prefix}/job/{self.job}/failed/{q}")
                if note is not None:
                    failure = (q, note.decode(errors="replace"), running, now)
                    break
            self._failure = failure
        return failure is not None and now - failure[3] >= NOTICE_GRACE

    def _try_get(self, key: str) -> bytes | None:
        try:
            return self.client.key_value_try_get_bytes(key)
        except Exception:  # not there (or the store is gone: the waits say so)
            return None

    def _end_unless_noticed(self, message: str, in_step: bool) -> None:
        if not in_step:
            deadline = time.monotonic() + NOTICE_GRACE
            while time.monotonic() < deadline:
                if self.noticed or self._stop.is_set():
                    return
                time.sleep(0.1)
        # The others stop at once rather than after their timeout.
        announce_exit(message)
        os.write(self._stderr, f"shardsearch: error in process {self.index}: {message}\n"
                 .encode())
        os._exit(1)
