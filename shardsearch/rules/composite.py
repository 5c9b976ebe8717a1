"""The `composite` rule: several rules in priority order, chosen per leaf."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import spec as _spec
from .base import ShardingRule, rule_from_config


@dataclasses.dataclass(frozen=True, init=False)
class CompositeShardingRule(ShardingRule):
    """Applies every rule; per leaf keeps the first spec that shards something.

    A leaf no rule shards stays replicated. `CompositeShardingRule()` with no
    rules replicates everything.

    Example: `CompositeShardingRule(PathShardingRule([("embed", P("tp"))]),
    AutoShardingRule())` shards embeddings by path and the rest automatically.
    """

    rules: tuple[ShardingRule, ...]
    kind: ClassVar[str] = "composite"

    def __init__(self, *rules: ShardingRule) -> None:
        for i, rule in enumerate(rules):
            if not isinstance(rule, ShardingRule):
                raise TypeError(
                    f"CompositeShardingRule: argument {i} is a {type(rule).__name__}, not "
                    "a ShardingRule; pass rule objects, e.g. AutoShardingRule()")
        object.__setattr__(self, "rules", tuple(rules))

    def apply(self, pytree: Any) -> Any:
        return self._first_sharding(pytree, lambda rule: rule.apply(pytree))

    def apply_argument(self, index: int, pytree: Any) -> Any:
        # Each rule is told the position too: a logical rule among them needs it.
        return self._first_sharding(pytree, lambda rule: rule.apply_argument(index, pytree))

    def _first_sharding(self, pytree: Any, specs_of: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(pytree)
        chosen: list[P] = [P()] * len(leaves)
        for rule in self.rules:
            specs = treedef.flatten_up_to(specs_of(rule))
            for i, spec in enumerate(specs):
                if _spec.shards_nothing(chosen[i]) and not _spec.shards_nothing(spec):
                    chosen[i] = _spec.canonical(spec)
        return jax.tree_util.tree_unflatten(treedef, chosen)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "rules": [r.to_config() for r in self.rules]}

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None, where: str,
    ) -> CompositeShardingRule:
        return cls(*(rule_from_config(c, mesh, f"{where}.rules[{i}]")
                     for i, c in enumerate(config["rules"])))

    def describe(self) -> list[str]:
        """The rules numbered in priority order, each described indented below.

        Example:
          >>> CompositeShardingRule(BatchShardingRule(("dp",))).describe()
          ['composite: per leaf, the first of these rules that shards it',
           '  1. batch  axes=["dp"]']
        """
        if not self.rules:
            return ["composite of no rules: everything replicated"]
        out = ["composite: per leaf, the first of these rules that shards it"]
        for i, rule in enumerate(self.rules, 1):
            first, *rest = rule.describe()
            # Continuation lines line up under the text after "N. ".
            out += [f"  {i}. {first.strip()}", *(f"     {line}" for line in rest)]
        return out
