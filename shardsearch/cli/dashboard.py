"""`shardsearch dashboard`: serve optuna-dashboard on a study storage.

optuna-dashboard is an optional dependency (the `dashboard` extra). Its app
(`optuna_dashboard.wsgi`) is served here with the standard library's WSGI
server, which is what `optuna_dashboard.run_server` does, except that bottle's
`run` would swallow Ctrl-C and SIGTERM: served here, they end the command with
130 and 143 like every other, and a port already taken is a usage error before
anything is served.

Example: `shardsearch dashboard --port 8080` → "optuna-dashboard on
http://127.0.0.1:8080/ (storage sqlite:///.../.shardsearch/studies.db)".
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .args import Command, UsageError, add_storage

INSTALL = "pip install 'shardsearch[dashboard]'"
DEFAULT_PORT = 8080
# SQLite URLs that name a file: "sqlite:///relative.db", "sqlite:////abs/path.db".
_SQLITE_FILE = "sqlite:///"


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535 ("8080" → 8080; 0: any free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_storage(p)
    p.add_argument("--port", type=port, default=DEFAULT_PORT, metavar="N",
                   help=f"port to serve on (default {DEFAULT_PORT}; 0: any free port, printed)")
    p.add_argument("--host", default="127.0.0.1", metavar="HOST",
                   help="address to bind (default 127.0.0.1, this machine only; 0.0.0.0 "
                        "serves every network the machine is on)")


def run(a: argparse.Namespace) -> int:
    try:
        import optuna_dashboard
    except ImportError:
        raise UsageError(f"optuna-dashboard is not installed; {INSTALL}") from None
    from ..base.secrets import redact_url
    from ..search.study.storage import default_storage, is_resumable

    url = a.storage or default_storage()
    shown = redact_url(url)
    if url.startswith(_SQLITE_FILE) and is_resumable(url) and \
            not Path(url[len(_SQLITE_FILE):]).is_file():
        raise UsageError(f"no study storage at {shown}: the file does not exist; give the "
                         "--storage that `shardsearch optimize` wrote to")
    app = optuna_dashboard.wsgi(_open(url, shown))
    server = _serve(app, a.host, a.port)
    print(f"optuna-dashboard on http://{a.host}:{server.server_port}/ (storage {shown}); "
          "Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (`base.interrupts.Terminated`)
        raise type(stop)("the dashboard stopped; the storage is as it was") from None
    finally:
        server.server_close()
    return 0


def _open(url: str, shown: str) -> Any:
    import optuna

    from ..base.secrets import hide_secrets

    try:
        return optuna.storages.RDBStorage(url)
    except Exception as err:  # a bad URL, a missing driver, a server down
        raise UsageError(f"cannot open storage {shown}: {type(err).__name__}: "
                         f"{hide_secrets(str(err), url)}") from None


def _serve(app: Any, host: str, number: int) -> Any:
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        # The dashboard polls every few seconds; a line per request would bury
        # the command's own output.
        def log_message(self, format: str, *args: Any) -> None:
            pass

    try:
        return make_server(host, number, app, handler_class=Quiet)
    except OSError as err:  # the port taken, an address not of this machine
        raise UsageError(f"cannot serve on {host}:{number}: {err.strerror or err}; "
                         "pick another --port or --host") from None


COMMAND = Command("dashboard", "serve optuna-dashboard on a study storage (the "
                  "`dashboard` extra)", add_arguments, run)
