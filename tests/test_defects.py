"""The eight known defects of the original design (docs/semantics.md): one test each.

Each test passes on shardsearch and would fail on the design the defect
describes.
"""

import ast
import subprocess
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from child_env import child_env
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base import monitor as _monitor

U = P.UNCONSTRAINED


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, np.float32)


_HASH_SCRIPT = r'''
import jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np
import shardsearch as ss
sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)
tree = [sds(64, 64, 64, 64, 64, 64), sds(4, 4, 4), sds(256)]
for mesh in (ss.abstract_mesh((2,) * 6, ("u", "v", "w", "x", "y", "z")),
             ss.create_mesh((2, 2, 2), ("fsdp", "sp", "tp"))):
    print(repr(ss.AutoShardingRule(mesh).apply(tree)))
    print(repr(ss.AutoShardingRule(mesh, reverse=True).apply(tree)))
    print(repr(ss.MemoryConstrainedShardingRule(1, mesh=mesh).apply(tree)))
'''


def test_defect_1_specs_do_not_depend_on_the_hash_seed():
    """Defect 1: iterating a set of axis names made specs depend on PYTHONHASHSEED.

    With six equal-size axes, set order would differ between most seeds.
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HASH_SCRIPT], env=child_env(PYTHONHASHSEED=str(seed)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for seed in (0, 1, 2, 3)]
    outputs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        outputs.append(stdout)
    assert len(set(outputs)) == 1
    # Axis order is the mesh's, not a hash order.
    assert outputs[0].splitlines()[0] == (
        "[P('u', 'v', 'w', 'x', 'y', 'z'), P('u', 'v', 'w'), P('u',)]")


def test_defect_2_default_min_shard_size_is_the_device_count(mesh24):
    """Defect 2: `np.prod(mesh.shape)` on the axis-size mapping is not the device
    count; the default `min_shard_size` must be 2 * 4 = 8 on a (2, 4) mesh."""
    rule = ss.AutoShardingRule(mesh24)
    # 4 and 6 elements are divisible by mesh axes but below 8 elements: replicated.
    assert rule.apply([sds(4), sds(6), sds(7), sds(2, 3)]) == [P(), P(), P(), P()]
    assert rule.apply([sds(8), sds(2, 4)]) == [P("dp"), P(None, "dp")]
    big = ss.AutoShardingRule(ss.abstract_mesh((4, 4), ("dp", "tp")))
    assert big.apply([sds(12), sds(16)]) == [P(), P("dp")]


def test_defect_3_memory_estimate_is_per_device_and_total(mesh24):
    """Defect 3: the estimate divided the sharded sum by the device count again
    and called the per-device figure "total"."""
    tree = {"w": sds(1024, 1024), "b": sds(1024)}
    specs = {"w": P("dp", "tp"), "b": P()}
    est = ss.ShardingAnalyzer(mesh24).estimate_memory_usage(tree, specs)
    assert est["total_size"] == 4 * 1024 * 1024 + 4 * 1024
    # The weight is split 8 ways; the replicated bias is held in full.
    assert est["size_per_device"] == 4 * 1024 * 1024 // 8 + 4 * 1024
    assert est["size_per_device"] != (4 * 1024 * 1024 // 8 + 4 * 1024) // 8


def test_defect_4_tuple_entries_and_unconstrained_validate():
    """Defect 4: tuple spec entries and `P.UNCONSTRAINED` crashed validation."""
    mesh = ss.create_mesh((2, 2, 2), ("fsdp", "sp", "tp"))
    analyzer = ss.ShardingAnalyzer(mesh)
    tree = {"a": sds(16, 8), "b": sds(16, 8), "c": sds(16, 8), "d": sds(6, 8)}
    specs = {"a": P(("fsdp", "sp"), "tp"), "b": P(U, "tp"), "c": P(("fsdp", "sp"), U),
             "d": P(("fsdp", "sp"), U)}
    assert analyzer.validate_partition_specs(tree, specs) == [
        "d: dim 0 has size 6, not divisible by mesh axes ('fsdp', 'sp') of size 4; use a "
        "different axis or pad the dim"]
    est = analyzer.estimate_memory_usage(tree, specs)
    assert [est["leaves"][k]["bytes_per_device"] for k in "abc"] == [64, 256, 128]


class Fixed(ss.ShardingRule):
    """A user's rule that gives every leaf the same spec, spelled as given."""

    kind = "fixed"

    def __init__(self, spec):
        self.spec = spec

    def apply(self, pytree):
        return jax.tree.map(lambda _: self.spec, pytree)

    def to_config(self):
        return {"kind": self.kind}


@pytest.mark.parametrize("spec", [
    P(None), P(None, None), P(None, None, None), P(U, U), P(None, U), P(U)], ids=str)
def test_defect_5_specs_that_shard_nothing_fall_through(mesh24, spec):
    """Defect 5: `P(None, None)` counted as sharded, so a composite never fell back.

    "Shards nothing" is recognised whatever the spec's length or spelling.
    """
    shape = (16, 8, 4)[: max(len(spec), 1)]
    auto = ss.AutoShardingRule(mesh24)
    got = ss.CompositeShardingRule(Fixed(spec), auto).apply(sds(*shape))
    assert got == auto.apply(sds(*shape)) != P()
    # Built-in rules fall through the same way.
    nothing = ss.ShapeBasedShardingRule({(None,) * len(shape): spec})
    assert ss.CompositeShardingRule(nothing, auto).apply(sds(*shape)) == got
    # And when nothing shards at all, the leaf is replicated (canonically).
    assert ss.CompositeShardingRule(Fixed(spec)).apply(sds(*shape)) == P()


def test_defect_6_size_one_axes_do_not_use_up_a_dim():
    """Defect 6: size-1 axes divide every dim and were handed out, using up the
    dim the useful axis should get.

    Mesh (1, 8) named ('a', 'b'), leaf [8, 16]: dims are visited 16 first; 'a'
    (size 1) would take it and push 'b' onto the 8, giving P('b', 'a').
    """
    mesh = ss.create_mesh((1, 8), ("a", "b"))
    assert ss.AutoShardingRule(mesh).apply(sds(8, 16)) == P(None, "b")
    assert ss.AutoShardingRule(mesh, axis_names=("a", "b")).apply(sds(8, 16)) == P(None, "b")
    assert ss.MemoryConstrainedShardingRule(1, mesh=mesh).apply(sds(8, 16)) == P(None, "b")


def test_defect_7_monitor_blocks_compiles_apart_and_validates_once(monkeypatch, mesh24):
    """Defect 7: the wrapper timed asynchronous dispatch, folded compilation into
    the first call, and re-validated on every call."""
    clock = types.SimpleNamespace(now=0.0)
    now = lambda: clock.now  # noqa: E731
    monkeypatch.setattr(_monitor, "time", types.SimpleNamespace(perf_counter=now, monotonic=now))

    class Result:
        def block_until_ready(self):
            clock.now += 5  # waiting for the device
            return self

    class Step:
        lowered = 0

        def lower(self, *args):
            Step.lowered += 1
            clock.now += 100  # compiling
            return types.SimpleNamespace(compile=lambda: lambda *a: Result())

    analyzer = ss.ShardingAnalyzer(mesh24)
    validations = []
    real = analyzer.validate_partition_specs
    monkeypatch.setattr(analyzer, "validate_partition_specs",
                        lambda *a: validations.append(1) or real(*a))
    monitored = ss.create_monitored_function(Step(), P("dp"), analyzer)
    metrics = [monitored(np.zeros((8, 8), np.float32))[1] for _ in range(3)]
    assert [m["compile_time"] for m in metrics] == [100, 0.0, 0.0]
    assert [m["execution_time"] for m in metrics] == [5, 5, 5]
    assert Step.lowered == 1
    assert len(validations) == 1


def test_defect_8_barrier_uses_public_api_only():
    """Defect 8: the barrier reached into private `jax._src` modules."""
    tree = ast.parse(Path(_monitor.__file__).read_text())
    modules = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names]
    assert "jax" in modules
    assert not [m for m in modules if m and "_src" in m.split(".")]
    assert "jax._src" not in Path(_monitor.__file__).read_text()
    assert ss.barrier_sync(timeout=1) is None
