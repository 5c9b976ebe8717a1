"""The PostgreSQL server of the tests that need one: its URL, or a skip.

`.ci/run` starts a server on loopback and puts the URL of an empty database
(user and password included) in SHARDSEARCH_TEST_POSTGRES. Locally, without
it, those tests skip; under CI=true they fail instead, so a CI run that lost
its server cannot pass by skipping them.
"""

import os

import pytest

ENV = "SHARDSEARCH_TEST_POSTGRES"


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
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
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
