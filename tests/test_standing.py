"""A timed candidate held against the study's best trial before it runs.

`Leader.behind` (`search/evaluation/standing.py`): a program moving no fewer
bytes than the best trial's and doing at least 1.1x its flops per device, or
as many flops and 1.5x its bytes accessed, is cut at the estimate stage
instead of being placed, warmed up and timed; the loop
gives each searched trial the study's best trial (`recorded_leader`).
"""

from __future__ import annotations

import optuna
import pytest

import shardsearch as ss
from shardsearch.search import Leader, Outcome, Stage, Standing
from shardsearch.search import loop as _loop
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.setup import make_context
from shardsearch.search.space.baselines import baseline_candidates
from shardsearch.search.study.record import figure_attrs, leader_notes, recorded_leader
from shardsearch.workloads import get_workload

LEADER = Leader(trial=3, value=0.78, flops=1e9, collective_bytes=5e7, bytes_accessed=2e9)


FLOPS, TRAFFIC = "flops", "traffic"


@pytest.mark.parametrize("flops, collective, accessed, cut", [
    (1.10e9, 5e7, 2e9, FLOPS),      # 1.1x the flops, the same bytes
    (2.00e9, 9e7, 3e9, FLOPS),      # more of everything
    (1.09e9, 9e7, 2.9e9, None),     # within the margins of the flops and the bytes
    (2.00e9, 4e7, 3e9, None),       # fewer collective bytes: it may win there
    (2.00e9, 9e7, 1e9, None),       # fewer bytes from memory: it may win there
    (2.00e9, None, None, FLOPS),    # a figure not known is not compared
    (None, 9e7, 3e9, None),         # without flops nothing is said
    (1.00e9, 5e7, 3e9, TRAFFIC),    # as many flops, 1.5x the bytes accessed
    (0.995e9, 5e7, 4e9, TRAFFIC),   # flops within 1% count as as many
    (0.98e9, 5e7, 4e9, None),       # 2% fewer flops: it may win there
    (1.00e9, 4e7, 4e9, None),       # fewer collective bytes
    (1.00e9, 5e7, None, None),      # bytes accessed not known: no traffic to compare
])
def test_a_program_behind_the_leader_does_clearly_more_work_and_no_less_of_any(
        flops, collective, accessed, cut):
    why = LEADER.behind(flops, collective, accessed)
    assert (why is not None) == (cut is not None)
    if cut == FLOPS:
        assert why.startswith(f"its program does {flops / 1e9:.2f}x the flops per device of "
                              "the best so far (trial 3, 780 ms)")
    if cut == TRAFFIC:
        assert why == (f"its program reads and writes {accessed / 2e9:.2f}x the bytes per "
                       "device of the best so far (trial 3, 780 ms), with as many flops and "
                       "no fewer collective bytes")


def test_a_leader_without_recorded_bytes_compares_the_flops_and_what_it_has():
    old = Leader(2, 0.5, 1e9)  # a best trial stored before the bytes were kept
    assert old.behind(1.2e9, 0.0, 0.0) is not None
    assert Leader(2, 0.5, 1e9, collective_bytes=1e6).behind(1.2e9, 0.0, None) is None
    assert LEADER.behind(1.2e9, 5e7, 2e9, margin=0.25) is None
    assert LEADER.behind(1e9, 5e7, 3e9, traffic_margin=0.6) is None
    assert old.behind(1e9, 0.0, 9e9) is None  # no bytes accessed of its own to compare


def _trial(value, outcome, state=optuna.trial.TrialState.COMPLETE):
    return optuna.trial.create_trial(
        state=state, value=value if state == optuna.trial.TrialState.COMPLETE else None,
        user_attrs={"outcome": outcome.to_json()} if outcome else {})


def test_the_leader_is_the_best_completed_trial_with_its_programs_costs():
    study = optuna.create_study()
    assert recorded_leader(study.get_trials()) is None
    study.add_trial(_trial(0.9, Outcome("a", "complete", value=0.9, flops=2e9,
                                        collective_bytes=1e6, bytes_accessed=3e9)))
    study.add_trial(_trial(0.7, Outcome("b", "complete", value=0.7, flops=1e9,
                                        collective_bytes=2e6)))  # bytes accessed not kept
    study.add_trial(_trial(None, Outcome("c", "cut", 3, "slower"),
                           optuna.trial.TrialState.PRUNED))
    assert recorded_leader(study.get_trials()) == Leader(1, 0.7, 1e9, 2e6, None)
    # The best without flops (an outcome that never compiled here): no leader, not the next.
    study.add_trial(_trial(0.5, Outcome("d", "complete", value=0.5)))
    assert recorded_leader(study.get_trials()) is None


def test_a_leader_without_costs_on_record_is_said():
    study = optuna.create_study()
    assert leader_notes(study.get_trials(), None) == ()  # nothing completed: nothing to say
    study.add_trial(_trial(0.5, Outcome("d", "complete", value=0.5)))  # no flops kept
    trials = study.get_trials()
    assert recorded_leader(trials) is None
    assert leader_notes(trials, None)[0].startswith(
        "the study's best trial has no flops on record")
    old = Leader(0, 0.5, 1e9, 2e6, None)
    assert "held against its flops and collective bytes only" in leader_notes(trials, old)[0]
    assert leader_notes(trials, LEADER) == ()


def test_an_outcome_stores_the_bytes_accessed_only_when_known():
    known = Outcome("a", "complete", value=1.0, flops=1.0, bytes_accessed=5.0)
    assert known.to_json()["bytes_accessed"] == 5.0
    assert Outcome.from_json(known.to_json()) == known
    assert "bytes_accessed" not in Outcome("a", "complete", value=1.0).to_json()
    # The dashboard's copy too.
    assert figure_attrs(known)["bytes_accessed"] == 5.0
    assert "bytes_accessed" not in figure_attrs(Outcome("a", "complete", value=1.0))


def test_a_searched_candidate_behind_the_leader_is_cut_before_it_runs(mesh24, monkeypatch):
    workload = get_workload("mlp:tiny")
    ctx, _ = make_context(workload, None, mesh24, warmup=1, repeats=2)
    specs, fp = _evaluate.resolve(baseline_candidates(workload, mesh24)["dp"], ctx)
    timed = _evaluate.evaluate(specs, fp, ctx, lambda i, s: False)
    assert timed.status == "complete" and timed.flops > 0 and timed.bytes_accessed > 0
    # A leader doing half this program's work, with no bytes of its own to
    # compare: the candidate is behind it and never runs.
    ran = []
    measure = _evaluate.measure
    monkeypatch.setattr(_evaluate, "measure", lambda *a: ran.append(a) or measure(*a))
    ahead = Standing(leader=Leader(5, timed.value, timed.flops / 2, 0.0, 0.0))
    cut = _evaluate.evaluate(specs, fp, ctx, lambda i, s: False, standing=ahead)
    assert cut.cut_stage == Stage.ESTIMATE and not cut.step_times and ran == []
    assert cut.reason.startswith("its program does 2.00x the flops per device of the best "
                                 "so far (trial 5, ")
    assert (cut.flops, cut.collective_bytes, cut.bytes_accessed) == (
        timed.flops, timed.collective_bytes, timed.bytes_accessed)
    # A baseline (no report) is timed whatever the leader; so is a program that
    # reads fewer bytes than the leader's.
    assert _evaluate.evaluate(specs, fp, ctx, None, standing=ahead).status == "complete"
    reads_more = Standing(leader=Leader(5, timed.value, timed.flops / 2, 0.0,
                                        timed.bytes_accessed * 2))
    assert _evaluate.evaluate(specs, fp, ctx, lambda i, s: False,
                              standing=reads_more).status == "complete"
    assert len(ran) == 2


def test_each_searched_trial_is_held_against_the_best_trial_before_it(mesh24, monkeypatch,
                                                                     tmp_path):
    seen = []
    evaluate = _evaluate.evaluate

    def watch(specs, fp, ctx, report=None, **kw):
        seen.append((report is not None, fp, kw["standing"].leader))
        return evaluate(specs, fp, ctx, report, **kw)

    monkeypatch.setattr(_loop._evaluate, "evaluate", watch)
    workload = get_workload("mlp:tiny")
    result = ss.optimize(workload, mesh=mesh24, n_trials=9, warmup=1, repeats=2, quiet=True,
                         storage=f"sqlite:///{tmp_path / 's.db'}", confirm_rounds=0)
    # Baselines are never cut on it: they get no leader.
    assert all(leader is None for searched, _, leader in seen if not searched)
    number = {t.outcome.fingerprint: t.number for t in reversed(result.trials)
              if not t.outcome.cache_hit}
    values = {t.number: t.outcome.value for t in result.trials if t.outcome.value is not None}
    searched = [(number[fp], leader) for is_searched, fp, leader in seen if is_searched]
    assert searched
    for trial, leader in searched:
        # The best completed trial recorded before it, with its program's costs.
        before = {n: v for n, v in values.items() if n < trial}
        assert leader.trial == min(before, key=lambda n: (before[n], n))
        outcome = next(t.outcome for t in result.trials if t.number == leader.trial)
        assert (leader.flops, leader.collective_bytes, leader.bytes_accessed) == (
            outcome.flops, outcome.collective_bytes, outcome.bytes_accessed)
