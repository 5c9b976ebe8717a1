"""optimize(): the search loop, its three cuts, the cache, resume, confirmation."""

import functools
import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optuna
import pytest

import shardsearch as ss
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.evaluation.stages import Stage
from shardsearch.search.finish import CONFIRM_WITHIN
from shardsearch.workloads import get_workload

FAST = dict(warmup=1, repeats=4, confirm_rounds=6, quiet=True)


def _storage(tmp_path):
    return f"sqlite:///{tmp_path / 'studies.db'}"


@pytest.fixture
def spy(monkeypatch):
    """Records, per fingerprint, how often the search compiled and measured it."""
    seen = {"compiled": [], "measured": []}
    real_evaluate, real_compile, real_measure = (
        _evaluate.evaluate, _evaluate.compile_step, _evaluate.measure)
    inside = {"evaluate": None}

    def evaluate(specs, fp, ctx, report=None, **options):
        inside["evaluate"] = fp
        try:
            return real_evaluate(specs, fp, ctx, report, **options)
        finally:
            inside["evaluate"] = None

    def compile_step(specs, ctx):
        if inside["evaluate"] is not None:
            seen["compiled"].append(inside["evaluate"])
        return real_compile(specs, ctx)

    def measure(compiled, specs, ctx, report, base):
        seen["measured"].append(base["fingerprint"])
        return real_measure(compiled, specs, ctx, report, base)

    monkeypatch.setattr(_evaluate, "evaluate", evaluate)
    monkeypatch.setattr(_evaluate, "compile_step", compile_step)
    monkeypatch.setattr(_evaluate, "measure", measure)
    # The spies watch this process: evaluate here, not in a worker.
    monkeypatch.setattr(ss, "optimize", functools.partial(ss.optimize, isolate=False))
    return seen


@pytest.mark.parametrize("name", ["mlp:tiny", "gpt:tiny"])
def test_optimize_beats_or_matches_every_baseline(name, mesh24, tmp_path, spy):
    # 8 trials: the 7 baselines (logical_megatron a cache hit of megatron) and
    # one searched candidate, enough for every claim below.
    result = ss.optimize(get_workload(name), mesh=mesh24, n_trials=8,
                         storage=_storage(tmp_path), **FAST)
    labels = [t.label for t in result.trials]
    assert labels[:2] == ["replicated", "default"]
    assert "search" in labels and any(t.outcome.cache_hit for t in result.trials)
    assert {"dp", "fsdp"} <= set(result.baselines)
    # The best baseline, and every baseline within CONFIRM_WITHIN of the best
    # search time, is re-timed with the finalists.
    fp_of = {t.label if t.label != "search" else f"trial {t.number}": t.outcome.fingerprint
             for t in reversed(result.trials)}
    retimed = {fp_of[label]: t.median for label, t in result.confirmation.items()}
    best_baseline = min(result.baselines, key=result.baselines.get)
    best_value = min(t.outcome.value for t in result.trials if t.outcome.value is not None)
    must = {best_baseline} | {label for label, v in result.baselines.items()
                              if v <= best_value * CONFIRM_WITHIN}
    assert {fp_of[label] for label in must} <= set(retimed)
    # The winner is the fastest of the re-timing, or a baseline that a faster
    # median did not beat significantly.
    # With the knobs it sets (no knob is searched: an expert plan's act_batch).
    win_fp = _evaluate.fingerprint(result.best_specs, tuple(result.best_knobs.items()))
    assert result.best_time == retimed[win_fp]
    assert (result.best_time == min(retimed.values())
            or win_fp in {fp_of[label] for label in result.baselines})
    assert result.verdict in ("faster", "tie")
    assert result.outputs_match is True
    # A fingerprint is never compiled twice by the search.
    assert len(spy["compiled"]) == len(set(spy["compiled"]))
    hits = [t for t in result.trials if t.outcome.cache_hit]
    assert all(t.outcome.compile_seconds == 0.0 for t in hits)
    # The winning specs are valid and come from its rules.
    analyzer = ss.ShardingAnalyzer(mesh24)
    args = get_workload(name).abstract()
    assert analyzer.validate_partition_specs(tuple(args), result.best_specs) == []
    assert result.best_rule.apply(args[0]) == result.best_specs[0]


def test_over_budget_candidates_are_cut_before_running(mesh24, tmp_path, spy):
    workload = get_workload("mlp:tiny")
    args = workload.abstract()
    replicated = ss.ShardingAnalyzer(mesh24).estimate_memory_usage(
        args, jax.tree.map(lambda _: jax.sharding.PartitionSpec(), args))["size_per_device"]
    budget = replicated // 2
    result = ss.optimize(workload, mesh=mesh24, n_trials=10, memory_budget=budget,
                         storage=_storage(tmp_path), **FAST)
    cut = [t.outcome for t in result.trials
           if t.outcome.status == "cut" and t.outcome.cut_stage in (Stage.CHECK, Stage.COMPILE)]
    assert {o.cut_stage for o in cut} == {Stage.CHECK, Stage.COMPILE}
    for outcome in cut:
        assert "over the budget" in outcome.reason
        assert outcome.step_times == ()
        assert outcome.fingerprint not in spy["measured"]
    by_label = {t.label: t.outcome for t in result.trials}
    assert by_label["replicated"].cut_stage is Stage.CHECK
    xla_totals = [t.outcome.memory["total"] for t in result.trials
                  if t.outcome.status == "complete"]
    assert xla_totals and max(xla_totals) <= budget


def test_compile_error_is_recorded_and_the_study_goes_on(mesh24, tmp_path, monkeypatch):
    real = _evaluate.compile_step
    calls = {"n": 0}

    def flaky(specs, ctx):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("XLA says no")
        return real(specs, ctx)

    monkeypatch.setattr(_evaluate, "compile_step", flaky)
    result = ss.optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=5,
                         storage=_storage(tmp_path), isolate=False, **FAST)
    failed = [t for t in result.trials if t.outcome.status == "failed"]
    assert len(failed) == 1
    assert "RuntimeError: XLA says no" in failed[0].outcome.reason
    assert len(result.trials) == 5
    states = [t.state.name for t in result.study.trials]
    assert states.count("FAIL") == 1


def test_resumed_study_keeps_finished_trials(mesh24, tmp_path):
    workload = get_workload("mlp:tiny")
    kw = dict(mesh=mesh24, storage=_storage(tmp_path), study_name="resume-me", isolate=False,
              **{**FAST, "confirm_rounds": 0})
    first = ss.optimize(workload, n_trials=3, **kw)
    second = ss.optimize(workload, n_trials=2, **kw)
    assert len(second.study.trials) == 5
    assert [t.number for t in second.trials[:3]] == [t.number for t in first.trials]
    # Baselines already evaluated are not enqueued again.
    labels = [t.label for t in second.trials]
    assert labels.count("replicated") == 1 and labels.count("default") == 1


def test_bad_arguments_fail_before_any_trial(mesh24, tmp_path):
    workload = get_workload("mlp:tiny")
    state, _batch = workload.init(0)
    storage = _storage(tmp_path)
    with pytest.raises(ValueError, match="objective='fast'; choose one of"):
        ss.optimize(workload, mesh=mesh24, objective="fast", storage=storage)
    with pytest.raises(ValueError, match="below the smallest possible footprint"):
        ss.optimize(workload, mesh=mesh24, memory_budget=64, storage=storage)
    with pytest.raises(ValueError, match="needs a concrete Mesh"):
        ss.optimize(workload, mesh=ss.abstract_mesh((2, 4), ("dp", "tp")), storage=storage)
    with pytest.raises(ValueError, match="cannot be traced"):
        ss.optimize(workload.step, (state, {"x": np.zeros((3, 5), np.float32)}),
                    mesh=mesh24, storage=storage)
    with pytest.raises(ValueError, match="must be concrete arrays"):
        ss.optimize(workload.step, workload.abstract(), mesh=mesh24, storage=storage)
    # (In this process: a worker would start only to be stopped again;
    # tests/test_bad_input.py's storage-dir case covers that path.)
    with pytest.raises(ValueError, match="cannot open storage"):
        ss.optimize(workload, mesh=mesh24, storage="sqlite:////nonexistent-dir/x/s.db",
                    isolate=False)


def test_static_objective_needs_no_concrete_arguments(mesh24, tmp_path, spy):
    workload = get_workload("gpt:tiny")
    result = ss.optimize(workload.step, workload.abstract(), mesh=mesh24, n_trials=6,
                         objective="static", storage=_storage(tmp_path), quiet=True)
    assert spy["measured"] == []
    assert result.verdict == "unconfirmed"
    complete = [t.outcome for t in result.trials if t.outcome.status == "complete"]
    assert complete and all(o.value > 0 and o.flops > 0 for o in complete)
    # The search samples with Optuna's TPE and says so in the study.
    assert isinstance(result.study.sampler, optuna.samplers.TPESampler)
    assert result.study.user_attrs["sampler"] == "TPESampler()"


@pytest.mark.slow
def test_static_objective_plans_llama_7b_on_64_devices(tmp_path):
    """The real-size model end to end: searched, estimated, exported, loaded back."""
    script = textwrap.dedent(f"""
        import json, math
        import shardsearch as ss
        ss.use_cpu_devices(64)
        import jax
        from jax.sharding import PartitionSpec as P
        from shardsearch.rules.base import argument_specs
        from shardsearch.workloads import get_workload
        mesh = ss.create_mesh((8, 8), ("dp", "tp"))
        workload = get_workload("llama:7b")
        r = ss.optimize(workload, mesh=mesh, n_trials=2, objective="static",
                        storage="sqlite:///{tmp_path}/s.db", quiet=True, warm_start=True)
        r.export("{tmp_path}/plan.json")
        plan = ss.load_plan("{tmp_path}/plan.json")

        def texts(specs):
            return [str(s) for s in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))]

        state, _batch = workload.abstract()
        big_replicated = [
            str(s) for x, s in zip(jax.tree.leaves(state),
                                   jax.tree.leaves(r.best_specs[0],
                                                   is_leaf=lambda x: isinstance(x, P)))
            if math.prod(x.shape) >= 1 << 20 and all(e is None for e in s)]
        print("OK " + json.dumps({{
            "labels": [t.label for t in r.trials],
            "status": [t.outcome.status.value for t in r.trials],
            "memory": {{t.label: t.outcome.memory.get("total") for t in r.trials}},
            "estimate": {{t.label: t.outcome.value for t in r.trials}},
            "best": r.best_label, "best_time": r.best_time,
            "big_replicated": big_replicated,
            "reloaded_same": texts(plan.apply(workload.abstract())) == texts(r.best_specs),
            "rules_same": texts(argument_specs(plan.rule, plan.batch_rule,
                                               workload.abstract())) == texts(r.best_specs),
        }}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("OK"))[3:])
    # Two trials: the replicated reference and the default rule, a sharded plan.
    assert facts["labels"] == ["replicated", "default"], facts
    assert facts["status"] == ["complete", "complete"], facts
    # The sharded plan wins by its estimate, holds an eighth of the replicated
    # footprint or less (64 devices), and splits every leaf of a million
    # elements or more.
    assert facts["best"] == "default"
    assert 0 < facts["best_time"] == facts["estimate"]["default"] < facts["estimate"]["replicated"]
    assert facts["memory"]["default"] * 8 < facts["memory"]["replicated"], facts["memory"]
    assert facts["big_replicated"] == [], facts["big_replicated"]
    # The exported plan, loaded back, gives the specs the search evaluated:
    # those it recorded, and its rules applied afresh.
    assert facts["reloaded_same"] is True
    assert facts["rules_same"] is True


def test_long_studies_release_jax_caches(mesh24, tmp_path, monkeypatch):
    cleared = []
    monkeypatch.setattr(_evaluate, "CLEAR_CACHES_EVERY", 2)
    real = jax.clear_caches
    monkeypatch.setattr(jax, "clear_caches", lambda: (cleared.append(1), real()))
    result = ss.optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=5,
                         storage=_storage(tmp_path), isolate=False, **FAST)
    assert len(cleared) == result.compiles // 2 >= 2
    assert result.outputs_match is True


def test_an_estimate_must_beat_the_best_baseline_by_the_margin_to_replace_it():
    """With nothing re-timed, a searched plan or a knob variant lower by less
    than 1% is no win: the published v5e row took microbatches=2 for 0.002%."""
    from types import SimpleNamespace

    from shardsearch.search.finish import ESTIMATE_MARGIN, estimated_winner

    def record(label, value):
        return SimpleNamespace(label=label, outcome=SimpleNamespace(value=value))

    base = record("fsdp_tp", 7.952524)
    variant = record("fsdp_tp~microbatches=2", 7.952338)
    assert estimated_winner(variant, base) is base
    clear = record("search", 7.952524 * (1 - ESTIMATE_MARGIN) * 0.999)
    assert estimated_winner(clear, base) is clear
    assert estimated_winner(record("search", 7.9 * (1 - ESTIMATE_MARGIN / 2)),
                            record("dp", 7.9)).label == "dp"
    assert estimated_winner(variant, None) is variant  # no baseline fits: the best there is
    assert estimated_winner(base, base) is base


def test_of_estimates_within_the_margin_the_least_communication_wins():
    """The published v5p 32B row: 8 microbatches and 4 at one estimate, the
    8 moving 4.60 s of collectives and the 4 2.75 s; the 4 is the safer plan."""
    from types import SimpleNamespace

    from shardsearch.search.finish import least_communication

    def record(value, comm, total=1):
        return SimpleNamespace(outcome=SimpleNamespace(
            value=value, breakdown=None if comm is None else {"communication": comm},
            memory={"total": total}))

    eight, four = record(5.300, 4.60), record(5.301, 2.75)
    assert least_communication([eight, four]) is four
    # Equal communication: the smaller footprint, then the order given.
    small = record(5.302, 2.75, total=0)
    assert least_communication([eight, four, small]) is small
    assert least_communication([four, record(5.31, 2.75)]) is four
    # Measured values carry no breakdown: the best stays.
    measured = record(5.3, None)
    assert least_communication([measured, four]) is measured


def test_pick_winner_keeps_the_baseline_unless_the_search_is_significantly_faster():
    from shardsearch.search.finish import pick_winner

    drift = np.linspace(0, 0.05, 12)  # the machine's drift hits every finalist alike
    base = list(1.0 + drift)
    # A lower median, but it loses almost half the paired rounds: not significant.
    lucky = list(1.0 + drift + np.array([-0.03, 0.02] * 6))
    clear = list(0.8 + drift)
    slow = list(1.5 + drift)
    assert np.median(lucky) < np.median(base)
    assert pick_winner([("search", lucky, False), ("fsdp", base, True),
                        ("other", slow, False)]) == ("fsdp", "tie")
    assert pick_winner([("search", clear, False), ("fsdp", base, True)]) == ("search", "faster")
    # Without a baseline among the finalists, the fastest median wins as before.
    assert pick_winner([("a", lucky, False), ("b", base, False)]) == ("a", "tie")
    # A baseline that is fastest wins whatever the searched plans do.
    assert pick_winner([("fsdp", clear, True), ("search", base, False)]) == ("fsdp", "faster")


def test_pick_winner_splits_the_level_among_the_searched_finalists():
    from scipy import stats

    from shardsearch.search.finish import pick_winner

    base = [1.0] * 12
    # Faster in 9 of 12 paired rounds: p = 0.032, significant alone, not as
    # the best of two searched plans (0.05 / 2).
    step = np.arange(1, 13) / 100
    edge = list(1.0 - step * np.where(np.isin(np.arange(12), (0, 1, 11)), -1, 1))
    assert 0.025 < stats.wilcoxon(np.subtract(edge, base), alternative="less").pvalue < 0.05
    other = [1.01] * 12
    assert pick_winner([("s1", edge, False), ("fsdp", base, True)])[0] == "s1"
    assert pick_winner([("s1", edge, False), ("s2", other, False),
                        ("fsdp", base, True)])[0] == "fsdp"


def test_pick_winner_takes_the_smallest_of_the_baselines_that_tie():
    from shardsearch.search.finish import pick_winner

    drift = np.linspace(0, 0.05, 12)
    base = list(1.0 + drift)
    lucky = list(1.0 + drift + np.array([-0.03, 0.02] * 6))  # lower median, not significant
    clear = list(0.8 + drift)
    # dp's lower median is luck: fsdp ties with it and needs a quarter of the memory.
    assert pick_winner([("dp", lucky, True, 400), ("fsdp", base, True, 100)]) == ("fsdp", "tie")
    # A baseline that is significantly faster keeps its place whatever it needs.
    assert pick_winner([("dp", clear, True, 400), ("fsdp", base, True, 100)]) == (
        "dp", "faster")
    # Equal or unknown memory: the fastest median, as without memory.
    assert pick_winner([("dp", lucky, True, 100), ("fsdp", base, True, 100)])[0] == "dp"
    assert pick_winner([("dp", lucky, True, None), ("fsdp", base, True, None)])[0] == "dp"
    assert pick_winner([("dp", lucky, True, 400), ("fsdp", base, True, None)])[0] == "dp"
    # A searched plan that ties is never the one picked for its memory.
    assert pick_winner([("search", lucky, False, 1), ("dp", base, True, 400)])[0] == "dp"


def test_the_paired_tests_p_value_is_scipys_with_ties_and_zeros():
    # With ties or zeros among 13 or fewer rounds SciPy enumerates the sign
    # flips one call at a time (2 s at 12 rounds); ours enumerates them at
    # once and must give the same p-value. Rounds of up to 10 keep SciPy quick.
    from scipy import stats

    from shardsearch.search.evaluation.confirm import _signed_rank_p_less

    rng = np.random.default_rng(0)
    cases = [np.array([-0.03, 0.02] * 3), np.array([0.0, -1.0, -1.0, 2.0, -3.0, 0.0, -2.0])]
    cases += [rng.integers(-3, 4, size=int(n)) * 0.01 for n in rng.integers(6, 11, size=30)]
    checked = 0
    for diffs in cases:
        if not np.any(diffs):
            continue
        expected = stats.wilcoxon(diffs, alternative="less").pvalue
        assert _signed_rank_p_less(diffs) == pytest.approx(expected, rel=1e-12), diffs
        checked += 1
    assert checked >= 25


def test_a_baseline_slower_in_every_round_does_not_tie_for_its_memory():
    # Three rounds: the paired test can never call one plan slower, but a plan
    # slower in every round than the fastest is not the same speed (seen: the
    # NNX example's 3-round confirmation picked a derived plan 28% behind dp
    # because it needed less memory).
    from shardsearch.search.finish import pick_winner

    dp = [12.4, 11.5, 13.2]
    derived = [15.9, 13.7, 19.3]
    assert pick_winner([("dp", dp, True, 400), ("logical_megatron", derived, True, 100)])[0] \
        == "dp"
    overlapping = [13.0, 11.9, 12.8]
    assert pick_winner([("dp", dp, True, 400), ("fsdp", overlapping, True, 100)])[0] == "fsdp"


def test_the_plan_picked_for_its_memory_ties_with_every_faster_tied_plan():
    # Seen under CI in the NNX example: replicated was fastest with a wide
    # 3-round interval that overlapped both dp's and fsdp's, so both "tied"
    # with it, and fsdp won for its memory though every round of it was slower
    # than every round of dp (13.9 ms against 9.1 ms).
    from shardsearch.search.finish import pick_winner

    replicated = [8.1, 12.0, 8.6]
    dp = [9.1, 8.6, 9.7]
    fsdp = [13.9, 11.5, 15.0]
    finalists = [("replicated", replicated, True, 900), ("dp", dp, True, 400),
                 ("fsdp", fsdp, True, 100)]
    assert pick_winner(finalists)[0] == "dp"
    # Where fsdp is as fast as dp too, its memory wins again.
    finalists[2] = ("fsdp", [9.4, 8.9, 9.9], True, 100)
    assert pick_winner(finalists)[0] == "fsdp"
