"""The search space: parameter encodings and trial → candidate."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import optuna
import pytest
from jax.sharding import PartitionSpec as P
from recording import RecordingTrial

import shardsearch as ss
from shardsearch.rules.batch import BatchShardingRule
from shardsearch.search.space.candidate import Candidate
from shardsearch.search.space.searchspace import (
    Param,
    ParamBlock,
    SearchSpace,
    lehmer_decode,
    ordered_subsets,
)


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


# --------------------------------------------------------------------------- blocks


def test_params_keep_their_names_kinds_ranges_and_order(mesh24):
    # Stored studies and TPE's seeded samples depend on exactly this.
    extra = ss.PathShardingRule([("emb", P("tp"))], mesh=mesh24)
    space = _space(mesh24, extra_rules={"emb": extra})
    got = [(p.name, (p.low, p.high) if p.choices is None else p.choices, p.when)
           for p in space.params()]
    assert got == [
        ("auto_order_0", (0, 1), ()),
        ("auto_join_0", (False, True), ()),
        ("auto_min_shard_size", space.min_shard_sizes, ()),
        ("auto_reverse", (False, True), ()),
        ("memory_rule", (False, True), ()),
        ("memory_fraction", (0.02, 0.05, 0.1, 0.25, 0.5), (("memory_rule", True),)),
        ("extra_emb", (False, True), ()),
        ("priority_0", (0, 2), ()),
        ("priority_1", (0, 1), ()),
        ("batch_axes", ("-", "dp", "tp", "dp,tp", "tp,dp"), ()),
    ]


@dataclasses.dataclass(frozen=True)
class _ReplicateBatchBlock(ParamBlock):
    """A block from outside the package: one categorical parameter that may
    replicate the batch, and one asked only when it does."""

    def params(self, space):
        return (Param.categorical("batch_mode", ["split", "replicate"]),
                Param.categorical("batch_note", ["a", "b"], when={"batch_mode": "replicate"}))

    def build(self, space, values, draft):
        if values["batch_mode"] == "split":
            return draft
        return dataclasses.replace(draft, batch_rule=BatchShardingRule(()))


@dataclasses.dataclass(frozen=True)
class _SpaceWithBlock(SearchSpace):
    def blocks(self):
        return (*super().blocks(), _ReplicateBatchBlock())


def test_a_new_block_is_suggested_and_enumerated_with_no_other_edit(mesh24):
    plain = _space(mesh24, memory_fractions=(0.5,))
    space = _SpaceWithBlock(mesh24, 1 << 20, 1 << 16, memory_fractions=(0.5,))
    combos = space.enumerate()
    # Each plain combination, then "split", or "replicate" with each note.
    assert combos == [{**c, **extra} for c in plain.enumerate()
                      for extra in ({"batch_mode": "split"},
                                    {"batch_mode": "replicate", "batch_note": "a"},
                                    {"batch_mode": "replicate", "batch_note": "b"})]
    base = {"auto_order_0": 0, "auto_join_0": False, "auto_min_shard_size": 8,
            "auto_reverse": False, "memory_rule": False, "priority_0": 0, "batch_axes": "dp"}
    split = space.suggest(optuna.trial.FixedTrial({**base, "batch_mode": "split"}))
    assert split.batch_rule.to_config() == BatchShardingRule(("dp",)).to_config()
    trial = RecordingTrial({**base, "batch_mode": "replicate", "batch_note": "b"})
    replicated = space.suggest(trial)
    assert replicated.batch_rule.to_config() == BatchShardingRule(()).to_config()
    assert trial.asked[-3:] == ["batch_axes", "batch_mode", "batch_note"]
    with pytest.raises(ValueError, match="batch_mode"):
        space.suggest(optuna.trial.FixedTrial(base))


@pytest.mark.parametrize("dims,names,extras", [((8,), ("x",), True),
                                               ((2, 4), ("dp", "tp"), True),
                                               ((2, 2, 2), ("a", "b", "c"), False)])
def test_every_enumerated_dict_replays_asking_exactly_its_params(dims, names, extras):
    mesh = ss.abstract_mesh(dims, names)
    extra = {"emb": ss.PathShardingRule([("emb", P(names[-1]))], mesh=mesh)} if extras else {}
    space = _SpaceWithBlock(mesh, 1 << 20, 1 << 10, extra, memory_fractions=(0.5,))
    combos = space.enumerate()
    assert len(combos) == len({tuple(c.items()) for c in combos})
    # Every dict on the small meshes; a spread of ~3000 on 2x2x2 (~100k dicts).
    for params in combos[:: max(1, len(combos) // 3000)]:
        trial = RecordingTrial(params)
        assert isinstance(space.suggest(trial), Candidate)
        assert trial.asked == list(params)


def test_conditional_params_appear_only_where_their_condition_holds(mesh24):
    space = _SpaceWithBlock(mesh24, 1 << 20, 1 << 16)
    combos = space.enumerate()
    assert all(("memory_fraction" in c) == c["memory_rule"] for c in combos)
    assert all(("batch_note" in c) == (c["batch_mode"] == "replicate") for c in combos)
    assert any("memory_fraction" in c for c in combos)
    params = {"auto_order_0": 0, "auto_join_0": False, "auto_min_shard_size": 8,
              "auto_reverse": False, "memory_rule": False, "memory_fraction": 0.5,
              "priority_0": 0, "batch_axes": "-", "batch_mode": "split", "batch_note": "a"}
    trial = RecordingTrial(params)
    space.suggest(trial)
    assert "memory_fraction" not in trial.asked and "batch_note" not in trial.asked


def test_params_are_the_optuna_distributions_a_study_records(mesh24):
    space = _space(mesh24)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: float(len(space.suggest(t).state_rule.rules)), n_trials=10)
    declared = {p.name: p for p in space.params()}
    for trial in study.trials:
        for name, dist in trial.distributions.items():
            p = declared[name]
            if p.choices is None:
                assert dist == optuna.distributions.IntDistribution(p.low, p.high)
            else:
                assert dist == optuna.distributions.CategoricalDistribution(p.choices)


def test_param_conditions_hold_on_values_chosen_before():
    p = Param("frac", choices=(0.1, 0.5), when={"on": True, "mode": "a"})
    assert p.when == (("on", True), ("mode", "a"))
    assert p.applies({"on": True, "mode": "a"})
    assert not p.applies({"on": True, "mode": "b"}) and not p.applies({"on": True})
    assert Param.integer("i", 0, 2).values() == (0, 1, 2)


@pytest.mark.parametrize("kwargs,match", [
    ({"name": "x", "low": 0, "high": 1, "choices": (1,)}, "either low and high or choices"),
    ({"name": "x"}, "either low and high or choices"),
    ({"name": "x", "low": 2, "high": 1}, "needs int low <= high"),
    ({"name": "x", "choices": ()}, "non-empty sequence"),
    ({"name": "x", "choices": ([1],)}, "non-empty sequence"),
    ({"name": "my x", "choices": (1,)}, "must be an identifier"),
])
def test_param_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Param(**kwargs)


@dataclasses.dataclass(frozen=True)
class _Declares(ParamBlock):
    declared: tuple[Param, ...]
    rule: str | None = None

    def params(self, space):
        return self.declared

    def build(self, space, values, draft):
        if self.rule is None:
            return draft
        return draft.with_rule(self.rule, ss.AutoShardingRule(space.mesh))


@dataclasses.dataclass(frozen=True)
class _Plus(SearchSpace):
    more: tuple[ParamBlock, ...] = ()
    only: tuple[ParamBlock, ...] | None = None

    def blocks(self):
        return self.only if self.only is not None else (*self.more, *super().blocks())


@pytest.mark.parametrize("block,match", [
    (_Declares((Param.categorical("auto_reverse", [1]),)), "'auto_reverse' is declared twice"),
    (_Declares((Param.categorical("y", [1], when={"later": True}),)),
     "asked when later=True, but no parameter 'later' declared before it"),
    (_Declares((Param.categorical("z", [1]), Param.categorical("y", [1], when={"z": 2}))),
     "asked when z=2"),
])
def test_declaration_errors(mesh24, block, match):
    with pytest.raises(ValueError, match=match):
        _Plus(mesh24, 1 << 20, 1 << 16, more=(block,)).params()


def test_build_errors_name_the_missing_piece(mesh24):
    fixed = optuna.trial.FixedTrial(
        {"auto_order_0": 0, "auto_join_0": False, "auto_min_shard_size": 8,
         "auto_reverse": False, "memory_rule": False, "priority_0": 0, "batch_axes": "-"})
    unlisted = _Plus(mesh24, 1 << 20, 1 << 16, more=(_Declares((), rule="mine"),))
    with pytest.raises(ValueError, match=r"rules \['mine'\] are not in SearchSpace.rule_names"):
        unlisted.suggest(fixed)
    twice = _Plus(mesh24, 1 << 20, 1 << 16, more=(_Declares((), rule="auto"),))
    with pytest.raises(ValueError, match="two blocks switched on a state rule named 'auto'"):
        twice.suggest(fixed)
    empty = _Plus(mesh24, 1 << 20, 1 << 16, only=())
    assert empty.enumerate() == [{}]
    with pytest.raises(ValueError, match=r"no block built \['state_rule', 'batch_rule'\]"):
        empty.suggest(fixed)
