"""A study in optuna-dashboard: `shardsearch dashboard` serves a stored study,
whose trials read back through the dashboard's HTTP API with their decoded
parameters and their figures as numbers.

Without optuna-dashboard (the `dashboard` extra) the served test skips, but
under CI=true it fails naming the extra, so a CI run that lost it is seen.
"""

import importlib.util
import json
import os
import select
import subprocess
import sys
import time
import urllib.request

import pytest
from child_env import child_env

import shardsearch as ss
from shardsearch.cli import main as _cli
from shardsearch.search.study import attrs
from shardsearch.workloads import get_workload

ANSWER_WAIT = 120.0  # seconds for the command to start serving (it imports jax)


def _need_dashboard() -> None:
    if importlib.util.find_spec("optuna_dashboard") is not None:
        return
    problem = ("the 'dashboard' extra is not installed (no optuna_dashboard); "
               "pip install -e '.[dashboard]'")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{problem}; under CI=true the dashboard test must run")
    pytest.skip(problem)


def _get(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + path, timeout=30) as answer:
        return json.loads(answer.read())


def _serve(storage: str) -> tuple[subprocess.Popen, str]:
    """`shardsearch dashboard` on `storage`, any free port: the process and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardsearch", "dashboard", "--storage", storage, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env())
    deadline = time.monotonic() + ANSWER_WAIT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            assert line, f"the dashboard ended ({proc.wait()}): {proc.stderr.read()}"
            return proc, line.split(" on ", 1)[1].split()[0].rstrip("/")
    proc.kill()
    raise AssertionError(f"the dashboard did not start within {ANSWER_WAIT} s")


def test_a_study_reads_back_through_the_dashboard(tmp_path):
    _need_dashboard()
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    result = ss.optimize(get_workload("mlp:tiny"), mesh=ss.create_mesh((2, 4), ("dp", "tp")),
                         n_trials=10, objective="static", space="rules", storage=storage,
                         quiet=True, isolate=False, confirm_rounds=0)
    name = result.study.study_name
    proc, base = _serve(storage)
    try:
        studies = _get(base, "/api/studies")["study_summaries"]
        study_id = next(s["study_id"] for s in studies if s["study_name"] == name)
        detail = _get(base, f"/api/studies/{study_id}")
    finally:
        proc.kill()
        proc.communicate()
    trials = {t["number"]: {a["key"]: a["value"] for a in t["user_attrs"]}
              for t in detail["trials"]}
    assert len(trials) == len(result.study.trials)
    # Every figure is a number the dashboard can sort and plot by.
    sortable = {a["key"]: a["sortable"] for a in detail["union_user_attrs"]}
    for key in (attrs.VALUE_SECONDS, attrs.COMPILE_SECONDS, attrs.MEMORY_TOTAL_BYTES,
                attrs.ESTIMATE):
        assert sortable.get(key) is True, (key, sortable)
    for trial in result.study.trials:
        served, stored = trials[trial.number], trial.user_attrs
        outcome = stored[attrs.OUTCOME]
        assert served[attrs.STATUS] == outcome["status"]
        if outcome["status"] == "complete":
            assert float(served[attrs.VALUE_SECONDS]) == pytest.approx(outcome["value"])
        if outcome["status"] == "cut":
            assert served[attrs.CUT_STAGE] in ("check", "compile", "estimate", "measure")
        if "total" in outcome["memory"]:
            assert int(served[attrs.MEMORY_TOTAL_BYTES]) == outcome["memory"]["total"]
    # The search's trials carry their Lehmer codes decoded, as stored.
    searched = [t for t in result.study.trials if t.user_attrs[attrs.LABEL] == "search"]
    assert searched, "the study proposed no search trial"
    for trial in searched:
        served = trials[trial.number]
        order = served[f"{attrs.READABLE_PREFIX}auto_order"]
        assert sorted(order.split(",")) == ["dp", "tp"]
        assert order == trial.user_attrs[f"{attrs.READABLE_PREFIX}auto_order"]
        assert order.split(",")[0] == ("dp", "tp")[trial.params["auto_order_0"]]
        assert sorted(served[f"{attrs.READABLE_PREFIX}priority"].split(",")) == [
            "auto", "memory"]


def test_measured_search_trials_report_each_steady_step(tmp_path):
    # What the dashboard's intermediate-value plot shows: the pruner's
    # reports, the warm-ups after the first, then the timed steps.
    result = ss.optimize(get_workload("mlp:tiny"), mesh=ss.create_mesh((2, 4), ("dp", "tp")),
                         n_trials=9, space="rules", storage=f"sqlite:///{tmp_path / 's.db'}",
                         warmup=2, repeats=3, confirm_rounds=0, quiet=True, isolate=False)
    # Complete, or cut while timed (on mlp:tiny every searched plan may be
    # cut: replicated's steps are the fastest there).
    timed = [t for t in result.study.trials if t.user_attrs[attrs.LABEL] == "search"
             and t.user_attrs[attrs.OUTCOME]["warmup_times"]
             and not t.user_attrs[attrs.OUTCOME]["cache_hit"]]
    assert timed, "no search trial was timed"
    for trial in timed:
        outcome = trial.user_attrs[attrs.OUTCOME]
        times = [*outcome["warmup_times"][1:], *outcome["step_times"]]
        if outcome["status"] == "complete":
            assert len(times) == 1 + 3
        assert sorted(trial.intermediate_values) == list(range(len(times)))
        assert [trial.intermediate_values[i] for i in range(len(times))] == \
            pytest.approx(times)
    baselines = [t for t in result.study.trials if t.user_attrs[attrs.LABEL] != "search"]
    assert baselines and not any(t.intermediate_values for t in baselines)


def test_without_optuna_dashboard_one_line_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # import fails
    code = _cli.main(["dashboard", "--storage", f"sqlite:///{tmp_path / 'studies.db'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "pip install 'shardsearch[dashboard]'" in err


def test_a_storage_file_that_does_not_exist_is_a_usage_error(capsys, tmp_path):
    _need_dashboard()
    code = _cli.main(["dashboard", "--storage", f"sqlite:///{tmp_path / 'none.db'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "does not exist" in err


@pytest.mark.parametrize("port", ["-1", "65536", "x"])
def test_a_bad_port_is_a_usage_error(port, capsys):
    code = _cli.main(["dashboard", "--port", port])
    assert code == 2
    assert capsys.readouterr().err.count("\n") == 1
