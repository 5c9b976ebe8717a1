"""Fidelity study: how well the static cost models rank plans they never ran.

For each workload and mesh (by default every (workload, mesh) pair of the
`cpu-sim8` suite; its budget variants do not matter here):

1. Candidates. The baseline plans (`baseline_candidates`, as `optimize`
   warm-starts) plus `--candidates` DISTINCT fingerprints drawn from the
   search space as `optimize` builds it (`make_space(..., space="both")`):
   every combination is enumerated (`SearchSpace.enumerate()`), each family's
   combinations are shuffled with `--seed` and taken in turn, one family after
   the other, so the sample holds the families alike (as the search's first,
   random trials do) instead of in proportion to their number of
   combinations; each is resolved to its fingerprint and kept when new.
2. Measurement (resumable). In a seeded shuffled order, so a slow drift of
   the machine does not follow the draw, each candidate is compiled ONCE
   (`shardsearch.bench.evaluate`, no memory budget) and scored by
   `EstimateThenMeasure`: every model's breakdown of the compiled program
   (`HardwareModel.breakdown`), then the measured objective's median step
   time (`--warmup` untimed, `--repeats` timed steps). Each result is
   appended to `<workload>-<mesh>.jsonl` as soon as it is measured; a killed
   run resumes where it stopped.
3. Report. Per entry and model: Kendall tau and Spearman between estimate
   and measurement (scipy.stats), the top-1 regret (measured time of the plan
   the estimate ranks first / best measured time) and the median ratio of
   estimate to measurement. For the calibrated model, the overlap rule
   (`Breakdown.overlap`) re-evaluated at 0, 0.25, 0.5, 0.75 and 1 from each
   candidate's breakdown (nothing recompiled); the study chooses the value
   with the best mean tau on the `--choose-on` entries (dp=2,tp=4) and
   reports the others as held out. Written to `--out`: `results.json` (every
   candidate's fingerprint, estimates, breakdowns and measurement),
   `results.md` (the tables and the command that produced them) and
   `estimate-vs-measured.png` (log-log, one panel per model; needs
   matplotlib).

Models: "default" is the built-in CPU model (`HARDWARE["cpu"]`); with
`--calibration DIR`, "calibrated" is `DIR/cpu-<mesh>.json` (`shardsearch
calibrate` writes e.g. `cpu-dp2-tp4.json` for dp=2,tp=4), one per mesh.

Run from the repository root (the default `--out` is relative to it), with
nothing else running:

    python benchmarks/fidelity/run.py --calibration /work/calib      # ~hours on 2 cores
    python benchmarks/fidelity/run.py --report-only --calibration /work/calib
    python benchmarks/fidelity/run.py --workloads gpt:tiny --meshes dp=2,tp=4 \\
        --candidates 5 --repeats 1 --out /tmp/fidelity                # a quick check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from shardsearch import HARDWARE, HardwareModel, Objective, create_mesh, parse_mesh
from shardsearch.bench import load_suite, machine_info, prepare_devices
from shardsearch.search import (
    Topology,
    baseline_candidates,
    evaluate,
    get_objective,
    make_context,
    make_space,
    resolve,
)
from shardsearch.workloads import get_workload

SCHEMA = 1
OVERLAPS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""The overlap rule's values the study compares for the calibrated model."""
DEFAULT, CALIBRATED = "default", "calibrated"
# The targets for the calibrated model on every cpu-sim8 workload.
TARGET_TAU, TARGET_REGRET = 0.85, 1.05


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="cpu-sim8",
                   help="the suite whose (workload, mesh) pairs are studied (cpu-sim8)")
    p.add_argument("--workloads", help="comma-separated built-in workloads, e.g. gpt:tiny "
                   "(default: the suite's); with --meshes, every workload on every mesh")
    p.add_argument("--meshes", nargs="+", metavar="MESH",
                   help="meshes such as dp=8 dp=2,tp=4 (default: the suite's)")
    p.add_argument("--calibration", metavar="DIR",
                   help="folder of calibrated models, cpu-<mesh>.json (e.g. cpu-dp2-tp4.json);"
                   " without it only the default model is studied")
    p.add_argument("--candidates", type=int, default=40,
                   help="distinct searched candidates per entry, besides the baselines (40)")
    p.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                   help="also study the baseline plans (default: yes)")
    p.add_argument("--repeats", type=int, default=7, help="timed steps per candidate (7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per candidate (2)")
    p.add_argument("--seed", type=int, default=0,
                   help="the draw's and the order's seed; also the workloads' (0)")
    p.add_argument("--choose-on", default="dp=2,tp=4", metavar="MESH",
                   help="the overlap value is chosen on this mesh's entries; the others "
                        "are held out (dp=2,tp=4)")
    p.add_argument("--out", default="benchmarks/results/fidelity", help="results folder")
    p.add_argument("--fresh", action="store_true",
                   help="discard the recorded measurements of the selected entries")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing; rewrite the report from the recorded .jsonl files")
    a = p.parse_args(argv)
    if a.candidates < 0 or a.repeats < 1 or a.warmup < 0:
        p.error("--candidates and --warmup must be >= 0 and --repeats >= 1")
    start = time.perf_counter()
    try:
        suite = load_suite(a.suite)
        pairs = select_pairs(suite, a.workloads, a.meshes)
        for _name, mesh_text in pairs:
            dims, _names = parse_mesh(mesh_text)
            if math.prod(dims) != suite.devices:
                raise ValueError(f"mesh {mesh_text} has {math.prod(dims)} devices; the "
                                 f"suite {suite.name} simulates {suite.devices}")
        # A report from the logs needs no model: each log's header holds its own.
        models = {} if a.report_only else {
            mesh: load_models(a.calibration, mesh) for mesh in _unique(m for _w, m in pairs)}
        prepare_devices(suite)
    except (ValueError, OSError) as err:
        print(f"run.py: error: {err}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "benchmarks/fidelity/run.py", *sys.argv[1:]]
                       if argv is None else ["python", "benchmarks/fidelity/run.py", *argv])
    entries = []
    for name, mesh_text in pairs:
        log = out / f"{_slug(name)}-{_slug(mesh_text)}.jsonl"
        if a.report_only:
            if not log.is_file():
                print(f"run.py: error: no measurements {log}; run without --report-only "
                      "first", file=sys.stderr)
                return 2
            header, records = read_log(log)
        else:
            # As JSON gives it back, so a resumed run compares like with like.
            header = json.loads(json.dumps({
                "workload": name, "mesh": mesh_text, "repeats": a.repeats,
                "warmup": a.warmup, "seed": a.seed, "baselines": a.baselines,
                "models": {k: m.to_json() for k, m in models[mesh_text].items()}}))
            try:
                records = measure_entry(name, mesh_text, models[mesh_text], header, log, a,
                                        command)
            except ValueError as err:
                print(f"run.py: error: {err}", file=sys.stderr)
                return 2
        entries.append(summarize_entry(header, records))
    result = {"schema": SCHEMA, "study": "fidelity", "command": command,
              "machine": machine_info(command),
              # Under --report-only the measuring settings are each entry's own.
              "settings": {"suite": suite.name, "overlaps": list(OVERLAPS),
                           "choose_on": a.choose_on, "report_only": a.report_only,
                           **({} if a.report_only else {
                               "candidates": a.candidates, "baselines": a.baselines,
                               "repeats": a.repeats, "warmup": a.warmup, "seed": a.seed,
                               "calibration": a.calibration})},
              "entries": entries, "overlap": choose_overlap(entries, a.choose_on),
              "wall_seconds": time.perf_counter() - start}
    result["plot_note"] = plot(result, out / "estimate-vs-measured.png")
    _write_json(out / "results.json", result)
    (out / "results.md").write_text(report(result), encoding="utf-8")
    if result["plot_note"]:
        print(f"note: {result['plot_note']}", file=sys.stderr)
    for line in _one_lines(result):
        print(line)
    print(f"wrote {out / 'results.md'} ({result['wall_seconds']:.0f} s)")
    return 0


# --------------------------------------------------------------------------- inputs


def select_pairs(suite: Any, workloads: str | None,
                 meshes: list[str] | None) -> list[tuple[str, str]]:
    """The (workload, mesh) pairs to study, in the suite's order.

    Neither given: the suite's pairs. Both: every workload on every mesh.
    One: the other defaults to every value the suite uses.

    Example: cpu-sim8 with neither gives
    `[("mlp:small", "dp=8"), ("mlp:small", "dp=2,tp=4"), ...]` (7 pairs).
    """
    pairs = _unique((f"{e.workload}:{e.size}", e.mesh) for e in suite.entries)
    if workloads is None and meshes is None:
        return pairs
    names = ([w.strip() for w in workloads.split(",") if w.strip()] if workloads
             else _unique(w for w, _m in pairs))
    shapes = meshes or _unique(m for _w, m in pairs)
    for name in names:
        get_workload(name)  # an unknown name fails here, before any device starts
    return [(w, m) for w in names for m in shapes]


def load_models(folder: str | None, mesh_text: str) -> dict[str, HardwareModel]:
    """The models studied on a mesh: the default CPU model, and the calibrated one.

    Raises:
      ValueError: the calibration file is missing or malformed (naming it).
    """
    models = {DEFAULT: HARDWARE["cpu"]}
    if folder is not None:
        path = Path(folder) / f"cpu-{_slug(mesh_text)}.json"
        if not path.is_file():
            raise ValueError(f"no calibrated model for mesh {mesh_text}: {path} is missing; "
                             f"run `shardsearch calibrate --mesh {mesh_text} --devices 8 "
                             f"--out {path}`")
        models[CALIBRATED] = HardwareModel.load(path)
    return models


# --------------------------------------------------------------------------- scoring


@dataclasses.dataclass(frozen=True, eq=False)
class EstimateThenMeasure(Objective):
    """Each model's breakdown of the compiled program, then the measured score.

    One compile serves every model and the measurement. The breakdowns go to
    `estimates[fingerprint]` (a model that cannot cost the program records
    its error instead); the outcome is the measured objective's.

    Example:
      >>> scorer = EstimateThenMeasure((("default", HARDWARE["cpu"]),), Topology.of(mesh))
      >>> ctx, _ = make_context(workload, None, mesh, objective=scorer)
      >>> evaluate(specs, fp, ctx).value, scorer.estimates[fp]["default"]["seconds"]
    """

    name: ClassVar[str] = "fidelity-study"
    needs_host_args: ClassVar[bool] = True
    timed_in: ClassVar[str] = "search"

    models: tuple[tuple[str, HardwareModel], ...] = ()
    topology: Topology | None = None
    estimates: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def score(self, candidate: Any, ctx: Any, report: Any) -> Any:
        self.estimates[candidate.fingerprint] = {
            label: estimate(model, candidate.program, self.topology)
            for label, model in self.models}
        return get_objective("measured").score(candidate, ctx, report)


def estimate(model: HardwareModel, program: Any, topology: Any) -> dict[str, Any]:
    """A model's estimate of one program: its total, breakdown, and the total
    under each overlap of `OVERLAPS` (the same breakdown, the rule re-applied)."""
    start = time.perf_counter()
    try:
        breakdown = model.breakdown(program, topology)
    except Exception as err:  # a model that cannot cost a program is a finding, not a crash
        return {"error": f"{type(err).__name__}: {err}"}
    return {"seconds": breakdown.total, "breakdown": breakdown.to_json(),
            "by_overlap": {str(x): dataclasses.replace(breakdown, overlap=x).total
                           for x in OVERLAPS},
            "estimate_seconds": time.perf_counter() - start}


# --------------------------------------------------------------------------- measuring


def measure_entry(name: str, mesh_text: str, models: dict[str, HardwareModel],
                  header: dict[str, Any], log: Path, a: argparse.Namespace,
                  command: str = "") -> list[dict[str, Any]]:
    """Draws the entry's candidates and measures those not yet in `log`.

    Raises:
      ValueError: `log` was recorded with other settings or models (and no
        `--fresh`).
    """
    import jax

    if a.fresh and log.is_file():
        log.unlink()
    recorded, done = {}, {}
    if log.is_file():
        recorded, records = read_log(log)
        if {k: v for k, v in recorded.items() if k != "machine"} != header:
            raise ValueError(f"{log} was measured with other settings or models; pass "
                             "--fresh to start it over, or another --out")
        done = {r["fingerprint"]: r for r in records}
    dims, names = parse_mesh(mesh_text)
    mesh = create_mesh(dims, names, devices=jax.devices()[:math.prod(dims)])
    scorer = EstimateThenMeasure(tuple(models.items()), Topology.of(mesh))
    workload = get_workload(name)
    ctx, _ = make_context(workload, None, mesh, memory_budget=None, objective=scorer,
                          seed=a.seed, warmup=a.warmup, repeats=a.repeats)
    start = time.perf_counter()
    space = make_space(mesh, ctx.abstract_args[0], ctx.budget, space="both", step=ctx.step,
                       args=ctx.abstract_args)
    rng = random.Random(a.seed)
    baselines = (baseline_candidates(workload, mesh, None, space.logical) if a.baselines
                 else {})
    picked = draw(space, ctx, baselines, a.candidates, rng)
    searched = sum(c["labels"] == ["search"] for c in picked.values())
    print(f"{name} on {mesh_text}: {len(picked)} distinct candidates ({searched} searched, "
          f"space {space.space}; {time.perf_counter() - start:.0f} s to draw)", flush=True)
    # Shuffled, so a slow drift of the machine does not follow the draw's order.
    order = list(picked)
    rng.shuffle(order)
    with log.open("a", encoding="utf-8") as f:
        if not recorded:
            f.write(json.dumps({"header": {**header, "machine": machine_info(command)}})
                    + "\n")
        for i, fp in enumerate(order, 1):
            if fp in done:
                continue
            began = time.perf_counter()
            outcome = evaluate(picked[fp]["specs"], fp, ctx)
            record = {"fingerprint": fp, "labels": picked[fp]["labels"],
                      "params": picked[fp]["params"], "status": str(outcome.status),
                      "reason": outcome.reason or None, "median_seconds": outcome.value,
                      "step_times": list(outcome.step_times),
                      "compile_seconds": outcome.compile_seconds,
                      "memory_total": outcome.memory.get("total"),
                      "estimates": scorer.estimates.pop(fp, {}),
                      "wall_seconds": time.perf_counter() - began}
            done[fp] = record
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
            print(f"  [{i}/{len(order)}] {fp} {','.join(record['labels'])}: "
                  f"{_shown(record)} (compile {outcome.compile_seconds:.1f} s)", flush=True)
    return [done[fp] for fp in order if fp in done]


def draw(space: Any, ctx: Any, baselines: dict[str, Any], count: int,
         rng: random.Random) -> dict[str, dict[str, Any]]:
    """The baselines, then `count` new distinct fingerprints from the space.

    Each family's combinations (`family` parameter; one group for a space
    without it) are shuffled, and the families take turns, so each family
    gives about as many candidates as the other whatever its size. A
    combination the rules refuse, or whose fingerprint is already in, is
    skipped.

    Returns:
      fingerprint -> {"labels", "params" (None for a baseline), "specs"}.
    """
    import optuna

    picked: dict[str, dict[str, Any]] = {}
    for label, candidate in baselines.items():
        specs, fp = resolve(candidate, ctx)
        if specs is not None:
            picked.setdefault(fp, {"labels": [], "params": None, "specs": specs})
            picked[fp]["labels"].append(label)
    families: dict[str, list[dict[str, Any]]] = {}
    for params in space.enumerate():
        families.setdefault(str(params.get("family", "")), []).append(params)
    for combos in families.values():
        rng.shuffle(combos)
    queues = [iter(c) for c in families.values()]
    drawn = 0
    while drawn < count and queues:
        for queue in list(queues):
            params = next(queue, None)
            if params is None:
                queues.remove(queue)
                continue
            specs, fp = resolve(space.suggest(optuna.trial.FixedTrial(params)), ctx)
            if specs is None or fp in picked:
                continue
            picked[fp] = {"labels": ["search"], "params": params, "specs": specs}
            drawn += 1
            if drawn == count:
                break
    return picked


def read_log(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the candidates of a measurement log (a line cut by a
    kill is dropped; a fingerprint measured twice keeps its last record)."""
    header: dict[str, Any] = {}
    records: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "header" in data:
            header = data["header"]
        else:
            records[data["fingerprint"]] = data
    return header, list(records.values())


# --------------------------------------------------------------------------- statistics


def fidelity(pairs: list[tuple[float, float, str]]) -> dict[str, Any]:
    """How well estimates rank measurements.

    Args:
      pairs: (estimate, measured, fingerprint) per candidate.

    Returns:
      n; kendall_tau and spearman (None with a constant side);
      top1_regret: the measured time of the candidate the estimate ranks
      first (ties broken by fingerprint; `tied_first` counts them) over the
      best measured; median_ratio of estimate to measured. Below 2
      candidates there is nothing to rank: only the ratio is given.

    Example:
      >>> fidelity([(1.0, 2.0, "a"), (2.0, 1.0, "b")])["top1_regret"]
      2.0
    """
    from scipy import stats

    n = len(pairs)
    out: dict[str, Any] = {"n": n, "kendall_tau": None, "spearman": None,
                           "top1_regret": None, "tied_first": None, "median_ratio": None}
    if n == 0:
        return out
    out["median_ratio"] = statistics.median(e / m for e, m, _f in pairs)
    if n < 2:
        return out
    est = [e for e, _m, _f in pairs]
    meas = [m for _e, m, _f in pairs]
    if len(set(est)) > 1 and len(set(meas)) > 1:
        out["kendall_tau"] = float(stats.kendalltau(est, meas).statistic)
        out["spearman"] = float(stats.spearmanr(est, meas).statistic)
    first = min(pairs, key=lambda p: (p[0], p[2]))
    out["top1_regret"] = first[1] / min(meas)
    out["tied_first"] = sum(e == first[0] for e in est)
    return out


def summarize_entry(header: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """One entry of `results.json`: its candidates, per-model statistics and
    overlap sweeps, and its timing."""
    done = [r for r in records if r["status"] == "complete" and r["median_seconds"]]
    labels = list(header.get("models", {}))
    stats, sweep, failed = {}, {}, {}
    for label in labels:
        costed = [r for r in done if "seconds" in r["estimates"].get(label, {})]
        failed[label] = len(done) - len(costed)
        stats[label] = fidelity([(r["estimates"][label]["seconds"], r["median_seconds"],
                                  r["fingerprint"]) for r in costed])
        sweep[label] = {str(x): fidelity([(r["estimates"][label]["by_overlap"][str(x)],
                                           r["median_seconds"], r["fingerprint"])
                                          for r in costed]) for x in OVERLAPS}
    compile_times = [r["compile_seconds"] for r in records if r["compile_seconds"]]
    walls = [r["wall_seconds"] for r in records]
    # How well the measurement ranks the candidates against itself: the first
    # timed step against the second. No estimate can be expected to agree with
    # the measured medians much better than the measurement agrees with itself.
    twice = [r for r in done if len(r.get("step_times") or []) >= 2]
    repeat = fidelity([(r["step_times"][0], r["step_times"][1], r["fingerprint"])
                       for r in twice])["kendall_tau"]
    return {
        "workload": header.get("workload"), "mesh": header.get("mesh"),
        "machine": header.get("machine"),
        "settings": {k: header.get(k) for k in ("repeats", "warmup", "seed", "baselines")},
        "models": {k: v.get("name") for k, v in header.get("models", {}).items()},
        "model_files": header.get("models", {}),
        "counts": {"candidates": len(records), "complete": len(done),
                   "searched": sum(r["labels"] == ["search"] for r in records),
                   "not_costed": failed,
                   "errors": {label: _first_error(records, label) for label in labels}},
        "stats": stats, "sweep": sweep, "repeatability_tau": repeat,
        "timing": {"measured_seconds": math.fsum(walls),
                   "per_candidate_seconds": statistics.mean(walls) if walls else None,
                   "compile_seconds_median": (statistics.median(compile_times)
                                              if compile_times else None),
                   "compile_seconds_max": max(compile_times, default=None)},
        "candidates": records,
    }


def choose_overlap(entries: list[dict[str, Any]], choose_on: str) -> dict[str, Any]:
    """The calibrated model's overlap value: the best mean Kendall tau over the
    `choose_on` entries (the first of equals, in `OVERLAPS` order); the mean
    over the other entries is reported beside it, as held out."""
    calibrated = [e for e in entries if CALIBRATED in e["stats"]]
    if not calibrated:
        return {"chosen": None, "note": "no calibrated model (run with --calibration DIR)"}
    chosen_set = [e for e in calibrated if e["mesh"] == choose_on]
    held = [e for e in calibrated if e["mesh"] != choose_on]

    def mean_tau(group: list[dict[str, Any]], x: float) -> float | None:
        taus = [e["sweep"][CALIBRATED][str(x)]["kendall_tau"] for e in group]
        taus = [t for t in taus if t is not None]
        return statistics.mean(taus) if taus else None

    chosen_mean = {str(x): mean_tau(chosen_set, x) for x in OVERLAPS}
    held_mean = {str(x): mean_tau(held, x) for x in OVERLAPS}
    ranked = [(v, -i) for i, v in enumerate(chosen_mean.values()) if v is not None]
    chosen = OVERLAPS[-max(ranked)[1]] if ranked else None
    return {"model": CALIBRATED, "choose_on": choose_on, "chosen": chosen,
            "mean_tau_chosen_on": chosen_mean, "mean_tau_held_out": held_mean,
            "chosen_on": [f"{e['workload']}@{e['mesh']}" for e in chosen_set],
            "held_out": [f"{e['workload']}@{e['mesh']}" for e in held],
            "note": (None if chosen is not None else
                     f"no {choose_on} entry with a Kendall tau; nothing chosen")}


# --------------------------------------------------------------------------- output


def report(result: dict[str, Any]) -> str:
    """`results.md`: the tables, the chosen overlap and the timings."""
    ov = result["overlap"]
    recorded = _unique(json.dumps(e["settings"], sort_keys=True) for e in result["entries"])
    s = json.loads(recorded[0]) if len(recorded) == 1 else None
    timing = ("entries measured with different settings (each entry's `settings` in "
              "results.json)" if s is None else
              f"median of {s['repeats']} timed steps after {s['warmup']} warm-up, seed "
              f"{s['seed']}, baselines {'included' if s['baselines'] else 'left out'}")
    machine = next((e["machine"] for e in result["entries"] if e.get("machine")),
                   result["machine"])
    lines = ["# Fidelity of the static cost models", "",
             "How well each model's estimate, from the compiled program alone, ranks "
             f"candidates by their measured step time ({timing}; simulated CPU devices). "
             "Candidates: the baseline plans plus distinct fingerprints drawn from the "
             "search space (space \"both\"; *searched*), each compiled once. *regret*: "
             "measured time of the estimate's first choice / best measured. *est./meas.*: "
             "median ratio of estimate to measurement. Produced by "
             "`benchmarks/fidelity/run.py`:",
             "", f"    {result['command']}", ""]
    started = _unique(e["machine"]["command"] for e in result["entries"]
                      if (e.get("machine") or {}).get("command")
                      and e["machine"]["command"] != result["command"])
    if started:
        lines += ["from the measurements of", "", *[f"    {c}" for c in started], ""]
    measured = math.fsum(e["timing"]["measured_seconds"] for e in result["entries"])
    lines += [f"Measured on: {machine.get('cpu')}, {machine.get('cores')} cores. Wall time "
              f"of that command: {result['wall_seconds']:.0f} s; measuring every candidate "
              f"of these entries took {measured:.0f} s in all.", "",
             "*step vs step τ*: Kendall τ between each candidate's first and second timed "
             "step, how well the measurement ranks the candidates against itself.", "",
             "| workload | mesh | model | candidates (searched; complete) | Kendall τ "
             "| Spearman | top-1 regret | est./meas. | step vs step τ |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in result["entries"]:
        for label, st in e["stats"].items():
            missing = e["counts"]["not_costed"][label]
            lines.append(
                f"| {e['workload']} | {e['mesh']} | {label} | {e['counts']['candidates']} "
                f"({e['counts']['searched']}; {e['counts']['complete']}"
                f"{f', {missing} not costed' if missing else ''}) "
                f"| {_f(st['kendall_tau'])} | {_f(st['spearman'])} | "
                f"{_f(st['top1_regret'], 'x')} | {_f(st['median_ratio'], 'x', 3)} "
                f"| {_f(e.get('repeatability_tau'))} |")
    errors = [(e, label, msg) for e in result["entries"]
              for label, msg in e["counts"]["errors"].items() if msg]
    if errors:
        lines += ["", "Candidates a model could not cost (first error per entry):", ""]
        lines += [f"- {e['workload']} on {e['mesh']}, {label}: {msg}" for e, label, msg in errors]
    lines += ["", "## The overlap rule of the calibrated model", ""]
    if ov.get("chosen") is None and "mean_tau_chosen_on" not in ov:
        lines.append(ov["note"])
    else:
        lines += _overlap_lines(result)
    lines += ["", "## Time", "",
              "| workload | mesh | candidates | measured, s | per candidate, s "
              "| compile, s (median / max) |", "|---|---|---|---|---|---|"]
    for e in result["entries"]:
        t = e["timing"]
        lines.append(f"| {e['workload']} | {e['mesh']} | {e['counts']['candidates']} | "
                     f"{t['measured_seconds']:.0f} | {_f(t['per_candidate_seconds'], '', 1)} | "
                     f"{_f(t['compile_seconds_median'], '', 1)} / "
                     f"{_f(t['compile_seconds_max'], '', 1)} |")
    lines += ["", "![estimate against measurement](estimate-vs-measured.png)"
              if not result.get("plot_note") else f"({result['plot_note']})", ""]
    return "\n".join(lines)


def _overlap_lines(result: dict[str, Any]) -> list[str]:
    ov = result["overlap"]
    entries = [e for e in result["entries"] if CALIBRATED in e["stats"]]
    names = [f"{e['workload']} {e['mesh']}"
             + (" (held out)" if e["mesh"] != ov["choose_on"] else "") for e in entries]
    head = ["| overlap | " + " | ".join(names)
            + f" | mean τ, {ov['choose_on']} | mean τ, held out |",
            "|---" * (len(entries) + 3) + "|"]
    for x in OVERLAPS:
        cells = [_f(e["sweep"][CALIBRATED][str(x)]["kendall_tau"]) for e in entries]
        mark = " (chosen)" if ov["chosen"] == x else ""
        head.append(f"| {x:g}{mark} | " + " | ".join(cells) + " | "
                    f"{_f(ov['mean_tau_chosen_on'][str(x)])} | "
                    f"{_f(ov['mean_tau_held_out'][str(x)])} |")
    text = ["Kendall τ of the calibrated model with its breakdowns' overlap set to each "
            "value (nothing recompiled). The value is chosen on the "
            f"{ov['choose_on']} entries (best mean τ); the other entries are held out and "
            "did not take part in the choice.", "", *head, ""]
    if ov["chosen"] is None:
        return [*text, ov["note"]]
    text += [f"Chosen: overlap = {ov['chosen']:g}. At that value (targets: τ ≥ "
             f"{TARGET_TAU}, regret ≤ {TARGET_REGRET}x):", "",
             "| workload | mesh | role | Kendall τ | Spearman | top-1 regret | est./meas. "
             "| targets |", "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        st = e["sweep"][CALIBRATED][str(ov["chosen"])]
        met = (st["kendall_tau"] is not None and st["kendall_tau"] >= TARGET_TAU
               and st["top1_regret"] is not None and st["top1_regret"] <= TARGET_REGRET)
        role = "chosen on" if e["mesh"] == ov["choose_on"] else "held out"
        text.append(f"| {e['workload']} | {e['mesh']} | {role} | {_f(st['kendall_tau'])} | "
                    f"{_f(st['spearman'])} | {_f(st['top1_regret'], 'x')} | "
                    f"{_f(st['median_ratio'], 'x', 3)} | {'met' if met else 'missed'} |")
    return text


def plot(result: dict[str, Any], path: Path) -> str | None:
    """Estimate against measurement, log-log, one panel per model (and one for
    the calibrated model at the chosen overlap); None, or why it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install 'shardsearch[bench]')"
    panels = _unique(label for e in result["entries"] for label in e["stats"])
    chosen = result["overlap"].get("chosen")
    views = [(label, None) for label in panels]
    if chosen is not None:
        views.append((CALIBRATED, chosen))
    if not views:
        return "plot skipped: no entries"
    fig, axes = plt.subplots(1, len(views), figsize=(5 * len(views), 4.6), squeeze=False)
    for ax, (label, overlap) in zip(axes[0], views, strict=True):
        lo, hi = math.inf, 0.0
        for i, e in enumerate(result["entries"]):
            xs, ys, base = [], [], []
            for r in e["candidates"]:
                got = r["estimates"].get(label, {})
                if r["status"] != "complete" or not r["median_seconds"] or "seconds" not in got:
                    continue
                y = got["seconds"] if overlap is None else got["by_overlap"][str(overlap)]
                xs.append(r["median_seconds"])
                ys.append(y)
                base.append(r["labels"] != ["search"])
            if not xs:
                continue
            lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
            ax.scatter([x for x, b in zip(xs, base, strict=True) if not b],
                       [y for y, b in zip(ys, base, strict=True) if not b], s=14,
                       color=f"C{i}", label=f"{e['workload']} {e['mesh']}")
            ax.scatter([x for x, b in zip(xs, base, strict=True) if b],
                       [y for y, b in zip(ys, base, strict=True) if b], s=30, marker="x",
                       color=f"C{i}")
        if hi > 0:
            ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle="--",
                    label="estimate = measured")
            ax.set_xlim(lo / 1.3, hi * 1.3)
            ax.set_ylim(lo / 1.3, hi * 1.3)
            ax.set_aspect("equal")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured median step, s")
        ax.set_ylabel("estimate, s")
        ax.set_title(label if overlap is None else f"{label}, overlap {overlap:g} (chosen)",
                     fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("Static estimate against measurement (x: baseline plans)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _one_lines(result: dict[str, Any]) -> list[str]:
    out = []
    for e in result["entries"]:
        parts = [f"{label} tau {_f(st['kendall_tau'])} regret {_f(st['top1_regret'], 'x')} "
                 f"est/meas {_f(st['median_ratio'], 'x', 3)}" for label, st in e["stats"].items()]
        out.append(f"{e['workload']} on {e['mesh']} ({e['counts']['complete']} complete): "
                   + "; ".join(parts))
    if result["overlap"].get("chosen") is not None:
        out.append(f"chosen overlap: {result['overlap']['chosen']:g}")
    return out


def _first_error(records: list[dict[str, Any]], label: str) -> str | None:
    return next((r["estimates"][label]["error"] for r in records
                 if "error" in r["estimates"].get(label, {})), None)


def _shown(record: dict[str, Any]) -> str:
    if record["median_seconds"] is None:
        return f"{record['status']}: {(record['reason'] or '')[:60]}"
    ests = ", ".join(f"{k} {v['seconds'] * 1e3:.3f} ms" if "seconds" in v else f"{k} -"
                     for k, v in record["estimates"].items())
    return f"{record['median_seconds'] * 1e3:.3f} ms (est. {ests})"


def _f(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _unique(items: Any) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _slug(text: str) -> str:
    """"gpt:small" -> "gpt-small", "dp=2,tp=4" -> "dp2-tp4"."""
    return text.replace(":", "-").replace("=", "").replace(",", "-")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
