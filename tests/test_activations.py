"""Activation sharding points (issue 24 item 3): a step names its activations,
the search places them through the `act_<name>` knobs, and a plan rebuilds
the step it was found for."""

from __future__ import annotations

import dataclasses
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxprs import constraint_shardings, constraints

import shardsearch as ss
from shardsearch.base import activations as acts
from shardsearch.base.mesh import axis_sizes
from shardsearch.base.warnings import KINDS, ShardsearchWarning
from shardsearch.search import (
    Candidate,
    baseline_candidates,
    compare_outputs,
    evaluate,
    make_context,
    plan_config,
    resolve,
    rule_from_config,
)
from shardsearch.search.execution.transport import jaxpr_digest, package_step
from shardsearch.workloads import get_workload
from shardsearch.workloads._activations import ActivationSharding
from shardsearch.workloads._llama import LlamaConfig
from shardsearch.workloads._llama import build as build_llama

AXES = (("dp", 2), ("tp", 4))


def user_step(state, x):
    """A two-layer step whose hidden state is a named point."""

    def loss(params):
        h = acts.activation(jnp.tanh(x @ params["w1"]), ("batch", "hidden"))
        return jnp.mean((h @ params["w2"]) ** 2)

    value, grads = jax.value_and_grad(loss)(state)
    return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), {"loss": value}


def _user_args():
    rng = np.random.default_rng(0)
    state = {"w1": jnp.asarray(rng.standard_normal((16, 32)).astype(np.float32) * 0.1),
             "w2": jnp.asarray(rng.standard_normal((32, 16)).astype(np.float32) * 0.1)}
    return state, jnp.asarray(rng.standard_normal((64, 16)).astype(np.float32))


# ---------------------------------------------------------------- the seam


def test_a_point_is_nothing_without_rules_and_a_constraint_under_them():
    x = jax.ShapeDtypeStruct((8, 16, 32), jnp.float32)

    def f(v):
        return acts.activation(v * 2, ("batch", "seq", "embed"))

    assert constraints(f, x) == []
    with acts.activation_rules({"seq": "tp", "embed": None}, AXES):
        specs = constraints(lambda v: f(v), x)
    assert specs == [(jax.sharding.PartitionSpec.UNCONSTRAINED, "tp", None)]
    # On Auto axes, whatever the jax's default for an AbstractMesh (0.11's is
    # Explicit, where an unconstrained dim is refused).
    with acts.activation_rules({"seq": "tp", "embed": None}, AXES):
        (sharding,) = constraint_shardings(lambda v: f(v), x)
    assert set(sharding.mesh.axis_types) == {jax.sharding.AxisType.Auto}
    # Names no rule mentions: nothing traced.
    with acts.activation_rules({"heads": "tp"}, AXES):
        assert constraints(lambda v: f(v), x) == []


def test_the_seam_refuses_what_it_cannot_place():
    x = jnp.zeros((8, 16))
    with pytest.raises(ValueError, match=r"one name \(or None\) per dim .* shape \(8, 16\)"):
        acts.activation(x, ("batch",))
    with pytest.raises(ValueError, match=r"name mesh axes the mesh .* lacks"), \
            acts.activation_rules({"batch": "fsdp"}, AXES):
        pass


def test_a_later_dim_keeps_an_axis_two_dims_ask_for():
    x = jax.ShapeDtypeStruct((8, 16, 4, 2), jnp.float32)
    unconstrained = jax.sharding.PartitionSpec.UNCONSTRAINED
    with acts.activation_rules({"batch": "dp", "seq": "tp", "heads": "tp"}, AXES):
        specs = constraints(lambda v: acts.activation(v, ("batch", "seq", "heads", None)), x)
    assert specs == [("dp", unconstrained, "tp", unconstrained)]
    with acts.activation_rules({"batch": ("dp", "tp"), "seq": "tp"}, AXES):
        specs = constraints(lambda v: acts.activation(v, ("batch", "seq", None, None)), x)
    assert specs == [(unconstrained, "tp", unconstrained, unconstrained)]


def test_a_models_own_rules_fill_in_and_the_searchs_win():
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)

    def f(v):
        with acts.activation_rules({"batch": "dp", "seq": "dp"}, AXES, fill=True):
            return acts.activation(v, ("batch", "seq"))

    with acts.activation_rules({"seq": "tp"}, AXES):
        assert constraints(lambda v: f(v), x) == [("dp", "tp")]


def test_points_are_found_by_one_trace_with_their_sizes():
    workload = get_workload("llama:tiny")
    found = acts.points(workload.step, workload.abstract())
    assert found == {"batch": (8,), "seq": (32,), "embed": (64,), "heads": (4,),
                     "kv_heads": (2,), "mlp": (192,)}
    # Found again although JAX has traced the step since.
    jax.eval_shape(workload.step, *workload.abstract())
    assert acts.points(workload.step, workload.abstract()) == found


def test_choices_keep_only_groups_that_divide_every_size():
    groups = ("-", "dp", "tp", "dp,tp", "tp,dp")
    choices = acts.activation_choices({"kv_heads": (2,), "heads": (4, 8), "odd": (3,)},
                                      groups, AXES)
    assert choices == {"act_kv_heads": ("auto", "-", "dp"),
                       "act_heads": ("auto", "-", "dp", "tp")}


def test_split_setting_separates_the_steps_knobs_from_the_rules():
    own, rules = acts.split_setting((("remat", "full"), ("act_seq", "tp"),
                                     ("act_batch", "dp,tp"), ("act_mlp", "-"),
                                     ("act_embed", "auto")))
    assert own == (("remat", "full"),)
    assert rules == {"seq": "tp", "batch": ("dp", "tp"), "mlp": None}


# ---------------------------------------------------------------- the knobs


def test_knobs_true_offers_one_knob_per_point_and_the_default_is_the_step(mesh24):
    workload = get_workload("llama:tiny")
    ctx, _ = make_context(workload, None, mesh24, knobs=True)
    declared = ctx.knobs.describe()
    assert declared["act_seq"] == ["auto", "-", "dp", "tp", "dp,tp", "tp,dp"]
    assert declared["act_kv_heads"] == ["auto", "-", "dp"]  # 2 kv heads: tp=4 cannot split
    assert declared["remat"] and declared["microbatches"]
    args = ctx.abstract_args
    default = ctx.knobs.step(())
    assert jaxpr_digest(jax.make_jaxpr(default)(*args)) == jaxpr_digest(
        jax.make_jaxpr(workload.step)(*args))
    sequence = ctx.knobs.step((("act_seq", "tp"),))
    specs = constraints(sequence, *args)
    assert specs and all(s[1] == "tp" for s in specs if len(s) >= 3 and s[1] is not None)
    # Asked by name: only those, the others at their defaults.
    ctx, _ = make_context(workload, None, mesh24, knobs=("act_seq", "remat"))
    assert set(ctx.knobs.searched()) == {"act_seq", "remat"}


def test_activation_sharding_is_one_point_of_the_space(mesh24):
    """A workload built with `activation_sharding` traces the very program
    the search's `act_batch` knob gives the plain workload."""
    cfg = LlamaConfig(vocab=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192,
                      seq=32, batch=8)
    pinned = dataclasses.replace(cfg, activation_sharding=ActivationSharding(AXES, ("dp",)))
    plain, fixed = build_llama("llama:a", cfg), build_llama("llama:b", pinned)
    ctx, _ = make_context(plain, None, mesh24, knobs=("act_batch",))
    args = plain.abstract()
    searched = ctx.knobs.step((("act_batch", "dp"),))
    assert jaxpr_digest(jax.make_jaxpr(searched)(*args)) == jaxpr_digest(
        jax.make_jaxpr(fixed.step)(*args))
    # The search's choice overrides the model's own.
    ctx, _ = make_context(fixed, None, mesh24, knobs=("act_batch",))
    over = constraints(ctx.knobs.step((("act_batch", "tp"),)), *args)
    assert over and all(s[0] == "tp" for s in over)


def test_a_placed_step_computes_what_the_step_as_given_computes(mesh24):
    """Sequence parallelism and heads on tp change where values live, not
    what they are: the output check passes against the default step."""
    workload = get_workload("gpt:tiny")
    ctx, _ = make_context(workload, None, mesh24, knobs=True, warmup=1, repeats=2)
    dp = baseline_candidates(workload, mesh24)["dp"]
    specs, _ = resolve(dp, ctx)
    setting = ctx.knobs.setting({"act_seq": "tp", "act_heads": "tp", "act_batch": "dp"})
    match, worst = compare_outputs(specs, specs, ctx.with_setting(setting))
    assert match and worst < 1e-3


def test_no_knobs_for_a_step_without_points_or_knobs(mesh24):
    state = {"w": jnp.ones((16, 16))}
    with pytest.raises(ValueError, match="declares no knobs and places no activations"):
        make_context(lambda s, x: (s, {}), (state, jnp.ones((8, 16))), mesh24, knobs=True)


# ---------------------------------------------------------------- across processes


def test_a_worker_places_the_points_of_the_workload_it_rebuilds(mesh24):
    workload = get_workload("gpt:tiny")
    dp = baseline_candidates(workload, mesh24)["dp"]
    candidate = Candidate(dp.state_rule, dp.batch_rule, "dp",
                          knobs=(("act_seq", "tp"), ("act_batch", "dp")))
    outcomes = {}
    for isolate in (False, True):
        ctx, _ = make_context(workload, None, mesh24, knobs=True, isolate=isolate,
                              warmup=1, repeats=2)
        with ctx:
            specs, fp = resolve(candidate, ctx)
            outcomes[isolate] = evaluate(specs, fp, ctx.with_setting(candidate.knobs))
    assert outcomes[True].status.value == outcomes[False].status.value == "complete"
    assert outcomes[True].memory["temp"] == outcomes[False].memory["temp"]
    assert outcomes[True].flops == outcomes[False].flops


def test_a_placed_step_travels_by_reference_with_its_rules(mesh24):
    args = tuple(jax.eval_shape(lambda: _user_args()))
    knobs = acts.with_activation_knobs(None, user_step, {"act_hidden": ("auto", "tp")},
                                       tuple(axis_sizes(mesh24).items()))
    setting = (("act_hidden", "tp"),)
    program, why = package_step(knobs.step(setting), None, args, "cpu", knobs, setting)
    assert why == ""
    kind, step, _digest, rules = program
    assert (kind, step, rules) == ("function", user_step, {"hidden": "tp"})
    # The default setting still exports (nothing mesh-bound in it).
    program, why = package_step(user_step, None, args, "cpu", knobs, ())
    assert program[0] == "export"


def test_a_users_step_is_searched_exported_and_rebuilt_from_its_plan(mesh24, tmp_path):
    args = _user_args()
    result = ss.optimize(user_step, args, mesh=mesh24, knobs=True, n_trials=8, quiet=True,
                         storage=f"sqlite:///{tmp_path / 's.db'}", warmup=1, repeats=2,
                         confirm_rounds=0, isolate=False, seed=0)
    assert set(result.best_knobs) == {"act_batch", "act_hidden"}
    searched = [r for r in result.trials if any(n.startswith("act_") for n, _ in r.knobs)]
    assert searched, "no trial placed an activation"
    path = tmp_path / "plan.json"
    ss.write_config(ss.export_config(result, args=args), path)
    plan = ss.load_plan(path)
    assert set(json.loads(path.read_text())["knobs"]) == {"act_batch", "act_hidden"}
    rules = acts.split_setting(tuple(plan.knobs.items()))[1]
    built = plan.build_step(user_step)
    # The one point, placed as the plan's knobs say (forward and backward), or
    # nothing when they leave it to XLA; which knobs win depends on timing.
    want = {tuple(acts.placement(("batch", "hidden"), rules))} if rules else set()
    assert set(constraints(built, *args)) == want
    # Applied in the user's code: same numbers as the step as given.
    mesh_specs = plan.apply(args)
    placed = jax.device_put(args, jax.tree.map(
        lambda s: jax.sharding.NamedSharding(mesh24, s), mesh_specs,
        is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)))
    got = jax.jit(built)(*placed)[1]["loss"]
    want = user_step(*args)[1]["loss"]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5)


def test_a_plan_with_a_factorys_knobs_needs_the_factory(tmp_path, mesh24):
    dp = baseline_candidates(None, mesh24, _user_args())["dp"]
    path = tmp_path / "plan.json"
    ss.write_config(plan_config(dp.state_rule, dp.batch_rule, mesh24), path)
    plan = dataclasses.replace(ss.load_plan(path), knobs={"remat": "full", "act_seq": "tp"})
    with pytest.raises(ValueError, match=r"sets the step's knobs \{'remat': 'full'\}; pass "
                                         r"the Knobs"):
        plan.build_step(user_step)
    workload = get_workload("llama:tiny")
    built = plan.build_step(workload.knobs)
    specs = constraints(built, *workload.abstract())
    assert specs and all(s[1] == "tp" for s in specs if len(s) == 3)


def test_the_best_baseline_gets_one_sequence_parallel_variant(mesh24):
    from shardsearch.search.space.candidate import knob_variants

    workload = get_workload("llama:tiny")
    ctx, _ = make_context(workload, None, mesh24, knobs=True)
    dp = baseline_candidates(workload, mesh24)["dp"]
    variants = knob_variants(dp, ctx.knobs, ("tp",))
    act = {label: v.knobs for label, v in variants.items() if "act_" in label}
    # 2 kv heads: tp=4 is not offered to them, so the variant leaves them alone.
    assert act == {"dp~act_seq=tp,act_heads=tp,act_mlp=tp": (
        ("act_seq", "tp"), ("act_heads", "tp"), ("act_mlp", "tp"))}
    assert {label for label in variants if "act_" not in label} == {
        "dp~microbatches=2", "dp~microbatches=4", "dp~microbatches=8", "dp~remat=selective",
        "dp~remat=full"}
    # No tensor axis, no such variant.
    assert not any("act_" in label for label in knob_variants(dp, ctx.knobs, ()))


def test_a_plan_places_the_points_on_the_mesh_it_was_loaded_for(tmp_path, mesh24):
    dp = baseline_candidates(None, mesh24, _user_args())["dp"]
    path = ss.write_config(plan_config(dp.state_rule, dp.batch_rule, mesh24), tmp_path / "p.json")
    other = ss.abstract_mesh((4, 2), ("dp", "tp"))
    plan = dataclasses.replace(ss.load_plan(path, mesh=other), knobs={"act_hidden": "tp"})
    jaxpr = jax.make_jaxpr(plan.build_step(user_step))(*_user_args())
    found = [e.params["sharding"] for e in jaxpr.eqns if e.primitive.name == "sharding_constraint"]
    found += [e.params["sharding"] for eqn in jaxpr.eqns for value in eqn.params.values()
              for e in getattr(getattr(value, "jaxpr", None), "eqns", ())
              if e.primitive.name == "sharding_constraint"]
    assert found and all(dict(s.mesh.shape) == {"dp": 4, "tp": 2} for s in found)


def test_a_point_no_axis_can_split_is_said_not_dropped(mesh24):
    """Three rows cannot be split over dp=2 or tp=4: asked by name, the error
    says so; under knobs=True, a warning does."""

    def odd_step(state, x):
        def loss(params):
            h = acts.activation(jnp.tanh(x @ params["w1"]), ("rows", "hidden"))
            return jnp.mean(h ** 2)

        value, grads = jax.value_and_grad(loss)(state)
        return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), {"loss": value}

    args = ({"w1": jnp.zeros((16, 32), jnp.float32)}, jnp.ones((3, 16), jnp.float32))
    with pytest.raises(ValueError, match=r"knobs \['act_rows'\] cannot be offered: act_rows: no "
                                         r"group of the mesh's axes \(dp=2, tp=4\) divides its "
                                         r"sizes \[3\]"):
        make_context(odd_step, args, mesh24, knobs=("act_rows",))
    with pytest.warns(ShardsearchWarning, match=r"act_rows: no group"):
        ctx, _ = make_context(odd_step, args, mesh24, knobs=True)
    assert set(ctx.knobs.searched()) == {"act_hidden"}


def test_on_one_device_a_point_is_not_placed_and_only_a_name_asked_for_says_why():
    """Planning remat and microbatches for one chip: no point can be split,
    which is no news under knobs=True (no warning; the step's other knobs are
    searched), an error naming the one device when a point is asked for by
    name, and one saying so when the points were all the step had."""
    one = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("dp",),
                            axis_types=(jax.sharding.AxisType.Auto,))
    workload = get_workload("gpt:tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShardsearchWarning)
        ctx, _ = make_context(workload, None, one, objective="static", knobs=True)
    searched = set(ctx.knobs.searched())
    ctx.close()
    assert "remat" in searched and not [n for n in searched if n.startswith("act_")]
    with pytest.raises(ValueError, match=r"knobs \['act_embed'\] cannot be offered: act_embed: "
                                         r"the mesh \(dp=1\) has one device"):
        make_context(workload, None, one, objective="static", knobs=("act_embed",))
    with pytest.raises(ValueError, match=r"the mesh can split none of its named activations"):
        make_context(user_step, _user_args(), one, knobs=True)


def test_an_activation_may_follow_the_logical_assignment_of_its_name(mesh24):
    """`act_<name>=logical`: the point goes where the candidate's logical
    assignment puts the parameters' axis of that name (Flax's one placement
    per name); in a rules-family candidate, XLA's."""
    import optuna

    from shardsearch.search.space.baselines import make_space

    workload = get_workload("llama:tiny")
    ctx, _ = make_context(workload, None, mesh24, knobs=("act_heads", "act_seq"))
    space = make_space(mesh24, ctx.abstract_args[0], space="both", step=ctx.step,
                       args=ctx.abstract_args, knobs=ctx.knobs)
    knobs = {p.name: p.values() for p in space.params() if p.name.startswith("knob_")}
    # heads is a logical axis the family assigns; seq, which it never places, is not.
    assert knobs["knob_act_heads"][-1] == "logical" and "logical" not in knobs["knob_act_seq"]
    assert space.joint_knobs() == {"act_heads"}

    def candidate(family, heads):
        chosen = {"family": family, "logical_heads": heads, "knob_act_heads": "logical",
                  "knob_act_seq": "auto"}
        values = {}
        for param in space.params():
            if param.applies(values):
                values[param.name] = chosen.get(param.name, param.values()[0])
        return space.suggest(optuna.trial.FixedTrial(values))

    assert candidate("logical", "dp").knobs == (("act_heads", "dp"),)
    assert candidate("logical", "-").knobs == (("act_heads", "-"),)
    assert candidate("rules", None).knobs == ()  # no assignment: XLA's
    # A space without the logical family offers no such value.
    rules_only = make_space(mesh24, ctx.abstract_args[0], space="rules", knobs=ctx.knobs)
    assert all("logical" not in p.values() for p in rules_only.params())


# ---------------------------------------------------------------- expert plans pin the batch


def _gpt_odd_vocab():
    """A GPT whose vocabulary no mesh axis divides: FSDP splits its embedding
    table's d_model dim over the axes that split the tokens' batch."""
    from shardsearch.workloads._gpt import GPTConfig
    from shardsearch.workloads._gpt import build as build_gpt

    return build_gpt("gpt:odd", GPTConfig(batch=8, seq=32, vocab=250, d_model=64, n_layers=1,
                                          n_heads=4, d_ff=128))


def test_the_expert_plans_pin_the_batch_of_the_activations_to_its_split(mesh24):
    from shardsearch.search.space.baselines import pin_batch

    workload = _gpt_odd_vocab()
    ctx, _ = make_context(workload, None, mesh24, objective="static")
    args = ctx.abstract_args
    assert ctx.knobs is None and "act_batch" in ctx.builds.choices
    baselines = pin_batch(baseline_candidates(workload, mesh24), ctx.builds, args,
                          axis_sizes(mesh24))
    assert {label: c.knobs for label, c in baselines.items()} == {
        "replicated": (), "default": (),  # no expert's plan
        "dp": (("act_batch", "dp,tp"),), "fsdp": (("act_batch", "dp,tp"),),
        "megatron": (("act_batch", "dp"),), "fsdp_tp": (("act_batch", "dp"),)}
    # What the pin is for: at the embedding lookup XLA gives the axes the table
    # and the tokens both ask for to the table, and without the pin the
    # activations after it hold the whole batch on every device.
    fsdp = baselines["fsdp"]
    specs, fp = resolve(fsdp, ctx)
    pinned = evaluate(specs, fp, ctx.with_setting(fsdp.knobs), run=False)
    loose = evaluate(specs, _fingerprint(specs), ctx, run=False)
    assert pinned.memory["total"] < 0.7 * loose.memory["total"], (pinned.memory, loose.memory)
    # Whatever knobs the search chooses, act_batch among them or not.
    for knobs in (("remat",), ("act_batch",)):
        ctx, _ = make_context(workload, None, mesh24, objective="static", knobs=knobs)
        chosen = pin_batch(baseline_candidates(workload, mesh24), ctx.builds, args,
                           axis_sizes(mesh24))
        assert chosen["fsdp"].knobs == (("act_batch", "dp,tp"),)


def test_a_search_of_other_knobs_holds_act_batch_and_pins_as_a_plain_one(mesh24, tmp_path):
    """`knobs=("remat",)`: act_batch is held (`Knobs.holding`: any value in a
    setting, never searched), so the experts run pinned, the best one's
    remat variants keep its pin, the proposals are pinned, and the winner's
    export carries its pin."""
    workload = _gpt_odd_vocab()
    ctx, _ = make_context(workload, None, mesh24, objective="static", knobs=("remat",))
    assert ctx.knobs.held == ("act_batch",) and list(ctx.knobs.searched()) == ["remat"]
    assert ctx.pins_proposals
    result = ss.optimize(workload, mesh=mesh24, objective="static", n_trials=10,
                         knobs=("remat",), quiet=True, isolate=False, seed=0,
                         storage=f"sqlite:///{tmp_path / 's.db'}", space="rules")
    ran = {t.label: dict(t.knobs) for t in result.trials}
    assert ran["fsdp"] == {"act_batch": "dp,tp"} and ran["megatron"] == {"act_batch": "dp"}
    variants = [label for label in ran if "~remat=" in label]
    assert len(variants) == 2 and all(ran[v]["act_batch"] == ran[v.split("~")[0]]["act_batch"]
                                      for v in variants)
    # Each proposal on the axes that split its batch, where act_batch offers them.
    proposals = [t for t in result.trials if t.label == "search"]
    offered = ctx.builds.choices["act_batch"]
    for t in proposals:
        proposal = Candidate(rule_from_config(t.state_rule, mesh24, "state"),
                             rule_from_config(t.batch_rule, mesh24, "batch"))
        split = ",".join(proposal.batch_axes(ctx.abstract_args)[1])
        assert dict(t.knobs).get("act_batch") == (split if split in offered else None), t
    assert any("act_batch" in dict(t.knobs) for t in proposals)
    assert "knob_act_batch" not in result.trials[-1].params
    config = ss.export_config(result, workload=workload)
    assert config["knobs"]["act_batch"] == dict(result.best_knobs)["act_batch"] != "auto"


def test_an_expert_no_act_batch_value_can_pin_is_named(mesh24):
    from shardsearch.base.warnings import UnpinnedBatchWarning
    from shardsearch.search.space.baselines import pin_notes

    workload = _gpt_odd_vocab()
    ctx, _ = make_context(workload, None, mesh24, objective="static")
    experts = baseline_candidates(workload, mesh24)
    sizes = axis_sizes(mesh24)
    assert pin_notes(experts, ctx.builds, ctx.abstract_args, sizes) == ()
    # An act_batch without the dp,tp group: dp and fsdp split the batch so.
    narrow = ctx.builds.narrowed("act_batch", lambda v: v != "dp,tp")
    (text,) = pin_notes(experts, narrow, ctx.abstract_args, sizes)
    assert text.startswith("unpinned: no act_batch value names the batch split of "
                           "dp (batch over dp,tp), fsdp (batch over dp,tp): ")
    assert "megatron" not in text
    assert issubclass(KINDS["unpinned"], UnpinnedBatchWarning)


def _fingerprint(specs):
    from shardsearch.search import fingerprint

    return fingerprint(specs)


def test_a_pinned_expert_wins_exports_and_starts_a_search_with_its_pin(mesh24, tmp_path):
    """A search that chooses no knob still runs the experts pinned; the plan
    file of a pinned winner keeps the pin, and a search started from it runs
    it, with no warning that it was dropped."""
    workload = _gpt_odd_vocab()
    storage = f"sqlite:///{tmp_path / 's.db'}"
    result = ss.optimize(workload, mesh=mesh24, objective="static", n_trials=4, quiet=True,
                         storage=storage, isolate=False, seed=0)
    ran = {r.label: r.knobs for r in result.trials}
    assert ran["fsdp"] == (("act_batch", "dp,tp"),) and ran["replicated"] == ()
    fsdp = next(r for r in result.trials if r.label == "fsdp")
    path = tmp_path / "fsdp.json"
    ss.write_config(ss.export_config(result, workload=workload, trial=fsdp.number), path)
    assert json.loads(path.read_text())["knobs"] == {"act_batch": "dp,tp"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShardsearchWarning)
        # Replicated (the reference) first, then the start plan.
        again = ss.optimize(workload, mesh=mesh24, objective="static", n_trials=2, quiet=True,
                            storage=storage, study_name="again", isolate=False, seed=0,
                            start_from=[path])
    start = next(r for r in again.trials if r.label == "plan:fsdp")
    assert start.knobs == (("act_batch", "dp,tp"),)
    assert start.outcome.fingerprint == fsdp.outcome.fingerprint


def test_a_search_without_knobs_pins_its_own_proposals_too(mesh24, tmp_path):
    """Each searched candidate runs with its activations' batch on its own
    batch split, as the experts do, unless the search chooses `act_batch`
    itself: then the sampler's value stands."""
    from shardsearch.search import rule_from_config

    workload = _gpt_odd_vocab()
    args, sizes = workload.abstract(), axis_sizes(mesh24)

    def split(record):
        candidate = Candidate(rule_from_config(record.state_rule, mesh24),
                              rule_from_config(record.batch_rule, mesh24))
        return ",".join(a for a in candidate.batch_axes(args)[1] if sizes[a] > 1)

    storage = f"sqlite:///{tmp_path / 's.db'}"
    result = ss.optimize(workload, mesh=mesh24, objective="static", n_trials=12, quiet=True,
                         storage=storage, isolate=False, seed=0)
    searched = [r for r in result.trials if r.label == "search" and not r.outcome.cache_hit]
    assert searched
    assert [dict(r.knobs).get("act_batch", "") for r in searched] == [split(r) for r in searched]
    chosen = ss.optimize(workload, mesh=mesh24, objective="static", n_trials=12, quiet=True,
                         storage=storage, study_name="chosen", isolate=False, seed=0,
                         knobs=("act_batch",))
    proposals = [r for r in chosen.trials if r.label == "search"]
    assert proposals and any(dict(r.knobs).get("act_batch", "auto") != split(r)
                             for r in proposals)
