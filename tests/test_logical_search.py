"""The logical family in the search: the space (rules / logical / both), the
baselines every step gets, and a short search on a user step written with jax only."""

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optuna
import pytest
from jax.sharding import PartitionSpec as P
from recording import RecordingTrial

import shardsearch as ss
from shardsearch.base import tree as _tree
from shardsearch.logical.discover import discover_logical_axes
from shardsearch.rules.logical import LogicalAxisRule
from shardsearch.search.space.baselines import (
    LOGICAL_MEGATRON,
    baseline_candidates,
    baseline_plans,
    make_space,
)
from shardsearch.search.space.candidate import Candidate
from shardsearch.search.space.logical import group_choices, offered_axes
from shardsearch.search.space.searchspace import SearchSpace
from shardsearch.workloads import expert_plans, get_workload

MESH = ss.abstract_mesh((2, 4), ("dp", "tp"))


@pytest.fixture(scope="module")
def gpt():
    workload = get_workload("gpt:tiny")
    args = workload.abstract()
    return workload, args, discover_logical_axes(workload.step, args)


def _declared(space):
    return [(p.name, (p.low, p.high) if p.choices is None else p.choices, p.when)
            for p in space.params()]


# ------------------------------------------------------------------- the space


def test_rules_space_is_exactly_todays(gpt):
    workload, args, axes = gpt
    today = make_space(MESH, args[0])
    explicit = make_space(MESH, args[0], space="rules", step=workload.step, args=args)
    with_axes = SearchSpace(MESH, today.reference_bytes, today.max_leaf_size, logical=axes)
    assert _declared(explicit) == _declared(today) == _declared(with_axes)
    assert explicit.enumerate() == today.enumerate()
    for params in today.enumerate()[::97]:
        a = today.suggest(optuna.trial.FixedTrial(params))
        b = explicit.suggest(optuna.trial.FixedTrial(params))
        assert json.dumps([a.state_rule.to_config(), a.batch_rule.to_config()]) == json.dumps(
            [b.state_rule.to_config(), b.batch_rule.to_config()])


@pytest.mark.parametrize("axes,choices", [
    (("x",), ("-", "x")),
    (("dp", "tp"), ("-", "dp", "tp", "dp,tp", "tp,dp")),
    (("a", "b", "c"), ("-", "a", "b", "c", "a,b", "a,c", "b,c", "a,b,c", "c,b,a")),
])
def test_group_choices(axes, choices):
    assert group_choices(axes) == choices


def test_offered_axes_are_large_enough_capped_largest_first(gpt):
    _, _, axes = gpt
    # gpt:tiny: mlp, vocab, vocab_2 (256), embed (64), seq (32), heads (4); batch is
    # the batch block's.
    assert offered_axes(axes, MESH, 6) == ("mlp", "vocab", "vocab_2", "embed", "seq", "heads")
    assert offered_axes(axes, MESH, 2) == ("mlp", "vocab")
    # On 8 x 8 a 4-head axis is below the smallest mesh axis.
    assert "heads" not in offered_axes(axes, ss.abstract_mesh((8, 8), ("dp", "tp")), 6)
    assert offered_axes(axes, ss.abstract_mesh((1,), ("x",)), 6) == ()


def test_logical_space_params_and_candidate(gpt):
    workload, args, axes = gpt
    space = make_space(MESH, args[0], space="logical", logical=axes)
    choices = group_choices(("dp", "tp"))
    assert _declared(space) == [
        ("batch_axes", ("-", "dp", "tp", "dp,tp", "tp,dp"), ()),
        *((f"logical_{n}", choices, ()) for n in ("mlp", "vocab", "vocab_2", "embed", "seq")),
        # 4 heads: the 8-way groups would leave them whole, the "-" candidate again.
        ("logical_heads", ("-", "dp", "tp"), ()),
        # The state has Adam moments: the optimizer-state block ends the space.
        ("opt_state_axes", choices, ())]
    params = {"batch_axes": "dp", "logical_mlp": "tp", "logical_vocab": "tp",
              "logical_vocab_2": "tp", "logical_embed": "-", "logical_seq": "-",
              "logical_heads": "tp", "opt_state_axes": "-"}
    candidate = space.suggest(optuna.trial.FixedTrial(params))
    assert isinstance(candidate.state_rule, LogicalAxisRule)
    assert isinstance(candidate.batch_rule, LogicalAxisRule)
    # One assignment: the state's part and the batch's part.
    assert candidate.state_rule.mapping == {"vocab": "tp", "vocab_2": "tp", "heads": "tp",
                                            "mlp": "tp"}
    assert candidate.batch_rule.mapping == {"batch": "dp"}
    megatron = expert_plans(workload, MESH).plans["megatron"]
    assert _tree.leaf_specs(candidate.specs(args)[0]) == _tree.leaf_specs(
        megatron.state_rule.apply(args[0]))
    assert candidate.specs(args)[1] == {"targets": P("dp"), "tokens": P("dp")}


def test_both_asks_family_first_and_each_family_only_when_picked(gpt):
    _, args, axes = gpt
    both = make_space(MESH, args[0], space="both", logical=axes)
    rules = make_space(MESH, args[0])
    logical = make_space(MESH, args[0], space="logical", logical=axes)
    declared = _declared(both)
    assert declared[0] == ("family", ("rules", "logical"), ())
    names = [d[0] for d in declared]
    assert names == ["family", *(n for n, _, _ in _declared(rules) if n != "batch_axes"),
                     "batch_axes", *(n for n, _, _ in _declared(logical)
                                     if n != "batch_axes")]
    assert names[-1] == "opt_state_axes" and "opt_state_axes" not in {
        n for n, _, _ in _declared(rules)}  # the rules space keeps its parameters
    for name, _choices, when in declared[1:]:
        if name in ("batch_axes", "opt_state_axes"):
            assert when == ()
        else:
            assert when[0] == ("family", "logical" if name.startswith("logical_") else "rules")
    combos = both.enumerate()
    # Both families end with the optimizer state's five choices.
    assert len(combos) == len(rules.enumerate()) * 5 + len(logical.enumerate())
    assert len(combos) == len({tuple(c.items()) for c in combos})
    # Every enumerated dict replays through suggest, asking exactly its parameters.
    for params in combos[:: max(1, len(combos) // 400)] + combos[-3:]:
        trial = RecordingTrial(params)
        candidate = both.suggest(trial)
        assert isinstance(candidate, Candidate)
        assert trial.asked == list(params)
        kind = candidate.state_rule.kind
        if params["opt_state_axes"] != "-":
            assert kind == "optimizer-state"
            kind = candidate.state_rule.rule.kind
        assert kind == ("logical" if params["family"] == "logical" else "composite")


def test_both_space_in_an_optuna_study_records_the_declared_distributions(gpt):
    _, args, axes = gpt
    space = make_space(MESH, args[0], space="both", logical=axes)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(lambda t: float(len(space.suggest(t).state_rule.to_config())), n_trials=12)
    declared = {p.name: p for p in space.params()}
    families = set()
    for trial in study.trials:
        families.add(trial.params["family"])
        for name, dist in trial.distributions.items():
            p = declared[name]
            expected = (optuna.distributions.IntDistribution(p.low, p.high) if p.choices is None
                        else optuna.distributions.CategoricalDistribution(p.choices))
            assert dist == expected
    assert families == {"rules", "logical"}


def test_space_errors(gpt):
    _, args, _ = gpt
    with pytest.raises(ValueError, match="space='logical' needs the step's logical axes"):
        SearchSpace(MESH, 1 << 20, 1 << 10, space="logical")
    with pytest.raises(ValueError, match=r"space='mixed'; choose one of \('rules'"):
        SearchSpace(MESH, 1 << 20, 1 << 10, space="mixed")
    with pytest.raises(ValueError, match="pass step= and args="):
        make_space(MESH, args[0], space="both")


def test_a_step_without_logical_axes_falls_back_to_rules_for_both_only():
    def step(state, x):
        return state * x.sum(), {}

    def broken(state, x):
        raise RuntimeError("cannot trace")

    args = (jnp.zeros(()), jnp.zeros((8,)))
    with pytest.warns(UserWarning, match="searching the rules family only"):
        space = make_space(MESH, args[0], space="both", step=broken, args=args)
    assert space.space == "rules"
    with pytest.raises(ValueError, match="could not be discovered"):
        make_space(MESH, args[0], space="logical", step=broken, args=args)
    assert make_space(MESH, args[0], space="both", step=step, args=args).space == "both"


# ---------------------------------------------------------------- baselines


class Adam(NamedTuple):
    count: jax.Array
    mu: dict
    nu: dict


def _user_args():
    params = {"layers": [{"w": jnp.ones((16, 64)), "b": jnp.zeros((64,))},
                         {"w": jnp.ones((64, 8)) * 0.1}]}
    zeros = jax.tree.map(jnp.zeros_like, params)
    state = {"params": params, "opt": Adam(jnp.zeros((), jnp.int32), zeros, zeros)}
    x = jnp.ones((16, 16))
    y = jnp.ones((16, 8))
    return state, x, y


def _user_step(state, x, y):
    """A plain jax step: a 2-layer MLP and Adam, nothing from shardsearch."""

    def loss(params):
        h = jnp.tanh(x @ params["layers"][0]["w"] + params["layers"][0]["b"])
        return jnp.mean((h @ params["layers"][1]["w"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(state["params"])
    opt = state["opt"]
    count = opt.count + 1
    mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt.mu, grads)
    nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt.nu, grads)
    params = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8),
                          state["params"], mu, nu)
    return {"params": params, "opt": Adam(count, mu, nu)}, {"loss": value}


def test_a_plain_step_gets_dp_and_fsdp_as_the_workloads_build_them():
    args = _user_args()
    candidates, skipped = baseline_plans(None, MESH, args)
    assert list(candidates) == ["replicated", "default", "dp", "fsdp"] and not skipped
    state, *batch = args
    dp, fsdp = candidates["dp"], candidates["fsdp"]
    assert _tree.leaf_specs(dp.state_rule.apply(state)) == [
        (p, P()) for p, _ in _tree.leaf_specs(dp.state_rule.apply(state))]
    assert [dp.batch_rule.apply(b) for b in batch] == [P(("dp", "tp"))] * 2
    assert fsdp.state_rule.to_config() == {"kind": "auto", "axis_names": [["dp", "tp"]],
                                           "min_shard_size": None, "reverse": False}
    got = dict(_tree.leaf_specs(fsdp.state_rule.apply(state)))
    assert got["params/layers/0/w"] == P(None, ("dp", "tp"))
    assert got["opt/mu/layers/1/w"] == P(("dp", "tp"))
    # The workloads' own versions build the same rules.
    workload = get_workload("mlp:tiny")
    plans = expert_plans(workload, MESH).plans
    for name in ("dp", "fsdp"):
        assert candidates[name].state_rule.to_config() == plans[name].state_rule.to_config()
        assert candidates[name].batch_rule.to_config() == plans[name].batch_rule.to_config()
    # A batch no mesh size divides: dp and fsdp are skipped, with the reason.
    odd = (state, jnp.ones((6, 16)), jnp.ones((6, 8)))
    candidates, skipped = baseline_plans(None, MESH, odd)
    assert list(candidates) == ["replicated", "default"]
    assert "batch=6" in skipped["dp"] and "batch=6" in skipped["fsdp"]
    assert list(baseline_candidates(None, MESH)) == ["replicated", "default"]


def test_logical_megatron_matches_megatron_on_gpt_and_mlp(gpt):
    for workload, args, axes in (gpt, _discovered("mlp:tiny")):
        candidates, skipped = baseline_plans(workload, MESH, args, axes)
        assert LOGICAL_MEGATRON in candidates, skipped
        logical = candidates[LOGICAL_MEGATRON]
        megatron = candidates["megatron"]
        assert [_tree.leaf_specs(t) for t in logical.specs(args)] == [
            _tree.leaf_specs(t) for t in megatron.specs(args)], workload.name


def _discovered(name):
    workload = get_workload(name)
    args = workload.abstract()
    return workload, args, discover_logical_axes(workload.step, args)


def test_logical_megatron_is_skipped_with_a_reason(gpt):
    workload, args, axes = gpt
    _, skipped = baseline_plans(workload, ss.abstract_mesh((8,), ("dp",)), args, axes)
    assert "needs a tensor axis" in skipped[LOGICAL_MEGATRON]
    # 4 heads, mlp 256, vocab 256 on 512 tensor ranks: nothing divides.
    _, skipped = baseline_plans(None, ss.abstract_mesh((512,), ("tp",)), args, axes)
    assert "divide none of the inner axes" in skipped[LOGICAL_MEGATRON]


# ----------------------------------------------------------- a short search


def test_a_user_step_searched_with_both_families_exports_a_valid_plan(tmp_path, mesh24):
    args = _user_args()
    storage = f"sqlite:///{tmp_path / 's.db'}"
    # In-process (isolate=False): what is tested is the space and the baselines.
    result = ss.optimize(_user_step, args, mesh=mesh24, n_trials=6, objective="static",
                         storage=storage, quiet=True, confirm_rounds=0, isolate=False)
    labels = [r.label for r in result.trials]
    # The hidden width (64) sits between the two weights: tensor parallel on tp.
    assert labels[:5] == ["replicated", "default", "dp", "fsdp", LOGICAL_MEGATRON]
    assert result.study.study_name.endswith("/both")
    assert result.study.user_attrs["space"] == "both"
    families = {r.params.get("family") for r in result.trials if r.label == "search"}
    assert families <= {"rules", "logical"} and families
    config = ss.export_config(result, args=args)
    path = ss.write_config(config, tmp_path / "plan.json")
    plan = ss.load_plan(path)
    specs = plan.apply(args)
    analyzer = ss.ShardingAnalyzer(mesh24)
    for tree, tree_specs in zip(args, specs, strict=True):
        assert analyzer.validate_partition_specs(tree, tree_specs) == []
    # A logical trial exports as logical-axis rules, which load back.
    logical = next((r for r in result.trials if r.state_rule["kind"] == "logical"), None)
    if logical is not None:
        config = ss.export_config(result, args=args, trial=logical.number)
        rules = ss.write_config(config, tmp_path / "rules.json", format="logical-axis-rules")
        assert ss.load_rule(rules).to_config() == config["state_rule"]
    rules_only = ss.optimize(_user_step, args, mesh=mesh24, n_trials=1, objective="static",
                             storage=storage, quiet=True, confirm_rounds=0, space="rules",
                             isolate=False)
    assert rules_only.study.study_name == result.study.study_name[:-len("/both")]


def test_the_cli_takes_the_space(capsys):
    from shardsearch.cli import main as _cli

    parser = _cli.build_parser()
    base = ["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4"]
    assert parser.parse_args(base).space == "both"
    assert parser.parse_args([*base, "--space", "logical"]).space == "logical"
    assert _cli.main([*base, "--space", "mixed"]) == 2
    assert "invalid choice: 'mixed'" in capsys.readouterr().err
    export = parser.parse_args(["export", "--study", "s", "--out", "f",
                                "--format", "logical-axis-rules"])
    assert export.format == "logical-axis-rules"


def test_opt_state_axes_split_the_moments_and_leave_the_parameters(gpt):
    _, args, axes = gpt
    space = make_space(MESH, args[0], space="logical", logical=axes)
    params = {"batch_axes": "dp", "logical_mlp": "tp", "logical_vocab": "tp",
              "logical_vocab_2": "tp", "logical_embed": "-", "logical_seq": "-",
              "logical_heads": "tp"}
    plain = space.suggest(optuna.trial.FixedTrial({**params, "opt_state_axes": "-"}))
    zero = space.suggest(optuna.trial.FixedTrial({**params, "opt_state_axes": "dp"}))
    before = dict(_tree.leaf_specs(plain.specs(args)[0]))
    after = dict(_tree.leaf_specs(zero.specs(args)[0]))
    moved = {path for path in after if after[path] != before[path]}
    assert moved and all(path.startswith("opt/") for path in moved)
    assert all("dp" in str(after[path]) for path in moved)


def test_baselines_the_space_can_build_carry_its_parameters_for_the_sampler(tmp_path, mesh24):
    # TPE models only trials that carry its parameters: the baselines, the
    # best plans of most studies, get the values whose proposal compiles
    # their very program, so that the searched trials start from them.
    storage = f"sqlite:///{tmp_path / 's.db'}"
    kwargs = dict(mesh=mesh24, objective="static", storage=storage, study_name="s",
                  quiet=True, confirm_rounds=0, isolate=False)
    workload = get_workload("gpt:tiny")
    result = ss.optimize(workload, n_trials=7, **kwargs)
    trials = {r.label: r for r in result.trials}
    assert "search" not in trials  # the warm start only
    megatron = {"family": "logical", "batch_axes": "dp", "logical_vocab": "tp",
                "logical_vocab_2": "tp", "logical_mlp": "tp", "logical_embed": "-",
                "logical_seq": "-", "logical_heads": "tp", "opt_state_axes": "-"}
    assert trials[LOGICAL_MEGATRON].params == trials["megatron"].params == megatron
    assert trials["dp"].params["batch_axes"] == "dp,tp"
    # FSDP splits each weight on its own largest dim: no logical assignment
    # does that, the rules family's AutoShardingRule over dp and tp does.
    assert trials["fsdp"].params["family"] == "rules"
    assert trials["fsdp"].params["batch_axes"] == "dp,tp"
    # Neither family builds the original design's default plan nor FSDP x TP.
    assert trials["default"].params == trials["fsdp_tp"].params == {}
    stored = {t.number: t for t in result.study.get_trials()}
    assert stored[trials["megatron"].number].distributions == {
        p.name: optuna.distributions.CategoricalDistribution(p.choices)
        for p in result.setup.space.params() if p.name in megatron}
    # A searched trial asked for a baseline's values compiles its program.
    expressed = [r for r in result.trials if r.params]
    for record in expressed:
        result.study.enqueue_trial(record.params)
    again = ss.optimize(workload, n_trials=len(expressed), **kwargs)
    searched = [r for r in again.trials if r.label == "search"]
    assert [r.params for r in searched] == [r.params for r in expressed]
    assert [r.outcome.fingerprint for r in searched] == [
        r.outcome.fingerprint for r in expressed]


def test_an_optuna_without_fixed_params_is_said_and_the_search_goes_on(mesh24, monkeypatch):
    from shardsearch.base.warnings import ShardsearchWarning
    from shardsearch.search import loop

    real = loop._Runner._express

    def express(self, trial, *args):
        return real(self, object(), *args)  # a trial without `_fixed_params`

    monkeypatch.setattr(loop._Runner, "_express", express)
    with pytest.warns(ShardsearchWarning, match="baselines' parameters are not recorded") \
            as caught:
        result = ss.optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=4,
                             objective="static", quiet=True, isolate=False,
                             storage=optuna.storages.InMemoryStorage())
    assert sum("_fixed_params" in str(w.message) for w in caught) == 1  # once per study
    assert all(not r.params for r in result.trials)
