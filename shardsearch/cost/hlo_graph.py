"""An HLO module's text as computations, and how often each runs per step.

:func:`parse_module` reads ``compiled.as_text()`` into computations of
instructions, links them into a call graph from ENTRY (fusions'
``calls=``, ``to_apply``, ``while`` bodies and conditions, conditional branches,
async wrappers) and gives every computation its execution count: an
instruction inside a ``while`` body (``lax.scan``, ``fori_loop``) runs once per
trip, nested loops multiply, and a computation called from two places adds
both. :mod:`shardsearch.cost.hlo` then counts what it cares about (collectives,
matmul flops) with those multiplicities.

Example: a ``lax.scan`` of length 5 around a fused matmul gives the fused
computation ``counts == 5`` and ``counts_once == 1``.

Only the text is read; nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import re

import networkx as nx

_HEADER = re.compile(r"^HloModule\b")
_COMPUTATION = re.compile(
    r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s(){}=]+)\s*(?:\(.*\)\s*->.*)?\{\s*$"
)
_INSTRUCTION = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[^\s=]+)\s+=\s+(?=\S)")
_OPCODE = re.compile(r"\s*(?P<opcode>[A-Za-z][\w\-.]*)\(")
# Most lines, read by one regex: "ROOT %name = f32[8]{0} add(%a, %b), attrs",
# an array shape and operands without brackets (no tuple shape, no shapes
# printed with the operands, no literal), nor comments. The rest is walked
# bracket by bracket (_parse_instruction).
_SIMPLE_LINE = re.compile(
    r"(?P<root>ROOT\s+)?%?(?P<name>[^\s=]+)\s+=\s+(?P<shape>[^\s(]\S*)\s+"
    r"(?P<opcode>[A-Za-z][\w\-.]*)\((?P<inside>[^()\[\]{}]*)\)[, ]*(?P<attrs>.*)"
)
# Two words in one operand, e.g. a shape before a name without brackets.
_TWO_TOKENS = re.compile(r"[^\s,]\s+[^\s,]")
# A quoted string with its escapes; unrolled ("normal* (special normal*)*")
# so that a long backend config is one run of the engine, not a choice a char.
_QUOTED = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_COMMENT = re.compile(r"/\*.*?\*/")
_BRACKET = re.compile(r"[()\[\]{}]")
_BRACKET_OR_COMMA = re.compile(r"[()\[\]{},]")
_KNOWN_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_CALLEE = re.compile(
    r"(?:^|[\s,])(?P<attr>calls|to_apply|body|condition|true_computation|"
    r"false_computation|select|scatter)=%?(?P<name>[^\s,{}()]+)"
)
_CALLEE_LIST = re.compile(
    r"(?:^|[\s,])(?:calls|branch_computations|called_computations)=\{(?P<names>[^}]*)\}"
)
# Every attribute that names a callee ends in one of these; most lines have none.
_CALLS_ANY = re.compile(r"calls=|to_apply=|body=|condition=|_computation|select=|scatter=")
_NEW = object.__new__
# async-update / async-done repeat the async-start's ``calls=``; following them
# too would count the wrapped work two or three times.
_NOT_CALLERS = frozenset({"async-update", "async-done"})
# Callers whose callees run as instructions of their own (loops, calls,
# branches, async work); every other callee is a fused body or a reducer,
# whose instructions work on values in registers.
_SCHEDULING = frozenset({"while", "conditional", "call", "async-start"})


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction, split into its parts.

    Attributes:
      name: the instruction's name, without ``%``.
      shape: its result shape as printed, e.g. ``f32[128,32]{1,0}``.
      opcode: e.g. ``dot``, ``fusion``, ``all-reduce-start``.
      operands: operand names, or the literal for ``constant`` / the index for
        ``parameter``.
      operand_shapes: each operand's shape where the text prints it inline
        (``dot(f32[16,32]{1,0} %a, ...)``, older printers), else ``""``.
      attrs: the text after the operands, quoted strings blanked so that user
        text (op names, metadata) cannot fake an attribute.
      raw_attrs: the same text with the strings kept (backend configs).
      line: the whole line, for error messages.
    """

    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    operand_shapes: tuple[str, ...]
    attrs: str
    raw_attrs: str
    line: str


@dataclasses.dataclass(frozen=True)
class Computation:
    """One HLO computation: its instructions by name, in text order."""

    name: str
    is_entry: bool
    instructions: dict[str, Instruction]
    root: str | None


@dataclasses.dataclass(frozen=True)
class Module:
    """A parsed HLO module with each computation's executions per step.

    Attributes:
      header: the ``HloModule`` line, or None when the text has none.
      computations: every computation, in text order.
      entry: the ENTRY computation's name.
      counts: executions per step: 1 for ENTRY, a ``while`` body its loop's
        trip count times its caller's count (the condition one more), summed
        over every call site. 0 for computations that never run.
      counts_once: the same with every loop taken to run once, which is how
        XLA's ``cost_analysis()`` counts a loop.
      unknown_trip_counts: bodies of loops (with a caller that runs) whose
        trip count was neither annotated nor derivable; both counts take them
        to run once.
      scheduled: ENTRY, then the computations called by ``while``,
        ``conditional``, ``call`` or ``async-start``: those whose instructions
        read and write memory. The others are fusions' bodies and reducers
        (``to_apply`` of a reduce or all-reduce).
    """

    header: str | None
    computations: dict[str, Computation]
    entry: str
    counts: dict[str, int]
    counts_once: dict[str, int]
    unknown_trip_counts: tuple[str, ...]
    scheduled: tuple[str, ...]


def parse_module(hlo_text: str) -> Module:
    """Parses HLO module text and counts how often each computation runs.

    Args:
      hlo_text: ``compiled.as_text()`` of a compiled ``jax.jit``, or any HLO
        module text with one ENTRY computation.

    Returns:
      The module, e.g. for a 5-step ``lax.scan`` ``counts["region_0.2"] == 5``
      for the loop body and ``counts_once["region_0.2"] == 1``.

    Raises:
      ValueError: the text has no (or several) ENTRY computations, a line is
        not an instruction, a computation is not closed or defined twice, an
        instruction calls a computation the text does not define, or the
        computations call each other in a cycle.
    """
    header, computations = _parse_computations(hlo_text)
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
    scheduled = {entries[0]: None}  # a dict keeps the order, a set would not
    for computation in computations.values():
        for instruction in computation.instructions.values():
            edges, unknown = _call_edges(instruction, computation, computations)
            if unknown:
                unknown_loops.append((computation.name, unknown))
            if instruction.opcode in _SCHEDULING:
                scheduled.update(dict.fromkeys(callee for callee, _ in edges))
            for callee, factor in edges:
                if graph.has_edge(computation.name, callee):
                    graph[computation.name][callee]["factor"] += factor
                    graph[computation.name][callee]["calls"] += 1
                else:
                    graph.add_edge(computation.name, callee, factor=factor, calls=1)
    if not nx.is_directed_acyclic_graph(graph):
        cycle = [edge[0] for edge in nx.find_cycle(graph)]
        raise ValueError(
            f"HLO computations call each other in a cycle {cycle}; HLO forbids "
            "recursion, so the text is corrupt or not an HLO module"
        )

    order = list(nx.topological_sort(graph))
    counts = _propagate(graph, order, entries[0], "factor")
    counts_once = _propagate(graph, order, entries[0], "calls")
    return Module(
        header=header,
        computations=computations,
        entry=entries[0],
        counts=counts,
        counts_once=counts_once,
        unknown_trip_counts=tuple(body for caller, body in unknown_loops if counts[caller]),
        scheduled=tuple(scheduled),
    )


def _propagate(graph: nx.DiGraph, order: list[str], entry: str, weight: str) -> dict[str, int]:
    count = dict.fromkeys(graph.nodes, 0)
    count[entry] = 1
    for caller in order:
        for callee in graph.successors(caller):
            count[callee] += count[caller] * graph[caller][callee][weight]
    return count


def _parse_computations(text: str) -> tuple[str | None, dict[str, Computation]]:
    header = None
    computations: dict[str, Computation] = {}
    current: tuple[str, bool, list[tuple[str, re.Match | None]]] | None = None
    for line in text.splitlines():
        if current is None:
            if _HEADER.match(line):
                header = line
            elif match := _COMPUTATION.match(line):
                current = (match["name"], bool(match["entry"]), [])
            continue
        name, is_entry, lines = current
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("}"):
            if name in computations:
                raise ValueError(f"HLO computation {name!r} is defined twice; pass one module")
            computations[name] = _build_computation(name, is_entry, lines)
            current = None
        elif "/*" not in stripped and (simple := _SIMPLE_LINE.match(stripped)):
            lines.append((stripped, simple))
        elif not lines or _INSTRUCTION.match(stripped):
            lines.append((stripped, None))
        else:
            # Hand-written HLO wraps long instructions; the printer never does.
            lines[-1] = (lines[-1][0] + " " + stripped, None)
    if current is not None:
        raise ValueError(
            f"HLO computation {current[0]!r} is not closed by '}}'; the text "
            "looks truncated, pass the whole of compiled.as_text()"
        )
    return header, computations


def _build_computation(
    name: str, is_entry: bool, lines: list[tuple[str, re.Match | None]]
) -> Computation:
    instructions: dict[str, Instruction] = {}
    root = None
    for line, simple in lines:
        if simple is not None:
            instruction = _simple_instruction(simple, line)
            is_root = simple["root"]
        else:
            match = _INSTRUCTION.match(line)
            if match is None:
                raise ValueError(
                    f"cannot read this line of HLO computation {name!r} as an "
                    f"instruction ('name = shape opcode(operands), attrs'): {line!r}"
                )
            instruction = _parse_instruction(match["name"], line[match.end() :], line)
            is_root = match["root"]
        instructions[instruction.name] = instruction
        if is_root:
            root = instruction.name
    return Computation(name, is_entry, instructions, root)


def _simple_instruction(match: re.Match, line: str) -> Instruction:
    """The instruction of a line `_SIMPLE_LINE` read: what `_parse_instruction`
    makes of it, without walking its brackets."""
    opcode, inside, raw_attrs = match["opcode"], match["inside"], match["attrs"]
    if opcode in ("constant", "parameter"):
        operands, operand_shapes = (inside.strip(),), ("",)
    elif _TWO_TOKENS.search(inside):  # "f32 %x": the slow path keeps both
        return _parse_instruction(match["name"], line[match.start("shape") :], line)
    else:
        operands = tuple(part.lstrip("%") for part in "".join(inside.split()).split(",") if part)
        operand_shapes = ("",) * len(operands)
    return _new_instruction(
        match["name"],
        match["shape"],
        opcode,
        operands,
        operand_shapes,
        _QUOTED.sub('""', raw_attrs) if '"' in raw_attrs else raw_attrs,
        raw_attrs,
        line,
    )


def _new_instruction(
    name: str,
    shape: str,
    opcode: str,
    operands: tuple[str, ...],
    operand_shapes: tuple[str, ...],
    attrs: str,
    raw_attrs: str,
    line: str,
) -> Instruction:
    """``Instruction(...)``, made faster: a frozen dataclass sets each field
    through ``object.__setattr__``; filling the instance's dict directly
    makes the same (equal, hashing alike) instance in under half the time,
    which counts for the thousands of instructions of a module. Instruction
    has no ``__post_init__`` to skip."""
    instruction = _NEW(Instruction)
    fields = instruction.__dict__
    fields["name"] = name
    fields["shape"] = shape
    fields["opcode"] = opcode
    fields["operands"] = operands
    fields["operand_shapes"] = operand_shapes
    fields["attrs"] = attrs
    fields["raw_attrs"] = raw_attrs
    fields["line"] = line
    return instruction


def _parse_instruction(name: str, rest: str, line: str) -> Instruction:
    if "/*" in rest:
        rest = _COMMENT.sub("", rest)
    # A tuple shape holds spaces; an array shape runs to the first space.
    tuple_shape = rest.startswith("(")
    end = closing(rest, 0, line) + 1 if tuple_shape else len(rest.split(None, 1)[0])
    shape = rest[:end]
    match = _OPCODE.match(rest, end)
    if match is None:
        raise ValueError(f"cannot find the opcode after the shape in HLO line {line!r}")
    opcode = match["opcode"]
    open_paren = match.end() - 1
    close_paren = closing(rest, open_paren, line)
    inside = rest[open_paren + 1 : close_paren]
    if opcode in ("constant", "parameter"):
        operands, operand_shapes = (inside.strip(),), ("",)
    else:
        # Operands may be printed with their shapes ("f32[4] %x"); the name is last.
        parts = [["", *part.rsplit(None, 1)][-2:] for part in split_top(inside) if part.strip()]
        operands = tuple(operand.lstrip("%") for _, operand in parts)
        operand_shapes = tuple(operand_shape for operand_shape, _ in parts)
    raw_attrs = rest[close_paren + 1 :].lstrip(", ")
    return Instruction(
        name=name,
        shape=shape,
        opcode=opcode,
        operands=operands,
        operand_shapes=operand_shapes,
        attrs=_QUOTED.sub('""', raw_attrs) if '"' in raw_attrs else raw_attrs,
        raw_attrs=raw_attrs,
        line=line,
    )


def closing(text: str, start: int, line: str) -> int:
    """Index of the bracket closing ``text[start]``, all bracket kinds nesting."""
    depth = 0
    # The regex skips the text between brackets at C speed; a line of HLO
    # is mostly names and numbers.
    for match in _BRACKET.finditer(text, start):
        if match.group() in "([{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return match.start()
    raise ValueError(f"unbalanced brackets in HLO line {line!r}")


def split_top(text: str) -> list[str]:
    """Splits on commas that are not inside brackets."""
    if not _BRACKET.search(text):
        return text.split(",")  # the usual operand list, "%a, %b"
    parts, depth, start = [], 0, 0
    for match in _BRACKET_OR_COMMA.finditer(text):
        char = match.group()
        if char == ",":
            if depth == 0:
                parts.append(text[start : match.start()])
                start = match.end()
        elif char in "([{":
            depth += 1
        else:
            depth -= 1
    parts.append(text[start:])
    return parts


# --- call graph and loops ---------------------------------------------------


def _call_edges(
    instruction: Instruction, computation: Computation, computations: dict[str, Computation]
) -> tuple[list[tuple[str, int]], str | None]:
    """Callees of one instruction with how often each runs per execution.

    Returns the edges and, for a while loop whose trip count is unknown, the
    name of its body (the loop is then counted as running once).
    """
    if instruction.opcode in _NOT_CALLERS or not _CALLS_ANY.search(instruction.attrs):
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
    loop: Instruction, caller: Computation, computations: dict[str, Computation]
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
    computations: dict[str, Computation],
    computation: Computation,
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
