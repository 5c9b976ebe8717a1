"""Why each leaf got its spec, for any rule: `explain_rule(rule, tree)`.

A `LogicalAxisRule` explains itself (logical names, the table entry it
matched, every divisibility fallback); a `CompositeShardingRule` names the
member that gave the spec (its position, as `describe()` numbers them);
any other rule says whether it shards the leaf.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from ..base import spec as _spec
from ..base import tree as _tree
from .base import ShardingRule
from .composite import CompositeShardingRule
from .logical import LeafExplanation, LogicalAxisRule

NO_RULE = "no rule shards it: replicated"


def explain_rule(rule: ShardingRule, tree: Any,
                 index: int | None = None) -> list[LeafExplanation]:
    """Per leaf of `tree`, in leaf order: the spec `rule` gives it and why.

    `index`: `tree`'s position among the arguments the rule is given (as
    `ShardingRule.apply_argument` takes it); None explains `rule.apply`.

    `names` is filled where the rule knows logical axes (a logical rule, or a
    composite holding one); None elsewhere.

    Example: for `CompositeShardingRule(BatchShardingRule(("dp",)),
    AutoShardingRule(mesh))` and a `[16, 64]` leaf: spec `P('dp')`, source
    `"rule 1 of the composite (batch)"`; for a scalar: `P()`,
    `"no rule shards it: replicated"`.
    """
    if isinstance(rule, LogicalAxisRule):
        return [_logical(e) for e in rule.explain(tree, index)]
    if isinstance(rule, CompositeShardingRule):
        return _composite(rule, tree, index)
    specs = rule.apply(tree) if index is None else rule.apply_argument(index, tree)
    paths, specs = _flat(tree, specs)
    return [LeafExplanation(path, shape, None, spec,
                            NO_RULE if _spec.shards_nothing(spec) else f"{rule.kind} rule")
            for (path, shape), spec in zip(paths, specs, strict=True)]


def _logical(e: LeafExplanation) -> LeafExplanation:
    return LeafExplanation(e.path, e.shape, e.names, e.spec, f"logical: {e.source}", e.notes)


def _composite(rule: CompositeShardingRule, tree: Any,
               index: int | None) -> list[LeafExplanation]:
    paths, _ = _flat(tree, None)
    members = [explain_rule(member, tree, index) for member in rule.rules]
    out = []
    for i, (path, shape) in enumerate(paths):
        chosen = next((k for k, m in enumerate(members) if not _spec.shards_nothing(m[i].spec)),
                      None)
        # Logical names and fallbacks come from the first member that knows them.
        known = next((m[i] for m in members if m[i].names is not None), None)
        names = None if known is None else known.names
        notes = () if known is None else known.notes
        if chosen is None:
            out.append(LeafExplanation(path, shape, names, P(), NO_RULE, notes))
            continue
        picked = members[chosen][i]
        kind = rule.rules[chosen].kind
        source = f"rule {chosen + 1} of the composite ({kind})"
        if picked.source != f"{kind} rule":  # a nested composite or logical rule says more
            source += f": {picked.source}"
        out.append(LeafExplanation(path, shape, names, _spec.canonical(picked.spec), source,
                                   picked.notes if picked.names is not None else notes))
    return out


def _flat(tree: Any, specs: Any) -> tuple[list[tuple[str, Any]], list[P]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    paths = [(_tree.path_str(p), _tree.leaf_shape(x)) for p, x in leaves]
    if specs is None:
        return paths, []
    _pairs, spec_leaves = _tree.specs_for_leaves(tree, specs)
    return paths, [_spec.canonical(s) for s in spec_leaves]
