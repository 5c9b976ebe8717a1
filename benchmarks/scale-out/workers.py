"""Many workers, one study: the static objective with 1 and with K workers
(`shardsearch optimize` processes) on one PostgreSQL study.

Each mode runs its workers on one study of its own, all started at once, and
counts the distinct candidates the study evaluated (fingerprints compiled,
not answered from another trial's record). The number compared is the wall
time, from the start of the processes, until the study held D distinct
candidates, D the smaller of the two modes' totals: the same work done, by
one worker or by K. Speedup = time with 1 worker / time with K.

Usage (from the repository root; a PostgreSQL database, as in docs/studies.md,
"K workers on one PostgreSQL study"):
    python benchmarks/scale-out/workers.py --storage postgresql://u:pw@127.0.0.1/db
        [--entry llama-7b-dp8-tp8] [--trials 24] [--workers 2]
        [--out benchmarks/results/scale-out]

The entry is one of the cpu-static64 suite's (workload, size, mesh, budget;
64 simulated CPU devices, the TPU model); each worker gets --trials / K trials
and its own seed. Writes `workers-<entry>.json` and `workers-<entry>.md`.
The storage URL is never written (its password hidden in what is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from shardsearch.bench import load_suite


def worker_command(entry, storage: str, study: str, trials: int, seed: int, out: Path):
    argv = [sys.executable, "-m", "shardsearch", "optimize",
            "--workload", f"{entry.workload}:{entry.size}", "--mesh", entry.mesh,
            "--devices", "64", "--objective", "static", "--hardware", "tpu",
            "--trials", str(trials), "--seed", str(seed), "--study", study,
            "--no-isolate", "--no-compile-cache", "--quiet", "--storage", storage,
            "--out", str(out)]
    if entry.budget:
        argv += ["--budget", str(entry.budget)]
    return argv


def run_mode(entry, storage: str, workers: int, trials: int, tag: str, folder: Path) -> dict:
    study = f"scale-out-{entry.id}-{workers}w-{tag}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    start = time.time()
    processes = [subprocess.Popen(
        worker_command(entry, storage, study, trials // workers, seed,
                       folder / f"{study}-{seed}.json"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for seed in range(workers)]
    for process in processes:
        _, err = process.communicate()
        if process.returncode:
            raise SystemExit(f"a worker failed ({process.returncode}):\n{err[-3000:]}")
    wall = time.time() - start
    loaded = optuna.load_study(study_name=study, storage=storage)
    done: list[float] = []  # seconds from start at which each distinct candidate was recorded
    seen: set[str] = set()
    pids: dict[int, int] = {}
    for trial in sorted(loaded.get_trials(), key=lambda t: t.datetime_complete or 0):
        owner = trial.user_attrs.get("owner") or {}
        pids[owner.get("pid")] = pids.get(owner.get("pid"), 0) + 1
        outcome = trial.user_attrs.get("outcome") or {}
        fp = outcome.get("fingerprint")
        if fp and not outcome.get("cache_hit") and fp not in seen:
            seen.add(fp)
            done.append(trial.datetime_complete.timestamp() - start)
    compiled = sum(1 for t in loaded.get_trials()
                   if (t.user_attrs.get("outcome") or {}).get("fingerprint")
                   and not t.user_attrs["outcome"].get("cache_hit"))
    return {"workers": workers, "study": study, "wall_seconds": wall,
            "trials": len(loaded.get_trials()), "trials_per_worker": sorted(pids.values()),
            "distinct_candidates": len(seen), "compiles": compiled,
            "seconds_to_each_distinct": done}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", required=True)
    p.add_argument("--entry", default="llama-7b-dp8-tp8")
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/scale-out")
    a = p.parse_args()
    entry = next(e for e in load_suite("cpu-static64").entries if e.id == a.entry)
    folder = Path(a.out)
    folder.mkdir(parents=True, exist_ok=True)
    tag = time.strftime("%Y%m%dT%H%M%S")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Other jobs on the machine take cores from the workers: say how busy it was.
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as scratch:  # the workers' plan files
        one = run_mode(entry, a.storage, 1, a.trials, tag, Path(scratch))
        load.append(os.getloadavg()[0])
        many = run_mode(entry, a.storage, a.workers, a.trials, tag, Path(scratch))
        load.append(os.getloadavg()[0])
    d = min(one["distinct_candidates"], many["distinct_candidates"])
    t1, tk = one["seconds_to_each_distinct"][d - 1], many["seconds_to_each_distinct"][d - 1]
    result = {
        "entry": entry.id, "workload": f"{entry.workload}:{entry.size}", "mesh": entry.mesh,
        "budget": entry.budget, "objective": "static", "trials": a.trials,
        "distinct_compared": d, "seconds_to_distinct": {"1": t1, str(a.workers): tk},
        "speedup": t1 / tk, "modes": [one, many],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(),
                    "load_average_1min": {"start": load[0], "between": load[1],
                                          "end": load[2]}},
        "command": (f"python benchmarks/scale-out/workers.py --storage postgresql://USER:***@HOST/DB"
                    f" --entry {entry.id} --trials {a.trials} --workers {a.workers}"),
    }
    (folder / f"workers-{entry.id}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# {a.workers} workers against 1 on one PostgreSQL study: {entry.id}", "",
        f"Static objective, {entry.workload}:{entry.size} on {entry.mesh} (64 simulated CPU "
        f"devices per worker, TPU model), {a.trials} trials split over the workers, on a "
        f"{os.cpu_count()}-core machine (1-minute load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} between the modes, {load[2]:.1f} at the end; the workers' own "
        f"processes count in it).", "",
        "| workers | wall s | trials | distinct candidates | compiles | s to "
        f"{d} distinct |", "|---|---|---|---|---|---|",
        *(f"| {m['workers']} | {m['wall_seconds']:.1f} | {m['trials']} | "
          f"{m['distinct_candidates']} | {m['compiles']} | "
          f"{m['seconds_to_each_distinct'][d - 1]:.1f} |" for m in (one, many)), "",
        f"Speedup to the same {d} distinct candidates: **{t1 / tk:.2f}x** with {a.workers} "
        "workers.", "", "Command:", "", f"    {result['command']}", ""]
    (folder / f"workers-{entry.id}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
