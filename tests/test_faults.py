"""Faulty candidates: a study survives steps that raise, crash, hang or give NaN.

Each workload here is fine while its weight `w` is whole on every device
(the replicated and data-parallel plans) and faulty once a device holds only
a shard of it (the default rule and fsdp): a host callback sees the device's
shard (`jax.debug.callback(..., partitioned=True)`), and a
`custom_partitioning` op sees the sharding XLA chose. The factories are
module-level so a worker process rebuilds them by name ("test_faults:hanging")
— host callbacks cannot travel as a `jax.export` program.
"""

import ctypes
import time

import jax
import jax.numpy as jnp
import numpy as np
import optuna
import pytest
from jax.experimental.custom_partitioning import custom_partitioning

import shardsearch as ss
from shardsearch.cli import main as _cli
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.setup import make_context
from shardsearch.search.space.baselines import baseline_candidates
from shardsearch.workloads import Workload

SHAPE = (16, 8)  # w; the batch x is (32, 16)
# No re-timing at the end: the finalists are the fine plans, which the search
# already ran; the winner's outputs are still compared with replicated's.
FAST = dict(n_trials=4, warmup=1, repeats=3, confirm_rounds=0, quiet=True)
FINE = {"replicated", "dp"}  # w whole on every device
FAULTY = {"default", "fsdp"}  # w split


def _workload(name, watch=None, poison=None):
    def step(state, batch):
        w = state["w"]
        if watch is not None:
            jax.debug.callback(watch, w, partitioned=True)
        if poison is not None:
            w = poison(w)
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((batch["x"] @ w) ** 2))(w)
        return {"w": state["w"] - 0.01 * grad}, {"loss": loss}

    def init(seed):
        rng = np.random.default_rng(seed)
        return ({"w": rng.standard_normal(SHAPE, np.float32)},
                {"x": rng.standard_normal((32, 16), np.float32)})

    def abstract():
        return ({"w": jax.ShapeDtypeStruct(SHAPE, jnp.float32)},
                {"x": jax.ShapeDtypeStruct((32, 16), jnp.float32)})

    return Workload(name, step, init, abstract, 0.0, SHAPE[0] * SHAPE[1])


def _raise_on_a_shard(w):
    if w.shape != SHAPE:
        raise ValueError(f"refusing a shard of shape {w.shape}")


def _segfault_on_a_shard(w):
    if w.shape != SHAPE:
        ctypes.string_at(0)  # reads address 0: SIGSEGV


def _hang_on_a_shard(w):
    if w.shape != SHAPE:
        time.sleep(600)


@custom_partitioning
def _nan_when_split(w):
    return w


def _keep(mesh, arg_shapes, result_shape):
    return arg_shapes[0].sharding


def _partition(mesh, arg_shapes, result_shape):
    sharding = arg_shapes[0].sharding
    split = any(axis is not None for axis in sharding.spec)
    return mesh, (lambda w: w * jnp.nan) if split else (lambda w: w), sharding, (sharding,)


_nan_when_split.def_partition(infer_sharding_from_operands=_keep, partition=_partition,
                              sharding_rule="i j -> i j")


@custom_partitioning
def _crash_compiling_when_split(w):
    return w


def _partition_or_crash(mesh, arg_shapes, result_shape):
    sharding = arg_shapes[0].sharding
    if any(axis is not None for axis in sharding.spec):
        ctypes.string_at(0)  # XLA's partitioner calls this while compiling
    return mesh, lambda w: w, sharding, (sharding,)


_crash_compiling_when_split.def_partition(
    infer_sharding_from_operands=_keep, partition=_partition_or_crash,
    sharding_rule="i j -> i j")


def raising():
    return _workload("test_faults:raising", watch=_raise_on_a_shard)


def segfaulting():
    return _workload("test_faults:segfaulting", watch=_segfault_on_a_shard)


def hanging():
    return _workload("test_faults:hanging", watch=_hang_on_a_shard)


def nan_when_split():
    return _workload("test_faults:nan_when_split", poison=_nan_when_split)


def crashing_compiler():
    return _workload("test_faults:crashing_compiler", poison=_crash_compiling_when_split)


def always_nan():
    return _workload("test_faults:always_nan", poison=lambda w: w * jnp.nan)


def _search(workload, tmp_path, **kw):
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    return ss.optimize(workload, mesh=mesh, storage=f"sqlite:///{tmp_path}/s.db",
                       isolate=True, **{**FAST, **kw})


def _check(result, reason):
    """The faulty baselines failed for `reason`, the others completed, one won."""
    by_label = {t.label: t.outcome for t in result.trials}
    assert set(by_label) == FINE | FAULTY
    for label in FAULTY:
        assert by_label[label].status == "failed", by_label[label]
        assert reason(by_label[label].reason), by_label[label].reason
    for label in FINE:
        assert by_label[label].status == "complete", by_label[label]
    assert result.best_label in FINE
    assert result.best_specs[0] == {"w": jax.sharding.PartitionSpec()}
    assert result.outputs_match is True
    states = {t.number: t.state.name for t in result.study.trials}
    assert "RUNNING" not in states.values()
    assert sorted(s for s in states.values() if s == "FAIL") == ["FAIL", "FAIL"]


def test_a_step_that_raises_on_some_shardings_fails_only_those(tmp_path):
    result = _search(raising(), tmp_path)
    _check(result, lambda r: r.startswith("step raised while measuring: ")
           and "ValueError: refusing a shard of shape" in r)


def test_a_step_that_segfaults_on_some_shardings_fails_only_those(tmp_path):
    result = _search(segfaulting(), tmp_path)
    _check(result, lambda r: r == "worker killed by SIGSEGV while measuring")


def test_a_step_that_hangs_on_some_shardings_fails_only_those(tmp_path):
    # Each hanging candidate costs the timeout: short, yet far above the
    # milliseconds a step of the fine plans takes.
    result = _search(hanging(), tmp_path, execute_timeout=3)
    _check(result, lambda r: r == "no step finished within 3 s")


def test_a_step_that_gives_nan_on_some_shardings_fails_only_those(tmp_path):
    result = _search(nan_when_split(), tmp_path)
    _check(result, lambda r: r.startswith("non-finite loss: metrics['loss'] is nan after 1 "
                                          "warm-up step(s)"))


def test_a_compile_that_segfaults_fails_only_its_candidate(mesh24):
    workload = crashing_compiler()
    ctx, _ = make_context(workload, None, mesh24, isolate=True, warmup=1, repeats=2)
    with ctx:
        outcomes = {}
        for name in ("default", "replicated"):
            specs, fp = _evaluate.resolve(baseline_candidates(workload, mesh24)[name], ctx)
            outcomes[name] = _evaluate.evaluate(specs, fp, ctx)
    assert outcomes["default"].status == "failed"
    assert outcomes["default"].reason == "worker killed by SIGSEGV while compiling"
    assert outcomes["replicated"].status == "complete"


def test_nan_under_the_replicated_plan_stops_before_the_search(tmp_path, monkeypatch, capsys):
    storage = f"sqlite:///{tmp_path}/s.db"
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    message = (r"the step gives non-finite values under the replicated plan \(metrics\['loss'\]"
               r" is nan after 1 step\(s\)\), so the step itself is broken, not a sharding")
    for isolate in (False, True):
        with pytest.raises(ValueError, match=message):
            ss.optimize(always_nan(), mesh=mesh, storage=storage, isolate=isolate,
                        **FAST)
    # Nothing was written: no study to resume, nothing to export.
    assert optuna.study.get_all_study_names(storage) == []
    monkeypatch.chdir(tmp_path)
    code = _cli.main(["optimize", "--workload", "test_faults:always_nan", "--mesh", "dp=2,tp=4",
                      "--trials", "3", "--quiet", "--storage", storage, "--no-compile-cache"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("shardsearch optimize: error: optimize: the step gives non-finite "
                          "values under the replicated plan (metrics['loss'] is nan")
