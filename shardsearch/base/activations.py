"""Named sharding points for a step's activations, and the rules that place them.

The search chooses where a step's arguments live; XLA's propagation places
everything in between. Some of what experts tune is in between: the batch dim
of the residual stream pinned to the data axes (MaxText's
`activation_batch`), its sequence dim split over the tensor axes (sequence
parallelism), the attention's heads on the tensor axes. A step declares where
such choices exist by calling `activation` on an intermediate value:

    >>> x = activation(x, ("batch", "seq", "embed"))

Outside a search (no rules active) that traces nothing: the step is exactly as
written. Under `activation_rules({"seq": "tp"}, mesh_axes)` each point's
dims whose name has a rule are constrained to those mesh axes (`None`: kept
whole), its other dims left to XLA. A search offers one knob per name it
finds (`act_<name>`, see `activation_choices`), so the rules are part of the
step's knob setting and reach workers, plan files and re-timings as knobs do.

The rules hold while the step is traced (a context variable, as Flax's
`logical_axis_rules`), so a function the step jits itself is traced once
under whichever rules were active first: call `activation` in code the step
traces inline.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import mesh as _mesh
from .knobs import Knobs

# A rule's value: one mesh axis, several (their product splits the dim), or
# None (the dim stays whole on every device).
Entry = str | tuple[str, ...] | None

# The knobs a search offers for the points: `act_<name>`; their values are
# `AUTO` (XLA decides: the default), `"-"` (whole) or mesh axes as
# `"dp"` / `"dp,tp"`.
PREFIX = "act_"
AUTO = "auto"
WHOLE = "-"
# The name of the batch dim of an activation (the residual stream's, and that
# of every point with one: MaxText's `activation_batch`), which expert plans,
# and a search's proposals unless it chooses `act_batch`, pin to the batch's split
# (`search.space.baselines.pin_batch`).
BATCH = "batch"
BATCH_KNOB = PREFIX + BATCH


def names_batch(knobs: Knobs | None) -> bool:
    """Whether `knobs` (a step's, as built) carry `act_batch`: the step names
    a batch activation, which plans may pin to their batch split."""
    return knobs is not None and BATCH_KNOB in knobs.choices


@dataclasses.dataclass(frozen=True)
class _Active:
    rules: Mapping[str, Entry]
    axes: tuple[tuple[str, int], ...]


_RULES: contextvars.ContextVar[_Active | None] = contextvars.ContextVar(
    "shardsearch_activation_rules", default=None)


@dataclasses.dataclass
class _Seen:
    sizes: dict[str, set[int]]
    # Each point's names, in order first met, and whether its unnamed dims are whole.
    named: dict[tuple[str | None, ...], bool]


# The names `released` leaves to XLA.
_RELEASED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "shardsearch_activation_released", default=frozenset())

# Mesh axes a released name's dims took outside (the enclosing vmap's
# `spmd_axis_name`): no dim traced inside may be put on them again.
_RESERVED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "shardsearch_activation_reserved", default=frozenset())

_SEEN: contextvars.ContextVar[_Seen | None] = contextvars.ContextVar(
    "shardsearch_activation_points", default=None)


def activation(x: jax.Array, names: Sequence[str | None], *,
               unnamed_whole: bool = False) -> jax.Array:
    """`x`, constrained as the active rules place `names` (one per dim).

    Args:
      x: an intermediate value of the step.
      names: a logical name per dim of `x` (None: a dim no rule places;
        `P.UNCONSTRAINED`: one left to XLA whatever the rules).
      unnamed_whole: the dims named None are kept whole when the point is
        constrained, rather than left to XLA (what a Flax logical
        constraint's None means; `shardsearch.flax.constraint_points`).

    Returns:
      `x` itself when no rule names any of its dims, else `x` under a
      sharding constraint (the dims without a rule unconstrained).

    Where the rules give one mesh axis to two dims of the point, the later dim
    keeps it and the earlier one is left to XLA: with `seq` and `heads` both
    on `tp`, the residual stream is split along the sequence and the
    attention's queries along their heads (Megatron-LM's sequence
    parallelism).

    Raises:
      ValueError: `names` does not have one entry per dim.
    """
    names = tuple(names)
    if len(names) != x.ndim or not all(
            n is None or n is P.UNCONSTRAINED or isinstance(n, str) for n in names):
        raise ValueError(f"activation: names={names!r} must give one name (or None) per dim "
                         f"of the value, shape {tuple(x.shape)}")
    seen = _SEEN.get()
    if seen is not None:
        seen.named[names] = seen.named.get(names, False) or unnamed_whole
        for name, size in zip(names, x.shape, strict=True):
            if isinstance(name, str):
                seen.sizes.setdefault(name, set()).add(int(size))
    active = _RULES.get()
    out = _RELEASED.get()
    names = tuple(P.UNCONSTRAINED if n in out else n for n in names)
    if active is None or not any(isinstance(n, str) and n in active.rules for n in names):
        return x
    # Auto axes (`abstract_mesh`): jax 0.11 makes an AbstractMesh's axes
    # Explicit by default, and refuses P.UNCONSTRAINED on those.
    mesh = _mesh.abstract_mesh(tuple(s for _, s in active.axes),
                               tuple(a for a, _ in active.axes))
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, placement(names, active.rules, unnamed_whole=unnamed_whole,
                                         reserved=_RESERVED.get())))


def placement(names: Sequence[str | None], rules: Mapping[str, Entry], *,
              unnamed_whole: bool = False, reserved: frozenset[str] = frozenset()) -> P:
    """The spec a point named `names` gets under `rules`: a ruled name's mesh
    axes, `P.UNCONSTRAINED` elsewhere (a dim named None: None when
    `unnamed_whole`); where two dims ask for one mesh axis the later dim
    keeps it and the earlier one is unconstrained, and so is a dim that asks
    for one of the `reserved` axes (those an enclosing map's dim took)."""
    entries: list[Any] = []
    taken: set[str] = set(reserved)
    unnamed = None if unnamed_whole else P.UNCONSTRAINED
    for name in reversed(tuple(names)):  # a later dim keeps a mesh axis two dims ask for
        entry = (rules.get(name, P.UNCONSTRAINED) if isinstance(name, str)
                 else unnamed if name is None else P.UNCONSTRAINED)
        axes = () if entry is P.UNCONSTRAINED or entry is None else (
            (entry,) if isinstance(entry, str) else tuple(entry))
        if taken & set(axes):
            entry, axes = P.UNCONSTRAINED, ()
        taken |= set(axes)
        entries.insert(0, entry)
    return P(*entries)


@contextlib.contextmanager
def activation_rules(rules: Mapping[str, Entry], axes: Sequence[tuple[str, int]],
                     *, fill: bool = False) -> Iterator[None]:
    """Places the points traced inside: `rules` maps a point's name to mesh axes.

    Args:
      rules: name -> a mesh axis, a tuple of them, or None (whole).
      axes: the mesh's `(axis name, size)` pairs, in mesh order.
      fill: give only the names the enclosing rules leave unplaced (a
        model's own defaults, which a search's choice overrides).

    Raises:
      ValueError: a rule names an axis `axes` lacks.
    """
    axes = tuple((str(a), int(s)) for a, s in axes)
    known = {a for a, _ in axes}
    stray = {n: e for n, e in rules.items()
             if any(a not in known for a in ((e,) if isinstance(e, str) else e or ()))}
    if stray:
        raise ValueError(f"activation rules {stray} name mesh axes the mesh {dict(axes)} lacks")
    outer = _RULES.get()
    if outer is not None and fill:
        merged = _Active({**rules, **outer.rules}, outer.axes)
    else:
        merged = _Active({**(outer.rules if outer else {}), **rules}, axes)
    token = _RULES.set(merged)
    try:
        yield
    finally:
        _RULES.reset(token)


def placed_on(name: str) -> tuple[str, ...]:
    """The mesh axes the active rules put the points' `name` dims on; `()`
    when no rule names it, or it keeps them whole."""
    active = _RULES.get()
    entry = None if active is None else active.rules.get(name)
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


@contextlib.contextmanager
def released(name: str) -> Iterator[None]:
    """The points traced inside leave their `name` dims to XLA, whatever rules
    are active or become active inside (a model's own): for a function mapped
    over a dim that takes the rule's axes instead (`jax.vmap(...,
    spmd_axis_name=placed_on(name))`), whose own `name` dims the rule would
    otherwise put on the same axes again. Those axes are reserved for the
    mapped dim: any other dim a rule puts on one of them is left to XLA too."""
    token = _RELEASED.set(_RELEASED.get() | {name})
    # The axes it took are the mapped dim's now: no other dim inside gets them
    # (with act_embed=dp beside act_batch=dp, tracing failed on "spmd_axis_name
    # ('dp',) cannot appear in with_sharding_constraint spec").
    reserved = _RESERVED.set(_RESERVED.get() | set(placed_on(name)))
    try:
        yield
    finally:
        _RESERVED.reset(reserved)
        _RELEASED.reset(token)


def placing() -> bool:
    """Whether a point traced now is placed or recorded: rules are active, or
    `points` is tracing. Outside both `activation` traces nothing, so a
    framework's own constraint can stand (`shardsearch.flax.constraint_points`)."""
    return _RULES.get() is not None or _SEEN.get() is not None


def points(step: Callable[..., Any], abstract_args: Sequence[Any]) -> dict[str, tuple[int, ...]]:
    """The names of the points `step` passes through, each with the sizes of
    its dims (sorted), in the order first met: one trace, no rules active."""
    return trace_points(step, abstract_args)[0]


def trace_points(step: Callable[..., Any], abstract_args: Sequence[Any]
                 ) -> tuple[dict[str, tuple[int, ...]], dict[tuple[str | None, ...], bool]]:
    """`points`, and each distinct point's names (one entry per dim) in the
    order first met, with whether its unnamed dims are kept whole (a Flax
    constraint, which a Flax export resolves the rules on)."""
    seen = _Seen({}, {})
    token = _SEEN.set(seen)
    outer = _RULES.set(None)
    try:
        # A new function, so that no trace JAX cached for `step` stands in for this one.
        jax.make_jaxpr(lambda *args: step(*args))(*abstract_args)
    finally:
        _RULES.reset(outer)
        _SEEN.reset(token)
    return ({name: tuple(sorted(sizes)) for name, sizes in seen.sizes.items()},
            dict(seen.named))


def name_to_json(name: Any) -> str | None:
    """A point's dim name as JSON: the name, None, or `"UNCONSTRAINED"`."""
    return "UNCONSTRAINED" if name is P.UNCONSTRAINED else name


def name_from_json(name: str | None) -> Any:
    """`name_to_json`'s inverse."""
    return P.UNCONSTRAINED if name == "UNCONSTRAINED" else name


def parse_value(value: str) -> Entry:
    """A knob value as a rule: `"dp,tp"` → `("dp", "tp")`, `"tp"` → `"tp"`, `"-"` → None."""
    if value == WHOLE:
        return None
    axes = tuple(value.split(","))
    return axes[0] if len(axes) == 1 else axes


def activation_choices(found: Mapping[str, Sequence[int]], groups: Sequence[str],
                       axes: Sequence[tuple[str, int]]) -> dict[str, tuple[str, ...]]:
    """The knobs for the points `found`: `act_<name>` -> `AUTO`, `"-"`, then
    each group of mesh axes (`"dp"`, `"dp,tp"`) whose size divides every size
    the name has. Names that only `AUTO` and `"-"` would be offered for (no
    axis divides them) are left out."""
    sizes = dict(axes)
    out = {}
    for name, dims in found.items():
        if not name.isidentifier():
            continue
        fits = [g for g in groups if g != WHOLE and all(
            d % math.prod(sizes[a] for a in g.split(",")) == 0 for d in dims)]
        if fits:
            out[PREFIX + name] = (AUTO, WHOLE, *fits)
    return out


def split_setting(setting: Sequence[tuple[str, Any]]
                  ) -> tuple[tuple[tuple[str, Any], ...], dict[str, Entry]]:
    """A knob setting as `(the step's own knobs, the activation rules)`."""
    own = tuple((n, v) for n, v in setting if not n.startswith(PREFIX))
    rules = {n[len(PREFIX):]: parse_value(v) for n, v in setting
             if n.startswith(PREFIX) and v != AUTO}
    return own, rules


def under_rules(step: Callable[..., Any], rules: Mapping[str, Entry],
                axes: Sequence[tuple[str, int]]) -> Callable[..., Any]:
    """`step` traced under `activation_rules(rules, axes)`; `step` itself
    when there are no rules. A new function each call, so that `jax.jit`
    never reuses a trace made under other rules."""
    if not rules:
        return step
    rules, axes = dict(rules), tuple(axes)

    @functools.wraps(step)
    def placed(*args: Any) -> Any:
        with activation_rules(rules, axes):
            return step(*args)

    return placed


def with_activation_knobs(knobs: Knobs | None, step: Callable[..., Any],
                          choices: Mapping[str, tuple[str, ...]],
                          axes: Sequence[tuple[str, int]]) -> Knobs:
    """`knobs` (None: a plain `step`) with the activation knobs `choices` added:
    their factory builds the step of the other knobs, then places its points
    by the `act_` values (`under_rules`)."""
    axes = tuple(axes)

    def make_step(**values: Any) -> Callable[..., Any]:
        own, rules = split_setting(tuple(values.items()))
        inner = knobs.make_step(**dict(own)) if knobs is not None else step
        return under_rules(inner, rules, axes)

    make_step.base = knobs.make_step if knobs is not None else None  # type: ignore[attr-defined]
    return Knobs(make_step, {**(knobs.choices if knobs is not None else {}), **choices})
