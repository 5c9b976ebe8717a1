"""The PostgreSQL server of the tests that need one: its URL, or a skip.

`.ci/run` starts a server on loopback and puts the URL of an empty database
(user and password included) in SHARDSEARCH_TEST_POSTGRES, and the server's
folder in SHARDSEARCH_TEST_POSTGRES_DIR (for the tests that restart it).
Locally, without them, those tests skip; under CI=true they fail instead, so
a CI run that lost its server cannot pass by skipping them.
"""

import os
import subprocess
import time
from pathlib import Path

import pytest

ENV = "SHARDSEARCH_TEST_POSTGRES"

# The tests that use the server run in one xdist process, one after another:
# tests/test_chaos.py stops and restarts it, which would break a test another
# process ran on it meanwhile (`pytest -n 2 --dist loadgroup`, the README's).
ONE_PROCESS = pytest.mark.xdist_group("postgres")


def postgres_url() -> str:
    """The test server's URL (`postgresql://user:password@127.0.0.1:PORT/db`),
    once it answers; else a skip (a failure under CI=true)."""
    url = os.environ.get(ENV)
    problem = None
    if not url:
        problem = f"no PostgreSQL server: {ENV} is not set (.ci/run starts one)"
    else:
        import sqlalchemy

        try:
            engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 5})
            with engine.connect():
                pass
            engine.dispose()
        except Exception as err:  # any driver's error: the server is not usable
            problem = f"the PostgreSQL server of {ENV} does not answer: {type(err).__name__}"
    if problem is None:
        return url
    if _under_ci():
        pytest.fail(f"{problem}; under CI=true the PostgreSQL tests must run")
    pytest.skip(problem)


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the test server, owned by the test user; its URL.

    Each test gets its own, so studies and claim tables never meet.
    """
    import sqlalchemy
    from sqlalchemy.engine import make_url

    base = make_url(url)
    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}" OWNER "{base.username}"'))
    engine.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


DIR_ENV = "SHARDSEARCH_TEST_POSTGRES_DIR"


def server_dir() -> Path:
    """The test server's folder (`.ci/postgres-server start DIR`: `DIR/data`,
    `DIR/bindir`), for the tests that restart it; else a skip (a failure
    under CI=true)."""
    text = os.environ.get(DIR_ENV)
    folder = Path(text) if text else None
    if folder is not None and (folder / "bindir").is_file() and (folder / "data").is_dir():
        return folder
    problem = (f"{DIR_ENV} is not set (.ci/run sets it to the server's folder)" if not text
               else f"{DIR_ENV}={text} holds no server made by .ci/postgres-server "
                    "(no bindir file or data folder)")
    if _under_ci():
        pytest.fail(f"{problem}; under CI=true the PostgreSQL restart tests must run")
    pytest.skip(problem)


def restart_server(folder: Path, timeout: float = 60.0) -> float:
    """`pg_ctl restart -m fast` of the server in `folder`: every connection is
    cut, the server comes back on the same port; returns the seconds it took.

    pg_ctl runs as the data folder's owner, as PostgreSQL refuses to run as root.

    Raises:
      AssertionError: pg_ctl failed (its output in the message).
    """
    data = folder / "data"
    owner = data.stat().st_uid
    command = [str(Path((folder / "bindir").read_text().strip()) / "pg_ctl"), "-D", str(data),
               # -l: the restarted server must not write to (and hold open) our pipes.
               "-l", str(folder / "server.log"), "-m", "fast", "-w", "-t", str(int(timeout)),
               "restart"]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 30,
                          user=owner if os.getuid() == 0 and owner != 0 else None)
    assert done.returncode == 0, f"pg_ctl restart failed ({done.returncode}): " \
        f"{done.stdout}{done.stderr}"
    return time.monotonic() - start


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
