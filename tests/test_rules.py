"""The sharding rules: golden tables, a brute-force reference, any pytree, errors.

Expected specs in the tables are worked out by hand from the documented
semantics (docs/semantics.md and the rules' docstrings), not by running the code.
Specs come out canonical: `P('dp', None)` is written `P('dp')`.
"""

import functools
import itertools
import json
import math
import types
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.search import parse_bytes, rule_from_config

MESHES = {
    "8": ((8,), ("x",)),
    "2x4": ((2, 4), ("dp", "tp")),
    "1x8": ((1, 8), ("a", "b")),
    "2x2x2": ((2, 2, 2), ("a", "b", "c")),
}

MiB = 2**20
U = P.UNCONSTRAINED


@functools.cache
def mesh(name: str):
    return ss.create_mesh(*MESHES[name])


def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _case_id(mesh_name, shape, params):
    dims = "x".join(map(str, shape)) if shape else "scalar"
    extra = ",".join(f"{k}={v}" for k, v in params.items()).replace(" ", "")
    return f"{mesh_name}-[{dims}]" + (f"-{extra}" if extra else "")


def _table(cases):
    return [pytest.param(*case, id=_case_id(*case[:3])) for case in cases]


# --------------------------------------------------------------------------
# AutoShardingRule
# --------------------------------------------------------------------------

# (mesh, shape, rule kwargs, expected spec). Default min_shard_size is the
# device count, 8 on every mesh here.
AUTO_CASES = [
    # (8,) mesh, axis 'x' of size 8.
    ("8", (16,), {}, P("x")),
    ("8", (8,), {}, P("x")),
    ("8", (7,), {}, P()),
    ("8", (), {}, P()),
    ("8", (0, 16), {}, P()),
    ("8", (4, 6), {}, P()),
    ("8", (4, 16), {}, P(None, "x")),
    ("8", (16, 16), {}, P("x")),
    ("8", (16, 16), {"reverse": True}, P("x")),
    ("8", (8, 32), {}, P(None, "x")),
    ("8", (8, 32), {"reverse": True}, P("x")),
    ("8", (3, 5, 24), {}, P(None, None, "x")),
    ("8", (4,), {"min_shard_size": 2}, P()),
    ("8", (16,), {"min_shard_size": 32}, P()),
    ("8", (16,), {"axis_names": (("x",),)}, P("x")),
    # (2, 4) mesh: dp=2, tp=4.
    ("2x4", (1024, 512), {}, P("dp", "tp")),
    ("2x4", (1024, 512), {"axis_names": ("tp", "dp")}, P("tp", "dp")),
    ("2x4", (1024, 512), {"reverse": True}, P("tp", "dp")),
    ("2x4", (7,), {}, P()),
    ("2x4", (8,), {}, P("dp")),
    ("2x4", (6, 4), {}, P("dp", "tp")),
    ("2x4", (6, 4), {"axis_names": ("tp", "dp")}, P("dp", "tp")),
    ("2x4", (6, 4), {"reverse": True}, P(None, "dp")),
    ("2x4", (3, 4), {}, P(None, "dp")),
    ("2x4", (12, 3), {}, P("dp")),
    ("2x4", (2, 2, 2), {}, P("dp")),
    ("2x4", (4, 6, 8), {}, P("tp", None, "dp")),
    ("2x4", (16, 4), {"axis_names": (("dp", "tp"),)}, P(("dp", "tp"))),
    ("2x4", (16, 4), {"axis_names": (("tp", "dp"),)}, P(("tp", "dp"))),
    ("2x4", (12, 16), {"axis_names": (("dp", "tp"),)}, P(None, ("dp", "tp"))),
    ("2x4", (16, 16), {"axis_names": ("tp",)}, P("tp")),
    ("2x4", (16, 16), {"axis_names": ()}, P()),
    ("2x4", (4,), {"min_shard_size": 4}, P("dp")),
    ("2x4", (8, 8), {"min_shard_size": 100}, P()),
    # (1, 8) mesh: a=1 splits nothing, b=8.
    ("1x8", (8, 16), {}, P(None, "b")),
    ("1x8", (16,), {}, P("b")),
    ("1x8", (8,), {}, P("b")),
    ("1x8", (4, 4), {}, P()),
    ("1x8", (16, 16), {"axis_names": ("a",)}, P()),
    ("1x8", (16, 8), {"axis_names": ("b", "a")}, P("b")),
    ("1x8", (16,), {"axis_names": (("a", "b"),)}, P(("a", "b"))),
    ("1x8", (8, 16), {"reverse": True}, P("b")),
    ("1x8", (4,), {"min_shard_size": 1}, P()),
    # (2, 2, 2) mesh: a, b, c all 2.
    ("2x2x2", (16, 8), {}, P("a", "b")),
    ("2x2x2", (4, 4, 4), {}, P("a", "b", "c")),
    ("2x2x2", (16,), {}, P("a")),
    ("2x2x2", (8, 8, 8, 8), {}, P("a", "b", "c")),
    ("2x2x2", (16, 8), {"axis_names": ("c", "a", "b")}, P("c", "a")),
    ("2x2x2", (16, 8), {"axis_names": (("a", "b"), "c")}, P(("a", "b"), "c")),
    ("2x2x2", (16, 6), {"axis_names": ("c", ("a", "b"))}, P("c")),
    ("2x2x2", (3, 16, 4), {"reverse": True}, P(None, "b", "a")),
    ("2x2x2", (7,), {}, P()),
    ("2x2x2", (6,), {"min_shard_size": 2}, P("a")),
    ("2x2x2", (16, 16), {"axis_names": ("b",)}, P("b")),
    ("2x2x2", (3, 5), {}, P()),
]


@pytest.mark.parametrize("mesh_name, shape, params, expected", _table(AUTO_CASES))
def test_auto_golden(mesh_name, shape, params, expected):
    rule = ss.AutoShardingRule(mesh(mesh_name), **params)
    assert rule.apply(sds(shape)) == expected


def _reference_auto(shape, sizes, names, min_size, reverse):
    """AutoShardingRule's semantics, by exhaustive search.

    The greedy rule gives the valid assignment (each dim: no axis or one that
    divides it; each axis entry at most once) that is lexicographically
    smallest when the dims are read in visiting order and each dim scores the
    priority of its entry, an unsharded dim scoring worst.
    """
    if len(shape) == 0 or math.prod(shape) < min_size:
        return P()
    entries = []
    for e in names:
        n = math.prod(sizes[a] for a in (e if isinstance(e, tuple) else (e,)))
        if n > 1:
            entries.append((e, n))
    none = len(entries)
    visit = sorted(range(len(shape)), key=lambda d: (shape[d] if reverse else -shape[d], d))
    best_key, best = None, None
    for choice in itertools.product(range(none + 1), repeat=len(shape)):
        used = [c for c in choice if c != none]
        if len(used) != len(set(used)):
            continue
        if any(c != none and shape[d] % entries[c][1] for d, c in enumerate(choice)):
            continue
        key = tuple(choice[d] for d in visit)
        if best_key is None or key < best_key:
            best_key, best = key, choice
    out = [None if c == none else entries[c][0] for c in best]
    while out and out[-1] is None:
        out.pop()
    return P(*out)


DIMS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)


def _random_axis_names(rng, names):
    """None, or a random ordering of a random subset, maybe with a tuple group."""
    if rng.random() < 0.2:
        return None
    chosen = [names[i] for i in rng.permutation(len(names))[: rng.integers(1, len(names) + 1)]]
    if len(chosen) >= 2 and rng.random() < 0.4:
        chosen = [(chosen[0], chosen[1]), *chosen[2:]]
    return tuple(chosen)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_auto_matches_brute_force_reference(mesh_name):
    m = mesh(mesh_name)
    sizes = dict(zip(m.axis_names, m.axis_sizes, strict=True))
    analyzer = ss.ShardingAnalyzer(m)
    rng = np.random.default_rng(1234)
    for _ in range(150):
        shape = tuple(int(d) for d in rng.choice(DIMS, size=rng.integers(0, 5)))
        names = _random_axis_names(rng, list(m.axis_names))
        min_size = [None, 1, 4, 8, 64][rng.integers(0, 5)]
        reverse = bool(rng.integers(0, 2))
        rule = ss.AutoShardingRule(m, axis_names=names, min_shard_size=min_size, reverse=reverse)
        got = rule.apply(sds(shape))
        want = _reference_auto(
            shape, sizes, names if names is not None else m.axis_names, min_size or 8, reverse)
        assert got == want, (shape, names, min_size, reverse)
        assert analyzer.validate_partition_specs(sds(shape), got) == []


def test_auto_docstring_example(mesh24):
    w = sds((1024, 512))
    assert ss.AutoShardingRule(mesh24).apply(w) == P("dp", "tp")
    assert ss.AutoShardingRule(mesh24, axis_names=("tp", "dp")).apply(w) == P("tp", "dp")


# --------------------------------------------------------------------------
# MemoryConstrainedShardingRule
# --------------------------------------------------------------------------

# (mesh, shape, kwargs, expected); float32 unless a dtype is given. Axes are
# taken largest first (ties in axis_names order), each onto the dim with the
# largest per-device extent that it divides, until the shard fits.
MEMORY_CASES = [
    ("8", (16, 16), {"budget": 1024}, P()),
    ("8", (16, 16), {"budget": 1023}, P("x")),
    ("8", (4, 16), {"budget": 100}, P(None, "x")),
    ("8", (3, 5), {"budget": 100}, P()),
    ("8", (3, 5), {"budget": 10}, P()),
    ("8", (16, 16), {"budget": "1KiB"}, P()),
    ("8", (16, 16), {"budget": "1KiB", "dtype": "float64"}, P("x")),
    ("8", (64,), {"budget": 32, "dtype": "int8"}, P("x")),
    ("8", (), {"budget": 1}, P()),
    ("8", (0, 16), {"budget": 1}, P()),
    ("2x4", (1024, 1024), {"budget": MiB}, P("tp")),
    ("2x4", (256, 512), {"budget": MiB}, P()),
    ("2x4", (1024, 2048), {"budget": MiB}, P("dp", "tp")),
    ("2x4", (8, 8), {"budget": 1}, P("tp", "dp")),
    ("2x4", (8, 8), {"budget": 1, "axis_names": ("dp", "tp")}, P("tp", "dp")),
    ("2x4", (6, 4), {"budget": 1}, P("dp", "tp")),
    ("2x4", (16,), {"budget": 1}, P(("tp", "dp"))),
    ("2x4", (16, 16), {"budget": 1, "axis_names": ("dp",)}, P("dp")),
    ("2x4", (16, 4), {"budget": 1, "axis_names": (("dp", "tp"),)}, P(("dp", "tp"))),
    ("2x4", (3, 3), {"budget": 1}, P()),
    ("1x8", (8, 16), {"budget": 1}, P(None, "b")),
    ("1x8", (16,), {"budget": 1}, P("b")),
    ("1x8", (16, 16), {"budget": 1, "axis_names": ("a",)}, P()),
    ("2x2x2", (8, 8), {"budget": 1}, P(("a", "c"), "b")),
    ("2x2x2", (8, 8), {"budget": 128}, P("a")),
    ("2x2x2", (8, 8), {"budget": 1, "axis_names": ("c", "b", "a")}, P(("c", "a"), "b")),
    ("2x2x2", (16,), {"budget": 1}, P(("a", "b", "c"))),
    ("2x2x2", (16,), {"budget": 64}, P()),
    ("2x2x2", (16,), {"budget": 63}, P("a")),
    ("2x2x2", (2, 3), {"budget": 1}, P("a")),
]


@pytest.mark.parametrize("mesh_name, shape, params, expected", _table(MEMORY_CASES))
def test_memory_golden(mesh_name, shape, params, expected):
    params = dict(params)
    dtype = params.pop("dtype", "float32")
    rule = ss.MemoryConstrainedShardingRule(
        params.pop("budget"), mesh=mesh(mesh_name), **params)
    assert rule.apply(sds(shape, dtype)) == expected


def _entry_size(entry, sizes):
    return math.prod(sizes[a] for a in (entry if isinstance(entry, tuple) else (entry,)))


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_memory_invariants_on_random_shapes(mesh_name):
    """Valid; replicated iff it fits; fits unless no axis left can split it; minimal."""
    m = mesh(mesh_name)
    sizes = dict(zip(m.axis_names, m.axis_sizes, strict=True))
    analyzer = ss.ShardingAnalyzer(m)
    rng = np.random.default_rng(99)
    for _ in range(150):
        shape = tuple(int(d) for d in rng.choice(DIMS, size=rng.integers(0, 4)))
        dtype = np.dtype(["float32", "bfloat16", "int8"][rng.integers(0, 3)])
        budget = int(rng.integers(1, 4096))
        rule = ss.MemoryConstrainedShardingRule(budget, mesh=m)
        leaf = sds(shape, dtype)
        spec = rule.apply(leaf)
        assert analyzer.validate_partition_specs(leaf, spec) == []
        per_device = analyzer.estimate_memory_usage(leaf, spec)["size_per_device"]
        if math.prod(shape) * dtype.itemsize <= budget:
            assert spec == P()
            continue
        used = [a for e in spec for a in ((e,) if isinstance(e, str) else (e or ()))]
        assert all(sizes[a] > 1 for a in used)
        local = [
            d // _entry_size(tuple(e) if isinstance(e, tuple) else e, sizes) if e else d
            for d, e in itertools.zip_longest(shape, spec)]
        if per_device > budget:
            # Nothing left that could split further.
            for axis, size in sizes.items():
                if axis not in used and size > 1:
                    assert all(x % size for x in local), (shape, spec, axis)
        elif used:
            # Minimal: without the last axis handed out it would not fit.
            order = sorted(m.axis_names, key=lambda a: -sizes[a])
            last = [a for a in order if a in used][-1]
            assert per_device * sizes[last] > budget, (shape, spec, budget)


def test_memory_docstring_example(mesh24):
    rule = ss.MemoryConstrainedShardingRule("1MiB", mesh=mesh24)
    assert rule.max_memory_per_device == MiB
    assert rule.apply(sds((1024, 1024))) == P("tp")
    assert rule.apply(sds((256, 512))) == P()


# --------------------------------------------------------------------------
# ShapeBasedShardingRule
# --------------------------------------------------------------------------

def _shape_patterns(names):
    first, last = names[0], names[-1]
    return [
        ((None, 1024), P(None, last)),
        ((512, None), P(first, None)),
        ((None,), P(first)),
        ((None, None, None), P(None, None, None)),
        ((0, None), P(last)),
        ((None, 8), P(U, last)),
    ]


# (mesh, shape, {}, expected in terms of the mesh's first/last axis names).
SHAPE_CASES = [
    ((512, 1024), lambda first, last: P(None, last)),
    ((512, 64), lambda first, last: P(first)),
    ((1024,), lambda first, last: P(first)),
    ((2, 3, 4), lambda first, last: P()),
    ((4, 4), lambda first, last: P()),
    ((), lambda first, last: P()),
    ((2, 3, 4, 5), lambda first, last: P()),
    ((0, 16), lambda first, last: P(last)),
    ((16, 8), lambda first, last: P(U, last)),
]


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize(
    "shape, expected", [pytest.param(s, e, id=_case_id("", s, {})[1:]) for s, e in SHAPE_CASES])
def test_shape_golden(mesh_name, shape, expected):
    names = MESHES[mesh_name][1]
    rule = ss.ShapeBasedShardingRule(_shape_patterns(names))
    want = expected(names[0], names[-1])
    assert rule.apply(sds(shape)) == want
    assert ss.ShardingAnalyzer(mesh(mesh_name)).validate_partition_specs(sds(shape), want) == []


def test_shape_first_match_wins_and_mapping_equals_pairs():
    pairs = [((None, None), P("a")), ((8, 8), P("b"))]
    assert ss.ShapeBasedShardingRule(pairs).apply(sds((8, 8))) == P("a")
    assert ss.ShapeBasedShardingRule(pairs[::-1]).apply(sds((8, 8))) == P("b")
    assert ss.ShapeBasedShardingRule(dict(pairs)) == ss.ShapeBasedShardingRule(pairs)


def test_shape_docstring_example():
    rule = ss.ShapeBasedShardingRule({(None, 1024): P(None, "tp")})
    assert rule.apply(sds((512, 1024))) == P(None, "tp")
    assert rule.apply(sds((1024,))) == P()


# --------------------------------------------------------------------------
# PathShardingRule
# --------------------------------------------------------------------------

def _model():
    return {
        "params": {
            "layers": [
                {"attn": {"wq": sds((16, 32)), "wk": sds((16, 32))}, "mlp": {"w1": sds((32, 64))}},
            ],
            "embed": sds((64, 16)),
            "norm": sds((16,)),
        },
    }


# (mesh, rules given the mesh's axis names, expected by leaf path).
PATH_CASES = {
    "8": (
        [(r"attn/w[qk]$", P(None, "x")), (r"mlp", P("x", None)), (r"embed", P("x"))],
        {"layers/0/attn/wq": P(None, "x"), "layers/0/attn/wk": P(None, "x"),
         "layers/0/mlp/w1": P("x"), "embed": P("x"), "norm": P()},
    ),
    "2x4": (
        [(r"attn/wq$", P("dp", "tp")), (r"attn", P(("dp", "tp"))), (r"mlp/w1", P(U, "tp")),
         (r"embed|norm", P("tp"))],
        {"layers/0/attn/wq": P("dp", "tp"), "layers/0/attn/wk": P(("dp", "tp")),
         "layers/0/mlp/w1": P(U, "tp"), "embed": P("tp"), "norm": P("tp")},
    ),
    "1x8": (
        [(r"w", P("a", "b")), (r"embed", P(("a", "b")))],
        {"layers/0/attn/wq": P("a", "b"), "layers/0/attn/wk": P("a", "b"),
         "layers/0/mlp/w1": P("a", "b"), "embed": P(("a", "b")), "norm": P()},
    ),
    "2x2x2": (
        [(r"layers/\d+/attn", P("a", ("b", "c"))), (r"w1", P(None, None)),
         (r"embed", P("c", "a"))],
        {"layers/0/attn/wq": P("a", ("b", "c")), "layers/0/attn/wk": P("a", ("b", "c")),
         "layers/0/mlp/w1": P(), "embed": P("c", "a"), "norm": P()},
    ),
}


@pytest.mark.parametrize("mesh_name", list(PATH_CASES))
def test_path_golden(mesh_name):
    rules, expected = PATH_CASES[mesh_name]
    out = ss.PathShardingRule(rules, mesh=mesh(mesh_name)).apply(_model())
    got = {
        jax.tree_util.keystr(p, simple=True, separator="/").removeprefix("params/"): s
        for p, s in jax.tree_util.tree_leaves_with_path(out, is_leaf=lambda x: isinstance(x, P))}
    assert got == expected
    assert ss.ShardingAnalyzer(mesh(mesh_name)).validate_partition_specs(_model(), out) == []


def test_path_first_match_wins_and_search_anywhere(mesh24):
    tree = {"wq": sds((8, 8))}
    rule = ss.PathShardingRule([("w", P("tp")), ("wq", P("dp"))], mesh=mesh24)
    assert rule.apply(tree) == {"wq": P("tp")}
    assert ss.PathShardingRule([("q$", P("dp", None))], mesh=mesh24).apply(tree) == {"wq": P("dp")}


# --------------------------------------------------------------------------
# CompositeShardingRule
# --------------------------------------------------------------------------

def _composite_cases(names, m):
    first, last = names[0], names[-1]
    auto = ss.AutoShardingRule(m)
    return [
        # A rule that shards nothing (whatever its spelling) falls through.
        ("none-then-auto", [ss.ShapeBasedShardingRule({(None, None): P(None, None)}), auto],
         (16, 8), ss.AutoShardingRule(m).apply(sds((16, 8)))),
        ("unconstrained-then-auto", [ss.ShapeBasedShardingRule({(None, None): P(U, None)}), auto],
         (16, 8), auto.apply(sds((16, 8)))),
        ("shape-wins", [ss.ShapeBasedShardingRule({(16, 8): P(None, last)}), auto],
         (16, 8), P(None, last)),
        ("keeps-unconstrained-when-sharding", [ss.ShapeBasedShardingRule({(16, 8): P(U, last)})],
         (16, 8), P(U, last)),
        ("too-small-then-shape", [ss.AutoShardingRule(m, min_shard_size=1000),
                                  ss.ShapeBasedShardingRule({(16, 8): P(last)})],
         (16, 8), P(last)),
        ("memory-fits-then-auto", [ss.MemoryConstrainedShardingRule("1GiB", mesh=m), auto],
         (16, 8), auto.apply(sds((16, 8)))),
        ("nothing-shards", [ss.ShapeBasedShardingRule({(1,): P(first)}),
                            ss.AutoShardingRule(m, min_shard_size=10**6)], (16, 8), P()),
        ("empty", [], (16, 8), P()),
        ("path-then-auto", [ss.PathShardingRule([("nomatch", P(first))], mesh=m), auto],
         (16, 8), auto.apply(sds((16, 8)))),
        ("canonical", [ss.ShapeBasedShardingRule([((None, None), P(last, None))])],
         (16, 8), P(last)),
    ]


COMPOSITE_IDS = [c[0] for c in _composite_cases(("a", "b"), ss.abstract_mesh((2, 4), ("a", "b")))]


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("case", COMPOSITE_IDS)
def test_composite_golden(mesh_name, case):
    m = mesh(mesh_name)
    _, rules, shape, expected = next(
        c for c in _composite_cases(MESHES[mesh_name][1], m) if c[0] == case)
    assert ss.CompositeShardingRule(*rules).apply(sds(shape)) == expected


def test_composite_hand_checked_on_2x4(mesh24):
    tree = {"emb": sds((16, 8)), "w": sds((16, 8)), "b": sds((4,))}
    rule = ss.CompositeShardingRule(
        ss.PathShardingRule([("emb", P("tp"))], mesh=mesh24), ss.AutoShardingRule(mesh24))
    assert rule.apply(tree) == {"emb": P("tp"), "w": P("dp", "tp"), "b": P()}


def test_composite_per_leaf_choice(mesh24):
    """Each leaf takes the first rule that shards it, independently."""
    tree = [sds((16, 8)), sds((6, 6))]
    rule = ss.CompositeShardingRule(
        ss.ShapeBasedShardingRule({(16, 8): P("tp")}),
        ss.AutoShardingRule(mesh24, axis_names=("dp",)))
    assert rule.apply(tree) == [P("tp"), P("dp")]


# --------------------------------------------------------------------------
# Every rule: valid output, any pytree, any leaf, abstract leaves and meshes
# --------------------------------------------------------------------------

def _all_rules(m):
    names = tuple(m.axis_names)
    return {
        "auto": ss.AutoShardingRule(m),
        "auto-reverse": ss.AutoShardingRule(m, axis_names=names[::-1], reverse=True),
        "memory": ss.MemoryConstrainedShardingRule(64, mesh=m),
        "shape": ss.ShapeBasedShardingRule({(None, 8): P(None, names[-1])}),
        "path": ss.PathShardingRule([("w$", P(names[-1]))], mesh=m),
        "composite": ss.CompositeShardingRule(
            ss.PathShardingRule([("emb", P(names[0]))], mesh=m), ss.AutoShardingRule(m)),
    }


RULE_KINDS = list(_all_rules(ss.abstract_mesh((2, 4), ("dp", "tp"))))


class Pair(NamedTuple):
    w: Any
    label: Any


def _any_tree():
    return {
        "dict": {"w": np.zeros((16, 8), np.float32), "none": None},
        "list": [np.zeros((8,), np.float32), 3, 2.5, True],
        "tuple": (np.zeros((0, 16), np.float32), np.zeros((), np.float32), np.float32(1.0)),
        "nt": Pair(w=jax.ShapeDtypeStruct((32, 16), jnp.bfloat16), label="name"),
        "tiny": np.zeros((3,), np.int8),
        "obj": object(),
        "text": "hello",
    }


NON_ARRAY_OR_TINY = [
    "list/1", "list/2", "list/3", "tuple/0", "tuple/1", "tuple/2", "nt/label", "tiny", "obj",
    "text"]


def _by_path(specs):
    return {
        jax.tree_util.keystr(p, simple=True, separator="/"): s
        for p, s in jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, P))}


@pytest.mark.parametrize("kind", RULE_KINDS)
def test_any_pytree_any_leaf(any_mesh, kind):
    tree = _any_tree()
    out = _all_rules(any_mesh)[kind].apply(tree)
    assert jax.tree.structure(out, is_leaf=lambda x: isinstance(x, P)) == jax.tree.structure(tree)
    assert out["dict"]["none"] is None
    specs = _by_path(out)
    assert all(isinstance(s, P) for s in specs.values())
    for path in NON_ARRAY_OR_TINY:
        assert specs[path] == P(), path
    assert ss.ShardingAnalyzer(any_mesh).validate_partition_specs(tree, out) == []


def test_path_rule_fallback_error_ignores_non_array_leaves(mesh24):
    tree = {"w": np.zeros((8, 8), np.float32), "name": "w", "meta": object()}
    rule = ss.PathShardingRule([(".", P("tp"))], fallback="error", mesh=mesh24)
    assert rule.apply(tree) == {"w": P("tp"), "name": P(), "meta": P()}


@pytest.mark.parametrize("kind", RULE_KINDS)
def test_abstract_leaves_give_the_same_specs(any_mesh, kind):
    shapes = {"w": (16, 8), "emb": (64, 32), "v": (24,), "t": (4, 6, 8)}
    concrete = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    abstract = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()}
    duck = {k: types.SimpleNamespace(shape=s, dtype=np.float32) for k, s in shapes.items()}
    rule = _all_rules(any_mesh)[kind]
    expected = rule.apply(concrete)
    assert rule.apply(abstract) == expected
    assert rule.apply(duck) == expected


@pytest.mark.parametrize("kind", RULE_KINDS)
@pytest.mark.parametrize("make", ["jax", "shardsearch"])
def test_abstract_mesh(kind, make):
    am = (jax.sharding.AbstractMesh((8, 8), ("dp", "tp")) if make == "jax"
          else ss.abstract_mesh((8, 8), ("dp", "tp")))
    tree = {"w": sds((64, 128)), "emb": sds((64, 8)), "b": sds((63,))}
    out = _all_rules(am)[kind].apply(tree)
    assert ss.ShardingAnalyzer(am).validate_partition_specs(tree, out) == []
    if kind == "auto":
        # Default min_shard_size is the abstract mesh's 64 devices.
        assert out == {"w": P("tp", "dp"), "emb": P("dp", "tp"), "b": P()}


def test_abstract_mesh_larger_than_this_machine():
    am = ss.abstract_mesh((16, 16), ("dp", "tp"))
    memory = ss.MemoryConstrainedShardingRule("1MiB", mesh=am)
    assert memory.apply(sds((4096, 4096))) == P("dp", "tp")
    auto = ss.AutoShardingRule(am)
    assert auto.apply(sds((255,))) == P()
    assert auto.apply(sds((256,))) == P("dp")


@pytest.mark.parametrize("kind", RULE_KINDS)
def test_rules_with_no_mesh_use_the_context_mesh(any_mesh, kind):
    tree = {"w": sds((16, 8)), "emb": sds((64, 32))}
    bound = _all_rules(any_mesh)[kind]
    unbound = rule_without_mesh(bound)
    with jax.set_mesh(any_mesh):
        assert unbound.apply(tree) == bound.apply(tree)


def rule_without_mesh(rule):
    return rule_from_config(json.loads(json.dumps(rule.to_config())), mesh=None)


def test_rule_without_mesh_outside_a_context_fails():
    with pytest.raises(RuntimeError, match="no mesh is set"):
        ss.AutoShardingRule().apply(sds((16, 8)))


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", RULE_KINDS)
def test_config_round_trip(any_mesh, kind):
    rule = _all_rules(any_mesh)[kind]
    config = rule.to_config()
    back = rule_from_config(json.loads(json.dumps(config)), mesh=any_mesh)
    assert back == rule
    assert back.to_config() == config


def test_config_round_trip_keeps_groups_and_unconstrained(mesh24):
    rules = [
        ss.AutoShardingRule(mesh24, axis_names=(("dp", "tp"),), min_shard_size=4, reverse=True),
        ss.MemoryConstrainedShardingRule(123, mesh=mesh24, axis_names=("tp", "dp")),
        ss.ShapeBasedShardingRule({(None, 0, 8): P(U, ("dp", "tp"))}),
        ss.PathShardingRule([(r"a|b", P(None, ("tp", "dp")))], fallback="error", mesh=mesh24),
    ]
    for rule in rules:
        assert rule_from_config(json.loads(json.dumps(rule.to_config())), mesh24) == rule


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------

def _bad_rule(what, m):
    return {
        "auto-unknown-axis": lambda: ss.AutoShardingRule(m, axis_names=("dp", "xx")).apply(
            sds((8, 8))),
        "auto-unknown-in-group": lambda: ss.AutoShardingRule(
            m, axis_names=(("dp", "zz"),)).apply(sds((8, 8))),
        "memory-unknown-axis": lambda: ss.MemoryConstrainedShardingRule(
            1, mesh=m, axis_names=("yy",)).apply(sds((8, 8))),
        "path-unknown-axis": lambda: ss.PathShardingRule(
            [("nomatch", P("qq"))], mesh=m).apply({"w": sds((8, 8))}),
    }[what]


@pytest.mark.parametrize("what, axis", [
    ("auto-unknown-axis", "xx"), ("auto-unknown-in-group", "zz"), ("memory-unknown-axis", "yy"),
    ("path-unknown-axis", "qq")])
def test_unknown_axis_fails_when_the_rule_meets_the_mesh(mesh24, what, axis):
    with pytest.raises(ValueError, match=rf"'{axis}'.*not in the mesh.*\('dp', 'tp'\)"):
        _bad_rule(what, mesh24)()


@pytest.mark.parametrize("make, error, match", [
    (lambda: ss.AutoShardingRule(axis_names=("dp", "dp")), ValueError, "'dp' is listed twice"),
    (lambda: ss.AutoShardingRule(axis_names=(("dp", "tp"), "tp")), ValueError,
     "'tp' is listed twice"),
    (lambda: ss.MemoryConstrainedShardingRule(1, axis_names=("a", ("b", "a"))), ValueError,
     "'a' is listed twice"),
    (lambda: ss.AutoShardingRule(axis_names="dp"), TypeError, "got the string 'dp'"),
    (lambda: ss.AutoShardingRule(axis_names=(1,)), TypeError, "axis name 1 must be a string"),
    (lambda: ss.AutoShardingRule(axis_names=((),)), TypeError, "non-empty tuple"),
    (lambda: ss.AutoShardingRule(min_shard_size=0), ValueError,
     "min_shard_size must be a positive number, got 0"),
    (lambda: ss.AutoShardingRule(min_shard_size=-8), ValueError,
     "min_shard_size must be a positive number, got -8"),
    (lambda: ss.AutoShardingRule(min_shard_size=2.5), TypeError, "min_shard_size must be an int"),
    (lambda: ss.AutoShardingRule(min_shard_size=True), TypeError, "min_shard_size must be an int"),
    (lambda: ss.AutoShardingRule(reverse="yes"), TypeError, "reverse must be a bool"),
    (lambda: ss.MemoryConstrainedShardingRule(0), ValueError,
     "max_memory_per_device must be a positive number, got 0"),
    (lambda: ss.MemoryConstrainedShardingRule(-1.5), ValueError,
     "max_memory_per_device must be a positive number"),
    (lambda: ss.MemoryConstrainedShardingRule(True), ValueError,
     "max_memory_per_device must be a positive number"),
    (lambda: ss.MemoryConstrainedShardingRule("0GiB"), ValueError, "must be positive"),
    (lambda: ss.MemoryConstrainedShardingRule("lots"), ValueError, "is not a byte count"),
    (lambda: ss.MemoryConstrainedShardingRule("3 parsecs"), ValueError, "unknown unit"),
    (lambda: ss.ShapeBasedShardingRule({(None, 8): ("dp",)}), TypeError,
     r"expected a jax.sharding.PartitionSpec, got tuple"),
    (lambda: ss.ShapeBasedShardingRule({(None, 8): "dp"}), TypeError,
     r"pattern \(None, 8\): expected a jax.sharding.PartitionSpec, got str"),
    (lambda: ss.ShapeBasedShardingRule({(None, 8): P(3)}), TypeError, "spec entry 3"),
    (lambda: ss.ShapeBasedShardingRule([("ab", P())]), TypeError, "must be a tuple"),
    (lambda: ss.ShapeBasedShardingRule({(-1, 8): P()}), TypeError, "non-negative ints"),
    (lambda: ss.ShapeBasedShardingRule({(8,): P("a", "b")}), ValueError,
     r"pattern \(8,\) has rank 1 but its spec .* has 2 entries"),
    (lambda: ss.PathShardingRule([("w", ("tp",))]), TypeError,
     r"rule 0 \('w'\): expected a jax.sharding.PartitionSpec, got tuple"),
    (lambda: ss.PathShardingRule([("w", None)]), TypeError, "expected a jax.sharding"),
    (lambda: ss.PathShardingRule([("ok", P()), ("(unclosed", P())]), ValueError,
     r"rule 1 pattern '\(unclosed' is not a valid regex"),
    (lambda: ss.PathShardingRule({"w": P()}), TypeError, "sequence of \\(regex, PartitionSpec"),
    (lambda: ss.PathShardingRule([("w", P(), 1)]), TypeError, "rule 0 .* expected a"),
    (lambda: ss.PathShardingRule([(3, P())]), TypeError, "pattern 3 must be a string"),
    (lambda: ss.PathShardingRule([], fallback="ignore"), ValueError,
     r"fallback='ignore'; choose one of \('replicate', 'error'\)"),
    (lambda: ss.CompositeShardingRule(ss.AutoShardingRule(), "auto"), TypeError,
     "argument 1 is a str, not a ShardingRule"),
    (lambda: ss.CompositeShardingRule(P("dp")), TypeError,
     r"argument 0 is a \w+, not a ShardingRule"),
], ids=lambda x: None if callable(x) or isinstance(x, type) else str(x)[:40])
def test_construction_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_path_spec_longer_than_rank_names_path_pattern_sizes(mesh24):
    rule = ss.PathShardingRule([(r"bias$", P("dp", "tp"))], mesh=mesh24)
    with pytest.raises(ValueError, match=(
            r"layer/bias: pattern 'bias\$' gives P\('dp', 'tp'\) with 2 entries but the leaf "
            r"has rank 1 \(shape \(8,\)\)")):
        rule.apply({"layer": {"bias": sds((8,))}})


def test_path_spec_not_dividing_names_path_pattern_sizes(mesh24):
    rule = ss.PathShardingRule([(r"w", P(None, "tp"))], mesh=mesh24)
    with pytest.raises(ValueError, match=(
            r"layer/w: pattern 'w' puts 'tp' \(size 4\) on dim 1 of size 6, which it does not "
            "divide")):
        rule.apply({"layer": {"w": sds((8, 6))}})


def test_path_problems_are_collected(mesh24):
    rule = ss.PathShardingRule([(r"w", P(("dp", "tp")))], fallback="error", mesh=mesh24)
    tree = {"w1": sds((12,)), "w2": sds((4, 4)), "other": sds((8,))}
    with pytest.raises(ValueError, match=r"3 problem\(s\)") as info:
        rule.apply(tree)
    message = str(info.value)
    assert "w1: pattern 'w' puts ('dp', 'tp') (size 8) on dim 0 of size 12" in message
    assert "w2: pattern 'w' puts ('dp', 'tp') (size 8) on dim 0 of size 4" in message
    assert "other: no pattern matches this leaf and fallback='error'" in message


def test_path_fallback_error_names_the_leaf(mesh24):
    rule = ss.PathShardingRule([(r"attn", P("tp"))], fallback="error", mesh=mesh24)
    with pytest.raises(ValueError, match=r"layers/0/mlp/w1: no pattern matches this leaf"):
        rule.apply({"layers": [{"attn": sds((8,)), "mlp": {"w1": sds((8,))}}]})


@pytest.mark.parametrize("config, match", [
    ([], r"^rule: expected an object with a 'kind', got \[\]"),
    ({}, "expected an object with a 'kind'"),
    ({"kind": "nope"}, r"unknown rule kind 'nope'; known kinds: \('auto'"),
    ({"kind": "memory"}, r"rule: malformed 'memory' rule \('max_memory_per_device'\)"),
    ({"kind": "memory", "max_memory_per_device": "-3GB"}, "malformed 'memory' rule"),
    ({"kind": "auto", "min_shard_size": 0}, "malformed 'auto' rule .*min_shard_size"),
    ({"kind": "auto", "min_shard_size": 8.0}, "malformed 'auto' rule .*must be an int"),
    ({"kind": "auto", "reverse": "no"}, "malformed 'auto' rule .*reverse must be a bool"),
    ({"kind": "auto", "axis_names": "dp"}, "malformed 'auto' rule .*must be a list"),
    ({"kind": "auto", "axis_names": ["dp", "dp"]}, "malformed 'auto' rule .*listed twice"),
    ({"kind": "composite"}, r"malformed 'composite' rule \('rules'\)"),
    ({"kind": "composite", "rules": [{"kind": "auto"}, {"kind": "bad"}]},
     r"^rule\.rules\[1\]: unknown rule kind 'bad'"),
    ({"kind": "composite", "rules": 3}, "malformed 'composite' rule"),
    ({"kind": "shape", "shape_patterns": [[[None, 8], "dp"]]},
     r"^rule\.shape_patterns\[0\]: expected a list of spec entries"),
    ({"kind": "shape", "shape_patterns": [[[None, 8], [3]]]},
     r"^rule\.shape_patterns\[0\]: entry 0 is 3"),
    ({"kind": "shape", "shape_patterns": [[[None, 8]]]}, "malformed 'shape' rule"),
    ({"kind": "path", "rules": [["(", ["dp"]]]}, "malformed 'path' rule .*not a valid regex"),
    ({"kind": "path", "rules": [], "fallback": "skip"}, "malformed 'path' rule .*fallback"),
    ({"kind": "path"}, r"malformed 'path' rule \('rules'\)"),
], ids=lambda x: json.dumps(x)[:50] if not isinstance(x, str) else None)
def test_rule_from_config_errors(config, match):
    with pytest.raises(ValueError, match=match):
        rule_from_config(config)


def test_rule_from_config_error_names_where():
    with pytest.raises(ValueError, match=r"^rules/tpu\.json#2: unknown rule kind"):
        rule_from_config({"kind": "x"}, where="rules/tpu.json#2")


def test_rule_mesh_must_be_a_mesh():
    with pytest.raises(TypeError, match=r"mesh must be a jax\.sharding\.Mesh or AbstractMesh"):
        ss.AutoShardingRule(mesh=(2, 4)).apply(sds((8, 8)))


# --------------------------------------------------------------------------
# Kinds and descriptions
# --------------------------------------------------------------------------

def test_built_in_kinds_register_in_order():
    from shardsearch.rules import registered_kinds, rule_class

    classes = (ss.AutoShardingRule, ss.CompositeShardingRule, ss.MemoryConstrainedShardingRule,
               ss.ShapeBasedShardingRule, ss.PathShardingRule, ss.BatchShardingRule)
    assert registered_kinds()[:6] == tuple(cls.kind for cls in classes)
    assert all(rule_class(cls.kind) is cls for cls in classes)


@pytest.mark.parametrize("kind", RULE_KINDS)
def test_from_config_is_the_inverse_of_to_config(mesh24, kind):
    rule = _all_rules(mesh24)[kind]
    config = json.loads(json.dumps(rule.to_config()))
    assert type(rule).from_config(config, mesh24, "rule") == rule


# (rule, the lines `describe()` gives): the format `shardsearch show` prints.
DESCRIBE_CASES = [
    (ss.AutoShardingRule(), ["auto  axis_names=null min_shard_size=null reverse=false"]),
    (ss.AutoShardingRule(axis_names=(("dp", "tp"),), min_shard_size=4, reverse=True),
     ['auto  axis_names=[["dp", "tp"]] min_shard_size=4 reverse=true']),
    # Fields in name order, as a plan file (sorted keys) holds them.
    (ss.MemoryConstrainedShardingRule("1MiB", axis_names=("tp", "dp")),
     ['memory  axis_names=["tp", "dp"] max_memory_per_device=1048576']),
    (ss.BatchShardingRule(("dp", "tp")), ['batch  axes=["dp", "tp"]']),
    (ss.BatchShardingRule(()), ["batch  axes=[]"]),
    (ss.ShapeBasedShardingRule({(None, 0, 8): P(U, ("dp", "tp")), (4,): P("dp")}),
     ["shape",
      '   [null, 0, 8]  P(P.UNCONSTRAINED, ("dp", "tp"))',
      '   [4]           P("dp")']),
    (ss.ShapeBasedShardingRule({}), ["shape"]),
    (ss.PathShardingRule([(r"a|b", P(None, ("tp", "dp"))), ("embed", P(("tp",)))],
                         fallback="error"),
     ['path  fallback="error"',
      '   "a|b"    P(None, ("tp", "dp"))',
      '   "embed"  P("tp")']),
    (ss.PathShardingRule([]), ['path  fallback="replicate"']),
    (ss.CompositeShardingRule(), ["composite of no rules: everything replicated"]),
    (ss.CompositeShardingRule(
        ss.PathShardingRule([("emb", P("dp"))]),
        ss.CompositeShardingRule(ss.ShapeBasedShardingRule({(None, 8): P(None, "tp")}),
                                 ss.AutoShardingRule()),
        ss.CompositeShardingRule(),
        ss.MemoryConstrainedShardingRule(100)),
     ["composite: per leaf, the first of these rules that shards it",
      '  1. path  fallback="replicate"',
      '        "emb"  P("dp")',
      "  2. composite: per leaf, the first of these rules that shards it",
      "       1. shape",
      '             [null, 8]  P(None, "tp")',
      "       2. auto  axis_names=null min_shard_size=null reverse=false",
      "  3. composite of no rules: everything replicated",
      "  4. memory  axis_names=null max_memory_per_device=100"]),
]


@pytest.mark.parametrize("rule, lines", DESCRIBE_CASES,
                         ids=[f"{r.kind}-{i}" for i, (r, _) in enumerate(DESCRIBE_CASES)])
def test_describe(rule, lines):
    assert rule.describe() == lines
    # A rule reads the same loaded from its config, whatever mesh it is bound to.
    assert rule_from_config(json.loads(json.dumps(rule.to_config()))).describe() == lines


# --------------------------------------------------------------------------
# Byte sizes (the memory rule's budgets)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("16GiB", 16 * 2**30), ("512MB", 512 * 10**6), ("1.5e9", 1_500_000_000), (1000, 1000),
    (" 2 gb ", 2 * 10**9), ("1KiB", 1024), ("1.5KB", 1500), ("7b", 7), ("1TiB", 2**40),
    (2.5e3, 2500), ("3kib", 3072),
], ids=repr)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("value, match", [
    ("16XB", r"size '16XB' has unknown unit 'xb'; use one of B, KB, MB"),
    ("3 parsecs", "unknown unit 'parsecs'"),
    ("abc", r"size 'abc' is not a byte count; write e.g. 16GiB"),
    ("", "is not a byte count"),
    ("GiB", "is not a byte count"),
    ("-1GiB", "is not a byte count"),
    ("nan", "is not a byte count"),
    (None, "is not a byte count"),
    ([16], "is not a byte count"),
    (True, "size True is not a number of bytes"),
    (0, "size 0 must be positive"),
    (-5, "size -5 must be positive"),
    ("0GB", "must be positive"),
    ("0.5", "at least 1 byte"),
    (0.25, "at least 1 byte"),
    (float("inf"), "must be positive, finite"),
    (float("nan"), "must be positive, finite"),
    ("1e999", "must be positive, finite"),
], ids=repr)
def test_parse_bytes_errors(value, match):
    with pytest.raises(ValueError, match=match):
        parse_bytes(value)


def test_the_optimizer_state_rule_splits_moments_over_the_data_axes():
    from shardsearch.rules import OptimizerStateRule, rule_from_config

    mesh = ss.create_mesh((4, 2), ("dp", "tp"))
    state = {"params": {"w": jax.ShapeDtypeStruct((1024, 512), "float32"),
                        "b": jax.ShapeDtypeStruct((6,), "float32")},
             "opt": {"mu": {"w": jax.ShapeDtypeStruct((1024, 512), "float32"),
                            "b": jax.ShapeDtypeStruct((6,), "float32")},
                     "step": jax.ShapeDtypeStruct((), "int32")}}
    inner = ss.PathShardingRule([(r"w$", P(None, "tp"))], fallback="replicate", mesh=mesh)
    rule = OptimizerStateRule(inner, ("dp",), mesh=mesh)
    specs = rule.apply(state)
    assert specs["params"]["w"] == P(None, "tp")            # the parameter as the inner rule
    assert specs["opt"]["mu"]["w"] == P("dp", "tp")          # its moment also over dp
    assert specs["opt"]["mu"]["b"] == P()                    # 6 is not divisible by 4
    assert specs["opt"]["step"] == P()
    # A dim already holding an axis takes the new ones beside it when they divide.
    wide = OptimizerStateRule(ss.PathShardingRule([(r"w$", P("tp"))], mesh=mesh), ("dp",),
                              mesh=mesh)
    assert wide.apply(state)["opt"]["mu"]["w"] == P(("tp", "dp"))
    back = rule_from_config(rule.to_config(), mesh, "test")
    assert back.apply(state) == specs
    with pytest.raises(ValueError, match=r"axes \['pp'\] are not mesh axes"):
        OptimizerStateRule(inner, ("pp",), mesh=mesh).apply(state)


def test_megatron_with_a_distributed_optimizer_is_built_by_name():
    from shardsearch.workloads import expert_plan, expert_plans, get_workload

    mesh = ss.create_mesh((4, 2), ("dp", "tp"))
    workload = get_workload("gpt:tiny")
    plan = expert_plan(workload, mesh, "megatron_do")
    state = workload.abstract()[0]
    megatron = expert_plan(workload, mesh, "megatron").state_rule.apply(state)
    zero = plan.state_rule.apply(state)
    flat = dict(jax.tree_util.tree_flatten_with_path(zero)[0])
    for path, spec in jax.tree_util.tree_flatten_with_path(megatron)[0]:
        name = jax.tree_util.keystr(path)
        if "'opt'" in name and "'mu'" in name and spec != flat[path]:
            assert "dp" in str(flat[path])
        elif "'params'" in name:
            assert flat[path] == spec
    assert any("dp" in str(s) for p, s in flat.items() if "'mu'" in jax.tree_util.keystr(p))
    # Not among the baselines every search runs.
    assert "megatron_do" not in expert_plans(workload, mesh).plans


def test_data_parallel_with_a_distributed_optimizer_is_built_by_name():
    """dp_do (ZeRO-1): dp's batch and parameters, each Adam moment that has a
    dim divisible by 8 split over both axes at once."""
    from shardsearch.workloads import NAMED_ONLY_PLANS, expert_plan, expert_plans, get_workload

    mesh = ss.create_mesh((4, 2), ("dp", "tp"))
    workload = get_workload("gpt:tiny")
    state = workload.abstract()[0]
    plan, dp = (expert_plan(workload, mesh, name) for name in ("dp_do", "dp"))
    assert plan.batch_spec == dp.batch_spec
    split = 0
    for (path, leaf), spec in zip(jax.tree_util.tree_flatten_with_path(state)[0],
                                  jax.tree_util.tree_leaves(plan.state_rule.apply(state)),
                                  strict=True):
        name = jax.tree_util.keystr(path)
        if "'mu'" in name or "'nu'" in name:
            if any(d % 8 == 0 for d in leaf.shape):
                assert ("dp", "tp") in tuple(spec), (name, spec)
                split += 1
        else:
            assert all(e is None for e in spec), (name, spec)
    assert split >= 4
    assert "dp_do" in NAMED_ONLY_PLANS and "dp_do" not in expert_plans(workload, mesh).plans
