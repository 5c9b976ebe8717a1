"""The hybrid objective: every candidate estimated, only the promising measured.

Also what every estimate now records (its breakdown), the hardware model's
memory as the static objective's default budget, and the topology (the axes
that cross hosts) reaching the estimate, in this process and in a worker.
"""

import contextlib
import io
import json
import math
import re

import pytest

import shardsearch as ss
from shardsearch.cli import main as _cli
from shardsearch.cost.chips import HARDWARE
from shardsearch.cost.hardware import HardwareModel
from shardsearch.cost.links import Link
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.evaluation.objectives import Hybrid, get_objective
from shardsearch.search.evaluation.stages import CUT, Stage
from shardsearch.search.evaluation.standing import Standing
from shardsearch.search.setup import make_context
from shardsearch.search.space.baselines import baseline_candidates
from shardsearch.search.study.record import TrialRecord, recorded_estimates
from shardsearch.workloads import get_workload

FAST = dict(warmup=1, repeats=3, confirm_rounds=6, quiet=True, space="rules", isolate=False)
# factor 1 and top 1: only a candidate whose estimate beats every earlier one is timed.
STRICT = Hybrid(factor=1.0, top_k=1)
# The legacy CPU model with links, so the axes that cross hosts cost more.
LINKS = HardwareModel("links", 5e10, 2e10, ici=Link(bandwidth=5e9, latency=1e-6),
                      dcn=Link(bandwidth=5e7, latency=1e-5))


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """A strict hybrid search on mlp:tiny in this process, every measurement watched."""
    storage = f"sqlite:///{tmp_path_factory.mktemp('hybrid') / 's.db'}"
    measured = []
    real = _evaluate.measure

    def measure(compiled, specs, ctx, report, base):
        measured.append(base["fingerprint"])
        return real(compiled, specs, ctx, report, base)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_evaluate, "measure", measure)
        result = ss.optimize(get_workload("mlp:tiny"), mesh=ss.create_mesh((2, 4), ("dp", "tp")),
                             n_trials=10, objective=STRICT, storage=storage, **FAST)
    return result, measured, storage


def test_hybrid_cuts_at_estimate_and_never_measures_what_it_cut(hybrid):
    result, measured, _ = hybrid
    cut = [t for t in result.trials if t.outcome.cut_stage == Stage.ESTIMATE]
    assert cut and result.summary()["cut_estimate"] == len(cut)
    for trial in cut:
        o = trial.outcome
        assert o.status == CUT and o.fingerprint not in measured and o.step_times == ()
        assert o.value is None and o.estimate > 0 and o.breakdown["total"] == o.estimate
        assert re.fullmatch(r"estimate [0-9.]+ [mu]?s is [0-9.]+x the best so far \([0-9.]+ "
                            r"[mu]?s\); hybrid measures within 1x or the best 1", o.reason)
        # The gate saw every estimate recorded before it, and one was smaller.
        earlier = [t.outcome.estimate for t in result.trials
                   if t.number < trial.number and t.outcome.estimate is not None]
        assert min(earlier) < o.estimate
    # Whatever was measured was estimated first.
    for trial in result.trials:
        if trial.outcome.step_times:
            assert trial.outcome.estimate is not None and trial.outcome.breakdown is not None


def test_hybrid_measures_every_baseline_and_confirms_as_measured(hybrid):
    result, measured, _ = hybrid
    baselines = [t for t in result.trials if t.label != "search"]
    assert {t.label for t in baselines} >= {"replicated", "default", "dp", "fsdp"}
    for trial in baselines:
        assert trial.outcome.status == "complete" and trial.outcome.step_times
        assert trial.outcome.fingerprint in measured
        assert trial.outcome.estimate is not None
    assert result.objective == "hybrid" and result.verdict in ("faster", "tie")
    assert result.best_time in {t.median for t in result.confirmation.values()}


def test_a_cut_trial_is_stored_at_stage_estimate_with_its_estimate(hybrid):
    result, _, _ = hybrid
    trials = {t.number: t for t in result.study.get_trials(deepcopy=False)}
    cut = next(t for t in result.trials if t.outcome.cut_stage == Stage.ESTIMATE)
    attrs = trials[cut.number].user_attrs
    # The "outcome" attribute keeps its form; the estimate and its parts sit beside it.
    assert attrs["outcome"]["cut_stage"] == 4 and "estimate" not in attrs["outcome"]
    assert attrs["estimate"] == cut.outcome.estimate
    assert attrs["breakdown"]["total"] == cut.outcome.estimate
    assert TrialRecord.from_trial(trials[cut.number]) == cut
    rows = ss.export_config(result)
    assert rows["results"]["trials"]["cut_estimate"] == result.summary()["cut_estimate"]
    assert rows["hardware"]["model"] == HARDWARE["cpu"].name
    assert all("estimate_seconds" in row for row in rows["results"]["baselines"])


def test_a_resumed_hybrid_study_compares_with_the_estimates_it_recorded(hybrid, monkeypatch):
    result, _, storage = hybrid
    before = recorded_estimates(result.study.get_trials(deepcopy=False))
    assert len(before) >= 6
    seen = []
    real = Hybrid.gate

    def gate(self, estimate, recorded):
        seen.append(tuple(recorded))
        return real(self, estimate, recorded)

    monkeypatch.setattr(Hybrid, "gate", gate)
    again = ss.optimize(get_workload("mlp:tiny"), mesh=ss.create_mesh((2, 4), ("dp", "tp")),
                        n_trials=2, objective=STRICT, storage=storage,
                        study_name=result.study.study_name, **FAST)
    assert seen and seen[0] == before  # the first new trial sees every earlier estimate
    assert len(again.trials) == len(result.trials) + 2


def test_the_gate_measures_within_the_factor_or_the_top_k():
    gate = Hybrid(factor=1.5, top_k=2).gate
    assert gate(1.0, ()) is None  # nothing recorded: measure
    assert gate(1.5, (1.0, 1.1, 1.2)) is None  # within 1.5x
    assert gate(1.6, (1.0, 1.7)) is None  # the second smallest: in the top 2
    assert gate(5.0, (1.0, 1.2)) == ("estimate 5 s is 5.0x the best so far (1 s); hybrid "
                                     "measures within 1.5x or the best 2")
    assert Hybrid(factor=1.0, top_k=0).gate(2e-5, (1e-5,)).startswith(
        "estimate 20 us is 2.0x the best so far (10 us)")
    assert get_objective("hybrid") == Hybrid()
    assert get_objective(Hybrid(factor=3.0)).factor == 3.0  # other settings, same objective
    for bad, match in (({"factor": 0.9}, "factor=0.9; give a finite number >= 1"),
                       ({"factor": math.inf}, "factor=inf"),
                       ({"top_k": -1}, "top_k=-1; give a whole number >= 0"),
                       ({"top_k": 1.5}, "top_k=1.5")):
        with pytest.raises(ValueError, match=re.escape(match)):
            Hybrid(**bad)


# --------------------------------------------------------------------------- static


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    """A static search on mlp:tiny and its exported plan."""
    folder = tmp_path_factory.mktemp("static")
    result = ss.optimize(get_workload("mlp:tiny"), mesh=ss.create_mesh((2, 4), ("dp", "tp")),
                         n_trials=4, objective="static", storage=f"sqlite:///{folder / 's.db'}",
                         **FAST)
    return result, result.export(folder / "plan.json")


def test_a_static_trials_breakdown_adds_up_to_its_recorded_value(static):
    result, _ = static
    stored = [t for t in result.study.get_trials(deepcopy=False)
              if t.user_attrs["outcome"]["status"] == "complete"]
    assert stored
    for trial in stored:
        parts = trial.user_attrs["breakdown"]
        assert math.isclose(parts["total"], trial.value)
        assert math.isclose(trial.user_attrs["estimate"], trial.value)
        assert math.isclose(math.fsum(c["seconds"] for c in parts["collectives"]),
                            parts["communication"])
        assert math.isclose(max(parts["compute"], parts["memory"]) + parts["communication"]
                            - parts["hidden"], trial.value)
    assert any(trial.user_attrs["breakdown"]["collectives"] for trial in stored)


def test_show_prints_the_breakdown_of_a_static_plan(static, capsys):
    _result, path = static
    plan = json.loads(path.read_text())
    winner = plan["results"]["winner"]
    assert math.isclose(winner["breakdown"]["total"], winner["median_seconds"])
    assert ss.load_plan(path).results["winner"]["breakdown"] == winner["breakdown"]
    assert _cli.main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"estimated as {HARDWARE['cpu'].name}" in out
    assert f"estimate of the exported plan ({HARDWARE['cpu'].name}):" in out
    assert re.search(r"^  total [0-9.]+ [mu]?s = (compute|memory) ", out, re.MULTILINE)
    assert re.search(r"^  compute [0-9.]+ [mu]?s, memory [0-9.]+ [mu]?s$", out, re.MULTILINE)
    if any(winner["breakdown"]["collectives"]):
        assert re.search(r"^  [a-z-]+ over [a-z,]+: ", out, re.MULTILINE)


class CollectiveCount(HardwareModel):
    """A model from outside that overrides `estimate(program)` only."""

    def estimate(self, program):
        return float(len(program.collectives.collectives))


def test_a_model_that_overrides_estimate_gives_its_number_and_no_breakdown(mesh24):
    ctx, _ = make_context(get_workload("mlp:tiny"), None, mesh24, objective="static",
                          hardware=CollectiveCount("count", 1.0, 1.0, 1.0))
    specs, fp = _evaluate.resolve(baseline_candidates(None, mesh24)["default"], ctx)
    outcome = _evaluate.evaluate(specs, fp, ctx)
    assert outcome.status == "complete" and outcome.value == outcome.estimate
    assert outcome.breakdown is None


def test_a_hardware_models_memory_is_the_static_default_budget(mesh24, tmp_path):
    workload = get_workload("mlp:tiny")
    args = workload.abstract()
    replicated = baseline_candidates(None, mesh24)["replicated"].specs(args)
    need = ss.ShardingAnalyzer(mesh24).estimate_memory_usage(tuple(args), replicated)
    small = HardwareModel("small", 5e10, 2e10, 5e9, memory_bytes=need["size_per_device"] // 2)
    ctx, _ = make_context(workload, None, mesh24, objective="static", hardware=small)
    assert ctx.budget == small.memory_bytes
    # A budget given wins; an objective that runs the step keeps the devices' memory.
    assert make_context(workload, None, mesh24, objective="static", hardware=small,
                        memory_budget="1GiB")[0].budget == 1 << 30
    assert make_context(workload, None, mesh24, objective="measured",
                        hardware=small)[0].budget is None
    assert make_context(workload, None, mesh24, objective="static",
                        hardware=HARDWARE["tpu-v5e"])[0].budget == 16 << 30
    result = ss.optimize(workload, mesh=mesh24, n_trials=4, objective="static",
                         hardware=small, storage=f"sqlite:///{tmp_path / 's.db'}", **FAST)
    first = result.trials[0]
    assert first.label == "replicated" and first.outcome.status == CUT
    assert first.outcome.cut_stage in (Stage.CHECK, Stage.COMPILE)
    assert "over the budget" in first.outcome.reason
    assert result.budget == small.memory_bytes
    assert ss.export_config(result)["hardware"]["model"] == "small"


# --------------------------------------------------------------------------- topology


def test_axes_across_hosts_cost_more_and_reach_the_worker(mesh24):
    workload = get_workload("mlp:tiny")
    dp = baseline_candidates(workload, mesh24)["dp"]

    def estimate(**options):
        ctx, _ = make_context(workload, None, mesh24, hardware=LINKS, **options)
        with ctx:
            specs, fp = _evaluate.resolve(dp, ctx)
            report = None if ctx.objective.name == "static" else (lambda i, s: False)
            return _evaluate.evaluate(specs, fp, ctx, report), ctx

    inside, ctx = estimate(objective="static")
    across, ctx = estimate(objective="static", dcn_axes=("dp",))
    assert ctx.topology().dcn_axes == ("dp",)
    assert across.estimate > inside.estimate
    # dp puts the batch on every axis: its gradients' all-reduce spans dp (across hosts).
    assert [(c["kind"], c["axes"]) for c in across.breakdown["collectives"]] == [
        ("all-reduce", ["dp", "tp"])]
    # In a worker process: the same estimate (the axes travelled), and the
    # study's recorded estimates travel with each job.
    ctx, _ = make_context(workload, None, mesh24, objective=STRICT, hardware=LINKS,
                          dcn_axes=("dp",), isolate=True)
    with ctx:
        specs, fp = _evaluate.resolve(dp, ctx)
        cut = _evaluate.evaluate(specs, fp, ctx, lambda i, s: False,
                                 standing=Standing((across.estimate / 10,)))
        assert cut.cut_stage == Stage.ESTIMATE and cut.estimate == across.estimate
        timed = _evaluate.evaluate(specs, fp, ctx, lambda i, s: False,
                                   standing=Standing((across.estimate,)))
        assert timed.status == "complete" and timed.step_times
        assert timed.estimate == across.estimate and ctx.executor.pid is not None


def test_bad_dcn_axes_are_refused(mesh24):
    with pytest.raises(ValueError, match=re.escape(
            "dcn_axes=('pp',): ['pp'] are not axes of the mesh ('dp', 'tp')")):
        make_context(get_workload("mlp:tiny"), None, mesh24, objective="static",
                     dcn_axes=("pp",))
    with pytest.raises(ValueError, match="give a sequence of mesh axis names"):
        make_context(get_workload("mlp:tiny"), None, mesh24, objective="static",
                     dcn_axes="dp")


# --------------------------------------------------------------------------- command line


def _refused(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        assert _cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("extra", "message"), [
    (["--objective", "static", "--hardware", "nope"],
     "--hardware nope: neither a built-in model (cpu, gpu, tpu, tpu-v5e"),
    (["--objective", "static", "--hardware", "bad.json"],
     "bad.json: field 'memory_bandwidth' must be a positive number"),
    (["--hardware", "tpu-v5e"], "objective 'measured' estimates nothing"),
    (["--objective", "static", "--dcn-axes", "pp"],
     "--dcn-axes pp: 'pp' is not an axis of --mesh dp=2,tp=4 (axes: dp, tp)"),
    (["--objective", "static", "--dcn-axes", "dp,,tp"], "not a list of axis names"),
    (["--hybrid-top-k", "2"], "--hybrid-top-k set the hybrid objective; add --objective hybrid"),
    (["--objective", "hybrid", "--hybrid-factor", "0.5"], "must be at least 1"),
])
def test_bad_hardware_axes_and_hybrid_options_are_one_line(extra, message, tmp_path,
                                                            monkeypatch, capsys):
    model = HARDWARE["cpu"].to_json() | {"memory_bandwidth": -1}
    (tmp_path / "bad.json").write_text(json.dumps(model))
    err = _refused(["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", *extra],
                   tmp_path, monkeypatch, capsys)
    assert message in err
