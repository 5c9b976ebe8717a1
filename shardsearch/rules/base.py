"""The rule seam: `ShardingRule`, the registry of kinds, and `rule_from_config`.

A rule kind is a concrete `ShardingRule` subclass that declares a class
attribute `kind`; defining the class registers it, so a plan file naming that
kind loads without any list here to edit:

    @dataclasses.dataclass(frozen=True)
    class LastDimRule(ShardingRule):
        axis: str
        kind: ClassVar[str] = "last-dim"

        def apply(self, pytree): ...
        def to_config(self): return {"kind": self.kind, "axis": self.axis}

        @classmethod
        def from_config(cls, config, mesh, where): return cls(config["axis"])

    rule_from_config({"kind": "last-dim", "axis": "tp"})  # → LastDimRule("tp")

Only kinds whose module has been imported are known: loading a plan never
imports anything the file names.
"""

from __future__ import annotations

import abc
import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..base import mesh as _mesh

# kind → class, in registration order (the order error messages list them in).
_KINDS: dict[str, type[ShardingRule]] = {}


class ShardingRule(abc.ABC):
    """A strategy that proposes a PartitionSpec for every leaf of a pytree.

    Subclasses implement `apply` and `to_config`; a concrete subclass that
    declares `kind` is registered under it (see `registered_kinds`) and should
    implement `from_config`, the inverse of `to_config`, so plans holding it
    load. A subclass that inherits `kind` without declaring its own is not
    registered: its configs load as the parent's kind.
    """

    kind: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" not in cls.__dict__:
            return
        _check_kind(cls)
        # An abstract intermediate class may name a kind but cannot be built.
        if not inspect.isabstract(cls):
            _register(cls)

    @abc.abstractmethod
    def apply(self, pytree: Any) -> Any:
        """Returns a pytree of `pytree`'s structure with PartitionSpec leaves."""

    def apply_argument(self, index: int, pytree: Any) -> Any:
        """`apply` to the `index`-th of the arguments this rule is given (the
        state rule: 0; the batch rule: 0, 1, ... over the batch arguments).

        A rule that tells arguments apart by position overrides it: two bare
        array arguments both have the path "", so a table keyed by path alone
        would give the second the first's specs (`LogicalAxisRule`). Others
        ignore the index.
        """
        del index
        return self.apply(pytree)

    def notes(self, pytree: Any, index: int | None = None) -> tuple[str, ...]:
        """What this rule could not decide for `pytree` and chose by fallback,
        as `base.warnings` notes (e.g. a logical rule's leaves without names,
        left replicated); `index` as for `apply_argument`. None by default:
        the other rules decide every leaf by their own parameters."""
        del pytree, index
        return ()

    @abc.abstractmethod
    def to_config(self) -> dict[str, Any]:
        """JSON-ready `{"kind": ..., ...}` form; the mesh is not part of it."""

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], mesh: _mesh.AnyMesh | None, where: str,
    ) -> ShardingRule:
        """Rebuilds the rule from its `to_config()` form, bound to `mesh`.

        Called by `rule_from_config` once it has checked that
        `config["kind"] == cls.kind`. Raise KeyError, TypeError or ValueError
        on a malformed field: `rule_from_config` reports it as
        `"{where}: malformed '<kind>' rule (...)"`. A ValueError whose message
        already starts with `where` (from a nested rule or spec) passes through
        unchanged.

        Args:
          config: the dict `to_config()` returned, after a JSON round trip.
          mesh: the mesh to bind the rule to, or None (the in-context mesh).
          where: where the config came from, for error messages.

        Example:
          >>> AutoShardingRule.from_config({"kind": "auto", "reverse": True}, None, "rule")
          AutoShardingRule(mesh=None, axis_names=None, min_shard_size=None, reverse=True)
        """
        raise NotImplementedError(
            f"{where}: rule kind {cls.kind!r} ({_class_name(cls)}) cannot be loaded from a "
            "config; define a classmethod from_config(cls, config, mesh, where) that "
            "inverts to_config()")

    def describe(self) -> list[str]:
        """Human-readable lines, without indent, for `shardsearch show`.

        By default one line: the kind, two spaces, then each `to_config` field
        as `name=<json>`, in name order. Rules holding tables or other rules
        add lines below.

        Example:
          >>> AutoShardingRule(axis_names=("tp",)).describe()
          ['auto  axis_names=["tp"] min_shard_size=null reverse=false']
        """
        return [describe_fields(self.to_config())]


def describe_fields(config: Mapping[str, Any], skip: Sequence[str] = ()) -> str:
    """`kind  name=<json> ...` for a rule's config, leaving out `skip` fields.

    Fields come in name order, as a plan file (written with sorted keys) holds
    them, so a rule reads the same whether built in code or loaded.

    Example: `{"kind": "memory", "max_memory_per_device": 100, "axis_names": None}`
    → `'memory  axis_names=null max_memory_per_device=100'`.
    """
    params = " ".join(f"{k}={json.dumps(config[k])}" for k in sorted(config)
                      if k != "kind" and k not in skip)
    return f"{config['kind']}  {params}".rstrip()


def registered_kinds() -> tuple[str, ...]:
    """Every rule kind `rule_from_config` can load, in registration order.

    The built-in kinds come first (`auto`, `composite`, `memory`, `shape`,
    `path`, `batch`), then kinds defined outside the package, as their
    modules are imported.
    """
    return tuple(_KINDS)


def rule_class(kind: str) -> type[ShardingRule] | None:
    """The class registered for `kind`, or None when no class claims it."""
    return _KINDS.get(kind)


def rule_from_config(
    config: Any, mesh: _mesh.AnyMesh | None = None, where: str = "rule",
) -> ShardingRule:
    """Rebuilds a rule from its `to_config()` form, bound to `mesh`.

    The kind is looked up among `registered_kinds()` and its class's
    `from_config` is called.

    Example:
      >>> rule_from_config({"kind": "batch", "axes": ["dp"]})
      BatchShardingRule(axes=('dp',))

    Raises:
      ValueError: unknown kind or malformed fields; the message names `where`
        (e.g. the file and the rule's position in it).
    """
    if not isinstance(config, dict) or "kind" not in config:
        raise ValueError(f"{where}: expected an object with a 'kind', got {config!r}")
    kind = config["kind"]
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(
            f"{where}: unknown rule kind {kind!r}; known kinds: {registered_kinds()}")
    try:
        rule = cls.from_config(config, mesh, where)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, ValueError) and str(err).startswith(where):
            raise
        raise ValueError(f"{where}: malformed {kind!r} rule ({err})") from None
    if not isinstance(rule, ShardingRule):
        raise TypeError(
            f"{where}: {_class_name(cls)}.from_config returned a {type(rule).__name__}, not "
            "a ShardingRule; return an instance of the class")
    return rule


def argument_specs(
    state_rule: ShardingRule, batch_rule: ShardingRule, args: Sequence[Any],
) -> tuple[Any, ...]:
    """Spec trees for `(state, *batch)`: the state rule on the first argument,
    the batch rule on each of the others, each told its position among them
    (`ShardingRule.apply_argument`): how every plan is applied."""
    state, *rest = args
    return (state_rule.apply_argument(0, state),
            *(batch_rule.apply_argument(k, b) for k, b in enumerate(rest)))


def argument_notes(
    state_rule: ShardingRule, batch_rule: ShardingRule, args: Sequence[Any],
) -> tuple[str, ...]:
    """The rules' notes (`ShardingRule.notes`) on `(state, *batch)`, applied as
    `argument_specs` applies them."""
    state, *rest = args
    out = list(state_rule.notes(state, 0))
    for k, b in enumerate(rest):
        out += [n for n in batch_rule.notes(b, k) if n not in out]
    return tuple(out)


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_kind(cls: type[ShardingRule]) -> None:
    kind = cls.__dict__["kind"]
    if not isinstance(kind, str) or not kind:
        raise TypeError(
            f"{_class_name(cls)}: kind must be a non-empty string, got {kind!r}; name the "
            "rule kind its configs will carry, e.g. kind = 'last-dim'")


def _register(cls: type[ShardingRule]) -> None:
    kind = cls.kind
    name = _class_name(cls)
    held = _KINDS.get(kind)
    if held is not None and _class_name(held) != name:
        raise ValueError(
            f"{name}: rule kind {kind!r} is already registered by {_class_name(held)}; "
            "give one of them another kind")
    # The same class defined again (a module reload) replaces its old entry,
    # under whatever kind it claimed before.
    for old in [k for k, c in _KINDS.items() if k != kind and _class_name(c) == name]:
        del _KINDS[old]
    _KINDS[kind] = cls
