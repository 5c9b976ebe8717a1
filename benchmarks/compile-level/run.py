"""What LLVM's optimisation level costs a static study on simulated CPU devices.

The static objective compiles each candidate for XLA:CPU only to read the
program: its optimized HLO (what the hardware model prices), XLA's memory
analysis (what the budget is checked against) and its cost analysis. Nothing
runs. LLVM comes after XLA's HLO passes and buffer assignment, so its level
should change none of that, only the time to compile; the search therefore
compiles such programs at `xla_backend_optimization_level=0`
(`search.evaluation.evaluate.compiler_options`).

This script checks both claims on cpu-static64's programs: every expert plan
that applies to llama:7b and gpt:1.5b on dp=8,tp=8 and dp=16,tp=4 (64
simulated devices), compiled through the search's own wrapper at level 0
and at level 2 (XLA:CPU's default), interleaved: each round compiles every
plan at both levels, the order of the two alternating from round to round,
with JAX's in-memory caches cleared before each compile and its persistent
cache off. Every compile's HLO text, memory analysis and cost analysis are
compared with an untimed compile of the plan at level 2 made first (the HLO
text with the frames that traced the step, so all are made by the same line).

    python benchmarks/compile-level/run.py --rounds 5 \\
        --out benchmarks/results/compile-level/cpu-static64.md

Writes the table (per plan: median seconds at each level, the median of the
per-round ratios level 2 / level 0 with its 95% CI from order statistics,
and whether everything read was identical) and `<out>.json` with every
compile's seconds. Run with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PAIRS = (("llama:7b", "dp=8,tp=8"), ("llama:7b", "dp=16,tp=4"),
         ("gpt:1.5b", "dp=8,tp=8"), ("gpt:1.5b", "dp=16,tp=4"))
DEVICES = 64
LEVELS = {"O0": 0, "O2": 2}


def read(executable) -> tuple:
    """What the search reads of a compiled program, in comparable form."""
    m = executable.memory_analysis()
    memory = tuple(getattr(m, f) for f in ("argument_size_in_bytes", "output_size_in_bytes",
                                             "alias_size_in_bytes", "temp_size_in_bytes"))
    cost = executable.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return (hashlib.sha256(executable.as_text().encode()).hexdigest(), memory,
            tuple(sorted((k, float(v)) for k, v in (cost or {}).items())))


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """`--rounds` and `--out`, as this script and `emitters.py` take them."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True, help="the results table (.md)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give at least 1")
    return args


def expert_programs() -> list[tuple[str, Any, Any]]:
    """JAX set up for `DEVICES` simulated CPU devices, its persistent cache
    off, and `(label, static context, specs)` for every expert plan that
    applies to each of `PAIRS`."""
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_enable_compilation_cache", False)

    import shardsearch as ss
    from shardsearch.search import make_context
    from shardsearch.workloads import expert_plans, get_workload

    programs = []
    for name, mesh_text in PAIRS:
        mesh = ss.create_mesh(*ss.parse_mesh(mesh_text))
        workload = get_workload(name)
        ctx, _ = make_context(workload, None, mesh, objective="static", quiet=True)
        for plan_name, plan in expert_plans(workload, mesh).plans.items():
            programs.append((f"{name} {mesh_text} {plan_name}", ctx,
                             plan.specs(ctx.abstract_args, mesh)))
    return programs


def compile_once(ctx: Any, specs: Any, options: dict[str, Any]) -> tuple[float, Any]:
    """`(seconds, executable)`: the step compiled through the search's own
    wrapper with XLA `options`, JAX's in-memory caches cleared first. The
    one line every compile of both scripts is made by (the HLO text names
    the Python frames that traced the step)."""
    import jax
    from jax.sharding import PartitionSpec

    import shardsearch as ss

    monitored = ss.create_monitored_function(
        ctx.step, tuple(specs), ctx.analyzer, out_specs=(specs[0], PartitionSpec()),
        donate_argnums=(0,), compiler_options=options)
    jax.clear_caches()
    start = time.perf_counter()
    executable, _ = monitored.compile(*ctx.abstract_args)
    return time.perf_counter() - start, executable


def report_round(r: int, rounds: int, label: str, seconds: dict[str, list[float]]) -> None:
    """One progress line on stderr: the round's seconds per configuration."""
    print(f"round {r}/{rounds} {label}: "
          + ", ".join(f"{k} {s[-1]:.2f} s" for k, s in seconds.items()),
          file=sys.stderr, flush=True)


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that made a results file, as the file names it."""
    return f"python benchmarks/compile-level/{script} " + " ".join(
        sys.argv[1:] if argv is None else argv)


def write(args: argparse.Namespace, lines: list[str], record: dict[str, Any]) -> None:
    """The table to `--out` (and stdout), the compiles' record beside it as
    `<out>.json`."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.splitlines()[0])
    programs = expert_programs()

    import jax

    from shardsearch.search import median_ci

    # Round 0 is the reference: one untimed compile of each plan at level 2
    # (it also warms up what a first compile pays once per process). It is
    # made by the same line as the timed ones: the HLO text names the Python
    # frames that traced the step.
    reference: dict[str, tuple] = {}
    seconds = {label: {k: [] for k in LEVELS} for label, _, _ in programs}
    differs: dict[str, list[str]] = {label: [] for label, _, _ in programs}
    for r in range(args.rounds + 1):
        order = ["O2"] if r == 0 else list(LEVELS) if r % 2 else list(LEVELS)[::-1]
        for label, ctx, specs in programs:
            for key in order:
                took, executable = compile_once(
                    ctx, specs, {"xla_backend_optimization_level": LEVELS[key]})
                seen = read(executable)
                if r == 0:
                    reference[label] = seen
                    continue
                seconds[label][key].append(took)
                if seen != reference[label]:
                    differs[label].append(f"round {r} {key}")
            if r:
                report_round(r, args.rounds, label, seconds[label])

    command = command_line("run.py", argv)
    lines = [
        "# LLVM's level for programs compiled only to be read: cpu-static64's expert plans",
        "", f"Command: `{command}`", "",
        f"{len(programs)} programs (every expert plan that applies, on {DEVICES} simulated "
        f"CPU devices), each compiled {args.rounds} times at each level, interleaved (the "
        "order alternating per round), JAX's caches cleared before every compile and its "
        "persistent cache off; jax " + jax.__version__ + ". *same*: every compile's "
        "optimized HLO text, memory analysis (arguments, outputs, aliased, temporaries) "
        "and cost analysis equal to an untimed compile of the plan at level 2 made "
        "first. *O2 / O0*: the median of the per-round ratios, with its 95% CI (order "
        "statistics; the full range under 6 rounds).", "",
        "| program | O2 s (median) | O0 s (median) | O2 / O0 [95% CI] | same |",
        "|---|---|---|---|---|"]
    totals = {k: 0.0 for k in LEVELS}
    for label, _, _ in programs:
        s = seconds[label]
        ratios = [a / b for a, b in zip(s["O2"], s["O0"], strict=True)]
        lo, hi = median_ci(ratios)
        for k in LEVELS:
            totals[k] += statistics.median(s[k])
        lines.append(f"| {label} | {statistics.median(s['O2']):.2f} | "
                     f"{statistics.median(s['O0']):.2f} | {statistics.median(ratios):.2f}x "
                     f"[{lo:.2f}–{hi:.2f}] | "
                     f"{'yes' if not differs[label] else 'NO: ' + ', '.join(differs[label])} |")
    same = sum(not d for d in differs.values())
    lines += ["", f"Sum of the medians: O2 {totals['O2']:.1f} s, O0 {totals['O0']:.1f} s "
                  f"({totals['O2'] / totals['O0']:.2f}x). Identical reads: {same} of "
                  f"{len(programs)} programs.", ""]
    write(args, lines, {"command": command, "jax": jax.__version__, "rounds": args.rounds,
                        "seconds": seconds, "differs": differs})
    return 0 if same == len(programs) else 1


if __name__ == "__main__":
    sys.exit(main())
