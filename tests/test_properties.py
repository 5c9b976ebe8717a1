"""Properties on random shapes, dtypes and meshes of up to three axes (Hypothesis).

- every built-in rule gives specs the analyzer accepts (the batch rule: exactly
  when its axes divide the batch dims, as it documents);
- a plan file round-trips exactly: written, loaded and written again, the same
  rules, specs and bytes;
- fingerprints (of spec trees, of leaves) do not depend on dict insertion order;
- the analyzer's bytes per device are XLA's `argument_size_in_bytes`.

Only the last compiles (on the 8 simulated devices, tiny shapes, few
examples); the rest work on abstract meshes. Every test is derandomized, so a
run tests the same examples everywhere.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base import mesh as _mesh
from shardsearch.base import spec as _spec
from shardsearch.base.tree import leaf_specs
from shardsearch.plan.reader import leaf_info, leaves_hash
from shardsearch.rules.base import argument_specs
from shardsearch.search import plan_config
from shardsearch.search.evaluation.outcome import fingerprint

# Same examples on every run and machine; nothing saved between runs.
FAST = settings(derandomize=True, deadline=None, database=None, max_examples=100)
COMPILING = settings(derandomize=True, deadline=None, database=None, max_examples=15)

AXES = ("dp", "tp", "fsdp", "sp")
KEYS = ("w", "b", "embed", "head", "norm", "wq", "wo", "scale")
DIMS = (1, 2, 3, 4, 6, 8, 12, 16, 24)
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int8, jnp.int32, jnp.uint8, jnp.bool_)


# --------------------------------------------------------------------------- strategies


@st.composite
def meshes(draw, max_size: int = 4):
    """An AbstractMesh of 1-3 axes, each of size 1..max_size."""
    n = draw(st.integers(1, 3))
    names = draw(st.permutations(AXES))[:n]
    dims = tuple(draw(st.integers(1, max_size)) for _ in range(n))
    return ss.abstract_mesh(dims, names)


@st.composite
def arrays(draw, min_rank: int = 0, dims=DIMS):
    rank = draw(st.integers(min_rank, 3))
    shape = tuple(draw(st.sampled_from(dims)) for _ in range(rank))
    return jax.ShapeDtypeStruct(shape, draw(st.sampled_from(DTYPES)))


@st.composite
def trees(draw, min_rank: int = 0, dims=DIMS, max_leaves: int = 5):
    """A dict of arrays, some of them one level down (like params/opt state)."""
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=max_leaves, unique=True))
    tree = {k: draw(arrays(min_rank, dims)) for k in keys}
    if len(keys) > 2 and draw(st.booleans()):
        tree = {"params": dict(list(tree.items())[1:]), keys[0]: tree[keys[0]]}
    return tree


@st.composite
def dividing_spec(draw, shape, sizes):
    """A spec for `shape` whose every entry divides its dim, each axis used once."""
    free = [a for a in sizes]
    entries = []
    for dim in shape:
        options = [None] + [a for a in free if dim % sizes[a] == 0]
        pairs = [(a, b) for a in free for b in free
                 if a != b and dim % (sizes[a] * sizes[b]) == 0]
        entry = draw(st.sampled_from(options + pairs))
        for axis in _spec.entry_axes(entry):
            free.remove(axis)
        entries.append(entry)
    return _spec.canonical(P(*entries))


@st.composite
def axis_names(draw, mesh):
    """None, or some of the mesh's axes in some order, the first two maybe grouped."""
    if draw(st.booleans()):
        return None
    names = draw(st.permutations(mesh.axis_names))
    names = names[:draw(st.integers(1, len(names)))]
    if len(names) > 1 and draw(st.booleans()):
        return ((names[0], names[1]), *names[2:])
    return tuple(names)


@st.composite
def state_rules(draw, mesh, tree, kinds=("auto", "memory", "path", "shape", "composite")):
    """A built-in rule bound to `mesh`; path and shape specs made to fit `tree`."""
    kind = draw(st.sampled_from(kinds))
    sizes = _mesh.axis_sizes(mesh)
    leaves = [(leaf["path"], tuple(leaf["shape"])) for leaf in leaf_info(tree)]
    if kind == "auto":
        return ss.AutoShardingRule(mesh, axis_names=draw(axis_names(mesh)),
                                   min_shard_size=draw(st.none() | st.integers(1, 64)),
                                   reverse=draw(st.booleans()))
    if kind == "memory":
        return ss.MemoryConstrainedShardingRule(draw(st.integers(1, 4096)), mesh,
                                                axis_names=draw(axis_names(mesh)))
    if kind == "path":
        chosen = draw(st.lists(st.sampled_from(leaves), max_size=3, unique=True))
        return ss.PathShardingRule(
            [(re.escape(path) + "$", draw(dividing_spec(shape, sizes)))
             for path, shape in chosen], mesh=mesh)
    if kind == "shape":
        patterns = []
        for _path, shape in draw(st.lists(st.sampled_from(leaves), max_size=3, unique=True)):
            spec = draw(dividing_spec(shape, sizes))
            # A dim the spec leaves alone may match any size.
            pattern = tuple(None if i >= len(spec) or spec[i] is None else d
                            for i, d in enumerate(shape))
            if (pattern, spec) not in patterns:
                patterns.append((pattern, spec))
        return ss.ShapeBasedShardingRule(patterns)
    parts = draw(st.lists(st.sampled_from(kinds[:-1]), min_size=1, max_size=3))
    return ss.CompositeShardingRule(*(draw(state_rules(mesh, tree, (p,))) for p in parts))


@st.composite
def batch_rules(draw, mesh):
    names = draw(st.permutations(mesh.axis_names))
    return ss.BatchShardingRule(tuple(names[:draw(st.integers(0, len(names)))]))


@st.composite
def problems(draw):
    """(mesh, (state, batch), state rule, batch rule)."""
    mesh = draw(meshes())
    state = draw(trees())
    batch = draw(trees(min_rank=1, max_leaves=2))
    return mesh, (state, batch), draw(state_rules(mesh, state)), draw(batch_rules(mesh))


def _reordered(tree):
    """The same tree with every dict's insertion order reversed."""
    if isinstance(tree, dict):
        return {k: _reordered(tree[k]) for k in reversed(list(tree))}
    return tree


def _flat_specs(tree):
    return [(path, _spec.canonical(s)) for path, s in leaf_specs(tree)]


# --------------------------------------------------------------------------- properties


@FAST
@given(problems())
def test_every_builtin_rule_gives_specs_the_analyzer_accepts(problem):
    mesh, (state, batch), rule, batch_rule = problem
    analyzer = ss.ShardingAnalyzer(mesh)
    assert analyzer.validate_partition_specs(state, rule.apply(state)) == []
    # The batch rule gives its spec even where it does not divide, so that the
    # analyzer (not a silent replica) reports it: exactly those leaves.
    sizes = _mesh.axis_sizes(mesh)
    group = math.prod(sizes[a] for a in batch_rule.axes)
    uneven = [leaf["path"] for leaf in leaf_info(batch) if leaf["shape"][0] % group]
    reported = analyzer.validate_partition_specs(batch, batch_rule.apply(batch))
    assert len(reported) == len(uneven)
    assert all(any(r.startswith(f"{path}: dim 0 ") for r in reported) for path in uneven)


@FAST
@given(problems())
def test_plan_files_round_trip_exactly(problem):
    mesh, args, rule, batch_rule = problem
    specs = argument_specs(rule, batch_rule, args)
    config = plan_config(rule, batch_rule, mesh, args=args)
    with tempfile.TemporaryDirectory() as folder:
        path = ss.write_config(config, Path(folder) / "plan.json")
        text = path.read_text(encoding="utf-8")
        plan = ss.load_plan(path)
        assert json.loads(text) == json.loads(json.dumps(config))
        assert plan.rule.to_config() == rule.to_config()
        assert plan.batch_rule.to_config() == batch_rule.to_config()
        assert plan.recorded_mesh == tuple(_mesh.axis_sizes(mesh).items())
        assert plan.mismatch(args) is None
        assert [_flat_specs(t) for t in plan.apply(args)] == [_flat_specs(t) for t in specs]
        # Written again from what was read: the same bytes.
        again = plan_config(plan.rule, plan.batch_rule, plan.mesh, args=args)
        assert ss.write_config(again, Path(folder) / "again.json").read_text(
            encoding="utf-8") == text


@FAST
@given(problems())
def test_fingerprints_ignore_dict_insertion_order(problem):
    mesh, (state, batch), rule, batch_rule = problem
    args, shuffled = (state, batch), (_reordered(state), _reordered(batch))
    specs = argument_specs(rule, batch_rule, args)
    assert fingerprint(specs) == fingerprint(argument_specs(rule, batch_rule, shuffled))
    assert fingerprint(specs) == fingerprint(tuple(_reordered(t) for t in specs))
    assert leaves_hash([leaf_info(t) for t in args]) == \
        leaves_hash([leaf_info(t) for t in shuffled])
    assert plan_config(rule, batch_rule, mesh, args=args) == \
        plan_config(rule, batch_rule, mesh, args=shuffled)


# Concrete meshes on the 8 simulated devices (a smaller one uses the first devices).
DEVICE_MESHES = (((8,), ("x",)), ((2, 4), ("dp", "tp")), ((4, 2), ("tp", "dp")),
                 ((2, 2, 2), ("a", "b", "c")), ((1, 8), ("a", "b")), ((2,), ("dp",)),
                 ((2, 2), ("dp", "tp")), ((4, 1, 2), ("x", "y", "z")))


@COMPILING
@given(st.data())
def test_analyzer_bytes_per_device_are_xlas(data):
    dims, names = data.draw(st.sampled_from(DEVICE_MESHES))
    mesh = ss.create_mesh(dims, names, jax.devices()[:math.prod(dims)])
    tree = data.draw(trees(dims=(1, 2, 3, 4, 6, 8), max_leaves=3))
    sizes = _mesh.axis_sizes(mesh)
    specs = {k: (data.draw(dividing_spec(v.shape, sizes)) if not isinstance(v, dict) else
                 {kk: data.draw(dividing_spec(vv.shape, sizes)) for kk, vv in v.items()})
             for k, v in tree.items()}
    placed = jax.tree.map(
        lambda leaf, spec: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                sharding=NamedSharding(mesh, spec)),
        tree, specs, is_leaf=lambda s: isinstance(s, P))
    compiled = jax.jit(lambda t: t).lower(placed).compile()
    estimate = ss.ShardingAnalyzer(mesh).estimate_memory_usage(tree, specs)
    assert estimate["size_per_device"] == compiled.memory_analysis().argument_size_in_bytes
