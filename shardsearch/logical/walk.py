"""Walking a jaxpr: every equation's couplings, through calls and loops.

`walk(graph, jaxpr, ins)` visits a jaxpr's equations in order and adds the
edges each implies to the `DimGraph` (`logical.graph`): array primitives by
their rule (`logical.primitives`), sub-jaxprs (jit, closed_call,
custom_jvp/vjp, remat, scan, while, cond) by walking them with their inputs
and outputs mapped onto the caller's values. Each call site gets fresh ids
for the body's values, so two calls of one cached jaxpr stay apart.

A primitive without a rule is treated as elementwise when all its operands
and outputs share one shape; otherwise it couples nothing. Either way it is
reported in `LogicalAxes.unhandled` (and `optimize` warns of it): the
elementwise guess can join dims a permuting op would not, and an op that
couples nothing can leave apart dims that belong together. A primitive with
no outputs (a debug callback) couples nothing and is not reported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from jax.extend import core as jcore

from ..base.spec import dim_axes
from .graph import SCAN_LENGTH, DimGraph, Frame, Op
from .primitives import couple, elementwise

# `call`: custom_partitioning's body, which computes what the op computes
# (only its partitioning is the user's own).
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr", "call")


def walk(g: DimGraph, jaxpr: Any, ins: Sequence[int]) -> list[int]:
    """Walks a `Jaxpr` or `ClosedJaxpr` whose inputs are the values `ins`.

    Returns:
        The value ids of its outputs.
    """
    jaxpr, consts = _open(jaxpr)
    env: dict[Any, int] = {}
    for var, const in zip(jaxpr.constvars, consts, strict=True):
        env[var] = g.value(getattr(const, "shape", ()), itemsize(const))
    for var, vid in zip(jaxpr.invars, ins, strict=True):
        env[var] = vid
    frame = Frame(tuple(ins))
    (g.op.bodies if g.op is not None else g.frames).append(frame)
    for eqn in jaxpr.eqns:
        eqn_ins = [_atom(g, env, a) for a in eqn.invars]
        eqn_outs = [g.value(_shape(v), itemsize(v.aval)) for v in eqn.outvars]
        for var, vid in zip(eqn.outvars, eqn_outs, strict=True):
            env[var] = vid
        op = Op(eqn.primitive.name, tuple(eqn_ins), tuple(eqn_outs),
                carried=_carried(eqn), constraint=_constraint(g, eqn))
        frame.ops.append(op)
        outer, g.op = g.op, op
        try:
            apply(g, eqn, eqn_ins, eqn_outs)
        finally:
            g.op = outer
    frame.outs = tuple(_atom(g, env, a) for a in jaxpr.outvars)
    return list(frame.outs)


def apply(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Adds the couplings of one equation."""
    control = _CONTROL.get(eqn.primitive.name)
    if control is not None:
        control(g, eqn, ins, outs)
    elif couple(g, eqn, ins, outs):
        pass
    elif _call_jaxpr(eqn) is not None:
        _call(g, eqn, ins, outs)
    elif not outs:
        pass  # no outputs (a debug callback): nothing it could couple
    elif len({g.shapes[v] for v in ins + outs}) <= 1:
        elementwise(g, eqn, ins, outs)
        g.unhandled(eqn.primitive.name)  # a guess, so it is reported too
    else:
        g.unhandled(eqn.primitive.name)


# --- helpers ----------------------------------------------------------------------------

def _open(jaxpr: Any) -> tuple[Any, Sequence[Any]]:
    if isinstance(jaxpr, jcore.ClosedJaxpr):
        return jaxpr.jaxpr, jaxpr.consts
    return jaxpr, ()


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in getattr(var.aval, "shape", ()))


def scan_counts(params: Mapping[str, Any]) -> tuple[int, int]:
    """A scan equation's numbers of consts and carries, its inputs' first two
    groups (the xs follow). jax up to 0.10 names them `num_consts` and
    `num_carry`; from 0.11 the inputs are a tree `ft_in` of (consts, carry,
    xs)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _xs = params["ft_in"].unpack()
    return len(consts), len(carry)


def _carried(eqn: Any) -> tuple[tuple[int, int], ...]:
    """(input index, output index) of a scan's or a while's loop carries."""
    p = eqn.params
    if eqn.primitive.name == "scan":
        first, carries = scan_counts(p)
        return tuple((first + k, k) for k in range(carries))
    if eqn.primitive.name == "while":
        first = p["cond_nconsts"] + p["body_nconsts"]
        return tuple((first + k, k) for k in range(len(eqn.outvars)))
    return ()


def _constraint(g: DimGraph, eqn: Any) -> tuple[tuple[str, ...] | None, ...] | None:
    """A sharding constraint's mesh axes per output dim (None where
    unconstrained), or None when the equation is not one or names no spec
    (a `GSPMDSharding`: noted in `g.unread_constraints()`)."""
    if eqn.primitive.name != "sharding_constraint" or not eqn.outvars:
        return None
    sharding = eqn.params.get("sharding")
    spec = getattr(sharding, "spec", None)
    if spec is None:
        g.unread(type(sharding).__name__)
        return None
    return dim_axes(spec, len(_shape(eqn.outvars[0])))


def itemsize(x: Any) -> int:
    """Bytes per element of an array, an abstract value or a Python scalar (0
    for what has no element size: a token)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None and isinstance(x, bool | int | float | complex):
        dtype = np.asarray(x).dtype
    try:
        return int(dtype.itemsize)
    except (AttributeError, TypeError):
        return 0


def _atom(g: DimGraph, env: dict[Any, int], atom: Any) -> int:
    if isinstance(atom, jcore.Literal):
        return g.value(_shape(atom), itemsize(atom.aval))
    return env[atom]


def _is_jaxpr(value: Any) -> bool:
    return isinstance(value, jcore.ClosedJaxpr | jcore.Jaxpr)


def _call_jaxpr(eqn: Any) -> Any | None:
    """The body of a call-like equation: one jaxpr parameter with the eqn's arity."""
    found = [eqn.params[k] for k in _CALL_PARAMS if _is_jaxpr(eqn.params.get(k))]
    others = [k for k, v in eqn.params.items() if _is_jaxpr(v) and k not in _CALL_PARAMS]
    if len(found) != 1 or others:
        return None
    body, _ = _open(found[0])
    if len(body.invars) != len(eqn.invars) or len(body.outvars) != len(eqn.outvars):
        return None
    return found[0]


def _link(g: DimGraph, outer: int, inner: int) -> None:
    """An outer value and the sub-jaxpr value it stands for."""
    g.tie_same(outer, inner)
    g.inherit(inner, outer)


def _inner_ins(g: DimGraph, jaxpr: Any, outer: Sequence[int]) -> list[int]:
    """Input ids for a sub-jaxpr: the caller's values where shapes agree, else
    fresh values coupled dim by dim where sizes agree (shard_map's local shapes)."""
    body, _ = _open(jaxpr)
    ids = []
    for var, vid in zip(body.invars, outer, strict=True):
        if _shape(var) == g.shapes[vid]:
            ids.append(vid)
        else:
            inner = g.value(_shape(var), itemsize(var.aval))
            _link(g, vid, inner)
            ids.append(inner)
    return ids


# --- calls and loops --------------------------------------------------------------------

def _call(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """jit, closed_call, custom_jvp/vjp, remat and other one-body calls."""
    body = _call_jaxpr(eqn)
    inner_outs = walk(g, body, _inner_ins(g, body, ins))
    for outer, inner in zip(outs, inner_outs, strict=True):
        _link(g, outer, inner)
    if any(g.shapes[o] != g.shapes[i] for o, i in zip(outs, inner_outs, strict=True)) or any(
            _shape(v) != g.shapes[i] for v, i in zip(_open(body)[0].invars, ins, strict=True)):
        # Local shapes (shard_map): only the unchanged dims were coupled.
        g.unhandled(eqn.primitive.name)


def _fresh(g: DimGraph, var: Any, outer: int, strip: int = 0) -> int:
    """A loop body's own id for one input, tied to the caller's value `outer`
    without its first `strip` dims (a scan's xs lose the stacked dim)."""
    inner = g.value(_shape(var), itemsize(var.aval))
    for d in range(g.rank(inner)):
        if d + strip < g.rank(outer):
            g.tie_equal(outer, d + strip, inner, d)
    g.inherit(outer, inner)
    return inner


def _scan(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """consts pass through; carry in, body carry and carry out tie; xs and ys
    tie to the body without their stacked leading dim, which is one axis for
    all of them (the layers of a scan-stacked model)."""
    p = eqn.params
    nc, nk = scan_counts(p)
    body = p["jaxpr"]
    body_vars = _open(body)[0].invars
    carry, xs = ins[nc:nc + nk], ins[nc + nk:]
    carry_in = [_fresh(g, v, c) for v, c in zip(body_vars[nc:nc + nk], carry, strict=True)]
    xs_in = [_fresh(g, v, x, 1) for v, x in zip(body_vars[nc + nk:], xs, strict=True)]
    inner_outs = walk(g, body, list(ins[:nc]) + carry_in + xs_in)
    for a, b, outer in zip(carry_in, inner_outs[:nk], outs[:nk], strict=True):
        g.tie_same(a, b)
        g.tie_same(outer, b)
    for y, inner in zip(outs[nk:], inner_outs[nk:], strict=True):
        for d in range(g.rank(inner)):
            g.tie_equal(y, d + 1, inner, d)
    stacked = [v for v in list(xs) + list(outs[nk:]) if g.rank(v) and g.size(v, 0) > 1]
    for v in stacked:
        g.mark(SCAN_LENGTH, v, 0)
        g.tie(stacked[0], 0, v, 0)


def _while(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Body and cond consts pass through; carry in, the bodies' carry and carry
    out tie."""
    p = eqn.params
    ncc, nbc = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, carry = ins[:ncc], ins[ncc:ncc + nbc], ins[ncc + nbc:]
    body_vars = _open(p["body_jaxpr"])[0].invars
    carry_in = [_fresh(g, v, c) for v, c in zip(body_vars[nbc:], carry, strict=True)]
    carry_out = walk(g, p["body_jaxpr"], list(body_consts) + carry_in)
    walk(g, p["cond_jaxpr"], list(cond_consts) + carry_in)
    for a, b, outer in zip(carry_in, carry_out, outs, strict=True):
        g.tie_same(a, b)
        g.tie_same(outer, b)


def _cond(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Every branch sees the operands and produces the outputs."""
    for branch in eqn.params["branches"]:
        for outer, inner in zip(outs, walk(g, branch, ins[1:]), strict=True):
            _link(g, outer, inner)


_CONTROL: dict[str, Callable[[DimGraph, Any, list[int], list[int]], None]] = {
    "scan": _scan,
    "while": _while,
    "cond": _cond,
}
