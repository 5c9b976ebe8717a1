"""Ctrl-C, SIGTERM and kill -9 in the middle of `shardsearch optimize`.

The signal tests run the real command in a subprocess, three times per
signal on one study: each run must exit with its code (130, 143) and no C++
abort, its running trial failed as "interrupted", nothing left RUNNING.
"""

import re
import signal
import subprocess
import sys
import time

import optuna
import pytest
from child_env import child_env
from optuna.trial import TrialState
from progress import after_trials, signal_mid_trial

import shardsearch as ss
from shardsearch.base.interrupts import (
    Terminated,
    handle_signals,
    interruptible,
    interrupts_deferred,
    raise_if_signalled,
)
from shardsearch.workloads import get_workload

TRIALS = 60  # more than any test lets finish
COMMAND = ["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--devices", "8",
           "--trials", str(TRIALS), "--objective", "static", "--space", "rules",
           "--study", "sig", "--no-compile-cache", "--confirm-rounds", "0"]


def _start(tmp_path, storage, isolate):
    env = child_env()
    return subprocess.Popen([sys.executable, "-m", "shardsearch", *COMMAND, "--storage",
                             storage, "--isolate" if isolate else "--no-isolate"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _trials(storage):
    return optuna.load_study(study_name="sig", storage=storage).get_trials()


def _interrupted(trials):
    return [t for t in trials
            if t.state == TrialState.FAIL and t.user_attrs.get("reason") == "interrupted"]


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_study_exits_cleanly_every_time(sig, code, word, tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    for run in range(1, 4):
        # In this process, a compile thread is in XLA when the signal comes (the
        # C++ abort seen before); isolated, the study process waits on its worker.
        process = _start(tmp_path, storage, isolate=run == 2)
        seen = after_trials(process, 2, TRIALS)
        signal_mid_trial(process, lambda: _trials(storage), sig)
        _, rest = process.communicate(timeout=300)
        err = (seen + rest).decode(errors="replace")
        # What a failed assertion shows: stderr without the progress bar's redraws.
        said = "\n".join(line for line in re.split(r"[\r\n]", err)
                         if line.strip() and "trial/s" not in line)[-3000:]
        assert process.returncode == code, said
        assert f"shardsearch optimize: {word}; finished trials are kept in the study, the " \
               "same command resumes it" in err
        for crash in ("Traceback", "terminate called", "FATAL", "Aborted"):
            assert crash not in err, said
        trials = _trials(storage)
        table = [(t.number, t.state.name, t.user_attrs.get("label"), t.user_attrs.get("reason"))
                 for t in trials]
        # With the run's last words: a trial left RUNNING was seen once on CI
        # (exit 143, trial 9 of the third run) and the reason was not printed.
        # (A message that is a string is printed whole, a tuple's repr cut short.)
        assert [t.number for t in trials if t.state == TrialState.RUNNING] == [], \
            f"run {run}: {table}\n{said}"
        # This run's trial and each earlier run's; what they finished is kept.
        assert len(_interrupted(trials)) == run, f"run {run}: {table}\n{said}"
        assert sum(t.state == TrialState.COMPLETE for t in trials) >= 2 * run


@pytest.mark.slow
def test_kill_9_mid_study_then_resume_loses_nothing(tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    process = _start(tmp_path, storage, isolate=False)
    # Past the moment the trial names its owner (a signal would wait for it; kill -9 cannot).
    after_trials(process, 2, TRIALS)
    signal_mid_trial(process, lambda: _trials(storage))
    process.communicate()  # reaps it: its pid no longer names a process
    before = _trials(storage)
    finished = {t.number: t.user_attrs["outcome"] for t in before if t.state.is_finished()}
    killed = [t.number for t in before if t.state == TrialState.RUNNING]
    assert len(finished) >= 2 and len(killed) == 1

    result = ss.optimize(get_workload("mlp:tiny"), mesh=ss.create_mesh((2, 4), ("dp", "tp")),
                         n_trials=1, storage=storage, study_name="sig", objective="static",
                         space="rules", confirm_rounds=0, quiet=True, isolate=False)
    after = {t.number: t for t in result.study.get_trials()}
    assert {n: after[n].user_attrs["outcome"] for n in finished} == finished
    assert [n for n, t in after.items() if t.state == TrialState.RUNNING] == []
    assert after[killed[0]].state == TrialState.FAIL
    assert after[killed[0]].user_attrs["reason"] == "interrupted"
    assert result.summary()["interrupted"] == 1
    assert len(result.trials) == len(finished) + 2  # the killed one and this run's


# --------------------------------------------------------------------------- in-process


def test_sigterm_raises_terminated_and_handlers_are_put_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(Terminated), handle_signals():
        signal.raise_signal(signal.SIGTERM)
        time.sleep(5)  # not reached: the handler raises first
    with pytest.raises(KeyboardInterrupt), handle_signals():
        signal.raise_signal(signal.SIGINT)
        time.sleep(5)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    assert issubclass(Terminated, KeyboardInterrupt)  # whatever cleans up after Ctrl-C runs


def test_an_interrupt_is_held_until_the_trial_has_its_owner():
    done = []
    with pytest.raises(KeyboardInterrupt), handle_signals():
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("the block ran to its end")
        done.append("not reached")
    assert done == ["the block ran to its end"]


class _SignalsWhenCollected:
    """Sends `sig` to this process from its finalizer: the handler's exception
    is raised inside `__del__`, where CPython prints it and drops it (as when
    SQLAlchemy's or JAX's gc callbacks run as the signal comes)."""

    def __init__(self, sig):
        self.sig = sig

    def __del__(self):
        signal.raise_signal(self.sig)


def _dropped(monkeypatch):
    """The exceptions CPython drops from finalizers from now on (it would
    print them as "Exception ignored in")."""
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    return dropped


def test_a_signal_whose_exception_a_finalizer_swallowed_is_raised_again(monkeypatch):
    dropped, done = _dropped(monkeypatch), []
    with pytest.raises(Terminated), handle_signals():
        _SignalsWhenCollected(signal.SIGTERM)  # collected at once
        done.append("ran on: the exception was dropped")
        raise_if_signalled()
        done.append("not reached")
    assert done == ["ran on: the exception was dropped"]
    assert dropped == [Terminated]  # swallowed, then raised again
    # Nor can a block that never meets a check point end as if nothing came.
    with pytest.raises(KeyboardInterrupt), handle_signals():
        _SignalsWhenCollected(signal.SIGINT)
    raise_if_signalled()  # outside `handle_signals`: nothing is remembered


def test_interruptible_lets_signals_through_inside_a_deferral():
    order = []
    with pytest.raises(Terminated), handle_signals(), interrupts_deferred():
        signal.raise_signal(signal.SIGTERM)
        order.append("held")
        with interruptible():  # the held signal is raised as the block starts
            order.append("not reached")
    assert order == ["held"]
    with pytest.raises(KeyboardInterrupt), handle_signals(), interrupts_deferred(), \
            interruptible():
        with interrupts_deferred():  # storage work inside: held again
            signal.raise_signal(signal.SIGINT)
            order.append("held inside")
        order.append("not reached")
    assert order == ["held", "held inside"]
    with pytest.raises(KeyboardInterrupt), handle_signals(), interrupts_deferred():
        signal.raise_signal(signal.SIGINT)
        raise_if_signalled()  # a check point delivers what the block holds
        order.append("not reached")
    assert order == ["held", "held inside"]


def _optimize_until(raises, tmp_path):
    """`optimize` under `handle_signals`, which must end by raising `raises`;
    the study's trials."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    with pytest.raises(raises), handle_signals():
        ss.optimize(get_workload("mlp:tiny"), mesh=ss.create_mesh((2, 4), ("dp", "tp")),
                    n_trials=20, storage=storage, study_name="sig", objective="static",
                    space="rules", confirm_rounds=0, quiet=True, isolate=False)
    return _trials(storage)


def test_a_signal_swallowed_mid_trial_still_ends_that_trial_as_interrupted(
        tmp_path, monkeypatch):
    import shardsearch.search.loop as loop

    dropped = _dropped(monkeypatch)
    real = loop._evaluate.evaluate

    def evaluate(*args, **kwargs):
        _SignalsWhenCollected(signal.SIGTERM)  # the exception is dropped in `__del__`
        return real(*args, **kwargs)

    monkeypatch.setattr(loop._evaluate, "evaluate", evaluate)
    trials = _optimize_until(Terminated, tmp_path)
    # The first evaluated trial ran to its end, then was failed as interrupted.
    assert dropped == [Terminated]
    assert [t.state for t in trials] == [TrialState.FAIL]
    assert len(_interrupted(trials)) == 1


def test_a_signal_during_the_storage_writes_waits_for_them(tmp_path, monkeypatch):
    import shardsearch.search.loop as loop

    # `record_attrs` runs inside the writes of the trial's record: a SIGTERM
    # from its second call is held until they are done, so the trial is kept
    # whole, not cut mid-write.
    real, calls = loop.record_attrs, []

    def record_attrs(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "record_attrs", record_attrs)
    trials = _optimize_until(Terminated, tmp_path)
    assert [t.state for t in trials if t.state == TrialState.RUNNING] == []
    assert len(trials) == 2 and _interrupted(trials) == []
    assert all(t.user_attrs.get("outcome") for t in trials)  # every write landed
