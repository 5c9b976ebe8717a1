"""The logical-axis rule: golden specs, fallbacks and their reasons, round trips, the
expert plans it can express, the logical-axis-rules file, and `shardsearch explain`."""

import itertools
import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base import spec as _spec
from shardsearch.base import tree as _tree
from shardsearch.cli import main as _cli
from shardsearch.logical.axes import LeafAxes, LogicalAxes, LogicalAxis
from shardsearch.logical.discover import discover_logical_axes
from shardsearch.rules.explain import NO_RULE, explain_rule
from shardsearch.rules.logical import LogicalAxisRule, compact, generalize
from shardsearch.search import plan_config, rule_from_config
from shardsearch.search.space.logical import split_rules
from shardsearch.workloads import expert_plans, get_workload

MESH = ss.abstract_mesh((2, 4), ("dp", "tp"))


def _struct(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


# A hand-written table: an attention block with 4 query heads and 2 KV heads.
AXES = LogicalAxes(
    (LogicalAxis("embed", 64, "embed"), LogicalAxis("heads", 4, "heads"),
     LogicalAxis("kv_heads", 2, "kv_heads"), LogicalAxis("mlp", 256, "mlp"),
     LogicalAxis("vocab", 50, "vocab"), LogicalAxis("batch", 8, "batch")),
    ((LeafAxes("params/layers/0/attn/wq", (64, 64), ("embed", "heads")),
      LeafAxes("params/layers/1/attn/wq", (64, 64), ("embed", "heads")),
      LeafAxes("params/layers/0/attn/wk", (64, 32), ("embed", "kv_heads")),
      LeafAxes("params/layers/0/mlp/w_up", (64, 256), ("embed", "mlp")),
      LeafAxes("params/embed", (50, 64), ("vocab", "embed")),
      LeafAxes("params/scale", (64,), ("embed",)),
      LeafAxes("params/step", (), ())),
     (LeafAxes("tokens", (8, 32), ("batch", None)),)))

LEAVES = {"params/layers/0/attn/wq": (64, 64), "params/layers/0/attn/wk": (64, 32),
          "params/layers/0/mlp/w_up": (64, 256), "params/embed": (50, 64),
          "params/scale": (64,)}


def _tree_of(leaves):
    return {path: _struct(*shape) for path, shape in leaves.items()}


@pytest.mark.parametrize("assignment,path,expected", [
    ({"heads": "tp"}, "params/layers/0/attn/wq", P(None, "tp")),
    ({"embed": "dp", "heads": "tp"}, "params/layers/0/attn/wq", P("dp", "tp")),
    # Equal dims: dim 0 goes first and takes dp; heads cannot use it again.
    ({"embed": "dp", "heads": "dp"}, "params/layers/0/attn/wq", P("dp")),
    # Larger dim first: mlp (256) takes tp before embed (64) can.
    ({"embed": "tp", "mlp": "tp"}, "params/layers/0/mlp/w_up", P(None, "tp")),
    # Everything on all axes: FSDP's largest divisible dim.
    ({n: ("dp", "tp") for n in ("embed", "mlp")}, "params/layers/0/mlp/w_up",
     P(None, ("dp", "tp"))),
    # 4 heads do not split 8 ways, although the dim (64) would.
    ({"heads": ("dp", "tp")}, "params/layers/0/attn/wq", P()),
    # 2 KV heads do not split 4 ways (the merged dim, 32, would).
    ({"kv_heads": "tp"}, "params/layers/0/attn/wk", P()),
    ({"kv_heads": "dp"}, "params/layers/0/attn/wk", P(None, "dp")),
    # A vocabulary of 50 does not divide by 4: the embed dim takes tp instead.
    ({"vocab": "tp", "embed": "tp"}, "params/embed", P(None, "tp")),
    ({"embed": ("tp", "dp")}, "params/scale", P(("tp", "dp"))),
    ({}, "params/layers/0/attn/wq", P()),
])
def test_golden_specs(assignment, path, expected):
    rule = LogicalAxisRule(MESH, AXES, assignment)
    assert rule.apply(_tree_of(LEAVES))[path] == expected


def test_deeper_and_resized_leaves_and_unknown_ones():
    rule = LogicalAxisRule(MESH, AXES, {"heads": ("dp", "tp"), "mlp": ("dp", "tp")})
    tree = {"params/layers/7/attn/wq": _struct(64, 64),    # a deeper layer, same shape
            "params/layers/7/mlp/w_up": _struct(256, 1024),  # resized: units unknown
            "params/other": _struct(64, 64),                # not in the table
            "params/scale": _struct(64, 2)}                 # known path, other rank
    by_path = {e.path: e for e in rule.explain(tree)}
    assert by_path["params/layers/7/attn/wq"].spec == P()
    assert "4 units, not divisible by 8" in by_path["params/layers/7/attn/wq"].notes[0]
    assert by_path["params/layers/7/attn/wq"].source == "matched params/layers/*/attn/wq"
    resized = by_path["params/layers/7/mlp/w_up"]
    assert resized.spec == P(None, ("dp", "tp")) and "resized" in resized.notes[0]
    for path in ("params/other", "params/scale"):
        assert by_path[path].spec == P() and by_path[path].names is None
        assert by_path[path].source == "unknown leaf: replicate"
    assert rule.apply(tree) == {e.path: e.spec for e in rule.explain(tree)}


def test_explain_names_every_fallback():
    rule = LogicalAxisRule(MESH, AXES, {"embed": "dp", "heads": "dp", "kv_heads": "tp",
                                        "vocab": "tp"})
    notes = {e.path: e.notes for e in rule.explain(_tree_of(LEAVES))}
    assert notes["params/layers/0/attn/wq"] == (
        "dim 1 (heads, size 64): 'dp' (size 2) not used: mesh axis 'dp' is already used by "
        "dim 0 (embed)",)
    assert notes["params/layers/0/attn/wk"] == (
        "dim 1 (kv_heads, size 32): 'tp' (size 4) not used: logical axis 'kv_heads' has 2 "
        "units, not divisible by 4",)
    assert notes["params/embed"] == (
        "dim 0 (vocab, size 50): 'tp' (size 4) not used: 50 is not divisible by 4",)
    one = ss.abstract_mesh((1, 8), ("dp", "tp"))
    note = LogicalAxisRule(one, AXES, {"embed": "dp"}).explain(_tree_of(LEAVES))[-1].notes
    assert note == ("dim 0 (embed, size 64): 'dp' (size 1) not used: its mesh axes have "
                    "size 1",)


def test_the_config_is_compact_and_round_trips(tmp_path):
    rule = LogicalAxisRule(MESH, AXES, {"heads": "tp", "batch": ["dp"], "mlp": ("dp", "tp"),
                                        "embed": None})
    config = rule.to_config()
    assert config["assignment"] == [["heads", "tp"], ["mlp", ["dp", "tp"]], ["batch", "dp"]]
    paths = [leaf[0] for leaf in config["arguments"][0]]
    assert paths.count("params/layers/*/attn/wq") == 1  # two layers held once
    assert "params/layers/0/attn/wq" not in paths
    again = rule_from_config(json.loads(json.dumps(config)), MESH)
    assert again == rule and again.to_config() == config
    tree = _tree_of(LEAVES)
    assert again.apply(tree) == rule.apply(tree)
    # Through a plan file.
    path = ss.write_config(plan_config(rule, rule, MESH), tmp_path / "plan.json")
    loaded = ss.load_plan(path)
    assert loaded.rule.to_config() == config and loaded.batch_rule.to_config() == config
    assert ss.load_rule(path).apply(tree) == rule.apply(tree)
    assert rule.describe()[1:3] == ['   embed     -', '   heads     "tp"']


def test_compact_keeps_layers_that_differ():
    leaves = (LeafAxes("l/0/w", (4, 8), ("a", "b")), LeafAxes("l/1/w", (4, 8), ("b", "a")))
    axes = LogicalAxes((LogicalAxis("a", 4), LogicalAxis("b", 8)), (leaves,))
    assert compact(axes).arguments[0] == leaves
    assert generalize("params/layers/12/attn/wq") == "params/layers/*/attn/wq"


@pytest.mark.parametrize("build,error,match", [
    (lambda: LogicalAxisRule(MESH, AXES, {"head": "tp"}), ValueError,
     r"logical axis 'head', which is not among the axes"),
    (lambda: LogicalAxisRule(MESH, AXES, {"heads": ("tp", "tp")}), ValueError,
     "'tp' is listed twice"),
    (lambda: LogicalAxisRule(MESH, AXES, {"heads": 4}), TypeError, "must be None, a mesh axis"),
    (lambda: LogicalAxisRule(MESH, {"axes": []}, {}), TypeError, "must be a LogicalAxes"),
    (lambda: LogicalAxisRule(MESH, AXES, [("heads", "tp"), ("heads", "dp")]), ValueError,
     "assigned twice"),
    (lambda: LogicalAxisRule(MESH, AXES, {"heads": "model"}).apply({}), ValueError,
     r"assigned mesh axis 'model', which is not in the mesh, whose axes are \('dp', 'tp'\)"),
])
def test_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_a_config_naming_an_axis_the_mesh_lacks_fails_when_loaded():
    config = LogicalAxisRule(MESH, AXES, {"heads": "tp"}).to_config()
    other = ss.abstract_mesh((8,), ("x",))
    with pytest.raises(ValueError, match=r"where: malformed 'logical' rule .*'tp'"):
        rule_from_config(config, other, "where")


# --------------------------------------------------------------- the expert plans


def _reproduce(mesh, axes, args, target, limit=512):
    """An assignment whose state specs equal `target`, searched over each axis's
    entries in the target (and None); None when no assignment does."""
    known = axes.leaves(0)
    seen = {a.name: [] for a in axes.axes}
    for path, spec in target:
        for d, entry in enumerate(_spec.canonical(spec)):
            name = known[path].names[d]
            if entry is not None and name is not None and entry not in seen[name]:
                seen[name].append(entry)
    options = [seen[a.name] + [None] for a in axes.axes]
    for combo in itertools.islice(itertools.product(*options), limit):
        assignment = dict(zip((a.name for a in axes.axes), combo, strict=True))
        state_rule, _ = split_rules(mesh, axes, assignment)
        if _tree.leaf_specs(state_rule.apply(args[0])) == target:
            return assignment
    return None


@pytest.mark.parametrize("name,dims,plan", [
    ("gpt:tiny", (2, 4), "megatron"), ("gpt:tiny", (2, 4), "dp"),
    ("gpt:tiny", (2, 2), "fsdp"),
    ("mlp:tiny", (2, 4), "megatron"), ("mlp:tiny", (2, 4), "dp"), ("mlp:tiny", (2, 4), "fsdp"),
])
def test_expert_plans_are_reproduced_by_some_assignment(name, dims, plan):
    mesh = ss.abstract_mesh(dims, ("dp", "tp"))
    workload = get_workload(name)
    args = workload.abstract()
    axes = discover_logical_axes(workload.step, args)
    expert = expert_plans(workload, mesh).plans[plan]
    target = _tree.leaf_specs(expert.state_rule.apply(args[0]))
    assignment = _reproduce(mesh, axes, args, target)
    assert assignment is not None, f"{plan} on {name} is not expressible"
    if plan == "megatron" and name == "gpt:tiny":
        assert {k: v for k, v in assignment.items() if v} == {
            "vocab": "tp", "vocab_2": "tp", "heads": "tp", "mlp": "tp"}


def test_fsdp_on_8_devices_splits_heads_which_the_rule_refuses():
    # gpt:tiny has 4 heads; FSDP splits wo's merged heads dim 8 ways.
    workload = get_workload("gpt:tiny")
    args = workload.abstract()
    axes = discover_logical_axes(workload.step, args)
    expert = expert_plans(workload, MESH).plans["fsdp"]
    target = _tree.leaf_specs(expert.state_rule.apply(args[0]))
    assert _reproduce(MESH, axes, args, target) is None
    rule, _ = split_rules(MESH, axes, {a.name: ("dp", "tp") for a in axes.axes})
    got = dict(_tree.leaf_specs(rule.apply(args[0])))
    differ = sorted(p for p, s in target if got[p] != s)
    assert differ and all(p.endswith("attn/wo") for p in differ)


def test_moe_experts_dim_is_expressible():
    workload = get_workload("moe:tiny")
    args = workload.abstract()
    axes = discover_logical_axes(workload.step, args)
    ep = expert_plans(workload, MESH).plans["ep"]
    target = dict(_tree.leaf_specs(ep.state_rule.apply(args[0])))
    stacked = {p: leaf for p, leaf in axes.leaves(0).items() if leaf.names[:1] == ("experts",)}
    assert len(stacked) == 3 * 3 * 2  # w_up/w_gate/w_down, params + 2 moments, 2 layers
    rule, _ = split_rules(MESH, axes, {"experts": "dp"})
    got = dict(_tree.leaf_specs(rule.apply(args[0])))
    for path in stacked:
        assert target[path][0] == "dp" == got[path][0], path


# ------------------------------------------------------- the logical-axis-rules file


def _logical_plan(workload, mesh, assignment):
    args = workload.abstract()
    axes = discover_logical_axes(workload.step, args)
    state_rule, batch_rule = split_rules(mesh, axes, assignment)
    return plan_config(state_rule, batch_rule, mesh, workload=workload)


def test_logical_axis_rules_file_round_trips(tmp_path):
    tiny = get_workload("gpt:tiny")
    assignment = {"heads": "tp", "mlp": "tp", "vocab": "tp", "vocab_2": "tp", "batch": "dp"}
    config = _logical_plan(tiny, MESH, assignment)
    path = ss.write_config(config, tmp_path / "rules.json", format="logical-axis-rules")
    data = json.loads(path.read_text())
    assert data["format"] == "logical-axis-rules"
    assert ["heads", "tp"] in data["rules"] and ["embed", None] in data["rules"]
    assert ["params/layers/*/attn/wq", [64, 64], ["embed", "heads"]] in data["params"]
    assert data["batch"] == [[["targets", [8, 32], ["batch", "seq"]],
                              ["tokens", [8, 32], ["batch", "seq"]]]]
    rule = ss.load_rule(path)
    assert rule.to_config() == config["state_rule"]
    state = tiny.abstract()[0]
    assert rule.apply(state) == ss.load_plan(
        ss.write_config(config, tmp_path / "plan.json")).rule.apply(state)
    bigger = ss.abstract_mesh((4, 4), ("dp", "tp"))
    assert ss.load_rule(path, bigger).mesh is bigger
    with pytest.raises(ValueError, match=r"mesh with axes \('dp', 'tp'\) but the mesh given"):
        ss.load_rule(path, ss.abstract_mesh((8,), ("x",)))


def test_a_plan_that_is_not_logical_cannot_be_written_as_logical_rules(tmp_path):
    config = plan_config(ss.AutoShardingRule(MESH), ss.BatchShardingRule(("dp",)), MESH)
    with pytest.raises(ValueError, match="state rule is a 'auto' rule, not 'logical'"):
        ss.write_config(config, tmp_path / "x.json", format="logical-axis-rules")
    assert not (tmp_path / "x.json").exists()


def test_a_plan_with_its_optimizer_state_split_further_says_what_rules_cannot_say(tmp_path):
    from shardsearch.rules.optimizer import OptimizerStateRule

    tiny = get_workload("gpt:tiny")
    axes = discover_logical_axes(tiny.step, tiny.abstract())
    state_rule, batch_rule = split_rules(MESH, axes, {"heads": "tp", "batch": "dp"})
    zero = OptimizerStateRule(state_rule, ("dp",), mesh=MESH)
    config = plan_config(zero, batch_rule, MESH, workload=tiny)
    for form in ("logical-axis-rules", "flax-rules"):
        with pytest.raises(ValueError, match=r"splits the optimizer state over more mesh "
                                             r"axes than its parameters \(\['dp'\]"):
            ss.write_config(config, tmp_path / "x.json", format=form)
    assert not (tmp_path / "x.json").exists()
    # The plan file itself carries it, and gives the same specs back.
    plan = ss.load_plan(ss.write_config(config, tmp_path / "plan.json"))
    assert plan.rule.apply(tiny.abstract()[0]) == zero.apply(tiny.abstract()[0])


def test_a_tiny_plan_applies_to_the_small_model(tmp_path):
    tiny, small = get_workload("gpt:tiny"), get_workload("gpt:small")
    assignment = {"heads": "tp", "mlp": "tp", "vocab": "tp", "vocab_2": "tp",
                  "embed": "dp", "batch": "dp"}
    path = ss.write_config(_logical_plan(tiny, MESH, assignment), tmp_path / "r.json",
                           format="logical-axis-rules")
    rule = ss.load_rule(path)
    state = small.abstract()[0]
    explained = rule.explain(state)
    assert {e.path for e in explained} == {p for p, _ in _tree.leaf_specs(rule.apply(state))}
    sizes = {"dp": 2, "tp": 4}
    for e in explained:
        assert e.names is not None, e.path  # every leaf of the deeper model is matched
        for d, entry in enumerate(_spec.canonical(e.spec)):
            if entry is None:
                continue
            # The same logical → mesh mapping, and every sharded dim divisible.
            assert entry == assignment[e.names[d]]
            assert e.shape[d] % _size(entry, sizes) == 0
        unsharded = [d for d in range(len(e.shape))
                     if e.names[d] in assignment and (len(e.spec) <= d or e.spec[d] is None)]
        # Each assigned dim left unsharded says why (here: the axis was used).
        assert len([n for n in e.notes if n.startswith("dim ")]) == len(unsharded)
        assert any("resized" in n for n in e.notes) or e.shape in ((), (1,))
    # With the small model's own axes, heads are counted again.
    recounted = rule.with_axes(discover_logical_axes(small.step, small.abstract()))
    assert recounted.mapping == rule.mapping
    assert not any("resized" in n for e in recounted.explain(state) for n in e.notes)


def _size(entry, sizes):
    out = 1
    for axis in _spec.entry_axes(entry):
        out *= sizes[axis]
    return out


# ------------------------------------------------------------------ explain


def test_explain_rule_names_the_composite_member():
    rule = ss.CompositeShardingRule(
        ss.PathShardingRule([("^w$", P("tp"))], mesh=MESH), ss.AutoShardingRule(MESH))
    tree = {"w": _struct(64, 64), "v": _struct(16, 8), "s": _struct()}
    got = {e.path: (e.spec, e.source) for e in explain_rule(rule, tree)}
    assert got == {"w": (P("tp"), "rule 1 of the composite (path)"),
                   "v": (P("dp", "tp"), "rule 2 of the composite (auto)"),
                   "s": (P(), NO_RULE)}
    logical = LogicalAxisRule(MESH, AXES, {"heads": "tp"})
    nested = {e.path: e for e in explain_rule(ss.CompositeShardingRule(logical),
                                              _tree_of(LEAVES))}
    assert nested["params/layers/0/attn/wq"].source == (
        "rule 1 of the composite (logical): logical: matched params/layers/*/attn/wq")
    assert nested["params/layers/0/attn/wq"].names == ("embed", "heads")
    assert nested["params/scale"].source == NO_RULE


def test_explain_command_prints_names_specs_and_reasons(tmp_path, capsys):
    tiny = get_workload("gpt:tiny")
    config = _logical_plan(tiny, MESH, {"heads": ("dp", "tp"), "mlp": "tp", "batch": "dp"})
    plan = ss.write_config(config, tmp_path / "plan.json")
    assert _cli.main(["explain", str(plan)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("state/params/layers/0/attn/wq "))
    assert "embed,heads" in line and "P()" in line and "matched params/layers/*/attn/wq" in line
    assert ("dim 1 (heads, size 64): ('dp', 'tp') (size 8) not used: logical axis 'heads' has "
            "4 units, not divisible by 8") in out
    assert "per device:" in out
    rules = ss.write_config(config, tmp_path / "rules.json", format="logical-axis-rules")
    assert _cli.main(["explain", str(rules), "--mesh", "dp=2,tp=2"]) == 0
    assert "on mesh dp=2,tp=2" in capsys.readouterr().out
    other = ss.write_config(plan_config(ss.AutoShardingRule(MESH),
                                           ss.BatchShardingRule(("dp",)), MESH, workload=tiny),
                            tmp_path / "auto.json")
    assert _cli.main(["explain", str(other)]) == 0
    out = capsys.readouterr().out
    assert "auto rule" in out and NO_RULE in out and "embed,heads" in out


@pytest.mark.parametrize("argv,message", [
    (["explain", "missing.json"], "cannot read missing.json"),
    (["explain", "{plan}", "--mesh", "a=2,b=4"], "mesh given has axes ('a', 'b')"),
    (["explain", "{plan}", "--mesh", "dp=2,tp=-1"], "give every size"),
    (["explain", "{bare}"], "records no leaves"),
    (["explain", "{plan}", "--workload", "nope:tiny"], "nope"),
])
def test_explain_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, monkeypatch,
                                                   capsys):
    monkeypatch.chdir(tmp_path)
    rule = LogicalAxisRule(MESH, AXES, {"heads": "tp"})
    plan = ss.write_config(plan_config(rule, rule, MESH, args=(_tree_of(LEAVES),)),
                           tmp_path / "plan.json")
    bare = ss.write_config(plan_config(rule, rule, MESH), tmp_path / "bare.json")
    argv = [a.format(plan=plan, bare=bare) for a in argv]
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("shardsearch explain: error: ")
    assert message in err[0]
