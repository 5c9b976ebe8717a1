"""Who runs a trial: its owner, its heartbeat, stale trials, claimed baselines.

Several runs may share one study (processes over an SQLite file, machines
over a database server), and any of them may die at any moment (kill -9, a
lost machine), leaving its trial RUNNING. So:

- a run names itself in every trial it starts (`Owner`, the trial's user
  attribute "owner") and beats a heartbeat into it while it runs
  (`Heartbeat`, "heartbeat": seconds since the epoch);
- `fail_stale_trials` fails the RUNNING trials whose owner is gone, with
  the user attribute "reason": "interrupted". A process of this machine is
  gone the moment it no longer exists; one elsewhere, when its heartbeat is
  older than `GRACE_SECONDS`. The first beat is written with the owner, at
  `ask`, and beats are epoch seconds: Optuna's `datetime_start`, a naive
  local time that a machine in another time zone reads hours off, is never
  read;
- `BaselineClaims` claims each warm-start baseline in the study before it
  runs, so two runs on one study never both run it, and a baseline whose
  claiming run died is run again.

Optuna's own heartbeat (`RDBStorage(heartbeat_interval=...)`) serves
`study.optimize` on relational storages. This one also works with
ask-and-tell and any storage, knows a dead process of this machine at once
rather than after a grace period, and records why the trial failed.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from . import attrs as _attrs
from .storage import close_storage

OWNER_ATTR, HEARTBEAT_ATTR = _attrs.OWNER, _attrs.HEARTBEAT
REASON_ATTR, LABEL_ATTR = _attrs.REASON, _attrs.LABEL
# The reason of a trial whose run stopped (a signal, kill -9, a lost machine)
# before it recorded an outcome; summaries count these apart from failures.
INTERRUPTED = "interrupted"

HEARTBEAT_SECONDS = 10.0
# A trial owned elsewhere is stale once its heartbeat is this old: a dozen
# missed beats, so a busy database or a skewed clock does not fail a live run.
GRACE_SECONDS = 120.0

# Heartbeats refused in a row after which a run takes its storage as lost:
# well inside the grace period, so it stops before others fail its trial.
MISSED_BEATS = 6


@dataclasses.dataclass(frozen=True)
class Owner:
    """The process that runs a trial, as the trial records it.

    Attributes:
      host: the machine's host name.
      pid: the process id.
      boot: the kernel's boot id (Linux), so a pid from before a reboot is
        not mistaken for a live one.
      pid_namespace: the pid namespace (Linux), so containers that share a
        host name do not read each other's pids.
      started: the process's start time in clock ticks since boot (Linux),
        so a recycled pid is not mistaken for the owner.

    Example:
      >>> Owner.current().alive()
      True
    """

    host: str
    pid: int
    boot: str | None = None
    pid_namespace: str | None = None
    started: int | None = None

    @classmethod
    def current(cls) -> Owner:
        """This process."""
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _read("/proc/sys/kernel/random/boot_id"),
                   _readlink("/proc/self/ns/pid"), _start_ticks(pid))

    def same_machine(self, other: Owner) -> bool:
        """Whether `other`'s pids mean the same processes as this owner's."""
        return (self.host, self.boot, self.pid_namespace) == (
            other.host, other.boot, other.pid_namespace)

    def alive(self) -> bool | None:
        """Whether this owner still runs, asked on its own machine: True, False,
        or None when a process with its pid exists but may be another one."""
        if self.started is not None:
            return _start_ticks(self.pid) == self.started
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return None
        return None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Owner | None:
        """The owner a trial recorded; None when it recorded none (or garbage)."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(str(data["host"]), int(data["pid"]), data.get("boot"),
                       data.get("pid_namespace"), data.get("started"))
        except (KeyError, TypeError, ValueError):
            return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """A live process's start time (field 22 of /proc/PID/stat); None when
    there is no such process, it has exited (a zombie), or no /proc."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after it.
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])


def is_stale(trial: FrozenTrial, here: Owner | None = None, now: float | None = None) -> bool:
    """Whether a RUNNING trial's owner is gone (see the module docstring).

    A trial with no heartbeat yet is not stale: another run created it an
    instant ago (its first beat comes with its owner, in `BaselineClaims.ask`),
    or a version before heartbeats did.
    """
    if trial.state != TrialState.RUNNING:
        return False
    here = here or Owner.current()
    owner = Owner.from_json(trial.user_attrs.get(OWNER_ATTR))
    if owner is not None and owner.same_machine(here):
        alive = owner.alive()
        if alive is not None:
            return not alive
    last = trial.user_attrs.get(HEARTBEAT_ATTR)
    if not isinstance(last, int | float):
        return False
    return (time.time() if now is None else now) - last > GRACE_SECONDS


def _never_taken(trial: FrozenTrial, settled: int) -> bool:
    """A RUNNING trial no run ever took: no owner and no heartbeat, though a
    trial created after it finished with its last beat more than the grace
    period ago (`settled`, its number). A run writes both an instant after
    creating its trial; what has neither that long after is an ask whose
    answer was lost (the server restarted as it committed) and that the run
    made again (`study.storage.ReconnectingStorage`). Only epoch seconds are
    compared, and only across the grace period: a later trial that finished
    a moment ago (a cache hit takes milliseconds) says nothing."""
    # An enqueued baseline claim (it carries its label from the start) keeps
    # its early number when a run pops it much later: its number says nothing
    # of when it became RUNNING.
    return (OWNER_ATTR not in trial.user_attrs and HEARTBEAT_ATTR not in trial.user_attrs
            and LABEL_ATTR not in trial.user_attrs and trial.number < settled)


def fail_stale_trials(study: optuna.Study,
                      trials: Sequence[FrozenTrial] | None = None,
                      now: float | None = None) -> list[int]:
    """Fails the study's stale RUNNING trials (or those among `trials`), and
    those no run ever took (`_never_taken`), as "interrupted"; returns their
    numbers.

    Two runs may do this at once: a trial another run failed first, even
    between this run's look and its write, is skipped.
    `now` (epoch seconds, default the clock) is when the heartbeats are judged.
    """
    if trials is None:
        trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    here, now = Owner.current(), time.time() if now is None else now
    # The latest trial whose run beat more than the grace period ago: a trial
    # created before it that still has no owner was never taken.
    settled = -1
    if any(OWNER_ATTR not in t.user_attrs and HEARTBEAT_ATTR not in t.user_attrs
           for t in trials):  # read the finished trials only when one could be orphaned
        settled = max((t.number for t in study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED))
            if isinstance(beat := t.user_attrs.get(HEARTBEAT_ATTR), int | float)
            and now - beat > GRACE_SECONDS), default=-1)
    failed = []
    for trial in trials:
        if not is_stale(trial, here, now) and not _never_taken(trial, settled):
            continue
        try:
            # Optuna has no public way to write to another process's trial.
            study._storage.set_trial_user_attr(trial._trial_id, REASON_ATTR, INTERRUPTED)
            # `skip_if_finished` looks before it writes: another run may close
            # the trial in between, and the write then refuses.
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        failed.append(trial.number)
    return failed


def mark_interrupted(study: optuna.Study, trial: optuna.Trial) -> None:
    """Fails this run's own `trial` as "interrupted" (Ctrl-C, SIGTERM), unless
    it was recorded just before the interrupt.

    Raises:
      Exception: whatever the storage raised, twice in a row.
    """
    for attempt in (1, 2):
        try:
            trial.set_user_attr(REASON_ATTR, INTERRUPTED)
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            return
        except optuna.exceptions.UpdateFinishedTrialError:
            return
        except Exception:
            if attempt == 2:
                raise
            # The interrupt may have cut a write short and left its session
            # holding the database (SQLite: "database is locked"): start over
            # on fresh connections, once the cut cursor's finalizer has run.
            close_storage(study)
            gc.collect()


class StorageLost(RuntimeError):
    """The study's storage failed `MISSED_BEATS` heartbeats in a row: this run
    stops after its trial, before other runs take that trial for dead."""


class Heartbeat:
    """Beats a trial's heartbeat every `interval` seconds while in the `with` block.

    The beats come from a daemon thread, so a step that holds the main thread
    in XLA for minutes still shows as alive; a trial finished meanwhile ends
    the beats. A beat the storage refuses is counted (`failures`, `missed`
    in a row, `error` the last one); after `MISSED_BEATS` in a row the
    storage is taken as lost (`lost`), and `check` raises `StorageLost`.

    Example:
      >>> with Heartbeat(trial) as beat:
      ...     outcome = evaluate(...)
      >>> beat.check()   # StorageLost if the database was gone for a minute
    """

    def __init__(self, trial: optuna.Trial, interval: float = HEARTBEAT_SECONDS):
        self.trial, self.interval = trial, interval
        self.failures = self.missed = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name="shardsearch-heartbeat")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # A beat stuck on a locked database must not hold up an interrupt.
        self._thread.join(timeout=1.0)

    @property
    def lost(self) -> bool:
        """Whether the last `MISSED_BEATS` beats all failed."""
        return self.missed >= MISSED_BEATS

    def check(self) -> None:
        """Raises `StorageLost` when the storage was lost during the block."""
        if self.lost:
            raise StorageLost(
                f"the study's storage refused {self.missed} heartbeats in a row "
                f"({self.error}); stopped after trial {self.trial.number} so that no "
                "other run takes it for dead: run the same command again once the "
                "storage is back, and the study resumes")

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.trial.set_user_attr(HEARTBEAT_ATTR, time.time())
                self.missed = 0
            except optuna.exceptions.UpdateFinishedTrialError:
                return
            except Exception as err:  # a storage hiccup: the next beat may get through
                self.failures += 1
                self.missed += 1
                self.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                if self.lost:
                    return


def _holds_claim(trial: FrozenTrial) -> bool:
    # Waiting, running, or recorded; a trial failed before it recorded an
    # outcome (interrupted, or an error of ours) gives its baseline back.
    return trial.state in (TrialState.WAITING, TrialState.RUNNING) or \
        _attrs.OUTCOME in trial.user_attrs


class BaselineClaims:
    """Hands out a run's trials: each a baseline claimed in the study, or a search trial.

    A baseline is claimed by enqueueing a trial labelled with its name (the
    label is written with the trial, at once), so every run sees the claim
    from the moment the trial has a number. A run skips the baselines other
    trials hold; if two runs claim one at the same instant, the lower trial
    number keeps it and the other trial becomes a search trial.

    Example:
      >>> claims = BaselineClaims(study, ["replicated", "default"])
      >>> trial, name = claims.ask()   # ("replicated" unless another run has it)
    """

    def __init__(self, study: optuna.Study, names: Sequence[str]):
        self.study, self.names = study, tuple(names)
        self._open = bool(self.names)

    def ask(self) -> tuple[optuna.Trial, str | None]:
        """A new trial owned by this process, and the baseline it runs (None:
        a search trial)."""
        if self._open:
            name = self._unclaimed()
            if name is None:
                self._open = False
            else:
                self.study.enqueue_trial({}, user_attrs={LABEL_ATTR: name})
        # The queue is the study's: this may be another run's claim (then this
        # run evaluates that baseline) or none (another run took ours).
        trial = self.study.ask()
        trial.set_user_attr(OWNER_ATTR, Owner.current().to_json())
        trial.set_user_attr(HEARTBEAT_ATTR, time.time())
        name = trial.user_attrs.get(LABEL_ATTR)
        if name is None:
            return trial, None
        if name in self.names and not self._held_before(name, trial.number):
            return trial, name
        trial.set_user_attr(LABEL_ATTR, "search")
        return trial, None

    def _unclaimed(self) -> str | None:
        trials = self.study.get_trials(deepcopy=False)
        # A dead run's claims are open again.
        stale = fail_stale_trials(
            self.study, [t for t in trials if t.state == TrialState.RUNNING])
        held = [t.user_attrs.get(LABEL_ATTR) for t in trials
                if _holds_claim(t) and t.number not in stale]
        return next((name for name in self.names if name not in held), None)

    def _held_before(self, name: str, number: int) -> bool:
        return any(t.number < number and t.user_attrs.get(LABEL_ATTR) == name
                   and _holds_claim(t) for t in self.study.get_trials(deepcopy=False))
