"""Text the commands print: tables of results and leaves, a plan's header, meshes.

Everything here turns data into strings; nothing parses options or runs the
library's work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..base.mesh import axes_text, axis_sizes
from ..base.units import format_bytes as _bytes
from ..cost.breakdown import Breakdown
from ..search.evaluation.logs import short as short_log_line
from ..search.evaluation.objectives import is_estimate
from ..search.evaluation.stages import Stage

VERDICTS = {
    "faster": "faster: significantly faster than the runner-up in interleaved re-timing",
    "tie": "tie: not significantly faster than the runner-up in interleaved re-timing",
    "unconfirmed": "unconfirmed: not re-timed (static objective, or a single finalist)",
}


def _cut_at(stage: Stage) -> str:
    return "while measuring" if stage == Stage.MEASURE else f"at {stage.label}"


def results_table(config: Mapping[str, Any]) -> str:
    """The exported candidate against every baseline, and the trial counts."""
    r = config["results"]
    static = is_estimate((config.get("search") or {}).get("objective"))
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
            times(row["speedup_vs_replicated"]), times(row["speedup_vs_best_expert"]),
            _bytes(mem), (row["timed_in"] or "")
            + (f" (as {row['timing_of']})" if row.get("timing_of") else "")))
    t = r["trials"]
    knobs = config.get("knobs")
    lines = [table(rows, right=(1, 2, 3, 4, 5)),
             f"* exported ({'the winner' if r['selected'] == 'best' else 'chosen trial'})"
             + (f", step built with {knobs_text(knobs)}" if knobs else ""),
             f"trials: {t['trials']} run, {t['completed']} completed; cut "
             + ", ".join(f"{t.get(s.summary_key, 0)} {_cut_at(s)}" for s in Stage) + "; "
             f"{t['failed']} failed; "
             # Plan files from before interrupted trials were counted have no key.
             + (f"{t['interrupted']} interrupted; " if t.get("interrupted") else "")
             + f"{t['cache_hits']} cache hits"
             + (f"; {r['compiles']} compiles this run" if r.get("compiles") is not None
                else "")]
    if r.get("verdict") is not None:
        lines.append(f"verdict: {VERDICTS.get(r['verdict'], r['verdict'])}")
    if r.get("outputs_match") is not None:
        lines.append(
            f"outputs: {'match' if r['outputs_match'] else 'DO NOT match'} the replicated "
            f"plan's (max relative error {r['max_relative_error']:.2g})")
    logged = [row for row in entries if row.get("log_lines")]
    if logged:
        # Caught per candidate, off the terminal (`optimize --verbose` prints them).
        lines.append("XLA log lines while compiling and running:")
        lines += [f"  {_row_name(row)}: {row['log_lines']}, first: "
                  f"{short_log_line(row.get('log_first') or '')}" for row in logged]
    lines += breakdown_lines(config)
    return "\n".join(lines)


def breakdown_lines(config: Mapping[str, Any]) -> list[str]:
    """The exported plan's estimate, part by part, when its results row has one.

    Example: ["estimate of the exported plan (cpu (one simulated device)):",
    "  total 1.2 ms = compute 1 ms + communication 0.2 ms - hidden 0 us (overlap 0)",
    "  compute 1 ms, memory 0.4 ms", "  all-reduce over dp: 0.2 ms, 4x, 1.0 MiB"]

    Raises:
      ValueError: the recorded breakdown is malformed (naming the field).
    """
    winner = config["results"]["winner"]
    if winner.get("breakdown") is None:
        return []
    parts = Breakdown.from_json(winner["breakdown"], "results.winner.breakdown")
    hardware = config.get("hardware") if isinstance(config.get("hardware"), dict) else {}
    about = [str(hardware["model"])] if hardware.get("model") else []
    if hardware.get("dcn_axes"):
        about.append("across hosts: " + ",".join(hardware["dcn_axes"]))
    return (["estimate of the exported plan" + (f" ({'; '.join(about)})" if about else "")
             + ":"] + [f"  {line}" for line in parts.lines()])


def _row_name(row: Mapping[str, Any]) -> str:
    return f"trial {row['trial']}" if row["label"] == "search" else row["label"]


def plan_header(path: str, config: Mapping[str, Any], plan: Any) -> str:
    """Where a plan file was found (mesh, hardware, study), its versions and its rules."""
    recorded = ",".join(f"{k}={v}" for k, v in plan.recorded_mesh)
    search, hardware, versions = (config.get(k) if isinstance(config.get(k), dict) else {}
                                  for k in ("search", "hardware", "versions"))
    lines = [f"plan {path} (schema {config['schema']})"]
    lines.append(f"  found on: mesh {recorded}"
                 + (f", {hardware.get('device_count')} {hardware.get('device_kind')} devices "
                    f"({hardware.get('platform')})" if hardware else "")
                 + (f", estimated as {hardware['model']}" if hardware.get("model") else "")
                 + (f", study {search.get('study')!r}, objective {search.get('objective')}, "
                    f"seed {search.get('seed')}" if search else ""))
    if versions:
        lines.append("  versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if plan.workload is not None or plan.fingerprint is not None:
        lines.append(f"  specs resolved on: {plan.workload} (fingerprint {plan.fingerprint})")
    lines.append("  state rule:")
    lines += [f"    {line}" for line in plan.rule.describe()]
    lines.append("  batch rule:")
    lines += [f"    {line}" for line in plan.batch_rule.describe()]
    if plan.batch_spec is not None:
        lines.append(f"  batch spec: {spec_text(plan.batch_spec)}")
    if plan.knobs:
        lines.append(f"  step knobs: {knobs_text(plan.knobs)} (make_step(**plan.knobs))")
    return "\n".join(lines)


def knobs_text(knobs: Mapping[str, Any]) -> str:
    """`{"remat": "full", "microbatches": 2}` as "remat=full, microbatches=2"."""
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


def leaf_table(mesh: Any, args: Sequence[Any], specs: Sequence[Any]) -> str:
    """Every leaf of the step's arguments: shape, dtype, spec and bytes per device."""
    from ..base.analyzer import ShardingAnalyzer

    analyzer = ShardingAnalyzer(mesh)
    rows = [("path", "shape", "dtype", "spec", "bytes/device")]
    total = 0
    for i, (tree, tree_specs) in enumerate(zip(args, specs, strict=True)):
        usage = analyzer.estimate_memory_usage(tree, tree_specs)
        total += usage["size_per_device"]
        for path, leaf in usage["leaves"].items():
            shape = "[" + ",".join(map(str, leaf["shape"])) + "]"
            rows.append((f"{arg_name(i, len(args))}/{path}", shape, leaf["dtype"],
                         spec_text(leaf["spec"]), _bytes(leaf["bytes_per_device"])))
    return (f"leaves on mesh {axes(mesh)}:\n" + table(rows, right=(4,))
            + f"\nper device: {_bytes(total)} of arguments")


def arg_name(i: int, n: int) -> str:
    """The name of the step's `i`-th of `n` arguments: state, batch, batch1, ..."""
    return "state" if i == 0 else "batch" if n == 2 else f"batch{i}"


def table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Rows as aligned columns (those in `right` right-aligned), two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def times(ratio: float | None) -> str:
    """A speedup ratio: 1.234 → "1.23x", None → "-"."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def spec_text(spec: Any) -> str:
    """A PartitionSpec as Python source, e.g. "P('dp', None)"."""
    from ..base.spec import spec_source, spec_to_json

    return spec_source(spec_to_json(spec))


def axes(mesh: Any) -> str:
    """A mesh's axes as name=size pairs: "dp=2,tp=4"."""
    return axes_text(axis_sizes(mesh))


def axes_of(dims: Sequence[int], names: Sequence[str]) -> str:
    """Axis sizes and names as name=size pairs: (2, 4), ("dp", "tp") → "dp=2,tp=4"."""
    return axes_text(dict(zip(names, dims, strict=True)))
