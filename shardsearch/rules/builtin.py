"""Sharding rules: pytree of arrays → pytree of PartitionSpecs.

Every rule works on abstract leaves (`jax.ShapeDtypeStruct`, or anything with
`.shape` and `.dtype`), so a plan for a model too large to allocate can be made
without allocating it. Non-array leaves and arrays too small to split come out
replicated (`P()`). Specs come out canonical: trailing `None`s dropped.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import jax
from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import spec as _spec
from ..base import tree as _tree
from ..base.units import parse_bytes

AxisEntry = str | tuple[str, ...]


class ShardingRule(abc.ABC):
    """A strategy that proposes a PartitionSpec for every leaf of a pytree."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def apply(self, pytree: Any) -> Any:
        """Returns a pytree of `pytree`'s structure with PartitionSpec leaves."""

    @abc.abstractmethod
    def to_config(self) -> dict[str, Any]:
        """JSON-ready `{"kind": ..., ...}` form; the mesh is not part of it."""


def _normalise_axis_names(names: Iterable[Any] | None, where: str) -> tuple[AxisEntry, ...] | None:
    """Checks `axis_names` (names or groups of names) and freezes it to tuples."""
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError(
            f"{where}: axis_names must be a sequence of axis names, got the string "
            f"{names!r}; write ({names!r},)")
    out: list[AxisEntry] = []
    seen: list[str] = []
    for entry in names:
        if isinstance(entry, list | tuple):
            group = tuple(entry)
            if not group or not all(isinstance(a, str) for a in group):
                raise TypeError(
                    f"{where}: axis group {entry!r} must be a non-empty tuple of axis names")
            entry = group[0] if len(group) == 1 else group
        elif not isinstance(entry, str):
            raise TypeError(
                f"{where}: axis name {entry!r} must be a string or a tuple of strings")
        for axis in _spec.entry_axes(entry):
            if axis in seen:
                raise ValueError(
                    f"{where}: axis {axis!r} is listed twice in axis_names="
                    f"{tuple(names)!r}; list each mesh axis once")
            seen.append(axis)
        out.append(entry)
    return tuple(out)


def _mesh_entries(
    mesh: _mesh.AnyMesh, names: tuple[AxisEntry, ...] | None, where: str,
) -> list[tuple[AxisEntry, int]]:
    """`(entry, size)` for every usable axis entry, checked against the mesh.

    Size-1 axes split nothing, so entries whose size is 1 are dropped rather
    than allowed to use up a dim.
    """
    sizes = _mesh.axis_sizes(mesh)
    entries = tuple(mesh.axis_names) if names is None else names
    unknown = [a for e in entries for a in _spec.entry_axes(e) if a not in sizes]
    if unknown:
        raise ValueError(
            f"{where}: axis {unknown[0]!r} is not in the mesh, whose axes are "
            f"{tuple(sizes)}; fix the name or pass a mesh that has it")
    out = []
    for entry in entries:
        size = math.prod(sizes[a] for a in _spec.entry_axes(entry))
        if size > 1:
            out.append((entry, size))
    return out


def _check_positive(value: Any, name: str, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where}: {name} must be a positive number, got {value!r}")


def _entry_to_json(entry: AxisEntry) -> Any:
    return list(entry) if isinstance(entry, tuple) else entry


@dataclasses.dataclass(frozen=True)
class AutoShardingRule(ShardingRule):
    """Gives each large dim the first unused mesh axis that divides it.

    Leaves with fewer than `min_shard_size` elements (default: the mesh's
    device count) stay replicated. Otherwise dims are visited from largest to
    smallest (smallest first with `reverse=True`; equal sizes in dim order) and
    each takes the first still-unused entry of `axis_names` whose size divides
    it, until the entries run out. An entry may be a tuple of axes, which then
    acts as one axis of their product size. Size-1 axes are skipped.

    Example: on mesh `{'dp': 2, 'tp': 4}`, a `[1024, 512]` weight gives
    `P('dp', 'tp')`; with `axis_names=('tp', 'dp')` it gives `P('tp', 'dp')`.

    Args:
      mesh: a Mesh or AbstractMesh; None means the in-context mesh at apply.
      axis_names: entries to hand out, in priority order; default all axes.
      min_shard_size: smallest leaf (in elements) worth splitting.
      reverse: visit dims smallest first.
    """

    mesh: _mesh.AnyMesh | None = None
    axis_names: tuple[AxisEntry, ...] | None = None
    min_shard_size: int | None = None
    reverse: bool = False
    kind: ClassVar[str] = "auto"

    def __post_init__(self) -> None:
        where = "AutoShardingRule"
        object.__setattr__(self, "axis_names", _normalise_axis_names(self.axis_names, where))
        if self.min_shard_size is not None:
            if isinstance(self.min_shard_size, bool) or not isinstance(self.min_shard_size, int):
                raise TypeError(
                    f"{where}: min_shard_size must be an int, got {self.min_shard_size!r}")
            _check_positive(self.min_shard_size, "min_shard_size", where)
        if not isinstance(self.reverse, bool):
            raise TypeError(f"{where}: reverse must be a bool, got {self.reverse!r}")

    def apply(self, pytree: Any) -> Any:
        mesh = _mesh.resolve_mesh(self.mesh)
        entries = _mesh_entries(mesh, self.axis_names, "AutoShardingRule")
        min_size = self.min_shard_size or _mesh.device_count(mesh)

        def one(path: str, leaf: Any) -> P:
            shape = _tree.leaf_shape(leaf)
            if not shape or math.prod(shape) < min_size:
                return P()
            if self.reverse:
                order = sorted(range(len(shape)), key=lambda d: (shape[d], d))
            else:
                order = sorted(range(len(shape)), key=lambda d: (-shape[d], d))
            out: list[Any] = [None] * len(shape)
            unused = list(entries)
            for d in order:
                if not unused:
                    break
                for k, (entry, size) in enumerate(unused):
                    if shape[d] % size == 0:
                        out[d] = entry
                        del unused[k]
                        break
            return _spec.canonical(P(*out))

        return _tree.map_with_path(one, pytree)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "axis_names": None if self.axis_names is None
            else [_entry_to_json(e) for e in self.axis_names],
            "min_shard_size": self.min_shard_size,
            "reverse": self.reverse,
        }


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
        leaves, treedef = jax.tree_util.tree_flatten(pytree)
        chosen: list[P] = [P()] * len(leaves)
        for rule in self.rules:
            specs = treedef.flatten_up_to(rule.apply(pytree))
            for i, spec in enumerate(specs):
                if _spec.shards_nothing(chosen[i]) and not _spec.shards_nothing(spec):
                    chosen[i] = _spec.canonical(spec)
        return jax.tree_util.tree_unflatten(treedef, chosen)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "rules": [r.to_config() for r in self.rules]}


@dataclasses.dataclass(frozen=True)
class MemoryConstrainedShardingRule(ShardingRule):
    """Splits only the leaves too big for one device's budget, just enough.

    A leaf whose bytes fit `max_memory_per_device` stays replicated. Otherwise
    mesh axes are taken largest first (ties in `axis_names` order); each goes
    to the dim with the largest per-device extent that it divides (a dim may
    take several axes), until the per-device shard fits or the axes run out.

    Example: budget 1 MiB on `{'dp': 2, 'tp': 4}`: a 4 MiB `[1024, 1024]` f32
    weight gives `P('tp')` (1 MiB per device); a 512 KiB one stays `P()`.

    Args:
      max_memory_per_device: bytes (int) or a size string like "16GiB".
      mesh: a Mesh or AbstractMesh; None means the in-context mesh at apply.
      axis_names: axes it may use; default all.
    """

    max_memory_per_device: int | float | str
    mesh: _mesh.AnyMesh | None = None
    axis_names: tuple[AxisEntry, ...] | None = None
    kind: ClassVar[str] = "memory"

    def __post_init__(self) -> None:
        where = "MemoryConstrainedShardingRule"
        try:
            budget = parse_bytes(self.max_memory_per_device)
        except ValueError as err:
            raise ValueError(
                f"{where}: max_memory_per_device must be a positive number, got "
                f"{self.max_memory_per_device!r} ({err})"
            ) from None
        object.__setattr__(self, "max_memory_per_device", budget)
        object.__setattr__(self, "axis_names", _normalise_axis_names(self.axis_names, where))

    def apply(self, pytree: Any) -> Any:
        mesh = _mesh.resolve_mesh(self.mesh)
        entries = _mesh_entries(mesh, self.axis_names, "MemoryConstrainedShardingRule")
        # Largest first; sorted() is stable, so ties keep axis_names order.
        entries = sorted(entries, key=lambda e: -e[1])
        budget = self.max_memory_per_device

        def one(path: str, leaf: Any) -> P:
            shape = _tree.leaf_shape(leaf)
            if not shape or math.prod(shape) == 0:
                return P()
            itemsize = _tree.leaf_dtype(leaf).itemsize
            local = list(shape)
            if math.prod(local) * itemsize <= budget:
                return P()
            assigned: list[list[str]] = [[] for _ in shape]
            for entry, size in entries:
                if math.prod(local) * itemsize <= budget:
                    break
                fits = [d for d in range(len(local)) if local[d] % size == 0]
                if not fits:
                    continue
                d = min(fits, key=lambda d: (-local[d], d))
                assigned[d].extend(_spec.entry_axes(entry))
                local[d] //= size
            return _spec.canonical(P(*(tuple(a) if a else None for a in assigned)))

        return _tree.map_with_path(one, pytree)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "max_memory_per_device": self.max_memory_per_device,
            "axis_names": None if self.axis_names is None
            else [_entry_to_json(e) for e in self.axis_names],
        }


def _check_spec(spec: Any, where: str) -> P:
    if not isinstance(spec, P):
        raise TypeError(
            f"{where}: expected a jax.sharding.PartitionSpec, got "
            f"{type(spec).__name__} {spec!r}; wrap it as PartitionSpec(...)")
    for entry in spec:
        _spec.entry_axes(entry)  # raises TypeError on entries that name nothing valid
    return spec


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


FALLBACKS = ("replicate", "error")


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


@dataclasses.dataclass(frozen=True)
class BatchShardingRule(ShardingRule):
    """Splits the leading (batch) dim of every leaf over a group of axes.

    Leaves of rank 0 and non-arrays stay replicated. The axes act as one group
    of their product size, in the order given; `axes=()` replicates. A batch
    dim the group does not divide still gets the spec, so the analyzer reports
    it instead of the plan silently changing.

    Example: `BatchShardingRule(("dp", "tp"))` gives `P(('dp', 'tp'))` for a
    `[16, 128]` token batch; `BatchShardingRule(("dp",))` gives `P('dp')`.
    """

    axes: tuple[str, ...] = ()
    kind: ClassVar[str] = "batch"

    def __post_init__(self) -> None:
        axes = _normalise_axis_names(self.axes, "BatchShardingRule") or ()
        if any(isinstance(a, tuple) for a in axes):
            raise TypeError(
                f"BatchShardingRule: axes={self.axes!r} must be a flat tuple of axis names")
        object.__setattr__(self, "axes", axes)

    @property
    def entry(self) -> AxisEntry | None:
        """The spec entry for the batch dim: None, a name, or a tuple of names."""
        if not self.axes:
            return None
        return self.axes[0] if len(self.axes) == 1 else self.axes

    def apply(self, pytree: Any) -> Any:
        entry = self.entry
        return _tree.map_with_path(
            lambda path, leaf: P(entry) if entry and _tree.leaf_shape(leaf) else P(), pytree)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "axes": list(self.axes)}


def argument_specs(
    state_rule: ShardingRule, batch_rule: ShardingRule, args: Sequence[Any],
) -> tuple[Any, ...]:
    """Spec trees for `(state, *batch)`: the state rule on the first argument,
    the batch rule on each of the others (how every plan is applied)."""
    state, *rest = args
    return (state_rule.apply(state), *(batch_rule.apply(b) for b in rest))


_KINDS: dict[str, type[ShardingRule]] = {
    cls.kind: cls
    for cls in (AutoShardingRule, CompositeShardingRule, MemoryConstrainedShardingRule,
                ShapeBasedShardingRule, PathShardingRule, BatchShardingRule)
}


def rule_from_config(
    config: Any, mesh: _mesh.AnyMesh | None = None, where: str = "rule",
) -> ShardingRule:
    """Rebuilds a rule from its `to_config()` form, bound to `mesh`.

    Raises:
      ValueError: unknown kind or malformed fields; the message names `where`
        (e.g. the file and the rule's position in it).
    """
    if not isinstance(config, dict) or "kind" not in config:
        raise ValueError(f"{where}: expected an object with a 'kind', got {config!r}")
    kind = config["kind"]
    if kind not in _KINDS:
        raise ValueError(f"{where}: unknown rule kind {kind!r}; known kinds: {tuple(_KINDS)}")
    try:
        if kind == "auto":
            return AutoShardingRule(
                mesh=mesh, axis_names=_axis_names_from_json(config.get("axis_names")),
                min_shard_size=config.get("min_shard_size"), reverse=config.get("reverse", False))
        if kind == "memory":
            return MemoryConstrainedShardingRule(
                config["max_memory_per_device"], mesh=mesh,
                axis_names=_axis_names_from_json(config.get("axis_names")))
        if kind == "composite":
            return CompositeShardingRule(*(
                rule_from_config(c, mesh, f"{where}.rules[{i}]")
                for i, c in enumerate(config["rules"])))
        if kind == "batch":
            if not isinstance(config["axes"], list):
                raise TypeError(f"axes must be a list of axis names, got {config['axes']!r}")
            return BatchShardingRule(tuple(config["axes"]))
        if kind == "shape":
            return ShapeBasedShardingRule([
                (tuple(pattern), _spec.spec_from_json(spec, f"{where}.shape_patterns[{i}]"))
                for i, (pattern, spec) in enumerate(config["shape_patterns"])])
        return PathShardingRule(
            [(pattern, _spec.spec_from_json(spec, f"{where}.rules[{i}]"))
             for i, (pattern, spec) in enumerate(config["rules"])],
            fallback=config.get("fallback", "replicate"), mesh=mesh)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, ValueError) and str(err).startswith(where):
            raise
        raise ValueError(f"{where}: malformed {kind!r} rule ({err})") from None


def _axis_names_from_json(data: Any) -> tuple[AxisEntry, ...] | None:
    if data is None:
        return None
    if not isinstance(data, list):
        # A bare string would otherwise be split into one-letter axis names.
        raise TypeError(f"axis_names must be a list of axis names, got {data!r}")
    return tuple(tuple(e) if isinstance(e, list) else e for e in data)

