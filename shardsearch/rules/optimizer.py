"""The `optimizer-state` rule: optimizer state split over more axes than its parameter.

ZeRO-1/2, and Megatron-LM's distributed optimizer: each data-parallel rank
keeps and updates only its slice of the Adam moments, and XLA gathers the
updated parameters. The rule wraps another one: every leaf keeps the inner
rule's spec, and the leaves of the optimizer state (by path) also get the
given axes on their largest dim that still divides.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import spec as _spec
from ..base import tree as _tree
from .base import ShardingRule, rule_from_config

# The state's optimizer leaves: the built-in workloads' `opt/mu/...`,
# `opt/nu/...`, and optax's usual names (`opt_state`, `mu`, `nu`).
OPTIMIZER_PATHS = r"(^|/)(opt|opt_state)/"


def is_optimizer_leaf(path: Any, leaf: Any, pattern: str = OPTIMIZER_PATHS) -> bool:
    """Whether a leaf (its key path) is optimizer state the rule splits: a
    non-scalar leaf whose path matches `pattern`."""
    return bool(_tree.leaf_shape(leaf)) and re.search(pattern, _tree.path_str(path)) is not None


def has_optimizer_state(pytree: Any, pattern: str = OPTIMIZER_PATHS) -> bool:
    """Whether `pytree` holds any leaf `is_optimizer_leaf` accepts."""
    return any(is_optimizer_leaf(path, leaf, pattern)
               for path, leaf in jax.tree_util.tree_flatten_with_path(pytree)[0])


@dataclasses.dataclass(frozen=True)
class OptimizerStateRule(ShardingRule):
    """`rule`'s specs, with the optimizer state also split over `axes`.

    For a leaf whose path matches `pattern`, the axes (those of `axes` its
    spec does not use yet, together) go on the largest dim whose size the
    dim's axes times theirs divides; a leaf with no such dim keeps its spec.

    Example: on `Mesh(dp=4, tp=2)`, with `rule` giving `opt/mu/w [1024, 512]`
    the spec `P(None, "tp")`, `OptimizerStateRule(rule, ("dp",))` gives it
    `P("dp", "tp")` and leaves the parameter `params/w` at `P(None, "tp")`.
    """

    rule: ShardingRule
    axes: tuple[str, ...]
    pattern: str = OPTIMIZER_PATHS
    mesh: _mesh.AnyMesh | None = None
    kind: ClassVar[str] = "optimizer-state"

    def __post_init__(self) -> None:
        if not isinstance(self.rule, ShardingRule):
            raise TypeError(f"OptimizerStateRule: rule must be a ShardingRule, got "
                            f"{type(self.rule).__name__}")
        axes = (self.axes,) if isinstance(self.axes, str) else tuple(self.axes)
        if not axes or not all(isinstance(a, str) and a for a in axes):
            raise ValueError(f"OptimizerStateRule: axes must be mesh axis names, got "
                             f"{self.axes!r}")
        object.__setattr__(self, "axes", axes)
        re.compile(self.pattern)

    def apply(self, pytree: Any) -> Any:
        return self._extend(pytree, self.rule.apply(pytree))

    def apply_argument(self, index: int, pytree: Any) -> Any:
        return self._extend(pytree, self.rule.apply_argument(index, pytree))

    def notes(self, pytree: Any, index: int | None = None) -> tuple[str, ...]:
        return self.rule.notes(pytree, index)

    def _extend(self, pytree: Any, specs: Any) -> Any:
        mesh = _mesh.resolve_mesh(self.mesh)
        sizes = _mesh.axis_sizes(mesh)
        unknown = [a for a in self.axes if a not in sizes]
        if unknown:
            raise ValueError(f"optimizer-state rule: axes {unknown} are not mesh axes "
                             f"{tuple(sizes)}")
        flat, treedef = jax.tree_util.tree_flatten_with_path(pytree)
        spec_leaves = treedef.flatten_up_to(specs)
        out = []
        for (path, leaf), spec in zip(flat, spec_leaves, strict=True):
            if is_optimizer_leaf(path, leaf, self.pattern):
                spec = _split(_spec.canonical(spec), _tree.leaf_shape(leaf), self.axes, sizes)
            out.append(spec)
        return jax.tree_util.tree_unflatten(treedef, out)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "rule": self.rule.to_config(), "axes": list(self.axes),
                "pattern": self.pattern}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None,
                    where: str) -> OptimizerStateRule:
        return cls(rule_from_config(config["rule"], mesh, f"{where}.rule"),
                   tuple(config["axes"]), config.get("pattern", OPTIMIZER_PATHS), mesh)

    def describe(self) -> list[str]:
        first, *rest = self.rule.describe()
        return [f"optimizer-state  axes={list(self.axes)} on paths matching "
                f"{self.pattern!r}, over:", f"  {first}", *(f"  {line}" for line in rest)]


def _split(spec: P, shape: Sequence[int], axes: tuple[str, ...],
           sizes: Mapping[str, int]) -> P:
    """`spec` with the axes it does not use yet added to its largest dim they divide."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    used = {a for e in entries if e is not None for a in ((e,) if isinstance(e, str) else e)}
    new = tuple(a for a in axes if a not in used)
    if not new:
        return spec
    extra = math.prod(sizes[a] for a in new)
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        have = () if entries[dim] is None else (
            (entries[dim],) if isinstance(entries[dim], str) else tuple(entries[dim]))
        if shape[dim] % (math.prod(sizes[a] for a in have) * extra) == 0:
            merged = have + new
            entries[dim] = merged[0] if len(merged) == 1 else merged
            return _spec.canonical(P(*entries))
    return spec
