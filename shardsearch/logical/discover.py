"""Discovering a step's logical axes from its jaxpr.

`discover_logical_axes(step, args)` traces the step, couples the dims that
must be split alike (`logical.walk` over a `logical.graph.DimGraph`),
takes the connected components, folds the components that repeat per layer
of an unrolled model into one axis each, and names the result
(`logical.naming`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import networkx as nx
import numpy as np

from ..base.tree import leaf_shape, path_str
from .axes import LeafAxes, LogicalAxes, LogicalAxis
from .graph import DimGraph, Merge, Node
from .naming import AxisFacts, LeafFacts, name_axes
from .user import adopt, given_names, user_names
from .walk import itemsize, walk

_INDEX = re.compile(r"(?<![^/])\d+(?![^/])")


def discover_logical_axes(step: Callable[..., Any], args: Sequence[Any],
                          names: Sequence[Any] | None = None) -> LogicalAxes:
    """Finds which dims of a step's arguments must be split alike, and names them.

    The step is traced once (`jax.make_jaxpr`, nothing is compiled) on
    abstract copies of `args`. Two dims share a logical axis when the
    dataflow relates them: a weight's output dim and the next weight's input
    dim, a parameter and its Adam moments, the batch dim of the inputs and of
    every activation. In an unrolled model the axes that play one role in
    every layer (the same leaf path but for the layer index, the same dim)
    are one axis, so their number does not grow with depth.

    Args:
      step: a plain (un-jitted) function, called as `step(*args)`.
      args: the step's arguments, the state first and then the batch, as
        arrays or `jax.ShapeDtypeStruct`s; other leaves (strings, Python
        objects) are held fixed during the trace. Flax's boxed parameters
        (`nnx.state(model)` with `nnx.with_partitioning`, Linen's
        `nn.with_logical_partitioning`) bring their logical names along.
      names: the user's logical names, per argument a tree like it whose
        leaves are `PartitionSpec`s or tuples of names (or None), as
        `nn.get_partition_spec` gives; where given they replace the boxes'.
        The axes take the user's names (`logical.user.adopt`): the dataflow
        still decides which dims are coupled, and a disagreement is
        recorded in `conflicts`.

    Returns:
      The `LogicalAxes`: one name per dim of every array leaf (None for
      size-1 dims, () for non-array leaves); the axes in order of first
      appearance, each sized by the smallest dim it joins (a merged
      `heads x head_dim` dim counts heads) and named by `logical.naming`;
      in `merges`, every reshape whose merged dim hides an axis that some
      argument carries (a flatten of `batch` and `seq`: the merged dim
      carries `batch` only) and every leaf the dataflow gives one axis on
      two dims; in `unhandled`, the primitives the analysis has no rule for;
      in `conflicts`, where the user's names disagree with the dataflow.

    Raises:
      TypeError: `args` is not a tuple or list.
      ValueError: `names` without one tree per argument, or of another structure.

    Example:
      >>> w = get_workload("gpt:tiny")
      >>> axes = discover_logical_axes(w.step, w.abstract())
      >>> axes.leaves(0)["params/layers/0/attn/wq"].names
      ('embed', 'heads')
    """
    if not isinstance(args, tuple | list):
        raise TypeError(f"discover_logical_axes takes the step's arguments as a tuple or "
                        f"list, got {type(args).__name__}; pass (state, batch)")
    args = tuple(args)
    g, per_arg, leaf_ids = trace_graph(step, args, "discover_logical_axes")
    return adopt(_assemble(g, per_arg, leaf_ids), _user_names(args, names))


def trace_graph(step: Callable[..., Any], args: Sequence[Any], where: str,
                ) -> tuple[DimGraph, list[list[Any]], list[list[int | None]]]:
    """Traces `step(*args)` once and walks its jaxpr into a `DimGraph`.

    Returns the graph, each argument's `(path, leaf)` pairs, and per argument
    the value id of each leaf (None for a leaf that is not an array).
    """
    args = tuple(args)
    per_arg = [jax.tree_util.tree_flatten_with_path(a)[0] for a in args]
    leaves, treedef = jax.tree_util.tree_flatten(args)
    traced = [leaf_shape(x) is not None for x in leaves]

    def flat_step(*arrays: Any) -> Any:
        it = iter(arrays)
        full = [next(it) if t else x for x, t in zip(leaves, traced, strict=True)]
        out = step(*jax.tree_util.tree_unflatten(treedef, full))
        # Only the arrays: a state that carries strings hands them back too.
        return [y for y in jax.tree_util.tree_leaves(out) if leaf_shape(y) is not None]

    abstract = [_abstract(x) for x, t in zip(leaves, traced, strict=True) if t]
    try:
        closed = _shared_trace(step, treedef, abstract) if all(traced) else None
        if closed is None:
            closed = jax.make_jaxpr(flat_step)(*abstract)
    except Exception as err:
        err.add_note(f"{where}: tracing the step with jax.make_jaxpr failed; "
                     "the step must run on abstract arguments (jax.ShapeDtypeStruct)")
        raise

    g = DimGraph()
    leaf_ids: list[list[int | None]] = []
    for a, flat in enumerate(per_arg):
        ids: list[int | None] = []
        for _, x in flat:
            shape = leaf_shape(x)
            if shape is None:
                ids.append(None)
                continue
            vid = g.value(shape, itemsize(x))
            if a == 0:
                g.weights[vid] = None
            elif _is_integer(x):
                g.labels[vid] = None
            ids.append(vid)
        leaf_ids.append(ids)
    walk(g, closed, [vid for ids in leaf_ids for vid in ids if vid is not None])
    return g, per_arg, leaf_ids


def _user_names(args: tuple[Any, ...], names: Sequence[Any] | None) -> list[list[Any]]:
    if names is None:
        return [user_names(a) for a in args]
    if not isinstance(names, tuple | list) or len(names) != len(args):
        raise ValueError(f"discover_logical_axes: names must give one tree per argument "
                         f"({len(args)}), got {names!r:.80}")
    return [user_names(a) if n is None else given_names(a, n)
            for a, n in zip(args, names, strict=True)]


def _shared_trace(step: Callable[..., Any], treedef: Any,
                  abstract: Sequence[Any]) -> Any:
    """`step`'s jaxpr traced through the step itself, or None where it returns
    anything but arrays (then the caller traces a wrapper that drops them).

    JAX caches a trace by the function traced and its arguments' types, so
    the compile that lowers this same `step` later (`jax.jit(step, ...)`,
    `base.monitor`) reuses this one instead of tracing again; a wrapper
    function would be traced twice, once here and once there.
    """
    try:
        closed = jax.make_jaxpr(step)(*jax.tree_util.tree_unflatten(treedef, list(abstract)))
    except TypeError:  # e.g. a string among the outputs: not a JAX type
        return None
    return closed


def _abstract(x: Any) -> Any:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype,
                                    weak_type=bool(getattr(x, "weak_type", False)))
    return x  # a Python scalar: make_jaxpr abstracts it as a weak-typed 0-d value


def _is_integer(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    try:
        return dtype is not None and np.issubdtype(np.dtype(dtype), np.integer)
    except TypeError:  # extended dtypes (PRNG keys)
        return False


def _components(g: DimGraph) -> tuple[dict[Node, int], list[int]]:
    """Node -> component index (ordered by smallest node), and each component's
    size: its smallest dim, so a merged `heads x head_dim` dim counts heads."""
    comps = sorted((sorted(c) for c in nx.connected_components(g.graph)), key=lambda c: c[0])
    comp_of = {node: i for i, comp in enumerate(comps) for node in comp}
    sizes = [min(g.size(v, d) for v, d in comp) for comp in comps]
    return comp_of, sizes


def _assemble(g: DimGraph, per_arg: list[list[tuple[Any, Any]]],
              leaf_ids: list[list[int | None]]) -> LogicalAxes:
    comp_of, comp_sizes = _components(g)
    paths = [[path_str(p) for p, _ in flat] for flat in per_arg]

    # Argument dims of each component, in order of first appearance.
    where: dict[int, list[tuple[int, str, int]]] = {}
    for a, ids in enumerate(leaf_ids):
        for path, vid in zip(paths[a], ids, strict=True):
            for d in range(0 if vid is None else g.rank(vid)):
                if g.size(vid, d) > 1:
                    where.setdefault(comp_of[(vid, d)], []).append((a, path, d))

    axis_of_comp = _fold_layers(where)
    n_axes = max(axis_of_comp.values(), default=-1) + 1
    sizes = [0] * n_axes
    evidence: list[dict[str, None]] = [{} for _ in range(n_axes)]
    for comp, axis in axis_of_comp.items():
        size = comp_sizes[comp]
        sizes[axis] = size if not sizes[axis] else min(sizes[axis], size)
    for kind, nodes in g.evidence.items():
        for node in nodes:
            axis = axis_of_comp.get(comp_of[node])
            if axis is not None:
                evidence[axis][kind] = None

    def axis_of(node: Node) -> int | None:
        comp = comp_of.get(node)
        return None if comp is None else axis_of_comp.get(comp)

    facts = [LeafFacts(a, g.shapes[vid], _is_integer(x),
                       tuple(axis_of((vid, d)) for d in range(g.rank(vid))))
             for a, ids in enumerate(leaf_ids)
             for (_, x), vid in zip(per_arg[a], ids, strict=True) if vid is not None]
    dots = [(tuple(i for i in map(axis_of, dot.batch) if i is not None),
             tuple(i for i in map(axis_of, dot.contracting) if i is not None))
            for dot in g.dots]
    named = name_axes([AxisFacts(s, frozenset(e)) for s, e in zip(sizes, evidence, strict=True)],
                      facts, dots)
    axes = tuple(LogicalAxis(name, size, role)
                 for (name, role), size in zip(named, sizes, strict=True))

    arguments = []
    notes: dict[str, None] = {}
    for a, ids in enumerate(leaf_ids):
        leaves = []
        for path, vid in zip(paths[a], ids, strict=True):
            if vid is None:
                leaves.append(LeafAxes(path, None, ()))
                continue
            names = tuple(None if (i := axis_of((vid, d))) is None else axes[i].name
                          for d in range(g.rank(vid)))
            for d, name in enumerate(names):
                if name is not None and name in names[:d]:
                    notes[f"argument {a} leaf {path!r}: dims {names.index(name)} and {d} both "
                          f"carry {name}; the dataflow joined them"] = None
            leaves.append(LeafAxes(path, g.shapes[vid], names))
        arguments.append(tuple(leaves))
    for merge in g.merges:
        note = _merge_note(merge, axis_of, axes, g)
        if note:
            notes[note] = None
    return LogicalAxes(axes, tuple(arguments), tuple(notes), g.unhandled_names())


def _fold_layers(where: dict[int, list[tuple[int, str, int]]]) -> dict[int, int]:
    """Component -> axis index, one axis per role in repeated structure.

    Components with the same signature (the set of their argument dims, with
    every numeric path part replaced by `*`) are one axis: layer 0's heads
    and layer 1's heads. A component joins the first earlier one of its
    signature that shares no leaf with it, so two dims of one leaf never fold
    into one axis (a stack of square layers keeps its hidden dims apart).
    """
    groups: dict[tuple[tuple[int, str, int], ...], list[tuple[int, set[tuple[int, str]]]]] = {}
    axis_of_comp: dict[int, int] = {}
    n_axes = 0
    for comp, dims in where.items():
        signature = tuple(sorted(dict.fromkeys((a, _INDEX.sub("*", p), d) for a, p, d in dims)))
        leaves = {(a, p) for a, p, _ in dims}
        for axis, members in groups.get(signature, []):
            if members.isdisjoint(leaves):
                members.update(leaves)
                axis_of_comp[comp] = axis
                break
        else:
            groups.setdefault(signature, []).append((n_axes, leaves))
            axis_of_comp[comp] = n_axes
            n_axes += 1
    return axis_of_comp


def _merge_note(merge: Merge, axis_of: Callable[[Node], int | None],
                axes: Sequence[LogicalAxis], g: DimGraph) -> str | None:
    """A line for `LogicalAxes.merges` when a reshape hides an argument axis.

    The merged dim carries its leading factor's axis only; the note is kept
    when a trailing factor is itself on some argument (a flatten of `batch`
    and `seq`), since that axis cannot be split on the merged dim. Trailing
    factors that no argument carries (the head_dim of `heads x head_dim`)
    lose nothing and are not noted.
    """
    if all(axis_of(n) is None for n in merge.in_nodes[1:]):
        return None

    def part(node: Node) -> str:
        i = axis_of(node)
        size = g.size(*node)
        return f"{size}" if i is None else f"{axes[i].name} ({size})"

    carried = axis_of(merge.out_node)
    label = "an axis on no argument" if carried is None else axes[carried].name
    return (f"reshape {merge.in_shape} -> {merge.out_shape} joins "
            f"{' x '.join(part(n) for n in merge.in_nodes)} into one dim that carries "
            f"{label}")
