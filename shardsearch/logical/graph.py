"""The dim graph: which (value, dim) pairs of a traced step must be split alike.

Every value the walk meets (an argument, an equation's output, a literal)
gets an int id in the order it is met; a node is `(value id, dim)`. Only dims
larger than 1 are nodes: a size-1 dim is never split, and coupling it with the
dim it broadcasts against (`sub f32[8,32,64] f32[8,32,1]`) would join
unrelated axes. An edge says the two dims must be split alike for the op that
relates them to run without resharding; the connected components are the
logical axes (`logical.discover`).

Besides edges, the walk records evidence the naming reads (`logical.naming`):
which dims are dot_general batch dims (and which of those batch a weight
itself: stacked experts), an embedding's indexed dim, a one-hot class dim, a
scan's stacked dim; and where a reshape merged several dims.

The walk also keeps the program itself, as `Frame`s of `Op`s in the order
they run: which value ids each equation reads and writes, and the bodies it
runs. `cost.footprint` reads it for the live bytes of a step before anything
compiles.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import networkx as nx

Node = tuple[int, int]

# Evidence kinds `DimGraph.mark` accepts.
DOT_BATCH = "dot_batch"        # a batch dim of some dot_general
WEIGHT_BATCH = "weight_batch"  # a batch dim of a dot_general on a state leaf itself
GATHER_INDEX = "gather_index"  # an operand dim a gather or scatter indexes
ONE_HOT = "one_hot"            # the class dim of a one-hot of integer labels
SCAN_LENGTH = "scan_length"    # the stacked (leading) dim of a scan's xs or ys
EVIDENCE = (DOT_BATCH, WEIGHT_BATCH, GATHER_INDEX, ONE_HOT, SCAN_LENGTH)


@dataclasses.dataclass(frozen=True)
class Merge:
    """A reshape whose output dim joins several input dims larger than 1.

    The merged dim is coupled with the leading factor only, so the other
    factors' axes are not visible on it.
    """

    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    out_node: Node
    in_nodes: tuple[Node, ...]


@dataclasses.dataclass(frozen=True)
class Dot:
    """One dot_general's lhs batch and contracting dims (for head_dim naming)."""

    batch: tuple[Node, ...]
    contracting: tuple[Node, ...]


@dataclasses.dataclass
class Op:
    """One equation as the walk met it: the value ids it reads and writes,
    and the frames of the bodies it runs (a call's body, a scan's, a while's
    cond and body, each branch of a cond), in the order walked."""

    primitive: str
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    bodies: list[Frame] = dataclasses.field(default_factory=list)
    # (input index, output index) of each loop carry: a scan's or a while's
    # result may take its input's buffer.
    carried: tuple[tuple[int, int], ...] = ()
    # A sharding constraint's mesh axes per dim of its output (None: XLA
    # chooses that dim); None for other primitives.
    constraint: tuple[tuple[str, ...] | None, ...] | None = None


@dataclasses.dataclass
class Frame:
    """One walk of a jaxpr: its input ids, its equations in order, its output ids."""

    ins: tuple[int, ...]
    ops: list[Op] = dataclasses.field(default_factory=list)
    outs: tuple[int, ...] = ()


class DimGraph:
    """The values of a traced step, their dims and the couplings between them.

    Example:
        >>> g = DimGraph()
        >>> a, b = g.value((8, 64)), g.value((8, 1))
        >>> g.tie_same(a, b)        # dim 0 only: b's dim 1 has size 1
        >>> g.graph.has_edge((a, 0), (b, 0))
        True
    """

    def __init__(self) -> None:
        self.graph = nx.Graph()
        self.shapes: list[tuple[int, ...]] = []
        self.itemsizes: list[int] = []  # bytes per element; 0 when not known
        self.frames: list[Frame] = []   # the top-level walks, in order
        self.op: Op | None = None       # the equation being walked, if any
        self.evidence: dict[str, list[Node]] = {kind: [] for kind in EVIDENCE}
        self.dots: list[Dot] = []
        self.merges: list[Merge] = []
        # Dicts used as ordered sets, so nothing iterates a set.
        self._unhandled: dict[str, None] = {}
        self._unread: dict[str, None] = {}  # shardings of constraints with no spec
        # Provenance, kept through shape-only ops and call boundaries.
        self.labels: dict[int, None] = {}   # integer leaves of the batch arguments
        self.iotas: dict[int, None] = {}    # iota outputs
        self.weights: dict[int, None] = {}  # leaves of the state (argument 0)

    def value(self, shape: Sequence[int], itemsize: int = 0) -> int:
        """A new value id; its dims larger than 1 become nodes."""
        vid = len(self.shapes)
        shape = tuple(int(d) for d in shape)
        self.shapes.append(shape)
        self.itemsizes.append(int(itemsize))
        self.graph.add_nodes_from((vid, d) for d, size in enumerate(shape) if size > 1)
        return vid

    def nbytes(self, vid: int) -> int:
        """The value's whole size in bytes (0 when its element size is not known)."""
        return math.prod(self.shapes[vid]) * self.itemsizes[vid]

    def size(self, vid: int, dim: int) -> int:
        return self.shapes[vid][dim]

    def rank(self, vid: int) -> int:
        return len(self.shapes[vid])

    def tie(self, a: int, da: int, b: int, db: int) -> None:
        """Couples dim `da` of `a` with dim `db` of `b`, unless either has size 1.

        Sizes may differ (a merged dim and its leading factor); callers that
        relate dims one to one check equality themselves.
        """
        if self.size(a, da) > 1 and self.size(b, db) > 1 and (a, da) != (b, db):
            self.graph.add_edge((a, da), (b, db))

    def tie_equal(self, a: int, da: int, b: int, db: int) -> None:
        """`tie` when the two dims have the same size; nothing otherwise."""
        if self.size(a, da) == self.size(b, db):
            self.tie(a, da, b, db)

    def tie_same(self, a: int, b: int) -> None:
        """Couples two values of one rank dim by dim, where the sizes agree."""
        if self.rank(a) == self.rank(b):
            for d in range(self.rank(a)):
                self.tie_equal(a, d, b, d)

    def mark(self, kind: str, vid: int, dim: int) -> None:
        """Records evidence `kind` for a dim (ignored for size-1 dims)."""
        if self.size(vid, dim) > 1:
            self.evidence[kind].append((vid, dim))

    def unhandled(self, primitive: str) -> None:
        """Notes a primitive the walk has no rule for."""
        self._unhandled[primitive] = None

    def unhandled_names(self) -> tuple[str, ...]:
        return tuple(sorted(self._unhandled))

    def unread(self, sharding: str) -> None:
        """Notes a sharding constraint whose sharding names no PartitionSpec
        (its type, e.g. "GSPMDSharding"): nothing can be read of its axes."""
        self._unread[sharding] = None

    def unread_constraints(self) -> tuple[str, ...]:
        return tuple(sorted(self._unread))

    def inherit(self, src: int, dst: int) -> None:
        """`dst` is `src` seen through a shape-only op: it keeps its provenance."""
        for provenance in (self.labels, self.iotas, self.weights):
            if src in provenance:
                provenance[dst] = None
