"""Collectives, matmul flops and bytes accessed, read from compiled XLA HLO text.

The static objective scores a candidate sharding without running it: it
compiles the step, takes ``compiled.as_text()`` (the post-optimisation,
SPMD-partitioned module, so every shape is per device) and asks two things of
it. :func:`parse_hlo` answers both from one parse:

- what communication XLA inserted: one :class:`Collective` per collective
  instruction, in a :class:`CollectiveSummary`, with the devices it spans:
  :attr:`Collective.groups` expands every replica-group syntax XLA prints
  (``{{0,1},{2,3}}``, iota ``[2,4]<=[8]`` and ``[4,2]<=[2,4]T(1,0)``, newer
  XLA's ``mesh['a'=2,'b'=4], device_ids=(...) {'b'}`` and
  ``maximal_mesh[...]``, a collective-permute's ``source_target_pairs``)
  into device ids, which :mod:`shardsearch.cost.topology` maps onto the
  mesh axes a collective crosses; :attr:`Collective.group_axes` keeps the
  axes the ``mesh[...]`` syntax lists;
- how much work the step does: :class:`HloCost`, the flops of every ``dot``
  and ``convolution`` (and cuBLAS gemm custom-call on GPU), split by the
  element type they take (:attr:`HloCost.dot_flops_by_dtype`), and the bytes
  its instructions read and write.

Both count each instruction as often as it runs per step: an instruction
inside a ``while`` body (``lax.scan``, ``fori_loop``) runs once per trip, and
nested loops multiply (see :mod:`shardsearch.cost.hlo_graph`). XLA's own
``compiled.cost_analysis()`` counts a loop body once, so a model whose layers
are stacked under ``lax.scan`` reports the flops and bytes of one layer;
:attr:`HloCost.dot_flops` minus :attr:`HloCost.dot_flops_once` (and likewise
for bytes) is what it leaves out.

Example::

    compiled = jax.jit(f, in_shardings=..., out_shardings=...).lower(*args).compile()
    summary, cost = parse_hlo(compiled.as_text())
    summary.bytes_by_kind()  # {"all-reduce": 20480, "all-gather": 0, ...}
    summary.transferred_bytes()  # ring-algorithm estimate of bytes sent per device
    summary.collectives[0].groups  # ((0, 1, 2, 3), (4, 5, 6, 7)): a psum over tp of dp=2,tp=4
    cost.dot_flops  # 5 * 2 * 128**3 for a 5-step scan of f32[128,128] matmuls
    cost.dot_flops_by_dtype  # (("f32", 5 * 2 * 128**3),)
    cost.loop_factor  # 5.0

Only the text is read; nothing here imports JAX. Point-to-point ``send`` /
``recv`` and the rarer ``collective-broadcast`` and ``ragged-all-to-all`` are
not counted, nor are the flops of elementwise ops, reductions or custom-calls
other than cuBLAS gemms.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
from collections.abc import Iterator
from typing import NamedTuple

from .hlo_graph import Computation, Instruction, Module, closing, parse_module, split_top
from .hlo_types import ARRAY, CALLS, ELEMENT_BITS, callers, matmul_dtype
from .replica_groups import Groups, permute_pairs, replica_groups

COLLECTIVE_KINDS: tuple[str, ...] = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
"""The collective kinds reported, in the order every per-kind mapping uses."""

_START_OPCODES = {f"{kind}-start": kind for kind in COLLECTIVE_KINDS}
_COLLECTIVE_OPCODES = frozenset(COLLECTIVE_KINDS) | frozenset(_START_OPCODES)
# Opcodes the flops pass looks at (a custom-call may be a gemm, and is counted).
_MATMUL_OPCODES = frozenset({"dot", "convolution", "custom-call"})


_LHS_CONTRACTING = re.compile(r"(?:^|[\s,])lhs_contracting_dims=\{(?P<dims>[^}]*)\}")
_DIM_LABELS = re.compile(
    r"(?:^|[\s,])dim_labels=(?P<lhs>[^_\s,]*)_(?P<kernel>[^-\s,]*)->(?P<out>[^\s,]*)"
)
_WINDOW = re.compile(r"(?:^|[\s,])window=\{(?P<window>[^}]*)\}")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
# cuBLAS gemms keep their dot dimensions in the backend config, as JSON.
_GEMM_TARGET = re.compile(r'custom_call_target="__cublas\$(?:gemm|lt\$matmul)[^"]*"')
_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions"\s*:\s*\[(?P<dims>[^\]]*)\]')


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled module.

    Attributes:
      kind: one of :data:`COLLECTIVE_KINDS`. An asynchronous pair
        (``all-gather-start`` / ``all-gather-done``, or an ``async-start``
        wrapping a collective) is one logical collective of the plain kind.
      bytes: bytes of the instruction's result on one device, summed over the
        elements of a tuple result. For ``*-start`` instructions, whose result
        bundles the operands, the output and context scalars, it is the bytes
        of the output part only. So for an all-gather it is the gathered
        buffer, for a reduce-scatter the scattered (smaller) one.
      group_size: devices taking part in each replica group. 1 means the op
        moves nothing (a group of one, or a size that could not be found,
        which :class:`CollectiveSummary` then lists in
        ``unknown_group_sizes``). For a collective-permute it is the number
        of distinct devices in ``source_target_pairs`` that send or receive
        from another device.
      count: executions per step: the product of the trip counts of the
        ``while`` loops around it, summed over every path from ENTRY.
      computation: name of the HLO computation holding the instruction.
      name: the instruction's name, to find it in the HLO text.
      groups: the device ids of every replica group, each in the order XLA
        lists (and reduces or gathers) it, e.g. ``((0, 1, 2, 3), (4, 5, 6,
        7))`` for ``replica_groups=[2,4]<=[8]``. The ids are XLA's: with
        ``jit`` or ``shard_map`` (one replica) they are partition ids, a
        device's position in the mesh's flattened device order. For a
        collective-permute, each ``(source, target)`` pair that moves data
        (source != target). Empty when XLA names no groups (no or empty
        ``replica_groups``: every device in one group) or no pairs.
      group_axes: for the ``mesh[...] {axes}`` syntax of newer XLA only, the
        axes XLA lists in the braces, each named once in the order listed
        (a sub-axis ``'b':(2)2`` by its axis ``"b"``; ``group_size`` says
        how many devices it spans), e.g. ``("axis_1",)``; None for every
        other syntax. These name the mesh of XLA's replica-group attribute,
        which XLA factors its own way (``mesh['axis_0'=1,'axis_1'=4,
        'axis_2'=2]`` for a ``dp=2, tp=4`` mesh), not the user's mesh: map
        ``groups`` onto the user's mesh instead.

    ``groups`` and ``group_axes`` are left out of ``==`` and the hash: a
    record compares by what moves and how often, where it moves is detail.
    """

    kind: str
    bytes: int
    group_size: int
    count: int
    computation: str
    name: str = ""
    groups: tuple[tuple[int, ...], ...] = dataclasses.field(default=(), compare=False)
    group_axes: tuple[str, ...] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        try:
            groups = tuple(tuple(operator.index(d) for d in group) for group in self.groups)
        except TypeError:
            groups = ((-1,),)  # reported below
        if any(d < 0 for group in groups for d in group):
            raise ValueError(
                f"Collective {self.name!r}: groups={self.groups!r} are not device "
                "ids; give each group as a tuple of ints >= 0"
            )
        object.__setattr__(self, "groups", groups)
        if self.group_axes is not None:
            object.__setattr__(self, "group_axes", tuple(self.group_axes))
        if self.kind not in COLLECTIVE_KINDS:
            raise ValueError(
                f"Collective kind {self.kind!r} is not one of {COLLECTIVE_KINDS}; "
                "use one of those names"
            )
        for field in ("bytes", "count"):
            if getattr(self, field) < 0:
                raise ValueError(
                    f"Collective {self.name!r}: {field}={getattr(self, field)} is "
                    "negative; it must be >= 0"
                )
        if self.group_size < 1:
            raise ValueError(
                f"Collective {self.name!r}: group_size={self.group_size} must be "
                ">= 1; use 1 when the group is unknown or a single device"
            )

    def transferred_bytes(self) -> float:
        """Estimates bytes one device sends for this collective, per step.

        Uses the ring-algorithm factors with ``n = group_size`` and
        ``B = bytes``: all-reduce ``2(n-1)/n * B``; all-gather ``(n-1)/n * B``
        (``B`` the gathered output); reduce-scatter ``(n-1) * B`` (``B`` the
        scattered output, so ``n * B`` is the input); all-to-all
        ``(n-1)/n * B``; collective-permute ``B``. Multiplied by ``count``;
        zero when ``n == 1``.

        Returns:
          The estimate in bytes, e.g. ``6144.0`` for a 4096-byte all-reduce
          over 4 devices executed once.
        """
        n = self.group_size
        if n <= 1:
            return 0.0
        factor = {
            "all-reduce": 2 * (n - 1) / n,
            "all-gather": (n - 1) / n,
            "reduce-scatter": float(n - 1),
            "all-to-all": (n - 1) / n,
            "collective-permute": 1.0,
        }[self.kind]
        return factor * self.bytes * self.count


@dataclasses.dataclass(frozen=True)
class CollectiveSummary:
    """The collectives of one compiled module, with what could not be resolved.

    Attributes:
      collectives: every collective reachable from ENTRY, in the order of the
        HLO text. Collectives in computations that ENTRY never calls are left
        out (they never run).
      unknown_trip_counts: body computations of ``while`` loops whose trip
        count was neither annotated nor derivable; their collectives are
        counted as if the loop ran once, so the totals are lower bounds.
      unknown_group_sizes: collectives whose group size could not be found
        (empty ``replica_groups`` and no ``HloModule`` line giving the device
        count); they are recorded with ``group_size=1``.
      num_devices: ``replica_count * num_partitions`` from the ``HloModule``
        line (XLA prints each only when it is not 1), or None without one.
    """

    collectives: tuple[Collective, ...] = ()
    unknown_trip_counts: tuple[str, ...] = ()
    unknown_group_sizes: tuple[str, ...] = ()
    num_devices: int | None = None

    def __post_init__(self):
        for field in ("collectives", "unknown_trip_counts", "unknown_group_sizes"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        for index, collective in enumerate(self.collectives):
            if not isinstance(collective, Collective):
                raise TypeError(
                    f"CollectiveSummary.collectives[{index}] is a "
                    f"{type(collective).__name__}, expected a Collective"
                )

    def bytes_by_kind(self) -> dict[str, int]:
        """Sums ``bytes * count`` per kind.

        Returns:
          A dict with every kind of :data:`COLLECTIVE_KINDS`, in that order,
          zero for kinds that do not occur, e.g.
          ``{"all-reduce": 8192, "all-gather": 0, "reduce-scatter": 0,
          "all-to-all": 0, "collective-permute": 0}``.
        """
        totals = dict.fromkeys(COLLECTIVE_KINDS, 0)
        for collective in self.collectives:
            totals[collective.kind] += collective.bytes * collective.count
        return totals

    @property
    def total_bytes(self) -> int:
        """Sum of ``bytes * count`` over all collectives."""
        return sum(c.bytes * c.count for c in self.collectives)

    def transferred_bytes(self) -> float:
        """Estimates bytes each device sends per step, summed over collectives.

        See :meth:`Collective.transferred_bytes` for the per-kind factors.
        """
        return sum(c.transferred_bytes() for c in self.collectives)


class KernelCost(NamedTuple):
    """One entry of :attr:`HloCost.kernels`: a kernel's work per step.

    Attributes:
      flops: the matmul flops it holds, ``(dtype, flops)`` pairs.
      bytes: the bytes it reads and writes.
      spaces: of those bytes, the ones in arrays the compiler placed in
        memory space ``n > 0`` (layouts marked ``S(n)``; on TPU, space 1 is
        the core's on-chip memory), ``(n, bytes)`` pairs by ``n``; empty
        where every array is in device memory (XLA:CPU and GPU programs).
      opcode: the instruction's opcode ("fusion", "copy-start", ...).

    Example:
      >>> KernelCost((("bf16", 2.1e12),), 3.4e9, ((1, 1.0e9),), "fusion")
    """

    flops: tuple[tuple[str, float], ...]
    bytes: float
    spaces: tuple[tuple[int, float], ...] = ()
    opcode: str = ""


def _kernel_cost(flops, nbytes, spaces=(), opcode="") -> KernelCost:
    """A `KernelCost` with its fields' types made exact (a plain
    `(flops, bytes)` pair gets no spaces and no opcode)."""
    return KernelCost(tuple((str(d), float(f)) for d, f in flops), float(nbytes),
                      tuple((int(n), float(b)) for n, b in spaces), str(opcode))


@dataclasses.dataclass(frozen=True)
class HloCost:
    """The matmul flops and memory traffic of one compiled module, per device and step.

    Each figure comes twice: counted as often as each instruction runs, and
    counted with every loop taken to run once, which is what XLA's
    ``cost_analysis()`` does. The difference is the work of the loop trips
    XLA leaves out; :func:`shardsearch.cost.program.loop_aware` adds it to XLA's
    figures.

    A matmul's flops are ``2 * prod(result dims) * prod(lhs contracting dim
    sizes)``: one multiply and one add per term of each output element, as
    XLA counts a ``dot``. A convolution's are ``2 * (output batch and
    features) * (input features per group) * (the window positions each
    output meets)``. In a plain spatial dim (stride 1, input not dilated,
    window no wider than the input) every window position counts, those over
    the padding too, which overestimates what XLA counts by 9% for a 3x3 SAME
    convolution of a 16x16 image; in any other dim only the positions that
    meet an input element count, as XLA counts them. The TPU compiler writes
    batched matmuls (attention's) as such convolutions, with batch dims as
    dilated or padded spatial dims, where counting every position would
    count the matmul up to 8 times.

    Bytes follow XLA's rules for ``bytes accessed``: each instruction of a
    computation that is not fused reads its operands and writes its result;
    a fusion reads only the slices it takes of an operand that it only
    slices, nothing of a buffer it updates in place, and writes only the
    update of a ``dynamic-update-slice`` root. An asynchronous ``-start``
    moves what its synchronous form would (a ``slice-start`` its slice, a
    ``copy-start`` one copy), its ``-done`` nothing. Buffer plumbing (parameters,
    tuples, bitcasts, loops and calls themselves) moves nothing.

    Attributes:
      dot_flops: flops of every ``dot``, ``convolution`` and cuBLAS gemm
        custom-call, each times its computation's executions per step
        (following fusions, calls, conditionals' branches, async wrappers and
        ``while`` bodies with their trip counts).
      dot_flops_once: the same with every loop taken to run once. Each
        conditional branch is counted in both, where XLA takes the costliest.
      bytes_accessed: bytes read and written per step, loops counted.
      bytes_accessed_once: the same with every loop taken to run once.
      unknown_ops: instructions (in computations that run) whose flops or
        bytes could not be found: an operand's shape is neither printed inline
        nor defined in the computation, a dim is dynamic, an element type is
        unknown, or a convolution has no readable ``dim_labels``. They count
        zero, so the totals are lower bounds.
      dot_flops_by_dtype: ``dot_flops`` split by the element type of each
        matmul's LHS operand as HLO spells it, ``(dtype, flops)`` pairs
        sorted by dtype, e.g. ``(("bf16", 4096.0), ("f32", 2048.0))``; they
        sum to ``dot_flops``. Where XLA widened the operand for the backend
        (the CPU backend computes bf16 and f16 matmuls in f32, behind a
        ``convert`` it adds), the type before that ``convert``: the type the
        program asked for, which is what a chip with native bf16 runs (the
        RHS's, when only the RHS was widened: XLA folds the constant ones
        that start a gradient into f32). A ``convert`` the program wrote
        (``x.astype(jnp.float32)``, named ``convert_element_type`` in its
        metadata) is kept. The operand's type unknown, the result's. Empty
        when built by hand without it.
      custom_calls_once: custom-call targets with how many calls of each run
        per step, every loop taken to run once as XLA's cost analysis counts
        them, sorted by target, e.g. ``(("ConcatBitcast", 30),)``. The TPU
        compiler's ``optimal_seconds`` charges some of them a sentinel
        (:attr:`shardsearch.cost.program.ProgramCost.compiler_seconds`).
      kernels: one :class:`KernelCost` per instruction that runs as a
        kernel of its own (an unfused instruction or a fusion, of ENTRY or of
        a loop body or a call), times its executions per step, e.g.
        ``KernelCost((("bf16", 2.1e12),), 3.4e9, (), "fusion")``; built from
        plain ``(flops, bytes)`` pairs too. A model that prices each kernel
        by its own roofline reads them
        (:attr:`shardsearch.cost.hardware.HardwareModel.per_op`). Instructions
        that move nothing and compute no matmul are left out.
    """

    dot_flops: float = 0.0
    dot_flops_once: float = 0.0
    bytes_accessed: float = 0.0
    bytes_accessed_once: float = 0.0
    unknown_ops: tuple[str, ...] = ()
    dot_flops_by_dtype: tuple[tuple[str, float], ...] = ()
    custom_calls_once: tuple[tuple[str, int], ...] = ()
    kernels: tuple[KernelCost, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "unknown_ops", tuple(self.unknown_ops))
        object.__setattr__(self, "kernels", tuple(_kernel_cost(*k) for k in self.kernels))
        for field in ("dot_flops", "dot_flops_once", "bytes_accessed", "bytes_accessed_once"):
            value = getattr(self, field)
            if not value >= 0:
                raise ValueError(f"HloCost.{field}={value!r} must be a number >= 0")
        calls = tuple((str(target), int(n)) for target, n in self.custom_calls_once)
        object.__setattr__(self, "custom_calls_once", calls)
        targets = [target for target, _ in calls]
        if targets != sorted(set(targets)) or not all(n >= 0 for _, n in calls):
            raise ValueError(
                f"HloCost.custom_calls_once={calls!r} must be (target, calls >= 0) "
                "pairs, one per target, sorted by target"
            )
        pairs = tuple((str(dtype), float(flops)) for dtype, flops in self.dot_flops_by_dtype)
        object.__setattr__(self, "dot_flops_by_dtype", pairs)
        dtypes = [dtype for dtype, _ in pairs]
        if dtypes != sorted(set(dtypes)) or not all(flops >= 0 for _, flops in pairs):
            raise ValueError(
                f"HloCost.dot_flops_by_dtype={pairs!r} must be (dtype, flops >= 0) "
                "pairs, one per dtype, sorted by dtype"
            )
        total = math.fsum(flops for _, flops in pairs)
        if pairs and not math.isclose(total, self.dot_flops, rel_tol=1e-9):
            raise ValueError(
                f"HloCost.dot_flops_by_dtype sums to {total!r} but "
                f"dot_flops={self.dot_flops!r}; the split must add up to the total"
            )

    @property
    def loop_factor(self) -> float:
        """``dot_flops / dot_flops_once``, or 1.0 without matmuls.

        For example 5.0 when every matmul sits in the body of a 5-step scan;
        nearly 32 for a model whose 32 layers are scanned. Below 1 only when a
        loop holding matmuls never runs.
        """
        return self.dot_flops / self.dot_flops_once if self.dot_flops_once else 1.0


def parse_hlo(hlo_text: str) -> tuple[CollectiveSummary, HloCost]:
    """Reads the collectives, matmul flops and bytes accessed of a compiled HLO module.

    The text is parsed once for both, which matters for big models (the
    text of a 7B-parameter training step is around half a megabyte).

    Args:
      hlo_text: ``compiled.as_text()`` of a compiled ``jax.jit`` (or any HLO
        module text with an ENTRY computation).

    Returns:
      ``(summary, cost)``. For example, the text of a ``[16,32] @ [32,64]``
      float32 matmul whose contracting dim is split 4 ways holds
      ``%all-reduce = f32[16,64]{1,0} all-reduce(...)`` and gives
      ``Collective(kind="all-reduce", bytes=4096, group_size=4, count=1, ...)``
      and ``HloCost(dot_flops=2 * 16 * 64 * 8, ...)`` (8 = 32 / 4 per
      device); inside a 5-step ``lax.scan`` the same op has ``count=5`` and
      the flops are 5 times as many, with ``dot_flops_once`` unchanged.

    Raises:
      ValueError: the text has no ENTRY computation, calls a computation it
        does not define, has a call cycle, or a collective has an element type
        or replica-group syntax this parser does not know.
    """
    module = parse_module(hlo_text)
    named: list[Kernel] = []
    cost = _costs(module, named)
    if _SPACE.search(hlo_text):
        placed = [k.spaces for k in _placed(hlo_text, module, named)]
        cost = dataclasses.replace(cost, kernels=tuple(
            k._replace(spaces=spaces) for k, spaces in zip(cost.kernels, placed, strict=True)))
    return _collectives(module), cost


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One entry of :attr:`HloCost.kernels`, named: what a profile of the
    chip lists by the same instruction name.

    Attributes:
      computation, name: where the instruction is and its name, without "%".
      opcode: its opcode ("fusion", "copy", ...).
      count: its executions per step (loop trip counts multiplied).
      flops: the matmul flops by dtype it computes per step, all executions.
      bytes: the bytes it reads and writes per step, all executions.
      spaces: of those, the bytes in memory space ``n > 0`` (:class:`KernelCost`).
    """

    computation: str
    name: str
    opcode: str
    count: float
    flops: tuple[tuple[str, float], ...]
    bytes: float
    spaces: tuple[tuple[int, float], ...] = ()


def kernel_table(hlo_text: str) -> list[Kernel]:
    """:attr:`HloCost.kernels` with each entry's instruction named, in the
    same order; for comparing the model kernel by kernel with a profile."""
    named: list[Kernel] = []
    module = parse_module(hlo_text)
    _costs(module, named)
    return _placed(hlo_text, module, named)


# An array whose layout places it in memory space n > 0, as
# "bf16[8,2048]{1,0:T(8,128)(2,1)S(1)}": its type, dims, layout and n.
_PLACED = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\bS\(([1-9]\d*)\)[^{}]*\})")
# Any "S(n)", n > 0: the spaces a text may place arrays in, found in a
# fraction of `_PLACED`'s time (1 ms against 27 on a 1 MB TPU program). A
# match outside an array's layout only costs `_placed` a count that finds
# no bytes there.
_SPACE = re.compile(r"S\(([1-9]\d*)\)")


@functools.lru_cache(maxsize=8192)
def _emptied(shape: str, space: int) -> str:
    """The shape text `shape` with each array in memory space `space` made
    empty: ``bf16[8,2048]{1,0:S(1)}`` becomes ``bf16[0]{1,0:S(1)}``."""
    return _PLACED.sub(lambda m: f"{m[1]}[0]{m[3]}" if int(m[4]) == space else m[0], shape)


def _placed(hlo_text: str, module: Module, named: list[Kernel]) -> list[Kernel]:
    """`named` with each kernel's bytes per memory space: the costs of
    `module` (parsed from `hlo_text`) counted again with the arrays of one
    space read as empty, per space it uses; what a kernel loses there is what
    it moves in that space."""
    spaces = sorted({int(n) for n in _SPACE.findall(hlo_text)})
    if not spaces:  # every array in device memory: no second count
        return named
    # per space, each kernel's bytes outside it (none: all of them in it)
    uses: dict[str, tuple[dict[int, str], dict[str, list[Instruction]]]] = {}
    outside = [{(computation.name, instruction.name): float(size * count)
                for computation, instruction, count, _, size in _sized(
                    module, _Walk(space, uses)) if size and count} for space in spaces]
    return [dataclasses.replace(k, spaces=tuple(
        (space, k.bytes - found.get((k.computation, k.name), 0.0))
        for space, found in zip(spaces, outside, strict=True)
        if k.bytes > found.get((k.computation, k.name), 0.0))) for k in named]


def parse_collectives(hlo_text: str) -> CollectiveSummary:
    """The collectives of a compiled HLO module; see :func:`parse_hlo`."""
    return _collectives(parse_module(hlo_text))


def _collectives(module: Module) -> CollectiveSummary:
    num_devices = _num_devices(module.header)
    collectives, unknown_groups = [], []
    for computation in module.computations.values():
        count = module.counts[computation.name]
        if not count:
            continue
        for instruction in computation.instructions.values():
            if instruction.opcode not in _COLLECTIVE_OPCODES:
                continue
            found = _collective(instruction, num_devices)
            if found is None:
                continue
            kind, size_bytes, groups = found
            group_size = groups.size
            if group_size is None:
                unknown_groups.append(instruction.name)
                group_size = 1
            collectives.append(
                Collective(
                    kind=kind,
                    bytes=size_bytes,
                    group_size=group_size,
                    count=count,
                    computation=computation.name,
                    name=instruction.name,
                    groups=groups.groups,
                    group_axes=groups.axes,
                )
            )
    return CollectiveSummary(
        collectives=tuple(collectives),
        unknown_trip_counts=module.unknown_trip_counts,
        unknown_group_sizes=tuple(unknown_groups),
        num_devices=num_devices,
    )


def _costs(module: Module, named: list[Kernel] | None = None) -> HloCost:
    """The module's costs; each kernel also appended to `named`, if given."""
    flops = flops_once = traffic = traffic_once = 0.0
    unknown: dict[str, None] = {}
    by_dtype: dict[str, float] = {}
    custom_calls: dict[str, int] = {}
    # Matmul flops of one execution of each computation, by dtype: what a
    # fusion calling it computes.
    held: dict[str, dict[str, float]] = {}
    own: dict[tuple[str, str], tuple[str, float]] = {}  # each matmul's, by (computation, name)
    sites = callers(module)
    for computation in module.computations.values():
        count, once = module.counts[computation.name], module.counts_once[computation.name]
        if not once:
            continue  # never called from ENTRY
        for instruction in computation.instructions.values():
            if instruction.opcode not in _MATMUL_OPCODES:
                continue
            if instruction.opcode == "custom-call":
                target = _TARGET.search(instruction.raw_attrs)
                name = target[1] if target else ""
                custom_calls[name] = custom_calls.get(name, 0) + once
            if not _is_matmul(instruction):
                continue
            found = _matmul_flops(instruction, computation)
            if found is None:
                unknown[instruction.name] = None
                continue
            flops += found * count
            flops_once += found * once
            if found:
                dtype = matmul_dtype(instruction, computation, module, sites)
                mine = held.setdefault(computation.name, {})
                mine[dtype] = mine.get(dtype, 0.0) + found
                own[computation.name, instruction.name] = dtype, found
                if count:
                    by_dtype[dtype] = by_dtype.get(dtype, 0.0) + found * count
    kernels = []
    for computation, instruction, count, once, size in _sized(module, _Walk()):
        if size is None:
            unknown[instruction.name] = None
            continue
        traffic += size * count
        traffic_once += size * once
        work = _kernel_flops(instruction, computation, held, own)
        if count and (size or work):
            kernels.append(KernelCost(tuple((d, f * count) for d, f in sorted(work.items())),
                                      float(size * count), (), instruction.opcode))
            if named is not None:
                named.append(Kernel(computation.name, instruction.name,
                                    instruction.opcode, count, *kernels[-1][:2]))
    return HloCost(
        dot_flops=flops,
        dot_flops_once=flops_once,
        bytes_accessed=traffic,
        bytes_accessed_once=traffic_once,
        unknown_ops=tuple(unknown),
        dot_flops_by_dtype=tuple(sorted(by_dtype.items())),
        custom_calls_once=tuple(sorted(custom_calls.items())),
        kernels=tuple(kernels),
    )


def _sized(module: Module, walk: _Walk) -> Iterator[
        tuple[Computation, Instruction, float, float, int | None]]:
    """Each instruction of the module's scheduled computations that runs from
    ENTRY, with its executions per step (all, and loop bodies once) and the
    bytes one execution moves as `walk` sizes them: None for an unknown
    element type or a dynamic dim."""
    for name in module.scheduled:
        computation = module.computations[name]
        count, once = module.counts[name], module.counts_once[name]
        if not once:
            continue
        for instruction in computation.instructions.values():
            try:
                size = _traffic(instruction, computation, module, walk)
            except ValueError:
                size = None
            yield computation, instruction, count, once, size


def _kernel_flops(instruction: Instruction, computation: Computation,
                  held: dict[str, dict[str, float]],
                  own: dict[tuple[str, str], tuple[str, float]]) -> dict[str, float]:
    """The matmul flops by dtype of one execution of a scheduled instruction:
    its fused body's, or its own when it is an unfused matmul."""
    if instruction.opcode == "fusion":
        callee = CALLS.search(instruction.attrs)
        return held.get(callee["name"], {}) if callee is not None else {}
    found = own.get((computation.name, instruction.name))
    return {found[0]: found[1]} if found else {}


def _num_devices(header: str | None) -> int | None:
    if header is None:
        return None
    devices = 1
    for key in ("replica_count", "num_partitions"):
        if match := re.search(rf"[\s,]{key}=(\d+)", header):
            devices *= int(match[1])
    return devices


# --- shapes -----------------------------------------------------------------


def _parse_shape(text: str, line: str) -> int | list:
    """Bytes of an array shape, or a (nested) list of them for a tuple shape."""
    value, end = _shape_at(text, 0, line)
    if text[end:].strip():
        raise ValueError(f"unexpected text {text[end:]!r} after shape in HLO line {line!r}")
    return value


def _shape_at(text: str, pos: int, line: str) -> tuple[int | list, int]:
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if text.startswith("(", pos):
        elements: list = []
        pos += 1
        while True:
            while text.startswith(" ", pos):
                pos += 1
            if text.startswith(")", pos):
                return elements, pos + 1
            element, pos = _shape_at(text, pos, line)
            elements.append(element)
            while text.startswith(" ", pos):
                pos += 1
            if text.startswith(",", pos):
                pos += 1
    match = ARRAY.match(text, pos)
    if match is None:
        raise ValueError(f"cannot read a shape at {text[pos:]!r} in HLO line {line!r}")
    pos = match.end()
    layout = ""
    if text.startswith("{", pos):
        close = closing(text, pos, line)
        layout, pos = text[pos : close + 1], close + 1
    return _array_bytes(match["type"], match["dims"], layout, line), pos


def _array_bytes(element_type: str, dims: str, layout: str, line: str) -> int:
    bits = ELEMENT_BITS.get(element_type)
    if bits is None and element_type.startswith("f8e"):
        bits = 8  # every float8 variant XLA adds is one byte
    if bits is None:
        raise ValueError(
            f"unknown HLO element type {element_type!r} in line {line!r}; "
            f"known types: {sorted(ELEMENT_BITS)} and f8e*; add its size to "
            "shardsearch.cost.hlo_types.ELEMENT_BITS"
        )
    if packed := re.search(r"E\((\d+)\)", layout):
        bits = int(packed[1])
    elements = 1
    for dim in filter(None, (d.strip() for d in dims.split(","))):
        # A bounded dynamic dim "<=8" may hold up to 8; plan for the bound.
        if not dim.removeprefix("<=").isdigit():
            raise ValueError(
                f"cannot size dim {dim!r} of {element_type}[{dims}] in HLO line "
                f"{line!r}; only static or bounded (<=N) dims have a size"
            )
        elements *= int(dim.removeprefix("<="))
    return math.ceil(elements * bits / 8)


def _total(shape: int | list) -> int:
    return shape if isinstance(shape, int) else sum(_total(s) for s in shape)


# --- collectives ------------------------------------------------------------


def _collective(
    instruction: Instruction, num_devices: int | None
) -> tuple[str, int, Groups] | None:
    opcode = instruction.opcode
    if opcode in COLLECTIVE_KINDS:
        kind = opcode
        size = _total(_parse_shape(instruction.shape, instruction.line))
    elif opcode in _START_OPCODES:
        kind = _START_OPCODES[opcode]
        size = _total(_parse_shape(_start_result(instruction) or instruction.shape,
                                   instruction.line))
    else:
        return None
    if kind == "collective-permute":
        return kind, size, permute_pairs(instruction)
    found = replica_groups(instruction, num_devices)
    # Every syntax gives the size and the groups apart; they must agree.
    if found.groups and max(len(g) for g in found.groups) != found.size:
        raise ValueError(
            f"replica groups of {instruction.name!r} hold "
            f"{max(len(g) for g in found.groups)} devices but the group size "
            f"read is {found.size}; the syntax was misread in HLO line "
            f"{instruction.line!r}"
        )
    return kind, size, found


# --- matmul flops -----------------------------------------------------------


def _is_matmul(instruction: Instruction) -> bool:
    if instruction.opcode in ("dot", "convolution"):
        return True
    return instruction.opcode == "custom-call" and bool(_GEMM_TARGET.search(instruction.raw_attrs))


def _matmul_flops(instruction: Instruction, computation: Computation) -> float | None:
    """Flops of one dot, convolution or cuBLAS gemm; None when a shape is unknown."""
    out = _array_dims(instruction.shape)
    if instruction.opcode == "convolution":
        return _convolution_flops(instruction, computation, out)
    if instruction.opcode == "dot":
        found = _LHS_CONTRACTING.search(instruction.attrs)
    else:  # the gemm's config is JSON, which attrs blanks
        found = _GEMM_CONTRACTING.search(instruction.raw_attrs)
    # No contracting dims printed: an outer product, one term per output.
    dims = found["dims"].split(",") if found else []
    contracting = [int(d.strip(' "')) for d in dims if d.strip()]
    lhs = _operand_dims(instruction, 0, computation)
    if out is None or lhs is None or any(d >= len(lhs) for d in contracting):
        return None
    return 2.0 * math.prod(out) * math.prod(lhs[d] for d in contracting)


def _convolution_flops(
    instruction: Instruction, computation: Computation, out: list[int] | None
) -> float | None:
    """2 x (output batch and features) x (input features per group) x the
    (output, kernel) position pairs of each spatial dim.

    A plain spatial dim (stride 1, input not dilated, window no wider than
    the input) counts every pair, those over the edge padding too: the
    border of a SAME convolution is counted as if the padding were data. Any
    other dim counts, as XLA's cost analysis does, only the pairs that meet
    an input element. The TPU compiler writes batched matmuls that way: a
    batch dim of 8 as a spatial dim ``size=8 stride=7 lhs_dilate=8`` (one of
    the 8 window positions meets an element), a group dim of 2 over an
    input of 1 as ``size=2 pad=1_1``, a dim of 2 as ``size=2 stride=2
    pad=1_1``; counting every pair would count such a matmul up to 8 times.
    """
    kernel = _operand_dims(instruction, 1, computation)
    labels = _DIM_LABELS.search(instruction.attrs)
    if (
        out is None
        or kernel is None
        or labels is None
        or len(labels["kernel"]) != len(kernel)
        or len(labels["out"]) != len(out)
    ):
        return None
    kernel_dims = dict(zip(labels["kernel"], kernel, strict=True))
    out_dims = dict(zip(labels["out"], out, strict=True))
    lhs = _operand_dims(instruction, 0, computation)
    lhs_dims = (
        dict(zip(labels["lhs"], lhs, strict=True)) if lhs and len(lhs) == len(labels["lhs"]) else {}
    )
    # Without the spatial dims: batch and features out, features in per group.
    terms = out_dims.get("b", 1) * out_dims.get("f", 1) * kernel_dims.get("i", 1)
    window = _window(instruction.attrs)
    for label in labels["kernel"]:
        if not label.isdigit():
            continue
        dim = int(label)
        stride, pad_low, lhs_dilate, rhs_dilate = (
            _window_field(window, key, dim, default)
            for key, default in (("stride", 1), ("pad", 0), ("lhs_dilate", 1), ("rhs_dilate", 1))
        )
        size = kernel_dims[label]
        extent = (size - 1) * rhs_dilate + 1
        inputs = lhs_dims.get(label)
        if stride == 1 and lhs_dilate <= 1 and (inputs is None or extent <= inputs):
            terms *= out_dims.get(label, 1) * size
        else:
            terms *= _window_pairs(
                out_dims.get(label, 1), size, inputs, stride, pad_low, lhs_dilate, rhs_dilate
            )
    return 2.0 * terms


def _window(attrs: str) -> dict[str, list[str]]:
    """``window={size=4x2 stride=3x1 pad=0_0x1_1 lhs_dilate=4x2}`` as
    ``{"size": ["4", "2"], "stride": ["3", "1"], "pad": ["0_0", "1_1"], ...}``."""
    match = _WINDOW.search(attrs)
    fields = match["window"].split() if match else []
    return {key: value.split("x") for key, _, value in (f.partition("=") for f in fields)}


def _window_field(window: dict[str, list[str]], key: str, dim: int, default: int) -> int:
    """One spatial dim's value of a window field (a padding's low side); XLA
    leaves out the fields that are all ``default``."""
    values = window.get(key, [])
    value = values[dim].split("_")[0] if dim < len(values) else ""
    return int(value) if value.lstrip("-").isdigit() else default


def _window_pairs(
    out: int,
    kernel: int,
    inputs: int | None,
    stride: int,
    pad_low: int,
    lhs_dilate: int,
    rhs_dilate: int,
) -> int:
    """(output, kernel) position pairs of one spatial dim that meet an input
    element: ``u = o * stride - pad_low + k * rhs_dilate`` a multiple of
    ``lhs_dilate`` with ``0 <= u / lhs_dilate < inputs`` (any u >= 0 when
    ``inputs`` is None).

    E.g. 8 for ``out=8, kernel=8, inputs=8, stride=7, lhs_dilate=8``: each
    output meets one of the 8 elements. XLA's ``GetConvolutionFlops`` counts
    the same pairs by visiting each one; this counts them in arithmetic
    progressions, one per kernel position.
    """
    lhs_dilate = max(lhs_dilate, 1)
    # o * stride = -c (mod L) has solutions iff gcd(stride, L) divides c: one
    # in every L / gcd outputs, from the first found with the inverse.
    step = math.gcd(stride, lhs_dilate)
    period = lhs_dilate // step
    inverse = pow(stride // step, -1, period) if period > 1 else 0
    pairs = 0
    for k in range(kernel):
        offset = k * rhs_dilate - pad_low
        if offset % step:
            continue
        first = (-(offset // step) * inverse) % period
        low = max(0, -(offset // stride)) if stride > 0 else 0
        high = out - 1
        if inputs is not None and stride > 0:
            high = min(high, ((inputs - 1) * lhs_dilate - offset) // stride)
        start = low + (first - low) % period
        if start <= high:
            pairs += (high - start) // period + 1
    return pairs


def _operand_dims(
    instruction: Instruction, index: int, computation: Computation
) -> list[int] | None:
    """Dims of an operand, from its inline shape or its definition in the computation.

    Post-optimisation text names operands only (``dot(%param_0.1, ...)``); a
    fused computation's parameters are instructions too, so the computation's
    own table holds every operand.
    """
    if index >= len(instruction.operands):
        return None
    shape = instruction.operand_shapes[index]
    if not shape:
        definition = computation.instructions.get(instruction.operands[index])
        shape = definition.shape if definition is not None else ""
    return _array_dims(shape)


def _array_dims(shape: str) -> list[int] | None:
    """Dims of an array shape, or of a tuple shape's first leaf (a gemm's
    output); None for no shape or a dynamic dim. A bounded dim ``<=N`` is N."""
    match = ARRAY.match(shape.lstrip("( "))
    if match is None:
        return None
    dims = [d.strip().removeprefix("<=") for d in match["dims"].split(",") if d.strip()]
    return [int(d) for d in dims] if all(d.isdigit() for d in dims) else None


# --- bytes accessed ---------------------------------------------------------

# Instructions that move no bytes themselves: they name, group or hand on
# buffers, or their callees' instructions are counted instead.
_NO_TRAFFIC = frozenset(
    {
        "parameter", "constant", "get-tuple-element", "tuple", "bitcast",
        "while", "conditional", "call", "async-start", "async-update", "async-done",
        "after-all", "add-dependency", "opt-barrier", "domain", "partition-id", "replica-id",
    }
)  # fmt: skip
_SLICES = frozenset({"slice", "dynamic-slice"})


class _Walk:
    """What one pass over a module's kernels carries: each fused body's
    parameters by index and each value's users (cached, by body; `uses`
    shares one cache between passes over the same module, since it does not
    depend on the space), and the memory space whose arrays are read as
    empty (None: every array counts).

    With ``space=1`` a ``bf16[8,128]{1,0:S(1)}`` operand counts 0 bytes: what
    a kernel loses then is what it moves in memory space 1 (`_placed`).
    """

    def __init__(self, space: int | None = None,
                 uses: dict[str, tuple[dict[int, str], dict[str, list[Instruction]]]]
                 | None = None):
        self.space = space
        self.uses = {} if uses is None else uses

    def bytes(self, shape: str, line: str) -> int:
        """Bytes of the shape text `shape` (of HLO line `line`), its arrays in
        `space` read as empty."""
        return _bytes(shape if self.space is None else _emptied(shape, self.space), line)

    def shape(self, shape: str, line: str) -> int | list:
        """`shape` read as `_parse_shape` reads it, its arrays in `space` empty."""
        return _parse_shape(shape if self.space is None else _emptied(shape, self.space), line)

    def empties(self, shape: str) -> bool:
        """Whether `shape` holds an array in `space` (read as empty here)."""
        return self.space is not None and _emptied(shape, self.space) != shape


def _traffic(
    instruction: Instruction,
    computation: Computation,
    module: Module,
    walk: _Walk,
) -> int:
    """Bytes one execution of an unfused instruction reads and writes."""
    opcode = instruction.opcode
    if opcode in _NO_TRAFFIC or opcode.endswith("-done"):  # a -start counted it
        return 0
    if opcode == "copy-start":  # (destination, source, context): one copy
        shape = walk.shape(instruction.shape, instruction.line)
        return 2 * _total(shape[0] if isinstance(shape, list) and shape else shape)
    if opcode.endswith("-start"):
        synchronous = _as_synchronous(instruction)
        if synchronous is not None:
            return _traffic(synchronous, computation, module, walk)
    if opcode in _SLICES:  # reads what it writes, from where its operand is
        written = walk.bytes(instruction.shape, instruction.line)
        if walk.space is None:
            return 2 * written
        placed = walk.empties(_operand_shape(instruction, 0, computation))
        return written + (0 if placed else _bytes(instruction.shape, instruction.line))
    if opcode == "dynamic-update-slice":  # in place: only the update moves
        return 2 * _operand_bytes(instruction, 1, computation, walk)
    if opcode == "fusion":
        callee = CALLS.search(instruction.attrs)
        if callee is not None:
            fused = module.computations[callee["name"]]
            return _fusion_traffic(instruction, computation, fused, module, walk)
    return walk.bytes(instruction.shape, instruction.line) + sum(
        _operand_bytes(instruction, index, computation, walk)
        for index in range(len(instruction.operands))
    )


def _fusion_traffic(
    fusion: Instruction,
    computation: Computation,
    fused: Computation,
    module: Module,
    walk: _Walk,
) -> int:
    params, users = _uses_of(fused, walk)
    traffic = _written(fused, fused.root, fusion.shape, fusion.line, walk)
    for index in range(len(fusion.operands)):
        read = _param_reads(params.get(index), users, module, walk, _in_space(fused, params,
                                                                              index, walk))
        traffic += _operand_bytes(fusion, index, computation, walk) if read is None else read
    return traffic


def _in_space(fused: Computation, params: dict[int, str], index: int, walk: _Walk) -> bool:
    """Whether a fused body's parameter `index` is an array of the space
    `walk` reads as empty (its layout says so: ``{1,0:T(8,128)S(1)}``)."""
    name = params.get(index)
    parameter = fused.instructions.get(name) if name is not None else None
    return parameter is not None and walk.empties(parameter.shape)


def _uses_of(fused: Computation, walk: _Walk) -> tuple[dict[int, str], dict[str, list]]:
    """A fused body's parameters by index and each value's users (cached)."""
    uses = walk.uses
    if fused.name not in uses:
        params, users = {}, {}
        for instruction in fused.instructions.values():
            if instruction.opcode == "parameter" and instruction.operands[0].isdigit():
                params[int(instruction.operands[0])] = instruction.name
            for operand in instruction.operands:
                users.setdefault(operand, []).append(instruction)
        uses[fused.name] = params, users
    return uses[fused.name]


def _param_reads(name: str | None, users: dict[str, list[Instruction]], module: Module,
                 walk: _Walk, placed: bool = False) -> int | None:
    """Bytes a fused body reads of its parameter `name`: the slices it takes
    of it, nothing where it updates it in place, and, where a fusion nested in
    the body takes it, what that body reads of it (a layer's weights sliced
    out of the scan's stacked ones, one fusion deeper). None when it reads
    it whole, or in a way not followed (then the whole operand counts).

    `placed`: the parameter is an array of the space `walk` reads as empty,
    so what its slices read is read there (a slice's own shape, in the
    kernel's registers, says nothing of where it was read from)."""
    readers = _readers(name, users)
    if not readers:
        return None
    total = 0
    for reader, via in readers:
        if reader.opcode in _SLICES and reader.operands[0] == via:
            total += 0 if placed else walk.bytes(reader.shape, reader.line)
        elif reader.opcode == "dynamic-update-slice" and reader.operands[0] == via:
            continue  # the buffer updated in place
        elif reader.opcode == "fusion" and (callee := CALLS.search(reader.attrs)):
            inner = module.computations[callee["name"]]
            params, inner_users = _uses_of(inner, walk)
            for index, operand in enumerate(reader.operands):
                if operand != via:
                    continue
                read = _param_reads(params.get(index), inner_users, module, walk,
                                    placed or _in_space(inner, params, index, walk))
                if read is None:
                    return None
                total += read
        else:
            return None
    return total


def _written(fused: Computation, name: str | None, shape: str, line: str, walk: _Walk) -> int:
    """Bytes a fused body's result ``name`` (of ``shape``) writes: an in-place
    ``dynamic-update-slice`` writes its update only, and a multi-output
    fusion's tuple root writes each element by the same rule (a layer's
    saved activation lands in its slot of the loop's stacked buffer)."""
    root = _through_bitcasts(fused, name)
    if root is not None and root.opcode == "dynamic-update-slice":
        return _operand_bytes(root, 1, fused, walk)
    if root is not None and root.opcode == "tuple" and shape.strip().startswith("("):
        parts = split_top(shape.strip()[1:-1])
        if len(parts) == len(root.operands):
            return sum(_written(fused, operand, part.strip(), line, walk)
                       for operand, part in zip(root.operands, parts, strict=True))
    return walk.bytes(shape, line)


def _as_synchronous(start: Instruction) -> Instruction | None:
    """The instruction an asynchronous ``<op>-start`` runs, as if it ran
    synchronously: ``<op>`` with the start's result for its shape (see
    `_start_result`); read as an instruction of its own, a start whose shape
    bundles its operands would write them again. None when the start's shape
    is its result (``all-reduce-start``), which is counted as it is."""
    result = _start_result(start)
    if result is None:
        return None
    return dataclasses.replace(start, opcode=start.opcode.removesuffix("-start"), shape=result)


def _start_result(start: Instruction) -> str | None:
    """The shape of what an asynchronous ``<op>-start`` produces, when its own
    shape bundles more: ``(operand, result, context...)``, the operand a
    tuple when there are several (``collective-permute-start``,
    ``all-gather-start``, the TPU compiler's ``slice-start``, newer GPU
    compilers' ``fusion-start``). None when the shape is the result itself:
    ``all-reduce-start``, unless its first element is a tuple of operands
    (an async wrapper's form). ``copy-start`` is ``(destination, source,
    context)`` and is not read here."""
    text = start.shape.strip()
    parts = split_top(text[1:-1]) if text.startswith("(") else []
    if len(parts) < 2:
        return None
    if start.opcode == "all-reduce-start" and not parts[0].lstrip().startswith("("):
        return None
    return parts[1].strip()


def _readers(
    name: str | None, users: dict[str, list[Instruction]]
) -> list[tuple[Instruction, str]]:
    """Instructions using ``name``, looking through bitcasts, with the name they use."""
    found, pending = [], [name] if name else []
    while pending:
        current = pending.pop()
        for user in users.get(current, []):
            if user.opcode == "bitcast":
                pending.append(user.name)
            else:
                found.append((user, current))
    return found


def _through_bitcasts(computation: Computation, name: str | None) -> Instruction | None:
    instruction = computation.instructions.get(name or "")
    while instruction is not None and instruction.opcode == "bitcast" and instruction.operands:
        instruction = computation.instructions.get(instruction.operands[0])
    return instruction


def _operand_bytes(instruction: Instruction, index: int, computation: Computation,
                   walk: _Walk) -> int:
    return walk.bytes(_operand_shape(instruction, index, computation), instruction.line)


def _operand_shape(instruction: Instruction, index: int, computation: Computation) -> str:
    shape = instruction.operand_shapes[index] if index < len(instruction.operand_shapes) else ""
    if not shape:
        definition = computation.instructions.get(instruction.operands[index])
        shape = definition.shape if definition is not None else ""
    if not shape:
        raise ValueError(f"no shape for operand {index} of HLO line {instruction.line!r}")
    return shape


def _bytes(shape: str, line: str) -> int:
    try:
        return _shape_bytes(shape)
    except ValueError:  # read it again for the error that names the line
        return _total(_parse_shape(shape, line))


@functools.lru_cache(maxsize=8192)
def _shape_bytes(shape: str) -> int:
    # A module prints a few hundred distinct shapes on thousands of lines.
    return _total(_parse_shape(shape, shape))
