"""Element types in HLO: their sizes, and the dtype a matmul really computes in.

`cost.hlo` sizes arrays with `ELEMENT_BITS` and splits matmul flops by dtype
with `matmul_dtype`: the CPU backend widens bf16 operands to f32 behind
converts it adds, so the printed operand type is not the program's; the
widening is followed back to the narrow type, except for converts the program
wrote itself.

Example:
  >>> matmul_dtype(dot, computation, module, callers(module))  # a bf16 x @ w on CPU
  'bf16'
"""

from __future__ import annotations

import re

from .hlo_graph import Computation, Instruction, Module

# Bits each element occupies in memory. Sub-byte types are stored one per byte
# unless the layout packs them with ``E(bits)``, which _array_bytes honours.
ELEMENT_BITS = {
    "pred": 8,
    "s2": 8, "u2": 8, "s4": 8, "u4": 8, "f4e2m1fn": 8,
    "s8": 8, "u8": 8,
    "s16": 16, "u16": 16, "f16": 16, "bf16": 16,
    "s32": 32, "u32": 32, "f32": 32,
    "s64": 64, "u64": 64, "f64": 64, "c64": 64,
    "c128": 128,
    "token": 0,
}  # fmt: skip


ARRAY = re.compile(r"(?P<type>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")


CALLS = re.compile(r"(?:^|[\s,])calls=%?(?P<name>[^\s,{}()]+)")


BODY = re.compile(r"(?:^|[\s,])body=%?(?P<name>[^\s,{}()]+)")


# Steps followed back from a matmul's operand to find the type it was widened
# from; real chains are a handful of steps (fusion boundary, bitcast, convert).
_TRACE_STEPS = 32


# Ops that hand on their first operand's values in another shape or layout.
_SAME_VALUES = frozenset(
    {"bitcast", "copy", "reshape", "transpose", "broadcast", "slice", "dynamic-slice"}
)


_USER_CONVERT = re.compile(r'op_name="[^"]*convert_element_type')


# Computation name -> (the computation holding its one caller, that caller).
Callers = dict[str, tuple[Computation, Instruction]]


def callers(module: Module) -> Callers:
    """The one fusion or ``while`` calling each fused computation or loop body.

    Computations with several callers are left out: their parameters have no
    single source.
    """
    found: dict[str, list[tuple[Computation, Instruction]]] = {}
    for computation in module.computations.values():
        for instruction in computation.instructions.values():
            if instruction.opcode == "fusion":
                callee = CALLS.search(instruction.attrs)
            elif instruction.opcode == "while":
                callee = BODY.search(instruction.attrs)
            else:
                continue
            if callee is not None:
                found.setdefault(callee["name"], []).append((computation, instruction))
    return {name: sites[0] for name, sites in found.items() if len(sites) == 1}


def matmul_dtype(
    instruction: Instruction, computation: Computation, module: Module, callers: Callers
) -> str:
    """Element type of a matmul's LHS operand, before any widening XLA added.

    E.g. ``"bf16"`` for a bf16 ``x @ w`` compiled for CPU, whose dot reads
    ``f32`` operands that a ``convert`` XLA inserted made from bf16 ones.
    When only the RHS was widened, its type: XLA folds a constant LHS (the
    ones that start a gradient) into the wide type, but the program's matmul
    took two operands of one type.
    """
    for index in range(min(2, len(instruction.operands))):
        narrow = _widened_from(module, callers, computation, instruction.operands[index])
        if narrow is not None:
            return narrow
    lhs = operand_shape(instruction, 0, computation) if instruction.operands else ""
    return element_type(lhs) or element_type(instruction.shape) or "unknown"


def _widened_from(
    module: Module, callers: Callers, computation: Computation, name: str
) -> str | None:
    """The narrowest type ``name``'s values were widened from by XLA, or None.

    Follows the values back through shape-only ops, fusion boundaries, tuples
    and loop-carried values, past each widening ``convert`` the program did
    not write, and stops at anything else.
    """
    narrowest = None
    for _ in range(_TRACE_STEPS):
        instruction = computation.instructions.get(name)
        if instruction is None or not instruction.operands:
            break
        opcode = instruction.opcode
        if opcode == "convert":
            source = operand_shape(instruction, 0, computation)
            wide, narrow = element_type(instruction.shape), element_type(source)
            if (
                _USER_CONVERT.search(instruction.raw_attrs)
                or not wide
                or not narrow
                or not 0 < bits(narrow) < bits(wide)
            ):
                break
            narrowest, name = narrow, instruction.operands[0]
        elif opcode in _SAME_VALUES:
            name = instruction.operands[0]
        elif opcode == "fusion":
            callee = CALLS.search(instruction.attrs)
            fused = module.computations.get(callee["name"]) if callee else None
            if fused is None or fused.root is None:
                break
            computation, name = fused, fused.root
        elif opcode == "parameter" and computation.name in callers:
            caller_computation, caller = callers[computation.name]
            index = int(instruction.operands[0]) if instruction.operands[0].isdigit() else -1
            if not 0 <= index < len(caller.operands):
                break
            # A loop body's parameter is the loop's tuple, from its operand.
            computation, name = caller_computation, caller.operands[index]
        elif opcode == "get-tuple-element":
            found = _tuple_element(module, callers, computation, instruction)
            if found is None:
                break
            computation, name = found
        else:
            break
    return narrowest


def _tuple_element(
    module: Module, callers: Callers, computation: Computation, instruction: Instruction
) -> tuple[Computation, str] | None:
    """Where ``get-tuple-element`` takes its value from, when that is known."""
    index = re.search(r"(?:^|[\s,])index=(\d+)", instruction.attrs)
    tuple_value = computation.instructions.get(instruction.operands[0])
    for _ in range(_TRACE_STEPS):
        if index is None or tuple_value is None:
            return None
        if tuple_value.opcode == "tuple":
            position = int(index[1])
            if position >= len(tuple_value.operands):
                return None
            return computation, tuple_value.operands[position]
        if tuple_value.opcode == "fusion":  # a multi-output fusion's root tuple
            callee = CALLS.search(tuple_value.attrs)
            fused = module.computations.get(callee["name"]) if callee else None
            if fused is None:
                return None
            computation, tuple_value = fused, fused.instructions.get(fused.root or "")
        elif tuple_value.opcode == "parameter" and computation.name in callers:
            caller_computation, caller = callers[computation.name]
            if caller.opcode != "while" or not caller.operands:
                return None
            # The loop's first trip gets its operand; later trips the body's
            # root, which holds values of the same type.
            computation = caller_computation
            tuple_value = computation.instructions.get(caller.operands[0])
        else:
            return None
    return None


def operand_shape(instruction: Instruction, index: int, computation: Computation) -> str:
    shape = instruction.operand_shapes[index] if index < len(instruction.operand_shapes) else ""
    if not shape and index < len(instruction.operands):
        definition = computation.instructions.get(instruction.operands[index])
        shape = definition.shape if definition is not None else ""
    return shape


def element_type(shape: str) -> str | None:
    """Element type of an array shape, or of a tuple shape's first leaf."""
    match = ARRAY.match(shape.lstrip("( "))
    return match["type"] if match else None


def bits(element_type: str) -> int:
    """Bits of a number type; 0 for pred, token and unknown types."""
    if element_type.startswith("f8e"):
        return 8
    return ELEMENT_BITS.get(element_type, 0) if element_type != "pred" else 0
