"""A rule kind registers itself: one defined here, outside the package, loads like a built-in.

`LastDimRule` below is what a user would write: a ShardingRule subclass with a
`kind` and a `from_config`. Defining it is all it takes for configs, composite
rules and plan files naming "last-dim" to load. The rest checks the registry's
errors: two classes claiming one kind, bad kinds, unknown kinds, malformed
configs.
"""

import dataclasses
import importlib
import json
import re
import textwrap
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.rules import base as rules_base
from shardsearch.rules import registered_kinds, rule_class
from shardsearch.search import plan_config, rule_from_config

BUILT_IN = ("auto", "composite", "memory", "shape", "path", "batch")


@dataclasses.dataclass(frozen=True)
class LastDimRule(ss.ShardingRule):
    """Splits every leaf's last dim over one mesh axis, where the axis divides it."""

    axis: str
    mesh: Any = None
    kind: ClassVar[str] = "last-dim"

    def __post_init__(self):
        if not isinstance(self.axis, str):
            raise TypeError(f"LastDimRule: axis must be a string, got {self.axis!r}")

    def apply(self, pytree):
        size = dict(zip(self.mesh.axis_names, self.mesh.axis_sizes, strict=True))[self.axis]

        def one(leaf):
            shape = getattr(leaf, "shape", None)
            if not shape or shape[-1] % size:
                return P()
            return P(*([None] * (len(shape) - 1)), self.axis)

        return jax.tree.map(one, pytree)

    def to_config(self):
        return {"kind": self.kind, "axis": self.axis}

    @classmethod
    def from_config(cls, config, mesh, where):
        return cls(config["axis"], mesh=mesh)


@pytest.fixture
def mesh():
    return ss.abstract_mesh((2, 4), ("dp", "tp"))


@pytest.fixture
def isolated_registry(monkeypatch):
    """Kinds registered during the test are forgotten after it."""
    monkeypatch.setattr(rules_base, "_KINDS", dict(rules_base._KINDS))


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _args():
    state = {"emb": sds(64, 32), "w": sds(32, 6), "b": sds(8)}
    batch = {"tokens": sds(16, 128)}
    return state, batch


def _round_trip(rule, mesh):
    return rule_from_config(json.loads(json.dumps(rule.to_config())), mesh)


# --------------------------------------------------------------------------
# A kind defined outside the package
# --------------------------------------------------------------------------

def test_defining_the_class_registers_its_kind():
    assert registered_kinds()[: len(BUILT_IN)] == BUILT_IN
    assert "last-dim" in registered_kinds()
    assert rule_class("last-dim") is LastDimRule
    assert rule_class("auto") is ss.AutoShardingRule
    assert rule_class("nope") is None


def test_custom_rule_round_trips(mesh):
    rule = LastDimRule("tp", mesh=mesh)
    assert rule.apply(_args()[0]) == {"emb": P(None, "tp"), "w": P(), "b": P("tp")}
    back = _round_trip(rule, mesh)
    assert back == rule
    assert back.to_config() == {"kind": "last-dim", "axis": "tp"}
    assert LastDimRule.from_config(rule.to_config(), mesh, "rule") == rule


def test_custom_rule_round_trips_inside_a_composite(mesh):
    rule = ss.CompositeShardingRule(
        ss.PathShardingRule([("emb", P("dp"))], mesh=mesh), LastDimRule("tp", mesh=mesh))
    back = _round_trip(rule, mesh)
    assert back == rule
    assert back.rules[1] == LastDimRule("tp", mesh=mesh)
    assert back.apply(_args()[0]) == {"emb": P("dp"), "w": P(), "b": P("tp")}


@pytest.mark.parametrize("nested", [False, True], ids=["alone", "in-composite"])
def test_custom_rule_round_trips_through_a_plan_file(tmp_path, mesh, nested):
    rule = LastDimRule("tp", mesh=mesh)
    if nested:
        rule = ss.CompositeShardingRule(ss.AutoShardingRule(mesh, axis_names=("dp",)), rule)
    batch_rule = ss.BatchShardingRule(("dp",))
    args = _args()
    path = ss.write_config(plan_config(rule, batch_rule, mesh, args=args),
                           tmp_path / "plan.json")
    assert '"kind": "last-dim"' in path.read_text()

    plan = ss.load_plan(path)
    assert plan.rule == rule
    assert plan.batch_rule == batch_rule
    assert ss.load_rule(path) == rule
    expected = (rule.apply(args[0]), batch_rule.apply(args[1]))
    assert plan.apply(args) == expected
    assert plan.rule.apply(args[0]) == expected[0]


def test_custom_rule_describes_itself_by_its_fields(mesh):
    assert LastDimRule("tp").describe() == ['last-dim  axis="tp"']
    assert ss.CompositeShardingRule(LastDimRule("tp")).describe() == [
        "composite: per leaf, the first of these rules that shards it",
        '  1. last-dim  axis="tp"']


# --------------------------------------------------------------------------
# Registry errors
# --------------------------------------------------------------------------

def test_a_second_class_claiming_a_kind_is_refused():
    with pytest.raises(ValueError, match=(
            r"test_rule_registry\.test_a_second_class_claiming_a_kind_is_refused\.<locals>\."
            r"Impostor: rule kind 'last-dim' is already registered by "
            r"test_rule_registry\.LastDimRule; give one of them another kind")):
        class Impostor(LastDimRule):
            kind: ClassVar[str] = "last-dim"
    with pytest.raises(ValueError, match=(
            r"Impostor: rule kind 'auto' is already registered by "
            r"shardsearch\.rules\.auto\.AutoShardingRule")):
        class Impostor(LastDimRule):
            kind: ClassVar[str] = "auto"
    assert rule_class("last-dim") is LastDimRule
    assert rule_class("auto") is ss.AutoShardingRule


def test_redefining_the_same_class_replaces_it(tmp_path, monkeypatch, isolated_registry):
    # A module reload defines the same module + qualname again: not a clash.
    (tmp_path / "my_rules_for_reload.py").write_text(textwrap.dedent("""
        import shardsearch as ss

        class Reloaded(ss.ShardingRule):
            kind = "reloaded"

            def apply(self, pytree):
                return pytree

            def to_config(self):
                return {"kind": self.kind}

            @classmethod
            def from_config(cls, config, mesh, where):
                return cls()
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_rules_for_reload")
    first = module.Reloaded
    kinds = registered_kinds()
    module = importlib.reload(module)
    assert module.Reloaded is not first
    assert rule_class("reloaded") is module.Reloaded
    assert registered_kinds() == kinds  # replaced in place, not appended
    assert isinstance(rule_from_config({"kind": "reloaded"}), module.Reloaded)


def test_a_subclass_that_inherits_a_kind_is_not_registered(isolated_registry):
    class Tweaked(ss.AutoShardingRule):
        pass

    assert rule_class("auto") is ss.AutoShardingRule
    assert Tweaked(reverse=True).to_config()["kind"] == "auto"


def test_an_abstract_class_with_a_kind_is_not_registered(isolated_registry):
    class Half(ss.ShardingRule):
        kind = "half"

        def to_config(self):
            return {"kind": self.kind}

    assert "half" not in registered_kinds()


@pytest.mark.parametrize("value", ["", 3, None, ("a",)], ids=repr)
def test_a_kind_must_be_a_non_empty_string(value, isolated_registry):
    before = registered_kinds()
    with pytest.raises(TypeError, match=(
            r"test_rule_registry\.test_a_kind_must_be_a_non_empty_string\.<locals>\.Bad: kind "
            rf"must be a non-empty string, got {re.escape(repr(value))}; name the rule kind")):
        class Bad(LastDimRule):
            kind = value
    assert registered_kinds() == before


def test_unknown_kind_lists_the_known_kinds_in_registration_order():
    known = registered_kinds()
    with pytest.raises(ValueError, match=re.escape(
            f"plan.json: state_rule: unknown rule kind 'last_dim'; known kinds: {known}")):
        rule_from_config({"kind": "last_dim", "axis": "tp"}, where="plan.json: state_rule")
    assert known[: len(BUILT_IN)] == BUILT_IN


@pytest.mark.parametrize("kind", [["auto"], {"k": 1}, 3, None], ids=repr)
def test_a_kind_that_is_not_a_string_is_unknown(kind):
    with pytest.raises(ValueError, match=r"^rule: unknown rule kind .*; known kinds: \('auto'"):
        rule_from_config({"kind": kind})


@pytest.mark.parametrize("config, match", [
    ({"kind": "last-dim"}, r"^rule: malformed 'last-dim' rule \('axis'\)$"),
    ({"kind": "last-dim", "axis": 3},
     r"^rule: malformed 'last-dim' rule \(LastDimRule: axis must be a string, got 3\)$"),
    ({"kind": "composite", "rules": [{"kind": "last-dim"}]},
     r"^rule\.rules\[0\]: malformed 'last-dim' rule \('axis'\)$"),
], ids=["missing-field", "bad-field", "nested"])
def test_malformed_custom_config_names_where_and_kind(config, match):
    with pytest.raises(ValueError, match=match):
        rule_from_config(config)


def test_a_kind_without_from_config_says_how_to_fix_it(isolated_registry):
    class NoLoader(ss.ShardingRule):
        kind = "no-loader"

        def apply(self, pytree):
            return pytree

        def to_config(self):
            return {"kind": self.kind}

    with pytest.raises(NotImplementedError, match=(
            r"^plan\.json: rule kind 'no-loader' \(.*NoLoader\) cannot be loaded from a config; "
            r"define a classmethod from_config\(cls, config, mesh, where\)")):
        rule_from_config({"kind": "no-loader"}, where="plan.json")


def test_from_config_must_return_a_rule(isolated_registry):
    class Confused(LastDimRule):
        kind: ClassVar[str] = "confused"

        @classmethod
        def from_config(cls, config, mesh, where):
            return config

    with pytest.raises(TypeError, match=r"^rule: .*Confused\.from_config returned a dict, not"):
        rule_from_config({"kind": "confused"})
