"""Isolated evaluation: one supervised worker per study, reused, replaced after a crash;
the in-process path on request; XLA's log lines caught per candidate."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_faults import segfaulting

import shardsearch as ss
from shardsearch.base.warnings import UnhandledPrimitiveWarning
from shardsearch.cli.render import results_table
from shardsearch.search import Outcome
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.execution.inprocess import InProcess
from shardsearch.search.execution.isolate import IsolationWarning
from shardsearch.search.setup import make_context
from shardsearch.search.space.baselines import baseline_candidates
from shardsearch.workloads import get_workload

FAST = dict(warmup=1, repeats=2)


def _evaluate_named(ctx, workload, mesh, names):
    out = {}
    for name in names:
        specs, fp = _evaluate.resolve(baseline_candidates(workload, mesh)[name], ctx)
        out[name] = (_evaluate.evaluate(specs, fp, ctx), ctx.executor.pid)
    return out


def test_one_worker_serves_every_candidate_and_compiles_what_this_process_would(mesh24):
    workload = get_workload("mlp:tiny")
    names = ("replicated", "dp", "fsdp")
    with make_context(workload, None, mesh24, isolate=True, **FAST)[0] as ctx:
        assert ctx.executor.transport == "export"
        isolated = _evaluate_named(ctx, workload, mesh24, names)
        assert ctx.executor.starts == 1 and ctx.compiles == 3
    assert ctx.executor.pid is None  # closed
    pids = {pid for _outcome, pid in isolated.values()}
    assert len(pids) == 1 and None not in pids
    here, _ = make_context(workload, None, mesh24, **FAST)
    assert isinstance(here.executor, InProcess)
    for name in names:
        outcome = isolated[name][0]
        assert outcome.status == "complete" and len(outcome.step_times) == 2
        specs, fp = _evaluate.resolve(baseline_candidates(workload, mesh24)[name], here)
        # The exported step compiles to the same program: same memory, flops, traffic.
        local = _evaluate.evaluate(specs, fp, here)
        assert (outcome.memory, outcome.flops, outcome.collective_bytes) == (
            local.memory, local.flops, local.collective_bytes)


def test_a_worker_that_crashes_is_replaced_and_the_next_candidate_runs(mesh24):
    workload = segfaulting()
    with make_context(workload, None, mesh24, isolate=True, **FAST)[0] as ctx:
        assert ctx.executor.transport == "workload"  # host callbacks cannot be exported
        seen = _evaluate_named(ctx, workload, mesh24, ("replicated", "default", "dp"))
        assert ctx.executor.starts == 2
    (ok, first), (crashed, gone), (again, second) = seen.values()
    assert ok.status == "complete" and again.status == "complete"
    assert crashed.status == "failed"
    assert crashed.reason == "worker killed by SIGSEGV while measuring"
    assert gone is None and None not in (first, second) and first != second


def test_isolate_false_compiles_in_this_process_and_the_default_does_not(mesh24, tmp_path,
                                                                          monkeypatch):
    compiled = []
    real = _evaluate.compile_step
    monkeypatch.setattr(_evaluate, "compile_step",
                        lambda specs, ctx: (compiled.append(1), real(specs, ctx))[1])
    kw = dict(mesh=mesh24, n_trials=3, objective="static", quiet=True)
    here = ss.optimize(get_workload("mlp:tiny"), storage=f"sqlite:///{tmp_path}/a.db",
                       isolate=False, **kw)
    assert len(compiled) == here.compiles >= 3
    compiled.clear()
    isolated = ss.optimize(get_workload("mlp:tiny"), storage=f"sqlite:///{tmp_path}/b.db",
                           **kw)
    assert compiled == [] and isolated.compiles >= 3
    assert [t.outcome.value for t in isolated.trials] == [t.outcome.value for t in here.trials]


def test_a_step_defined_here_travels_to_the_worker_as_an_export(mesh24, tmp_path):
    scale = 0.5  # a closure: nothing another process could import

    def step(state, batch):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((batch @ w) ** 2) * scale)(state)
        return state - 0.01 * grad, {"loss": loss}

    rng = np.random.default_rng(0)
    args = (rng.standard_normal((16, 8), np.float32), rng.standard_normal((32, 16), np.float32))
    ctx, _ = make_context(step, args, mesh24, isolate=True)
    assert ctx.executor.transport == "export"
    ctx.close()
    result = ss.optimize(step, args, mesh=mesh24, n_trials=4, storage=f"sqlite:///{tmp_path}/s.db",
                         isolate=True, confirm_rounds=6, quiet=True, **FAST)
    assert {t.outcome.status.value for t in result.trials} == {"complete"}
    assert result.outputs_match is True


def test_a_step_that_cannot_reach_a_worker_runs_here_or_is_refused(mesh24):
    def step(state, batch):  # a host callback in a closure: neither exported nor imported
        jax.debug.callback(lambda w: None, state)
        return state * 2, {"loss": jnp.sum(batch)}

    args = (np.ones((16, 8), np.float32), np.ones((32, 16), np.float32))
    with pytest.warns(IsolationWarning, match="evaluating candidates in this process, without "
                                              "a worker.*jax.export failed"):
        ctx, _ = make_context(step, args, mesh24, isolate=None)
    assert isinstance(ctx.executor, InProcess)
    with pytest.raises(ValueError, match=r"isolate=True, but the step cannot run in a worker "
                                         r"process: jax.export failed .*; make it exportable"):
        make_context(step, args, mesh24, isolate=True)


def gathering_step(state, batch):
    """A host callback on the state: XLA gathers a sharded state onto one device
    for it, and says so ("Involuntary full rematerialization")."""
    state = jax.pure_callback(lambda w: w, jax.ShapeDtypeStruct(state.shape, state.dtype), state)
    return state * 0.5, {"loss": jnp.sum(batch) + jnp.sum(state)}


GATHER_ARGS = (np.ones((16, 8), np.float32), np.ones((32, 16), np.float32))


@pytest.mark.parametrize("isolate", [False, True], ids=["here", "worker"])
def test_xla_log_lines_are_counted_per_candidate_and_kept_off_the_terminal(mesh24, capfd,
                                                                           isolate):
    specs = (P("dp", "tp"), P())
    quiet, _ = make_context(gathering_step, GATHER_ARGS, mesh24, isolate=isolate, **FAST)
    with quiet:
        assert isolate is False or quiet.executor.transport == "function"
        outcome = _evaluate.evaluate(specs, _evaluate.fingerprint(specs), quiet)
        clean = _evaluate.evaluate((P(), P()), _evaluate.fingerprint((P(), P())), quiet)
    assert outcome.status == "complete" and outcome.log_count >= 1
    assert "Involuntary full rematerialization" in outcome.log_first
    assert clean.log_count == 0 and clean.log_first == ""
    assert "rematerialization" not in capfd.readouterr().err
    with make_context(gathering_step, GATHER_ARGS, mesh24, isolate=isolate, verbose=True,
                      **FAST)[0] as loud:
        # Other specs: this process has the first ones compiled, and XLA would not talk.
        other = (P(("dp", "tp")), P())
        _evaluate.evaluate(other, _evaluate.fingerprint(other), loud)
    assert "Involuntary full rematerialization" in capfd.readouterr().err


def test_the_log_lines_reach_the_study_and_the_results_table(mesh24, tmp_path):
    # The host callback is a primitive the logical axes have no rule for: said once.
    with pytest.warns(UnhandledPrimitiveWarning, match="no coupling rule: pure_callback"):
        result = ss.optimize(gathering_step, GATHER_ARGS, mesh=mesh24, n_trials=2,
                             objective="static", storage=f"sqlite:///{tmp_path}/s.db",
                             isolate=False, quiet=True)
    default = next(t for t in result.trials if t.label == "default")
    stored = result.study.trials[default.number].user_attrs["outcome"]
    assert stored["log_count"] >= 1 and "rematerialization" in stored["log_first"]
    # Studies from before the fields existed still load.
    old = {k: v for k, v in stored.items() if k not in ("log_count", "log_first")}
    assert Outcome.from_json(old).log_count == 0
    config = ss.export_config(result, args=GATHER_ARGS)
    row = next(r for r in config["results"]["baselines"] if r["label"] == "default")
    assert row["log_lines"] == stored["log_count"]
    table = results_table(config)
    assert "XLA log lines while compiling and running:" in table
    assert f"  default: {row['log_lines']}, first: [SPMD] Involuntary full rematerialization" \
        in table


def test_a_workload_whose_name_rebuilds_another_step_is_refused(mesh24):
    impostor = dataclasses.replace(segfaulting(), name="test_faults:raising")
    ctx, _ = make_context(impostor, None, mesh24, isolate=True, **FAST)
    with pytest.raises(ValueError, match=r"the evaluation worker did not start: .*traces to "
                                         r"another program than the study's"):
        ctx.executor.start()



def test_tpu_chips_this_process_holds_are_not_handed_to_a_worker(monkeypatch):
    # libtpu lets one process open a host's chips (on a v5e the worker failed
    # with "... libtpu multi-process lockfile"): candidates stay in-process.
    import types
    import warnings

    from shardsearch.search.execution import isolate

    chip = types.SimpleNamespace(platform="tpu")
    ctx = types.SimpleNamespace(mesh=types.SimpleNamespace(devices=np.array([chip])))
    monkeypatch.setattr(isolate.jax, "devices", lambda *a: [chip])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no IsolationWarning: nothing is wrong
        assert isolate.Isolation.prepare(ctx, None, forced=False) is None
    with pytest.raises(ValueError, match="this process holds the TPU"):
        isolate.Isolation.prepare(ctx, None, forced=True)
