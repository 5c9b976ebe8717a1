"""What one search over several processes costs: the same measured search of a
workload on one 8-device mesh, run in one process (8 simulated CPU devices)
and in 2 processes x 4 devices joined over loopback (`shardsearch launch`).

Both runs use the same seed, so they propose the same candidates while the
sampler is still in its random start-up (the first 10 searched trials); the
table says how many fingerprints the two runs share. For each run it reports
the wall time, and per evaluated trial (compiled here, not a cache hit) the
median of: the trial's seconds (proposal to record), its compile seconds, its
steps (the median step times warmup + repeats), and the rest: trial - compile
- steps, where the lockstep's cost shows (publishing the job, the agreement
before the first step, gathering the outcomes, and waiting for the slower
process).

Usage (from the repository root):
    python benchmarks/scale-out/run.py [--workload gpt:tiny] [--mesh dp=2,tp=4]
        [--trials 10] [--out benchmarks/results/scale-out]

Writes `lockstep-<workload>.json` (every number) and `lockstep-<workload>.md`
(the table and the commands) under --out. On a 2-core machine the two
processes share the cores, as the one process's 8 devices do; compare the
modes within one run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna


def command(mode: str, a: argparse.Namespace, folder: Path) -> list[str]:
    search = ["optimize", "--workload", a.workload, "--mesh", a.mesh, "--trials", str(a.trials),
              "--space", a.space, "--warmup", str(a.warmup), "--repeats", str(a.repeats),
              "--confirm-rounds", "0", "--quiet", "--no-compile-cache", "--seed", "0",
              "--storage", f"sqlite:///{folder / mode}.db", "--study", mode,
              "--out", str(folder / f"{mode}.json")]
    if mode == "one-process":
        return [sys.executable, "-m", "shardsearch", *search, "--devices", "8", "--no-isolate"]
    return [sys.executable, "-m", "shardsearch", "launch", "--processes", "2",
            "--devices-per-process", "4", "--", *search]


def one_mode(mode: str, a: argparse.Namespace, folder: Path) -> dict:
    argv = command(mode, a, folder)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{mode} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                         f"\n{done.stderr[-3000:]}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name=mode,
                               storage=f"sqlite:///{folder / mode}.db").get_trials()
    rows = []
    for t in trials:
        o = t.user_attrs.get("outcome") or {}
        if o.get("cache_hit") or not o.get("compile_seconds"):
            continue
        times = o.get("step_times") or []
        steps = statistics.median(times) * (a.warmup + len(times)) if times else 0.0
        rows.append({"number": t.number, "fingerprint": o["fingerprint"],
                     "status": o["status"], "seconds": t.user_attrs["seconds"],
                     "compile": o["compile_seconds"], "steps": steps,
                     "rest": t.user_attrs["seconds"] - o["compile_seconds"] - steps})
    return {"mode": mode, "command": " ".join(argv[1:]), "wall": wall, "trials": len(trials),
            "evaluated": rows}


def medians(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in ("seconds", "compile", "steps",
                                                                "rest")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="gpt:tiny")
    p.add_argument("--mesh", default="dp=2,tp=4")
    p.add_argument("--space", default="rules")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/scale-out")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_mode(mode, a, Path(tmp)) for mode in ("one-process", "two-processes")]
    shared = ({r["fingerprint"] for r in runs[0]["evaluated"]}
              & {r["fingerprint"] for r in runs[1]["evaluated"]})
    summary = {"workload": a.workload, "mesh": a.mesh, "trials": a.trials,
               "warmup": a.warmup, "repeats": a.repeats, "machine": platform.platform(),
               "cpus": __import__("os").cpu_count(), "shared_fingerprints": len(shared),
               "runs": runs,
               "medians": {r["mode"]: medians(r["evaluated"]) for r in runs}}
    one, two = (summary["medians"][m] for m in ("one-process", "two-processes"))
    summary["overhead_per_trial"] = two["rest"] - one["rest"]
    lines = [f"# One search over two processes: {a.workload} on {a.mesh}", "",
             f"{a.trials} trials, warmup {a.warmup}, repeats {a.repeats}, no confirmation; "
             f"{summary['cpus']} CPUs ({summary['machine']}). Evaluated trials share "
             f"{len(shared)} fingerprints between the two runs.", "",
             "| mode | wall s | evaluated | trial s | compile s | steps s | rest s |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        m = summary["medians"][r["mode"]]
        lines.append(f"| {r['mode']} | {r['wall']:.1f} | {len(r['evaluated'])} | "
                     f"{m['seconds']:.3f} | {m['compile']:.3f} | {m['steps']:.3f} | "
                     f"{m['rest']:.3f} |")
    lines += ["", f"Lockstep overhead per evaluated trial (median rest, two processes minus "
                  f"one): {summary['overhead_per_trial']:.3f} s.", "", "Commands:", ""]
    lines += [f"    {r['command']}" for r in runs]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = a.workload.replace(":", "-")
    (out / f"lockstep-{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / f"lockstep-{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
