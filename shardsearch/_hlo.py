"""Collectives and the bytes they move, read from compiled XLA HLO text.

The static objective scores a candidate sharding without running it: it
compiles the step, takes ``compiled.as_text()`` (the post-optimisation,
SPMD-partitioned module, so every shape is per device) and asks what
communication XLA inserted. :func:`parse_collectives` answers with one
:class:`Collective` per collective instruction, each carrying how many times it
runs per step: an instruction inside a ``while`` body (``lax.scan``,
``fori_loop``) runs once per trip, and nested loops multiply.

Example::

    compiled = jax.jit(f, in_shardings=..., out_shardings=...).lower(*args).compile()
    summary = parse_collectives(compiled.as_text())
    summary.bytes_by_kind()  # {"all-reduce": 20480, "all-gather": 0, ...}
    summary.transferred_bytes()  # ring-algorithm estimate of bytes sent per device

Only the text is read; nothing here imports JAX. Point-to-point ``send`` /
``recv`` and the rarer ``collective-broadcast`` and ``ragged-all-to-all`` are
not counted.
"""

from __future__ import annotations

import dataclasses
import math
import re

import networkx as nx

COLLECTIVE_KINDS: tuple[str, ...] = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
"""The collective kinds reported, in the order every per-kind mapping uses."""

_START_OPCODES = {f"{kind}-start": kind for kind in COLLECTIVE_KINDS}

# Bits each element occupies in memory. Sub-byte types are stored one per byte
# unless the layout packs them with ``E(bits)``, which _array_bytes honours.
_ELEMENT_BITS = {
    "pred": 8,
    "s2": 8, "u2": 8, "s4": 8, "u4": 8, "f4e2m1fn": 8,
    "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "f16": 16, "bf16": 16,
    "s32": 32, "u32": 32, "f32": 32,
    "s64": 64, "u64": 64, "f64": 64, "c64": 64,
    "c128": 128,
    "token": 0,
}  # fmt: skip

_HEADER = re.compile(r"^HloModule\b")
_COMPUTATION = re.compile(
    r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s(){}=]+)\s*(?:\(.*\)\s*->.*)?\{\s*$"
)
_INSTRUCTION = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[^\s=]+)\s+=\s+(?=\S)")
_OPCODE = re.compile(r"\s*(?P<opcode>[A-Za-z][\w\-.]*)\(")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_COMMENT = re.compile(r"/\*.*?\*/")
_ARRAY = re.compile(r"(?P<type>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")
_KNOWN_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_IOTA_GROUPS = re.compile(r"\[(?P<dims>\d+(?:,\d+)*)\]<=\[\d+(?:,\d+)*\](?:T\([\d,]+\))?")
_MESH_GROUPS = re.compile(r"mesh\[(?P<axes>[^\]]*)\]")
_CALLEE = re.compile(
    r"(?:^|[\s,])(?P<attr>calls|to_apply|body|condition|true_computation|"
    r"false_computation|select|scatter)=%?(?P<name>[^\s,{}()]+)"
)
_CALLEE_LIST = re.compile(
    r"(?:^|[\s,])(?:calls|branch_computations|called_computations)=\{(?P<names>[^}]*)\}"
)
# async-update / async-done repeat the async-start's ``calls=``; following them
# too would count the wrapped collective two or three times.
_NOT_CALLERS = frozenset({"async-update", "async-done"})


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
    """

    kind: str
    bytes: int
    group_size: int
    count: int
    computation: str
    name: str = ""

    def __post_init__(self):
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


@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]  # operand names, or the literal for constants
    attrs: str  # with quoted strings blanked, so user text cannot fake one
    raw_attrs: str
    line: str


@dataclasses.dataclass(frozen=True)
class _Computation:
    name: str
    is_entry: bool
    instructions: dict[str, _Instruction]
    root: str | None


def parse_collectives(hlo_text: str) -> CollectiveSummary:
    """Lists the collectives of a compiled HLO module and how often each runs.

    Args:
      hlo_text: ``compiled.as_text()`` of a compiled ``jax.jit`` (or any HLO
        module text with an ENTRY computation).

    Returns:
      The summary. For example, the text of a ``[16,32] @ [32,64]`` float32
      matmul whose contracting dim is split 4 ways holds
      ``%all-reduce = f32[16,64]{1,0} all-reduce(...)`` and gives
      ``Collective(kind="all-reduce", bytes=4096, group_size=4, count=1, ...)``;
      inside a 5-step ``lax.scan`` the same op has ``count=5``.

    Raises:
      ValueError: the text has no ENTRY computation, calls a computation it
        does not define, has a call cycle, or a collective has an element type
        or replica-group syntax this parser does not know.
    """
    header, computations = _parse_module(hlo_text)
    num_devices = _num_devices(header)
    entries = [c.name for c in computations.values() if c.is_entry]
    if len(entries) != 1:
        raise ValueError(
            f"expected exactly one ENTRY computation in the HLO text, found "
            f"{len(entries)} ({entries}); pass the whole module, e.g. "
            "compiled.as_text()"
        )

    graph = nx.DiGraph()
    graph.add_nodes_from(computations)
    unknown_loops = []
    for computation in computations.values():
        for instruction in computation.instructions.values():
            edges, unknown = _call_edges(instruction, computation, computations)
            if unknown:
                unknown_loops.append((computation.name, unknown))
            for callee, factor in edges:
                if graph.has_edge(computation.name, callee):
                    graph[computation.name][callee]["factor"] += factor
                else:
                    graph.add_edge(computation.name, callee, factor=factor)
    if not nx.is_directed_acyclic_graph(graph):
        cycle = [edge[0] for edge in nx.find_cycle(graph)]
        raise ValueError(
            f"HLO computations call each other in a cycle {cycle}; HLO forbids "
            "recursion, so the text is corrupt or not an HLO module"
        )

    count = dict.fromkeys(computations, 0)
    count[entries[0]] = 1
    for caller in nx.topological_sort(graph):
        for callee in graph.successors(caller):
            count[callee] += count[caller] * graph[caller][callee]["factor"]

    collectives, unknown_groups = [], []
    for computation in computations.values():
        if not count[computation.name]:
            continue
        for instruction in computation.instructions.values():
            found = _collective(instruction, num_devices)
            if found is None:
                continue
            kind, size_bytes, group_size = found
            if group_size is None:
                unknown_groups.append(instruction.name)
                group_size = 1
            collectives.append(
                Collective(
                    kind=kind,
                    bytes=size_bytes,
                    group_size=group_size,
                    count=count[computation.name],
                    computation=computation.name,
                    name=instruction.name,
                )
            )
    return CollectiveSummary(
        collectives=tuple(collectives),
        unknown_trip_counts=tuple(body for caller, body in unknown_loops if count[caller]),
        unknown_group_sizes=tuple(unknown_groups),
        num_devices=num_devices,
    )


def _parse_module(text: str) -> tuple[str | None, dict[str, _Computation]]:
    header = None
    computations: dict[str, _Computation] = {}
    current: tuple[str, bool, list[str]] | None = None
    for line in text.splitlines():
        if current is None:
            if _HEADER.match(line):
                header = line
            elif match := _COMPUTATION.match(line):
                current = (match["name"], bool(match["entry"]), [])
            continue
        name, is_entry, lines = current
        if not line.strip():
            continue
        if line.lstrip().startswith("}"):
            if name in computations:
                raise ValueError(f"HLO computation {name!r} is defined twice; pass one module")
            computations[name] = _build_computation(name, is_entry, lines)
            current = None
        elif _INSTRUCTION.match(line) or not lines:
            lines.append(line.strip())
        else:
            # Hand-written HLO wraps long instructions; the printer never does.
            lines[-1] += " " + line.strip()
    if current is not None:
        raise ValueError(
            f"HLO computation {current[0]!r} is not closed by '}}'; the text "
            "looks truncated, pass the whole of compiled.as_text()"
        )
    return header, computations


def _build_computation(name: str, is_entry: bool, lines: list[str]) -> _Computation:
    instructions: dict[str, _Instruction] = {}
    root = None
    for line in lines:
        match = _INSTRUCTION.match(line)
        if match is None:
            raise ValueError(
                f"cannot read this line of HLO computation {name!r} as an "
                f"instruction ('name = shape opcode(operands), attrs'): {line!r}"
            )
        instruction = _parse_instruction(match["name"], line[match.end() :], line)
        instructions[instruction.name] = instruction
        if match["root"]:
            root = instruction.name
    return _Computation(name, is_entry, instructions, root)


def _parse_instruction(name: str, rest: str, line: str) -> _Instruction:
    rest = _COMMENT.sub("", rest)
    # A tuple shape holds spaces; an array shape runs to the first space.
    tuple_shape = rest.startswith("(")
    end = _closing(rest, 0, line) + 1 if tuple_shape else len(rest.split(None, 1)[0])
    shape = rest[:end]
    match = _OPCODE.match(rest, end)
    if match is None:
        raise ValueError(f"cannot find the opcode after the shape in HLO line {line!r}")
    open_paren = match.end() - 1
    close_paren = _closing(rest, open_paren, line)
    inside = rest[open_paren + 1 : close_paren]
    if match["opcode"] in ("constant", "parameter"):
        operands = (inside.strip(),)
    else:
        # Operands may be printed with their shapes ("f32[4] %x"); the name is last.
        operands = tuple(
            part.split()[-1].lstrip("%") for part in _split_top(inside) if part.strip()
        )
    raw_attrs = rest[close_paren + 1 :].lstrip(", ")
    return _Instruction(
        name=name,
        shape=shape,
        opcode=match["opcode"],
        operands=operands,
        attrs=_QUOTED.sub('""', raw_attrs),
        raw_attrs=raw_attrs,
        line=line,
    )


def _closing(text: str, start: int, line: str) -> int:
    """Index of the bracket closing ``text[start]``, all bracket kinds nesting."""
    depth = 0
    for index in range(start, len(text)):
        char = text[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return index
    raise ValueError(f"unbalanced brackets in HLO line {line!r}")


def _split_top(text: str) -> list[str]:
    """Splits on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


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
    match = _ARRAY.match(text, pos)
    if match is None:
        raise ValueError(f"cannot read a shape at {text[pos:]!r} in HLO line {line!r}")
    pos = match.end()
    layout = ""
    if text.startswith("{", pos):
        close = _closing(text, pos, line)
        layout, pos = text[pos : close + 1], close + 1
    return _array_bytes(match["type"], match["dims"], layout, line), pos


def _array_bytes(element_type: str, dims: str, layout: str, line: str) -> int:
    bits = _ELEMENT_BITS.get(element_type)
    if bits is None and element_type.startswith("f8e"):
        bits = 8  # every float8 variant XLA adds is one byte
    if bits is None:
        raise ValueError(
            f"unknown HLO element type {element_type!r} in line {line!r}; "
            f"known types: {sorted(_ELEMENT_BITS)} and f8e*; add its size to "
            "shardsearch._hlo._ELEMENT_BITS"
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
    instruction: _Instruction, num_devices: int | None
) -> tuple[str, int, int | None] | None:
    opcode = instruction.opcode
    if opcode in COLLECTIVE_KINDS:
        kind = opcode
        size = _total(_parse_shape(instruction.shape, instruction.line))
    elif opcode in _START_OPCODES:
        kind = _START_OPCODES[opcode]
        shape = _parse_shape(instruction.shape, instruction.line)
        # all-reduce-start yields its output(s) directly; every other -start
        # (and an async wrapper, whose first element is the operand tuple)
        # yields (operands, output, context...), so the output is element 1.
        bundled = (
            isinstance(shape, list)
            and len(shape) >= 2
            and (kind != "all-reduce" or isinstance(shape[0], list))
        )
        size = _total(shape[1] if bundled else shape)
    else:
        return None
    if kind == "collective-permute":
        return kind, size, _permute_size(instruction)
    return kind, size, _group_size(instruction, num_devices)


def _permute_size(instruction: _Instruction) -> int | None:
    match = re.search(r"(?:^|[\s,])source_target_pairs=", instruction.attrs)
    if match is None:
        return None
    start = match.end()
    if not instruction.attrs.startswith("{", start):
        raise ValueError(
            f"source_target_pairs of {instruction.name!r} is not a {{{{s,t}},...}} "
            f"list: {instruction.line!r}"
        )
    body = instruction.attrs[start + 1 : _closing(instruction.attrs, start, instruction.line)]
    devices: dict[int, None] = {}
    for pair in re.findall(r"\{([^{}]*)\}", body):
        source, target = (int(x) for x in pair.split(","))
        if source != target:
            devices.update({source: None, target: None})
    return max(len(devices), 1)


def _group_size(instruction: _Instruction, num_devices: int | None) -> int | None:
    attrs, line = instruction.attrs, instruction.line
    match = re.search(r"(?:^|[\s,])replica_groups=", attrs)
    # No replica_groups printed means the same as "{}": every device.
    start = match.end() if match else None
    if start is None or attrs.startswith("{}", start):
        return num_devices
    if attrs.startswith("{", start):
        body = attrs[start + 1 : _closing(attrs, start, line)]
        groups = re.findall(r"\{([^{}]*)\}", body)
        if not groups:
            return num_devices
        # Groups of one op have equal sizes in practice; take the largest.
        return max(len([x for x in g.split(",") if x.strip()]) for g in groups)
    if iota := _IOTA_GROUPS.match(attrs, start):
        # [num_groups, group_size]<=[devices...]: the group size comes last.
        return int(iota["dims"].split(",")[-1])
    if attrs.startswith("maximal_mesh[", start):
        return 1
    if mesh := _MESH_GROUPS.match(attrs, start):
        return _mesh_group_size(mesh, attrs, line)
    raise ValueError(
        f"unrecognised replica_groups syntax in HLO line {line!r}; expected "
        "{{0,1},...}, [groups,size]<=[n] or mesh[...] {axes}"
    )


def _mesh_group_size(mesh: re.Match, attrs: str, line: str) -> int:
    """Group size of ``mesh['a'=2,'b'=4], device_ids=(...) {'b'}`` (newer XLA)."""
    sizes = {}
    for axis in mesh["axes"].split(","):
        name, _, size = axis.rpartition("=")
        sizes[name.strip().strip("'\"")] = int(size)
    pos = mesh.end()
    if devices := re.compile(r",\s*device_ids=").match(attrs, pos):
        pos = _closing(attrs, devices.end(), line) + 1
    axes = re.compile(r"\s*\{(?P<axes>[^{}]*)\}").match(attrs, pos)
    if axes is None:
        raise ValueError(
            f"mesh replica_groups without the {{axes}} that form a group in HLO line {line!r}"
        )
    group = 1
    for ref in filter(None, (r.strip() for r in axes["axes"].split(","))):
        # A sub-axis prints as name:(pre_size)size and spans only `size` devices.
        name, _, sub = ref.partition(":")
        name = name.strip("'\"")
        if sub:
            group *= int(sub.rpartition(")")[2])
        elif name in sizes:
            group *= sizes[name]
        else:
            raise ValueError(
                f"replica group axis {name!r} is not in the mesh {sizes} in HLO line {line!r}"
            )
    return group


# --- call graph and loops ---------------------------------------------------


def _call_edges(
    instruction: _Instruction, computation: _Computation, computations: dict[str, _Computation]
) -> tuple[list[tuple[str, int]], str | None]:
    """Callees of one instruction with how often each runs per execution.

    Returns the edges and, for a while loop whose trip count is unknown, the
    name of its body (the loop is then counted as running once).
    """
    if instruction.opcode in _NOT_CALLERS:
        return [], None
    names = [(m["attr"], m["name"]) for m in _CALLEE.finditer(instruction.attrs)]
    for match in _CALLEE_LIST.finditer(instruction.attrs):
        names += [("list", n.strip().lstrip("%")) for n in match["names"].split(",") if n.strip()]
    for _, name in names:
        if name not in computations:
            raise ValueError(
                f"instruction {instruction.name!r} in computation "
                f"{computation.name!r} calls computation {name!r}, which the "
                "text does not define; pass the whole module"
            )
    trips, unknown = 1, None
    if instruction.opcode == "while":
        found = _trip_count(instruction, computation, computations)
        if found is None:
            unknown = dict(names).get("body", instruction.name)
        else:
            trips = found
    edges = []
    for attr, name in names:
        if instruction.opcode == "while" and attr == "body":
            edges.append((name, trips))
        elif instruction.opcode == "while" and attr == "condition":
            # The condition runs once more than the body, to see it is done.
            edges.append((name, trips + 1 if unknown is None else 1))
        else:
            # Conditional branches are all counted, as if each were taken.
            edges.append((name, 1))
    return edges, unknown


def _trip_count(
    loop: _Instruction, caller: _Computation, computations: dict[str, _Computation]
) -> int | None:
    if match := _KNOWN_TRIP_COUNT.search(loop.raw_attrs):
        return int(match[1])
    attrs = {m["attr"]: m["name"] for m in _CALLEE.finditer(loop.attrs)}
    condition = computations.get(attrs.get("condition", ""))
    body = computations.get(attrs.get("body", ""))
    if condition is None or body is None or not loop.operands:
        return None
    # Without XLA's annotation, recognise "i = init; while i < limit: i += step".
    compare = _value(computations, condition, condition.root, None)
    if not compare or compare[0] != "compare":
        return None
    _, direction, lhs, rhs = compare
    if rhs and rhs[0] == "gte":
        lhs, rhs = rhs, lhs
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction)
    if not (lhs and rhs and lhs[0] == "gte" and rhs[0] == "const"):
        return None
    index, limit = lhs[1], rhs[1]
    init_tuple = caller.instructions.get(loop.operands[0])
    body_root = body.instructions.get(body.root or "")
    if (
        init_tuple is None
        or init_tuple.opcode != "tuple"
        or body_root is None
        or body_root.opcode != "tuple"
        or index >= min(len(init_tuple.operands), len(body_root.operands))
    ):
        return None
    init = _value(computations, caller, init_tuple.operands[index], None)
    update = _value(computations, body, body_root.operands[index], None)
    if not init or init[0] != "const" or not update or update[0] != "add":
        return None
    terms = {term[0]: term[1] for term in update[1:] if term}
    if terms.get("gte") != index or "const" not in terms:
        return None
    start, step = init[1], terms["const"]
    span = {
        "LT": limit - start,
        "LE": limit - start + 1,
        "GT": start - limit,
        "GE": start - limit + 1,
    }.get(direction)
    if span is None or (step > 0) != (direction in ("LT", "LE")) or step == 0:
        return None
    return max(0, -(-span // abs(step)))


def _value(
    computations: dict[str, _Computation],
    computation: _Computation,
    name: str | None,
    params: list | None,
) -> tuple | None:
    """A small symbolic value of a scalar: const, gte (of the loop tuple), add, compare.

    ``params`` maps a fused computation's parameters to the caller's values.
    Returns None for anything else.
    """
    instruction = computation.instructions.get(name or "")
    if instruction is None:
        return None
    opcode, operands = instruction.opcode, instruction.operands
    if opcode == "constant":
        return ("const", int(operands[0])) if re.fullmatch(r"-?\d+", operands[0]) else None
    if opcode == "parameter":
        index = int(operands[0])
        if params is None:
            return ("param", index)
        return params[index] if index < len(params) else None
    if opcode in ("copy", "bitcast", "convert", "reshape") and operands:
        return _value(computations, computation, operands[0], params)
    if opcode == "get-tuple-element" and operands:
        base = _value(computations, computation, operands[0], params)
        index = re.search(r"(?:^|[\s,])index=(\d+)", instruction.attrs)
        return ("gte", int(index[1])) if base == ("param", 0) and index else None
    if opcode in ("fusion", "call"):
        callee = re.search(r"(?:^|[\s,])(?:calls|to_apply)=%?([^\s,{}()]+)", instruction.attrs)
        fused = computations.get(callee[1]) if callee else None
        if fused is None:
            return None
        values = [_value(computations, computation, o, params) for o in operands]
        return _value(computations, fused, fused.root, values)
    if opcode in ("add", "compare") and len(operands) == 2:
        lhs, rhs = (_value(computations, computation, o, params) for o in operands)
        if opcode == "add":
            return ("add", lhs, rhs)
        direction = re.search(r"(?:^|[\s,])direction=(\w+)", instruction.attrs)
        return ("compare", direction[1] if direction else None, lhs, rhs)
    return None
