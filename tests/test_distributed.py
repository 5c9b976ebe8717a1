"""One search over several JAX processes (`search.distributed`, `shardsearch launch`).

Each test starts real processes: 2 x 4 simulated CPU devices joined over
loopback into one dp=2,tp=4 mesh (gloo for the collectives between them).
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from child_env import child_env

import shardsearch as ss
from shardsearch.cli.launch import free_port, process_command, worst
from shardsearch.cli.main import main
from shardsearch.cli.supervise import supervise
from shardsearch.search.evaluation.outcome import Outcome
from shardsearch.search.evaluation.stages import FAILED
from shardsearch.search.execution.distributed import (
    PROCESS_TIMES_ATTR,
    Distributed,
    merge_outcomes,
    settings,
)
from shardsearch.workloads import get_workload

# Small and quick: mlp:tiny (the quickest to compile; what is tested is how the
# processes search together), the baselines only (replicated, default, dp), few steps.
SEARCH = ["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--space", "rules",
          "--warmup", "1", "--repeats", "3", "--quiet", "--no-compile-cache"]


# ---------------------------------------------------------------- in this process


def _done(times, value=None):
    return Outcome("f", "complete", value=value or statistics.median(times),
                   step_times=tuple(times))


def test_a_steps_time_is_the_slowest_process_time():
    merged = merge_outcomes([(_done([1.0, 2.0, 3.0]), True), (_done([2.0, 1.0, 3.5]), True)])
    assert merged.step_times == (2.0, 2.0, 3.5) and merged.value == 2.0


def test_a_failure_in_any_process_fails_the_candidate_naming_it():
    failed = Outcome("f", "failed", reason="compile failed: XlaRuntimeError: boom")
    echo = Outcome("f", "failed", reason="step raised while measuring: PeerFailed: process 1")
    merged = merge_outcomes([(echo, False), (failed, True)])
    assert merged.status == FAILED and merged.reason == (
        "process 1: compile failed: XlaRuntimeError: boom")
    # A cut at compile (same program, same memory everywhere) beats the echo of it.
    cut = Outcome("f", "cut", 2, "XLA needs 9 bytes per device")
    assert merge_outcomes([(cut, True), (echo, False)]) is cut


def test_settings_refuse_what_a_single_process_cannot_do():
    assert settings(None, None) is None
    with pytest.raises(ValueError, match="needs several JAX processes"):
        settings(Distributed(), False)
    with pytest.raises(ValueError, match="positive number of seconds"):
        Distributed(timeout=0)


def test_launch_needs_a_command_and_sets_the_process_flags_itself(capsys):
    assert main(["launch", "--processes", "2"]) == 2
    assert "give the command after --" in capsys.readouterr().err
    assert main(["launch", "--processes", "2", "--", "optimize", "--process-id", "1"]) == 2
    assert "launch sets these itself" in capsys.readouterr().err
    assert process_command(["optimize", "--x"], "127.0.0.1:7", 2, 1, 4)[3:] == [
        "optimize", "--x", "--coordinator", "127.0.0.1:7", "--num-processes", "2",
        "--process-id", "1", "--devices", "4"]
    assert worst([0, 1]) == 1 and worst([0, -9]) == 137


def test_optimize_refuses_isolation_across_processes(capsys):
    code = main(["optimize", "--workload", "mlp:tiny", "--mesh", "dp=8", "--isolate",
                 "--num-processes", "2"])
    assert code == 2 and "--isolate is not available" in capsys.readouterr().err


# ---------------------------------------------------------------- several processes


def _env():
    env = child_env(PYTHONUNBUFFERED="1")
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    return env


def _study(storage, name):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=storage)


def test_two_processes_search_one_mesh(tmp_path):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    plan = tmp_path / "plan.json"
    out = subprocess.run(
        [sys.executable, "-m", "shardsearch", "launch", "--processes", "2",
         "--devices-per-process", "4", "--", *SEARCH, "--trials", "3", "--confirm-rounds", "6",
         "--storage", storage, "--study", "two", "--out", str(plan)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert all(line[:4] in ("[0] ", "[1] ") for line in lines), lines
    assert any("on mesh dp=2,tp=4 (8 cpu devices)" in line for line in lines if
               line.startswith("[0] "))
    followed = [line for line in lines if line.startswith("[1] process 1: candidate")]

    # Each trial is recorded once, by process 0; none is left running.
    trials = _study(storage, "two").get_trials(deepcopy=False)
    assert [t.number for t in trials] == [0, 1, 2]
    assert all(t.state.is_finished() for t in trials)
    assert {t.user_attrs["label"] for t in trials} == {"replicated", "default", "dp"}
    # Process 1 printed one line per candidate it ran, and no more.
    measured = [t for t in trials if PROCESS_TIMES_ATTR in t.user_attrs]
    assert measured and len(followed) <= len(trials)
    assert len(followed) >= len(measured)
    for t in measured:
        # A step's time is the slowest process's: the recorded times are the
        # per-step maximum over the processes, the value their median.
        per_process = t.user_attrs[PROCESS_TIMES_ATTR]
        recorded = t.user_attrs["outcome"]["step_times"]
        assert len(per_process) == 2 and all(len(p) == 3 for p in per_process)
        assert recorded == [max(a, b) for a, b in zip(*per_process, strict=True)]
        assert t.value == pytest.approx(statistics.median(recorded))

    # Process 0's plan loads and applies to the workload on the same mesh here.
    loaded = ss.load_plan(plan, mesh=ss.create_mesh((2, 4), ("dp", "tp")))
    args = get_workload("mlp:tiny").abstract()
    assert loaded.mismatch(args) is None
    assert len(loaded.apply(args)) == len(args)
    assert json.loads(plan.read_text())["mesh"]


@pytest.mark.slow
def test_two_processes_build_each_candidates_knob_setting(tmp_path):
    """Lockstep with the step's knobs: the setting travels with each job and
    every process compiles the step it builds."""
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    plan = tmp_path / "plan.json"
    out = subprocess.run(
        [sys.executable, "-m", "shardsearch", "launch", "--processes", "2",
         "--devices-per-process", "4", "--", *SEARCH, "--trials", "10", "--confirm-rounds", "6",
         "--knobs", "microbatches", "--storage", storage, "--study", "knobs", "--out",
         str(plan)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    trials = _study(storage, "knobs").get_trials(deepcopy=False)
    assert all(t.state.is_finished() for t in trials)
    knobbed = [t for t in trials if t.user_attrs.get("knobs")
               and t.user_attrs["outcome"]["status"] == "complete"
               and not t.user_attrs["outcome"].get("cache_hit")]
    assert knobbed, [(t.number, t.params) for t in trials]
    for t in knobbed:
        # A searched trial's parameter, or a baseline's variant ("dp~microbatches=2").
        chosen = (t.params["knob_microbatches"] if t.user_attrs["label"] == "search"
                  else int(t.user_attrs["label"].rpartition("=")[2]))
        assert chosen == t.user_attrs["knobs"]["microbatches"] != 1
        per_process = t.user_attrs[PROCESS_TIMES_ATTR]
        assert len(per_process) == 2 and all(len(p) == 3 for p in per_process)
    assert json.loads(plan.read_text())["knobs"]["microbatches"] in (1, 2, 4, 8)


def _start(i, port, storage, trials, tmp_path, workload="mlp:tiny", study="kill",
           options=("--lockstep-timeout", "5"), env=None):
    search = [workload if a == "mlp:tiny" else a for a in SEARCH]
    return subprocess.Popen(
        [sys.executable, "-m", "shardsearch", *search, "--trials", str(trials),
         "--confirm-rounds", "0", "--storage", storage, "--study", study,
         "--out", str(tmp_path / "plan.json"), "--coordinator", f"127.0.0.1:{port}",
         "--num-processes", "2", "--process-id", str(i), "--devices", "4", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=env or _env())


def _finished(storage):
    try:
        trials = _study(storage, "kill").get_trials(deepcopy=False)
    except Exception:  # not created yet, or being created
        return []
    return [t for t in trials if "outcome" in t.user_attrs]


@pytest.mark.parametrize("victim", [1, pytest.param(0, marks=pytest.mark.slow)],
                         ids=["follower-killed", "leader-killed"])
def test_a_killed_process_stops_the_other_and_the_study_resumes(tmp_path, victim):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    port = free_port()
    procs = [_start(i, port, storage, 6, tmp_path) for i in range(2)]
    try:
        deadline = time.monotonic() + 240
        while not _finished(storage):
            assert time.monotonic() < deadline, "no trial finished"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.2)
        procs[victim].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        survivor = procs[1 - victim]
        _out, err = survivor.communicate(timeout=90)
        took = time.monotonic() - killed
        if victim == 1:
            # Process 0 notices within the lockstep timeout (5 s), plus a
            # compile already under way, and says which process it lost.
            assert survivor.returncode == 1, err[-3000:]
            assert "error: process 1 " in err or "error in process 0: process 1 " in err, \
                err[-3000:]
        else:
            # Process 0 hosted JAX's coordination service: JAX aborts the
            # other's search at once; the command outside it says so.
            assert survivor.returncode == 1, err[-3000:]
            assert "shardsearch optimize: error: JAX's runtime aborted this process" in err, \
                err[-3000:]
        assert took < 90
        procs[victim].communicate()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    before = {t.number: t.user_attrs["outcome"] for t in _finished(storage)}
    assert before
    if victim == 0:
        # The resume is the same whichever process died; it is checked once,
        # below, to keep the suite's time down.
        return

    # Both restarted: the study resumes; no finished trial is lost or changed.
    # One new trial is enough to show that it goes on.
    port = free_port()
    procs = [_start(i, port, storage, 1, tmp_path) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-2000:] + err[-3000:]
    after = _study(storage, "kill").get_trials(deepcopy=False)
    # Process 0 failed its running trial as interrupted before it left. (A
    # process 0 killed with -9 leaves it to the next run: at once when it
    # holds its owner, after the grace period when it died between creating
    # the trial and naming itself in it; `search.ownership`.)
    assert all(t.state.is_finished() for t in after), [(t.number, t.state) for t in after]
    assert {n: o for n, o in before.items()} == {
        t.number: t.user_attrs["outcome"] for t in after if t.number in before}
    assert len([t for t in after if "outcome" in t.user_attrs]) >= len(before) + 1


def test_a_step_failing_in_one_process_fails_the_candidate_and_ends_the_run(tmp_path):
    # Process 1's finiteness check fails after the warm-up of the 2nd candidate
    # (`tests/stepfail.py`), while process 0 is already inside the next step's
    # collectives: process 0 cannot leave them, so the run ends, but at once
    # (not after --execute-timeout), and the candidate is recorded as failed.
    storage = f"sqlite:///{tmp_path / 'studies.db'}"

    def start(i, port, fail_from, trials):
        env = _env() | {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                       os.environ.get("PYTHONPATH", "")]),
                        "SHARDSEARCH_TEST_FAIL_FROM": fail_from}
        return _start(i, port, storage, trials, tmp_path, "stepfail:failing_in_process_1",
                      "fail", ("--lockstep-timeout", "60", "--execute-timeout", "600"), env)

    port = free_port()
    procs = [start(i, port, "4", 4) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    assert "process 1 failed while running the step (non-finite loss: injected" in outs[0][1]
    trials = _study(storage, "fail").get_trials(deepcopy=False)
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1, [(t.number, t.state) for t in trials]
    outcome = failed[0].user_attrs["outcome"]
    assert outcome["status"] == FAILED
    assert outcome["reason"].startswith("process 1: non-finite loss: injected")

    # Restarted without the fault: the failed candidate is not run again.
    port = free_port()
    procs = [start(i, port, "", 1) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    after = _study(storage, "fail").get_trials(deepcopy=False)
    runs = [t for t in after if t.user_attrs.get("outcome", {}).get("fingerprint")
            == outcome["fingerprint"] and not t.user_attrs["outcome"].get("cache_hit")]
    assert [t.number for t in runs] == [failed[0].number]


# ---------------------------------------------------------------- the command outside the search


def test_the_command_outside_passes_exit_codes_through_and_names_a_signal(capsys):
    assert supervise([sys.executable, "-c", "raise SystemExit(3)"], "p") == 3
    # JAX's runtime aborts a process whose coordinator (process 0) is gone.
    assert supervise([sys.executable, "-c", "import os; os.abort()"], "p") == 1
    err = capsys.readouterr().err
    assert err.startswith("p: error: JAX's runtime aborted this process (SIGABRT)")
    assert "restart every process" in err and err.count("\n") == 1


def test_the_command_outside_passes_a_stop_signal_on_once(capsys):
    # The child asks its parent (this test) to stop; the parent must not die
    # of it, must pass it on, and reports the child's end as that signal's.
    child = ("import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); "
             "time.sleep(60)")
    assert supervise([sys.executable, "-c", child], "p") == 128 + signal.SIGTERM
    assert "p: stopped by SIGTERM (the search ended on SIGTERM" in capsys.readouterr().err
