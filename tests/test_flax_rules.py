"""Flax's `logical_axis_rules` both ways: the flax-rules export resolves, through
Flax's own `nn.logical_to_mesh_axes`, to the specs our rule gives every leaf;
`LogicalAxisRule.from_flax` / `.to_flax` round-trip."""

import json
import os

import jax
import pytest
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base.spec import canonical
from shardsearch.rules.logical import FlaxRulesMismatch, LogicalAxisRule, flax_resolve
from shardsearch.search import plan_config
from shardsearch.search.space.logical import split_rules
from shardsearch.workloads import get_workload

if os.environ.get("CI") == "true":
    import flax.linen as nn  # under CI the flax extra is installed: a missing one fails
else:
    nn = pytest.importorskip("flax.linen")


def _assignments(axes):
    names = [a.name for a in axes.axes]
    return {
        "fsdp": {n: ("dp", "tp") for n in names},      # every dim wants every axis
        "tp": {n: "tp" for n in names},                # larger dims must come first
        "mixed": {n: ("tp" if i % 2 else "dp") for i, n in enumerate(names)},
    }


@pytest.mark.parametrize("workload", ["gpt:tiny", "llama:tiny", "mlp:tiny"])
@pytest.mark.parametrize("kind", ["fsdp", "tp", "mixed"])
def test_flax_rules_export_gives_the_measured_spec_of_every_leaf(mesh24, tmp_path,
                                                                 workload, kind):
    w = get_workload(workload)
    args = w.abstract()
    axes = ss.discover_logical_axes(w.step, args)
    state_rule, batch_rule = split_rules(mesh24, axes, _assignments(axes)[kind])
    config = plan_config(state_rule, batch_rule, mesh24, workload=w)
    if (workload, kind) == ("gpt:tiny", "tp"):
        # wq (embed 64, heads 64) gives tp to embed, wo (heads 64, embed 64) to
        # heads (equal sizes: the first dim): no one order of pairs does both,
        # and the export says so, naming the leaves.
        with pytest.raises(FlaxRulesMismatch, match=r"attn/wo"):
            ss.write_config(config, tmp_path / "rules.json", format="flax-rules")
        return
    path = ss.write_config(config, tmp_path / "rules.json", format="flax-rules")
    data = json.loads(path.read_text())
    assert data["format"] == "flax-rules"
    rules = [(n, tuple(e) if isinstance(e, list) else e) for n, e in data["rules"]]
    measured = {leaf["path"]: leaf["spec"] for leaf in config["workload"]["arguments"][0]}
    differ, compared = [], 0
    for why in state_rule.explain(args[0]):
        if why.names is None:
            continue
        theirs = nn.logical_to_mesh_axes(why.names, rules)
        want = canonical(ss.ShardingPlan.from_config(config).recorded_specs[0][why.path])
        assert measured[why.path] is not None
        compared += 1
        if canonical(theirs) != want:
            differ.append((why.path, theirs, want))
    assert compared > 0 and differ == []
    # Read back, the file gives the same specs.
    assert ss.load_rule(path, mesh24).apply(args[0]) == state_rule.apply(args[0])


def test_flax_resolve_is_flaxs_resolution():
    cases = [(("embed", "mlp"), [("mlp", "tp"), ("embed", "tp")]),
             (("embed", "mlp"), [("embed", "tp"), ("mlp", "tp")]),
             (("batch", None, "heads"), [("batch", ("dp", "tp")), ("heads", "tp")]),
             (("a", "b"), [("a", None), ("b", "dp"), ("a", "dp")]),
             # A constraint's names: UNCONSTRAINED as a name and as a pair's axes.
             (("batch", P.UNCONSTRAINED, "mlp"), [("batch", "dp"), ("mlp", P.UNCONSTRAINED)]),
             (("seq", "heads", None), [("heads", "tp"), ("seq", "tp"),
                                       ("seq", P.UNCONSTRAINED), ("heads", P.UNCONSTRAINED)])]
    for names, pairs in cases:
        assert flax_resolve(names, pairs) == canonical(nn.logical_to_mesh_axes(names, pairs))


def test_from_flax_and_to_flax_round_trip(mesh24):
    w = get_workload("gpt:tiny")
    axes = ss.discover_logical_axes(w.step, w.abstract())
    rule, _ = split_rules(mesh24, axes, {n: ("dp", "tp") for n in (a.name for a in axes.axes)})
    pairs = rule.to_flax()
    back = LogicalAxisRule.from_flax(pairs, mesh24, names=rule.axes)
    state = w.abstract()[0]
    assert back.apply(state) == rule.apply(state)
    assert back.to_flax() == pairs


def test_from_flax_checks_mesh_axes_and_reads_boxes(mesh24):
    boxed = {"w": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((8, 16), "float32"),
                                          names=("embed", "mlp"))}
    rule = LogicalAxisRule.from_flax([("mlp", "tp"), ("embed", "dp"), ("other", "dp")],
                                     mesh24, names=boxed)
    assert rule.mapping == {"embed": "dp", "mlp": "tp"}
    with pytest.raises(ValueError, match="mesh axis 'fsdp', which is not in the mesh"):
        LogicalAxisRule.from_flax([("embed", "fsdp")], mesh24, names=boxed)


def test_a_leaf_flax_cannot_resolve_alike_is_named(mesh24):
    from shardsearch.logical.axes import LeafAxes, LogicalAxes, LogicalAxis

    # One name on two dims: Flax refuses it.
    axes = LogicalAxes((LogicalAxis("embed", 8),), ((LeafAxes("w", (8, 8), ("embed", "embed")),),))
    rule = LogicalAxisRule(mesh24, axes, {"embed": "tp"})
    with pytest.raises(FlaxRulesMismatch, match="leaf 'w'"):
        rule.to_flax()
