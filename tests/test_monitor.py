"""The monitored step and the barrier.

Timing numbers are not asserted; a fake clock and counting wrappers show what
is timed, what is compiled and what is validated.
"""

import ast
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base import monitor as _monitor

METRIC_KEYS = {"execution_time", "compile_time", "memory_usage", "validation_issues"}


class FakeClock:
    """A clock that moves only when the fakes below say so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Pending:
    """A result whose `block_until_ready` takes 5 fake seconds."""

    def __init__(self, value, clock):
        self.value, self.clock = value, clock

    def block_until_ready(self):
        self.clock.now += 5
        return self


class CountingJit:
    """A jitted function: lowering is counted; compiling takes 100 fake seconds,
    dispatch 1 and waiting for the result 5 (when a clock is given)."""

    def __init__(self, fn, clock=None):
        self.jitted = jax.jit(fn)
        self.clock = clock
        self.lowered = 0

    def __call__(self, *args):
        return self.jitted(*args)

    def lower(self, *args):
        self.lowered += 1
        lowered = self.jitted.lower(*args)
        if self.clock is None:
            return lowered
        clock = self.clock

        def compile_():
            clock.now += 100
            compiled = lowered.compile()

            def call(*a):
                clock.now += 1
                return Pending(compiled(*a), clock)

            return call

        return types.SimpleNamespace(compile=compile_)


def _spy_validation(monkeypatch, analyzer):
    calls = []
    real = analyzer.validate_partition_specs

    def spy(tree, specs):
        calls.append(jax.tree.map(np.shape, tree))
        return real(tree, specs)

    monkeypatch.setattr(analyzer, "validate_partition_specs", spy)
    return calls


def test_result_and_metrics(mesh24):
    x = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    monitored = ss.create_monitored_function(
        lambda a: a * 2 + 1, P("dp", "tp"), ss.ShardingAnalyzer(mesh24))
    result, metrics = monitored(x)
    assert set(metrics) == METRIC_KEYS
    np.testing.assert_array_equal(np.asarray(result), x * 2 + 1)
    assert metrics["validation_issues"] == []
    assert metrics["memory_usage"]["total_size"] == 512
    assert metrics["memory_usage"]["size_per_device"] == 64
    assert metrics["execution_time"] >= 0
    assert metrics["compile_time"] > 0
    # The arguments were placed with the specs: an identity-like step keeps them.
    assert result.sharding.spec == P("dp", "tp")
    _, again = monitored(x)
    assert again["compile_time"] == 0.0


def test_several_arguments(mesh24):
    x = np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 100
    w = np.arange(8 * 12, dtype=np.float32).reshape(8, 12) / 100
    monitored = ss.create_monitored_function(
        jnp.matmul, (P("dp"), P(None, "tp")), ss.ShardingAnalyzer(mesh24))
    result, metrics = monitored(x, w)
    np.testing.assert_allclose(np.asarray(result), x @ w, rtol=1e-5)
    assert metrics["memory_usage"]["size_per_device"] == 16 * 8 * 4 // 2 + 8 * 12 * 4 // 4


def test_pytree_argument_and_none_spec(mesh24):
    state = {"w": np.ones((16, 8), np.float32), "b": np.ones((8,), np.float32)}
    monitored = ss.create_monitored_function(
        lambda s: jax.tree.map(lambda a: a.sum(), s), {"w": P("dp", "tp"), "b": None},
        ss.ShardingAnalyzer(mesh24))
    result, metrics = monitored(state)
    assert float(result["w"]) == 128 and float(result["b"]) == 8
    assert metrics["validation_issues"] == []


def test_execution_time_blocks_and_excludes_compilation(monkeypatch, mesh24):
    clock = FakeClock()
    monkeypatch.setattr(
        _monitor, "time", types.SimpleNamespace(perf_counter=clock, monotonic=clock, time=clock))
    step = CountingJit(lambda a: a + 1, clock)
    monitored = ss.create_monitored_function(step, P("dp"), ss.ShardingAnalyzer(mesh24))
    result, first = monitored(np.zeros((8, 4), np.float32))
    # Compiling (100) is not execution; waiting for the result (5) is.
    assert first["compile_time"] == 100
    assert first["execution_time"] == 6
    np.testing.assert_array_equal(np.asarray(result.value), np.ones((8, 4)))
    _, second = monitored(np.zeros((8, 4), np.float32))
    assert second["compile_time"] == 0.0
    assert second["execution_time"] == 6
    assert step.lowered == 1


def test_compiles_once_per_signature(mesh24):
    step = CountingJit(lambda a: a * 3)
    monitored = ss.create_monitored_function(step, P("dp", "tp"), ss.ShardingAnalyzer(mesh24))
    compile_times = [monitored(np.ones((16, 8), np.float32))[1]["compile_time"] for _ in range(3)]
    assert step.lowered == 1
    assert compile_times[0] > 0 and compile_times[1:] == [0.0, 0.0]
    result, metrics = monitored(np.ones((32, 8), np.float32))
    assert step.lowered == 2 and metrics["compile_time"] > 0
    np.testing.assert_array_equal(np.asarray(result), np.full((32, 8), 3.0))
    monitored(np.ones((32, 8), np.int32))  # a new dtype is a new signature too
    assert step.lowered == 3


def test_validates_once_per_signature(monkeypatch, mesh24):
    analyzer = ss.ShardingAnalyzer(mesh24)
    calls = _spy_validation(monkeypatch, analyzer)
    monitored = ss.create_monitored_function(lambda a: a - 1, P("dp", "tp"), analyzer)
    for _ in range(3):
        _, metrics = monitored(np.ones((16, 8), np.float32))
        assert metrics["validation_issues"] == []
    assert len(calls) == 1
    monitored(np.ones((32, 8), np.float32))
    assert len(calls) == 2
    assert calls[1] == ((32, 8),)


def test_problems_warn_once_and_the_call_still_runs(monkeypatch, mesh24):
    analyzer = ss.ShardingAnalyzer(mesh24)
    calls = _spy_validation(monkeypatch, analyzer)
    monitored = ss.create_monitored_function(lambda a: a * 2, P("tp"), analyzer)
    x = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    with pytest.warns(ss.ShardingWarning, match=(
            r"(?s)1 sharding problem\(s\).*0: dim 0 has size 6, not divisible by mesh axis 'tp' "
            "of size 4")):
        result, metrics = monitored(x)
    np.testing.assert_array_equal(np.asarray(result), x * 2)
    assert len(metrics["validation_issues"]) == 1
    assert "not divisible" in metrics["validation_issues"][0]
    assert metrics["memory_usage"] == {}
    # Same signature: no second warning (warnings are errors here) and no re-check.
    result, metrics = monitored(x)
    np.testing.assert_array_equal(np.asarray(result), x * 2)
    assert len(metrics["validation_issues"]) == 1
    assert len(calls) == 1


def test_context_mesh_analyzer(mesh24):
    monitored = ss.create_monitored_function(lambda a: a + 1, P("dp"), ss.ShardingAnalyzer())
    with jax.set_mesh(mesh24):
        result, metrics = monitored(np.zeros((8,), np.float32))
    np.testing.assert_array_equal(np.asarray(result), np.ones(8))
    assert metrics["memory_usage"]["size_per_device"] == 16


def test_abstract_mesh_cannot_run_a_step():
    analyzer = ss.ShardingAnalyzer(ss.abstract_mesh((2, 4), ("dp", "tp")))
    monitored = ss.create_monitored_function(lambda a: a, P("dp"), analyzer)
    with pytest.raises(TypeError, match="the analyzer's mesh is abstract"):
        monitored(np.zeros((8,), np.float32))


def test_mismatched_spec_tree_is_an_error(mesh24):
    monitored = ss.create_monitored_function(
        lambda a, b: a, (P(), P(), P()), ss.ShardingAnalyzer(mesh24))
    with pytest.raises(ValueError, match="the spec tree does not match"):
        monitored(np.zeros(8), np.zeros(8))


def test_wrapped_function_is_reachable(mesh24):
    def step(a):
        return a

    assert ss.create_monitored_function(step, P(), ss.ShardingAnalyzer(mesh24)).__wrapped__ is step


# --------------------------------------------------------------------------
# barrier_sync
# --------------------------------------------------------------------------

def test_barrier_returns_at_once_in_one_process():
    assert jax.process_count() == 1
    assert ss.barrier_sync() is None
    assert ss.barrier_sync(timeout=0.01) is None


def test_barrier_names_are_unique():
    first, second = next(_monitor._barrier_ids), next(_monitor._barrier_ids)
    ss.barrier_sync()
    assert next(_monitor._barrier_ids) == second + 2 and first != second


@pytest.mark.parametrize("timeout", [0, -5, True, "10", None], ids=repr)
def test_barrier_timeout_must_be_positive(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        ss.barrier_sync(timeout=timeout)


def test_barrier_uses_public_api_only():
    source = Path(_monitor.__file__).read_text()
    assert "jax._src" not in source
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names]
    assert not [m for m in imported if m and "_src" in m.split(".")]
