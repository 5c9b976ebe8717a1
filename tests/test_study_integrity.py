"""A study is bound to what it searched; stale trials; baselines claimed once; in-memory storage."""

import dataclasses
import subprocess
import sys
import time

import jax
import optuna
import pytest
from optuna.trial import TrialState

import shardsearch as ss
from shardsearch.cli import main as _cli
from shardsearch.cli.render import results_table
from shardsearch.search.study import ownership as _own
from shardsearch.search.study.identity import IDENTITY_ATTR, StudyIdentity, arguments_fingerprint
from shardsearch.search.study.storage import is_resumable
from shardsearch.workloads import get_workload

FAST = dict(objective="static", confirm_rounds=0, quiet=True, space="rules", isolate=False)
REFUSED = "a study resumes only the search that started it"


@pytest.fixture(scope="module")
def mesh():
    return ss.create_mesh((2, 4), ("dp", "tp"))


@pytest.fixture(scope="module")
def bound(tmp_path_factory, mesh):
    """An mlp:tiny study on dp=2,tp=4 (static objective, rules space), 3 trials."""
    storage = f"sqlite:///{tmp_path_factory.mktemp('bound') / 's.db'}"
    ss.optimize(get_workload("mlp:tiny"), mesh=mesh, n_trials=3, storage=storage,
                study_name="bound", **FAST)
    return storage


def _snapshot(storage, name):
    study = optuna.load_study(study_name=name, storage=storage)
    return study.user_attrs, [(t.number, t.state, t.params, t.user_attrs) for t in study.trials]


def _dead_pid():
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


# --------------------------------------------------------------------------- identity


@pytest.mark.parametrize("change, message", [
    ({"step": "gpt:tiny"},
     "study 'bound' searched mlp:tiny on dp=2,tp=4; this run is gpt:tiny on dp=2,tp=4; "),
    ({"mesh": ((4, 2), ("dp", "tp"))},
     "study 'bound' searched mlp:tiny on dp=2,tp=4; this run is mlp:tiny on dp=4,tp=2; "),
    ({"objective": "measured"},
     "searched mlp:tiny on dp=2,tp=4 with objective static; this run is mlp:tiny on "
     "dp=2,tp=4 with objective measured; "),
    ({"space": "both"}, "with space 'rules' (version 1); this run is mlp:tiny on dp=2,tp=4 "
                        "with space 'both' (version 2)"),
], ids=["workload", "mesh", "objective", "space"])
def test_a_study_refuses_another_search_before_writing_anything(bound, mesh, change, message):
    before = _snapshot(bound, "bound")
    kw = {**FAST, "mesh": mesh, "storage": bound, "study_name": "bound", "n_trials": 2}
    kw.update({k: v for k, v in change.items() if k != "step"})
    if "mesh" in change:
        kw["mesh"] = ss.create_mesh(*change["mesh"])
    with pytest.raises(ValueError, match=REFUSED) as refused:
        ss.optimize(get_workload(change.get("step", "mlp:tiny")), **kw)
    assert message in str(refused.value)
    # Not a trial added, not an attribute touched: the stored result still stands.
    assert _snapshot(bound, "bound") == before
    assert before[0]["result"] is not None


def test_a_raw_step_study_is_bound_to_its_arguments_leaves(tmp_path, mesh):
    workload = get_workload("mlp:tiny")
    args = workload.abstract()
    storage = f"sqlite:///{tmp_path / 's.db'}"
    kw = dict(mesh=mesh, storage=storage, study_name="raw", n_trials=1, **FAST)
    result = ss.optimize(workload.step, args, **kw)
    recorded = result.study.user_attrs[IDENTITY_ATTR]
    assert recorded["workload"] is None and recorded["arguments"] == arguments_fingerprint(args)
    state, batch = args
    bigger = (state, jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((2 * x.shape[0], *x.shape[1:]), x.dtype), batch))
    with pytest.raises(ValueError, match=f"searched a raw step on arguments "
                       f"{recorded['arguments']} on dp=2,tp=4; this run is a raw step on "
                       f"arguments {arguments_fingerprint(bigger)} on dp=2,tp=4"):
        ss.optimize(workload.step, bigger, **kw)
    # export resolves specs only on the leaves the study searched.
    with pytest.raises(ValueError, match="the given arguments have other leaf paths"):
        ss.export_config(result.study, args=bigger)
    assert ss.export_config(result.study, args=args)["workload"] is not None
    assert ss.export_config(result.study, workload=workload)["workload"] is not None


def test_a_study_from_before_identities_resumes_and_is_then_bound(tmp_path, mesh):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    legacy = optuna.create_study(storage=storage, study_name="old")
    for key, value in {"workload": "mlp:tiny", "mesh": {"dp": 2, "tp": 4},
                       "objective": "static", "result": None}.items():
        legacy.set_user_attr(key, value)
    before = _snapshot(storage, "old")
    with pytest.raises(ValueError, match="study 'old' searched mlp:tiny on dp=2,tp=4; this "
                                         "run is gpt:tiny"):
        ss.optimize(get_workload("gpt:tiny"), mesh=mesh, storage=storage, study_name="old",
                    n_trials=1, **FAST)
    assert _snapshot(storage, "old") == before
    result = ss.optimize(get_workload("mlp:tiny"), mesh=mesh, storage=storage,
                         study_name="old", n_trials=1, **FAST)
    bound = StudyIdentity.from_json(result.study.user_attrs[IDENTITY_ATTR])
    assert dataclasses.replace(bound, values=None) == StudyIdentity(
        "mlp:tiny", None, (("dp", 2), ("tp", 4)), "static", "rules")
    assert dict(bound.values)["budget"] is None  # the values it now records


def test_cli_refuses_another_workload_and_export_checks_the_workload(
        bound, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = _snapshot(bound, "bound")
    code = _cli.main(["optimize", "--workload", "gpt:tiny", "--mesh", "dp=2,tp=4",
                      "--objective", "static", "--space", "rules", "--storage", bound,
                      "--study", "bound", "--no-compile-cache", "--no-isolate", "--quiet",
                      "--out", "p.json"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("shardsearch optimize: error: study 'bound' searched mlp:tiny on "
                          "dp=2,tp=4; this run is gpt:tiny on dp=2,tp=4; ")
    assert not (tmp_path / "p.json").exists() and _snapshot(bound, "bound") == before

    code = _cli.main(["export", "--study", "bound", "--storage", bound, "--workload",
                      "gpt:tiny", "--out", "x.json"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "study 'bound' searched mlp:tiny; the workload given is gpt:tiny" in err
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(ValueError, match="searched mlp:tiny; the workload given is gpt:tiny"):
        ss.export_config(optuna.load_study(study_name="bound", storage=bound),
                         workload=get_workload("gpt:tiny"))
    assert _cli.main(["export", "--study", "bound", "--storage", bound, "--workload",
                      "mlp:tiny", "--out", "y.json"]) == 0


# --------------------------------------------------------------------------- stale trials


def _running(owner=None, heartbeat=None, **attrs):
    attrs = dict(attrs)
    if owner is not None:
        attrs[_own.OWNER_ATTR] = owner.to_json()
    if heartbeat is not None:
        attrs[_own.HEARTBEAT_ATTR] = heartbeat
    return optuna.trial.create_trial(state=TrialState.RUNNING, user_attrs=attrs)


def test_which_running_trials_are_stale():
    here = _own.Owner.current()
    elsewhere = _own.Owner("another-host", here.pid, "boot", "ns", 1)
    dead = _own.Owner(here.host, _dead_pid(), here.boot, here.pid_namespace)
    recycled = _own.Owner(here.host, here.pid, here.boot, here.pid_namespace, -1)
    fresh = _running().datetime_start.timestamp()
    late = fresh + _own.GRACE_SECONDS + 1
    assert not _own.is_stale(_running(here), here)
    assert _own.is_stale(_running(dead), here)
    if here.started is not None:  # Linux: a pid now used by another process
        assert _own.is_stale(_running(recycled), here)
    # Another machine: only the heartbeat tells (the first is written at ask).
    assert not _own.is_stale(_running(elsewhere, heartbeat=fresh), here, now=fresh + 1)
    assert _own.is_stale(_running(elsewhere, heartbeat=fresh), here, now=late)
    assert not _own.is_stale(_running(elsewhere), here, now=fresh + 1)
    # No beat yet (an older version, or another run an instant after creating
    # it): never judged by Optuna's start time, a naive local time.
    assert not _own.is_stale(_running(), here, now=fresh + 1)
    assert not _own.is_stale(_running(), here, now=late)
    assert not _own.is_stale(_running(elsewhere), here, now=late)
    finished = optuna.trial.create_trial(state=TrialState.FAIL)
    assert not _own.is_stale(finished, here, now=late)


def test_a_running_trial_beats_its_heartbeat_until_it_ends():
    study = optuna.create_study()
    trial = study.ask()
    with _own.Heartbeat(trial, interval=0.01) as heart:
        for _ in range(500):  # until the first beat lands
            if _own.HEARTBEAT_ATTR in study.trials[0].user_attrs:
                break
            time.sleep(0.01)
        study.tell(trial, state=TrialState.FAIL)  # the beats end with the trial
    beat = study.trials[0].user_attrs[_own.HEARTBEAT_ATTR]
    assert isinstance(beat, float)
    assert not heart._thread.is_alive()


def test_resume_fails_dead_runs_trials_as_interrupted_and_counts_them(tmp_path, mesh):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    kw = dict(mesh=mesh, storage=storage, study_name="stale", **FAST)
    workload = get_workload("mlp:tiny")
    ss.optimize(workload, n_trials=2, **kw)  # replicated, default
    study = optuna.load_study(study_name="stale", storage=storage)
    here = _own.Owner.current()
    # A run killed while it ran baseline "dp", and a live run now running "fsdp".
    killed, live = study.ask(), study.ask()
    killed.set_user_attr("label", "dp")
    killed.set_user_attr("owner", _own.Owner(here.host, _dead_pid(), here.boot,
                                             here.pid_namespace).to_json())
    live.set_user_attr("label", "fsdp")
    live.set_user_attr("owner", here.to_json())

    result = ss.optimize(workload, n_trials=2, **kw)
    states = {t.number: t for t in result.study.trials}
    assert states[killed.number].state == TrialState.FAIL
    assert states[killed.number].user_attrs["reason"] == "interrupted"
    assert states[live.number].state == TrialState.RUNNING  # its owner lives
    # The killed run's baseline runs again; the live run's is left to it.
    new = [r.label for r in result.trials if r.number > live.number]
    assert new == ["dp", "megatron"]
    summary = result.summary()
    assert summary["interrupted"] == 1 and summary["failed"] == 0
    assert summary["trials"] == 5
    config = ss.export_config(result)
    assert config["results"]["trials"]["interrupted"] == 1
    rows = {row["label"]: row for row in config["results"]["baselines"]}
    assert rows["dp"]["status"] == "complete"  # the re-run, not the interrupted claim
    line = next(x for x in results_table(config).splitlines() if x.startswith("trials:"))
    assert "; 0 failed; 1 interrupted; " in line
    with pytest.raises(ValueError, match=f"trial {killed.number} was interrupted"):
        ss.export_config(result, trial=killed.number)
    # Summaries and plan files from before the count existed still render.
    del config["results"]["trials"]["interrupted"]
    assert "interrupted" not in results_table(config)


def test_a_baseline_claimed_twice_at_once_goes_to_the_lower_trial():
    study = optuna.create_study()
    first = study.ask()  # another run's claim, a moment earlier
    first.set_user_attr("label", "replicated")
    study.enqueue_trial({}, user_attrs={"label": "replicated"})  # ours, racing it
    claims = _own.BaselineClaims(study, ["replicated", "default"])
    trial, name = claims.ask()
    assert (trial.number, name) == (1, None)  # ours loses: a search trial
    assert trial.user_attrs["label"] == "search"
    assert trial.user_attrs["owner"] == _own.Owner.current().to_json()
    study.tell(trial, state=TrialState.FAIL)
    trial, name = claims.ask()
    assert name == "default"
    # Failed before it recorded an outcome (its run died): the next run claims it again.
    study.tell(trial, state=TrialState.FAIL)
    assert _own.BaselineClaims(study, ["replicated", "default"]).ask()[1] == "default"


# --------------------------------------------------------------------------- in-memory storage


@pytest.mark.parametrize("storage, resumable", [
    (None, True), ("sqlite:////tmp/studies.db", True), ("postgresql://u@db/x", True),
    ("sqlite://", False), ("sqlite:///:memory:", False),
    ("sqlite:///file:s?mode=memory&uri=true", False),
    (optuna.storages.InMemoryStorage(), False),
])
def test_in_memory_storages_are_not_resumable(storage, resumable):
    assert is_resumable(storage) is resumable


def test_cli_does_not_call_an_in_memory_study_resumable(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = _cli.main(["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4",
                      "--trials", "2", "--objective", "static", "--space", "rules",
                      "--storage", "sqlite://", "--no-compile-cache", "--no-isolate",
                      "--quiet", "--confirm-rounds", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "in sqlite:// (in memory: it ends with this process)" in out
    assert "resumes" not in out
