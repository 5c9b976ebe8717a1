"""The `logical` rule: logical axes (per leaf, a name per dim) mapped onto mesh axes.

A `LogicalAxisRule` holds a table of leaves (path, shape, one logical axis
name per dim, from `logical.discover`) and an assignment `logical name →
mesh axes`. It applies to any argument tree, state and batch alike, so one
assignment shards both consistently, the way flax's and MaxText's
`logical_axis_rules` do:

    rule = LogicalAxisRule(mesh, axes, {"heads": "tp", "mlp": "tp", "batch": "dp"})
    rule.apply(state)  # wq [64, 64] (embed, heads) → P(None, 'tp')

The file form flax and MaxText users know (`[logical_name, mesh_axes or
null]` pairs plus each parameter's logical names) is written by
`logical_axis_rules_json` and read back by `rule_from_logical_axis_rules`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import jax
from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import spec as _spec
from ..base import tree as _tree
from ..base.activations import placement
from ..base.warnings import ShardsearchWarning, note
from ..logical.axes import LeafAxes, LogicalAxes, LogicalAxis
from .axes import AxisEntry
from .base import ShardingRule

FORMAT = "logical-axis-rules"
FORMAT_VERSION = 1
# What an unknown leaf gets (flax's `RulesFallback` names the same choice).
FALLBACK = "replicate"
_INDEX = re.compile(r"^[0-9]+$")


def generalize(path: str) -> str:
    """The path with every numeric part replaced by `*`, so that the leaves of a
    deeper model of the same architecture match: `params/layers/3/attn/wq` →
    `params/layers/*/attn/wq`."""
    return "/".join("*" if _INDEX.match(part) else part for part in path.split("/"))


def normalise_entry(entry: Any, where: str) -> AxisEntry | None:
    """One assignment value checked and frozen: None, a name, or a group of names.

    Example: `["dp", "tp"]` → `("dp", "tp")`; `("tp",)` → `"tp"`; `()` → None.

    Raises:
      TypeError: not None, a string or a sequence of strings.
      ValueError: a mesh axis listed twice in one group.
    """
    if entry is None or isinstance(entry, str):
        if isinstance(entry, str) and not entry:
            raise TypeError(f"{where}: an empty string names no mesh axis; use None")
        return entry
    if not isinstance(entry, list | tuple) or not all(isinstance(a, str) and a for a in entry):
        raise TypeError(f"{where}: {entry!r} must be None, a mesh axis name or a tuple of "
                        "mesh axis names")
    group = tuple(entry)
    twice = [a for i, a in enumerate(group) if a in group[:i]]
    if twice:
        raise ValueError(f"{where}: mesh axis {twice[0]!r} is listed twice in {group!r}")
    if not group:
        return None
    return group[0] if len(group) == 1 else group


def entry_to_json(entry: AxisEntry | None) -> Any:
    """`None` → null, `"tp"` → `"tp"`, `("dp", "tp")` → `["dp", "tp"]`."""
    return list(entry) if isinstance(entry, tuple) else entry


@dataclasses.dataclass(frozen=True)
class LeafExplanation:
    """Why one leaf got its spec.

    Attributes:
      path: the leaf's `/`-joined path.
      shape: its shape (None for a non-array).
      names: its logical axis per dim, or None when the rule does not know it.
      spec: the spec the rule gives it.
      source: where the decision came from: `"exact"` (the recorded leaf),
        `"matched <path>"` (a table entry with its layer indices as `*`),
        or the fallback for a leaf the rule does not know.
      notes: for every dim whose logical axis is assigned but that stays
        unsharded, why; plus notes on the match (a resized leaf).

    Example: `LeafExplanation("params/layers/0/attn/wk", (64, 32), ("embed",
    "kv_heads"), P(), "exact", ("dim 1 (kv_heads, size 32): 'tp' (size 4) not
    used: logical axis 'kv_heads' has 2 units, not divisible by 4",))`.
    """

    path: str
    shape: tuple[int, ...] | None
    names: tuple[str | None, ...] | None
    spec: P
    source: str
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, init=False)
class LogicalAxisRule(ShardingRule):
    """Shards every leaf by its logical axes and a logical → mesh assignment.

    Leaves are looked up in the table of `axes` by path: the exact path
    first (the same shape preferred, then the same rank), then the path with
    its numeric parts as `*` (`generalize`), so a deeper model of the same
    architecture is covered. A leaf the table does not know (or knows with
    another rank) stays replicated (`FALLBACK`), and `explain` says so.

    Per leaf, dims are visited larger first, ties by dim index; with every
    axis on all mesh axes this is FSDP's "largest divisible dim" choice. A
    dim takes its logical axis's mesh entry only if
      - no earlier dim of the leaf used any of those mesh axes,
      - the dim size is divisible by the entry's size, and
      - when the leaf has its recorded shape, the logical axis's size (its
        units: heads, not heads × head_dim) is divisible too, so whole
        heads stay on each device; a resized leaf (another model size) is
        checked on its dim size only, its units being unknown;
    otherwise it stays unsharded and `explain` gives the reason. The rule
    never produces a spec that does not divide its dim.

    Example: with `wq` recorded as `(embed, heads)`, shape `[64, 64]`, heads
    of size 4, on mesh `{'dp': 2, 'tp': 4}`: `{"heads": "tp"}` gives
    `P(None, 'tp')`; `{"heads": ("dp", "tp")}` gives `P()` (4 heads do not
    split 8 ways), and `explain` says why.

    Args:
      mesh: a Mesh or AbstractMesh; None means the in-context mesh at apply.
        The assignment's mesh axes are checked against it when applied.
      axes: the logical axes (`logical.axes.LogicalAxes`); kept compact: the
        leaves of one argument sharing a generalized path, shape and names
        are held once, under the generalized path. Discovery notes (merges,
        unhandled primitives) are not part of the rule.
      assignment: logical axis name → a mesh axis, a tuple of mesh axes
        (acting as one axis of their product size), or None; a mapping or
        `(name, entry)` pairs. Names must be among `axes`; unnamed axes are
        unassigned.
    """

    mesh: _mesh.AnyMesh | None
    axes: LogicalAxes
    assignment: tuple[tuple[str, AxisEntry], ...] = ()
    kind: ClassVar[str] = "logical"

    def __init__(self, mesh: _mesh.AnyMesh | None, axes: LogicalAxes,
                 assignment: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        where = "LogicalAxisRule"
        if not isinstance(axes, LogicalAxes):
            raise TypeError(f"{where}: axes must be a LogicalAxes (from "
                            f"discover_logical_axes), got {type(axes).__name__}")
        pairs = assignment.items() if isinstance(assignment, Mapping) else assignment
        given: dict[str, AxisEntry | None] = {}
        for item in pairs:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise TypeError(f"{where}: assignment item {item!r} is not a (logical name, "
                                "mesh axes) pair")
            name, entry = item
            if name in given:
                raise ValueError(f"{where}: logical axis {name!r} is assigned twice")
            given[name] = normalise_entry(entry, f"{where}: assignment[{name!r}]")
        known = [a.name for a in axes.axes]
        unknown = [n for n in given if n not in known]
        if unknown:
            raise ValueError(f"{where}: assignment names logical axis {unknown[0]!r}, which "
                             f"is not among the axes {tuple(known)}; fix the name")
        # Axis order, Nones dropped: one spelling per meaning, so equal
        # assignments give equal configs.
        ordered = tuple((n, given[n]) for n in known if given.get(n) is not None)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "axes", compact(axes))
        object.__setattr__(self, "assignment", ordered)

    @property
    def mapping(self) -> dict[str, AxisEntry]:
        """The assignment as a dict (assigned axes only, in axis order)."""
        return dict(self.assignment)

    def with_axes(self, axes: LogicalAxes) -> LogicalAxisRule:
        """The same assignment over another table of logical axes.

        For a resized model, whose leaves the path lookup matches with their
        units unknown: rediscover its axes and keep the assignment, so heads
        are counted again. Assigned names the new axes lack are an error.

        Example: `load_rule("tiny.json").with_axes(discover_logical_axes(
        small.step, small.abstract()))`.
        """
        return LogicalAxisRule(self.mesh, axes, self.assignment)

    def to_flax(self) -> list[tuple[str, AxisEntry | None]]:
        """The assignment as Flax `logical_axis_rules`, ordered so that Flax's
        `nn.logical_to_mesh_axes` gives every leaf of the table the spec this
        rule gives it (`flax_pairs`).

        Example: `[("heads", "tp"), ("mlp", "tp"), ("embed", None)]`.

        Raises:
          FlaxRulesMismatch: a leaf no order of pairs gets right, named.
        """
        return flax_pairs([self])

    @classmethod
    def from_flax(cls, rules: Sequence[Any], mesh: _mesh.AnyMesh | None, *,
                  names: Any) -> LogicalAxisRule:
        """A rule from Flax or MaxText `logical_axis_rules` and the leaves' names.

        Args:
          rules: `[(logical name, mesh axis | tuple of mesh axes | None), ...]`
            in Flax's order of precedence (MaxText's `logical_axis_rules`).
            The first pair of each name is its entry; pairs naming a logical
            axis no leaf carries are left out.
          mesh: the mesh; every mesh axis the pairs name must be in it.
          names: the leaves' logical names: a `LogicalAxes`, or an argument
            tree whose parameters carry Flax boxes (`nnx.state(model)`, Linen's
            boxed variables), read by `logical.user.user_names`; an axis's
            size is then the smallest dim carrying it.

        Returns:
          The rule. Where its resolution (larger dims first, divisibility
          checked) gives a leaf another spec than Flax's would, a
          `FlaxRulesWarning` names the leaves.

        Raises:
          ValueError: malformed pairs, or a mesh axis the mesh lacks.

        Example: `LogicalAxisRule.from_flax([("embed", "fsdp"), ("mlp", "tp")],
        mesh, names=nnx.state(model))`.
        """
        where = "LogicalAxisRule.from_flax"
        if isinstance(rules, str | bytes) or not isinstance(rules, Sequence):
            raise TypeError(f"{where}: rules must be a list of (logical name, mesh axes) "
                            f"pairs, got {type(rules).__name__}")
        pairs = _checked_pairs(rules, "rules", mesh, where)
        axes = names if isinstance(names, LogicalAxes) else _boxed_axes(names)
        known = {a.name for a in axes.axes}
        first: dict[str, AxisEntry | None] = {}
        for n, e in pairs:
            if n in known:
                first.setdefault(n, e)
        rule = cls(mesh, axes, [(n, e) for n, e in first.items() if e is not None])
        if mesh is not None:
            _warn_flax_differences(rule, pairs)
        return rule

    def apply(self, pytree: Any) -> Any:
        table = self._table()
        return _tree.map_with_path(lambda path, leaf: table.spec(path, leaf).spec, pytree)

    def apply_argument(self, index: int, pytree: Any) -> Any:
        """`apply` looking leaves up in the table's `index`-th argument only
        (when the table has one), so two bare-array batch arguments, both at
        path "", each get their own logical axes."""
        table = self._table(index)
        return _tree.map_with_path(lambda path, leaf: table.spec(path, leaf).spec, pytree)

    def notes(self, pytree: Any, index: int | None = None) -> tuple[str, ...]:
        """One `unnamed` note listing the array leaves of `pytree` that the
        table has no logical names for (they are left replicated), if any."""
        unknown = [e.path or "(the argument itself)" for e in self.explain(pytree, index)
                   if e.names is None and e.shape]
        if not unknown:
            return ()
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more"
                                          if len(unknown) > 5 else "")
        return (note("unnamed", f"leaves with no logical names in the rule's table, left "
                                f"replicated: {shown}"),)

    def explain(self, pytree: Any, index: int | None = None) -> list[LeafExplanation]:
        """Per leaf of `pytree`, in leaf order: its logical names, spec and why.

        Example: for `wk` `(embed, kv_heads)` with 2 KV heads and `{"kv_heads":
        "tp"}` on tp=4: spec `P()`, note `"dim 1 (kv_heads, size 32): 'tp'
        (size 4) not used: logical axis 'kv_heads' has 2 units, not divisible
        by 4"`. `index`: as for `apply_argument`.
        """
        table = self._table(index)
        out: list[LeafExplanation] = []
        _tree.map_with_path(lambda path, leaf: out.append(table.spec(path, leaf)), pytree)
        return out

    def _table(self, index: int | None = None) -> _Table:
        mesh = _mesh.resolve_mesh(self.mesh)
        sizes = _mesh.axis_sizes(mesh)
        missing = [(n, a) for n, e in self.assignment for a in _spec.entry_axes(e)
                   if a not in sizes]
        if missing:
            name, axis = missing[0]
            raise ValueError(
                f"LogicalAxisRule: logical axis {name!r} is assigned mesh axis {axis!r}, "
                f"which is not in the mesh, whose axes are {tuple(sizes)}; fix the "
                "assignment or pass a mesh that has it")
        axes = self.axes
        if index is not None and 0 <= index < len(axes.arguments):
            axes = dataclasses.replace(axes, arguments=(axes.arguments[index],))
        return _Table(axes, self.mapping, sizes)

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "assignment": [[n, entry_to_json(e)] for n, e in self.assignment],
            "axes": [[a.name, a.size, a.role] for a in self.axes.axes],
            "arguments": [[[leaf.path, None if leaf.shape is None else list(leaf.shape),
                            list(leaf.names)] for leaf in argument]
                          for argument in self.axes.arguments],
        }

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None, where: str,
    ) -> LogicalAxisRule:
        axes = LogicalAxes(
            tuple(LogicalAxis(n, s, r) for n, s, r in config["axes"]),
            tuple(tuple(LeafAxes(p, None if s is None else tuple(s), tuple(names))
                        for p, s, names in argument)
                  for argument in config["arguments"]))
        assignment = config["assignment"]
        if not isinstance(assignment, list):
            raise TypeError(f"assignment must be a list of [name, mesh axes] pairs, got "
                            f"{assignment!r}")
        rule = cls(mesh, axes, [tuple(pair) for pair in assignment])
        if mesh is not None:
            rule._table()  # a mesh axis the mesh lacks fails when the config loads
        return rule

    def describe(self) -> list[str]:
        """The kind and table size, then one `logical → mesh axes` line per axis.

        Example:
          >>> LogicalAxisRule(mesh, axes, {"heads": "tp"}).describe()
          ['logical  3 axes, 2 leaves; unknown leaves: replicate',
           '   embed  -', '   heads  "tp"', '   mlp    -']
        """
        leaves = sum(len(a) for a in self.axes.arguments)
        mapping = self.mapping
        width = max((len(a.name) for a in self.axes.axes), default=0)
        lines = [f"{self.kind}  {len(self.axes.axes)} axes, {leaves} leaves; unknown leaves: "
                 f"{FALLBACK}"]
        for axis in self.axes.axes:
            entry = mapping.get(axis.name)
            value = "-" if entry is None else json.dumps(entry_to_json(entry))
            lines.append(f"   {axis.name.ljust(width)}  {value}")
        return lines


def compact(axes: LogicalAxes) -> LogicalAxes:
    """`axes` with the leaves of each argument that share a generalized path,
    shape and names held once, under the generalized path (at the first
    one's position); merges and unhandled notes dropped.

    Example: `params/layers/0/attn/wq` and `params/layers/1/attn/wq`, both
    `[64, 64]` `(embed, heads)`, become one `params/layers/*/attn/wq` entry;
    if layer 1's names differed, both would stay as they are.
    """
    arguments = []
    for argument in axes.arguments:
        groups: dict[str, list[LeafAxes]] = {}
        for leaf in argument:
            groups.setdefault(generalize(leaf.path), []).append(leaf)
        out: list[LeafAxes] = []
        for general, members in groups.items():
            first = members[0]
            if all((m.shape, m.names) == (first.shape, first.names) for m in members):
                out.append(LeafAxes(general, first.shape, first.names))
            else:
                out.extend(members)
        arguments.append(tuple(out))
    return LogicalAxes(axes.axes, tuple(arguments))


class _Table:
    """A rule's leaves indexed for lookup, bound to mesh sizes."""

    def __init__(self, axes: LogicalAxes, mapping: dict[str, AxisEntry],
                 sizes: dict[str, int]) -> None:
        self.mapping, self.sizes, self.units = mapping, sizes, axes.sizes
        # path → entries (argument order), generalized path → entries; a
        # batch argument's bare array and another's can share a path.
        self.exact: dict[str, list[LeafAxes]] = {}
        self.general: dict[str, list[LeafAxes]] = {}
        for argument in axes.arguments:
            for leaf in argument:
                if leaf.shape is not None:
                    self.exact.setdefault(leaf.path, []).append(leaf)
                    self.general.setdefault(generalize(leaf.path), []).append(leaf)

    def lookup(self, path: str, shape: tuple[int, ...]) -> tuple[LeafAxes | None, str]:
        """The table entry for a leaf: exact path (same shape first, then same
        rank), then generalized path (same rank); None when there is none."""
        exact = [e for e in self.exact.get(path, ()) if len(e.shape or ()) == len(shape)]
        for entry in exact:
            if entry.shape == shape:
                return entry, "exact"
        if exact:
            return exact[0], "exact"
        for entry in self.general.get(generalize(path), ()):
            if len(entry.shape or ()) == len(shape):
                return entry, f"matched {entry.path}"
        return None, f"unknown leaf: {FALLBACK}"

    def spec(self, path: str, leaf: Any) -> LeafExplanation:
        shape = _tree.leaf_shape(leaf)
        if not shape:
            names: tuple[str | None, ...] | None = None if shape is None else ()
            return LeafExplanation(path, shape, names, P(), "scalar or non-array")
        entry, source = self.lookup(path, shape)
        if entry is None:
            return LeafExplanation(path, shape, None, P(), source,
                                   ("the rule's table has no leaf of this path and rank; "
                                    f"it is left replicated ({FALLBACK})",))
        notes: list[str] = []
        recorded = entry.shape == shape
        if not recorded:
            notes.append(f"resized: recorded as {list(entry.shape or ())}, now {list(shape)}; "
                         "dims checked on their size only (units unknown)")
        out: list[AxisEntry | None] = [None] * len(shape)
        used: dict[str, int] = {}  # mesh axis → the dim that took it
        for d in sorted(range(len(shape)), key=lambda d: (-shape[d], d)):
            name = entry.names[d]
            target = self.mapping.get(name) if name is not None else None
            if target is None:
                continue
            mesh_axes = _spec.entry_axes(target)
            n = math.prod(self.sizes[a] for a in mesh_axes)
            what = f"dim {d} ({name}, size {shape[d]}): {_entry_text(target)} (size {n})"
            taken = [a for a in mesh_axes if a in used]
            if n == 1:
                notes.append(f"{what} not used: its mesh axes have size 1")
            elif taken:
                other = used[taken[0]]
                notes.append(f"{what} not used: mesh axis {taken[0]!r} is already used by "
                             f"dim {other} ({entry.names[other]})")
            elif shape[d] % n:
                notes.append(f"{what} not used: {shape[d]} is not divisible by {n}")
            elif recorded and self.units[name] % n:
                notes.append(f"{what} not used: logical axis {name!r} has "
                             f"{self.units[name]} units, not divisible by {n}")
            else:
                out[d] = target
                used.update({a: d for a in mesh_axes})
        return LeafExplanation(path, shape, entry.names, _spec.canonical(P(*out)), source,
                               tuple(notes))


def _boxed_axes(tree: Any) -> LogicalAxes:
    """The logical axes the Flax boxes of one argument tree give (`logical.user`)."""
    from ..logical.user import user_names

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    names = user_names(tree)
    sizes: dict[str, int] = {}
    leaves = []
    for (path, leaf), given in zip(flat, names, strict=True):
        shape = _tree.leaf_shape(leaf)
        if shape is None:
            leaves.append(LeafAxes(_tree.path_str(path), None, ()))
            continue
        given = given if given is not None and len(given) == len(shape) else (None,) * len(
            shape)
        for n, d in zip(given, shape, strict=True):
            if n is not None:
                sizes[n] = min(sizes.get(n, d), d)
        leaves.append(LeafAxes(_tree.path_str(path), shape, given))
    if not sizes:
        raise ValueError("LogicalAxisRule.from_flax: names= has no leaf with Flax logical "
                         "names (nn.with_logical_partitioning, nnx.with_partitioning); give "
                         "a LogicalAxes or the boxed state")
    return LogicalAxes(tuple(LogicalAxis(n, s) for n, s in sizes.items()), (tuple(leaves),))


class FlaxRulesWarning(ShardsearchWarning):
    """Flax's resolution of `logical_axis_rules` (by the pairs' order, without a
    divisibility check, with fallback pairs) gives some leaves other specs than
    the `LogicalAxisRule` built from them."""


def _warn_flax_differences(rule: LogicalAxisRule,
                           pairs: Sequence[tuple[str, AxisEntry | None]]) -> None:
    table = rule._table()
    differ = []
    for argument in rule.axes.arguments:
        for leaf in argument:
            if not leaf.shape:
                continue
            ours = table.spec(leaf.path, jax.ShapeDtypeStruct(leaf.shape, "float32")).spec
            try:
                theirs = flax_resolve(leaf.names, pairs)
            except ValueError as err:
                differ.append(f"{leaf.path}: {err}")
                continue
            if theirs != _spec.canonical(ours):
                differ.append(f"{leaf.path}: Flax {theirs}, this rule {_spec.canonical(ours)}")
    if differ:
        more = f" (+{len(differ) - 3} more)" if len(differ) > 3 else ""
        warnings.warn(FlaxRulesWarning(
            f"LogicalAxisRule.from_flax: on {len(differ)} leaves the rule gives other specs "
            f"than Flax would: {'; '.join(differ[:3])}{more}"), stacklevel=3)


def _entry_text(entry: AxisEntry) -> str:
    return repr(entry) if isinstance(entry, str) else repr(tuple(entry))


# --------------------------------------------------------------------------- file form


def logical_axis_rules_json(
    rule: LogicalAxisRule, mesh_axes: Mapping[str, int],
    batch_rule: ShardingRule | None = None,
) -> dict[str, Any]:
    """The rule in the form flax and MaxText users know, as JSON-ready data.

    `rules` lists every logical axis as `[logical_name, mesh_axes or null]`
    (`nn.logical_to_mesh_axes(names, rules)` takes the same pairs); `params`
    gives each state leaf's logical names (with its shape, so the divisibility
    of units can be checked on the model it was found on); `batch` the same
    for the batch arguments when `batch_rule` is logical too.

    Example:
      {"format": "logical-axis-rules", "version": 1,
       "mesh": {"axis_names": ["dp", "tp"], "axis_sizes": [2, 4]},
       "rules": [["batch", "dp"], ["embed", null], ["heads", "tp"]],
       "axes": [["batch", 8, "batch"], ...],
       "params": [["params/layers/*/attn/wq", [64, 64], ["embed", "heads"]], ...]}

    Note: flax resolves a leaf's dims in dim order; this rule visits larger
    dims first (see `LogicalAxisRule`), so load the file with `load_rule` to
    get exactly the specs the search measured.
    """
    config = rule.to_config()
    mapping = rule.mapping
    out: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "mesh": {"axis_names": list(mesh_axes), "axis_sizes": list(mesh_axes.values())},
        "rules": [[a.name, entry_to_json(mapping.get(a.name))] for a in rule.axes.axes],
        "axes": config["axes"],
        "params": config["arguments"][0] if config["arguments"] else [],
    }
    if isinstance(batch_rule, LogicalAxisRule):
        out["batch"] = batch_rule.to_config()["arguments"]
        batch_axes = {a.name: a for a in batch_rule.axes.axes}
        known = [a[0] for a in out["axes"]]
        out["axes"] = out["axes"] + [[a.name, a.size, a.role] for n, a in batch_axes.items()
                                     if n not in known]
        out["rules"] += [[n, entry_to_json(batch_rule.mapping.get(n))]
                         for n in batch_axes if n not in known]
    return out


def rule_from_logical_axis_rules(
    data: Any, mesh: _mesh.AnyMesh | None, where: str,
) -> tuple[LogicalAxisRule, LogicalAxisRule | None, _mesh.AnyMesh]:
    """Rebuilds the rules from `logical_axis_rules_json`'s form.

    Args:
      data: the parsed file.
      mesh: the mesh to bind the rules to; it must have the file's axis names
        (sizes may differ). None: an AbstractMesh with the file's axes.
      where: the file, for error messages.

    Returns:
      `(state_rule, batch_rule or None, mesh)`.

    Raises:
      ValueError: naming `where`, for anything malformed or a mesh with other
        axis names.
    """
    fix = f"write it again with `shardsearch export --format {FORMAT}`"
    try:
        if not isinstance(data, dict) or data.get("format") not in (FORMAT, FLAX_FORMAT):
            raise ValueError(f"expected an object with \"format\": {FORMAT!r} or "
                             f"{FLAX_FORMAT!r}")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
            raise ValueError(f"version {version!r} is not one this shardsearch reads "
                             f"(up to {FORMAT_VERSION}); upgrade shardsearch")
        names, sizes = data["mesh"]["axis_names"], data["mesh"]["axis_sizes"]
        if not (isinstance(names, list) and isinstance(sizes, list)
                and len(names) == len(sizes)):
            raise TypeError("mesh must have axis_names and axis_sizes, one size per name")
        recorded = _mesh.abstract_mesh(tuple(sizes), tuple(names))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: malformed {FORMAT} file ({err}); {fix}") from None
    bound = recorded if mesh is None else _mesh.resolve_mesh(mesh)
    if tuple(bound.axis_names) != tuple(names):
        raise ValueError(
            f"{where}: the rules were found on a mesh with axes {tuple(names)} but the mesh "
            f"given has axes {tuple(bound.axis_names)}; use those axis names in that order "
            "(sizes may differ)")
    try:
        # A flax-rules file's pairs for the step's Flax constraints (the names
        # under "unconstrained") place activations, not these leaves.
        activations = set(data.get("unconstrained") or ())
        rules = [p for p in _pairs(data["rules"], "rules") if p[0] not in activations]
        axes = [list(a) for a in data["axes"]]
        known = [a[0] for a in axes]
        unknown = [n for n, _ in rules if n not in known]
        if unknown:
            raise ValueError(f"rules name logical axis {unknown[0]!r}, which 'axes' lacks")
        state = _rule(axes, [data["params"]], rules, bound)
        batch = None
        if data.get("batch") is not None:
            batch = _rule(axes, data["batch"], rules, bound)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: malformed {FORMAT} file ({err}); {fix}") from None
    return state, batch, bound


def _pairs(data: Any, what: str) -> list[tuple[str, Any]]:
    if not isinstance(data, list):
        raise TypeError(f"{what} must be a list of [logical_name, mesh_axes_or_null] pairs, "
                        f"got {type(data).__name__}")
    for i, p in enumerate(data):
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)):
            raise TypeError(f"{what} must be a list of [logical_name, mesh_axes_or_null] "
                            f"pairs; item {i} is {p!r}")
    return [(p[0], p[1]) for p in data]


def _rule(axes: Sequence[list[Any]], arguments: Sequence[Any],
          rules: Sequence[tuple[str, Any]], mesh: _mesh.AnyMesh | None) -> LogicalAxisRule:
    used = {leaf[2][d] for argument in arguments for leaf in argument
            for d in range(len(leaf[2])) if leaf[2][d] is not None}
    # Each rule keeps the axes its own leaves carry, so a state rule does not
    # list the batch's axes (as the search builds them).
    mine = [a for a in axes if a[0] in used]
    config = {"kind": LogicalAxisRule.kind, "axes": mine, "arguments": list(arguments),
              "assignment": [[n, e] for n, e in rules if e is not None and n in used]}
    return LogicalAxisRule.from_config(config, mesh, "logical-axis-rules")


# --------------------------------------------------------------------------- Flax's rules

FLAX_FORMAT = "flax-rules"


class FlaxRulesMismatch(ValueError):
    """No order of `(logical name, mesh axes)` pairs makes Flax's resolution
    give a leaf the spec the rule gives it; the message names the leaves."""


def flax_resolve(names: Sequence[str | None], pairs: Sequence[tuple[str, Any]]) -> P:
    """The spec Flax's `nn.logical_to_mesh_axes(names, pairs)` gives, without Flax.

    The pairs are in order of precedence: each assigns its mesh axes to the
    first dim carrying its logical name when that dim is still unassigned and
    none of those mesh axes is used yet. Nothing checks divisibility.

    Example: `flax_resolve(("embed", "mlp"), [("mlp", "tp"), ("embed", "tp")])`
    → `P(None, 'tp')`; with the pairs the other way round, `P('tp')`.

    Raises:
      ValueError: a name on two dims (Flax refuses it too).
    """
    twice = [n for i, n in enumerate(names) if isinstance(n, str) and n in names[:i]]
    if twice:
        raise ValueError(f"logical name {twice[0]!r} is on two dims of {tuple(names)}; Flax "
                         "refuses that")
    unassigned = object()
    # A dim given no name stays as given (None, or P.UNCONSTRAINED), as in Flax.
    result: list[Any] = [unassigned if isinstance(n, str) else n for n in names]
    for name, entry in pairs:
        if name not in names:
            continue
        pos = list(names).index(name)
        wanted = set(_spec.entry_axes(entry)) if entry is not None else set()
        used = {a for r in result if r is not unassigned and r is not None
                for a in _spec.entry_axes(r)}
        if not wanted & used and result[pos] is unassigned:
            result[pos] = entry
    return _spec.canonical(P(*[None if r is unassigned else r for r in result]))


def flax_pairs(rules: Sequence[LogicalAxisRule]) -> list[tuple[str, AxisEntry | None]]:
    """The rules' assignment as Flax `logical_axis_rules` that give the same specs.

    Our rule visits a leaf's larger dims first and leaves unsharded a dim whose
    mesh axes do not divide it; Flax resolves by the order of the pairs and
    checks nothing. So the pairs are ordered to agree on every leaf of the
    rules' tables (a name whose mesh axes a larger dim took comes after that
    dim's name), and a name no leaf is sharded on gets null. Every leaf is then
    checked through `flax_resolve`.

    Args:
      rules: `LogicalAxisRule`s sharing one assignment (the state's and the
        batch's of one plan).

    Returns:
      `[(logical name, mesh axes or None), ...]` in the order to give Flax.

    Raises:
      FlaxRulesMismatch: a leaf no order of pairs gives its spec (a name on
        two of its dims, a dim left unsharded for divisibility where Flax
        would shard it, contradictory orders); every such leaf is named.

    Example: `wq (embed 64, heads 256)` and `w1 (mlp 512, embed 64)` with
    embed and heads and mlp all on `"x"`: our rule puts `x` on the larger dim of
    each leaf, so the pairs come out `[heads, mlp, embed]` (both before embed).
    """
    mapping: dict[str, AxisEntry] = {}
    order: list[str] = []
    leaves: list[tuple[str, LeafAxes, P]] = []
    for rule in rules:
        for name, entry in rule.assignment:
            if mapping.setdefault(name, entry) != entry:
                raise FlaxRulesMismatch(
                    f"logical axis {name!r} is on {entry!r} in one rule and "
                    f"{mapping[name]!r} in another; Flax's rules give one entry per name")
        order += [a.name for a in rule.axes.axes if a.name not in order]
        table = rule._table()
        for a, argument in enumerate(rule.axes.arguments):
            for leaf in argument:
                if leaf.shape:
                    struct = jax.ShapeDtypeStruct(leaf.shape, "float32")
                    where = f"{rule.kind} argument {a} leaf {leaf.path!r}"
                    leaves.append((where, leaf, table.spec(leaf.path, struct).spec))
    sharded: dict[str, None] = {}
    before: dict[str, dict[str, None]] = {n: {} for n in order}  # name -> names that precede
    problems: list[str] = []
    for _where, leaf, spec in leaves:
        entries = list(spec) + [None] * (len(leaf.names) - len(spec))
        for name, got in zip(leaf.names, entries, strict=True):
            if got is not None and name is not None:
                sharded[name] = None
            if got is not None or name is None or name not in mapping:
                continue
            # Assigned but unsharded here: some sharded dim of this leaf must
            # have taken one of its mesh axes first.
            wanted = set(_spec.entry_axes(mapping[name]))
            blockers = [leaf.names[e] for e, other in enumerate(entries)
                        if other is not None and wanted & set(_spec.entry_axes(other))]
            for blocker in blockers:
                if blocker is not None:
                    before[name][blocker] = None
    pairs_order = _precedence(order, before)
    pairs: list[tuple[str, AxisEntry | None]] = [
        (n, mapping[n] if n in sharded else None) for n in pairs_order if n in mapping]
    pairs += [(n, None) for n in order if n not in mapping]
    for where, leaf, spec in leaves:
        try:
            got = flax_resolve(leaf.names, pairs)
        except ValueError as err:
            problems.append(f"{where}: {err}")
            continue
        if got != _spec.canonical(spec):
            problems.append(f"{where}: Flax gives {got}, the rule {_spec.canonical(spec)}")
    if problems:
        shown = "; ".join(dict.fromkeys(problems[:5]))
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise FlaxRulesMismatch(
            f"Flax's logical_axis_rules cannot give the specs the search measured on "
            f"{len(problems)} leaves: {shown}{more}; use --format logical-axis-rules (read "
            "with shardsearch.load_rule) or the plan file for these")
    return pairs


def flax_activation_pairs(points: Sequence[Sequence[Any]], placed: Mapping[str, AxisEntry | None],
                          pairs: Sequence[tuple[str, Any]]
                          ) -> tuple[list[tuple[str, AxisEntry | None]], list[str]]:
    """Pairs that make Flax's `nn.with_logical_constraint` place a step's
    activations as the search placed them, after `pairs` (the parameters').

    Under a search a Flax constraint is a point (`base.activations.placement`,
    `unnamed_whole`): a placed name gets its mesh axes, where two of a point's
    dims ask for one mesh axis the later dim keeps it, and every other named
    dim is left to XLA. Flax instead goes by the order of its pairs and keeps
    a dim whole when no pair places it (a point none of whose names is placed
    is not constrained by the search, so Flax must leave all its dims to XLA).
    So the placed names come first, a
    name ordered before the names of earlier dims it shares mesh axes with,
    and then every activation name once more as `(name, P.UNCONSTRAINED)`.
    Each point is then checked through `flax_resolve`.

    Args:
      points: each Flax constraint's names, one per dim (None: kept whole;
        `P.UNCONSTRAINED`: XLA's), as `activations.trace_points` finds them.
      placed: the search's activation rules, name -> mesh axes (None: whole);
        a name not in it was left to XLA.
      pairs: the parameters' pairs, which come first (a name that is on
        parameters too takes their pair in Flax).

    Returns:
      `(the placed names' pairs, the names to add as (name, P.UNCONSTRAINED))`.

    Raises:
      FlaxRulesMismatch: each point Flax would place otherwise, with both specs.
    """
    on_params = {n for n, _ in pairs}
    order = list(dict.fromkeys(n for names in points for n in names
                               if isinstance(n, str) and n not in on_params))
    before: dict[str, dict[str, None]] = {n: {} for n in order}
    for names in points:
        for i, name in enumerate(names):
            if name not in placed or name not in before:
                continue
            mine = set(_spec.entry_axes(placed[name]))
            for later in names[i + 1:]:  # a later dim's name goes first where axes meet
                if later in placed and later in before and mine & set(
                        _spec.entry_axes(placed[later])):
                    before[name][later] = None
    extra = [(n, placed[n]) for n in _precedence(order, before) if n in placed]
    loose = list(order)
    resolved = [*pairs, *extra, *((n, P.UNCONSTRAINED) for n in loose)]
    problems = []
    for names in points:
        # A point no rule names is not constrained at all: every dim XLA's.
        want = _spec.canonical(placement(names, placed, unnamed_whole=True) if any(
            isinstance(n, str) and n in placed for n in names) else P(*[P.UNCONSTRAINED] * len(
                names)))
        try:
            got = flax_resolve(tuple(names), resolved)
        except ValueError as err:
            problems.append(str(err))
            continue
        if got != want:
            shared = [n for n in names if n in on_params]
            why = (f" ({', '.join(map(repr, shared))} also names parameters, whose pair Flax "
                   "gives it)" if shared else "")
            whole = (" (Flax keeps a dim named None whole, where the search placed none of "
                     "the point's names and left it to XLA: name it, or give it "
                     "PartitionSpec.UNCONSTRAINED)" if None in names and not why else "")
            problems.append(f"point {tuple(names)}: Flax gives {got}, the search traced "
                            f"{want}{why}{whole}")
    if problems:
        shown = "; ".join(problems[:5])
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise FlaxRulesMismatch(
            f"Flax's logical_axis_rules cannot place the step's activations as the search "
            f"traced them at {len(problems)} nn.with_logical_constraint points: {shown}{more}; "
            "give activations names of their own (MaxText's activation_batch, ...), or "
            "export another trial, or use the plan file with plan.build_step")
    return extra, loose


def _precedence(order: Sequence[str], before: Mapping[str, Mapping[str, None]]) -> list[str]:
    """`order` sorted so that every name comes after the names in `before[name]`,
    otherwise keeping `order`; a cycle keeps its names in `order` (the check
    after it names the leaves that then differ)."""
    out: list[str] = []
    left = list(order)
    while left:
        ready = next((n for n in left if all(b in out or b not in left
                                             for b in before.get(n, {}))), left[0])
        out.append(ready)
        left.remove(ready)
    return out


def flax_rules_json(
    rule: LogicalAxisRule, mesh_axes: Mapping[str, int], batch_rule: ShardingRule | None = None,
) -> dict[str, Any]:
    """The `flax-rules` file: `logical_axis_rules_json` whose `rules` give, through
    Flax's own `nn.logical_to_mesh_axes` (or `nnx.logical_to_mesh_axes`), the
    very specs the rule gives every leaf of its table (`flax_pairs`).

    Example: `{"format": "flax-rules", "version": 1, "rules": [["heads", "tp"],
    ["embed", null], ...], "params": [[path, shape, names], ...], ...}`; a
    Flax user passes `rules` to `nn.logical_axis_rules(...)` or
    `nn.logical_to_mesh_sharding(specs, mesh, rules)`.

    Raises:
      FlaxRulesMismatch: see `flax_pairs`.
    """
    rules = [rule] + ([batch_rule] if isinstance(batch_rule, LogicalAxisRule) else [])
    pairs = flax_pairs(rules)
    out = logical_axis_rules_json(rule, mesh_axes, batch_rule)
    out["format"] = FLAX_FORMAT
    out["rules"] = [[n, entry_to_json(e)] for n, e in pairs]
    return out



def _checked_pairs(items: Iterable[Any], label: str, mesh: _mesh.AnyMesh | None,
                   where: str) -> list[tuple[str, AxisEntry | None]]:
    """`(logical name, mesh axes)` pairs, each entry normalised; an item that
    is not such a pair is a TypeError naming `label[i]`, a mesh axis `mesh`
    lacks a ValueError."""
    pairs: list[tuple[str, AxisEntry | None]] = []
    for i, item in enumerate(items):
        if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(
                item[0], str):
            raise TypeError(f"{where}: {label}[{i}] = {item!r} is not a (logical name, "
                            "mesh axes) pair")
        pairs.append((item[0], normalise_entry(item[1], f"{where}: {label}[{i}]")))
    if mesh is not None:
        sizes = _mesh.axis_sizes(_mesh.resolve_mesh(mesh))
        unknown = [(n, a) for n, e in pairs for a in _spec.entry_axes(e) if a not in sizes]
        if unknown:
            raise ValueError(
                f"{where}: logical axis {unknown[0][0]!r} is mapped to mesh axis "
                f"{unknown[0][1]!r}, which is not in the mesh {tuple(sizes)}; map it to "
                "null or use a mesh that has that axis")
    return pairs

@dataclasses.dataclass(frozen=True, init=False)
class FlaxBoxRule(ShardingRule):
    """Flax's `logical_axis_rules` on the logical names the arguments carry.

    A MaxText-style rules list alone (no table of leaves) as a rule: each leaf
    inside a Flax box (`nnx.Param` with `sharding`, Linen's
    `LogicallyPartitioned`) gets `flax_resolve(its names, pairs)`, exactly as
    Flax would shard it; any other leaf stays replicated (`FALLBACK`, an
    `unnamed` note). What `--start-from` makes of a bare rules list.

    Example: `FlaxBoxRule(mesh, [("embed", "fsdp"), ("mlp", "tp")])` on
    `nnx.state(model)` gives a kernel boxed `("embed", "mlp")` `P('fsdp', 'tp')`.

    Args:
      mesh: the mesh the pairs' axes are checked against (None: not checked).
      pairs: `(logical name, mesh axes or None)` in order of precedence.
    """

    mesh: _mesh.AnyMesh | None
    pairs: tuple[tuple[str, AxisEntry | None], ...]
    kind: ClassVar[str] = "flax-boxes"

    def __init__(self, mesh: _mesh.AnyMesh | None, pairs: Iterable[Any]) -> None:
        checked = _checked_pairs(pairs, "pairs", mesh, "FlaxBoxRule")
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "pairs", tuple(checked))

    def apply(self, pytree: Any) -> Any:
        from ..logical.user import box_names, is_box

        def one(node: Any) -> Any:
            names = box_names(node)
            if names is None:
                return P()
            return jax.tree.map(
                lambda leaf: flax_resolve(names, self.pairs)
                if len(_tree.leaf_shape(leaf) or ()) == len(names) else P(), node)

        return jax.tree.map(one, pytree, is_leaf=is_box)

    def notes(self, pytree: Any, index: int | None = None) -> tuple[str, ...]:
        from ..logical.user import user_names

        flat = jax.tree_util.tree_flatten_with_path(pytree)[0]
        unknown = [_tree.path_str(p) or "(the argument itself)"
                   for (p, leaf), names in zip(flat, user_names(pytree), strict=True)
                   if names is None and _tree.leaf_shape(leaf)]
        if not unknown:
            return ()
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more"
                                          if len(unknown) > 5 else "")
        return (note("unnamed", f"leaves in no Flax box with logical names, left "
                                f"replicated: {shown}"),)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "pairs": [[n, entry_to_json(e)] for n, e in self.pairs]}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None,
                    where: str) -> FlaxBoxRule:
        pairs = config["pairs"]
        if not isinstance(pairs, list):
            raise TypeError(f"pairs must be a list of [name, mesh axes] pairs, got {pairs!r}")
        return cls(mesh, [tuple(p) for p in pairs])


def rules_list_candidate(data: Any, mesh: _mesh.AnyMesh | None, where: str
                         ) -> tuple[FlaxBoxRule, ShardingRule]:
    """A MaxText-style `logical_axis_rules` list (or `{"logical_axis_rules": [...]}`)
    as `(state rule, batch rule)`: `FlaxBoxRule` for the state; for the batch a
    `BatchShardingRule` on the mesh axes of the first pair named `batch` or
    `activation_batch` (replicated without one).

    Raises:
      ValueError: naming `where`: not a list of pairs, or a mesh axis the mesh lacks.
    """
    from .batch import BatchShardingRule

    if isinstance(data, dict) and "logical_axis_rules" in data:
        data = data["logical_axis_rules"]
    if data == []:
        raise ValueError(f"{where}: the logical_axis_rules list holds no pairs; give "
                         "[logical_name, mesh_axes_or_null] pairs, or a plan file")
    try:
        pairs = _pairs(data, "a logical_axis_rules list")
        state = FlaxBoxRule(mesh, pairs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None
    batch = next((e for n, e in state.pairs if n in ("batch", "activation_batch")), None)
    axes = () if batch is None else (batch,) if isinstance(batch, str) else tuple(batch)
    return state, BatchShardingRule(axes)
