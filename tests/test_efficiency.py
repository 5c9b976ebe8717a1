"""The search-efficiency study's bookkeeping (`benchmarks/efficiency/run.py`):
the table, the refine stage and the replay, on mlp:tiny with planted values."""

import collections
import itertools
import json
import math

import optuna
import pytest
from bench_scripts import load_script

import shardsearch as ss
from shardsearch.search import make_context, make_space
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.workloads import get_workload


@pytest.fixture(scope="module")
def run():
    return load_script("benchmarks/efficiency/run.py", "efficiency_run")


@pytest.fixture(scope="module")
def table(run, tmp_path_factory):
    """mlp:tiny's whole (2, 4) space resolved, nothing timed (`limit=0`)."""
    out = tmp_path_factory.mktemp("eff")
    return run.build_table("mlp:tiny", (2, 4), ("dp", "tp"), out, repeats=1, warmup=0,
                           limit=0, refine=0)


def test_table_maps_every_combination_to_a_fingerprint(run, table):
    space = make_space(ss.abstract_mesh((2, 4), ("dp", "tp")),
                       get_workload("mlp:tiny").abstract()[0])
    combos = space.enumerate()
    pairs = run._params(table)
    assert [params for params, _fp in pairs] == combos
    fps = {fp for _params, fp in pairs if fp is not None}
    assert fps == set(table["fingerprints"]) and len(fps) == table["space"]["distinct"]
    assert all(r["status"] == "untimed" for r in table["fingerprints"].values())


def _planted(table, values):
    planted = json.loads(json.dumps(table))
    for fp, value in values.items():
        planted["fingerprints"][fp] = {"status": "complete", "median_seconds": value}
    return planted


def test_replay_counts_trials_and_distinct_evaluations_to_the_target(run, table):
    fps = sorted(table["fingerprints"])
    # One planted best, and everything else at least 10% slower. The best is
    # the fingerprint the most combinations give, so that most replays reach
    # it within a short budget and both branches below are exercised.
    values = {fp: 1.0 + 0.1 + i * 0.01 for i, fp in enumerate(fps)}
    combos = collections.Counter(fp for _params, fp in run._params(table) if fp is not None)
    best = max(fps, key=lambda fp: (combos[fp], fp))
    values[best] = 1.0
    # A quarter of the space's distinct fingerprints: the replays' cost grows
    # faster than their length (TPE, the grid), and nothing below needs more.
    budget = len(fps) // 4
    result = run.replay_all(_planted(table, values), seeds=2, budget=budget, tolerance=0.03)
    assert result["space"]["within_tolerance"] == 1
    assert result["space"]["best"]["fingerprint"] == best
    assert set(result["samplers"]) == set(run.SAMPLERS)
    reached_any = False
    for name, data in result["samplers"].items():
        reached = 0
        for r in data["runs"]:
            trace, distinct = r["trace"], r["distinct_trace"]
            assert len(trace) == len(distinct) == budget
            got = [v for v in trace if v is not None]  # None until the first completes
            assert all(a >= b for a, b in itertools.pairwise(got)), name
            assert all(a <= b for a, b in itertools.pairwise(distinct)), name
            first = next((i for i, v in enumerate(trace) if v == 1.0), None)
            if first is None:
                assert r["trials_to_target"] is None
            else:
                reached += 1
                reached_any = True
                assert r["trials_to_target"] == first + 1
                assert r["distinct_to_target"] == distinct[first]
        assert data["summary"]["reached"] == reached
    assert reached_any  # the branch that counts trials to the target was checked


def test_refined_fingerprints_decide_the_best_and_the_targets(run, table):
    fps = sorted(table["fingerprints"])
    values = {fp: 2.0 for fp in fps}
    planted = _planted(table, values)
    # A fingerprint left out of the refinement cannot be the target even with
    # a lower first-pass value: the refined ones were measured alike.
    planted["fingerprints"][fps[0]]["median_seconds"] = 0.5
    for fp, value in zip(fps[1:4], (1.0, 1.02, 1.2), strict=True):
        planted["fingerprints"][fp].update(median_seconds=value, refined_times=[value])
    result = run.replay_all(planted, seeds=1, budget=5, tolerance=0.03)
    assert result["refine"]["count"] == 3
    assert result["space"]["best"]["fingerprint"] == fps[1]
    assert result["space"]["within_tolerance"] == 2


def test_refine_retimes_the_fastest_and_reuses_the_record(run, tmp_path, mesh24):
    workload = get_workload("mlp:tiny")
    ctx, _ = make_context(workload, None, mesh24, memory_budget=None, warmup=1, repeats=2)
    space = make_space(mesh24, ctx.abstract_args[0], ctx.budget)
    specs_of = {}
    for params in space.enumerate():
        specs, fp = _evaluate.resolve(space.suggest(optuna.trial.FixedTrial(params)), ctx)
        if specs is not None:
            specs_of.setdefault(fp, specs)
        if len(specs_of) == 4:
            break
    fps = sorted(specs_of)
    results = {fp: {"status": "complete", "median_seconds": float(i)}
               for i, fp in enumerate(fps)}
    results[fps[3]]["status"] = "cut"
    path = tmp_path / "w.refine.json"
    refined = run._refine(results, specs_of, ctx, path, count=2, rounds=3)
    assert set(refined) == set(fps[:2])
    assert all(len(t["times"]) == 3 and t["median"] > 0 for t in refined.values())
    compiles = ctx.compiles
    assert run._refine(results, specs_of, ctx, path, count=2, rounds=3) == refined
    assert ctx.compiles == compiles  # reused from the file, nothing re-timed
    assert not math.isnan(refined[fps[0]]["ci"][0])
