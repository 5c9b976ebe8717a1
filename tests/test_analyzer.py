"""ShardingAnalyzer: every problem found and named; memory that matches XLA's."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardsearch as ss

U = P.UNCONSTRAINED


def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


# --------------------------------------------------------------------------
# validate_partition_specs on the (2, 4) mesh: (shape, spec, expected messages)
# --------------------------------------------------------------------------

VALID = [
    ((16, 8), P("dp", "tp")),
    ((16, 8), P("tp", "dp")),
    ((16, 8), P(("dp", "tp"))),
    ((16, 8), P(("tp", "dp"), None)),
    ((16, 8), P(U, "tp")),
    ((16, 8), P(U, U)),
    ((16, 8), P(None, None)),
    ((16, 8), P()),
    ((7,), P()),
    ((), P()),
    ((0, 8), P("dp", "tp")),
    ((16, 8), None),
]


@pytest.mark.parametrize("shape, spec", VALID, ids=lambda x: str(x).replace(" ", ""))
def test_valid_specs(mesh24, shape, spec):
    analyzer = ss.ShardingAnalyzer(mesh24)
    assert analyzer.validate_partition_specs({"w": sds(shape)}, {"w": spec}) == []


INVALID = [
    ((16, 8), P("xx"), [r"^w: dim 0 uses axis 'xx', which is not in the mesh \('dp', 'tp'\)"]),
    ((16, 8), P("dp", "dp"), [r"^w: axis 'dp' is used twice in spec P\('dp', 'dp'\)"]),
    ((16, 8), P(("dp", "tp"), "tp"), [r"^w: axis 'tp' is used twice"]),
    ((16,), P("dp", "tp"),
     [r"^w: spec P\('dp', 'tp'\) has 2 entries but the leaf has rank 1 \(shape \(16,\)\)"]),
    ((), P("dp"), [r"^w: spec .* has 1 entries but the leaf has rank 0"]),
    ((6, 8), P("tp"),
     [r"^w: dim 0 has size 6, not divisible by mesh axis 'tp' of size 4; use a different axis"]),
    ((16, 6), P(None, "tp"), [r"^w: dim 1 has size 6, not divisible by mesh axis 'tp' of size 4"]),
    ((12, 8), P(("dp", "tp")),
     [r"^w: dim 0 has size 12, not divisible by mesh axes \('dp', 'tp'\) of size 8"]),
    ((6, 6), P("tp", "tp"), [
        r"^w: dim 0 has size 6, not divisible by mesh axis 'tp' of size 4",
        r"^w: axis 'tp' is used twice",
        r"^w: dim 1 has size 6, not divisible by mesh axis 'tp' of size 4"]),
    ((7,), P("qq", "dp"), [
        r"^w: spec P\('qq', 'dp'\) has 2 entries but the leaf has rank 1",
        r"^w: dim 0 uses axis 'qq', which is not in the mesh"]),
    ((16, 8), "dp", [r"^w: spec 'dp' is a str, not a PartitionSpec"]),
    ((16, 8), P(3), [r"^w: dim 0: spec entry 3 is not None, an axis name"]),
]


@pytest.mark.parametrize(
    "shape, spec, expected", INVALID, ids=lambda x: str(x).replace(" ", "")[:30])
def test_invalid_specs_name_path_dim_axis_and_sizes(mesh24, shape, spec, expected):
    problems = ss.ShardingAnalyzer(mesh24).validate_partition_specs(
        {"w": sds(shape)}, {"w": spec})
    assert len(problems) == len(expected), problems
    for message, pattern in zip(problems, expected, strict=True):
        assert re.search(pattern, message), (pattern, message)


def test_all_problems_in_a_tree_are_reported_with_their_paths(mesh24):
    tree = {"layers": [{"w": sds((6, 8)), "b": sds((8,))}, {"w": sds((16, 8)), "b": sds((8,))}],
            "head": sds((16,))}
    specs = {"layers": [{"w": P("tp"), "b": P("zz")}, {"w": P("dp", "tp"), "b": P()}],
             "head": P(None, "dp")}
    problems = ss.ShardingAnalyzer(mesh24).validate_partition_specs(tree, specs)
    assert [p.split(":")[0] for p in problems] == ["head", "layers/0/b", "layers/0/w"]


def test_root_leaf_is_named(mesh24):
    problems = ss.ShardingAnalyzer(mesh24).validate_partition_specs(sds((6,)), P("tp"))
    assert problems == [
        "<root>: dim 0 has size 6, not divisible by mesh axis 'tp' of size 4; use a different "
        "axis or pad the dim"]


def test_non_array_leaves_are_fine_replicated(mesh24):
    tree = {"name": "x", "n": 3, "none": None, "obj": object()}
    specs = {"name": P(), "n": P(), "none": None, "obj": P()}
    assert ss.ShardingAnalyzer(mesh24).validate_partition_specs(tree, specs) == []


def test_mismatched_structure_is_an_error(mesh24):
    with pytest.raises(ValueError, match="the spec tree does not match the array tree"):
        ss.ShardingAnalyzer(mesh24).validate_partition_specs(
            {"a": sds((8,)), "b": sds((8,))}, {"a": P()})


def test_analyzer_mesh_must_be_a_mesh():
    with pytest.raises(TypeError, match=r"mesh must be a jax\.sharding\.Mesh"):
        ss.ShardingAnalyzer("dp=2,tp=4")


def test_analyzer_without_mesh_uses_the_context_mesh(mesh24):
    analyzer = ss.ShardingAnalyzer()
    with jax.set_mesh(mesh24):
        assert analyzer.validate_partition_specs(sds((6,)), P("tp"))
        assert analyzer.estimate_memory_usage(sds((8,)), P("tp"))["size_per_device"] == 8
    with pytest.raises(RuntimeError, match="no mesh is set"):
        analyzer.validate_partition_specs(sds((8,)), P())


def test_abstract_mesh_analyzer():
    am = jax.sharding.AbstractMesh((8, 8), ("dp", "tp"))
    analyzer = ss.ShardingAnalyzer(am)
    assert analyzer.validate_partition_specs(sds((64, 128)), P("tp", "dp")) == []
    assert analyzer.validate_partition_specs(sds((60, 128)), P("tp", "dp")) == [
        "<root>: dim 0 has size 60, not divisible by mesh axis 'tp' of size 8; use a "
        "different axis or pad the dim"]
    est = analyzer.estimate_memory_usage({"w": sds((64, 128))}, {"w": P("tp", "dp")})
    assert est["total_size"] == 64 * 128 * 4
    assert est["size_per_device"] == 64 * 128 * 4 // 64


# --------------------------------------------------------------------------
# estimate_memory_usage
# --------------------------------------------------------------------------

# (shape, dtype, spec, bytes, bytes per device) on the (2, 4) mesh.
MEMORY = [
    ((8, 16), "float32", P("dp", "tp"), 512, 64),
    ((8, 16), "float32", P(), 512, 512),
    ((8, 16), "float32", None, 512, 512),
    ((8, 16), "bfloat16", P(None, "tp"), 256, 64),
    ((8, 16), "int8", P(("dp", "tp")), 128, 16),
    ((8, 16), "float32", P(U, "tp"), 512, 128),
    ((9,), "float32", P("tp"), 36, 12),
    ((), "float32", P(), 4, 4),
    ((0, 16), "float32", P("dp"), 0, 0),
]


@pytest.mark.parametrize(
    "shape, dtype, spec, nbytes, per_device", MEMORY, ids=lambda x: str(x).replace(" ", ""))
def test_memory_golden(mesh24, shape, dtype, spec, nbytes, per_device):
    est = ss.ShardingAnalyzer(mesh24).estimate_memory_usage({"x": sds(shape, dtype)}, {"x": spec})
    assert est["total_size"] == nbytes
    assert est["size_per_device"] == per_device
    leaf = est["leaves"]["x"]
    assert (leaf["shape"], leaf["dtype"], leaf["bytes"], leaf["bytes_per_device"]) == (
        shape, dtype, nbytes, per_device)


def test_memory_docstring_example_and_non_arrays(mesh24):
    tree = {"w": np.zeros((8, 16), np.float32), "name": "ignored", "n": 7, "none": None}
    specs = {"w": P("dp", "tp"), "name": P(), "n": P(), "none": None}
    est = ss.ShardingAnalyzer(mesh24).estimate_memory_usage(tree, specs)
    # A Python int is a 4-byte weakly typed scalar on device; strings hold nothing.
    assert est["total_size"] == 512 + 4
    assert est["size_per_device"] == 64 + 4
    assert set(est["leaves"]) == {"w", "n"}


def _placed_tree(mesh):
    """A tree with sharded, replicated, tuple-entry, uneven and scalar leaves."""
    names = tuple(mesh.axis_names)
    first, last = names[0], names[-1]
    arrays = {
        "w": np.ones((32, 16), np.float32),
        "emb": np.ones((64, 8), jnp.bfloat16),
        "pair": (np.ones((16,), np.int8), np.ones((4, 8), np.float32)),
        "odd": np.ones((7, 3), np.float32),
        "scalar": np.ones((), np.float32),
        "bias": np.ones((24,), np.float16),
    }
    specs = {
        "w": ss.AutoShardingRule(mesh).apply(arrays["w"]),
        "emb": P(names),
        "pair": (P(), P(None, last)),
        "odd": P(),
        "scalar": P(),
        "bias": P(first),
    }
    return arrays, specs


def test_memory_estimate_matches_xla(any_mesh):
    arrays, specs = _placed_tree(any_mesh)
    shardings = jax.tree.map(
        lambda s: NamedSharding(any_mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    placed = jax.device_put(arrays, shardings)
    compiled = jax.jit(lambda t: t).lower(placed).compile()
    est = ss.ShardingAnalyzer(any_mesh).estimate_memory_usage(arrays, specs)
    assert est["size_per_device"] == compiled.memory_analysis().argument_size_in_bytes
    assert est["total_size"] == sum(x.nbytes for x in jax.tree.leaves(arrays))
    for path, leaf in jax.tree_util.tree_leaves_with_path(placed):
        info = est["leaves"][jax.tree_util.keystr(path, simple=True, separator="/")]
        assert info["bytes"] == leaf.nbytes
        assert info["bytes_per_device"] == leaf.addressable_shards[0].data.nbytes
        assert info["bytes_per_device"] == math.prod(
            leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    # Something is sharded on every mesh, so the per-device figure is smaller.
    assert est["size_per_device"] < est["total_size"]
