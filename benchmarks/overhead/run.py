"""Where a search's trial time goes: compile, timed steps, and the rest.

Runs the README's main job in a fresh temporary folder, so that it gets a
fresh study and an empty compilation cache:

    shardsearch optimize --workload gpt:tiny --mesh dp=2,tp=4 --devices 8 --trials 20 --quiet

then reads the study back (`./.shardsearch/studies.db` in that folder) and
splits the time of its evaluated trials (cache hits left out):

  trial time  = the trials' "seconds" (wall time from proposal to record);
  compile     = the outcomes' `compile_seconds` (lowering, which traces the
                step, and XLA's compile: `monitor.compile_within` times both);
  timed steps = the outcomes' `step_times`;
  other       = trial time - compile - timed steps.

The warm-up steps (2 per measured candidate) are not in `step_times`, so they
are in "other"; the report gives the split both ways, warm-ups in "other"
(the definition above) and counted with the timed steps, taking them from
the outcomes' `warmup_times` (recorded since commit 5ac59d6) or else from
the timers. With `--trace` one more run has wall-clock timers on the
functions of the pipeline (`hook/sitecustomize.py`, in the study process and
in its worker), and the report splits "other" into where it went.

Usage (from the repository root):
    python benchmarks/overhead/run.py [--runs 2] [--trace] [--no-isolate] [--job ARGS]

`--job` runs another command than the README's job (its arguments as one
string, with `--trials` and `--quiet`), e.g. a search on a TPU host's chip.

Prints the split and writes it to benchmarks/overhead/results.md (`--out`).
Timings are wall-clock and noisy on a busy machine; the file gives the load
average before and after each run. The timers cost a little themselves
(one Python call per timed function call): compare the untraced runs'
split with the traced one's.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = ["optimize", "--workload", "gpt:tiny", "--mesh", "dp=2,tp=4", "--devices", "8",
       "--trials", "20", "--quiet"]

# Where "other" went, as the timers name it: (label, the last link of the timers'
# keys, or links, and whether it runs in the executor's job or the study process).
# The keys are chains of nested timed calls (`hook/sitecustomize.py`); a part's
# time is the sum over its calls inside the evaluated trials' windows.
PARTS = [
    ("warm-up step 1 (first run of the new executable)",
     "monitored call (first, outside repeat)", "job"),
    ("warm-up steps 2+", "monitored call (outside repeat)", "job"),
    ("HLO analysis (`ProgramCost.from_compiled`: the text parsed for flops and "
     "collectives, XLA's memory and cost analyses)", "ProgramCost.from_compiled", "job"),
    ("pruning round trip after each timed step (`Trial.report`, `should_prune`: "
     "SQLite, and the pipe)", "on_repeat (report round trip)", "job"),
    ("proposal (`SearchSpace.suggest`: TPE, a storage write per parameter)",
     "SearchSpace.suggest", "study"),
    ("the monitored wrapper's own time around each timed step (signature, "
     "`device_put` of placed arrays)", "monitored call (repeat) minus execution_time", "job"),
    ("`jax.clear_caches` (every 20 compiles)", "clear_caches", "job"),
    ("placing the arguments (`device_put` of the host arrays)", "place", "job"),
    ("stage 1 (`check`) and `resolve`", ("check", "resolve"), "study"),
    ("compile claim (`CompileClaims.acquire`: an SQLite insert)", "CompileClaims.acquire",
     "study"),
    ("NaN checks after warm-ups and steps (`check_finite`)", "check_finite", "job"),
    # Inside the executor's call, once per knob setting (with the activation
    # pins, most candidates bring one): not transport.
    ("a knob setting's step packed for the worker (`package_step`: traced, exported or "
     "hashed)", "package_step", "study"),
    ("a knob setting's step rebuilt in the worker (`worker._step`: traced, its jaxpr hashed "
     "and checked; the setting's first compile reuses the trace)", "_step", "job"),
]
# The parts above that run inside the executor's call, taken out of "worker transport".
IN_EXECUTOR = ("package_step", "_step")


def run_job(trials: int, isolate: bool, trace: bool, job: list[str] = JOB) -> dict:
    """One run of the job in a fresh folder: wall time, study name, trial attributes,
    and the timers' dumps when traced."""
    import optuna

    with tempfile.TemporaryDirectory(prefix="shardsearch-overhead-") as folder:
        argv = [sys.executable, "-m", "shardsearch", *job_args(trials, isolate, job)]
        env = dict(os.environ)
        if trace:
            traces = Path(folder) / "trace"
            traces.mkdir()
            env["OVERHEAD_TRACE"] = str(traces)
            env["PYTHONPATH"] = os.pathsep.join(
                [str(HERE / "hook")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p])
        load = os.getloadavg()[0]
        start = time.perf_counter()
        subprocess.run(argv, cwd=folder, check=True, env=env, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        storage = f"sqlite:///{folder}/.shardsearch/studies.db"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        (summary,) = optuna.get_all_study_summaries(storage)
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        attrs = [t.user_attrs for t in study.get_trials(deepcopy=False)]
        dumps = ([json.loads(p.read_text()) for p in sorted(traces.glob("*.json"))]
                 if trace else [])
    return {"wall": wall, "study": summary.study_name, "trials": attrs, "dumps": dumps,
            "load": (load, os.getloadavg()[0])}


def job_args(trials: int, isolate: bool, job: list[str] = JOB) -> list[str]:
    args = list(job)
    args[args.index("--trials") + 1] = str(trials)
    return args + ([] if isolate else ["--no-isolate"])


def split(trials: list[dict]) -> dict:
    """The split of the evaluated trials' time (module docstring). "warmups" is
    the warm-up steps' execution time where the outcomes record it
    (`warmup_times`), else None."""
    evaluated = [t for t in trials if "outcome" in t and not t["outcome"].get("cache_hit")]
    total = sum(t.get("seconds", 0.0) for t in evaluated)
    compile_ = sum(t["outcome"].get("compile_seconds", 0.0) for t in evaluated)
    steps = sum(sum(t["outcome"].get("step_times", ())) for t in evaluated)
    recorded = any("warmup_times" in t["outcome"] for t in evaluated)
    warmups = (sum(sum(t["outcome"].get("warmup_times", ())) for t in evaluated)
               if recorded else None)
    return {"evaluated": len(evaluated), "trials": len(trials), "total": total,
            "compile": compile_, "steps": steps, "other": total - compile_ - steps,
            "warmups": warmups}


def breakdown(dumps: list[dict]) -> dict:
    """Seconds per part of "other" (`PARTS`) over the evaluated trials, from the
    timers: a trial is the study process's `_Runner._one` call, evaluated when
    a `compile_and_score` ran inside it (in either process)."""
    events = [e for d in dumps for e in d["events"]]
    study = next(d for d in dumps if d["role"] == "study")
    windows = [(s, s + t) for k, s, t in study["events"] if k.endswith("_Runner._one")]
    parts: collections.Counter = collections.Counter()
    evaluated = 0
    for lo, hi in windows:
        inside = [(k, t) for k, s, t in events if s >= lo - 1e-3 and s + t <= hi + 1e-3]
        if not any(k.endswith("compile_and_score") for k, _ in inside):
            continue
        evaluated += 1
        for key, seconds in inside:
            last = key.split("/")[-1]
            parts["compile_and_score"] += seconds * (last == "compile_and_score")
            parts["compile_within"] += seconds * (last == "compile_within"
                                                  and "compile_and_score" in key)
            parts["steps"] += seconds * (last == "monitored call (repeat)")
            parts["steps-wrapper"] += seconds * (
                last == "monitored call (repeat) minus execution_time")
            parts["warmup-calls"] += seconds * (
                last in ("monitored call (first, outside repeat)",
                         "monitored call (outside repeat)") and "time_steps" in key)
            parts["warmup-wrapper"] += seconds * (
                last in ("monitored call (first, outside repeat) minus execution_time",
                         "monitored call (outside repeat) minus execution_time")
                and "time_steps" in key)
            parts["Trial.report+should_prune"] += seconds * (
                last in ("Trial.report", "Trial.should_prune"))
            parts["executor"] += seconds * (last in ("Isolation.evaluate", "InProcess.evaluate"))
            parts["shared trace"] += seconds * (last == "_shared_trace" and "check" in key)
            parts["in-process candidates"] += last == "InProcess.evaluate"
            for label, suffix, _where in PARTS:
                if last in ((suffix,) if isinstance(suffix, str) else suffix) and not any(
                        x in key for x in ("retime", "compare", "first_steps")):
                    parts[label] += seconds
    parts["steps"] -= parts["steps-wrapper"]  # the execution times: `step_times`
    # The warm-ups' execution times, as `step_times` counts the timed steps'.
    parts["warmups"] = parts["warmup-calls"] - parts["warmup-wrapper"]
    return {"evaluated": evaluated, "parts": dict(parts),
            "missing": sorted({m for d in dumps for m in d["missing"]})}


def warmups_of(run: dict) -> tuple[float | None, str]:
    """The run's warm-up seconds (execution only, as `step_times`) and where
    they came from: the outcomes, the timers, or nowhere."""
    if run["split"]["warmups"] is not None:
        return run["split"]["warmups"], "outcomes"
    if "breakdown" in run:
        return run["breakdown"]["parts"].get("warmups", 0.0), "timers"
    return None, ""


def code_under_test() -> str:
    """Which shardsearch the job ran: its folder, and the commit when it is a checkout."""
    where = "import shardsearch; print(shardsearch.__file__)"
    found = subprocess.run([sys.executable, "-c", where], capture_output=True, text=True,
                           check=True).stdout.strip()
    folder = Path(found).parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--",
                                "shardsearch"], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"`{folder}` (not a git checkout)"
    return f"`{folder}` at commit {commit}" + (" with uncommitted changes" if dirty else "")


def report(runs: list[dict], isolate: bool) -> str:
    job = runs[0].get("job", JOB)
    cmd = "shardsearch " + shlex.join(job_args(runs[0]["trials_asked"], isolate, job))
    flags = (" --no-isolate" if not isolate else "") + (
        f" --job {shlex.quote(shlex.join(job))}" if job != JOB else "")
    lines = [
        "# Trial time outside compile and timed steps",
        "",
        f"Written by `python benchmarks/overhead/run.py{flags}`"
        f" on {datetime.date.today().isoformat()}: the job `{cmd}`, each run in a fresh "
        "temporary folder (fresh study, empty compilation cache). Trial time, compile and "
        "timed steps are the study's (`seconds`, `compile_seconds`, `step_times` of the "
        "evaluated trials); other = trial time - compile - timed steps.",
        "",
        f"Code: {code_under_test()}.",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}. The load average before and after each run is in "
        f"the table: above {os.cpu_count()}, other work shared the cores and every time "
        "here is longer than on an idle machine.",
        "",
        "| run | evaluated trials | trial time s | compile | timed steps | warm-up steps "
        "| other | other, warm-ups counted as steps | wall s | load before / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        s = r["split"]
        total = s["total"]
        warm, source = warmups_of(r)
        warm_cell = f"{warm:.2f} s ({pct(warm, total)}, {source})" if warm is not None else \
            "not recorded"
        both = pct(s["other"] - warm, total) if warm is not None else "-"
        lines.append(
            f"| {i}{' (traced)' if r['traced'] else ''} | {s['evaluated']} of {s['trials']} "
            f"| {total:.2f} | {s['compile']:.2f} s ({pct(s['compile'], total)}) "
            f"| {s['steps']:.2f} s ({pct(s['steps'], total)}) | {warm_cell} "
            f"| {s['other']:.2f} s (**{pct(s['other'], total)}**) | {both} | {r['wall']:.1f} "
            f"| {r['load'][0]:.2f} / {r['load'][1]:.2f} |")
    plain = [r["split"] for r in runs if not r["traced"]]
    if len(plain) > 1:
        shares = [100 * s["other"] / s["total"] for s in plain]
        lines += ["", f"Other over the untraced runs: median {statistics.median(shares):.1f}% "
                      f"(from {min(shares):.1f}% to {max(shares):.1f}%)."]
    traced = [r for r in runs if r["traced"]]
    if traced:
        lines += ["", *traced_report(traced[-1])]
    return "\n".join(lines) + "\n"


def traced_report(run: dict) -> list[str]:
    s, b = run["split"], run["breakdown"]
    parts = b["parts"]
    total, other = s["total"], s["other"]
    ranked = sorted(((label, parts.get(label, 0.0)) for label, *_ in PARTS),
                    key=lambda x: -x[1])
    named = sum(v for _, v in ranked)
    transport = parts.get("executor", 0.0) - parts.get("compile_and_score", 0.0) - sum(
        parts.get(label, 0.0) for label, suffix, _ in PARTS if suffix in IN_EXECUTOR)
    lines = [
        "## Where \"other\" goes (the traced run)",
        "",
        f"{b['evaluated']} evaluated trials, trial time {total:.2f} s, other {other:.2f} s "
        f"({pct(other, total)}). As the timers saw them: compile "
        f"{parts.get('compile_within', 0.0):.2f} s (the outcomes say {s['compile']:.2f} s), "
        f"timed steps {parts.get('steps', 0.0):.2f} s (the outcomes say {s['steps']:.2f} s). "
        "A warm-up step's time below is the whole call through the monitored wrapper.",
        "",
        "| part of \"other\" | s | % of trial time |",
        "|---|---|---|",
    ]
    for label, seconds in ranked:
        lines.append(f"| {label} | {seconds:.2f} | {pct(seconds, total)} |")
    lines += [
        f"| worker transport (the executor's call minus the job it ran and the steps "
        f"packed and rebuilt: pipes, pickling, the log read; 0 in-process) "
        f"| {transport:.2f} | {pct(transport, total)} |",
        f"| not named above (the study process's own steps between them, the timers) "
        f"| {other - named - transport:.2f} | {pct(other - named - transport, total)} |",
        "",
        f"Of the pruning round trips, the study process's `Trial.report` and "
        f"`Trial.should_prune` took {parts.get('Trial.report+should_prune', 0.0):.2f} s.",
    ]
    shared = parts.get("shared trace", 0.0)
    if shared:
        said = (f"Of stage 1, {shared:.2f} s ({pct(shared, total)}) is its trace of the step "
                "(`jax.make_jaxpr`, once per knob setting, for the memory prediction). ")
        if parts.get("in-process candidates"):
            warm = warmups_of(run)[0]
            said += ("The candidates ran in the study process, so their compiles reused "
                     "that trace instead of tracing the step themselves, as they did inside "
                     "`compile_seconds` before commit 6dc7562: counted as compile, other is "
                     f"{pct(other - shared, total)}"
                     + (f" ({pct(other - shared - warm, total)} with the warm-ups counted as "
                        "steps)" if warm is not None else "") + ".")
        else:
            said += ("The candidates ran in an isolated worker, which traces the step "
                     "again when it rebuilds a knob setting's step (`worker._step`, above; "
                     "that setting's first compile reuses its trace): here stage 1's trace "
                     "is overhead.")
        lines += ["", said]
    if b["missing"]:
        lines += ["", "Timers that found no function to wrap (renamed?): "
                      + ", ".join(f"`{m}`" for m in b["missing"])]
    return lines


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1, help="untraced runs")
    parser.add_argument("--trace", action="store_true",
                        help="one more run with the timers, to split \"other\"")
    parser.add_argument("--no-isolate", dest="isolate", action="store_false",
                        help="evaluate in the study process (the job's --no-isolate)")
    parser.add_argument("--out", default=str(HERE / "results.md"))
    parser.add_argument("--job", type=shlex.split, default=JOB,
                        help="the command's arguments instead of the README's job (give "
                             "--trials and --quiet in it), e.g. on a TPU host \"optimize "
                             "--workload gpt:small --mesh dp=1 --knobs --trials 20 --quiet\"")
    a = parser.parse_args()
    runs = []
    for traced_run in [False] * a.runs + [True] * a.trace:
        found = run_job(a.trials, a.isolate, traced_run, a.job)
        run = {"wall": found["wall"], "load": found["load"], "split": split(found["trials"]),
               "traced": traced_run, "trials_asked": a.trials, "job": a.job}
        if traced_run:
            run["breakdown"] = breakdown(found["dumps"])
            seen, evaluated = run["breakdown"]["evaluated"], run["split"]["evaluated"]
            if seen != evaluated:  # every part would read 0, or be short
                raise SystemExit(
                    f"the timers saw {seen} evaluated trials of the study's {evaluated}: "
                    "hook/sitecustomize.py did not time the process that evaluated them "
                    "(started in a way it does not know?); dumps of "
                    f"{sorted(d['role'] for d in found['dumps'])}")
        runs.append(run)
        s = run["split"]
        print(f"{'traced ' if traced_run else ''}run: {s['evaluated']} evaluated trials, "
              f"{s['total']:.2f} s: compile {pct(s['compile'], s['total'])}, timed steps "
              f"{pct(s['steps'], s['total'])}, other {s['other']:.2f} s "
              f"({pct(s['other'], s['total'])}); load {run['load'][0]:.2f} -> "
              f"{run['load'][1]:.2f}", flush=True)
    text = report(runs, a.isolate)
    Path(a.out).write_text(text)
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
