"""Studies on a real PostgreSQL server (`pgserver`): both URL spellings, and
errors that never print the password.

SQLAlchemy reads `postgresql://` as psycopg 3 and `postgresql+psycopg2://` as
psycopg2; the `postgres` extra brings both. Each error path runs the real
command in a subprocess and reads everything it printed.
"""

import subprocess
import sys
from urllib.parse import quote

import pytest
from child_env import child_env
from pgserver import ONE_PROCESS, fresh_database, postgres_url
from sqlalchemy.engine import make_url

from shardsearch.search.study.storage import close_storage, open_study, storage_engine

pytestmark = ONE_PROCESS

# A password that no message could contain by chance.
WRONG = "Wr0ng-pw-7f3a9c"


def test_both_url_spellings_open_one_study():
    url = fresh_database(postgres_url(), "shardsearch_spellings")
    psycopg2_url = url.replace("postgresql://", "postgresql+psycopg2://", 1)
    first = open_study(url, "spelled")
    assert storage_engine(first).dialect.driver == "psycopg"  # psycopg 3
    first.tell(first.ask(), 1.5)
    second = open_study(psycopg2_url, "spelled", create=False)
    assert storage_engine(second).dialect.driver == "psycopg2"
    assert [t.value for t in second.get_trials()] == [1.5]
    for study in (first, second):
        close_storage(study)  # its connections closed, not left to the collector


def _url(case):
    """A URL of the test server gone wrong, its password, and what the error says."""
    base = make_url(postgres_url())
    wrong = {
        "wrong-password": (base.set(password=WRONG), "password authentication failed"),
        # The server listens on 127.0.0.1 only.
        "wrong-host": (base.set(host="127.0.0.2"), "refused"),
        "missing-database": (base.set(database="no_such_database"),
                             'database "no_such_database" does not exist'),
    }
    url, message = wrong[case]
    return url.render_as_string(hide_password=False), url.password, message


# Each case through another command: they share the storage door (`open_study`).
@pytest.mark.parametrize("case, command", [
    ("wrong-password", ["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2", "--devices",
                        "2", "--objective", "static", "--trials", "1", "--quiet"]),
    ("wrong-host", ["export", "--study", "none", "--out", "plan.json"]),
    ("missing-database", ["confirm", "--study", "none"]),
], ids=["wrong-password", "wrong-host", "missing-database"])
def test_a_password_is_never_printed(case, command, tmp_path):
    url, password, message = _url(case)
    env = child_env()
    done = subprocess.run([sys.executable, "-m", "shardsearch", *command, "--storage", url],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    printed = done.stdout + done.stderr
    assert done.returncode == 2, printed
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr and ":***@" in done.stderr
    for secret in {password, quote(password, safe="")}:
        assert secret not in printed
