"""Flax's `nn.with_logical_constraint` names are the search's activation points
(issue 26 item 2): `shardsearch.flax.constraint_points` makes the model's
unpinned calls `shardsearch.activation` points while a search traces, and
leaves Flax's own function to run everywhere else."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jaxprs import constraints

import shardsearch as ss
from shardsearch.base import activations as acts
from shardsearch.search import make_context
from shardsearch.search.space.logical import split_rules

if os.environ.get("CI") == "true":
    import flax.linen as nn  # under CI the flax extra is installed: a missing one fails
    import optax
    from flax import nnx
else:
    pytest.importorskip("flax")
    optax = pytest.importorskip("optax")
    import flax.linen as nn
    from flax import nnx

from shardsearch import flax as ssf

AXES = (("dp", 2), ("tp", 4))
UNCONSTRAINED = P.UNCONSTRAINED


@pytest.fixture(autouse=True)
def flaxs_own_function(monkeypatch):
    """Each test starts with Flax's function in place, as a fresh process has it,
    so that what installs the points is the code under test."""
    fn = nn.with_logical_constraint
    monkeypatch.setattr(nn, "with_logical_constraint", getattr(fn, "__wrapped__", fn))


class Block(nnx.Module):
    """An NNX MLP naming its activations as MaxText does, through Linen's
    `nn.with_logical_constraint` (names discovery never invents)."""

    def __init__(self, rngs):
        self.wi = nnx.Linear(16, 32, use_bias=False, rngs=rngs)
        self.wo = nnx.Linear(32, 16, use_bias=False, rngs=rngs)

    def __call__(self, x):
        x = nn.with_logical_constraint(x, ("activation_batch", "activation_embed"))
        h = nn.with_logical_constraint(jax.nn.gelu(self.wi(x)),
                                       ("activation_batch", "activation_mlp"))
        return self.wo(h)


def _loss(model, x):
    return jnp.mean(model(x) ** 2)


def _step_and_args():
    model = Block(nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((8, 16)), jnp.float32)
    return ssf.train_step(model, optax.adamw(1e-2), _loss, x)


def test_points_are_the_models_names_with_their_sizes():
    step, args = _step_and_args()
    assert acts.points(step, args) == {"activation_batch": (8,), "activation_embed": (16,),
                                       "activation_mlp": (32,)}


def test_the_searchs_rules_place_them_and_outside_a_search_flax_runs():
    step, args = _step_and_args()
    # Outside a search: Flax's function, a no-op without Flax's rules.
    assert constraints(step, *args) == []
    with acts.activation_rules({"activation_mlp": "tp", "activation_batch": "dp"}, AXES):
        specs = constraints(lambda *a: step(*a), *args)
    # Forward: x and h; the backward pass carries the same constraints on the cotangents.
    assert ("dp", "tp") in specs and ("dp", UNCONSTRAINED) in specs
    assert set(specs) == {("dp", "tp"), ("dp", UNCONSTRAINED)}


def test_a_pinned_call_is_flaxs_own(mesh24):
    """Flax's rules active, or `rules=`/`mesh=` passed: the user pinned it, and
    Flax resolves it as it would without shardsearch, inside a search too."""
    ssf.constraint_points()
    x = jax.ShapeDtypeStruct((8, 32), jnp.float32)
    pairs = [("activation_batch", "dp"), ("activation_mlp", "tp")]

    def pinned(v):
        return nn.with_logical_constraint(v, ("activation_batch", "activation_mlp"),
                                          rules=pairs, mesh=mesh24)

    flaxs = nn.with_logical_constraint.__wrapped__
    want = constraints(lambda v: flaxs(v, ("activation_batch", "activation_mlp"),
                                        rules=pairs, mesh=mesh24), x)
    assert want == [("dp", "tp")]
    with acts.activation_rules({"activation_mlp": "dp"}, AXES):
        assert constraints(lambda v: pinned(v), x) == want
    seen = acts.points(pinned, (x,))
    assert seen == {}  # a pinned call is not a point the search could move
    # Every argument reaches Flax as given, positional ones too.
    from flax.linen.spmd import RulesFallback

    strict = RulesFallback.RAISE_ERROR
    with pytest.raises(ValueError, match="did not match a rule"):
        jax.make_jaxpr(lambda v: nn.with_logical_constraint(
            v, ("activation_batch", "other"), pairs, mesh24, strict))(x)

    def in_rules(v):
        with nn.logical_axis_rules(pairs):
            return nn.with_logical_constraint(v, ("activation_batch", "activation_mlp"))

    assert acts.points(in_rules, (x,)) == {}


def test_unnamed_dims_are_whole_as_flax_keeps_them_and_too_many_names_are_refused():
    ssf.constraint_points()
    x = jax.ShapeDtypeStruct((8, 4, 32), jnp.float32)
    with acts.activation_rules({"activation_batch": "dp"}, AXES):
        specs = constraints(lambda v: nn.with_logical_constraint(
            v, P("activation_batch", UNCONSTRAINED)), x)
    # Past the names, a dim is kept whole, as Flax's rules keep it; UNCONSTRAINED is XLA's.
    assert specs == [("dp", UNCONSTRAINED, None)]
    with pytest.raises(ValueError, match=r"nn.with_logical_constraint: names .* more than the "
                                         r"3 dims .*shape \(8, 4, 32\)"), \
            acts.activation_rules({"activation_batch": "dp"}, AXES):
        jax.make_jaxpr(lambda v: nn.with_logical_constraint(v, ("a", "b", "c", "d")))(x)


def test_a_tree_of_values_takes_a_tree_of_names():
    ssf.constraint_points()
    tree = {"q": jax.ShapeDtypeStruct((8, 16), jnp.float32),
            "k": jax.ShapeDtypeStruct((8, 4), jnp.float32)}
    names = {"q": ("activation_batch", "activation_heads"), "k": None}
    seen = acts.points(lambda t: nn.with_logical_constraint(t, names), (tree,))
    assert seen == {"activation_batch": (8,), "activation_heads": (16,)}


def test_knobs_are_offered_for_the_models_names(mesh24):
    step, args = _step_and_args()
    ctx, _ = make_context(step, args, mesh24, knobs=True)
    declared = ctx.knobs.describe()
    assert set(declared) == {"act_activation_batch", "act_activation_embed",
                             "act_activation_mlp"}
    assert declared["act_activation_mlp"] == ["auto", "-", "dp", "tp", "dp,tp", "tp,dp"]


def test_a_flax_step_is_searched_with_its_names_and_rebuilt_from_its_plan(mesh24, tmp_path):
    step, args = _step_and_args()
    result = ss.optimize(step, args, mesh=mesh24, knobs=True, n_trials=8, quiet=True,
                         storage=f"sqlite:///{tmp_path / 's.db'}", warmup=1, repeats=2,
                         confirm_rounds=0, isolate=False, seed=0)
    names = {"act_activation_batch", "act_activation_embed", "act_activation_mlp"}
    assert set(result.best_knobs) == names
    placed_trials = [r for r in result.trials
                     if any(n in names and v != "auto" for n, v in r.knobs)]
    assert placed_trials, "no trial placed one of the model's activations"
    path = ss.write_config(ss.export_config(result), tmp_path / "plan.json")
    assert set(json.loads(path.read_text())["knobs"]) == names
    plan = ss.load_plan(path)
    chosen = {n: v for n, v in plan.knobs.items() if v != "auto"}
    built = plan.build_step(step)
    assert bool(constraints(built, *args)) == bool(chosen)
    got = jax.jit(built)(*args)[1]["loss"]
    np.testing.assert_allclose(np.asarray(got), np.asarray(step(*args)[1]["loss"]), rtol=1e-5)


# ---------------------------------------------------------------- back through Flax's rules


class Sequence3(nnx.Module):
    """Activations `(batch, length, ...)` named as MaxText names them; two of a
    point's dims can ask for one mesh axis (length and mlp on tp)."""

    def __init__(self, rngs, names_on_params=False, unnamed=False):
        self.unnamed = unnamed  # a dim named None: whole under Flax's rules
        init = nnx.initializers.lecun_normal()
        if names_on_params:  # the kernel says "activation_mlp" too
            init = nnx.with_partitioning(init, ("activation_embed", "activation_mlp"))
        self.wi = nnx.Linear(16, 32, use_bias=False, kernel_init=init, rngs=rngs)
        self.wo = nnx.Linear(32, 16, use_bias=False, rngs=rngs)

    def __call__(self, x):
        x = nn.with_logical_constraint(
            x, ("activation_batch", "activation_length", "activation_embed"))
        h = nn.with_logical_constraint(jax.nn.gelu(self.wi(x)),
                                       ("activation_batch", "activation_length", "activation_mlp"))
        h = nn.with_logical_constraint(h, ("activation_batch", P.UNCONSTRAINED, None)
                                       if self.unnamed else
                                       ("activation_batch", "activation_length", P.UNCONSTRAINED))
        return self.wo(h)


def _sequence_step(names_on_params=False, unnamed=False):
    import flax

    flax.config.update("flax_always_shard_variable", False)
    model = Sequence3(nnx.Rngs(0), names_on_params, unnamed)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((8, 4, 16)), jnp.float32)
    return ssf.train_step(model, optax.sgd(1e-2), _loss, x)


def _flax_file(step, args, mesh, placed, tmp_path, assignment=None):
    """A logical plan of `step` (every discovered axis whole but batch on dp,
    unless `assignment`), with the activation knobs `placed` and the step's
    Flax constraints, as export_config records them; written as flax-rules."""
    from shardsearch.search import plan_config

    axes = ss.discover_logical_axes(step, args)
    assignment = assignment or {a.name: ("dp" if a.name == "batch" else None) for a in axes.axes}
    state_rule, batch_rule = split_rules(mesh, axes, assignment)
    config = plan_config(state_rule, batch_rule, mesh, args=args)
    _, named = acts.trace_points(step, args)
    config["flax_points"] = [[acts.name_to_json(n) for n in names]
                             for names, whole in named.items() if whole]
    config["knobs"] = {f"act_{n}": v for n, v in placed.items()}
    return ss.write_config(config, tmp_path / "rules.json", format="flax-rules")


def _placed_specs(specs):
    """Constraint specs that constrain something, canonical (a constraint
    leaving every dim to XLA is no constraint)."""
    from shardsearch.base.spec import canonical

    return [canonical(P(*s)) for s in specs if any(e is not UNCONSTRAINED for e in s)]


@pytest.mark.parametrize("placed", [
    {"activation_length": "tp", "activation_mlp": "tp", "activation_batch": "dp"},
    {"activation_embed": "tp", "activation_length": "-"},
    {},
], ids=["sequence-parallel", "embed-on-tp", "all-to-xla"])
def test_flaxs_own_rules_place_the_constraints_as_the_search_traced_them(
        mesh24, tmp_path, placed):
    step, args = _sequence_step()
    path = _flax_file(step, args, mesh24, placed, tmp_path)
    rules = ssf.rules_from_file(path)
    # The search's program: the knobs' rules on the step.
    rules_of = acts.split_setting(tuple((f"act_{n}", v) for n, v in placed.items()))[1]
    ours = constraints(acts.under_rules(step, rules_of, AXES), *args)
    # The user's program: Flax's function under the exported rules and a mesh.
    with jax.set_mesh(mesh24), nn.logical_axis_rules(rules):
        theirs = constraints(lambda *a: step(*a), *args)
    assert len(theirs) == 5  # three constraints, two on the cotangents (x has none)
    assert _placed_specs(theirs) == _placed_specs(ours)
    # The file reads back as the parameters' rule, its activation pairs aside.
    assert ss.load_rule(path, mesh24).apply(args[0]) == split_rules(
        mesh24, ss.discover_logical_axes(step, args), {
            a.name: ("dp" if a.name == "batch" else None)
            for a in ss.discover_logical_axes(step, args).axes})[0].apply(args[0])
    if placed.get("activation_mlp") == "tp":
        # mlp keeps tp at the hidden state, so length (an earlier dim) is XLA's there.
        assert P("dp", UNCONSTRAINED, "tp") in _placed_specs(ours)


def test_a_name_on_parameters_and_activations_that_flax_would_place_alike_is_refused(
        mesh24, tmp_path):
    step, args = _sequence_step(names_on_params=True)
    axes = ss.discover_logical_axes(step, args)
    assignment = {a.name: ("tp" if a.name == "activation_mlp" else None) for a in axes.axes}
    from shardsearch.rules.logical import FlaxRulesMismatch

    with pytest.raises(FlaxRulesMismatch, match=r"'activation_mlp' also names parameters"):
        _flax_file(step, args, mesh24, {"activation_batch": "dp"}, tmp_path, assignment)
    # Where the knobs place them as the parameters' pairs do, Flax agrees.
    path = _flax_file(step, args, mesh24, {"activation_mlp": "tp", "activation_embed": "-"},
                      tmp_path, assignment)
    assert ("activation_mlp", "tp") in ssf.rules_from_file(path)


def test_a_dim_named_none_in_a_point_the_search_left_alone_is_refused(mesh24, tmp_path):
    """Flax keeps it whole, the search left the whole point to XLA."""
    from shardsearch.rules.logical import FlaxRulesMismatch

    step, args = _sequence_step(unnamed=True)
    with pytest.raises(FlaxRulesMismatch, match=r"point \('activation_batch', UNCONSTRAINED, "
                                                r"None\).*Flax keeps a dim named None whole"):
        _flax_file(step, args, mesh24, {"activation_mlp": "tp"}, tmp_path)
    # Placed through its batch, the point is constrained in the search too: agreed.
    _flax_file(step, args, mesh24, {"activation_batch": "dp"}, tmp_path)


def test_the_study_records_the_steps_flax_constraints_for_export(mesh24, tmp_path):
    step, args = _sequence_step()
    result = ss.optimize(step, args, mesh=mesh24, knobs=("act_activation_length",), n_trials=3,
                         quiet=True, storage=f"sqlite:///{tmp_path / 's.db'}", warmup=1,
                         repeats=1, confirm_rounds=0, isolate=False, seed=0, space="logical")
    config = ss.export_config(result)
    assert config["flax_points"] == [
        ["activation_batch", "activation_length", "activation_embed"],
        ["activation_batch", "activation_length", "activation_mlp"],
        ["activation_batch", "activation_length", "UNCONSTRAINED"]]
    # Recorded in the study: a stored study exports them too, without the step.
    assert ss.export_config(result.study, args=args)["flax_points"] == config["flax_points"]
    with pytest.raises(ValueError, match="not a flax-rules file"):
        ssf.rules_from_file(ss.write_config(config, tmp_path / "plan.json"))


# ---------------------------------------------------------------- start plans


MAXTEXT = [["batch", "dp"], ["activation_batch", "dp"], ["activation_length", "tp"],
           ["activation_mlp", "tp"], ["activation_embed", None], ["mlp", "tp"]]


def test_a_maxtext_list_places_the_models_constraints_in_its_start_plan(mesh24, tmp_path):
    """The list's activation pairs are what Flax would place the model's
    constraints by: the start plan runs with them as its act_ knobs."""
    from shardsearch.search.space.baselines import StartPlanWarning, start_candidates

    step, args = _sequence_step()
    path = tmp_path / "maxtext.json"
    path.write_text(json.dumps(MAXTEXT))
    ctx, _ = make_context(step, args, mesh24, knobs=True)
    names = [n for point in ctx.flax_points for n in point if isinstance(n, str)]
    start = start_candidates([path], mesh24, ctx.knobs, names)["plan:maxtext"]
    # Declaration order; activation_embed=None is "-"; the parameters' pairs are no knobs.
    assert start.knobs == (("act_activation_batch", "dp"), ("act_activation_length", "tp"),
                           ("act_activation_embed", "-"), ("act_activation_mlp", "tp"))
    # A search that places no activations runs it without them, and says so.
    plain, _ = make_context(step, args, mesh24)
    with pytest.warns(StartPlanWarning, match=r"maxtext\.json'.*runs without "
                                              r"act_activation_batch=dp.*knobs: none"):
        start = start_candidates([path], mesh24, plain.knobs, names)["plan:maxtext"]
    assert start.knobs == ()


def test_a_plan_file_starts_with_its_knobs(mesh24, tmp_path):
    from shardsearch.search.space.baselines import StartPlanWarning, start_candidates

    step, args = _step_and_args()
    first = ss.optimize(step, args, mesh=mesh24, knobs=True, n_trials=1, quiet=True,
                        storage=f"sqlite:///{tmp_path / 's.db'}", warmup=1, repeats=1,
                        confirm_rounds=0, isolate=False, seed=0, warm_start=False)
    config = ss.export_config(first)
    config["knobs"] = {**config["knobs"], "act_activation_mlp": "tp"}
    path = ss.write_config(config, tmp_path / "mine.json")
    ctx, _ = make_context(step, args, mesh24, knobs=True)
    start = start_candidates([path], mesh24, ctx.knobs)["plan:mine"]
    assert ("act_activation_mlp", "tp") in start.knobs
    # The search runs it so: the trial records the knobs.
    again = ss.optimize(step, args, mesh=mesh24, knobs=True, n_trials=1, quiet=True,
                        storage=f"sqlite:///{tmp_path / 's.db'}", study_name="again", warmup=1,
                        repeats=1, confirm_rounds=0, isolate=False, seed=0, warm_start=False,
                        start_from=[path])
    assert [(t.label, dict(t.knobs).get("act_activation_mlp")) for t in again.trials] == [
        ("plan:mine", "tp")]
    # A value the search does not offer, or a knob it does not vary: warned, left out.
    config["knobs"] = {"act_activation_mlp": "dp,dp", "remat": "full"}
    path = ss.write_config(config, tmp_path / "mine.json")
    with pytest.warns(StartPlanWarning, match=r"runs without act_activation_mlp=dp,dp, "
                                              r"remat=full"):
        assert start_candidates([path], mesh24, ctx.knobs)["plan:mine"].knobs == ()
