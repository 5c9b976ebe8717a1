"""Storage passwords: hidden in every URL shardsearch prints, stores or puts in an error.

The error paths are driven for real: a connection to a port nobody listens
on, a database driver that is not installed, and a stand-in PostgreSQL server
(a socket speaking enough of the wire protocol to ask for the password and
then refuse it, or to say the database does not exist). No PostgreSQL server
is needed; failing to connect is the point.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import socket
import struct
import threading
import traceback

import jax
import jax.numpy as jnp
import pytest

import shardsearch as ss
from shardsearch.base.secrets import HIDDEN, hide_secrets, redact_url
from shardsearch.cli import main as _cli
from shardsearch.search.study.storage import open_study

SECRET = "secretpw"


# --------------------------------------------------------------------------- the function


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:secretpw@db:5432/s", "postgresql://u:***@db:5432/s"),
    ("postgresql+psycopg2://u:secretpw@db/s", "postgresql+psycopg2://u:***@db/s"),
    ("mysql+pymysql://user:secretpw@db-host/shardsearch",
     "mysql+pymysql://user:***@db-host/shardsearch"),
    # A password holding '/', ':', '?' or '#' is still one password to SQLAlchemy.
    ("postgresql://u:se/cr:et?pw#x@db/s", "postgresql://u:***@db/s"),
    # %-escapes: hidden whole, escaped or not.
    ("postgresql://u:secret%40pw%2F@db/s", "postgresql://u:***@db/s"),
    # An unescaped '@': everything before the last one is hidden.
    ("postgresql://u:secret@pw@db:5432/s", "postgresql://***@db:5432/s"),
    ("postgresql://u:se/cr@t@pw@db/s?sslmode=require",
     "postgresql://***@db/s?sslmode=require"),
    # Query-string passwords, under the names drivers use.
    ("postgresql://u@db/s?password=secretpw&sslmode=require",
     "postgresql://u@db/s?password=***&sslmode=require"),
    ("mysql://u@db/s?passwd=secretpw", "mysql://u@db/s?passwd=***"),
    ("mssql+pyodbc://u@db/s?PWD=secretpw", "mssql+pyodbc://u@db/s?PWD=***"),
    ("postgresql://u@db/s?sslpassword=secretpw&password=a&password=b",
     "postgresql://u@db/s?sslpassword=***&password=***&password=***"),
    ("postgresql://u:secretpw@[::1]:5432/s?auth_token=secretpw",
     "postgresql://u:***@[::1]:5432/s?auth_token=***"),
    # Nothing to hide: the URL as written.
    ("sqlite:////home/me/.shardsearch/studies.db", "sqlite:////home/me/.shardsearch/studies.db"),
    ("sqlite:///rel/at@home.db", "sqlite:///rel/at@home.db"),
    ("sqlite://", "sqlite://"),
    ("postgresql://u@db/s", "postgresql://u@db/s"),
    # Not parseable: at most the scheme is shown.
    ("sqlite:/secretpw.db", "sqlite:***"),
    ("secretpw", "***"),
    ("postgresql://u:secretpw@db:port/s", "postgresql:***"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown
    assert SECRET not in shown and "secret" not in shown.replace("sqlite:////home", "")


def test_hide_secrets_scrubs_the_url_and_what_drivers_quote_of_it():
    url = "postgresql://u:secret@pw@db/s?password=secretpw2"
    # A driver handed the misparsed URL names the "host" it could not find.
    text = f'cannot connect to {url}: could not translate host name "pw@db" to address'
    hidden = hide_secrets(text, url)
    assert "secret" not in hidden and "pw@db" not in hidden
    assert hidden.startswith(f"cannot connect to {redact_url(url)}: ")
    assert hide_secrets("nothing here", "sqlite://") == "nothing here"
    assert redact_url(42) == "<int>"


# --------------------------------------------------------------------------- a server


class _FakePostgres:
    """A listening socket that speaks PostgreSQL's startup protocol, then refuses.

    `mode="password"` asks for a cleartext password, reads it and answers
    "password authentication failed"; `mode="database"` answers "database ...
    does not exist". What a real server says in those cases, with no server.
    """

    def __init__(self, mode: str):
        self.mode, self.passwords = mode, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError, struct.error):
                self._talk(conn)

    def _talk(self, conn: socket.socket) -> None:
        def read(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = conn.recv(n - len(data))
                if not chunk:
                    raise OSError("closed")
                data += chunk
            return data

        while True:
            length, code = struct.unpack("!ii", read(8))
            body = read(length - 8)
            if code in (80877103, 80877104):  # SSL / GSS encryption request: no
                conn.sendall(b"N")
                continue
            params = body.split(b"\0")
            user = params[params.index(b"user") + 1].decode() if b"user" in params else "?"
            database = params[params.index(b"database") + 1].decode() \
                if b"database" in params else user
            break
        if self.mode == "password":
            conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # cleartext password, please
            _kind, length = struct.unpack("!ci", read(5))
            self.passwords.append(read(length - 4).rstrip(b"\0").decode())
            fields = ("28P01", f'password authentication failed for user "{user}"')
        else:
            fields = ("3D000", f'database "{database}" does not exist')
        payload = b"".join(k + v.encode() + b"\0" for k, v in (
            (b"S", "FATAL"), (b"V", "FATAL"), (b"C", fields[0]), (b"M", fields[1]))) + b"\0"
        conn.sendall(b"E" + struct.pack("!i", len(payload) + 4) + payload)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def servers():
    made = {mode: _FakePostgres(mode) for mode in ("password", "database")}
    yield made
    for server in made.values():
        server.close()


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]  # closed again: nothing listens there


def _missing_driver() -> str:
    for driver in ("pg8000", "psycopg", "asyncpg", "pygresql"):
        if importlib.util.find_spec(driver) is None:
            return driver
    pytest.skip("every PostgreSQL driver is installed")


# One URL per way of failing, each with the password in another place.
CASES = ["wrong-host", "wrong-host-at", "query", "missing-driver", "unknown-dialect",
         "wrong-password", "missing-database"]


@pytest.fixture(params=CASES)
def failing_url(request, servers):
    case = request.param
    connects = case.startswith(("wrong", "missing-database", "query"))
    if connects and importlib.util.find_spec("psycopg2") is None:
        pytest.skip("psycopg2 (the test extra) is needed to reach a server")
    port = _free_port()
    url = {
        "wrong-host": f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:{port}/db",
        # An unescaped '@' in the password: the driver misreads part of it as the host.
        "wrong-host-at": f"postgresql+psycopg2://u:{SECRET}@x{SECRET}@127.0.0.1:{port}/db",
        "query": f"postgresql+psycopg2://u@127.0.0.1:{port}/db?password={SECRET}",
        "missing-driver": f"postgresql+{_missing_driver()}://u:{SECRET}@127.0.0.1:{port}/db",
        "unknown-dialect": f"postgresql+nosuchdriver://u:{SECRET}@db/x",
        "wrong-password": f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:"
                          f"{servers['password'].port}/db",
        "missing-database": f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:"
                            f"{servers['database'].port}/nodb",
    }[case]
    return case, url


def _expected(case: str) -> str:
    return {"wrong-password": "password authentication failed",
            "missing-database": 'database "nodb" does not exist',
            "missing-driver": "No module named", "unknown-dialect": "Can't load plugin",
            }.get(case, "Connection refused" if case != "wrong-host-at" else
                  "could not translate host name")


def _all_text(err: BaseException) -> str:
    return "".join(traceback.format_exception(err))


# --------------------------------------------------------------------------- library


def _step(state, batch):
    return state, {"loss": jnp.sum(state * batch)}


def test_library_errors_hide_the_password(failing_url, mesh24, capfd, caplog, servers):
    case, url = failing_url
    texts = []
    for create in (True, False):
        with pytest.raises(ValueError, match="cannot open storage") as err:
            open_study(url, "s", create=create)
        texts.append(_all_text(err.value))
    args = (jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))
    with pytest.raises(ValueError, match="cannot open storage") as err:
        ss.optimize(_step, args, mesh=mesh24, objective="static", storage=url, n_trials=1,
                    warm_start=False, quiet=True, study_name="s", isolate=False)
    texts.append(_all_text(err.value))
    captured = capfd.readouterr()
    everything = "\n".join([*texts, captured.out, captured.err, caplog.text])
    assert SECRET not in everything
    assert _expected(case) in texts[0]
    assert HIDDEN in texts[0]
    if case == "wrong-password":
        # The stand-in server did receive the password: the path was the real one.
        assert servers["password"].passwords[-1] == SECRET


# --------------------------------------------------------------------------- command line


def test_cli_errors_hide_the_password(failing_url, tmp_path, monkeypatch, capfd, caplog):
    case, url = failing_url
    monkeypatch.chdir(tmp_path)
    # The evaluation worker never sees the storage, and starting one costs a
    # process: one case keeps the default (a worker started, then ended by the
    # storage's error), the others search in this process.
    isolate = [] if case == "wrong-password" else ["--no-isolate"]
    runs = [
        ["export", "--study", "s", "--storage", url, "--out", "plan.json"],
        ["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--objective",
         "static", "--trials", "1", "--quiet", "--no-compile-cache", "--storage", url,
         *isolate],
    ]
    for argv in runs:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert _cli.main(argv) == 2
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"shardsearch {argv[0]}: error: "
                                                       "cannot open storage"), lines
        assert _expected(case) in lines[0] and HIDDEN in lines[0]
        assert SECRET not in out.getvalue() + err.getvalue()
    captured = capfd.readouterr()
    assert SECRET not in captured.out + captured.err + caplog.text
    assert not (tmp_path / "plan.json").exists()


def test_plan_files_and_summaries_never_carry_the_storage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    with contextlib.redirect_stdout(out):
        assert _cli.main(["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4",
                          "--objective", "static", "--trials", "1", "--quiet",
                          "--no-compile-cache", "--no-isolate", "--storage", storage,
                          "--out", "p.json"]) == 0
    assert f"in {storage} (the same command" in out.getvalue()
    text = (tmp_path / "p.json").read_text()
    assert "sqlite" not in text and "studies.db" not in text
