"""`plan_differences`: the dimensions in which two plans for one step differ."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from shardsearch.search import plan_differences
from shardsearch.workloads import get_workload


@pytest.fixture(scope="module")
def args():
    return get_workload("mlp:tiny").abstract()


WHOLE = P()


def _specs(args, params=WHOLE, moments=WHOLE, batch=WHOLE):
    """Spec trees for `(state, batch)`: every non-scalar leaf of a group gets its spec."""

    def state_spec(path, leaf):
        if not leaf.shape:
            return P()
        keys = [getattr(k, "key", None) for k in path]
        return moments if keys[0] == "opt" else params

    state, batch_tree = args
    return (jax.tree_util.tree_map_with_path(state_spec, state),
            jax.tree.map(lambda x: batch if x.shape else P(), batch_tree))


def _count(tree, keep=lambda path: True):
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return sum(1 for path, _ in leaves if keep([getattr(k, "key", None) for k in path]))


def test_the_same_plan_differs_in_nothing(args):
    assert plan_differences(args, _specs(args, P("dp")), _specs(args, P("dp"))) == []
    # One spelling per meaning: P(("dp",)) is P("dp").
    assert plan_differences(args, _specs(args, P(("dp",))), _specs(args, P("dp"))) == []


def test_each_group_of_leaves_is_named_with_how_many_differ(args):
    state, batch = args
    params = _count(state["params"])
    moments = _count(state["opt"], lambda path: path[0] in ("mu", "nu"))
    opt_leaves = _count(state["opt"])
    zero = _specs(args, moments=P("dp"), batch=P("dp"))
    dp = _specs(args, batch=P("dp"))
    # ZeRO-style: only the moments' split differs, not the parameters'.
    assert plan_differences(args, zero, dp) == [
        f"optimizer state: {moments} of {opt_leaves} leaves"]
    fsdp = _specs(args, P("dp"), P("dp"), P("dp"))
    assert plan_differences(args, fsdp, _specs(args)) == [
        f"parameters: {params} of {params} leaves",
        f"optimizer state: {moments} of {opt_leaves} leaves",
        f"batch: {_count(batch)} of {_count(batch)} leaves"]


def test_knobs_name_both_values_and_activation_points_go_together(args):
    specs = _specs(args)
    defaults = {"microbatches": 1, "remat": "full", "act_seq": None, "act_mlp": None}
    mine = (("remat", "none"), ("act_seq", ("tp",)), ("act_mlp", "tp"))
    assert plan_differences(args, specs, specs, mine, (("microbatches", 2),),
                            defaults=defaults) == [
        "microbatches: 1 (other: 2)", "remat: none (other: full)",
        "activations: act_seq=tp,act_mlp=tp (other: act_seq=-,act_mlp=-)"]
    # Without the defaults a left-out knob is "default".
    assert plan_differences(args, specs, specs, (("remat", "none"),)) == [
        "remat: none (other: default)"]


def test_the_mesh_shape_is_compared_when_both_are_given(args):
    specs = _specs(args)
    assert plan_differences(args, specs, specs, mesh={"dp": 4, "tp": 2},
                            other_mesh={"dp": 2, "tp": 4}) == [
        "mesh shape: dp=4,tp=2 (other: dp=2,tp=4)"]
    assert plan_differences(args, specs, specs, mesh={"dp": 4, "tp": 2}) == []


def test_a_spec_tree_that_does_not_match_is_refused(args):
    state_specs, _ = _specs(args)
    with pytest.raises(ValueError, match="the spec tree does not match"):
        plan_differences(args, (state_specs, {"x": P()}), _specs(args))
