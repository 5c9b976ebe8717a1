"""Which dims each array primitive couples, one rule per primitive.

`couple(graph, eqn, ins, outs)` adds the edges an equation's primitive
implies to the `DimGraph` (`logical.graph`) and says whether it knew the
primitive. Primitives with sub-jaxprs (jit, scan, while, cond, ...) are the
walk's own (`logical.walk`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .graph import DOT_BATCH, GATHER_INDEX, ONE_HOT, WEIGHT_BATCH, DimGraph, Dot, Merge

Rule = Callable[[DimGraph, Any, list[int], list[int]], None]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_ELEMENTWISE = _words("""
    abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e cbrt
    ceil clamp clz complex conj convert_element_type copy copy_p cos cosh cummax cummin
    cumlogsumexp cumprod cumsum digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt
    igamma igamma_grad_a igammac imag integer_pow is_finite le lgamma log log1p logistic lt
    max mesh_cast min mul ne neg nextafter not one_minus_square or polygamma population_count
    pow pvary real reduce_precision regularized_incomplete_beta rem reshard rev round rsqrt
    select_n
    sharding_constraint shift_left shift_right_arithmetic shift_right_logical sign sin sinh
    sort sqrt square stop_gradient sub tan tanh threefry2x32 xor zeta random_gamma_grad
    """)
# Ops that only move or relabel elements: a value seen through one keeps its
# provenance (integer labels, iota, state leaves), which the one-hot and
# stacked-weight evidence read.
_SHAPE_ONLY = _words("""
    broadcast_in_dim convert_element_type copy copy_p reshape squeeze transpose
    """)
# Ops that make fresh values from nothing the step's arrays carry.
_FRESH = _words("rng_bit_generator rng_uniform random_seed")
# Ops whose outputs share the operands' leading dims (keys and their bits).
_PREFIX = _words("random_bits random_fold_in random_split random_unwrap random_wrap")
_REDUCTIONS = _words("""
    argmax argmin reduce_and reduce_max reduce_min reduce_or reduce_prod reduce_sum reduce_xor
    """)
_WINDOWED = _words("reduce_window reduce_window_max reduce_window_min reduce_window_sum")


def couple(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> bool:
    """Adds the couplings of one equation; False when its primitive has no rule."""
    name = eqn.primitive.name
    if name in _SHAPE_ONLY and ins and outs:
        g.inherit(ins[0], outs[0])
    rule = _RULES.get(name)
    if rule is not None:
        rule(g, eqn, ins, outs)
    elif name in _ELEMENTWISE:
        elementwise(g, eqn, ins, outs)
    elif name in _REDUCTIONS:
        _reduction(g, eqn, ins, outs)
    elif name in _WINDOWED:
        _windowed(g, eqn, ins, outs)
    elif name in _PREFIX:
        _prefix(g, ins, outs)
    elif name not in _FRESH:
        return False
    return True


def elementwise(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Operands of the output's rank tie dim by dim; size-1 dims broadcast."""
    if not outs:
        return
    for vid in ins + outs[1:]:
        g.tie_same(vid, outs[0])


def _pairwise(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Operand i passes through to output i (optimization_barrier, device_put)."""
    for a, b in zip(ins, outs, strict=False):
        g.tie_same(a, b)
        g.inherit(a, b)


def _prefix(g: DimGraph, ins: list[int], outs: list[int]) -> None:
    for a in ins[:1]:
        for b in outs:
            for d in range(min(g.rank(a), g.rank(b))):
                g.tie_equal(a, d, b, d)


def _reduction(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """The kept dims, in order, tie to the output's."""
    axes = set(eqn.params.get("axes", eqn.params.get("dimensions", ())))
    n = len(outs)
    for x, y in zip(ins[:n], outs, strict=True):
        kept = [d for d in range(g.rank(x)) if d not in axes]
        for out_dim, d in enumerate(kept):
            if out_dim < g.rank(y):
                g.tie_equal(x, d, y, out_dim)


def _windowed(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Pooling: dims with a window of 1 and an unchanged size."""
    window = eqn.params["window_dimensions"]
    n = len(outs)
    for x, y in zip(ins[:n], outs, strict=True):
        for d in range(min(g.rank(x), g.rank(y), len(window))):
            if window[d] == 1:
                g.tie_equal(x, d, y, d)


def _select_and_scatter_add(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """A pooling's gradient: the operand is the output; the pooled source ties
    where the window is 1."""
    source, operand = ins[0], ins[1]
    g.tie_same(operand, outs[0])
    window = eqn.params["window_dimensions"]
    for d in range(min(g.rank(source), len(window))):
        if window[d] == 1:
            g.tie_equal(source, d, outs[0], d)


def _broadcast_in_dim(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    for d, out_dim in enumerate(eqn.params["broadcast_dimensions"]):
        g.tie_equal(ins[0], d, outs[0], out_dim)


def _transpose(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    for out_dim, d in enumerate(eqn.params["permutation"]):
        g.tie_equal(ins[0], d, outs[0], out_dim)


def _squeeze(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    removed = {d % g.rank(ins[0]) for d in eqn.params["dimensions"]}
    kept = [d for d in range(g.rank(ins[0])) if d not in removed]
    for out_dim, d in enumerate(kept):
        g.tie_equal(ins[0], d, outs[0], out_dim)


def reshape_groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Aligns two shapes of one size into groups of dims with equal products.

    Example:
        >>> reshape_groups((8, 32, 64), (8, 32, 4, 1, 16))
        [([0], [0]), ([1], [1]), ([2], [2, 3, 4])]
    """
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        gi, gj, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                gi.append(i)
                pa, i = pa * a[i], i + 1
            elif pb < pa and j < len(b):
                gj.append(j)
                pb, j = pb * b[j], j + 1
            else:
                return groups
        groups.append((gi, gj))
    return groups


def _reshape(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Each group's leading factors tie: sharding a leading factor splits the
    flattened elements into the same contiguous blocks on both sides.

    `d_model -> (heads, head_dim)` ties d_model with heads. A group that joins
    several dims larger than 1 into fewer is recorded as a `Merge`.
    """
    x, y = ins[0], outs[0]
    a, b = g.shapes[x], g.shapes[y]
    if 0 in a or 0 in b:
        return
    for gi, gj in reshape_groups(a, b):
        big_in = [d for d in gi if a[d] > 1]
        big_out = [d for d in gj if b[d] > 1]
        if not big_in or not big_out:
            continue
        g.tie(x, big_in[0], y, big_out[0])
        if len(big_in) > 1 and len(big_out) < len(big_in):
            g.merges.append(Merge(a, b, (y, big_out[0]), tuple((x, d) for d in big_in)))


def _dot_general(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Contracting and batch dims across the operands; the output's batch, lhs
    free and rhs free dims (in that order) to their sources."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs, out = ins[0], ins[1], outs[0]
    for dl, dr in zip(tuple(lc) + tuple(lb), tuple(rc) + tuple(rb), strict=True):
        g.tie_equal(lhs, dl, rhs, dr)
    for dl, dr in zip(lb, rb, strict=True):
        g.mark(DOT_BATCH, lhs, dl)
        g.mark(DOT_BATCH, rhs, dr)
        for vid, d in ((lhs, dl), (rhs, dr)):
            if vid in g.weights:
                g.mark(WEIGHT_BATCH, vid, d)
    g.dots.append(Dot(tuple((lhs, d) for d in lb if g.size(lhs, d) > 1),
                      tuple((lhs, d) for d in lc if g.size(lhs, d) > 1)))
    lfree = [d for d in range(g.rank(lhs)) if d not in lc and d not in lb]
    rfree = [d for d in range(g.rank(rhs)) if d not in rc and d not in rb]
    sources = [(lhs, d) for d in lb] + [(lhs, d) for d in lfree] + [(rhs, d) for d in rfree]
    for out_dim, (vid, d) in enumerate(sources):
        g.tie_equal(vid, d, out, out_dim)


def _conv(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Batch to batch, lhs features to rhs input features, rhs output features
    to the output's, and spatial dims whose size is unchanged."""
    lhs_spec, rhs_spec, out_spec = eqn.params["dimension_numbers"]
    lhs, rhs, out = ins[0], ins[1], outs[0]
    if eqn.params.get("batch_group_count", 1) == 1:
        g.tie_equal(lhs, lhs_spec[0], out, out_spec[0])
    if eqn.params.get("feature_group_count", 1) == 1:
        g.tie_equal(lhs, lhs_spec[1], rhs, rhs_spec[1])
    g.tie_equal(rhs, rhs_spec[0], out, out_spec[1])
    for dl, do in zip(lhs_spec[2:], out_spec[2:], strict=True):
        g.tie_equal(lhs, dl, out, do)


def _unchanged(g: DimGraph, x: int, y: int, dims: Sequence[int]) -> None:
    for d in dims:
        g.tie_equal(x, d, y, d)


def _slice(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    _unchanged(g, ins[0], outs[0], range(g.rank(ins[0])))


def _pad(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    config = eqn.params["padding_config"]
    _unchanged(g, ins[0], outs[0], [d for d, c in enumerate(config) if tuple(c) == (0, 0, 0)])


def _concatenate(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    axis = eqn.params["dimension"]
    for x in ins:
        _unchanged(g, x, outs[0], [d for d in range(g.rank(x)) if d != axis])


def _split(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    axis = eqn.params["axis"] % g.rank(ins[0])
    for y in outs:
        _unchanged(g, ins[0], y, [d for d in range(g.rank(y)) if d != axis])


def _dynamic_update_slice(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    g.tie_same(ins[0], outs[0])
    _unchanged(g, ins[1], ins[0], range(g.rank(ins[1])))


def _top_k(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    for y in outs:
        _unchanged(g, ins[0], y, range(g.rank(y) - 1))


def _gather(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """An embedding lookup: the table's indexed dim is its own axis (marked);
    its sliced-whole dims (the features) tie to the output's offset dims, and
    the indices' batch dims to the output's other dims."""
    dn = eqn.params["dimension_numbers"]
    operand, indices, out = ins[0], ins[1], outs[0]
    skipped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window = [d for d in range(g.rank(operand)) if d not in skipped]
    for d, out_dim in zip(window, dn.offset_dims, strict=False):
        g.tie_equal(operand, d, out, out_dim)
    out_batch = [d for d in range(g.rank(out)) if d not in dn.offset_dims]
    for d, out_dim in zip(range(g.rank(indices) - 1), out_batch, strict=False):
        g.tie_equal(indices, d, out, out_dim)
    for do, di in zip(dn.operand_batching_dims, dn.start_indices_batching_dims, strict=True):
        g.tie_equal(operand, do, indices, di)
    for d in dn.start_index_map:
        g.mark(GATHER_INDEX, operand, d)


def _scatter(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """The transpose of `_gather` (the embedding's gradient): the output is the
    operand; update window dims tie to the operand's, scatter dims to indices."""
    dn = eqn.params["dimension_numbers"]
    operand, indices, updates = ins[0], ins[1], ins[2]
    g.tie_same(operand, outs[0])
    skipped = set(dn.inserted_window_dims) | set(dn.operand_batching_dims)
    window = [d for d in range(g.rank(operand)) if d not in skipped]
    for d, ud in zip(window, dn.update_window_dims, strict=False):
        g.tie_equal(operand, d, updates, ud)
    scatter_dims = [d for d in range(g.rank(updates)) if d not in dn.update_window_dims]
    for d, ud in zip(range(g.rank(indices) - 1), scatter_dims, strict=False):
        g.tie_equal(indices, d, updates, ud)
    for do, di in zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims, strict=True):
        g.tie_equal(operand, do, indices, di)
    for d in dn.scatter_dims_to_operand_dims:
        g.mark(GATHER_INDEX, operand, d)


def _iota(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """A fresh value; remembered, since `labels == iota` is a one-hot."""
    g.iotas[outs[0]] = None


def _eq(g: DimGraph, eqn: Any, ins: list[int], outs: list[int]) -> None:
    """Elementwise; and `labels[..., None] == iota` is a one-hot, whose iota dim
    is a class dim (an output head's vocab)."""
    elementwise(g, eqn, ins, outs)
    for a, b in ((ins[0], ins[1]), (ins[1], ins[0])):
        if a in g.labels and b in g.iotas and g.rank(a) == g.rank(b):
            for d in range(g.rank(b)):
                if g.size(a, d) == 1:
                    g.mark(ONE_HOT, b, d)


_RULES: dict[str, Rule] = {
    "broadcast_in_dim": _broadcast_in_dim,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "reshape": _reshape,
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "slice": _slice,
    "dynamic_slice": _slice,
    "pad": _pad,
    "concatenate": _concatenate,
    "split": _split,
    "dynamic_update_slice": _dynamic_update_slice,
    "top_k": _top_k,
    "gather": _gather,
    "eq": _eq,
    "iota": _iota,
    "optimization_barrier": _pairwise,
    "device_put": _pairwise,
    "reduce": _reduction,
    "select_and_scatter_add": _select_and_scatter_add,
    **{name: _scatter for name in ("scatter", "scatter-add", "scatter_add", "scatter-mul",
                                   "scatter_mul", "scatter-min", "scatter_min", "scatter-max",
                                   "scatter_max", "scatter-sub", "scatter_sub")},
}
