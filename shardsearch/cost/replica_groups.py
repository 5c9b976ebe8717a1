"""Which devices each collective's replica groups hold, in every syntax XLA prints.

`cost.hlo` reads a collective's ``replica_groups=`` (or a permute's
``source_target_pairs=``) through `replica_groups` / `permute_pairs` and keeps
the expanded device ids on `Collective.groups`, which `cost.topology` maps to
mesh axes. The syntaxes: explicit lists ``{{0,1},{2,3}}``; iota
``[2,4]<=[8]`` and ``[4,2]<=[2,4]T(1,0)`` (an iota over the reshape dims,
transposed, then cut into groups); the newer ``mesh['a'=2,'b'=4],
device_ids=(...) {'b'}`` with sub-axes ``'b':(1)2``; and ``maximal_mesh[...]``.

Example:
  >>> replica_groups(instruction, 8)  # replica_groups=[4,2]<=[2,4]T(1,0)
  Groups(size=2, groups=((0, 4), (1, 5), (2, 6), (3, 7)), axes=None)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Sequence

from .hlo_graph import Instruction, closing

_INTS = r"\d+(?:\s*,\s*\d+)*"


# [num_groups,group_size]<=[reshape dims]T(perm): an iota, reshaped, transposed.
_IOTA_GROUPS = re.compile(
    rf"\[(?P<dims>{_INTS})\]<=\[(?P<reshape>{_INTS})\](?:T\((?P<perm>{_INTS})\))?"
)


_MESH_GROUPS = re.compile(r"mesh\[(?P<axes>[^\]]*)\]")


_MAXIMAL_MESH = re.compile(r"maximal_mesh\[\s*device_id\s*=\s*(?P<id>\d+)\s*\]")


_DEVICE_IDS = re.compile(r",\s*device_ids=")


# A mesh's device order: an iota [reshape dims]T(perm), or the ids in full.
_DEVICE_IOTA = re.compile(rf"\s*\[(?P<reshape>{_INTS})\](?:T\((?P<perm>{_INTS})\))?\s*")


_MESH_AXES = re.compile(r"\s*\{(?P<axes>[^{}]*)\}")


_SUB_AXIS = re.compile(r"\((?P<pre>\d+)\)(?P<size>\d+)")


# A permute's pairs in the printer's spelling, "{0,1},{1,2}" (or none).
_PAIRS = re.compile(r"(?:\{\d+,\d+\}(?:,\{\d+,\d+\})*)?")


@dataclasses.dataclass(frozen=True)
class Groups:
    """Where one collective's replica groups lie, as read from its attributes."""

    size: int | None  # devices per group; None when unknown
    groups: tuple[tuple[int, ...], ...] = ()
    axes: tuple[str, ...] | None = None


def permute_pairs(instruction: Instruction) -> Groups:
    match = re.search(r"(?:^|[\s,])source_target_pairs=", instruction.attrs)
    if match is None:
        return Groups(None)
    start = match.end()
    if not instruction.attrs.startswith("{", start):
        raise ValueError(
            f"source_target_pairs of {instruction.name!r} is not a {{{{s,t}},...}} "
            f"list: {instruction.line!r}"
        )
    body = instruction.attrs[start + 1 : closing(instruction.attrs, start, instruction.line)]
    pairs = []
    if _PAIRS.fullmatch(body):  # the usual "{0,1},{1,2}": read at once
        numbers = [int(n) for n in re.findall(r"\d+", body)]
        pairs = [(s, t) for s, t in zip(numbers[::2], numbers[1::2], strict=True) if s != t]
    else:
        for pair in re.findall(r"\{([^{}]*)\}", body):
            source, target = _ints(pair, instruction.line)
            if source != target:
                pairs.append((source, target))
    devices = dict.fromkeys(device for pair in pairs for device in pair)
    return Groups(max(len(devices), 1), tuple(pairs))


def replica_groups(instruction: Instruction, num_devices: int | None) -> Groups:
    attrs, line = instruction.attrs, instruction.line
    match = re.search(r"(?:^|[\s,])replica_groups=", attrs)
    # No replica_groups printed means the same as "{}": every device.
    start = match.end() if match else None
    if start is None or attrs.startswith("{}", start):
        return Groups(num_devices)
    if attrs.startswith("{", start):
        body = attrs[start + 1 : closing(attrs, start, line)]
        groups = tuple(_ints(g, line) for g in re.findall(r"\{([^{}]*)\}", body))
        if not groups:
            return Groups(num_devices)
        # Groups of one op have equal sizes in practice; take the largest.
        return Groups(max(len(g) for g in groups), groups)
    if iota := _IOTA_GROUPS.match(attrs, start):
        return _iota_groups(iota, line)
    if maximal := _MAXIMAL_MESH.match(attrs, start):
        return Groups(1, ((int(maximal["id"]),),), ())
    if attrs.startswith("maximal_mesh[", start):
        return Groups(1, (), ())
    if mesh := _MESH_GROUPS.match(attrs, start):
        return _mesh_groups(mesh, attrs, line)
    raise ValueError(
        f"unrecognised replica_groups syntax in HLO line {line!r}; expected "
        "{{0,1},...}, [groups,size]<=[n] or mesh[...] {axes}"
    )


def _iota_groups(iota: re.Match, line: str) -> Groups:
    """``[num_groups,size]<=[dims]T(perm)``: iota(prod(dims)) reshaped to dims,
    transposed by perm, cut into groups of ``size`` (XLA's IotaReplicaGroupList).

    For example ``[4,2]<=[2,4]T(1,0)`` is ``((0, 4), (1, 5), (2, 6), (3, 7))``.
    """
    dims = _ints(iota["dims"], line)
    reshape = _ints(iota["reshape"], line)
    perm = _ints(iota["perm"], line) if iota["perm"] else tuple(range(len(reshape)))
    # The group size comes last: [num_groups, group_size].
    size = dims[-1]
    if math.prod(dims) != math.prod(reshape):
        raise ValueError(
            f"iota replica groups {iota[0]} list {math.prod(dims)} devices but "
            f"the iota {list(reshape)} holds {math.prod(reshape)} in HLO line {line!r}"
        )
    return Groups(size, _chunks(_transposed(range(math.prod(reshape)), reshape, perm, line), size))


def _mesh_groups(mesh: re.Match, attrs: str, line: str) -> Groups:
    """``mesh['a'=2,'b'=4], device_ids=(...) {'b'}`` (newer XLA): the devices
    that differ only along the axes in braces form a group.

    As XLA's MeshAxesReplicaGroupList does: the device array, shaped like the
    mesh (a sub-axis ``'a':(pre)size`` splits its axis into
    ``[pre, size, rest]``), is transposed so that the listed axes come last,
    in the order listed, and cut into groups. For example
    ``mesh['a'=2,'b'=4] {'a'}`` is ``((0, 4), (1, 5), (2, 6), (3, 7))``.
    """
    sizes: dict[str, int] = {}
    for axis in mesh["axes"].split(","):
        name, _, size = axis.rpartition("=")
        sizes[name.strip().strip("'\"")] = int(size)
    count = math.prod(sizes.values())
    pos = mesh.end()
    devices: tuple[int, ...] = tuple(range(count))
    if found := _DEVICE_IDS.match(attrs, pos):
        if not attrs.startswith("(", found.end()):
            raise ValueError(f"mesh device_ids are not in (...) in HLO line {line!r}")
        close = closing(attrs, found.end(), line)
        devices = _mesh_devices(attrs[found.end() + 1 : close], count, line)
        pos = close + 1
    axes = _MESH_AXES.match(attrs, pos)
    if axes is None:
        raise ValueError(
            f"mesh replica_groups without the {{axes}} that form a group in HLO line {line!r}"
        )
    # Each listed axis as (mesh dim, sub-axis (pre, size) or None).
    refs: list[tuple[int, tuple[int, int] | None]] = []
    names = list(sizes)
    for ref in filter(None, (r.strip() for r in axes["axes"].split(","))):
        name, _, sub = ref.partition(":")
        name = name.strip().strip("'\"")
        if name not in sizes:
            raise ValueError(
                f"replica group axis {name!r} is not in the mesh {sizes} in HLO line {line!r}"
            )
        part = None
        if sub:
            # A sub-axis prints as name:(pre_size)size and spans only `size` devices.
            found_sub = _SUB_AXIS.fullmatch(sub.strip())
            if found_sub is None:
                raise ValueError(f"cannot read sub-axis {ref!r} in HLO line {line!r}")
            part = (int(found_sub["pre"]), int(found_sub["size"]))
        refs.append((names.index(name), part))
    size = math.prod(sizes[names[d]] if p is None else p[1] for d, p in refs)
    dims, grouped = _split_mesh(tuple(sizes.values()), refs, line)
    rest = [d for d in range(len(dims)) if d not in grouped]
    groups = _chunks(_transposed(devices, dims, (*rest, *grouped), line), size)
    return Groups(size, groups, tuple(dict.fromkeys(names[d] for d, _ in refs)))


def _mesh_devices(text: str, count: int, line: str) -> tuple[int, ...]:
    """The device ids of a replica-group mesh, in mesh order: ``[2,4]T(1,0)``
    (an iota reshaped and transposed) or the ids listed, ``0,4,1,5,...``."""
    if iota := _DEVICE_IOTA.fullmatch(text):
        reshape = _ints(iota["reshape"], line)
        perm = _ints(iota["perm"], line) if iota["perm"] else tuple(range(len(reshape)))
        devices = _transposed(range(math.prod(reshape)), reshape, perm, line)
    else:
        devices = _ints(text, line)
    if len(devices) != count:
        raise ValueError(
            f"device_ids=({text}) name {len(devices)} devices for a mesh of "
            f"{count} in HLO line {line!r}"
        )
    return devices


def _split_mesh(
    sizes: tuple[int, ...], refs: list[tuple[int, tuple[int, int] | None]], line: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Reshapes the mesh so that each listed (sub-)axis is a dim of its own.

    Returns the new dims and, for each ref in the order listed, its dim.
    E.g. ``mesh[a=8] {a:(1)2}``: dims ``(1, 2, 4)``, grouped ``(1,)``.
    """
    dims: list[int] = []
    grouped: dict[int, int] = {}  # ref index -> new dim
    for axis, full in enumerate(sizes):
        mine = [(i, part) for i, (d, part) in enumerate(refs) if d == axis]
        if not mine:
            dims.append(full)
            continue
        if len(mine) == 1 and mine[0][1] is None:
            grouped[mine[0][0]] = len(dims)
            dims.append(full)
            continue
        if any(part is None for _, part in mine):
            raise ValueError(
                f"mesh axis {axis} is listed whole and as a sub-axis in HLO line {line!r}"
            )
        # Sub-axes of one axis, outermost (smallest pre-size) first; gaps
        # between them and the rest of the axis become dims of their own.
        covered = 1
        for i, (pre, size) in sorted(mine, key=lambda item: item[1][0]):
            if pre % covered:
                raise ValueError(
                    f"sub-axes of mesh axis {axis} overlap ({pre=} after "
                    f"{covered} devices) in HLO line {line!r}"
                )
            if pre > covered:
                dims.append(pre // covered)
            grouped[i] = len(dims)
            dims.append(size)
            covered = pre * size
        if full % covered:
            raise ValueError(
                f"sub-axes of mesh axis {axis} (size {full}) span {covered} "
                f"devices, which does not divide it, in HLO line {line!r}"
            )
        if full > covered:
            dims.append(full // covered)
    return tuple(dims), tuple(grouped[i] for i in range(len(refs)))


def _transposed(
    values: Sequence[int], dims: Sequence[int], perm: Sequence[int], line: str
) -> tuple[int, ...]:
    """``values`` (row-major, shaped ``dims``) transposed by ``perm``, flattened."""
    if sorted(perm) != list(range(len(dims))) or len(values) != math.prod(dims):
        raise ValueError(
            f"cannot transpose {len(values)} devices shaped {list(dims)} by "
            f"{list(perm)} in HLO line {line!r}"
        )
    strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
    steps = [strides[p] for p in perm]
    return tuple(
        values[sum(i * s for i, s in zip(index, steps, strict=True))]
        for index in itertools.product(*(range(dims[p]) for p in perm))
    )


def _chunks(devices: tuple[int, ...], size: int) -> tuple[tuple[int, ...], ...]:
    return tuple(devices[i : i + size] for i in range(0, len(devices), size)) if size else ()


def _ints(text: str, line: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"expected device ids, found {text!r} in HLO line {line!r}") from None
