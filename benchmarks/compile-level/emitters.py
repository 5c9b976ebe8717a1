"""XLA:CPU's fusion emitters for programs compiled only to be read.

After `run.py` showed that LLVM's level changes nothing the static search
reads, a profile of the -O0 compile (`perf record` of gpt:1.5b fsdp on 64
devices) put most of what was left in the fusion emitters
(`xla::cpu::FusionCompiler::Compile`, code generation for every fusion) and
little in XLA's HLO passes. XLA:CPU in jaxlib before 0.11 still has its legacy
emitters (`xla_cpu_use_fusion_emitters=false`, what the tests compile with),
which generate code more cheaply. Unlike LLVM's level, the choice reaches
back into the HLO pipeline: the fusions are formed a little differently, so
the program read is not byte-identical. This script measures what that costs
the search's reading and what it saves, on `run.py`'s 16 programs:

    python benchmarks/compile-level/emitters.py --rounds 6 \\
        --out benchmarks/results/compile-level/emitters-cpu-static64.md

Each round compiles every program through the search's own wrapper with the
search's options before (`xla_backend_optimization_level=0`, the new
emitters: "O0") and with the legacy emitters added ("O0 legacy"), the order
alternating per round, JAX's caches cleared before each compile and its
persistent cache off. Every compile is compared with an untimed compile of
the program at XLA's defaults made first: whether its optimized HLO text is
identical, the largest difference of its memory analysis (arguments,
outputs, aliased, temporaries) in bytes, and the relative difference of the
estimate `cpu-static64` scores it by (the `tpu` hardware model on the mesh,
`HardwareModel.estimate` of `ProgramCost.from_compiled`). Writes the table
and `<out>.json` with every compile's seconds. Run with nothing else on the
machine.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (
    DEVICES,
    command_line,
    compile_once,
    expert_programs,
    parse_args,
    read,
    report_round,
    write,
)

DEFAULTS = {"xla_backend_optimization_level": 2}  # XLA:CPU's own, as run.py spells them
CONFIGS = {"O0": {"xla_backend_optimization_level": 0},
           "O0 legacy": {"xla_backend_optimization_level": 0,
                         "xla_cpu_use_fusion_emitters": False}}
HARDWARE = "tpu"  # the model cpu-static64 estimates with


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.splitlines()[0])
    programs = expert_programs()

    import jax

    import shardsearch as ss
    from shardsearch.search import ProgramCost, median_ci

    model = ss.HARDWARE[HARDWARE]

    def measure(ctx, specs, options):
        took, executable = compile_once(ctx, specs, options)
        return took, read(executable), model.estimate(ProgramCost.from_compiled(executable))

    # Round 0: the reference, one untimed compile of each program at XLA's
    # defaults (level 2 named, as in run.py, and the new emitters), made by
    # the same line as the timed ones (the HLO text names the frames that
    # traced the step).
    reference: dict[str, tuple] = {}
    seconds = {label: {k: [] for k in CONFIGS} for label, _, _ in programs}
    # Per program and config: HLO identical in every round, the largest
    # memory difference in bytes, the largest relative estimate difference.
    agree = {label: {k: [True, 0, 0.0] for k in CONFIGS} for label, _, _ in programs}
    for r in range(args.rounds + 1):
        order = [None] if r == 0 else list(CONFIGS) if r % 2 else list(CONFIGS)[::-1]
        for label, ctx, specs in programs:
            for key in order:
                took, seen, estimate = measure(ctx, specs, CONFIGS.get(key, DEFAULTS))
                if r == 0:
                    reference[label] = (seen, estimate)
                    continue
                seconds[label][key].append(took)
                (text, memory, _cost), base = seen, reference[label]
                row = agree[label][key]
                row[0] = row[0] and text == base[0][0]
                row[1] = max(row[1], *(abs(a - b) for a, b in zip(memory, base[0][1],
                                                                 strict=True)))
                row[2] = max(row[2], abs(estimate - base[1]) / base[1])
            if r:
                report_round(r, args.rounds, label, seconds[label])

    command = command_line("emitters.py", argv)
    lines = [
        "# XLA:CPU's fusion emitters for programs compiled only to be read: "
        "cpu-static64's expert plans", "", f"Command: `{command}`", "",
        f"{len(programs)} programs (every expert plan that applies, on {DEVICES} simulated "
        f"CPU devices), each compiled {args.rounds} times with each configuration, "
        "interleaved (the order alternating per round), JAX's caches cleared before every "
        "compile and its persistent cache off; jax " + jax.__version__ + ". *O0*: LLVM at "
        "-O0 with XLA:CPU's default (new) fusion emitters, the static search's options "
        "before; *O0 legacy*: the same with `xla_cpu_use_fusion_emitters=false`. Compared "
        "with an untimed compile of the program at XLA's defaults made first: *HLO*: the "
        "optimized HLO text identical in every round; *memory Δ*: the largest difference "
        "of any memory-analysis field, bytes; *estimate Δ*: the largest relative "
        f"difference of the `{HARDWARE}` model's estimate. *O0 / O0 legacy*: the median of "
        "the per-round ratios, with its 95% CI (order statistics; the full range under "
        "6 rounds).", "",
        "| program | O0 s (median) | O0 legacy s (median) | O0 / O0 legacy [95% CI] | "
        "HLO (O0, legacy) | memory Δ (O0, legacy) | estimate Δ (O0, legacy) |",
        "|---|---|---|---|---|---|---|"]
    totals = {k: 0.0 for k in CONFIGS}
    for label, _, _ in programs:
        s, a = seconds[label], agree[label]
        ratios = [x / y for x, y in zip(s["O0"], s["O0 legacy"], strict=True)]
        lo, hi = median_ci(ratios)
        for k in CONFIGS:
            totals[k] += statistics.median(s[k])
        lines.append(
            f"| {label} | {statistics.median(s['O0']):.2f} | "
            f"{statistics.median(s['O0 legacy']):.2f} | {statistics.median(ratios):.2f}x "
            f"[{lo:.2f}–{hi:.2f}] | "
            + ", ".join("same" if a[k][0] else "differs" for k in CONFIGS) + " | "
            + ", ".join(str(a[k][1]) for k in CONFIGS) + " | "
            + ", ".join(f"{a[k][2]:.1e}" for k in CONFIGS) + " |")
    worst = {k: (max(a[k][1] for a in agree.values()), max(a[k][2] for a in agree.values()))
             for k in CONFIGS}
    lines += ["", f"Sum of the medians: O0 {totals['O0']:.1f} s, O0 legacy "
                  f"{totals['O0 legacy']:.1f} s ({totals['O0'] / totals['O0 legacy']:.2f}x). "
                  "Largest differences from XLA's defaults: "
              + "; ".join(f"{k} {m} bytes, estimate {e:.1e}" for k, (m, e) in worst.items())
              + ".", ""]
    write(args, lines, {"command": command, "jax": jax.__version__, "rounds": args.rounds,
                        "seconds": seconds, "agree": agree})
    return 0


if __name__ == "__main__":
    sys.exit(main())
