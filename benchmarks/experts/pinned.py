"""The expert plans with and without the batch of their activations pinned.

An expert plan gives the specs of the step's arguments; where the step names
its activations (the built-in transformers' residual stream, attention and
MLP points), the search now also runs it with their batch dim on the mesh
axes that split the batch (`act_batch`), as MaxText's `activation_batch`
rule does (`shardsearch.search.pin_batch`). This compiles every expert plan
of a static suite's entries both ways, as the suite's search does (its
hardware model, the static objective's cheap CPU compile), and tabulates
XLA's memory per device and the model's estimate:

    python benchmarks/experts/pinned.py cpu-static64 \\
        --out benchmarks/results/experts/cpu-static64.md

Each distinct (workload, mesh) of the suite once; entries that differ only
in their budget share it. The budget is the search's default (the hardware
model's memory, where it names one): a plan over it is shown as cut, with
the reason; a suite's own budget (16 GiB) is read off the memory column.
The compile seconds are printed, not compared.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def parse(argv: list[str] | None, description: str,
          extra: Callable[[argparse.ArgumentParser], None] = lambda p: None
          ) -> tuple[argparse.Namespace, Any]:
    """The arguments (a suite, `--out`, and what `extra` adds) and the suite,
    its CPU devices simulated; what this script and `searched.py` share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("suite")
    extra(parser)
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args(argv)

    from shardsearch.bench import load_suite, prepare_devices

    suite = load_suite(a.suite)
    prepare_devices(suite)
    return a, suite


def entry_context(suite: Any, entry: Any, budget: int | None = None) -> tuple[Any, Any, Any]:
    """`(context, workload, mesh)`: a static context for an entry, with the
    suite's hardware model (the search's default budget unless `budget`)."""
    from shardsearch.bench import entry_mesh
    from shardsearch.search import make_context
    from shardsearch.workloads import get_workload

    workload = get_workload(entry.workload_name)
    mesh = entry_mesh(suite, entry)
    ctx, _ = make_context(workload, None, mesh, objective="static", quiet=True,
                          hardware=entry.hardware or suite.hardware, memory_budget=budget)
    return ctx, workload, mesh


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that made a results file, as the file names it."""
    return " ".join(["python", f"benchmarks/experts/{script}",
                     *(sys.argv[1:] if argv is None else argv)])


def write(out: Path, lines: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    a, suite = parse(argv, __doc__.splitlines()[0])

    from shardsearch.search import baseline_candidates, evaluate, fingerprint, pin_batch, resolve

    lines = [f"# Expert plans with the batch of their activations pinned: `{a.suite}`", "",
             f"Command: `{command_line('pinned.py', argv)}`", "",
             "Per plan: XLA's total per device (arguments, outputs and temporaries, less what "
             "is aliased) and the suite's hardware model's estimate of a step, as the plan's "
             "specs alone leave the activations to XLA's propagation (*as specs*) and with "
             "`act_batch` on the batch's axes (*pinned*).", "",
             "| workload | mesh | plan | act_batch | as specs: GiB, s | pinned: GiB, s | "
             "estimate as specs / pinned |",
             "|---|---|---|---|---|---|---|"]
    seen = set()
    for entry in suite.entries:
        key = (entry.workload_name, entry.mesh)
        if key in seen:
            continue
        seen.add(key)
        ctx, workload, mesh = entry_context(suite, entry)
        args = ctx.abstract_args
        pinned = pin_batch(baseline_candidates(workload, mesh), ctx.builds, args,
                           dict(mesh.shape))
        for label, candidate in pinned.items():
            if label in ("replicated", "default") or not candidate.knobs:
                continue
            specs, fp = resolve(candidate, ctx)
            start = time.perf_counter()
            loose = evaluate(specs, fingerprint(specs), ctx, run=False)
            held = evaluate(specs, fp, ctx.with_setting(candidate.knobs), run=False)
            cells = []
            for outcome in (loose, held):
                total = outcome.memory.get("total")
                cells.append(f"{total / 2**30:.2f}, {outcome.value:.3g}"
                             if total is not None and outcome.value is not None
                             else f"{outcome.status.value}: {outcome.reason[:90]}")
            ratio = (f"{loose.value / held.value:.2f}x"
                     if loose.value is not None and held.value else "-")
            lines.append(f"| {entry.workload_name} | {entry.mesh} | {label} | "
                         f"{dict(candidate.knobs)['act_batch']} | {cells[0]} | {cells[1]} | "
                         f"{ratio} |")
            print(lines[-1], f"({time.perf_counter() - start:.0f} s)", flush=True)
    write(a.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
