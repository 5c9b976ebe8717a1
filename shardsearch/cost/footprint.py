"""A step's bytes per device before it compiles: what its jaxpr keeps live.

`trace_program(step, args)` traces the step once (a knob setting is its own
program: remat keeps fewer residuals, microbatches a smaller batch per pass,
activation rules add sharding constraints) and keeps its `DimGraph`
(`logical.graph`), whose walk recorded every equation in the order it runs.
`predict_footprint(program, specs, axis_sizes)` then prices one candidate:

1. **Where each value is split.** Every sharding constraint in the program,
   then the arguments' specs, say which mesh axes split which dims. Each other
   dim takes the axes of the nearest split one the dataflow couples it to (a
   breadth-first search over the graph's edges), the constraints' first, as
   XLA's propagation holds to them, then the arguments' where a constraint's
   axis is taken by another dim of the value: an activation's batch dim
   follows the batch's, the MLP hidden dim the weight's column split. A
   constrained value is placed first and whole (its constraint's dims before
   any dim the arguments reach), and the values after it follow it as
   placed: a constraint that puts the embedding dim on the batch's data axis
   leaves the batch dim, there and in everything computed from it, the
   other axes only. A value's bytes per device are those of its shard: each
   dim split by the distinct mesh axes on it, rounded up where they do not
   divide it (XLA pads the last shards: a microbatch of 384 rows on 256
   devices holds 2).
2. **What is live at once.** Broadcasts and iotas are not stored (XLA computes
   them inside the fusion that reads them). The equations run in order; a value lives from the
   equation that makes it to the last one that reads it, a body's values
   while its equation runs (a scan's stacked outputs the whole loop, a loop's
   carry in its input's buffer when that input dies there). The new state takes
   the donated state's buffers, as the compiled step's aliasing does.

The figure is the arguments plus the most bytes live at once besides them.
It counts every equation's output as if it were stored, where XLA fuses
elementwise chains and reuses buffers, so it is an upper-biased estimate of
XLA's own total; the search scales it by what the study's compiled candidates
showed (`evaluation.evaluate.check`) before it cuts on it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from ..base.spec import dim_axes
from ..logical.discover import trace_graph
from ..logical.graph import DimGraph, Frame, Node


@dataclasses.dataclass(frozen=True)
class Program:
    """A step traced once for pricing: its graph, where its arguments are, and
    what no candidate changes.

    Attributes:
      graph: the walked jaxpr (`logical.graph.DimGraph`), its program in `frames`.
      leaves: per argument, the value id of each array leaf in flattening order
        (None for a leaf that is not an array).
      treedefs: per argument, its tree structure (specs are flattened up to it).
      pinned: the dims the step's own sharding constraints fix, and their axes.
      fused: the values never stored on their own (`_fused`).
    """

    graph: DimGraph
    leaves: tuple[tuple[int | None, ...], ...]
    treedefs: tuple[Any, ...]
    pinned: Mapping[Node, tuple[str, ...]]
    fused: frozenset[int]


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Predicted bytes per device of one candidate.

    Attributes:
      arguments: the arguments' bytes per device under the specs.
      live: the most bytes live at once besides the arguments.
    """

    arguments: int
    live: int

    @property
    def total(self) -> int:
        return self.arguments + self.live


def trace_program(step: Callable[..., Any], args: Sequence[Any]) -> Program:
    """Traces `step(*args)` (abstract arguments are enough) into a `Program`."""
    g, _, leaf_ids = trace_graph(step, args, "memory prediction")
    treedefs = tuple(jax.tree_util.tree_structure(a) for a in args)
    pinned: dict[Node, tuple[str, ...]] = {}
    for op in _ops(g.frames):
        if op.constraint is not None and op.outs:
            _seed(pinned, op.outs[0], op.constraint)
    return Program(g, tuple(tuple(ids) for ids in leaf_ids), treedefs, pinned,
                   frozenset(_fused(g.frames)))


def predict_footprint(program: Program, specs: Sequence[Any],
                      axis_sizes: Mapping[str, int]) -> Footprint:
    """The candidate's predicted bytes per device (module docstring).

    Args:
      program: from `trace_program`.
      specs: one spec tree per argument, `PartitionSpec` leaves.
      axis_sizes: the mesh's axis sizes by name.

    Raises:
      ValueError: `specs` without one tree per argument, or of another structure.
    """
    if len(specs) != len(program.treedefs):
        raise ValueError(f"memory prediction: {len(specs)} spec trees for "
                         f"{len(program.treedefs)} arguments")
    g = program.graph
    given: dict[Node, tuple[str, ...]] = {}
    for ids, treedef, tree in zip(program.leaves, program.treedefs, specs, strict=True):
        for vid, spec in zip(ids, treedef.flatten_up_to(tree), strict=True):
            if vid is not None:
                # A leaf without a spec is whole.
                spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
                _seed(given, vid, dim_axes(spec, g.rank(vid)))
    # The constrained values first, as XLA holds them: each dim a constraint
    # leaves to XLA takes the axes the rest of the dataflow gives it, less
    # those the constrained dims hold. Then every other value follows the
    # nearest of them, as a whole, before the arguments.
    first = _placements(g, _spread(g, [program.pinned, given]), axis_sizes,
                        only={vid for vid, _ in program.pinned})
    held = dict(program.pinned)
    held.update(((vid, d), axes) for vid, dims in first.items()
                for d, axes in enumerate(dims) if axes)
    options = _spread(g, [held, given])
    shard = _shard_bytes(g, _placements(g, options, axis_sizes), axis_sizes)

    def size(vid: int) -> int:
        return 0 if vid in program.fused else shard.get(vid, g.nbytes(vid))

    arguments = sum(size(v) for ids in program.leaves for v in ids if v is not None)
    state = [v for v in program.leaves[0] if v is not None] if program.leaves else []
    live = max((_peak(frame, size, aliased=_aliased(frame, state, g)) for frame in g.frames),
               default=0)
    return Footprint(arguments, live)


# Primitives whose outputs XLA computes inside the fusion that reads them
# rather than storing them: a broadcast (a mask, a zero, a bias) and an iota.
_FUSED = frozenset({"broadcast_in_dim", "iota"})


def _fused(frames: Sequence[Frame], found: set[int] | None = None) -> set[int]:
    """The values never stored on their own: the outputs of `_FUSED`
    primitives, and a call's outputs that are such values in its body."""
    found = set() if found is None else found
    for frame in frames:
        for op in frame.ops:
            _fused(op.bodies, found)
            if op.primitive in _FUSED:
                found.update(op.outs)
            elif len(op.bodies) == 1 and not op.carried:
                found.update(out for out, inner in zip(op.outs, op.bodies[0].outs, strict=False)
                             if inner in found)
    return found


def _seed(seeds: dict[Node, tuple[str, ...]], vid: int,
          axes: Sequence[tuple[str, ...] | None]) -> None:
    """Seeds every dim of `vid` its spec fixes (`base.spec.dim_axes`: not the
    dims left to XLA)."""
    for d, names in enumerate(axes):
        if names is not None:
            seeds[(vid, d)] = names


def _ops(frames: Sequence[Frame]) -> Any:
    for frame in frames:
        for op in frame.ops:
            yield op
            yield from _ops(op.bodies)


def _spread(g: DimGraph, tiers: Sequence[Mapping[Node, tuple[str, ...]]],
            ) -> dict[Node, list[tuple[int, tuple[str, ...]]]]:
    """Each node's candidate axes, best first, each with its rank (0 for a
    seed, then 1 for the first tier, 2 for the second...): a seeded node its
    seed's only; any other node, per tier in order, the axes of the nearest
    split seed of that tier that reaches it through unseeded nodes (the first
    in order on a tie). A seed that keeps its dim whole (a replicated
    weight's) stays whole but spreads nothing: XLA keeps an activation split
    by the batch even where it meets a replicated weight."""
    seeded: dict[Node, tuple[str, ...]] = {}
    for tier in tiers:
        for node, axes in tier.items():
            seeded.setdefault(node, axes)
    options: dict[Node, list[tuple[int, tuple[str, ...]]]] = {
        n: [(0, a)] for n, a in seeded.items()}
    for rank, tier in enumerate(tiers, 1):
        reached: dict[Node, tuple[str, ...]] = {}
        queue = collections.deque(n for n, axes in tier.items()
                                  if axes and seeded[n] == axes and n in g.graph)
        while queue:
            node = queue.popleft()
            axes = seeded.get(node) or reached[node]
            for other in g.graph.neighbors(node):
                if other not in seeded and other not in reached:
                    reached[other] = axes
                    queue.append(other)
        for node, axes in reached.items():
            options.setdefault(node, []).append((rank, axes))
    return options


def _placements(g: DimGraph, options: Mapping[Node, list[tuple[int, tuple[str, ...]]]],
                axis_sizes: Mapping[str, int], only: set[int] | None = None,
                ) -> dict[int, list[tuple[str, ...]]]:
    """Per value with a split dim (of `only`, when given), the mesh axes on
    each dim: the seeded dims first, then the tiers' in order (first dims
    first within a rank), each dim the first of its candidate axes that still
    split it (mesh axes another dim of the value took, or a dim of size 1,
    dropped). A constraint's dim so keeps its axes where the arguments would
    have put them on another dim of the value first."""
    by_value: dict[int, list[tuple[int, int, tuple[str, ...]]]] = {}
    for (vid, d), choices in options.items():
        if only is None or vid in only:
            by_value.setdefault(vid, []).extend(
                (rank, d, names) for rank, names in choices if names)
    out: dict[int, list[tuple[str, ...]]] = {}
    for vid, choices in by_value.items():
        used: set[str] = set()
        placed: list[tuple[str, ...]] = [()] * len(g.shapes[vid])
        for _, d, names in sorted(choices):
            if placed[d]:
                continue
            size, taken = g.shapes[vid][d], []
            for name in names:
                if (name in used or axis_sizes.get(name, 1) <= 1
                        or _shard_dim(size, taken, axis_sizes) == 1):
                    continue
                taken.append(name)
            used.update(taken)
            placed[d] = tuple(taken)
        if used:
            out[vid] = placed
    return out


def _shard_bytes(g: DimGraph, placements: Mapping[int, Sequence[tuple[str, ...]]],
                 axis_sizes: Mapping[str, int]) -> dict[int, int]:
    """Per split value id, its bytes on one device: each dim split by its
    axes (`_placements`). An axis that does not divide the dim still splits
    it, as XLA's partitioner does, into shards of the rounded-up size, the
    last ones padded: 384 rows over 256 devices hold 2 rows on each, 192 rows
    1 (64 devices hold only padding).

    Example: a [384, 512] float32 value, dim 0 on an axis of 256 devices:
    2 x 512 x 4 = 4096 bytes per device, not the whole 786432."""
    return {vid: math.prod(_shard_dim(n, axes, axis_sizes)
                           for n, axes in zip(g.shapes[vid], dims, strict=True))
            * g.itemsizes[vid] for vid, dims in placements.items()}


def _shard_dim(extent: int, axes: Sequence[str], axis_sizes: Mapping[str, int]) -> int:
    """A dim's extent on one device split by `axes` in order, each rounded up."""
    for name in axes:
        extent = -(-extent // axis_sizes[name])
    return extent


def _aliased(frame: Frame, state: Sequence[int], g: DimGraph) -> frozenset[int]:
    """The top-level outputs that take a donated state leaf's buffer: the new
    state, leaf for leaf where shape and element size agree."""
    if frame.ins[:len(state)] != tuple(state):
        return frozenset()
    return frozenset(out for out, leaf in zip(frame.outs, state, strict=False)
                     if g.shapes[out] == g.shapes[leaf]
                     and g.itemsizes[out] == g.itemsizes[leaf])


def _peak(frame: Frame, size: Callable[[int], int], aliased: frozenset[int] = frozenset()) -> int:
    """The most bytes live at once in one walk of a jaxpr, its inputs, its
    constants and its literals not counted (whoever runs it holds them)."""
    last: dict[int, int] = {}
    for i, op in enumerate(frame.ops):
        for v in op.ins:
            last[v] = i
    for v in frame.outs:
        last[v] = len(frame.ops)
    alive: dict[int, int] = {}  # value id → bytes, for the values this frame made
    live = peak = 0
    for i, op in enumerate(frame.ops):
        # A loop's result takes its carry's buffer when the carry dies here.
        reuse = {op.outs[o]: op.ins[k] for k, o in op.carried
                 if op.ins[k] in alive and last.get(op.ins[k]) == i}
        new = {v: 0 if v in aliased else size(v)
               for v in op.outs if v not in reuse and v not in alive}
        made = sum(new.values())
        inner = max((_peak(body, size) for body in op.bodies), default=0)
        if op.bodies and not op.carried:
            # A call: its body's peak already holds the values it returns.
            peak = max(peak, live + max(made, inner))
        else:
            peak = max(peak, live + made + inner)
        for out, src in reuse.items():
            # The carry's buffer, grown to the result where the carry was not
            # stored before (a loop's zeros).
            grow = max(0, (0 if out in aliased else size(out)) - alive[src])
            alive[out] = alive.pop(src) + grow
            made += grow
        alive.update(new)
        live += made
        for v in dict.fromkeys(op.ins + op.outs):
            if v in alive and last.get(v, -1) <= i:
                live -= alive.pop(v)
    return max(peak, live)
