"""The study's pruner: a timed candidate is cut once its steps are slower than the best's."""

import functools
import itertools

import optuna
import pytest

import shardsearch as ss
from shardsearch.base.warnings import ShardsearchWarning
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.evaluation.stages import COMPLETE, CUT, Stage
from shardsearch.search.setup import make_context
from shardsearch.search.space.baselines import baseline_candidates
from shardsearch.search.study.pruner import SlowerThanBest
from shardsearch.workloads import get_workload

BEST = (1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.02)


@pytest.mark.parametrize("steps, best, cut", [
    ((1.3, 1.2), BEST, True),           # above six of the best's seven (times 1.1): p = 1/18
    ((1.3,), BEST, False),              # one step is never enough
    ((1.3, 1.04), BEST, False),         # the second within the best's spread
    ((1.3, 1.2), (), False),            # a best without timed steps
    ((0.5, 0.6), BEST, False),          # faster
    ((1.0, 1.1, 0.9, 1.0), BEST, False),  # the same
    ((1.3, float("nan")), BEST, False),  # a step that is not a number
    ((1.4, 1.35, 1.45, 1.5), BEST[:3], True),
])
def test_a_trial_is_cut_when_its_steps_are_significantly_above_the_bests(steps, best, cut):
    assert SlowerThanBest(0.1, 2).slower(steps, best) is cut


def test_a_trial_within_the_margin_of_the_best_is_not_cut():
    # 7% slower in every step: a finalist to re-time, not a loser, at the
    # default margin of 10%; without a margin it is cut.
    best = (1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0)
    steps = (1.07, 1.08, 1.06, 1.07, 1.07)
    assert not SlowerThanBest().slower(steps, best)
    assert SlowerThanBest(margin=0.0).slower(steps, best)
    assert SlowerThanBest(margin=0.05).slower(steps, best)
    assert not SlowerThanBest(margin=0.07).slower(steps, best)


def test_the_rank_sum_test_cuts_where_a_paired_test_of_as_many_steps_cannot():
    # All three steps slower: the signed-rank test of three pairs cannot go
    # under 1/8; the rank-sum test against seven steps is at 1/120.
    slow = (2.0, 2.1, 2.2)
    assert SlowerThanBest(0.1, 2).slower(slow, BEST)
    import scipy.stats
    paired = [s - b for s, b in zip(slow, BEST, strict=False)]
    assert scipy.stats.wilcoxon(paired, alternative="greater").pvalue >= 0.1


@pytest.mark.parametrize("options, match", [
    (dict(p_threshold=0), "p_threshold=0"), (dict(p_threshold=1.5), "between 0 and 1"),
    (dict(p_threshold=True), "p_threshold=True"), (dict(min_steps=0), "min_steps=0"),
    (dict(min_steps=2.5), "whole number"), (dict(margin=-0.1), "margin=-0.1"),
    (dict(margin=float("inf")), "share >= 0"),
])
def test_bad_pruner_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        SlowerThanBest(**options)


def test_a_maximised_study_is_refused():
    study = optuna.create_study(direction="maximize", pruner=SlowerThanBest())
    trial = study.ask()
    trial.report(1.0, 0)
    trial.report(1.0, 1)
    with pytest.raises(ValueError, match="prunes a minimised study"):
        trial.should_prune()


def test_a_best_trial_without_timed_steps_cuts_nothing_and_says_so_once():
    # A completed trial with neither reports nor a recorded outcome, as a
    # study stored before shardsearch kept the steps holds it.
    study = optuna.create_study(pruner=SlowerThanBest())
    study.add_trial(optuna.trial.create_trial(value=1.0))

    def slow_trial():
        trial = study.ask()
        for i in range(3):
            trial.report(5.0, i)
        return trial

    first = slow_trial()
    with pytest.warns(ShardsearchWarning, match="trial 0, the study's best, has no timed "
                                                "steps on record"):
        assert not first.should_prune()
    study.tell(first, 5.0)  # slower than the best: trial 0 stays the best
    assert not slow_trial().should_prune()  # no second warning: warnings are errors here


def test_a_candidate_slower_than_a_baseline_is_cut_after_two_steps(mesh24, tmp_path,
                                                                   monkeypatch):
    # Baselines are timed without reports, so the best trial here (a
    # baseline: every searched candidate's steps are ten times slower) has no
    # intermediate values; the pruner reads its recorded step times.
    noise = itertools.cycle((0.0, 0.001, -0.001, 0.002))

    def time_steps(compiled, specs, ctx, repeats, report=None, warmups=None):
        if report is None:
            return [0.01 + next(noise) for _ in range(repeats)]
        times = []
        for i in range(repeats):
            times.append(0.1 + next(noise))
            if report(i, times[-1]):
                break
        return times

    monkeypatch.setattr(_evaluate, "time_steps", time_steps)
    optimize = functools.partial(ss.optimize, isolate=False)
    result = optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=12, warmup=1,
                      repeats=6, confirm_rounds=6, quiet=True,
                      storage=f"sqlite:///{tmp_path / 'studies.db'}")
    timed = [t for t in result.trials if t.label == "search" and not t.outcome.cache_hit
             and t.outcome.step_times]
    assert timed, "no searched candidate was timed; the test proves nothing"
    for trial in timed:
        assert trial.outcome.status == CUT and trial.outcome.cut_stage is Stage.MEASURE
        assert len(trial.outcome.step_times) == 2
    assert all(len(t.outcome.step_times) == 6 for t in result.trials
               if t.label != "search" and t.outcome.step_times and not t.outcome.cache_hit)
    assert isinstance(result.study.pruner, SlowerThanBest)


@pytest.mark.parametrize("stops, warmups, timed", [
    (1, 2, 0),   # stopped at the second warm-up: the third never runs, nothing is timed
    (3, 3, 1),   # stopped at the first timed step
])
def test_the_warm_ups_after_the_first_are_reported_before_the_timed_steps(mesh24, stops,
                                                                          warmups, timed):
    # A steady warm-up is evidence for the timing cut: a candidate the cut
    # stops at its second report stops one timed step earlier than when only
    # the timed steps were reported; one stopped at a warm-up times nothing.
    workload = get_workload("mlp:tiny")
    ctx, _ = make_context(workload, None, mesh24, warmup=3, repeats=4)
    specs, fp = _evaluate.resolve(baseline_candidates(workload, mesh24)["dp"], ctx)
    reports = []

    def report(i, seconds):
        reports.append((i, seconds))
        return len(reports) == stops

    cut = _evaluate.evaluate(specs, fp, ctx, report)
    assert cut.status == CUT and cut.cut_stage is Stage.MEASURE
    assert (len(cut.warmup_times), len(cut.step_times)) == (warmups, timed)
    # The first warm-up (the executable's first run) is never reported.
    steady = [*cut.warmup_times[1:], *cut.step_times]
    assert reports == list(enumerate(steady)) and len(reports) == stops
    assert cut.reason.startswith(f"significantly slower than the best so far after {stops} "
                                 f"steady step{'s' if stops != 1 else ''} (median ")
    reports.clear()
    done = _evaluate.evaluate(specs, fp, ctx, lambda i, s: reports.append(i) and False)
    assert done.status == COMPLETE and len(done.step_times) == 4
    assert reports == list(range(2 + 4))
