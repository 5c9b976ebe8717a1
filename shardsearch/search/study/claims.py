"""Claims in the study's database: one worker compiles a fingerprint, the others reuse it.

Several `optimize` processes (workers) may share one study on a relational
storage (PostgreSQL, MySQL, an SQLite file). Two of them often reach the same
spec trees from different parameters, and each compile costs seconds to
minutes, so a fingerprint is compiled once across all of them:

- before it compiles a fingerprint, a worker inserts a row keyed by (study
  name, fingerprint) into the table `shardsearch_claims`, in the study's own
  database. The primary key makes the insert atomic: of two workers that try
  at once, the database lets exactly one in;
- a worker whose insert is refused waits for the claiming trial (the row
  names its number) to finish, then reuses the outcome that trial recorded;
- a claiming trial that finished without an outcome for that fingerprint
  (failed, interrupted), or whose run is gone (`ownership.is_stale`: a dead
  process on this machine at once, one elsewhere after the grace period), is
  taken over: the waiter moves the row to its own trial with an update that
  only succeeds if the row still names the dead trial, so one waiter wins;
- a waiter that has waited `wait` seconds evaluates the candidate itself
  (a warning says so): a slow compile must not stall the others forever.

The outcome itself lives where every other outcome lives, in the trial's
user attributes (`search.record`); the row only says who is on it. A row
whose trial is gone or holds another fingerprint (a study deleted and made
again under the same name) counts as abandoned, so an old row never stands
in for a result.

The same table says which workers are on the study (`Roster`), so the
finalists are re-timed once, by the worker that finishes last: a worker that
finishes while another live worker is still searching leaves the
confirmation to it; the workers that find none left claim the confirmation
of their generation (the set of worker rows they all see), and the database
lets one of them in.

Storages without a database (Optuna's `InMemoryStorage`, journal files)
serve one process; their claims always succeed at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..evaluation.outcome import Outcome
from .ownership import GRACE_SECONDS, OWNER_ATTR, Owner, fail_stale_trials, is_stale
from .record import TrialRecord
from .storage import is_resumable, reconnecting, storage_engine

TABLE = "shardsearch_claims"
# Seconds between looks at a claim another worker holds: short, as static
# trials take a fraction of a second; a look is one small query.
POLL_SECONDS = 0.1
MAX_POLL_SECONDS = 1.0


class _Rows:
    """The claims table's rows of one study (none without a database)."""

    def __init__(self, study: optuna.Study):
        self.study = study
        engine = storage_engine(study)
        # An in-memory database has one process: nothing to share.
        shared = engine is not None and is_resumable(str(engine.url))
        self._table = _table(engine) if shared else None
        self._engine = engine

    @property
    def shared(self) -> bool:
        """Whether claims go through a database other processes can see."""
        return self._table is not None

    @reconnecting
    def _insert(self, key: str, trial_number: int) -> bool:
        from sqlalchemy.exc import IntegrityError

        try:
            with self._engine.begin() as conn:
                conn.execute(self._table.insert().values(
                    study=self.study.study_name, key=key, trial=trial_number,
                    claimed=time.time(), owner=json.dumps(Owner.current().to_json())))
            return True
        except IntegrityError:
            return False


class CompileClaims(_Rows):
    """Claims fingerprints in a study's database before they are compiled.

    Args:
      study: the study the workers share.
      wait: seconds a worker waits for another's claim before it evaluates
        the candidate itself.

    Example:
      >>> claims = CompileClaims(study, wait=1200.0)
      >>> outcome = claims.acquire("3f2a9c0d1e4b5a68", trial.number)
      >>> # None: this trial holds the claim and compiles; else the outcome to reuse
    """

    def __init__(self, study: optuna.Study, wait: float):
        super().__init__(study)
        self.wait = wait

    def acquire(self, key: str, trial_number: int) -> Outcome | None:
        """Claims `key` for trial `trial_number`, or the outcome another trial
        recorded for it.

        Returns:
          None when this trial now holds the claim (or waited `wait` seconds
          in vain) and must evaluate; else the other trial's `Outcome`.
        """
        if self._table is None:
            return None
        deadline = time.monotonic() + self.wait
        pause = POLL_SECONDS
        while True:
            if self._insert(key, trial_number):
                return None
            holder = self._holder(key)
            if holder is None:
                continue  # released between our insert and our read: try again
            if holder == trial_number:
                # A row naming this very trial: left by a study deleted and made
                # again under the same name (its trial numbers start over). It
                # would otherwise wait `wait` seconds for itself.
                self._take_over(key, holder, trial_number)
                return None
            trial = self._trial(holder)
            outcome = _recorded(trial, key)
            if outcome is not None:
                return outcome
            if _abandoned(trial) and self._take_over(key, holder, trial_number):
                if trial is not None and trial.state == TrialState.RUNNING:
                    fail_stale_trials(self.study, [trial])
                return None
            if time.monotonic() > deadline:
                warnings.warn(
                    f"shardsearch: trial {holder} of study {self.study.study_name!r} has "
                    f"held candidate {key} for over {self.wait:.0f} s; trial {trial_number} "
                    "evaluates it too", RuntimeWarning, stacklevel=2)
                return None
            time.sleep(pause)
            pause = min(pause * 1.5, MAX_POLL_SECONDS)

    @reconnecting
    def _holder(self, key: str) -> int | None:
        t = self._table
        with self._engine.connect() as conn:
            return conn.execute(t.select().with_only_columns(t.c.trial).where(
                t.c.study == self.study.study_name, t.c.key == key)).scalar()

    @reconnecting
    def _take_over(self, key: str, holder: int, trial_number: int) -> bool:
        t = self._table
        with self._engine.begin() as conn:
            moved = conn.execute(t.update().where(
                t.c.study == self.study.study_name, t.c.key == key, t.c.trial == holder,
            ).values(trial=trial_number, claimed=time.time()))
        return moved.rowcount == 1

    def _trial(self, number: int) -> FrozenTrial | None:
        """The study's trial `number`, read afresh; None when there is none."""
        # Optuna has no public way to read one trial of a study by number.
        storage = self.study._storage
        try:
            trial_id = storage.get_trial_id_from_study_id_trial_number(
                self.study._study_id, number)
            return storage.get_trial(trial_id)
        except KeyError:
            return None


# The `trial` of a worker row: searching, or done.
_SEARCHING, _DONE = -2, -3
# What the study's result says about its confirmation ("confirmed_by").
CONFIRMED_HERE = "the last worker to finish"
CONFIRM_LEFT = "left to the last worker to finish, or to shardsearch confirm"
CONFIRMED_ELSEWHERE = "another worker that finished at the same time"


class Roster(_Rows):
    """The workers on a study, one row each, so the last to finish confirms.

    Example:
      >>> with Roster(study) as roster:   # joins; leaves if the search fails
      ...     ...  # the search; `roster.touch()` after each trial
      ...     roster.turn()   # CONFIRMED_HERE: re-time the finalists here
    """

    def __init__(self, study: optuna.Study):
        super().__init__(study)
        # Per call, not per process: a process may run optimize twice on a study.
        self.key = f"worker:{uuid.uuid4().hex[:16]}"

    def __enter__(self) -> Roster:
        self.join()
        return self

    def __exit__(self, kind: Any, *exc: object) -> None:
        if kind is not None:  # a worker that stopped early does not hold up the others
            with contextlib.suppress(Exception):
                self._delete([self.key])

    def join(self) -> None:
        """Adds this worker (and drops the rows of workers long done or dead)."""
        if self._table is None:
            return
        rows = self._rows()
        gone = [k for k, (trial, claimed, owner) in rows.items()
                if (trial == _DONE and time.time() - claimed > GRACE_SECONDS)
                or (trial == _SEARCHING and not self._alive(owner, claimed))]
        self._delete(gone)
        self._insert(self.key, _SEARCHING)

    @reconnecting
    def _delete(self, keys: list[str]) -> None:
        if self._table is None or not keys:
            return
        t = self._table
        with self._engine.begin() as conn:
            conn.execute(t.delete().where(t.c.study == self.study.study_name,
                                          t.c.key.in_(keys)))

    def touch(self) -> None:
        """Says this worker still searches (for workers on other machines)."""
        self._set(_SEARCHING)

    def turn(self) -> str:
        """Marks this worker done and says who confirms: `CONFIRMED_HERE` (this
        worker), `CONFIRM_LEFT` (a live worker still searches) or
        `CONFIRMED_ELSEWHERE` (another worker that found none left claimed it)."""
        if self._table is None:
            return CONFIRMED_HERE
        self._set(_DONE)
        rows = self._rows()
        if any(trial == _SEARCHING and self._alive(owner, claimed)
               for key, (trial, claimed, owner) in rows.items() if key != self.key):
            return CONFIRM_LEFT
        # Those that finish together see the same rows: one claim for all of them.
        generation = hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()[:16]
        return CONFIRMED_HERE if self._insert(f"confirm:{generation}", _DONE) \
            else CONFIRMED_ELSEWHERE

    @reconnecting
    def _set(self, trial: int) -> None:
        if self._table is None:
            return
        t = self._table
        with self._engine.begin() as conn:
            conn.execute(t.update().where(t.c.study == self.study.study_name,
                                          t.c.key == self.key)
                         .values(trial=trial, claimed=time.time()))

    @reconnecting
    def _rows(self) -> dict[str, tuple[int, float, str | None]]:
        t = self._table
        with self._engine.connect() as conn:
            rows = conn.execute(t.select().where(t.c.study == self.study.study_name,
                                                 t.c.key.like("worker:%"))).all()
        return {r.key: (r.trial, r.claimed, r.owner) for r in rows}

    def _alive(self, owner_json: str | None, claimed: float) -> bool:
        """Whether a worker still searches: its process, asked on this machine;
        elsewhere, a row touched within the grace period or a live trial."""
        try:
            owner = Owner.from_json(json.loads(owner_json or "null"))
        except ValueError:
            owner = None
        if owner is not None and owner.same_machine(Owner.current()):
            return owner.alive() is not False
        if time.time() - claimed < GRACE_SECONDS:
            return True
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return any(Owner.from_json(t.user_attrs.get(OWNER_ATTR)) == owner and not is_stale(t)
                   for t in running)


def _recorded(trial: FrozenTrial | None, key: str) -> Outcome | None:
    """The outcome `trial` evaluated for fingerprint `key`, once it is finished."""
    if trial is None or not trial.state.is_finished():
        return None
    record = TrialRecord.from_trial(trial)
    if record is None or record.outcome.fingerprint != key or record.outcome.cache_hit:
        return None
    return record.outcome


def _abandoned(trial: FrozenTrial | None) -> bool:
    # Finished without the outcome `_recorded` looked for, never there, or its run is gone.
    return trial is None or trial.state.is_finished() or is_stale(trial)


def _table(engine: Any) -> Any:
    """The claims table of `engine`'s database, created there if missing (one
    look per search)."""
    from sqlalchemy import Column, Float, Integer, MetaData, String, Table, Text, inspect
    from sqlalchemy.exc import DBAPIError

    table = Table(
        TABLE, MetaData(),
        # Optuna's own limit on study names.
        Column("study", String(512), primary_key=True),
        Column("key", String(128), primary_key=True),
        Column("trial", Integer, nullable=False),
        Column("claimed", Float, nullable=False),
        Column("owner", Text))
    try:
        table.create(engine, checkfirst=True)
    except DBAPIError:
        # Two workers that start together both find no table and both create it
        # (PostgreSQL: a duplicate type name); the one that lost finds it there.
        if not inspect(engine).has_table(TABLE):
            raise
    return table
