"""Where studies live and how they are sampled: Optuna storage, sampler, compile cache.

Everything here is process-wide or outside the process: the study's storage
URL, the sampler every study is created with (recorded in plan files), and
JAX's persistent compilation cache. The trial loop (`search.loop`) only
opens a study and asks it for trials.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import jax
import optuna

from ...base.secrets import hide_secrets, redact_url

DEFAULT_DIR = Path(".shardsearch")


def default_storage() -> str:
    """An SQLite file under `./.shardsearch/`, created on demand."""
    DEFAULT_DIR.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(DEFAULT_DIR / 'studies.db').resolve()}"


# The search's sampler is Optuna's TPE with these options on top of its
# defaults (none: `benchmarks/efficiency` replays it against the grouped
# multivariate variant, random and grid sampling on tables of whole spaces
# timed beforehand, and over 20 seeds the grouped variant was no better; see
# `benchmarks/results/efficiency/summary.md`).
SAMPLER_OPTIONS: dict[str, Any] = {}

# Recorded with each study (and in exported files and bench entries), so a
# result says which sampler found it; derived from the options above.
SAMPLER = "TPESampler(" + ", ".join(f"{k}={v!r}" for k, v in SAMPLER_OPTIONS.items()) + ")"


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """The search's sampler (`SAMPLER`), seeded."""
    return optuna.samplers.TPESampler(seed=seed, **SAMPLER_OPTIONS)


def open_study(storage: str | None, study_name: str, sampler: Any = None,
               pruner: Any = None, create: bool = True) -> optuna.Study:
    """Creates or resumes a study; a storage that cannot be opened is a ValueError.

    Errors show the URL with its passwords hidden (`base.secrets`).
    """
    check_study_name(study_name)
    url = storage or default_storage()
    try:
        for attempt in range(SCHEMA_ATTEMPTS):
            try:
                opened = (_sqlite_file_storage(url) if _is_sqlite_file(url)
                          else _server_storage(url))
                if create:
                    return optuna.create_study(
                        storage=opened, study_name=study_name, sampler=sampler,
                        pruner=pruner, direction="minimize", load_if_exists=True)
                return optuna.load_study(storage=opened, study_name=study_name,
                                         sampler=sampler, pruner=pruner)
            except Exception as err:
                if attempt + 1 == SCHEMA_ATTEMPTS or not _lost_schema_race(err):
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")
    except KeyError:
        raise ValueError(
            f"no study named {study_name!r} in storage {redact_url(url)!r}; list them with "
            "optuna.get_all_study_summaries or check the name") from None
    except Exception as err:
        if isinstance(err, ValueError) and "study" in str(err).lower():
            raise ValueError(hide_secrets(str(err), url)) from None
        # Optuna's "Failed to import DB access module" leaves out which module.
        cause = f" ({err.__cause__})" if isinstance(err, ImportError) and err.__cause__ else ""
        raise ValueError(
            f"cannot open storage {redact_url(url)!r}: {type(err).__name__}: "
            f"{hide_secrets(str(err) + cause, url)}; {_storage_hint(url, err)}") from None


# Seconds an SQLite transaction waits for another process's to end before
# "database is locked"; Optuna's transactions take milliseconds.
SQLITE_LOCK_WAIT = 60.0


def _is_sqlite_file(url: Any) -> bool:
    return isinstance(url, str) and url.startswith("sqlite") and is_resumable(url)


def _sqlite_file_storage(url: str) -> optuna.storages.RDBStorage:
    """An Optuna storage on an SQLite file whose transactions are serialised.

    Python's sqlite3 starts a transaction only at the first write, so a read
    and the write that depends on it are not one atomic step: two workers
    both read a queued (WAITING) trial, both set it RUNNING, and both run it
    (the second `tell` then fails with "Cannot tell a COMPLETE trial").
    Opening every transaction with BEGIN IMMEDIATE takes the file's write
    lock before the read, so the second worker waits and then sees the trial
    taken. SQLite serialises writers anyway; this makes the reads that
    decide a write wait with them.
    """
    from sqlalchemy import event

    storage = optuna.storages.RDBStorage(
        url, engine_kwargs={"connect_args": {"timeout": SQLITE_LOCK_WAIT}})
    engine = storage.engine

    @event.listens_for(engine, "connect")
    def _no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
        # SQLAlchemy's begin event below opens the transactions instead.
        dbapi_connection.isolation_level = None
        # Commits append to a write-ahead log instead of syncing the file: the
        # per-step pruning reports and the per-parameter writes of a proposal
        # stop waiting on the disk (measured: Trial.report 11-21 ms -> 5-7 ms,
        # benchmarks/overhead). A power cut may lose the last transactions, not
        # the file; WAL needs a local disk, as SQLite's locking already does.
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    # Connections opened while Optuna created its tables lack the hooks.
    engine.dispose()
    return storage


def _server_storage(url: Any) -> Any:
    """An Optuna storage on a database server that outlives the server's restart.

    A restart cuts every connection a worker holds. Pooled connections are
    checked before each use (Optuna turns that on for MySQL only), and a call
    that meets the server down or its connection cut is tried again for a
    few seconds (`ReconnectingStorage`), instead of ending the search with
    "terminating connection due to administrator command". SQLite files and
    URLs that are not strings are left as they are.
    """
    if not isinstance(url, str) or url.startswith("sqlite"):
        return url
    return ReconnectingStorage(url, engine_kwargs={"pool_pre_ping": True})


# Seconds between the tries of a storage call that lost its server: about
# 12 s in all, long enough for a restart (about half a second measured by
# tests/test_chaos.py) and short of the heartbeats' patience.
RECONNECT_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 4.0)


def _lost_server(err: BaseException) -> bool:
    """Whether `err` is a server gone or a connection cut (retryable), not a
    refused statement (an integrity error, a finished trial: final)."""
    import sqlalchemy.exc

    seen: BaseException | None = err
    for _ in range(8):  # Optuna wraps SQLAlchemy's error, which may wrap the driver's
        if seen is None:
            return False
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        # A session whose connection was cut mid-transaction refuses further
        # use until rolled back (PendingRollbackError): the same lost server.
        if isinstance(seen, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError
                      | sqlalchemy.exc.PendingRollbackError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def reconnecting(fn: Any, on_lost: Any = None) -> Any:
    """`fn`, tried again after `RECONNECT_DELAYS` while it fails for a lost
    server (`_lost_server`); any other error is raised at once. `on_lost`
    (called with `fn`'s arguments) runs before each new try. For the claims'
    own statements on the storage's database (`study.claims`) and every call
    of `ReconnectingStorage`."""
    def call(*args: Any, **kwargs: Any) -> Any:
        for delay in RECONNECT_DELAYS:
            try:
                return fn(*args, **kwargs)
            except Exception as err:
                if not _lost_server(err):
                    raise
                if on_lost is not None:
                    on_lost(*args, **kwargs)
                time.sleep(delay)
        return fn(*args, **kwargs)

    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


def _drop_session(storage: Any, *args: Any, **kwargs: Any) -> None:
    """The thread's session still holds the cut connection and its failed
    transaction: drop it, so the next try opens a new one."""
    with contextlib.suppress(Exception):
        storage.scoped_session.remove()


class ReconnectingStorage(optuna.storages.RDBStorage):
    """`RDBStorage` whose calls are tried again while the server is away.

    Every storage call of Optuna's interface is retried when it failed for a
    lost server or a cut connection (`_lost_server`), after
    `RECONNECT_DELAYS`; any other error is raised at once. A call whose
    commit reached the server but whose answer was lost is made twice: for
    `create_new_trial` that leaves a trial no run owns, which the study's
    stale-trial check fails once a later trial has finished
    (`study.ownership.fail_stale_trials`).
    """


# Optuna's interface, and the private calls its cache in front of an RDB
# storage makes to it (`optuna.storages._CachedStorage`).
_CALLS = [name for name, value in vars(optuna.storages.BaseStorage).items()
          if not name.startswith("_") and callable(value)]
_CALLS += [name for name in ("_create_new_trial", "_get_trials", "_set_trial_param",
                             "_get_best_trial_id", "_get_stale_trial_ids")
           if hasattr(optuna.storages.RDBStorage, name)]
for _name in _CALLS:
    setattr(ReconnectingStorage, _name,
            reconnecting(getattr(optuna.storages.RDBStorage, _name), on_lost=_drop_session))


# Workers started together on a new database all create Optuna's tables at
# once; those that lose the race find them made on the next attempt.
SCHEMA_ATTEMPTS = 4


def _lost_schema_race(err: Exception) -> bool:
    """Whether opening a storage failed because another process was creating
    its tables at that moment (or, SQLite, held the file's lock)."""
    name, text = type(err).__name__, str(err).lower()
    return name == "IntegrityError" or (
        name in ("OperationalError", "ProgrammingError")
        and ("already exists" in text or "database is locked" in text))


def _storage_hint(url: str, err: Exception) -> str:
    """How to fix a storage that would not open, by what went wrong."""
    scheme = url.partition("://")[0]
    postgres = scheme.startswith("postgresql")
    if scheme in ("postgresql", "postgresql+psycopg", "postgresql+psycopg2") and \
            isinstance(err, ImportError):
        # SQLAlchemy reads postgresql:// as psycopg 3 and +psycopg2 as psycopg2.
        return ("install the PostgreSQL drivers with pip install 'shardsearch[postgres]' "
                "(postgresql:// uses psycopg 3, postgresql+psycopg2:// uses psycopg2)")
    if type(err).__name__ == "OperationalError" and not scheme.startswith("sqlite"):
        return ("check that the server runs on that host and port and that the user, "
                "password and database are right" + (
                    " (a database is made with createdb -O USER NAME; see docs/studies.md, "
                    "'K workers on one PostgreSQL study')" if postgres else ""))
    return "give an Optuna storage URL such as sqlite:///path/to/studies.db"


def check_study_name(name: Any) -> str:
    """`name` when it can name a study: a non-empty string printable on one line.

    An empty name must not quietly become the default one, and a line break
    would split every message that quotes it. Example: "gpt-dp2" → "gpt-dp2";
    "" and "a\nb" raise ValueError.
    """
    if not isinstance(name, str) or not name.strip() or not name.isprintable():
        raise ValueError(
            f"study name {name!r}: give a non-empty name printable on one line (no line "
            "breaks or control characters), e.g. 'gpt-small-dp2-tp4'")
    return name


def is_resumable(storage: Any) -> bool:
    """Whether a study in `storage` outlives this process, so that a later run
    resumes it: False for an in-memory SQLite URL ("sqlite://",
    "sqlite:///:memory:", "mode=memory") and Optuna's InMemoryStorage.

    Example:
      >>> is_resumable("sqlite:///studies.db"), is_resumable("sqlite://")
      (True, False)
    """
    if storage is None:
        return True  # the default SQLite file
    if isinstance(storage, optuna.storages.InMemoryStorage):
        return False
    if not isinstance(storage, str):
        return True
    from sqlalchemy.engine import make_url

    try:
        url = make_url(storage)
    except Exception:  # not a URL open_study can use either; it reports that
        return True
    if url.get_backend_name() != "sqlite":
        return True
    database = url.database or ""
    return not (database in ("", ":memory:") or database.startswith("file::memory:")
                or url.query.get("mode") == "memory")


def close_storage(study: optuna.Study) -> None:
    """Closes the connections of a study's relational storage (a no-op for others).

    For a run that stops: its last writes are committed, and the database
    sees its connections end rather than vanish. The study stays usable: a
    later call opens new connections.
    """
    engine = storage_engine(study)
    # Closing an in-memory database would erase it (its URL has no password).
    if engine is None or not is_resumable(str(engine.url)):
        return
    backend = getattr(study._storage, "_backend", study._storage)
    # Best effort: it runs on the way out of an interrupt, which must stay one.
    with contextlib.suppress(Exception):
        backend.remove_session()
        engine.dispose()


def storage_engine(study: optuna.Study) -> Any:
    """The SQLAlchemy engine of a study's relational storage; None for others
    (`InMemoryStorage`, journal files).

    Other processes see what goes through it: `search.claims` keeps its
    table in the same database.
    """
    # Optuna wraps an RDBStorage (`engine`) in a cache (`_backend`); neither is public.
    backend = getattr(study._storage, "_backend", study._storage)
    return getattr(backend, "engine", None)


def use_compile_cache(folder: str | Path) -> Path:
    """Turns on JAX's persistent compilation cache in `folder`, unless the
    process already has one; returns the folder in use. Compiles over 0.5 s
    are kept, unless the environment sets JAX's own threshold
    (`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`)."""
    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path.resolve()))
    # JAX's default threshold (1 s) would skip most small-model compiles.
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path
