"""Searched trials against the best expert, with and without the baselines'
parameters recorded for TPE (`search/space/express.py`).

Runs one search per seed in a fresh process for each of two checkouts of
shardsearch, alternating (old, new, old, new, ...), and prints one line per
search: the best expert's and the best searched trial's value (the search's
own numbers: each candidate's median of its timed steps, or the static
estimate) and how many searched trials came within 5% of the best expert.

    python benchmarks/expressed/run.py --old /tmp/old --new . --seeds 0 1 2 \
        --workload gpt:tiny --mesh dp=2,tp=4 --trials 30 --objective measured

`--old` / `--new`: folders holding a `shardsearch` package (a worktree of
another commit, `git worktree add /tmp/old <commit>`); each search runs with
that folder as its working folder and first on `PYTHONPATH`, in-process (isolate=False), no
confirmation rounds, an in-memory study. Writes nothing; the results file
quotes what it printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ONE = r"""
import json, sys, time
import shardsearch as ss
ss.use_cpu_devices(8)
import optuna
from shardsearch.workloads import get_workload
optuna.logging.set_verbosity(optuna.logging.WARNING)
workload, mesh_text, seed, trials, objective = sys.argv[1:6]
sizes = dict(kv.split("=") for kv in mesh_text.split(","))
mesh = ss.create_mesh(tuple(int(v) for v in sizes.values()), tuple(sizes))
start = time.perf_counter()
result = ss.optimize(get_workload(workload), mesh=mesh, n_trials=int(trials),
                     objective=objective, seed=int(seed), quiet=True, isolate=False,
                     confirm_rounds=0, storage=optuna.storages.InMemoryStorage())
done = [r for r in result.trials if r.outcome.value is not None]
experts = {r.label: r.outcome.value for r in done
           if r.label not in ("search", "replicated", "default") and "~" not in r.label}
searched = [r.outcome.value for r in done if r.label == "search"]
best = min(experts.values())
print(json.dumps({
    "seed": int(seed), "best_expert": best, "best_expert_label": min(experts, key=experts.get),
    "best_searched": min(searched) if searched else None, "searched": len(searched),
    "within_5pct": sum(v <= best * 1.05 for v in searched),
    "baselines_with_params": sum(1 for r in result.trials if r.label != "search" and r.params),
    "seconds": round(time.perf_counter() - start, 1)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workload", default="gpt:tiny")
    parser.add_argument("--mesh", default="dp=2,tp=4")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--objective", default="measured")
    a = parser.parse_args()
    for seed in a.seeds:
        for name, folder in (("old", a.old), ("new", a.new)):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(folder), JAX_PLATFORMS="cpu")
            env.pop("XLA_FLAGS", None)
            # Run from the checkout: `python -c` puts the working folder first.
            out = subprocess.run([sys.executable, "-c", ONE, a.workload, a.mesh, str(seed),
                                  str(a.trials), a.objective], env=env, check=True,
                                 cwd=os.path.abspath(folder),
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
            row = json.loads(out)
            ratio = (row["best_expert"] / row["best_searched"] if row["best_searched"]
                     else float("nan"))
            expert = f"{row['best_expert_label']} {row['best_expert'] * 1e3:.3f}"
            searched = f"{row['best_searched'] * 1e3:.3f}"
            print(f"| {name} | {seed} | {expert} | {searched} | {ratio:.3f} | "
                  f"{row['within_5pct']} of {row['searched']} | "
                  f"{row['baselines_with_params']} | {row['seconds']} |", flush=True)


if __name__ == "__main__":
    main()
