"""The logical names a user already gave (`logical.user`): Linen's boxed params
and NNX metadata name the discovered axes; the dataflow still decides which
dims are coupled; a conflict is named. Flax's rules on the boxes
(`FlaxBoxRule`) give Flax's own specs, and a MaxText-style rules list starts a
search."""

import json
import os

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base.spec import canonical
from shardsearch.base.warnings import UserNamesConflictWarning
from shardsearch.logical.user import box_names, normalise_names, user_names
from shardsearch.rules.logical import FlaxBoxRule

if os.environ.get("CI") == "true":
    import flax  # under CI the flax extra is installed: a missing one fails
    import flax.linen as nn
    import optax
    from flax import nnx
else:
    flax = pytest.importorskip("flax")
    optax = pytest.importorskip("optax")
    import flax.linen as nn
    from flax import nnx

D, H, B = 8, 16, 4


def _boxed(names1=("width", "ff"), names2=None):
    """Linen-style boxed params, abstract: w1 named, w2 named only when asked. The
    names are ones discovery never invents, so finding them proves adoption."""
    w1 = nn.LogicallyPartitioned(jax.ShapeDtypeStruct((D, H), jnp.float32), names=names1)
    w2 = jax.ShapeDtypeStruct((H, D), jnp.float32)
    if names2 is not None:
        w2 = nn.LogicallyPartitioned(w2, names=names2)
    return {"w1": w1, "w2": w2}


def _residual_step(params, x):
    # x's feature dim, w1's rows and w2's columns are coupled (the residual);
    # w1's columns and w2's rows too (the matmul chain).
    w1, w2 = nn.unbox(params["w1"]), nn.unbox(params["w2"])
    y = x + (x @ w1) @ w2
    loss = jnp.mean(y * y)
    return jax.tree.map(lambda p: p * 0.9, params), {"loss": loss}


def _x():
    return jax.ShapeDtypeStruct((B, D), jnp.float32)


def _leaves(specs):
    """A spec tree's specs in leaf order, canonical (boxes and all)."""
    return [canonical(s) for s in jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P))]


def _names(axes, argument=0):
    return {leaf.path: leaf.names for leaf in axes.arguments[argument]}


# --------------------------------------------------------------------------- reading boxes


def test_box_names_read_linen_and_nnx_boxes_and_nothing_else():
    w = jnp.zeros((D, H))
    assert box_names(nn.LogicallyPartitioned(w, names=("embed", "mlp"))) == ("embed", "mlp")
    with flax.config.temp_flip_flag("always_shard_variable", False):
        assert box_names(nnx.Param(w, out_sharding=("embed", None))) == ("embed", None)
        assert box_names(nnx.Param(w)) is None
    assert box_names(w) is None
    assert normalise_names(P("embed", ("a", "b"), None)) == ("embed", None, None)
    assert normalise_names("embed") is None
    boxed = _boxed()
    assert user_names(boxed) == [("width", "ff"), None]  # leaves in key order


# --------------------------------------------------------------------------- adopt


def test_linen_boxes_name_their_dims_and_coupled_unnamed_dims_take_the_name():
    axes = ss.discover_logical_axes(_residual_step, (_boxed(), _x()))
    names = _names(axes)
    assert names["w1/value"] == ("width", "ff")
    # w2 has no box: its dims take the names of the dims they are coupled with.
    assert names["w2"] == ("ff", "width")
    assert {a.name for a in axes.axes} >= {"width", "ff"}
    assert _names(axes, 1)[""][1] == "width"  # x's features: the residual
    assert axes.conflicts == ()


def test_nnx_metadata_names_the_params_and_the_adam_moments():
    from shardsearch import flax as ssf

    class Tiny(nnx.Module):
        def __init__(self):
            self.w1 = nnx.Param(jnp.ones((D, H)), out_sharding=("width", "ff"))
            self.w2 = nnx.Param(jnp.ones((H, D)))

        def __call__(self, x):
            return x + (x @ self.w1[...]) @ self.w2[...]

    with flax.config.temp_flip_flag("always_shard_variable", False):
        model = Tiny()
    step, args = ssf.train_step(model, optax.adam(0.1), lambda m, x: jnp.mean(m(x) ** 2),
                                jnp.ones((B, D)))
    axes = ss.discover_logical_axes(step, args)
    names = _names(axes)
    assert names["params/w1/value"] == ("width", "ff")
    assert names["params/w2/value"] == ("ff", "width")
    for moment in ("mu", "nu"):
        assert names[f"opt_state/0/{moment}/w1/value"] == ("width", "ff")
        assert names[f"opt_state/0/{moment}/w2/value"] == ("ff", "width")
    assert axes.conflicts == ()


def test_names_given_beside_the_arguments_win_too():
    params = {"w1": jax.ShapeDtypeStruct((D, H), jnp.float32),
              "w2": jax.ShapeDtypeStruct((H, D), jnp.float32)}
    axes = ss.discover_logical_axes(_residual_step, (params, _x()),
                                    names=[{"w1": P("width", "ff"), "w2": None}, None])
    assert _names(axes) == {"w1": ("width", "ff"), "w2": ("ff", "width")}
    with pytest.raises(ValueError, match="one tree per argument"):
        ss.discover_logical_axes(_residual_step, (params, _x()), names=[None])
    with pytest.raises(ValueError, match="do not have the argument's structure"):
        ss.discover_logical_axes(_residual_step, (params, _x()),
                                 names=[{"w1": P("width", "ff")}, None])


def test_two_user_names_on_coupled_dims_are_a_conflict_naming_both():
    # w2's rows are coupled with w1's columns ("ff"), but the user called them "inner".
    axes = ss.discover_logical_axes(_residual_step,
                                    (_boxed(names2=("inner", "width")), _x()))
    assert len(axes.conflicts) == 1
    conflict = axes.conflicts[0]
    assert "'ff'" in conflict and "'inner'" in conflict and "w2" in conflict
    # The first name in leaf order names the axis; both leaves carry it.
    names = _names(axes)
    assert names["w1/value"] == ("width", "ff") and names["w2/value"] == ("ff", "width")
    assert "inner" not in {a.name for a in axes.axes}
    assert any(n.startswith("conflict:") and "'inner'" in n for n in axes.notes())


def test_names_of_another_rank_are_ignored_and_named():
    axes = ss.discover_logical_axes(_residual_step, (_boxed(names1=("width",)), _x()))
    assert len(axes.conflicts) == 1
    assert "w1" in axes.conflicts[0] and "ignored" in axes.conflicts[0]
    assert "width" not in {a.name for a in axes.axes}  # nothing else named it


def test_optimize_warns_a_conflict(mesh24, tmp_path):
    with pytest.warns(UserNamesConflictWarning, match=r"'ff'.*'inner'"):
        ss.optimize(_residual_step, (_boxed(names2=("inner", "width")), _x()),
                    mesh=mesh24, n_trials=1, storage=f"sqlite:///{tmp_path / 's.db'}",
                    study_name="conflict", warm_start=False, **_STATIC)


# --------------------------------------------------------------------------- Flax's rules

PAIRS = [("batch", "dp"), ("mlp", "tp"), ("embed", ("dp", "tp")), ("heads", "tp"),
         ("embed", "dp"), ("kv", None)]


def _model_boxes():
    shapes = {"wi": ((D, H), ("embed", "mlp")), "wo": ((H, D), ("mlp", "embed")),
              "q": ((D, 4, 2), ("embed", "heads", "kv")),
              "norm": ((D,), ("embed",)), "emb": ((32, D), ("vocab", "embed"))}
    return {k: nn.LogicallyPartitioned(jax.ShapeDtypeStruct(s, jnp.float32), names=n)
            for k, (s, n) in shapes.items()}


def test_flax_box_rule_gives_flaxs_specs(mesh24):
    boxed = _model_boxes()
    ours = FlaxBoxRule(mesh24, PAIRS).apply(boxed)
    theirs = nn.logical_to_mesh(nn.get_partition_spec(boxed), PAIRS)
    assert len(_leaves(ours)) == len(boxed)
    assert _leaves(ours) == _leaves(theirs)
    # Flax's fallback pair: embed takes dp once tp is used on the leaf.
    assert canonical(ours["wi"].value) == P("dp", "tp")
    assert FlaxBoxRule(mesh24, PAIRS).notes(boxed) == ()
    # A leaf in no box stays replicated, and says so.
    mixed = {**boxed, "bias": jax.ShapeDtypeStruct((H,), jnp.float32)}
    assert FlaxBoxRule(mesh24, PAIRS).apply(mixed)["bias"] == P()
    (note,) = FlaxBoxRule(mesh24, PAIRS).notes(mixed)
    assert note.startswith("unnamed:") and "bias" in note


def test_flax_box_rule_round_trips_and_checks_mesh_axes(mesh24):
    rule = FlaxBoxRule(mesh24, PAIRS)
    again = FlaxBoxRule.from_config(json.loads(json.dumps(rule.to_config())), mesh24, "t")
    assert again == rule
    with pytest.raises(ValueError, match="mesh axis 'fsdp', which is not in the mesh"):
        FlaxBoxRule(mesh24, [("embed", "fsdp")])
    with pytest.raises(TypeError, match=r"pairs\[0\] = \('embed',\) is not a"):
        FlaxBoxRule(mesh24, [("embed",)])


# --------------------------------------------------------------------------- start plans

_STATIC = dict(objective="static", quiet=True, confirm_rounds=0, isolate=False)
RULES = [["batch", "dp"], ["mlp", "tp"], ["embed", None]]


@pytest.mark.parametrize("form", ["list", "object"])
def test_a_maxtext_rules_list_starts_a_search(mesh24, tmp_path, form):
    boxed = {"w1": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((D, H), jnp.float32),
                                           names=("embed", "mlp")),
             "w2": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((H, D), jnp.float32),
                                           names=("mlp", "embed"))}
    path = tmp_path / "maxtext.json"
    path.write_text(json.dumps(RULES if form == "list" else {"logical_axis_rules": RULES,
                                                             "note": "from base.yml"}))
    result = ss.optimize(_residual_step, (boxed, _x()), mesh=mesh24, n_trials=1,
                         warm_start=False, start_from=[path],
                         storage=f"sqlite:///{tmp_path / 's.db'}", study_name=form, **_STATIC)
    assert [t.label for t in result.trials] == ["plan:maxtext"]
    pairs = [(n, e) for n, e in RULES]
    want = nn.logical_to_mesh(nn.get_partition_spec(boxed), pairs)
    assert _leaves(result.best_specs[0]) == _leaves(want)  # Flax's specs, on the boxes
    assert canonical(result.best_specs[0]["w1"].value) == P(None, "tp")
    assert result.best_specs[1] == P("dp")  # the batch from the `batch` pair


@pytest.mark.parametrize(("data", "match"), [
    ([], r"maxtext\.json: the logical_axis_rules list holds no pairs"),
    ({"logical_axis_rules": []}, r"maxtext\.json: the logical_axis_rules list holds no pairs"),
    ([["embed"]], r"maxtext\.json: a logical_axis_rules list must be a list .* pairs; item 0 is "
     r"\['embed'\]"),
    ([["embed", 3]], r"maxtext\.json: .*3 must be None, a mesh axis name"),
    ([["embed", "fsdp"]], r"maxtext\.json: .*mesh axis 'fsdp', which is not in the mesh"),
])
def test_a_bad_rules_list_is_one_clear_error(mesh24, tmp_path, data, match):
    path = tmp_path / "maxtext.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match) as err:
        ss.optimize(_residual_step, (_boxed(), _x()), mesh=mesh24, n_trials=1,
                    warm_start=False, start_from=[path],
                    storage=f"sqlite:///{tmp_path / 's.db'}", study_name="bad", **_STATIC)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("start plan: ")
