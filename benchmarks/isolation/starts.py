"""What starting an isolated worker costs: forked from the helper that has
imported JAX (the default on Linux) against a new `python -c` interpreter
(`SHARDSEARCH_FORK_WORKERS=0`).

Each round runs both modes, in an order that alternates between rounds, each
in a fresh Python process: there, `--studies` contexts are made one after
another (`make_context(..., isolate=True)` on mlp:tiny), and each one's
worker is started (`ctx.executor.start()`: the worker loads the study and
says it is ready) and closed. The first start of a process includes the
helper's start when forking; the later ones are what a restart after a
failed candidate, or the next study in a notebook, costs.

Usage (from the repository root, nothing else running):
    python benchmarks/isolation/starts.py [--rounds 5] [--studies 4]

Prints one table (medians over the rounds, seconds) and the raw seconds as
JSON; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(studies: int) -> list[float]:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import shardsearch as ss
    from shardsearch.search import make_context
    from shardsearch.workloads import get_workload

    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    workload = get_workload("mlp:tiny")
    seconds = []
    for _ in range(studies):
        ctx, _ = make_context(workload, None, mesh, isolate=True)
        with ctx:
            start = time.perf_counter()
            if not ctx.executor.start():
                raise SystemExit("the worker did not start")
            seconds.append(time.perf_counter() - start)
    return seconds


def run_mode(fork: bool, studies: int) -> list[float]:
    env = {**os.environ, "SHARDSEARCH_FORK_WORKERS": "1" if fork else "0"}
    done = subprocess.run([sys.executable, __file__, "--child", str(studies)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the {'forked' if fork else 'python -c'} run failed:\n"
                         f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--studies", type=int, default=4)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    raw: dict[str, list[list[float]]] = {"forked": [], "python -c": []}
    for r in range(args.rounds):
        for fork in ((True, False) if r % 2 == 0 else (False, True)):
            raw["forked" if fork else "python -c"].append(run_mode(fork, args.studies))
    print(f"worker start, seconds (median over {args.rounds} rounds; mlp:tiny, 8 CPU devices)")
    print("| mode | first start in the process | later starts |")
    print("|---|---|---|")
    for mode, runs in raw.items():
        first = statistics.median(run[0] for run in runs)
        later = statistics.median(s for run in runs for s in run[1:])
        print(f"| {mode} | {first:.2f} | {later:.3f} |")
    print(json.dumps(raw))


if __name__ == "__main__":
    main()
