"""The `shardsearch` command line: parse, call the library, print.

Exit codes: 0 success; 1 the work failed (no candidate completed, a plan that
does not fit the workload); 2 a usage error (bad option, unknown workload,
unreadable storage or file), reported as one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..base.units import format_bytes as _bytes

# Each command: (name, help, add its options, run it).
Command = tuple[str, str, Callable[[argparse.ArgumentParser], None],
                Callable[[argparse.Namespace], int]]


class UsageError(Exception):
    """The user asked for something that cannot be done: exit code 2."""


class WorkFailed(Exception):
    """The request was sound but the work did not succeed: exit code 1."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# --------------------------------------------------------------------------- optimize


def _add_optimize(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, metavar="NAME",
                   help="a built-in workload (gpt:small, llama:tiny, mlp:tiny, ...) or a "
                        "factory 'package.module:function' returning a Workload")
    p.add_argument("--mesh", required=True, metavar="AXES",
                   help="mesh axes as name=size pairs, e.g. dp=2,tp=4 (one size may be -1: "
                        "the remaining devices)")
    p.add_argument("--devices", type=_positive_int, metavar="N",
                   help="simulate N CPU devices (for trying meshes this machine lacks)")
    p.add_argument("--trials", type=_count, default=40, metavar="N",
                   help="trials to run, the baselines included (default 40)")
    p.add_argument("--timeout", type=_positive_float, metavar="S",
                   help="stop starting trials after S seconds")
    p.add_argument("--budget", metavar="BYTES",
                   help="per-device memory budget, e.g. 16GiB (default: the device's memory "
                        "where JAX reports it, else none)")
    p.add_argument("--objective", choices=("measured", "static"), default="measured",
                   help="measured: median step time on the mesh (default); static: estimated "
                        "from the compiled program, nothing runs")
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage URL (default sqlite:///./.shardsearch/studies.db)")
    p.add_argument("--study", metavar="NAME",
                   help="study name (default from workload, mesh, objective and shapes); the "
                        "same name and storage resume a study")
    p.add_argument("--seed", type=_count, default=0, metavar="N",
                   help="sampler seed (default 0)")
    p.add_argument("--out", metavar="FILE",
                   help="plan file to write (default ./shardsearch-<workload>-<mesh>.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--compile-cache", default=".shardsearch/jax-cache", metavar="DIR",
                   help="JAX's persistent compilation cache, so a resumed study compiles "
                        "from disk (default: %(default)s)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="leave JAX's compilation cache settings alone")
    timing = p.add_argument_group("timing")
    timing.add_argument("--warmup", type=_count, default=2, metavar="N",
                        help="untimed steps per candidate (default 2)")
    timing.add_argument("--repeats", type=_positive_int, default=7, metavar="N",
                        help="timed steps per candidate (default 7)")
    timing.add_argument("--confirm-rounds", type=_count, default=10, metavar="N",
                        help="interleaved re-timing rounds of the finalists (default 10; 0 "
                             "skips)")


def _run_optimize(a: argparse.Namespace) -> int:
    # Before anything asks JAX for devices: the count is fixed at backend start.
    if a.devices is not None:
        _simulate_devices(a.devices)
    from ..base.mesh import parse_mesh
    from ..base.units import parse_bytes
    from ..plan.writer import write_config
    from ..search.export import export_config
    from ..search.loop import default_storage, optimize

    dims, names = _usage(parse_mesh, a.mesh)
    budget = _usage(parse_bytes, a.budget) if a.budget is not None else None
    workload = _workload(a.workload)
    mesh = _mesh(dims, names)
    out = Path(a.out or f"shardsearch-{_slug(workload.name)}-{_slug(_axes(mesh))}.json")
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name")
    storage = a.storage or default_storage()
    n = mesh.devices.size
    print(f"shardsearch {__version__}: {workload.name} on mesh {_axes(mesh)} ({n} "
          f"{mesh.devices.flat[0].platform} devices), {a.trials} trials, objective "
          f"{a.objective}", flush=True)
    try:
        result = optimize(
            workload, mesh=mesh, n_trials=a.trials, timeout=a.timeout, memory_budget=budget,
            objective=a.objective, storage=storage, study_name=a.study, seed=a.seed,
            warmup=a.warmup, repeats=a.repeats, confirm_rounds=a.confirm_rounds,
            compile_cache=None if a.no_compile_cache else a.compile_cache, quiet=a.quiet)
    except ValueError as err:  # optimize checks its inputs before any trial
        raise UsageError(str(err)) from None
    except (RecursionError, NotImplementedError):
        raise  # bugs, not failed work: keep their traceback
    except RuntimeError as err:  # no candidate completed; XLA failing on the devices
        raise WorkFailed(str(err)) from None
    config = export_config(result, workload=workload)
    try:
        written = write_config(config, out)
    except OSError as err:
        raise WorkFailed(
            f"the search finished but {out} could not be written ({err}); export it with "
            f"`shardsearch export --study '{result.study.study_name}' --storage "
            f"'{_redact(storage)}' --out FILE`") from None
    print(_results_table(config))
    print(f"study: {result.study.study_name!r} in {_redact(storage)} (the same command "
          "resumes it)")
    print(f"wrote {written}")
    return 0


def _simulate_devices(n: int) -> None:
    import jax

    from ..base.mesh import use_cpu_devices

    # Simulated devices are CPU devices: keep an accelerator from becoming the default.
    jax.config.update("jax_platforms", "cpu")
    try:
        use_cpu_devices(n)
    except (RuntimeError, ValueError) as err:
        raise UsageError(str(err)) from None


def _mesh(dims: tuple[int, ...], names: tuple[str, ...]) -> Any:
    import jax

    from ..base.mesh import create_mesh

    devices = jax.devices()
    if -1 not in dims and math.prod(dims) < len(devices):
        devices = devices[:math.prod(dims)]  # a smaller mesh runs on the first devices
    if -1 not in dims and math.prod(dims) > len(devices):
        raise UsageError(
            f"mesh {_axes_of(dims, names)} needs {math.prod(dims)} devices but there are "
            f"{len(devices)}; shrink the mesh or simulate more with --devices "
            f"{math.prod(dims)}")
    return _usage(create_mesh, dims, names, devices)


# --------------------------------------------------------------------------- export


def _add_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study", required=True, metavar="NAME", help="the stored study")
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage URL (default sqlite:///./.shardsearch/studies.db)")
    p.add_argument("--trial", type=_count, metavar="N",
                   help="export trial N instead of the study's winner")
    p.add_argument("--workload", metavar="NAME",
                   help="resolve specs on this workload (default: the study's, if built in; "
                        "a study run on a factory needs it named here)")
    p.add_argument("--out", required=True, metavar="FILE", help="file to write")
    p.add_argument("--format", choices=("json", "partition-rules"), default="json",
                   help="json: the plan file (default); partition-rules: Python source with "
                        "PARTITION_RULES = [(regex, PartitionSpec), ...]")


def _run_export(a: argparse.Namespace) -> int:
    from ..plan.writer import write_config
    from ..search.export import export_config
    from ..search.loop import default_storage, open_study

    storage = a.storage or default_storage()
    study = _usage(open_study, storage, a.study, create=False)
    workload = _workload(a.workload) if a.workload else None
    try:
        config = export_config(study, workload=workload, trial=a.trial)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if config["workload"] is None:
        if a.format == "partition-rules":
            raise UsageError(
                f"study {a.study!r} ran on a raw step, so its specs cannot be resolved; "
                "name the workload with --workload to write partition rules")
        print(f"note: study {a.study!r} ran on a raw step; the plan has its rules, mesh and "
              "results but no resolved specs (name the workload with --workload)",
              file=sys.stderr)
    try:
        written = write_config(config, a.out, format=a.format)
    except OSError as err:
        raise UsageError(f"cannot write {a.out}: {err.strerror or err}") from None
    print(f"wrote {written} ({a.format}): {config['results']['winner']['label']} "
          f"(trial {config['results']['winner']['trial']}) of study {a.study!r}")
    return 0


# --------------------------------------------------------------------------- show


def _add_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a plan file written by optimize or export")
    p.add_argument("--workload", metavar="NAME",
                   help="also list every leaf's spec and bytes per device on this workload")
    p.add_argument("--mesh", metavar="AXES",
                   help="apply on these axis sizes instead of the recorded ones (same axis "
                        "names), e.g. dp=4,tp=8; needs no devices")


def _run_show(a: argparse.Namespace) -> int:
    from ..base.mesh import abstract_mesh, parse_mesh
    from ..plan.reader import PlanMismatchWarning, load_plan

    mesh = None
    if a.mesh is not None:
        dims, names = _usage(parse_mesh, a.mesh)
        if -1 in dims:
            raise UsageError(f"--mesh {a.mesh}: give every size (no -1) to show a plan")
        mesh = _usage(abstract_mesh, dims, names)
    try:
        plan = load_plan(a.file, mesh)
    except OSError as err:
        raise UsageError(f"cannot read {a.file}: {err.strerror or err}") from None
    except ValueError as err:
        raise UsageError(str(err)) from None
    config = _read_json(a.file)
    print(_plan_header(a.file, config, plan))
    if plan.results is not None:
        try:
            print(_results_table(config))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            # Loading needs only the rules; a hand-edited results section is not fatal.
            print(f"note: {a.file}: the 'results' section is not as `optimize` writes it; "
                  "not shown", file=sys.stderr)
    if a.workload is None:
        return 0
    workload = _workload(a.workload)
    args = workload.abstract()
    fit = f"the plan does not fit {workload.name} on mesh {_axes(plan.mesh)}"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PlanMismatchWarning)
            specs = plan.apply(args)
    except ValueError as err:  # a path rule refuses a dim it cannot split
        print(f"{fit}: {err}", file=sys.stderr)
        return 1
    for w in caught:
        print(f"note: {w.message}", file=sys.stderr)
    print(_leaf_table(plan.mesh, args, specs))
    from ..base.analyzer import ShardingAnalyzer

    analyzer = ShardingAnalyzer(plan.mesh)
    problems = [f"{_arg_name(i, len(args))}/{problem}"
                for i, (tree, tree_specs) in enumerate(zip(args, specs, strict=True))
                for problem in analyzer.validate_partition_specs(tree, tree_specs)]
    if problems:
        print(f"{fit}: {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    return 0


def _arg_name(i: int, n: int) -> str:
    return "state" if i == 0 else "batch" if n == 2 else f"batch{i}"


def _read_json(path: str) -> dict[str, Any]:
    import json

    # load_plan has checked the file already; this only gets the sections to print.
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _plan_header(path: str, config: Mapping[str, Any], plan: Any) -> str:
    recorded = ",".join(f"{k}={v}" for k, v in plan.recorded_mesh)
    search, hardware, versions = (config.get(k) if isinstance(config.get(k), dict) else {}
                                  for k in ("search", "hardware", "versions"))
    lines = [f"plan {path} (schema {config['schema']})"]
    lines.append(f"  found on: mesh {recorded}"
                 + (f", {hardware.get('device_count')} {hardware.get('device_kind')} devices "
                    f"({hardware.get('platform')})" if hardware else "")
                 + (f", study {search.get('study')!r}, objective {search.get('objective')}, "
                    f"seed {search.get('seed')}" if search else ""))
    if versions:
        lines.append("  versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if plan.workload is not None or plan.fingerprint is not None:
        lines.append(f"  specs resolved on: {plan.workload} (fingerprint {plan.fingerprint})")
    lines.append("  state rule:")
    lines += _describe_rule(config["state_rule"], "    ")
    lines.append("  batch rule:")
    lines += _describe_rule(config["batch_rule"], "    ")
    if plan.batch_spec is not None:
        lines.append(f"  batch spec: {_spec_text(plan.batch_spec)}")
    return "\n".join(lines)


def _describe_rule(config: Mapping[str, Any], indent: str) -> list[str]:
    import json

    if config["kind"] == "composite":
        if not config["rules"]:
            return [f"{indent}composite of no rules: everything replicated"]
        out = [f"{indent}composite: per leaf, the first of these rules that shards it"]
        for i, rule in enumerate(config["rules"], 1):
            first, *rest = _describe_rule(rule, indent + "     ")
            out += [f"{indent}  {i}. {first.strip()}", *rest]
        return out
    from ..plan.writer import spec_source

    # Pattern tables read best one pattern per line, in priority order.
    table = {"path": "rules", "shape": "shape_patterns"}.get(config["kind"])
    params = " ".join(f"{k}={json.dumps(v)}" for k, v in config.items()
                      if k not in ("kind", table))
    out = [f"{indent}{config['kind']}  {params}".rstrip()]
    if table is not None:
        pairs = [(json.dumps(p), spec_source(s)) for p, s in config[table]]
        width = max((len(p) for p, _ in pairs), default=0)
        out += [f"{indent}   {p.ljust(width)}  {s}" for p, s in pairs]
    return out


def _leaf_table(mesh: Any, args: Sequence[Any], specs: Sequence[Any]) -> str:
    from ..base.analyzer import ShardingAnalyzer

    analyzer = ShardingAnalyzer(mesh)
    rows = [("path", "shape", "dtype", "spec", "bytes/device")]
    total = 0
    for i, (tree, tree_specs) in enumerate(zip(args, specs, strict=True)):
        usage = analyzer.estimate_memory_usage(tree, tree_specs)
        total += usage["size_per_device"]
        for path, leaf in usage["leaves"].items():
            shape = "[" + ",".join(map(str, leaf["shape"])) + "]"
            rows.append((f"{_arg_name(i, len(args))}/{path}", shape, leaf["dtype"],
                         _spec_text(leaf["spec"]), _bytes(leaf["bytes_per_device"])))
    return (f"leaves on mesh {_axes(mesh)}:\n" + _table(rows, right=(4,))
            + f"\nper device: {_bytes(total)} of arguments")


# --------------------------------------------------------------------------- bench


def _add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", required=True, metavar="NAME",
                   help="a suite name (looked up as ./benchmarks/suites/NAME.json) or a path "
                        "to a suite file")
    p.add_argument("--out", default="benchmarks/results", metavar="DIR",
                   help="results go to DIR/<suite>/ (default benchmarks/results)")
    p.add_argument("--rules", default="rules", metavar="DIR",
                   help="winners are exported to DIR/<suite>/<entry>.json (default rules)")
    p.add_argument("--entries", metavar="ID,ID",
                   help="run only these entries (default all; see --list)")
    p.add_argument("--devices", type=_positive_int, metavar="N",
                   help="simulate N CPU devices (default: the suite's count when it "
                        "simulates its devices)")
    p.add_argument("--force", action="store_true",
                   help="rerun entries that already have a result (their studies resume)")
    p.add_argument("--list", action="store_true", help="list the suite's entries and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar during searches")
    quick = p.add_argument_group("overrides for quick checks (recorded in each entry)")
    quick.add_argument("--trials", type=_positive_int, metavar="N",
                       help="trials per entry instead of the suite's")
    quick.add_argument("--repeats", type=_positive_int, metavar="N",
                       help="timed steps per candidate in the search")
    quick.add_argument("--rounds", type=_positive_int, metavar="N",
                       help="interleaved rounds of the comparison run")


def _run_bench(a: argparse.Namespace) -> int:
    from ..bench.runner import run_suite
    from ..bench.suite import load_suite, prepare_devices

    suite = _usage(load_suite, a.suite)
    ids = [i.strip() for i in a.entries.split(",") if i.strip()] if a.entries else None
    selected = _usage(suite.select, ids)
    if a.list:
        for e in suite.entries:
            limit = " ".join(x for x in (f"{e.trials} trials" if e.trials else "",
                                         f"{e.timeout:g} s" if e.timeout else "") if x)
            print(f"{e.id}: {e.workload_name} on {e.mesh}, {e.objective}, {limit}, budget "
                  f"{e.budget or 'none'}")
        return 0
    # Before anything asks JAX for devices: the count is fixed at backend start.
    _usage(prepare_devices, suite, a.devices)
    command = _bench_command(a)
    print(f"shardsearch {__version__}: suite {suite.name} ({suite.path}), {len(selected)} "
          f"entries, results in {Path(a.out) / suite.name}", flush=True)
    run = run_suite(suite, out=a.out, rules_dir=a.rules, entries=ids, force=a.force,
                    trials=a.trials, repeats=a.repeats, rounds=a.rounds, quiet=a.quiet,
                    command=command, log=lambda line: print(line, flush=True))
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {run.folder / 'results.md'}: {len(run.finished)} entries run, "
          f"{len(run.skipped)} already done, {len(run.failed)} failed")
    if run.failed:
        raise WorkFailed(f"{len(run.failed)} entries failed ({', '.join(run.failed)}); "
                         "the same command retries them")
    return 0


def _bench_command(a: argparse.Namespace) -> str:
    """The command line that repeats this run, for machine.json."""
    import shlex

    parts = ["shardsearch", "bench", "--suite", a.suite]
    for flag in ("out", "rules", "entries", "devices", "trials", "repeats", "rounds"):
        value = getattr(a, flag)
        if value is not None:
            parts += [f"--{flag}", str(value)]
    parts += [f"--{f}" for f in ("force", "quiet") if getattr(a, f)]
    return shlex.join(parts)


# --------------------------------------------------------------------------- tables


def _results_table(config: Mapping[str, Any]) -> str:
    """The exported candidate against every baseline, and the trial counts."""
    r = config["results"]
    static = (config.get("search") or {}).get("objective") == "static"
    winner = r["winner"]
    rows = [("", "estimated ms" if static else "median ms", "95% CI ms", "vs replicated",
             "vs best expert", "memory/device", "timed in")]
    entries = [] if winner["label"] != "search" else [winner]
    entries += list(r["baselines"])
    for row in entries:
        mark = "*" if row["trial"] == winner["trial"] or row is winner else " "
        name = f"{row['label']} (trial {row['trial']})" if row["label"] == "search" \
            else row["label"]
        if row["label"] == r.get("best_expert"):
            name += " [best expert]"
        memory = row["memory_per_device"]
        mem = memory.get("total", memory.get("arguments"))
        if row["median_seconds"] is None:
            status = row["status"] + (f" at {row['cut_stage']}" if row["cut_stage"] else "")
            reason = (row["reason"] or "")[:70]
            rows.append((f"{mark} {name}", status, reason, "", "", _bytes(mem), ""))
            continue
        ci = row["ci_seconds"]
        rows.append((
            f"{mark} {name}", f"{row['median_seconds'] * 1e3:.3f}",
            f"{ci[0] * 1e3:.3f}-{ci[1] * 1e3:.3f}" if ci else "-",
            _times(row["speedup_vs_replicated"]), _times(row["speedup_vs_best_expert"]),
            _bytes(mem), row["timed_in"] or ""))
    t = r["trials"]
    lines = [_table(rows, right=(1, 2, 3, 4, 5)),
             f"* exported ({'the winner' if r['selected'] == 'best' else 'chosen trial'})",
             f"trials: {t['trials']} run, {t['completed']} completed; cut {t['cut_check']} at "
             f"check, {t['cut_compile']} at compile, {t['cut_measure']} while measuring; "
             f"{t['failed']} failed; {t['cache_hits']} cache hits"
             + (f"; {r['compiles']} compiles this run" if r.get("compiles") is not None
                else "")]
    if r.get("verdict") is not None:
        lines.append(f"verdict: {_VERDICTS.get(r['verdict'], r['verdict'])}")
    if r.get("outputs_match") is not None:
        lines.append(
            f"outputs: {'match' if r['outputs_match'] else 'DO NOT match'} the replicated "
            f"plan's (max relative error {r['max_relative_error']:.2g})")
    return "\n".join(lines)


_VERDICTS = {
    "faster": "faster: significantly faster than the runner-up in interleaved re-timing",
    "tie": "tie: not significantly faster than the runner-up in interleaved re-timing",
    "unconfirmed": "unconfirmed: not re-timed (static objective, or a single finalist)",
}


def _table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _spec_text(spec: Any) -> str:
    from ..base.spec import spec_to_json
    from ..plan.writer import spec_source

    return spec_source(spec_to_json(spec))


# --------------------------------------------------------------------------- helpers


def _usage(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls a library function on user input; its ValueError/TypeError is a usage error."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None


def _workload(name: str) -> Any:
    from ..workloads import get_workload

    # As under `python -m`, a factory module in the current folder is importable.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return get_workload(name)
    except Exception as err:  # a user factory may raise anything; it is their input
        message = str(err) if isinstance(err, ValueError | TypeError) else \
            f"workload {name!r} could not be built: {type(err).__name__}: {err}"
        raise UsageError(message) from None


def _axes(mesh: Any) -> str:
    return ",".join(f"{a}={s}" for a, s in zip(mesh.axis_names, mesh.axis_sizes, strict=True))


def _axes_of(dims: Sequence[int], names: Sequence[str]) -> str:
    return ",".join(f"{a}={s}" for a, s in zip(names, dims, strict=True))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", text.replace("=", "")).strip("-")


def _redact(url: str) -> str:
    """A storage URL with its password hidden, fit to print."""
    return re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)


def _positive_int(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


# --------------------------------------------------------------------------- main


EXIT_CODES = "exit codes: 0 success, 1 the work failed, 2 usage error"
COMMANDS: tuple[Command, ...] = (
    ("optimize", "search for the fastest sharding of a workload and write its plan",
     _add_optimize, _run_optimize),
    ("export", "write the winner (or a chosen trial) of a stored study to a file",
     _add_export, _run_export),
    ("show", "print a plan file; with --workload, every leaf's spec and bytes per device",
     _add_show, _run_show),
    ("bench", "run a benchmark suite: search each entry, compare with every expert plan",
     _add_bench, _run_bench),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: one subcommand per entry of `COMMANDS`."""
    parser = _Parser(
        prog="shardsearch",
        description="Search-based sharding optimizer for JAX: finds PartitionSpecs by "
        "compiling and timing the real step on the real mesh.",
        epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"shardsearch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text, add, run in COMMANDS:
        p = sub.add_parser(name, help=help_text, epilog=EXIT_CODES,
                           description=help_text[0].upper() + help_text[1:] + ".")
        add(p)
        p.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI with `argv` (default `sys.argv[1:]`); returns the exit code.

    Example: `main(["show", "plan.json"])` prints the plan and returns 0.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version and usage errors end here
        return int(done.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    prog = f"shardsearch {args.command}"
    try:
        return args.run(args)
    except UsageError as err:
        return _fail(prog, err, 2)
    except WorkFailed as err:
        return _fail(prog, err, 1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; finished trials are kept in the study, the same "
              "command resumes it", file=sys.stderr)
        return 130


def _fail(prog: str, err: Exception, code: int) -> int:
    message = " | ".join(line.strip() for line in str(err).splitlines() if line.strip())
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def main_entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (`| head`) left; what it did not read is not an error of ours.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
