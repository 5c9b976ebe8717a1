"""Several workers on one study: `shardsearch optimize` processes sharing a storage.

The workers run the real command in subprocesses (static objective, mlp:tiny
on 8 simulated devices each) on a real PostgreSQL server (`pgserver`) and on
an SQLite file; the claims (`search.claims`) are also tested on their own,
in this process, where a dead worker is a pid that no longer runs.
"""

import collections
import subprocess
import sys
import threading
import time

import optuna
import pytest
from child_env import child_env
from optuna.trial import TrialState
from pgserver import ONE_PROCESS, fresh_database, postgres_url
from progress import after_trials, signal_mid_trial
from sqlalchemy.engine import make_url

from shardsearch.search.evaluation.outcome import Outcome
from shardsearch.search.evaluation.stages import COMPLETE
from shardsearch.search.study.claims import (
    CONFIRM_LEFT,
    CONFIRMED_ELSEWHERE,
    CONFIRMED_HERE,
    CompileClaims,
    Roster,
)
from shardsearch.search.study.ownership import OWNER_ATTR, Owner
from shardsearch.search.study.record import outcome_attrs
from shardsearch.search.study.storage import close_storage, open_study

STUDY = "workers"
COMMAND = ["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--devices", "8",
           "--objective", "static", "--space", "rules", "--study", STUDY,
           "--no-compile-cache", "--no-isolate", "--confirm-rounds", "0"]


def _worker(tmp_path, storage, name, trials, seed, command=COMMAND):
    env = child_env()
    return subprocess.Popen(
        [sys.executable, "-m", "shardsearch", *command, "--storage", storage, "--trials",
         str(trials), "--seed", str(seed), "--out", str(tmp_path / f"{name}.json")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(process, limit=240):
    out, err = process.communicate(timeout=limit)
    assert process.returncode == 0, err.decode()[-3000:]
    return out.decode() + err.decode()


def _trials(url):
    study = optuna.load_study(study_name=STUDY, storage=url)
    try:
        return study.get_trials()
    finally:
        close_storage(study)


def _pids(trials):
    return collections.Counter((t.user_attrs.get(OWNER_ATTR) or {}).get("pid") for t in trials)


def _compiled(trials):
    """Fingerprint → how many trials compiled it (not answered from another's record)."""
    out = collections.Counter()
    for t in trials:
        outcome = t.user_attrs.get("outcome") or {}
        if outcome.get("fingerprint") and not outcome.get("cache_hit"):
            out[outcome["fingerprint"]] += 1
    return out


def _check_cooperated(trials, workers):
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    by_pid = _pids(trials)
    for process in workers:
        assert by_pid[process.pid] >= 2, by_pid  # each worker recorded its own trials
    compiled = _compiled(trials)
    assert compiled and max(compiled.values()) == 1, compiled  # never compiled twice
    # The shared baselines: each was run by one worker only.
    labels = collections.Counter(t.user_attrs.get("label") for t in trials
                                 if "outcome" in t.user_attrs)
    assert labels["replicated"] == 1 and labels["default"] == 1, labels


@pytest.mark.slow
@ONE_PROCESS
def test_two_workers_on_postgres_share_compiles_and_survive_kill_9(tmp_path):
    url = fresh_database(postgres_url(), "shardsearch_workers")
    # Both spellings of the driver share one study: psycopg 3 and psycopg2.
    spelled = url.replace("postgresql://", "postgresql+psycopg2://", 1)
    doomed = _worker(tmp_path, spelled, "a", trials=30, seed=1)
    survivor = _worker(tmp_path, url, "b", trials=10, seed=2)
    after_trials(doomed, 3, 30, limit=120.0)
    killed = signal_mid_trial(doomed, lambda: _trials(url))
    doomed.communicate()
    out = _finish(survivor)
    password = make_url(url).password
    assert password not in out and "***" in out  # the study line names the storage
    trials = _trials(url)
    _check_cooperated(trials, [doomed, survivor])
    # The killed worker's trial was ended by the survivor, at once (same machine).
    assert trials[killed].state == TrialState.FAIL
    assert trials[killed].user_attrs["reason"] == "interrupted"
    survivor_trials = [t for t in trials
                       if (t.user_attrs.get(OWNER_ATTR) or {}).get("pid") == survivor.pid]
    assert len(survivor_trials) == 10


@pytest.mark.slow
def test_two_workers_on_sqlite_share_compiles(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    first = _worker(tmp_path, url, "a", trials=5, seed=1)
    second = _worker(tmp_path, url, "b", trials=5, seed=2)
    _finish(first)
    _finish(second)
    trials = _trials(url)
    assert len(trials) == 10
    _check_cooperated(trials, [first, second])


@pytest.mark.slow
def test_two_measuring_workers_share_a_study_and_the_last_confirms(tmp_path):
    """As a user runs them: the measured objective, each candidate in its
    worker process, the finalists re-timed by the last worker to finish."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    measured = [("measured" if arg == "static" else arg) for arg in COMMAND
                if arg != "--no-isolate"]
    measured[measured.index("--confirm-rounds") + 1] = "6"
    measured += ["--warmup", "1", "--repeats", "3"]
    first = _worker(tmp_path, url, "a", 6, 1, measured)
    second = _worker(tmp_path, url, "b", 6, 2, measured)
    _finish(first, 400)
    _finish(second, 400)
    trials = _trials(url)
    assert len(trials) == 12
    _check_cooperated(trials, [first, second])
    # Every trial that ran its step recorded its timed repeats.
    timed = [t for t in trials if t.user_attrs["outcome"]["status"] == "complete"
             and not t.user_attrs["outcome"].get("cache_hit")]
    assert timed and all(len(t.user_attrs["outcome"]["step_times"]) == 3 for t in timed)
    # The finalists were re-timed once, by the worker that finished last (or,
    # both finishing at once, by one of them); both wrote the plan.
    study = optuna.load_study(study_name=STUDY, storage=url)
    result = study.user_attrs["result"]
    assert result["confirmed_by"] in (CONFIRMED_HERE, CONFIRMED_ELSEWHERE), result
    assert result["confirmation"], result
    assert (tmp_path / "a.json").exists() and (tmp_path / "b.json").exists()


def test_workers_on_one_sqlite_file_never_take_the_same_queued_trial(tmp_path):
    # Without serialised transactions, four asking threads took 16 of 40
    # queued trials twice (each thread has its own engine, as a worker does).
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    queued = 40
    first = open_study(url, "queue")
    for i in range(queued):
        first.enqueue_trial({"x": i})
    taken: list[int] = []
    lock = threading.Lock()

    def ask_all():
        study = open_study(url, "queue")
        for _ in range(queued // 4):
            number = study.ask().number
            with lock:
                taken.append(number)
        close_storage(study)

    threads = [threading.Thread(target=ask_all) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    close_storage(first)
    assert sorted(taken) == list(range(queued))


# ---------------------------------------------------------------- the claims alone


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=ONE_PROCESS)])
def study(request, tmp_path):
    """A new study on an SQLite file or on the PostgreSQL server."""
    url = (f"sqlite:///{tmp_path / 'claims.db'}" if request.param == "sqlite"
           else fresh_database(postgres_url(), f"shardsearch_claims_{request.node.name[5:40]}"))
    study = optuna.create_study(storage=url, study_name="claims")
    yield study
    close_storage(study)


def _dead_owner():
    """The owner record of a process that ran on this machine and is gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return Owner.current().to_json() | {"pid": child.pid, "started": None}


def _record(study, trial, fingerprint, value):
    outcome = Outcome(fingerprint, COMPLETE, value=value)
    for key, item in outcome_attrs(outcome).items():
        trial.set_user_attr(key, item)
    trial.set_user_attr("state_rule", {})
    trial.set_user_attr("batch_rule", {})
    study.tell(trial, value)


def test_a_claimed_fingerprint_is_reused_and_a_dead_claim_taken_over(study):
    claims = CompileClaims(study, wait=30.0)
    assert claims.shared
    first = study.ask()
    assert claims.acquire("f00d", first.number) is None  # this trial holds it
    _record(study, first, "f00d", 0.5)
    second = study.ask()
    reused = claims.acquire("f00d", second.number)
    assert reused is not None and reused.value == 0.5 and reused.fingerprint == "f00d"
    # A trial whose process died while it held a claim: the next trial takes it over.
    orphan = study.ask()
    orphan.set_user_attr(OWNER_ATTR, _dead_owner())
    assert claims.acquire("beef", orphan.number) is None
    third = study.ask()
    third.set_user_attr(OWNER_ATTR, Owner.current().to_json())
    assert claims.acquire("beef", third.number) is None
    assert study.get_trials()[orphan.number].state == TrialState.FAIL  # ended, not RUNNING


def test_a_claim_left_by_a_deleted_study_of_the_same_name_never_stalls_a_trial(study):
    """A study deleted and made again under its name starts its trial numbers
    over; a row its first trial left names the new study's first trial,
    which must not wait for itself (a bench entry rerun stalled for the whole
    wait on its first baseline)."""
    url, name = study._storage, study.study_name
    CompileClaims(study, wait=60.0).acquire("cafe", study.ask().number)
    optuna.delete_study(study_name=name, storage=url)
    again = optuna.create_study(storage=url, study_name=name)
    trial = again.ask()
    start = time.monotonic()
    assert CompileClaims(again, wait=60.0).acquire("cafe", trial.number) is None
    assert time.monotonic() - start < 10


def test_the_last_worker_to_finish_confirms_once(study):
    early, late = Roster(study), Roster(study)
    early.join()
    late.join()
    assert early.turn() == CONFIRM_LEFT  # the other still searches
    assert late.turn() == CONFIRMED_HERE
    # Two that find no one left at the same instant: one confirms.
    again = [Roster(study), Roster(study)]
    for roster in again:
        roster.join()
    for roster in again:
        roster._set(-3)  # both done before either looks
    assert sorted(r.turn() for r in again) == sorted([CONFIRMED_HERE, CONFIRMED_ELSEWHERE])


# ---------------------------------------------------------------- the confirmation


@pytest.mark.slow
def test_a_study_is_confirmed_by_its_last_worker_or_by_confirm(tmp_path, mesh24):
    import shardsearch as ss
    from shardsearch.cli.main import main
    from shardsearch.search.export import export_config
    from shardsearch.search.reconfirm import CONFIRMED_BY_COMMAND, confirm_study
    from shardsearch.workloads import get_workload

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    timing = {"warmup": 1, "repeats": 2}
    result = ss.optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=3, storage=storage,
                         study_name="measured", confirm_rounds=6, isolate=False, quiet=True,
                         **timing)
    assert result.confirmed_by == CONFIRMED_HERE  # alone, it is the last to finish
    confirmed = confirm_study(storage, "measured", mesh=mesh24, rounds=6, **timing)
    assert confirmed.confirmed_by == CONFIRMED_BY_COMMAND and confirmed.confirmation
    study = optuna.load_study(study_name="measured", storage=storage)
    assert study.user_attrs["result"]["confirmed_by"] == CONFIRMED_BY_COMMAND
    assert export_config(study)["results"]["confirmed_by"] == CONFIRMED_BY_COMMAND
    # A static study has nothing to re-time: a usage error.
    ss.optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=1, storage=storage,
                study_name="static", objective="static", isolate=False, quiet=True)
    assert main(["confirm", "--study-name", "static", "--storage", storage]) == 2


def test_confirm_builds_the_finalists_steps_with_the_knobs_their_trials_set(
        tmp_path, mesh24, monkeypatch):
    """A study searched with knobs has trials whose step is built with a
    setting (the best baseline's variants). Whichever of them the re-timing
    takes, `confirm` must build its step with that setting, where it used to
    stop with "the step has no knobs"."""
    import shardsearch as ss
    from shardsearch.search import reconfirm
    from shardsearch.workloads import get_workload

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    timing = {"warmup": 1, "repeats": 2}
    ss.optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=10, storage=storage,
                study_name="knobs", confirm_rounds=0, knobs=True, isolate=False, quiet=True,
                space="rules", **timing)
    built = []
    real_finish = reconfirm.finish

    def finish(setup, study, records, rounds, *args, **kwargs):
        for r in records:
            if r.knobs:  # each could be a finalist: its step must build
                built.append(setup.context.with_setting(r.knobs).knobs.values(r.knobs))
        return real_finish(setup, study, records, rounds, *args, **kwargs)

    monkeypatch.setattr(reconfirm, "finish", finish)
    confirmed = reconfirm.confirm_study(storage, "knobs", mesh=mesh24, rounds=6, **timing)
    assert built and any(v["microbatches"] > 1 or v["grad_groups"] > 1 for v in built), built
    assert all(len(t.times) == 6 for t in confirmed.confirmation.values())


def test_confirm_keeps_the_retiming_in_the_plan_file_when_the_study_cannot_store_it(
        tmp_path, mesh24, capsys):
    """A study the confirmation can read but not write (a read-only SQLite
    file, as a copy from another machine can be): the re-timing is not lost
    to a traceback; the plan file holds it and the error is one line."""
    import shardsearch as ss
    from shardsearch.cli.main import main
    from shardsearch.workloads import get_workload

    db = tmp_path / "studies.db"
    ss.optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=3, storage=f"sqlite:///{db}",
                study_name="ro", confirm_rounds=0, isolate=False, quiet=True, space="rules",
                warmup=1, repeats=2)
    capsys.readouterr()
    plan = tmp_path / "plan.json"
    code = main(["confirm", "--study", "ro", "--storage", f"sqlite:///file:{db}?mode=ro&uri=true",
                 "--rounds", "6", "--warmup", "1", "--repeats", "2", "--out", str(plan)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "re-timed, but the result could not be stored" in err and "readonly" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    confirmed = ss.load_plan(plan)
    assert confirmed.results["confirmed_by"] == "shardsearch confirm"
    assert confirmed.results["verdict"] in ("faster", "tie")
