"""The search space: parameter encodings and trial → candidate."""

import itertools

import jax
import jax.numpy as jnp
import optuna
import pytest
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.search.space import Candidate, SearchSpace, lehmer_decode, ordered_subsets


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_lehmer_codes_cover_every_permutation_once(n):
    items = list("abcd"[:n])
    codes = itertools.product(*(range(n - i) for i in range(n - 1)))
    perms = [tuple(lehmer_decode(c, items)) for c in codes]
    assert sorted(perms) == sorted(itertools.permutations(items))


def test_lehmer_decode_example():
    assert lehmer_decode([1, 0], "abc") == ["b", "a", "c"]


@pytest.mark.parametrize("n,count", [(0, 1), (1, 2), (2, 5), (3, 16)])
def test_ordered_subsets_count(n, count):
    subsets = ordered_subsets(list("xyz"[:n]))
    assert len(subsets) == count == len(set(subsets))
    assert subsets[0] == ()


def _space(mesh, **kw):
    return SearchSpace(mesh, reference_bytes=1 << 20, max_leaf_size=1 << 16, **kw)


def test_min_shard_sizes_start_at_device_count_and_exceed_largest_leaf(mesh24):
    sizes = _space(mesh24).min_shard_sizes
    assert sizes[0] == 8
    assert sizes[-1] > 1 << 16
    assert list(sizes) == sorted(set(sizes))


def test_size_one_axes_are_not_searched():
    mesh = ss.create_mesh((1, 8), ("a", "b"))
    assert _space(mesh).axes == ("b",)


def test_fixed_trial_builds_the_documented_candidate(mesh24):
    space = _space(mesh24)
    params = {"auto_order_0": 1, "auto_join_0": False, "auto_min_shard_size": 8,
              "auto_reverse": False, "memory_rule": False, "priority_0": 0,
              "batch_axes": "dp"}
    candidate = space.suggest(optuna.trial.FixedTrial(params))
    tree = {"w": jax.ShapeDtypeStruct((64, 32), jnp.float32)}
    # Order (tp, dp): the largest dim takes tp.
    assert candidate.state_rule.apply(tree) == {"w": P("tp", "dp")}
    assert candidate.batch_rule.apply({"x": jax.ShapeDtypeStruct((16, 4), jnp.float32)}) == {
        "x": P("dp")}


def test_joined_axes_split_one_dim_like_fsdp(mesh24):
    params = {"auto_order_0": 0, "auto_join_0": True, "auto_min_shard_size": 8,
              "auto_reverse": False, "memory_rule": False, "priority_0": 0,
              "batch_axes": "dp,tp"}
    candidate = _space(mesh24).suggest(optuna.trial.FixedTrial(params))
    tree = {"w": jax.ShapeDtypeStruct((64, 32), jnp.float32)}
    assert candidate.state_rule.apply(tree) == {"w": P(("dp", "tp"))}


def test_priority_puts_memory_rule_first_or_last(mesh24):
    base = {"auto_order_0": 0, "auto_join_0": False, "auto_min_shard_size": 8,
            "auto_reverse": False, "memory_rule": True, "memory_fraction": 0.5,
            "batch_axes": "-"}
    space = _space(mesh24)
    first = space.suggest(optuna.trial.FixedTrial({**base, "priority_0": 0}))
    last = space.suggest(optuna.trial.FixedTrial({**base, "priority_0": 1}))
    kinds = lambda c: [r.kind for r in c.state_rule.rules]  # noqa: E731
    assert kinds(first) == ["memory", "auto"]
    assert kinds(last) == ["auto", "memory"]


def test_extra_rules_switch_on_and_off(mesh24):
    extra = ss.PathShardingRule([("emb", P("tp"))], mesh=mesh24)
    space = _space(mesh24, extra_rules={"emb": extra})
    params = {"auto_order_0": 0, "auto_join_0": False, "auto_min_shard_size": 8,
              "auto_reverse": False, "memory_rule": False, "priority_0": 2,
              "priority_1": 0, "batch_axes": "-"}
    on = space.suggest(optuna.trial.FixedTrial({**params, "extra_emb": True}))
    off = space.suggest(optuna.trial.FixedTrial({**params, "extra_emb": False}))
    assert extra in on.state_rule.rules
    assert extra not in off.state_rule.rules


def test_enumerate_replays_through_suggest(mesh24):
    space = _space(mesh24)
    combos = space.enumerate()
    expected = (2 * 2 * len(space.min_shard_sizes) * 2 * (1 + len(space.memory_fractions))
                * 2 * 5)
    assert len(combos) == expected
    for params in combos[:: max(1, len(combos) // 50)]:
        assert isinstance(space.suggest(optuna.trial.FixedTrial(params)), Candidate)


def test_bad_extra_rule_and_candidate_errors(mesh24):
    with pytest.raises(TypeError, match="extra rule 'x' is a str"):
        _space(mesh24, extra_rules={"x": "not a rule"})
    with pytest.raises(ValueError, match="must be an identifier"):
        _space(mesh24, extra_rules={"my rule": ss.AutoShardingRule(mesh24)})
    with pytest.raises(TypeError, match=r"Candidate\.batch_rule must be a ShardingRule"):
        Candidate(ss.AutoShardingRule(mesh24), P("dp"))


def test_space_is_deterministic(mesh24):
    space = _space(mesh24)
    a, b = space.enumerate(), space.enumerate()
    assert a == b
