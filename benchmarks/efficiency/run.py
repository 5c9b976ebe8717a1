"""Search-efficiency study: how many evaluations each Optuna sampler needs.

For each workload, on a (2, 4) mesh of 8 simulated CPU devices:

1. Timing (resumable). Enumerate every parameter combination of the search
   space (`SearchSpace.enumerate()`, the space built as `optimize` builds it),
   resolve each to its fingerprint (the hash of its spec trees), and time each
   DISTINCT fingerprint once with `shardsearch.bench.evaluate` (no pruning, no memory
   budget). Each result is appended to `<workload>.timing.jsonl` as soon as it
   is measured, so a killed run resumes where it stopped; at the end the whole
   table (params -> fingerprint, fingerprint -> median seconds or cut/failed)
   goes to `<workload>.table.json`.
2. Refine. The `--refine` fastest fingerprints of that first pass are
   compiled again and re-timed interleaved over `--refine-rounds` rounds
   (`<workload>.refine.json`); their refined medians replace the first-pass
   ones, and the space's best and the target set are decided among them.
3. Replay. `tpe` (`make_sampler(seed)`, what `optimize` uses), `tpe-grouped`
   (`TPESampler(seed, multivariate=True, group=True)`), random (`RandomSampler(seed)`)
   and grid (`GridSampler` over the full grid, `seed` shuffling its order)
   each propose through `SearchSpace.suggest`; a trial looks its candidate
   up in the table instead of re-timing it (not complete: pruned, as
   `optimize` reports a cut). Recorded per sampler and seed: the trials, and
   the distinct fingerprints (= compiles, with the search's cache), until
   the first trial that evaluates a target (within `--tolerance` of the
   space's best median); and the best-so-far after every trial. Results:
   `<workload>.json`, `summary.md` and `<workload>.png` (matplotlib, if
   installed).

Run from the repository root (the default `--out` is relative to it), with
shardsearch installed (`pip install -e .`):

    python benchmarks/efficiency/run.py                      # both workloads, ~hours
    python benchmarks/efficiency/run.py --replay-only        # re-analyse the tables
    python benchmarks/efficiency/run.py --workloads gpt:tiny --repeats 1 --limit 20 \
        --out /tmp/eff                                      # a quick check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from shardsearch import abstract_mesh, create_mesh, parse_mesh, use_cpu_devices
from shardsearch.bench import machine_info
from shardsearch.search import evaluate, make_context, make_sampler, make_space, resolve, retime
from shardsearch.workloads import get_workload

# "tpe" is the sampler `optimize` uses; "tpe-grouped" is the multivariate TPE
# over groups of parameters, the alternative for a conditional space.
SAMPLERS = ("tpe", "tpe-grouped", "random", "grid")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="gpt:tiny,mlp:small",
                   help="comma-separated built-in workloads (default gpt:tiny,mlp:small)")
    p.add_argument("--mesh", default="dp=2,tp=4", help="mesh axes (default dp=2,tp=4)")
    p.add_argument("--out", default="benchmarks/results/efficiency", help="results folder")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per fingerprint (3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per fingerprint (1)")
    p.add_argument("--seeds", type=int, default=20,
                   help="seeds per sampler (20; a replay costs seconds)")
    p.add_argument("--budget", type=int,
                   help="trials per replay (default: the number of distinct fingerprints)")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="'found' means within this fraction of the space's best (0.03)")
    p.add_argument("--refine", type=int, default=20,
                   help="re-time the N best fingerprints of the first pass interleaved, "
                        "so the space's best is not decided by noise (20; 0: off)")
    p.add_argument("--refine-rounds", type=int, default=15,
                   help="interleaved timed steps per refined fingerprint (15)")
    p.add_argument("--replay-only", action="store_true",
                   help="reuse the recorded tables; time nothing (needs no devices)")
    p.add_argument("--limit", type=int,
                   help="time at most N distinct fingerprints (a quick check of the "
                        "pipeline; its replay treats the untimed ones as cut)")
    a = p.parse_args(argv)
    dims, names = parse_mesh(a.mesh)
    if not a.replay_only:
        import jax

        # Before JAX starts its backend: the device count is fixed then. The
        # study is about simulated CPU devices, also on a host with a GPU.
        jax.config.update("jax_platforms", "cpu")
        use_cpu_devices(math.prod(dims))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in [w.strip() for w in a.workloads.split(",") if w.strip()]:
        table_path = out / f"{_slug(name)}.table.json"
        if a.replay_only:
            if not table_path.is_file():
                print(f"run.py: error: no table {table_path}; run without --replay-only first",
                      file=sys.stderr)
                return 2
            table = json.loads(table_path.read_text(encoding="utf-8"))
        else:
            table = build_table(name, dims, names, out, a.repeats, a.warmup, a.limit,
                                a.refine, a.refine_rounds)
            _write(table_path, table, rows=True)
        result = replay_all(table, a.seeds, a.budget, a.tolerance)
        _write(out / f"{_slug(name)}.json", result)
        note = plot(result, out / f"{_slug(name)}.png")
        if note:
            print(f"note: {note}", file=sys.stderr)
        print(_one_line(result), flush=True)
    summary = write_summary(out)
    print(f"wrote {summary}")
    return 0


# --------------------------------------------------------------------------- space


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _grid(combos: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Every parameter's values, in first-seen order (GridSampler's search space)."""
    grid: dict[str, list[Any]] = {}
    for params in combos:
        for k, v in params.items():
            if v not in grid.setdefault(k, []):
                grid[k].append(v)
    return grid


# --------------------------------------------------------------------------- timing


def build_table(name: str, dims: tuple[int, ...], names: tuple[str, ...], out: Path,
                repeats: int, warmup: int, limit: int | None, refine: int = 0,
                refine_rounds: int = 15) -> dict[str, Any]:
    """Params -> fingerprint for the whole space, each fingerprint timed once,
    and the `refine` best of them re-timed interleaved."""
    import optuna

    workload = get_workload(name)
    mesh = create_mesh(dims, names)
    ctx, _ = make_context(workload, None, mesh, memory_budget=None, warmup=warmup,
                             repeats=repeats)
    space = make_space(mesh, ctx.abstract_args[0], ctx.budget)
    start = time.perf_counter()
    combos = space.enumerate()
    rows, specs_of, invalid = [], {}, {}
    for params in combos:
        specs, fp = resolve(space.suggest(optuna.trial.FixedTrial(params)), ctx)
        if specs is None:
            invalid[_key(params)] = fp  # the reason
            rows.append([params, None])
            continue
        specs_of.setdefault(fp, specs)
        rows.append([params, fp])
    print(f"{name}: {len(combos)} combinations, {len(specs_of)} distinct fingerprints, "
          f"{len(invalid)} invalid ({time.perf_counter() - start:.0f} s to resolve)", flush=True)
    # Shuffled, so slow drifts of the machine do not follow the enumeration
    # order, and so a --limit run times a sample of the whole space.
    order = list(specs_of)
    random.Random(0).shuffle(order)
    if limit is not None:
        order = order[:limit]
    log = out / f"{_slug(name)}.timing.jsonl"
    timed = _read_log(log)
    with log.open("a", encoding="utf-8") as f:
        for i, fp in enumerate(order, 1):
            if fp in timed:
                continue
            outcome = evaluate(specs_of[fp], fp, ctx)
            timed[fp] = outcome.to_json()
            f.write(json.dumps(timed[fp]) + "\n")
            f.flush()
            os.fsync(f.fileno())
            shown = (f"{outcome.value * 1e3:.3f} ms" if outcome.value is not None
                     else f"{outcome.status}: {outcome.reason[:60]}")
            print(f"  [{i}/{len(order)}] {fp}: {shown} (compile "
                  f"{outcome.compile_seconds:.1f} s)", flush=True)
    results = {}
    for fp in specs_of:
        o = timed.get(fp)
        results[fp] = ({"status": "untimed", "median_seconds": None} if o is None else {
            "status": o["status"], "median_seconds": o["value"], "step_times": o["step_times"],
            "compile_seconds": o["compile_seconds"], "reason": o["reason"] or None,
            "memory_total": o["memory"].get("total")})
    refined = _refine(results, specs_of, ctx, out / f"{_slug(name)}.refine.json", refine,
                      refine_rounds)
    for fp, timing in refined.items():
        # The replay uses the refined median; the first pass's stays beside it.
        results[fp].update({"first_pass_median_seconds": results[fp]["median_seconds"],
                            "median_seconds": timing["median"], "refined_times": timing["times"],
                            "refined_ci": timing["ci"]})
    grid = _grid(combos)
    return {
        "schema": 1, "workload": name, "mesh": dict(zip(names, dims, strict=True)),
        "repeats": repeats, "warmup": warmup, "limit": limit,
        "refine": {"count": len(refined), "rounds": refine_rounds}, "machine": machine_info(
            " ".join(["python", "benchmarks/efficiency/run.py", *sys.argv[1:]])),
        "space": {"combinations": len(combos), "distinct": len(specs_of),
                  "invalid": len(invalid), "grid": grid},
        # One row per combination: its value of each column (null where the
        # parameter is not asked, e.g. memory_fraction with memory_rule off), then
        # its fingerprint (null: the rules refused the arguments).
        "columns": list(grid),
        "rows": [[params.get(c) for c in grid] + [fp] for params, fp in rows],
        "fingerprints": results, "invalid_reasons": invalid,
    }


def _refine(results: dict[str, dict[str, Any]], specs_of: dict[str, Any], ctx: Any,
            path: Path, count: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Re-times the `count` fastest fingerprints of the first pass interleaved.

    A first pass of a few steps each ranks candidates within a few percent
    of each other by noise; a 3% target needs the top of the table measured
    better than that. Interleaving (A B C … A B C) makes slow drifts of the
    machine hit them alike. Kept in `path`, reused while the set and the
    rounds are the same.
    """
    if count <= 0:
        return {}
    done = sorted((r["median_seconds"], fp) for fp, r in results.items()
                  if r["status"] == "complete")
    top = sorted(fp for _v, fp in done[:count])
    if path.is_file():
        kept = json.loads(path.read_text(encoding="utf-8"))
        if sorted(kept["timings"]) == top and kept["rounds"] == rounds:
            return kept["timings"]
    start = time.perf_counter()
    timings = retime([(fp, specs_of[fp]) for fp in top], ctx, rounds=rounds)
    kept = {"rounds": rounds, "timings": {fp: t.to_json() for fp, t in timings.items()}}
    _write(path, kept)
    print(f"  refined the {len(top)} best over {rounds} interleaved rounds "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    return kept["timings"]


def _read_log(path: Path) -> dict[str, dict[str, Any]]:
    """Fingerprints timed by an earlier run (a line cut by a kill is dropped)."""
    timed: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            timed[record["fingerprint"]] = record
    return timed


# --------------------------------------------------------------------------- replay


def replay_all(table: dict[str, Any], seeds: int, budget: int | None,
               tolerance: float) -> dict[str, Any]:
    """Every sampler, every seed, against the table."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    mesh = abstract_mesh(tuple(table["mesh"].values()), tuple(table["mesh"]))
    space = make_space(mesh, get_workload(table["workload"]).abstract()[0])
    lookup = {_key(params): fp for params, fp in _params(table)}
    values = {fp: r["median_seconds"] for fp, r in table["fingerprints"].items()
              if r["status"] == "complete"}
    if not values:
        raise SystemExit(f"run.py: {table['workload']}: no fingerprint completed; nothing "
                         "to replay")
    # With a refined table, the best and the targets are decided among the
    # refined fingerprints only: they were measured alike, and better.
    refined = {fp for fp, r in table["fingerprints"].items() if "refined_times" in r}
    pool = {fp: v for fp, v in values.items() if fp in refined} or values
    best_fp = min(pool, key=lambda k: (pool[k], k))
    best = pool[best_fp]
    targets = {fp for fp, v in pool.items() if v <= best * (1 + tolerance)}
    budget = budget or table["space"]["distinct"]
    out: dict[str, Any] = {
        "workload": table["workload"], "mesh": table["mesh"], "tolerance": tolerance,
        "budget": budget, "seeds": list(range(seeds)), "repeats": table["repeats"],
        "limit": table.get("limit"),
        "refine": {"count": len(refined),
                   "rounds": (table.get("refine") or {}).get("rounds")},
        "space": {**{k: v for k, v in table["space"].items() if k != "grid"},
                  "complete": len(values), "within_tolerance": len(targets),
                  "best": {"fingerprint": best_fp, "median_seconds": best,
                           "params": next(p for p, f in _params(table) if f == best_fp)}},
        "samplers": {},
    }
    for sampler in SAMPLERS:
        runs = [replay(sampler, seed, space, table["space"]["grid"], lookup, values, budget,
                       targets) for seed in range(seeds)]
        out["samplers"][sampler] = {"summary": {
            "reached": sum(r["trials_to_target"] is not None for r in runs),
            # The bar: found within a quarter of the space's evaluations.
            "within_quarter": sum(r["distinct_to_target"] is not None
                                  and r["distinct_to_target"] <= table["space"]["distinct"] / 4
                                  for r in runs),
            "trials_to_target": _spread([r["trials_to_target"] for r in runs]),
            "distinct_to_target": _spread([r["distinct_to_target"] for r in runs]),
            "best_at_budget": _spread([r["trace"][-1] for r in runs])}, "runs": runs}
    return out


def replay(sampler_name: str, seed: int, space: Any, grid: dict[str, list[Any]],
           lookup: dict[str, str | None], values: dict[str, float], budget: int,
           targets: set[str]) -> dict[str, Any]:
    """One sampler and seed: trials look their candidate up instead of timing
    it; the target is reached at the first trial that evaluates one of
    `targets`."""
    import optuna

    samplers = {
        "tpe": lambda: make_sampler(seed),
        "tpe-grouped": lambda: _grouped_tpe(seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        "grid": lambda: optuna.samplers.GridSampler(grid, seed=seed),
    }
    study = optuna.create_study(sampler=samplers[sampler_name](), direction="minimize")
    trace: list[float | None] = []
    distinct: list[int] = []
    seen: set[str] = set()
    best = math.inf
    hit: int | None = None

    def objective(trial: optuna.Trial) -> float:
        nonlocal best, hit
        space.suggest(trial)
        fp = lookup.get(_key(trial.params))
        if fp is not None:
            seen.add(fp)
        if hit is None and fp in targets:
            hit = len(trace)
        value = values.get(fp) if fp is not None else None
        if value is not None:
            best = min(best, value)
        trace.append(best if math.isfinite(best) else None)
        distinct.append(len(seen))
        if value is None:
            raise optuna.TrialPruned()  # cut, failed or invalid: as optimize reports it
        return value

    study.optimize(objective, n_trials=budget)
    return {"seed": seed, "trials_to_target": None if hit is None else hit + 1,
            "distinct_to_target": None if hit is None else distinct[hit],
            "trace": trace, "distinct_trace": distinct}


def _grouped_tpe(seed: int) -> Any:
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)


def _params(table: dict[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """The table's rows back as (params, fingerprint) pairs."""
    columns = table["columns"]
    return [({c: v for c, v in zip(columns, row[:-1], strict=True) if v is not None}, row[-1])
            for row in table["rows"]]


def _spread(xs: list[float | None]) -> dict[str, float | None]:
    """Median, min and max; a run that never got there counts as infinitely late."""
    got = [x for x in xs if x is not None]
    ranked = sorted(math.inf if x is None else x for x in xs)
    median = statistics.median(ranked) if ranked else None
    return {"median": median if median is not None and math.isfinite(median) else None,
            "min": min(got, default=None), "max": max(got, default=None)}


# --------------------------------------------------------------------------- output


def write_summary(out: Path) -> Path:
    """`summary.md` from every `<workload>.json` in `out`."""
    lines = ["# Search efficiency", "",
             "How many evaluations each sampler needs to come within the tolerance of the "
             "best median step time in the whole space (every distinct candidate timed once "
             "beforehand). *trials*: Optuna trials; *distinct*: distinct fingerprints among "
             "them, i.e. compiles with the search's cache. Median [min–max] over the seeds; "
             "a seed that did not get there within the budget counts as infinitely late "
             "(median `-` when half of them did not). Produced by "
             "`benchmarks/efficiency/run.py`.", ""]
    for path in sorted(out.glob("*.json")):
        if path.name.endswith((".table.json", ".refine.json")):
            continue
        lines += [*_summary_lines(json.loads(path.read_text(encoding="utf-8"))), ""]
    target = out / "summary.md"
    target.write_text("\n".join(lines), encoding="utf-8")
    return target


def _summary_lines(r: dict[str, Any]) -> list[str]:
    s = r["space"]
    mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items())
    head = [f"## {r['workload']} on {mesh}", "",
            f"{s['combinations']} parameter combinations, {s['distinct']} distinct "
            f"fingerprints ({s['complete']} completed, {s['invalid']} combinations invalid); "
            f"best {s['best']['median_seconds'] * 1e3:.3f} ms ({s['best']['fingerprint']}), "
            f"{s['within_tolerance']} fingerprints within {r['tolerance']:.0%} of it. "
            f"{r['repeats']} timed repeats per fingerprint; budget {r['budget']} trials; "
            f"seeds {r['seeds'][0]}–{r['seeds'][-1]}."
            + (f" The best and the targets are decided among the {r['refine']['count']} "
               f"fastest of that first pass, re-timed over {r['refine']['rounds']} "
               "interleaved rounds." if (r.get("refine") or {}).get("count") else "")
            + (f" TRUNCATED: only {r['limit']} fingerprints timed (--limit)."
               if r.get("limit") else ""), "",
            "| sampler | reached | within ¼ of the space | trials (median [min–max]) "
            "| distinct (median [min–max]) | best at budget, ms (median) |",
            "|---|---|---|---|---|---|"]
    for name, data in r["samplers"].items():
        m = data["summary"]
        best = m["best_at_budget"]["median"]
        quarter = m.get("within_quarter")
        head.append(f"| {name} | {m['reached']}/{len(r['seeds'])} | "
                    + ("-" if quarter is None else f"{quarter}/{len(r['seeds'])}") + " | "
                    f"{_range(m['trials_to_target'])} | {_range(m['distinct_to_target'])} | "
                    + ("-" if best is None else f"{best * 1e3:.3f}") + " |")
    return head


def _one_line(r: dict[str, Any]) -> str:
    return f"{r['workload']}: trials to within {r['tolerance']:.0%} of the best: " + "; ".join(
        f"{n} {_range(d['summary']['trials_to_target'])}" for n, d in r["samplers"].items())


def _range(x: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:g}"

    return f"{f(x['median'])} [{f(x['min'])}–{f(x['max'])}]"


def plot(result: dict[str, Any], path: Path) -> str | None:
    """Two panels, one line per sampler. Left: best-so-far relative to the
    space's best against trials, mean over seeds. Right: the share of seeds
    that have evaluated a target against distinct evaluations, with a
    quarter of the space marked (the issue's bar)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install 'shardsearch[bench]')"
    best = result["space"]["best"]["median_seconds"]
    distinct = result["space"]["distinct"]
    seeds = len(result["seeds"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, data) in enumerate(result["samplers"].items()):
        traces = [[math.nan if v is None else v / best for v in run["trace"]]
                  for run in data["runs"]]
        cols = list(zip(*traces, strict=True))
        mean = [statistics.fmean(c) if not any(map(math.isnan, c)) else math.nan for c in cols]
        left.plot(range(1, len(mean) + 1), mean, label=name, color=f"C{i}")
        hits = sorted(r["distinct_to_target"] for r in data["runs"]
                      if r["distinct_to_target"] is not None)
        xs = [0, *hits, distinct]
        ys = [0, *[(k + 1) / seeds for k in range(len(hits))], len(hits) / seeds]
        right.step(xs, ys, where="post", label=name, color=f"C{i}")
    left.axhline(1 + result["tolerance"], color="black", linestyle="--", linewidth=0.8,
                 label=f"best + {result['tolerance']:.0%}")
    left.set_ylim(0.98, 1.5)
    left.set_xlabel("trials")
    left.set_ylabel("best so far / best in the space (mean over seeds)")
    left.legend()
    right.axvline(distinct / 4, color="black", linestyle="--", linewidth=0.8,
                  label="¼ of the space")
    right.set_xlim(0, distinct)
    right.set_ylim(0, 1.02)
    right.set_xlabel("distinct fingerprints evaluated (compiles)")
    right.set_ylabel(f"share of {seeds} seeds within {result['tolerance']:.0%} of the best")
    right.legend(loc="lower right")
    mesh = ",".join(f"{k}={v}" for k, v in result["mesh"].items())
    fig.suptitle(f"{result['workload']} on {mesh}: {distinct} distinct candidates, "
                 f"{seeds} seeds per sampler", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _write(path: Path, data: dict[str, Any], rows: bool = False) -> None:
    """Whole or not at all; a table's rows and fingerprints one per line."""
    tmp = path.with_name(f".{path.name}.tmp")
    if rows:
        parts = []
        for key in sorted(data):
            value = data[key]
            if key == "rows":
                inner = ",\n".join("  " + json.dumps(r) for r in value)
                parts.append(f' "rows": [\n{inner}\n ]')
            elif key == "fingerprints":
                inner = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                                   for k, v in sorted(value.items()))
                parts.append(f' "fingerprints": {{\n{inner}\n }}')
            else:
                parts.append(f" {json.dumps(key)}: {json.dumps(value, sort_keys=True)}")
        text = "{\n" + ",\n".join(parts) + "\n}\n"
    else:
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _slug(name: str) -> str:
    return name.replace(":", "-")


if __name__ == "__main__":
    sys.exit(main())
