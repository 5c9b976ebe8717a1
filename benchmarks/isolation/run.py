"""What isolated evaluation costs: the same candidates evaluated in-process and in a worker.

For each mode, in a fresh Python process (so neither inherits the other's
compile caches): `make_context` (with isolation: the step exported, the host
arguments saved), then every baseline of the workload evaluated twice with
the measured objective: a cold round (each candidate compiled for the first
time) and a warm round (the same specs again: JAX's in-memory caches serve
the compile, in the worker as here). The worker starts on the first
evaluation, so the first candidate's time includes its start.

Usage (from the repository root):
    python benchmarks/isolation/run.py [--workload mlp:tiny] [--mesh 2,4]

Prints one table; nothing is written. Timings are wall-clock on this
machine, noisy on a busy one: compare the modes within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def one_mode(workload_name: str, dims: tuple[int, ...], isolate: bool) -> dict:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import shardsearch as ss
    from shardsearch.search import baseline_candidates, evaluate, make_context, resolve
    from shardsearch.workloads import get_workload

    names = ("dp", "tp", "pp")[: len(dims)]
    mesh = ss.create_mesh(dims, names)
    workload = get_workload(workload_name)
    start = time.perf_counter()
    ctx, _ = make_context(workload, None, mesh, isolate=isolate)
    setup = time.perf_counter() - start
    rounds = []
    with ctx:
        candidates = baseline_candidates(workload, mesh)
        for _round in range(2):
            seconds = {}
            for label, candidate in candidates.items():
                specs, fp = resolve(candidate, ctx)
                if specs is None:
                    continue
                start = time.perf_counter()
                outcome = evaluate(specs, fp, ctx)
                seconds[label] = (time.perf_counter() - start, outcome.status.value)
            rounds.append(seconds)
    return {"setup": setup, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp:tiny")
    parser.add_argument("--mesh", default="2,4", help="axis sizes, e.g. 2,4")
    parser.add_argument("--mode", choices=("here", "worker"), help=argparse.SUPPRESS)
    a = parser.parse_args()
    dims = tuple(int(d) for d in a.mesh.split(","))
    if a.mode is not None:
        print(json.dumps(one_mode(a.workload, dims, a.mode == "worker")))
        return
    found = {}
    for mode in ("here", "worker"):
        out = subprocess.run([sys.executable, __file__, "--workload", a.workload, "--mesh",
                              a.mesh, "--mode", mode], capture_output=True, text=True,
                             check=True)
        found[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    here, worker = found["here"], found["worker"]
    print(f"{a.workload} on mesh {a.mesh}, measured objective (2 warm-ups, 7 repeats)")
    print(f"make_context: {here['setup']:.2f} s in-process, {worker['setup']:.2f} s "
          "isolated (export + saving the arguments)")
    for i, title in enumerate(("cold (compiled here)", "warm (compile cached)")):
        print(f"\n{title}")
        print(f"{'candidate':<14}{'in-process s':>14}{'isolated s':>12}{'extra s':>10}")
        extras = []
        for n, (label, (t_here, status)) in enumerate(here["rounds"][i].items()):
            t_worker, status_w = worker["rounds"][i][label]
            note = "" if status == status_w == "complete" else f"  ({status}/{status_w})"
            first = " (worker start)" if i == 0 and n == 0 else ""
            if not first:
                extras.append(t_worker - t_here)
            print(f"{label:<14}{t_here:>14.3f}{t_worker:>12.3f}{t_worker - t_here:>10.3f}"
                  f"{first}{note}")
        print(f"median extra per candidate: {statistics.median(extras):.3f} s")


if __name__ == "__main__":
    main()
