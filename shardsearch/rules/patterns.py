"""Pattern tables written by hand: `shape` (shape → spec) and `path` (regex → spec).

Both are ordered lists of `(pattern, PartitionSpec)` pairs where the first
match wins, and both describe themselves one pattern per line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import spec as _spec
from ..base import tree as _tree
from .base import ShardingRule, describe_fields

FALLBACKS = ("replicate", "error")


@dataclasses.dataclass(frozen=True, init=False)
class ShapeBasedShardingRule(ShardingRule):
    """Maps shape patterns to specs; the first pattern that matches wins.

    A pattern is a tuple of ints and `None` (any size) and matches only leaves
    of its rank. Leaves no pattern matches stay replicated.

    Example: `{(None, 1024): P(None, 'tp')}` gives `P(None, 'tp')` for a
    `[512, 1024]` weight and `P()` for a `[1024]` bias.
    """

    shape_patterns: tuple[tuple[tuple[int | None, ...], P], ...]
    kind: ClassVar[str] = "shape"

    def __init__(
        self,
        shape_patterns: Mapping[tuple[int | None, ...], P] | Sequence[tuple[Any, P]],
    ) -> None:
        where = "ShapeBasedShardingRule"
        items = shape_patterns.items() if isinstance(shape_patterns, Mapping) else shape_patterns
        out = []
        for pattern, spec in items:
            if not isinstance(pattern, tuple | list) or not all(
                d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)
                for d in pattern
            ):
                raise TypeError(
                    f"{where}: pattern {pattern!r} must be a tuple of non-negative ints "
                    "and None (None matches any size)")
            pattern = tuple(pattern)
            spec = _check_spec(spec, f"{where}: pattern {pattern}")
            if len(spec) > len(pattern):
                raise ValueError(
                    f"{where}: pattern {pattern} has rank {len(pattern)} but its spec "
                    f"{spec} has {len(spec)} entries; shorten the spec")
            out.append((pattern, spec))
        object.__setattr__(self, "shape_patterns", tuple(out))

    def apply(self, pytree: Any) -> Any:
        def one(path: str, leaf: Any) -> P:
            shape = _tree.leaf_shape(leaf)
            if shape is None:
                return P()
            for pattern, spec in self.shape_patterns:
                if len(pattern) == len(shape) and all(
                    p is None or p == d for p, d in zip(pattern, shape, strict=True)
                ):
                    return _spec.canonical(spec)
            return P()

        return _tree.map_with_path(one, pytree)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "shape_patterns": [
                [list(pattern), _spec.spec_to_json(spec)] for pattern, spec in self.shape_patterns
            ],
        }

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None, where: str,
    ) -> ShapeBasedShardingRule:
        return cls([
            (tuple(pattern), _spec.spec_from_json(spec, f"{where}.shape_patterns[{i}]"))
            for i, (pattern, spec) in enumerate(config["shape_patterns"])])

    def describe(self) -> list[str]:
        """The kind, then one `pattern  spec` line per pattern, in priority order.

        Example:
          >>> ShapeBasedShardingRule({(None, 8): P(None, "tp")}).describe()
          ['shape', '   [null, 8]  P(None, "tp")']
        """
        return _describe_table(self.to_config(), "shape_patterns")


@dataclasses.dataclass(frozen=True, init=False)
class PathShardingRule(ShardingRule):
    """Ordered `(regex, spec)` pairs matched against each leaf's key path.

    The path is the leaf's `/`-joined key path (`params/layers/3/attn/wq`);
    `re.search` is used, so a pattern may match any part of it; the first
    matching pair wins. This is the form EasyDeL and Flax users write by hand.

    Example: `PathShardingRule([(r"attn/w[qkv]$", P(None, "tp"))])` gives
    `P(None, 'tp')` for `layers/0/attn/wq` of shape `[512, 512]`.

    Args:
      rules: the `(pattern, PartitionSpec)` pairs, in priority order.
      fallback: what an array leaf no pattern matches gets: `"replicate"` (P())
        or `"error"` (raise, naming the leaf paths). Non-array leaves (strings,
        objects) always get P().
      mesh: checks the specs' axes and divisibility; None means the in-context
        mesh at apply.

    Raises at apply:
      ValueError: a matched spec names an axis not in the mesh, is longer than
        the leaf's rank, or does not divide a dim; or (fallback "error") leaves
        match nothing. All problems are listed together.
    """

    rules: tuple[tuple[str, P], ...]
    fallback: str = "replicate"
    mesh: _mesh.AnyMesh | None = None
    kind: ClassVar[str] = "path"

    def __init__(
        self,
        rules: Sequence[tuple[str, P]],
        fallback: str = "replicate",
        mesh: _mesh.AnyMesh | None = None,
    ) -> None:
        where = "PathShardingRule"
        if isinstance(rules, str | Mapping):
            raise TypeError(
                f"{where}: rules must be a sequence of (regex, PartitionSpec) pairs, got "
                f"{type(rules).__name__}")
        out = []
        for i, item in enumerate(rules):
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise TypeError(
                    f"{where}: rule {i} is {item!r}; expected a (regex, PartitionSpec) pair")
            pattern, spec = item
            if not isinstance(pattern, str):
                raise TypeError(f"{where}: rule {i} pattern {pattern!r} must be a string")
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(
                    f"{where}: rule {i} pattern {pattern!r} is not a valid regex ({err}); "
                    "fix or escape it") from None
            out.append((pattern, _check_spec(spec, f"{where}: rule {i} ({pattern!r})")))
        if fallback not in FALLBACKS:
            raise ValueError(
                f"{where}: fallback={fallback!r}; choose one of {FALLBACKS}")
        object.__setattr__(self, "rules", tuple(out))
        object.__setattr__(self, "fallback", fallback)
        object.__setattr__(self, "mesh", mesh)

    def apply(self, pytree: Any) -> Any:
        mesh = _mesh.resolve_mesh(self.mesh)
        sizes = _mesh.axis_sizes(mesh)
        for pattern, spec in self.rules:
            for axis in _spec.spec_axes(spec):
                if axis not in sizes:
                    raise ValueError(
                        f"PathShardingRule: pattern {pattern!r} uses axis {axis!r}, which is "
                        f"not in the mesh {tuple(sizes)}; fix the spec or the mesh")
        compiled = [(re.compile(p), p, s) for p, s in self.rules]
        problems: list[str] = []

        def one(path: str, leaf: Any) -> P:
            if _tree.leaf_shape(leaf) is None:
                return P()  # strings and other non-arrays have nothing to split
            for regex, pattern, spec in compiled:
                if regex.search(path):
                    problems.extend(_fit_problems(path, leaf, spec, pattern, sizes))
                    return _spec.canonical(spec)
            if self.fallback == "error":
                problems.append(
                    f"{path}: no pattern matches this leaf and fallback='error'; add a "
                    "pattern for it or use fallback='replicate'")
            return P()

        specs = _tree.map_with_path(one, pytree)
        if problems:
            raise ValueError(
                f"PathShardingRule: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
        return specs

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "rules": [[p, _spec.spec_to_json(s)] for p, s in self.rules],
            "fallback": self.fallback,
        }

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None, where: str,
    ) -> PathShardingRule:
        return cls(
            [(pattern, _spec.spec_from_json(spec, f"{where}.rules[{i}]"))
             for i, (pattern, spec) in enumerate(config["rules"])],
            fallback=config.get("fallback", "replicate"), mesh=mesh)

    def describe(self) -> list[str]:
        """The kind and fallback, then one `regex  spec` line per pattern.

        Example:
          >>> PathShardingRule([("embed", P("tp"))]).describe()
          ['path  fallback="replicate"', '   "embed"  P("tp")']
        """
        return _describe_table(self.to_config(), "rules")


def _check_spec(spec: Any, where: str) -> P:
    if not isinstance(spec, P):
        raise TypeError(
            f"{where}: expected a jax.sharding.PartitionSpec, got "
            f"{type(spec).__name__} {spec!r}; wrap it as PartitionSpec(...)")
    for entry in spec:
        _spec.entry_axes(entry)  # raises TypeError on entries that name nothing valid
    return spec


def _fit_problems(path: str, leaf: Any, spec: P, pattern: str, sizes: dict[str, int]) -> list[str]:
    shape = _tree.leaf_shape(leaf) or ()
    if len(spec) > len(shape):
        return [f"{path}: pattern {pattern!r} gives {spec} with {len(spec)} entries but the "
                f"leaf has rank {len(shape)} (shape {shape}); shorten the spec"]
    out = []
    for d, entry in enumerate(spec):
        n = math.prod(sizes[a] for a in _spec.entry_axes(entry))
        if shape[d] % n:
            out.append(
                f"{path}: pattern {pattern!r} puts {entry!r} (size {n}) on dim {d} of size "
                f"{shape[d]}, which it does not divide; use another axis or pad the dim")
    return out


def _describe_table(config: Mapping[str, Any], table: str) -> list[str]:
    # A pattern table reads best one pattern per line, in priority order, with
    # the specs lined up in a column.
    pairs = [(json.dumps(p), _spec.spec_source(s)) for p, s in config[table]]
    width = max((len(p) for p, _ in pairs), default=0)
    return [describe_fields(config, skip=(table,)),
            *(f"   {p.ljust(width)}  {s}" for p, s in pairs)]


