"""Can Shardy's own propagation, run before compiling, say what XLA will need?

Stage 1 predicts a candidate's bytes from the jaxpr with its own guess of
where each value is split (`cost.footprint`), and on cpu-static64's 16 GiB
entries that guess misses most over-budget verdicts: XLA needs up to 28x the
prediction when the batch and a weight's dim ask for the same mesh axes and
propagation resolves the conflict for the weight (the logits and the
attention scores then hold the whole batch on every device). jaxlib ships
Shardy's passes: this probe lowers each plan, runs `sdy-propagation-pipeline`
on the StableHLO in-process (no compile), walks the propagated module for
the most bytes per device live at once, then compiles the plan and sets
XLA's own figure beside it.

    python benchmarks/prediction/shardy.py gpt:1.5b dp=8,tp=8 \\
        benchmarks/results/prediction/shardy.md dp fsdp dp_do replicated

The walk (`live_bytes`): values split as propagation says (a value without
a sharding is whole on every device); values live from the op that makes
them to their last use; broadcasts, iotas, constants and elementwise ops
whose every user is elementwise are fused (not stored), their operands held
until the fused chain's last stored user; a loop's results take its
operands' buffers; the step's returned values take the donated arguments';
a dot whose contracted dim is split over axes its result also uses holds its
partial sums whole on those axes first. Same conventions as `cost.footprint`
where they overlap; a probe, not part of the package.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

_ELEMENT_BYTES = {"f64": 8, "i64": 8, "ui64": 8, "f32": 4, "i32": 4, "ui32": 4,
                  "bf16": 2, "f16": 2, "i16": 2, "ui16": 2, "i8": 1, "ui8": 1, "i1": 1}
_ELEMENTWISE = {f"stablehlo.{name}" for name in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "exponential", "log", "sqrt",
    "rsqrt", "negate", "abs", "select", "compare", "convert", "tanh", "logistic", "power", "and",
    "or", "not", "sign", "floor", "ceil", "clamp", "exponential_minus_one", "log_plus_one",
    "sine", "cosine", "xor", "remainder", "is_finite", "round_nearest_even", "round_nearest_afz",
    "broadcast_in_dim", "reshape", "transpose", "iota", "constant", "cbrt", "atan2",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "popcnt")}
_ELEMENTWISE.add("sdy.constant")
_NEVER_STORED = {"stablehlo.broadcast_in_dim", "stablehlo.iota", "stablehlo.constant",
                 "sdy.constant", "stablehlo.reshape", "stablehlo.convert"}
_IN_PLACE = {"stablehlo.while", "stablehlo.dynamic_update_slice"}
_SHARDING = re.compile(r"<@\w+, \[(.*?)\](?:, replicated=\{[^}]*\})?>")
_DIM = re.compile(r"\{([^}]*)\}")
_SUB_AXIS = re.compile(r"\w+:\(\d+\)(\d+)")
_CONTRACTING = re.compile(r"lhs_contracting_dimensions = \[([\d, ]*)\]")


def shardings(text: str) -> list[list[tuple[str, ...]]]:
    """Each value's mesh axes per dim, from an `sdy.sharding` attribute's text.

    Example:
      >>> shardings('#sdy.sharding_per_value<[<@mesh, [{"dp", "tp"}, {}]>]>')
      [[('dp', 'tp'), ()]]
      >>> shardings('#sdy.sharding<@mesh, [{"tp":(1)4}]>')   # a sub-axis of size 4
      [[('tp:(1)4',)]]
    """
    found = []
    for value in _SHARDING.finditer(text):
        found.append([tuple(a.strip().replace('"', "") for a in dim[1].split(",")
                            if a.strip() and a.strip() != "?")
                      for dim in _DIM.finditer(value[1])])
    return found


class Walk:
    """The most bytes per device live at once in a propagated module's `main`."""

    def __init__(self, module, axis_sizes: dict[str, int]):
        from jaxlib.mlir import ir

        self.ir = ir
        self.axis_sizes = axis_sizes
        self.functions = {ir.StringAttr(op.attributes["sym_name"]).value: op
                          for op in module.body.operations if op.operation.name == "func.func"}
        self.peaks: dict[str, int] = {}

    def _axis(self, axis: str) -> int:
        sub = _SUB_AXIS.fullmatch(axis)
        return int(sub[1]) if sub else self.axis_sizes[axis]

    def nbytes(self, value_type, dims) -> int:
        """Bytes per device of a tensor type split as `dims` (None: whole)."""
        try:
            tensor = self.ir.RankedTensorType(value_type)
        except ValueError:  # tokens, tuples: nothing to hold
            return 0
        size = _ELEMENT_BYTES.get(str(tensor.element_type), 4)
        for i, extent in enumerate(tensor.shape):
            parts = 1
            for axis in (dims[i] if dims and i < len(dims) else ()):
                parts *= self._axis(axis)
            size *= -(-extent // parts)
        return size

    @staticmethod
    def _result_dims(op):
        return shardings(str(op.attributes["sdy.sharding"])) \
            if "sdy.sharding" in op.attributes else None

    def _partial_sums(self, op, dims_of) -> int:
        if op.operation.name != "stablehlo.dot_general":
            return 0
        contracting = _CONTRACTING.search(str(op.attributes["dot_dimension_numbers"]))
        lhs = dims_of.get(op.operands[0])
        split = {axis for d in (contracting[1].split(",") if contracting else ())
                 if d.strip() and lhs and int(d) < len(lhs) for axis in lhs[int(d)]}
        result = self._result_dims(op)
        if not split or not result:
            return 0
        return self.nbytes(op.results[0].type,
                           [tuple(a for a in dim if a not in split) for dim in result[0]])

    def _block(self, block, dims_of, returned_free: bool) -> int:
        ops = list(block.operations)
        users: dict = {}

        def note_uses(op, at):
            for operand in op.operands:
                users.setdefault(operand, set()).add(at)
            for region in op.regions:
                for inner_block in region.blocks:
                    for inner in inner_block.operations:
                        note_uses(inner, at)

        for at, op in enumerate(ops):
            note_uses(op, at)
        fused = [op.operation.name in _ELEMENTWISE and bool(op.results)
                 and all(ops[u].operation.name in _ELEMENTWISE
                         for r in op.results for u in users.get(r, ()))
                 and any(users.get(r) for r in op.results) for op in ops]
        needed = list(range(len(ops)))
        for at in range(len(ops) - 1, -1, -1):
            if fused[at]:
                needed[at] = max((needed[u] for r in ops[at].results
                                  for u in users.get(r, ())), default=at)
        last = {v: max(needed[u] for u in uses) for v, uses in users.items()}
        live: dict = {}
        held = peak = 0
        for at, op in enumerate(ops):
            name = op.operation.name
            dims = self._result_dims(op)
            for i, result in enumerate(op.results):
                dims_of[result] = dims[i] if dims and i < len(dims) else None
            inner = 0
            if name == "func.call":
                inner = self.function(self.ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
            for region in op.regions:
                for inner_block in region.blocks:
                    # a loop's or branch's block takes the op's operands, first to first
                    for argument, operand in zip(inner_block.arguments, op.operands,
                                                 strict=False):
                        dims_of[argument] = dims_of.get(operand)
                    inner = max(inner, self._block(inner_block, dims_of, False))
            sizes = [0 if name in _NEVER_STORED or name in _IN_PLACE or fused[at]
                     or (returned_free and any(ops[u].operation.name == "func.return"
                                               for u in users.get(r, ())))
                     else self.nbytes(r.type, dims_of[r]) for r in op.results]
            peak = max(peak, held + inner + sum(sizes) + self._partial_sums(op, dims_of))
            for result, size in zip(op.results, sizes, strict=True):
                if size:
                    live[result] = size
                    held += size
            for value in [v for v in live if last.get(v, -1) <= at]:
                held -= live.pop(value)
        return peak

    def function(self, name: str) -> int:
        """Peak bytes live inside function `name` besides its arguments."""
        if name not in self.peaks:
            function = self.functions[name]
            block = function.regions[0].blocks[0]
            attrs = function.attributes.get("arg_attrs")
            dims_of = {}
            for i, argument in enumerate(block.arguments):
                found = shardings(str(self.ir.ArrayAttr(attrs)[i])) if attrs is not None else []
                dims_of[argument] = found[0] if found else None
            self.peaks[name] = self._block(block, dims_of, returned_free=name == "main")
        return self.peaks[name]

    def arguments(self) -> int:
        """Bytes per device of `main`'s arguments as they are split."""
        function = self.functions["main"]
        attrs = self.ir.ArrayAttr(function.attributes["arg_attrs"])
        return sum(self.nbytes(a.type, (shardings(str(attrs[i])) or [None])[0])
                   for i, a in enumerate(function.regions[0].blocks[0].arguments))


def propagated_bytes(lowered, axis_sizes: dict[str, int], op_priority: bool) -> tuple[int, int]:
    """`(arguments, arguments + peak live)` bytes per device of `lowered`
    after Shardy's propagation pipeline, walked as `Walk` does;
    `op_priority=False` runs the pipeline with op-priority propagation off."""
    from jaxlib.mlir import ir, passmanager

    module = lowered.compiler_ir("stablehlo")
    with module.context:  # the copy lives only as long as this context
        copy = ir.Module.parse(str(module))
        pipeline = str(passmanager.PassManager.parse(
            "builtin.module(sdy-propagation-pipeline)"))
        # the printed pipeline names a pass only its own builder can add
        pipeline = pipeline.replace("sdy-save-module,", "").replace(",sdy-save-module", "")
        if not op_priority:
            pipeline = pipeline.replace("run-op-priority-propagation=true",
                                        "run-op-priority-propagation=false")
        passmanager.PassManager.parse(pipeline).run(copy.operation)
        walk = Walk(copy, axis_sizes)
        arguments = walk.arguments()
        return arguments, arguments + walk.function("main")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", help="a registered workload, e.g. gpt:1.5b")
    parser.add_argument("mesh", help="axis=size,... e.g. dp=8,tp=8")
    parser.add_argument("out", type=Path)
    parser.add_argument("plans", nargs="+", help="expert plan names")
    args = parser.parse_args(argv)
    axes = dict((a, int(n)) for a, n in (part.split("=") for part in args.mesh.split(",")))
    devices = 1
    for n in axes.values():
        devices *= n

    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    jax.config.update("jax_platforms", "cpu")
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    from shardsearch.search import predict_footprint, trace_program
    from shardsearch.workloads import expert_plan, get_workload

    mesh = jax.make_mesh(tuple(axes.values()), tuple(axes),
                         axis_types=(AxisType.Auto,) * len(axes))
    workload = get_workload(args.workload)
    abstract = workload.abstract()
    program = trace_program(workload.step, abstract)
    gib = 2**30
    command = " ".join(["python benchmarks/prediction/shardy.py", *sys.argv[1:]]
                       if argv is None else ["python benchmarks/prediction/shardy.py", *argv])
    lines = [f"# Shardy's propagation before compiling, against XLA: {args.workload} on "
             f"{args.mesh} CPU devices", "", f"Command: `{command}`", "",
             "GiB per device. *propagated*: the arguments plus the most bytes live at once "
             "in the module Shardy's pipeline propagated (`live_bytes` in the script's "
             "docstring), with op-priority propagation on (the pipeline's default) and off; "
             "*stage 1*: what the search predicts today, from the jaxpr (`cost.footprint`, "
             "before the study's scaling); *XLA*: the compiled program's arguments plus "
             "temporaries. Seconds: lowering and both propagations, then the compile.", "",
             "| plan | arguments | stage 1 | XLA / it | propagated (default) | XLA / it | "
             "propagated (op priority off) | XLA / it | XLA | seconds: propagate, compile |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in args.plans:
        specs = expert_plan(workload, mesh, name).specs(abstract, mesh)
        placed = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                              is_leaf=lambda x: isinstance(x, PartitionSpec))
        stage1 = predict_footprint(program, specs, axes).total
        start = time.perf_counter()
        lowered = jax.jit(workload.step, in_shardings=placed, donate_argnums=0).lower(*abstract)
        (arguments, default), (_, no_priority) = (
            propagated_bytes(lowered, axes, on) for on in (True, False))
        totals = (default, no_priority)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        memory = lowered.compile().memory_analysis()
        compile_seconds = time.perf_counter() - start
        xla = memory.argument_size_in_bytes + memory.temp_size_in_bytes
        lines.append(f"| {name} | {arguments / gib:.2f} | {stage1 / gib:.2f} | "
                     f"{xla / stage1:.2f} | {totals[0] / gib:.2f} | "
                     f"{xla / totals[0]:.2f} | {totals[1] / gib:.2f} | {xla / totals[1]:.2f} | "
                     f"{xla / gib:.2f} | {seconds:.2f}, {compile_seconds:.1f} |")
        print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
