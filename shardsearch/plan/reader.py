"""The plan file read back: schema-1 JSON → rules, recorded specs, checks.

Reading parses JSON only — nothing a file names is imported, evaluated or
unpickled — and checks every field, naming the file in each error. A loaded
`ShardingPlan` gives the recorded specs for the arguments it was found for
and applies its rules afresh, with a warning, to anything else. docs/plan-files.md
documents every field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._version import __version__
from ..base import mesh as _mesh
from ..base import spec as _spec
from ..base import tree as _tree
from ..base.activations import AUTO, PREFIX, split_setting, under_rules
from ..base.jsonfile import read_json
from ..base.knobs import Knobs
from ..base.monitor import ShardingWarning
from ..rules.base import ShardingRule, argument_specs, rule_from_config
from ..rules.batch import BatchShardingRule

SCHEMA = 1
# What a plan needs to load; everything else in the file is optional.
_FIELDS = ("schema", "mesh", "state_rule", "batch_rule")
_INVALID = "{where}: the file is {problem}; export it again with `shardsearch export`"


class PlanMismatchWarning(ShardingWarning):
    """A plan met arguments (or a mesh) other than those it was found for.

    Its rules were applied afresh; the specs that come out were never measured.
    """


class LeafRecord(NamedTuple):
    """One leaf of a recorded argument: where it is, what it is, how it was split."""

    path: str
    shape: tuple[int, ...] | None
    dtype: str | None
    spec: P


def leaf_info(tree: Any) -> list[dict[str, Any]]:
    """Path, shape and dtype of every leaf, in leaf order (null for non-arrays)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape, dtype = _tree.leaf_shape(leaf), _tree.leaf_dtype(leaf)
        out.append({"path": _tree.path_str(path),
                    "shape": None if shape is None else list(shape),
                    "dtype": None if dtype is None else str(dtype)})
    return out


def leaves_hash(arguments: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    """Hash of every leaf's path, shape and dtype (not its spec), argument by argument."""
    data = [[[leaf["path"], leaf["shape"], leaf["dtype"]] for leaf in arg] for arg in arguments]
    return hashlib.sha256(json.dumps(data, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """A loaded plan: the rules, the mesh they were found on, the recorded specs.

    Attributes:
      rule: the state rule (a `ShardingRule`, bound to `mesh`).
      batch_rule: the rule for every other argument.
      mesh: the mesh the rules are bound to: the one given to `load_plan`, or an
        AbstractMesh with the recorded axes.
      recorded_mesh: `((axis, size), ...)` the plan was found on.
      workload: the name of the workload the specs were resolved on, or None.
      fingerprint: hash of the recorded leaves' paths, shapes and dtypes
        (None when the plan has no resolved specs).
      leaves: per argument, the recorded `LeafRecord`s (None without specs).
      results: the file's "results" section (measured numbers), or None.
      source: the file (or "config") the plan came from, for messages.
      knobs: how to build the step the plan was found for, `{knob: value}`
        (`plan.build_step(knobs)`: the factory's knobs, and where the
        activations go, the `act_<name>` knobs; a knob not listed keeps its
        default); empty when the search did not choose the step's knobs.

    Example:
      >>> plan = load_plan("plan.json")
      >>> state_specs, batch_specs = plan.apply(workload.abstract())
    """

    rule: ShardingRule
    batch_rule: ShardingRule
    mesh: _mesh.AnyMesh
    recorded_mesh: tuple[tuple[str, int], ...]
    workload: str | None = None
    fingerprint: str | None = None
    leaves: tuple[tuple[LeafRecord, ...], ...] | None = None
    results: Mapping[str, Any] | None = None
    source: str = "config"
    knobs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def build_step(self, step: Callable[..., Any] | Knobs) -> Callable[..., Any]:
        """The step the plan was found for, built from `step` with `knobs`.

        Args:
          step: the `Knobs` the search was given (or a workload's `knobs`), or
            the plain step when the plan's only knobs place activations.

        Returns:
          `step.make_step(**knobs)` (defaults for the knobs not listed), or
          `step`, tracing its `shardsearch.activation` points as the plan's
          `act_<name>` knobs place them on `mesh` (the one `load_plan` was
          given, else the recorded axes).

        Raises:
          ValueError: the plan sets a factory's knobs but `step` is a plain
            function, or names a knob `step` does not declare.
        """
        own, rules = split_setting(tuple(self.knobs.items()))
        if isinstance(step, Knobs):
            inner = step.make_step(**step.values(step.setting(dict(own))))
        elif own:
            raise ValueError(f"{self.source}: the plan sets the step's knobs "
                             f"{dict(own)}; pass the Knobs (or the workload's knobs) it was "
                             "found with, not a built step")
        else:
            inner = step
        return under_rules(inner, rules, tuple(_mesh.axis_sizes(self.mesh).items()))

    @property
    def batch_spec(self) -> P | None:
        """The batch's leading-dim spec when the batch rule is a BatchShardingRule."""
        if isinstance(self.batch_rule, BatchShardingRule):
            return P(self.batch_rule.entry) if self.batch_rule.entry else P()
        return None

    @property
    def recorded_specs(self) -> tuple[dict[str, P], ...] | None:
        """Per argument, `{leaf path: spec}` as the search resolved it."""
        if self.leaves is None:
            return None
        return tuple({leaf.path: leaf.spec for leaf in arg} for arg in self.leaves)

    def mismatch(self, args: Sequence[Any]) -> str | None:
        """Why the recorded specs do not fit `args` on `mesh`, or None when they do.

        Also non-None ("no recorded specs") when the plan has none.
        """
        if self.leaves is None:
            return "the plan has no recorded specs"
        sizes = _mesh.axis_sizes(self.mesh)
        if tuple(sizes.items()) != self.recorded_mesh:
            return (f"the mesh has sizes {sizes}, the plan was found on "
                    f"{dict(self.recorded_mesh)}")
        if len(args) != len(self.leaves):
            return (f"{len(args)} arguments given, the plan recorded {len(self.leaves)} "
                    "(state, *batch)")
        got = [leaf_info(tree) for tree in args]
        if leaves_hash(got) == self.fingerprint:
            return None
        return _first_difference(got, self.leaves)

    def apply(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """Spec trees for `(state, *batch)`.

        The recorded specs when the arguments' leaves (paths, shapes, dtypes)
        and the mesh sizes are the ones the plan was found for; otherwise the
        rules applied afresh, with a `PlanMismatchWarning` saying what differs
        (none when the plan has no recorded specs to differ from).
        """
        args = tuple(args)
        if not args:
            raise ValueError(f"{self.source}: apply needs (state, *batch), got no arguments")
        reason = self.mismatch(args)
        if reason is None:
            recorded = self.recorded_specs or ()
            return tuple(_tree.map_with_path(lambda path, _leaf, r=r: r[path], tree)
                         for tree, r in zip(args, recorded, strict=True))
        if self.leaves is not None:
            warnings.warn(PlanMismatchWarning(
                f"{self.source}: {reason}; applying the plan's rules afresh, so these specs "
                "were not the ones measured"), stacklevel=2)
        return argument_specs(self.rule, self.batch_rule, args)

    def shardings(self, args: Sequence[Any], mesh: Mesh | None = None) -> tuple[Any, ...]:
        """`NamedSharding` trees for `(state, *batch)`, for `jax.jit(in_shardings=...)`.

        Args:
          args: the arguments (arrays or ShapeDtypeStructs).
          mesh: a concrete mesh with the plan's axis names; default `self.mesh`
            when that is concrete.
        """
        mesh = self.mesh if mesh is None else mesh
        if not isinstance(mesh, Mesh):
            raise ValueError(
                f"{self.source}: shardings need a concrete Mesh, and this plan is bound to "
                f"{type(mesh).__name__}; pass mesh=shardsearch.create_mesh(...)")
        _check_axes(self.recorded_mesh, mesh, self.source)
        return tuple(
            jax.tree.map(lambda s: NamedSharding(mesh, s), tree,
                         is_leaf=lambda s: isinstance(s, P))
            for tree in self.apply(args))

    @classmethod
    def from_config(cls, config: Any, mesh: _mesh.AnyMesh | None = None,
                    where: str = "config") -> ShardingPlan:
        """Builds a ShardingPlan from plan data (a parsed file); every problem names `where`."""
        if not isinstance(config, dict):
            raise ValueError(f"{where}: expected a JSON object at the top, got "
                             f"{type(config).__name__}")
        missing = [k for k in _FIELDS if k not in config]
        if missing:
            raise ValueError(
                f"{where}: missing field {missing[0]!r} (a plan file needs {list(_FIELDS)}); "
                "the file is not a shardsearch plan or was cut short")
        schema = config["schema"]
        if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
            raise ValueError(f"{where}: field 'schema' must be a positive integer, got "
                             f"{schema!r}")
        if schema > SCHEMA:
            raise ValueError(
                f"{where}: schema {schema} is newer than this shardsearch ({__version__}) "
                f"reads (schema {SCHEMA}); upgrade shardsearch to load it")
        recorded = _mesh_from_json(config["mesh"], where)
        if mesh is None:
            mesh = _mesh.abstract_mesh(tuple(s for _, s in recorded),
                                       tuple(a for a, _ in recorded))
        else:
            mesh = _mesh.resolve_mesh(mesh)
            _check_axes(recorded, mesh, where)
        rule = rule_from_config(config["state_rule"], mesh, f"{where}: state_rule")
        batch_rule = rule_from_config(config["batch_rule"], mesh, f"{where}: batch_rule")
        _check_rule_axes({"state_rule": rule, "batch_rule": batch_rule}, recorded, where)
        workload = config.get("workload")
        name = fingerprint = leaves = None
        if workload is not None:
            name, fingerprint, leaves = _workload_from_json(workload, recorded, where)
        results = config.get("results")
        if results is not None and not isinstance(results, dict):
            raise ValueError(f"{where}: field 'results' must be an object or null")
        knobs = config.get("knobs", {})
        if not isinstance(knobs, dict) or not all(
                isinstance(k, str) and isinstance(v, str | int | float | bool | None)
                for k, v in knobs.items()):
            raise ValueError(f"{where}: field 'knobs' must be an object of knob names to "
                             f"plain values (e.g. {{\"remat\": \"full\"}}), got {knobs!r}")
        return cls(rule, batch_rule, mesh, recorded, name, fingerprint, leaves, results, where,
                   dict(knobs))


def load_plan(path: str | os.PathLike[str], mesh: _mesh.AnyMesh | None = None) -> ShardingPlan:
    """Reads a plan file written by `write_config` / `shardsearch export`.

    Only JSON is parsed: nothing the file names is imported or evaluated.

    Args:
      path: the plan file.
      mesh: a Mesh or AbstractMesh with the recorded axis names (sizes may
        differ: the rules are then applied afresh); default an AbstractMesh
        with the recorded axes and sizes.

    Returns:
      A frozen `ShardingPlan`.

    Raises:
      OSError: the file cannot be read.
      ValueError: naming the file: not UTF-8, not JSON, cut short, nested
        deeper than `base.jsonfile.MAX_DEPTH`, a newer schema, a missing or
        malformed field, a rule naming an axis its own mesh lacks, or a mesh
        with other axis names.

    Example:
      >>> plan = load_plan("plan.json", mesh=shardsearch.create_mesh((2, 4), ("dp", "tp")))
      >>> in_shardings = plan.shardings((state, batch))
    """
    where = str(path)
    data = read_json(path, where, invalid=_INVALID)
    return ShardingPlan.from_config(data, mesh, where)


def load_rule(path: str | os.PathLike[str],
              mesh: _mesh.AnyMesh | None = None) -> ShardingRule:
    """The state rule of a plan file, bound to `mesh` (see `load_plan`).

    A `logical-axis-rules` or `flax-rules` file (`shardsearch export --format
    ...`) loads too: its `LogicalAxisRule` for the state; so does a bare
    Flax/MaxText rules list (see `load_rules`).

    Example:
      >>> rule = load_rule("plan.json")
      >>> rule.apply(workload.abstract()[0])  # spec tree for the train state
    """
    return _read_rules(path, mesh)[0]


def load_rules(path: str | os.PathLike[str],
               mesh: _mesh.AnyMesh | None = None) -> tuple[ShardingRule, ShardingRule]:
    """The state and batch rules of a plan file, a logical-axis-rules or
    flax-rules file, or a MaxText-style `logical_axis_rules` list.

    What a search needs to start from a file, whichever form `shardsearch
    export` wrote it in. A bare rules list (`[["embed", "fsdp"], ["mlp",
    "tp"], ...]`, or an object with that list under `"logical_axis_rules"`)
    gives a `FlaxBoxRule` (Flax's resolution on the names the state's Flax
    boxes carry) and a batch rule on its `batch` or `activation_batch` axes.

    Raises:
      OSError: the file cannot be read.
      ValueError: naming the file, as `load_plan`; also a logical-axis-rules
        file without the batch's logical names.
    """
    from ..rules.logical import FORMAT

    state_rule, batch_rule = _read_rules(path, mesh)
    if batch_rule is None:
        raise ValueError(
            f"{path}: this {FORMAT} file names no batch leaves, so it gives no batch "
            "rule; give the plan file instead (`shardsearch export`'s default format)")
    return state_rule, batch_rule


def load_start(path: str | os.PathLike[str], mesh: _mesh.AnyMesh | None = None
               ) -> tuple[ShardingRule, ShardingRule, dict[str, Any], dict[str, str]]:
    """`load_rules`, and the knobs a search starting from the file takes.

    Returns:
      `(state rule, batch rule, knobs, pairs)`: `knobs` the plan file's own
      (`{"remat": "full", "act_seq": "tp"}`; empty for a rules file), and
      `pairs` every name of a rules file's `logical_axis_rules` as the
      activation knob it would be (`{"act_activation_length": "tp",
      "act_embed": "-"}`; a flax-rules file's `unconstrained` names:
      `"auto"`): which of them are the step's activations only the step
      tells (`search.space.baselines.start_candidates`).

    Raises:
      OSError, ValueError: as `load_rules`.
    """
    state_rule, batch_rule = load_rules(path, mesh)
    data = read_json(path, str(path), invalid=_INVALID)
    if isinstance(data, dict) and "schema" in data:
        return state_rule, batch_rule, dict(data.get("knobs") or {}), {}
    listed = data["logical_axis_rules"] if isinstance(data, dict) and (
        "logical_axis_rules" in data) else data["rules"] if isinstance(data, dict) else data
    pairs: dict[str, str] = {}
    for name, entry in listed:  # Flax's precedence: a name's first pair is its entry
        pairs.setdefault(PREFIX + name, "-" if entry is None else entry if isinstance(
            entry, str) else ",".join(entry))
    for name in data.get("unconstrained", ()) if isinstance(data, dict) else ():
        pairs.setdefault(PREFIX + name, AUTO)
    return state_rule, batch_rule, {}, pairs


def _read_rules(path: str | os.PathLike[str], mesh: _mesh.AnyMesh | None
                ) -> tuple[ShardingRule, ShardingRule | None]:
    # Any form `shardsearch export` writes; a logical-axis-rules file may lack
    # the batch (None), a plan file always has it. A bare Flax/MaxText rules
    # list has no table of leaves: it reads the names the arguments' Flax
    # boxes carry when applied.
    from ..rules.logical import (
        FLAX_FORMAT,
        FORMAT,
        rule_from_logical_axis_rules,
        rules_list_candidate,
    )

    where = str(path)
    data = read_json(path, where, invalid=_INVALID)
    if isinstance(data, dict) and data.get("format") in (FORMAT, FLAX_FORMAT):
        return rule_from_logical_axis_rules(data, mesh, where)[:2]
    if isinstance(data, list) or (isinstance(data, dict) and "logical_axis_rules" in data
                                  and "schema" not in data):
        return rules_list_candidate(data, mesh, where)
    plan = ShardingPlan.from_config(data, mesh, where)
    return plan.rule, plan.batch_rule


def _check_axes(recorded: tuple[tuple[str, int], ...], mesh: _mesh.AnyMesh, where: str) -> None:
    want = tuple(a for a, _ in recorded)
    got = tuple(mesh.axis_names)
    if got != want:
        raise ValueError(
            f"{where}: the plan was found on a mesh with axes {want} but the mesh given has "
            f"axes {got}; build the mesh with axis names {want} in that order (sizes may "
            "differ)")


def _check_rule_axes(rules: Mapping[str, ShardingRule],
                     recorded: tuple[tuple[str, int], ...], where: str) -> None:
    # A rule that names an axis its own mesh lacks fails only once applied
    # (or, for some kinds, silently shards less); refuse it when the file loads.
    names = tuple(a for a, _ in recorded)
    unknown = [(at, axis) for field, rule in rules.items()
               for at, axis in _named_axes(rule, field) if axis not in names]
    if unknown:
        at, axis = unknown[0]
        more = f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise ValueError(
            f"{where}: {at} names axis {axis!r}, which is not in the plan's own mesh "
            f"{names}{more}; the file was edited or damaged: fix the axis name or export "
            "it again")


def _named_axes(value: Any, at: str) -> list[tuple[str, str]]:
    """`(where, axis)` for every mesh axis a rule names, in its specs and axis lists.

    Walks a dataclass rule's fields (nested rules included), so a new rule kind
    is covered when it keeps axes in `PartitionSpec`s or in fields named
    `axis_names` / `axes`. Example: `BatchShardingRule(("dp",))` at "batch_rule"
    → `[("batch_rule.axes", "dp")]`.
    """
    if isinstance(value, P):
        return [(at, a) for a in _spec.spec_axes(value)]
    if isinstance(value, ShardingRule) and dataclasses.is_dataclass(value):
        out = []
        for field in dataclasses.fields(value):
            item, here = getattr(value, field.name, None), f"{at}.{field.name}"
            if field.name in ("axis_names", "axes") and isinstance(item, tuple | list):
                out += [(here, a) for entry in item for a in _spec.entry_axes(entry)]
            elif field.name != "mesh":
                out += _named_axes(item, here)
        return out
    if isinstance(value, tuple | list):
        return [x for i, v in enumerate(value) for x in _named_axes(v, f"{at}[{i}]")]
    if isinstance(value, Mapping):
        return [x for k, v in value.items() for x in _named_axes(v, f"{at}[{k!r}]")]
    return []


def _mesh_from_json(data: Any, where: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: field 'mesh' must be an object with 'axis_names' and "
                         f"'axis_sizes', got {data!r}")
    names, sizes = data.get("axis_names"), data.get("axis_sizes")
    if not (isinstance(names, list) and names and all(isinstance(n, str) and n.isidentifier()
                                                      for n in names)
            and len(set(names)) == len(names)):
        raise ValueError(f"{where}: field 'mesh.axis_names' must be a non-empty list of "
                         f"distinct axis names, got {names!r}")
    if not (isinstance(sizes, list) and len(sizes) == len(names) and all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)):
        raise ValueError(f"{where}: field 'mesh.axis_sizes' must list one positive size "
                         f"per axis of {names}, got {sizes!r}")
    return tuple(zip(names, sizes, strict=True))


def _workload_from_json(
    data: Any, recorded: tuple[tuple[str, int], ...], where: str,
) -> tuple[str | None, str, tuple[tuple[LeafRecord, ...], ...]]:
    field = f"{where}: field 'workload'"
    if not isinstance(data, dict) or not isinstance(data.get("arguments"), list):
        raise ValueError(f"{field} must be null or an object with 'name', 'hash' and "
                         "'arguments' (a list of leaf lists)")
    name, digest = data.get("name"), data.get("hash")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"{field}.name must be a string or null, got {name!r}")
    axes = {a for a, _ in recorded}
    arguments = []
    for i, arg in enumerate(data["arguments"]):
        if not isinstance(arg, list):
            raise ValueError(f"{field}.arguments[{i}] must be a list of leaves, got {arg!r}")
        leaves = []
        for j, leaf in enumerate(arg):
            at = f"{field}.arguments[{i}][{j}]"
            if not isinstance(leaf, dict) or not {"path", "shape", "dtype", "spec"} <= set(leaf):
                raise ValueError(f"{at} must be an object with 'path', 'shape', 'dtype' and "
                                 f"'spec', got {leaf!r}")
            shape = leaf["shape"]
            if not isinstance(leaf["path"], str) or (shape is not None and not (
                    isinstance(shape, list) and all(isinstance(d, int) and d >= 0
                                                    for d in shape))) or not (
                    leaf["dtype"] is None or isinstance(leaf["dtype"], str)):
                raise ValueError(f"{at}: path must be a string, shape a list of sizes (or "
                                 f"null), dtype a string (or null); got {leaf!r}")
            spec = _spec.spec_from_json(leaf["spec"], f"{at}.spec")
            unknown = [a for a in _spec.spec_axes(spec) if a not in axes]
            if unknown:
                raise ValueError(f"{at}: spec of {leaf['path']!r} uses axis {unknown[0]!r}, "
                                 f"which is not in the plan's mesh {sorted(axes)}")
            leaves.append(LeafRecord(leaf["path"], None if shape is None else tuple(shape),
                                     leaf["dtype"], spec))
        arguments.append(tuple(leaves))
    expected = leaves_hash(data["arguments"])
    if digest != expected:
        raise ValueError(
            f"{field}.hash is {digest!r} but the recorded leaves hash to {expected!r}; the "
            "file was edited or damaged — export it again")
    return name, expected, tuple(arguments)


def _first_difference(got: list[list[dict[str, Any]]],
                      recorded: tuple[tuple[LeafRecord, ...], ...]) -> str:
    diffs = []
    for i, (now, then) in enumerate(zip(got, recorded, strict=True)):
        then_by_path = {leaf.path: leaf for leaf in then}
        now_paths = {leaf["path"] for leaf in now}
        for leaf in now:
            old = then_by_path.get(leaf["path"])
            shape = None if leaf["shape"] is None else tuple(leaf["shape"])
            if old is None:
                diffs.append(f"argument {i} has leaf {leaf['path']!r}, which the plan lacks")
            elif (shape, leaf["dtype"]) != (old.shape, old.dtype):
                diffs.append(f"leaf {leaf['path']!r} is {leaf['dtype']}{list(shape or [])}, "
                             f"the plan recorded {old.dtype}{list(old.shape or [])}")
        diffs += [f"argument {i} lacks the plan's leaf {leaf.path!r}"
                  for leaf in then if leaf.path not in now_paths]
    if not diffs:
        return "the arguments' leaves are in another order than the plan's"
    more = f" (+{len(diffs) - 1} more differences)" if len(diffs) > 1 else ""
    return f"the arguments differ from the plan's: {diffs[0]}{more}"
