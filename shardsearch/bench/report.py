"""Benchmark reports: the machine, one Markdown table per suite, and plots.

Everything here reads the entry files the runner wrote, so a report can be
regenerated at any time from whatever entries have finished. Plots need
matplotlib (the `bench` extra); without it they are skipped with a note.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base.host import meminfo_bytes, proc_field
from ..base.jsonfile import read_json
from ..base.units import format_bytes as _bytes
from ..base.warnings import ShardsearchWarning
from ..plan.writer import strict_json
from ..search.evaluation import confirm as _confirm
from ..search.evaluation.objectives import is_estimate
from ..search.evaluation.stages import Stage
from . import published_report as _published

MATPLOTLIB_MISSING = ("plots skipped: matplotlib is not installed (pip install "
                      "'shardsearch[bench]' or pip install matplotlib)")


def machine_info(command: str = "") -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, memory, devices, versions.

    Example: `{"cpu": "AMD EPYC 7B13", "cores": 2, "memory_bytes": 25..., ...}`.
    """
    import jax

    from ..plan.writer import versions

    devices = jax.devices()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "cpu": proc_field("/proc/cpuinfo", "model name") or platform.processor() or None,
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "memory_bytes": meminfo_bytes("MemTotal"),
        "os": platform.platform(),
        "devices": {"platform": devices[0].platform, "device_kind": devices[0].device_kind,
                    "count": len(devices)},
        "versions": versions(),
        "command": command,
        "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


# --------------------------------------------------------------------------- speedups


def speedups(plans: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The winner against replicated, default, the best expert that fits, and
    (simulated meshes) one device."""
    by = {p["label"]: p for p in plans}
    winner = by["winner"]
    best = best_expert(plans)
    out = {"vs_replicated": speedup(winner, by.get("replicated")),
           "vs_default": speedup(winner, by.get("default")),
           "vs_best_expert": speedup(winner, best)}
    if "single_device" in by:
        single = speedup(winner, by["single_device"])
        if single["speedup"]:
            single["time_ratio"] = 1 / single["speedup"]
        out["vs_single_device"] = single
    return out


def best_expert(plans: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The fastest expert plan with a time (ties: by label); None if none has one."""
    experts = [p for p in plans if p["role"] == "expert" and p["median_seconds"] is not None]
    return min(experts, key=lambda p: (p["median_seconds"], p["label"]), default=None)


def speedup(winner: Mapping[str, Any], ref: Mapping[str, Any] | None) -> dict[str, Any]:
    """The winner against one reference plan, as `results.md` reports it.

    Args:
      winner, ref: plan rows as an entry file holds them (`label`, `role`,
        `status`, `fingerprint`, `median_seconds`, `times` one per round);
        `ref` None: no reference fits.

    Returns:
      `reference` (its label), `speedup` = the median of the per-round
      ratios reference / winner (above 1: the winner is faster; for static
      estimates, which have no rounds, the ratio of the two estimates),
      `ratio_ci` (the 95% CI of that median, from order statistics, so it
      always holds the point estimate), `verdict` ("faster" when a paired
      one-sided Wilcoxon test says so and the whole interval is above 1,
      "slower" the other way round, else "tie"; "same plan" for equal specs)
      and `note` (why a figure is missing). Example: winner times [1, 1,
      ...], reference [2, 2, ...] (6 rounds) → `{"speedup": 2.0, "ratio_ci":
      [2.0, 2.0], "verdict": "faster", ...}`.
    """
    out: dict[str, Any] = {"reference": ref["label"] if ref else None, "speedup": None,
                           "ratio_ci": None, "verdict": None, "note": None}
    if ref is None:
        out["note"] = "no expert plan fits the budget"
        return out
    if ref["median_seconds"] is None or winner["median_seconds"] is None:
        out["note"] = f"{ref['label']}: {ref['status']}"
        return out
    if ref["fingerprint"] == winner["fingerprint"] and ref["role"] != "single_device":
        return {**out, "speedup": 1.0, "ratio_ci": [1.0, 1.0], "verdict": "same plan"}
    a, b = winner["times"], ref["times"]
    if not (a and b):
        out["speedup"] = ref["median_seconds"] / winner["median_seconds"]
        out["note"] = "static estimates: no confidence interval, no test"
        return out
    # The point estimate is the statistic the interval is about: the ratio of
    # two medians can fall outside the per-round ratio's interval.
    ratios = [r / w for r, w in zip(b, a, strict=True)]
    out["speedup"] = statistics.median(ratios)
    lo, hi = _confirm.median_ci(ratios)
    out["ratio_ci"] = [lo, hi]
    if len(a) < _confirm.MIN_ROUNDS:
        out["note"] = f"fewer than {_confirm.MIN_ROUNDS} paired rounds: no significance test"
    else:
        out["verdict"] = ("faster" if _confirm.faster_than(a, b) and lo > 1 else
                          "slower" if _confirm.faster_than(b, a) and hi < 1 else "tie")
    return out


def interval_problems(record: Mapping[str, Any]) -> list[str]:
    """Every reported ratio of an entry record that disagrees with its own
    interval, or with its plans' times: empty when the record is consistent.

    Checked per comparison (`speedups`): the point estimate lies inside
    `ratio_ci`; a "faster" verdict has its whole interval above 1, a "slower"
    one below 1; and the stored figures are what `speedups` computes from the
    plans' recorded times today (a record from before a change to them is
    stale, and `refresh_speedups` rewrites it).
    """
    where = f"{record.get('suite', '?')}/{record.get('entry', {}).get('id', '?')}"
    problems = []
    for key, s in record.get("speedups", {}).items():
        ratio, ci, verdict = s.get("speedup"), s.get("ratio_ci"), s.get("verdict")
        if ratio is not None and ci is not None and not ci[0] <= ratio <= ci[1]:
            problems.append(f"{where} {key}: {ratio:.4f}x outside its interval "
                            f"[{ci[0]:.4f}, {ci[1]:.4f}]")
        if verdict == "faster" and (ci is None or ci[0] <= 1):
            problems.append(f"{where} {key}: 'faster' with an interval {ci} that holds 1")
        if verdict == "slower" and (ci is None or ci[1] >= 1):
            problems.append(f"{where} {key}: 'slower' with an interval {ci} that holds 1")
    if "plans" in record and record.get("speedups") != speedups(record["plans"]):
        problems.append(f"{where}: its speedups are not what its plans' times give today; "
                        "run benchmarks/intervals/check.py --refresh")
    return problems


def refresh_speedups(folder: Path) -> list[str]:
    """Recomputes every entry's `speedups` under `folder/entries` from its
    plans' recorded times (nothing is re-run), rewriting the files whose
    figures change; returns their names."""
    changed = []
    for path in sorted((folder / "entries").glob("*.json")):
        record = read_json(path)
        fresh = speedups(record["plans"])
        if record.get("speedups") != fresh:
            record["speedups"] = fresh
            text = json.dumps(strict_json(record), indent=1, sort_keys=True, allow_nan=False)
            path.write_text(text + "\n", encoding="utf-8")
            changed.append(path.name)
    return changed


# --------------------------------------------------------------------------- reading


def load_entries(suite: Any, folder: Path) -> list[dict[str, Any]]:
    """Finished entry records under `folder/entries`, in suite order (others last)."""
    records = {}
    for path in sorted((folder / "entries").glob("*.json")):
        try:
            records[path.stem] = read_json(path)
        except (OSError, ValueError):  # also a damaged file: not UTF-8, too deep
            continue  # a file being written by another run; its next report has it
    order = [e.id for e in suite.entries]
    return [records[k] for k in sorted(records, key=lambda k: (
        order.index(k) if k in order else len(order), k))]


def write_report(suite: Any, folder: Path) -> list[str]:
    """Rewrites `results.md` and the plots from the finished entries.

    Returns:
      Notes for the user (e.g. that plots were skipped).
    """
    records = load_entries(suite, folder)
    machine = _read(folder / "machine.json") or {}
    (folder / "results.md").write_text(
        markdown(suite, records, machine, load_rechecks(folder, records)), encoding="utf-8")
    if not records:
        return []
    notes = (_published.plot(records, folder / "published.png")
             if _published.has_published(records) else [])
    return notes + plot_speedups(suite.name, records, folder / "speedups.png")


def load_rechecks(folder: Path, records: Sequence[Mapping[str, Any]],
                  ) -> dict[str, dict[str, Any] | None]:
    """The fresh-process re-timings of `folder/recheck.json`
    (`benchmarks/recheck/run.py`) by entry id: the recheck's entry where it
    re-timed the run `records` hold, None where it re-timed an earlier run of
    the entry (its winner may not be today's). Empty without the file."""
    path = folder / "recheck.json"
    summary = _read(path)
    if not isinstance(summary, dict):
        if path.exists():
            warnings.warn(ShardsearchWarning(
                f"{path} cannot be read as a recheck (damaged, or not a JSON object): the "
                "report shows no recheck; rerun benchmarks/recheck/run.py"), stacklevel=2)
        return {}
    by_id = {r["entry"]["id"]: r for r in records}
    out: dict[str, dict[str, Any] | None] = {}
    for e in summary.get("entries", []):
        record = by_id.get(e.get("entry"))
        if record is None:
            continue
        if "entry_finished_at" in e:
            current = e["entry_finished_at"] == record.get("finished_at")
        else:
            # A recheck from before it named the run: it re-timed this run if
            # the suite's figure it quotes is this record's.
            plans = {p["label"]: p for p in record["plans"]}
            ref = plans.get(e["reference"])
            current = ref is not None and (
                speedup(plans["winner"], ref)["speedup"] == e["recorded"]["speedup"])
        out[e["entry"]] = e if current else None
    return out


def recheck_summary(rechecks: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """One paragraph: the verdicts of the fresh-process re-timings, counted
    over every run of every entry rechecked (`load_rechecks`)."""
    current = [e for e in rechecks.values() if e is not None]
    if not current:
        return []
    verdicts: dict[str, int] = {}
    for e in current:
        for r in e["repetitions"]:
            verdict = r["verdict"] or "not tested"
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
    runs = sum(verdicts.values())
    counts = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items(), key=lambda kv: -kv[1]))
    stale = len(rechecks) - len(current)
    entries = f"{len(current)} entr{'y' if len(current) == 1 else 'ies'}"
    return ["", f"Rechecked in a fresh process: {entries}, {runs} run{'s' * (runs != 1)}: "
            f"{counts}"
            + (f" ({stale} more rechecked an earlier run)." if stale else ".")]


def recheck_cell(record: Mapping[str, Any],
                 rechecks: Mapping[str, Mapping[str, Any] | None]) -> str:
    """The report's *rechecked* cell: each fresh-process re-timing of the
    entry's winner (`load_rechecks`), against its reference when that is not
    the best expert."""
    entry = record["entry"]["id"]
    if entry not in rechecks:
        return "-"
    e = rechecks[entry]
    if e is None:
        return "stale (an earlier run's winner)"
    runs = "; ".join(format_speedup(r) for r in e["repetitions"])
    best = record["speedups"]["vs_best_expert"]["reference"]
    return runs if e["reference"] == best else f"vs {e['reference']}: {runs}"


def _read(path: Path) -> Any:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- markdown


def markdown(suite: Any, records: Sequence[Mapping[str, Any]],
             machine: Mapping[str, Any],
             rechecks: Mapping[str, Mapping[str, Any] | None] | None = None) -> str:
    """The suite's results table, one row per finished entry; with
    `rechecks` (`load_rechecks`), the winners' fresh-process re-timings
    beside their headline ratios."""
    rechecks = rechecks or {}
    versions = machine.get("versions") or {}
    memory = machine.get("memory_bytes")
    static = any(is_estimate(r["objective"]) for r in records)
    # Entries recorded before the winner's differences were kept have none:
    # their reports keep the columns they had.
    changes = any("differs" in _winner(r) for r in records)
    columns = ["entry", "workload", "mesh", "budget/device", "winner", "ms [95% CI]",
               "replicated ms", "default ms", "best expert ms", "× replicated", "× default",
               "× best expert", *(["winner changes"] if changes else []),
               *(["rechecked in a fresh process"] if rechecks else []), "× 1 device",
               "memory/device", "search"]
    lines = [
        f"# Benchmark suite `{suite.name}`", "",
        *([suite.description, ""] if suite.description else []),
        f"{len(records)} of {len(suite.entries)} entries finished. Machine: "
        f"{machine.get('cpu')}, {machine.get('cores')} cores, "
        f"{_bytes(memory) if memory else '?'} memory; jax {versions.get('jax')}, jaxlib "
        f"{versions.get('jaxlib')}, optuna {versions.get('optuna')} (details in "
        f"`machine.json`, raw numbers in `entries/<id>.json`).", "",
        _commands(records, machine), "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for r in records:
        plans = {p["label"]: p for p in r["plans"]}
        s = r["speedups"]
        best = s["vs_best_expert"]["reference"]
        winner = plans["winner"]
        lines.append("| " + " | ".join([
            r["entry"]["id"], r["workload"],
            ",".join(f"{k}={v}" for k, v in r["mesh"].items()),
            _budget(r["budget"]),
            f"{winner.get('source')}" + (" (est.)" if is_estimate(r["objective"]) else "")
            + (f", {winner['family']} family" if winner.get("family") else ""),
            _ms(winner), _ms(plans.get("replicated")), _ms(plans.get("default")),
            f"{best}: {_ms(plans[best])}" if best else "none fits",
            format_speedup(s["vs_replicated"]), format_speedup(s["vs_default"]),
            format_speedup(s["vs_best_expert"]),
            *([winner_changes(winner)] if changes else []),
            *([recheck_cell(r, rechecks)] if rechecks else []),
            format_speedup(s["vs_single_device"]) if "vs_single_device" in s else "-",
            _memory(winner), _search(r["search"]),
        ]) + " |")
    lines += ["", *versus_expert(records), *recheck_summary(rechecks), "",
              *skipped_experts(records), *LEGEND]
    if changes:
        lines.append(CHANGES_LEGEND)
    if rechecks:
        lines.append(RECHECK_LEGEND)
    if static:
        lines += ["- Entries with objective `static` show XLA-based estimates, not "
                  "measurements: no CI and no verdict."]
    text = "\n".join(lines) + "\n"
    if _published.has_published(records):
        # Entries compared with published runs: that comparison first, then the table.
        head, table, rest = text.partition("| entry | workload |")
        text = (f"{head}{_published.markdown(records, _commands(records, machine))}"
                f"## Every plan the search compared\n\n{table}{rest}")
    return text


def _winner(record: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(p for p in record["plans"] if p["label"] == "winner")


def winner_changes(winner: Mapping[str, Any]) -> str:
    """The report's *winner changes* cell: the dimensions in which the winner
    differs from the best expert plan (`search.space.plan_differences`)."""
    differs = winner.get("differs")
    if differs is None:
        return "-"
    return "; ".join(differs["dimensions"]) or "nothing (same plan)"


def _commands(records: Sequence[Mapping[str, Any]], machine: Mapping[str, Any]) -> str:
    """The command(s) that produced the entries: one line, each command with
    the entries it produced when they are not all from one run."""
    by: dict[str, list[str]] = {}
    for r in records:
        command = (r.get("machine") or {}).get("command") or machine.get("command", "")
        by.setdefault(command, []).append(r["entry"]["id"])
    if len(by) <= 1:
        return f"Command: `{next(iter(by), machine.get('command', ''))}`"
    return "Commands: " + "; ".join(
        f"`{command}` ({', '.join(ids) if len(ids) <= 3 else f'{len(ids)} entries'})"
        for command, ids in sorted(by.items(), key=lambda kv: -len(kv[1]))) + "."


def versus_expert(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One paragraph: how the winners fared against the best expert plan that
    fits, counted by verdict, with every entry where the winner was slower
    and the largest significant (or estimated) speedup. Static estimates,
    which have no test, count as "faster (est.)", "equal (est.)" or
    "slower (est.)"."""
    verdicts: dict[str, list[tuple[float, str, str]]] = {}
    for r in records:
        s = r["speedups"]["vs_best_expert"]
        verdict = s["verdict"] or _estimate_verdict(s)
        verdicts.setdefault(verdict, []).append((s["speedup"] or 0.0, r["entry"]["id"],
                                                 format_speedup(s)))
    if not verdicts:
        return []
    order = ["faster", "faster (est.)", "tie", "equal (est.)", "same plan", "slower",
             "slower (est.)", "not tested", "no expert fits"]
    counts = ", ".join(f"{len(verdicts[v])} {v}" for v in order if v in verdicts)
    text = f"Winner against the best expert plan that fits: {counts}."
    slower = verdicts.get("slower", []) + verdicts.get("slower (est.)", [])
    if slower:
        text += " Slower: " + "; ".join(f"{entry} {shown}" for _x, entry, shown in
                                         sorted(slower, key=lambda t: t[1])) + "."
    faster = verdicts.get("faster", []) + verdicts.get("faster (est.)", [])
    if faster:
        _x, entry, shown = max(faster)
        text += f" Largest speedup: {entry} {shown}."
    return [text]


# Static estimates have no noise; within this factor they count as equal.
ESTIMATE_TOLERANCE = 0.01


def _estimate_verdict(s: Mapping[str, Any]) -> str:
    if s["reference"] is None:
        return "no expert fits"
    if s["speedup"] is None or s["ratio_ci"] is not None:
        return "not tested"
    if s["speedup"] > 1 + ESTIMATE_TOLERANCE:
        return "faster (est.)"
    return "slower (est.)" if s["speedup"] < 1 - ESTIMATE_TOLERANCE else "equal (est.)"


def skipped_experts(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The expert plans that do not apply to an entry (wrong mesh, shapes a
    mesh axis does not divide, no experts to split), one line per reason, so
    a "none fits" is never left unexplained."""
    by_reason: dict[str, tuple[list[str], list[str]]] = {}
    for r in records:
        for name, reason in sorted((r.get("experts_skipped") or {}).items()):
            names, entries = by_reason.setdefault(reason, ([], []))
            if name not in names:
                names.append(name)
            if r["entry"]["id"] not in entries:
                entries.append(r["entry"]["id"])
    if not by_reason:
        return []
    return ["Expert plans that do not apply (not timed):", "",
            *(f"- {', '.join(names)} on {', '.join(entries)}: {reason}"
              for reason, (names, entries) in by_reason.items()), ""]


LEGEND = (
    "How to read it:",
    "",
    "- *winner*: what the search chose (`search (trial N)`, or the baseline that won).",
    "- *ms [95% CI]*: median step time over the interleaved comparison rounds, with a "
    "distribution-free 95% confidence interval of the median. Every plan of an entry was "
    "timed in the same run. `no fit (X)`: the plan needs X per device, over the budget "
    "(not timed).",
    "- *× reference*: reference median / winner median (above 1x: the winner is faster), "
    "the 95% CI of the per-round ratio, and the one-sided paired Wilcoxon verdict "
    "(`faster`, `slower`, `tie`; `same plan` when the winner is that plan).",
    "- *× 1 device*: the same step, replicated, on one device of the same machine "
    "(simulated CPU meshes only: all simulated devices share the real cores).",
    "- *memory/device*: the winner's XLA total per device (arguments from the analyzer).",
    "- *search*: wall time of the search, compiles, trials (completed / cut at check, "
    "compile, measure / failed / cache hits) and the share of trial time spent on "
    "candidates that were cut. An entry re-run with `--force` over a finished study runs "
    "no trial: it shows the wall time and compiles of the earlier runs that searched "
    "(the trials' own time when those were not recorded), then this run's (the "
    "confirmation's).",
)


CHANGES_LEGEND = (
    "- *winner changes*: the dimensions in which the winner differs from the best expert "
    "plan: the leaves of the parameters, the optimizer state or the batch whose split "
    "differs (of all of them), and each step knob, the expert's value after \"other:\" "
    "(`-` for an entry recorded before this was kept, or with no expert that fits).")


RECHECK_LEGEND = (
    "- *rechecked in a fresh process*: the winner loaded from its exported plan file and "
    "re-timed against the reference in separate interleaved runs after the suite "
    "(`recheck.md`, `benchmarks/recheck/run.py`), one ratio per run as *× reference*; "
    "`-`: not rechecked; `stale`: the recheck timed an earlier run's winner.")


def _ms(plan: Mapping[str, Any] | None) -> str:
    if plan is None:
        return "-"
    if plan["median_seconds"] is None:
        mem = plan["memory_per_device"]
        need = mem.get("total", mem.get("arguments"))
        if plan["status"] == "does not fit":
            return f"no fit ({_bytes(need)})" if need is not None else "no fit"
        return plan["status"] or "-"
    text = f"{plan['median_seconds'] * 1e3:.3g}"
    if plan["ci_seconds"]:
        lo, hi = plan["ci_seconds"]
        text += f" [{lo * 1e3:.3g}–{hi * 1e3:.3g}]"
    return text


def format_speedup(s: Mapping[str, Any]) -> str:
    """A `speedup` record as the report shows it, e.g. "1.28x [1.10–1.41] faster"
    ("-" when there is no figure)."""
    if s["speedup"] is None:
        return "-"
    text = f"{s['speedup']:.2f}x"
    if s["ratio_ci"] and s["verdict"] != "same plan":
        text += f" [{s['ratio_ci'][0]:.2f}–{s['ratio_ci'][1]:.2f}]"
    return text + (f" {s['verdict']}" if s["verdict"] else "")


def _budget(budget: Mapping[str, Any]) -> str:
    if budget["bytes"] is None:
        return "none"
    return _bytes(budget["bytes"]) + (f" ({budget['spec']})" if budget["spec"] in (
        "quarter", "published") else "")


def _memory(plan: Mapping[str, Any]) -> str:
    mem = plan["memory_per_device"]
    text = _bytes(mem["total"]) if "total" in mem else "-"
    return text + (f" (args {_bytes(mem['arguments'])})" if "arguments" in mem else "")


def _search(s: Mapping[str, Any]) -> str:
    t = s["trials"]
    share = f"{s['cut_share']:.0%}" if s["cut_share"] is not None else "-"
    cost = f"{s['wall_seconds']:.0f} s, {s['compiles']} compiles"
    if s.get("trials_before") and s["trials_before"] >= t["trials"]:
        # A rerun over a finished study ran no trial: its wall time and
        # compiles are the confirmation's. The search's cost is that of the
        # earlier runs that ran trials, when they were recorded, else the
        # trials' own time.
        ran = [r for r in s.get("earlier_runs", []) if r["new_trials"] > 0]
        searched = (f"{sum(r['wall_seconds'] for r in ran):.0f} s, "
                    f"{sum(r['compiles'] for r in ran)} compiles in "
                    f"{'the earlier run' if len(ran) == 1 else f'{len(ran)} earlier runs'}"
                    if ran else f"{s['trial_seconds']:.0f} s in trials")
        if ran and ran[0].get("trials_before"):
            searched += f" (+ {ran[0]['trials_before']} earlier trials)"
        cost = f"{searched}; resumed, no new trial (this run {cost})"
    elif s.get("trials_before"):
        cost += f" (+ {s['trials_before']} earlier trials)"
    # The columns recorded reports have; a later stage (estimate) is added
    # only where it cut something, so those reports regenerate unchanged.
    columns = (Stage.CHECK, Stage.COMPILE, Stage.MEASURE)
    later = "".join(f"; {t[s.summary_key]} cut at {s.label}" for s in Stage
                    if s not in columns and t.get(s.summary_key))
    return (f"{cost}; {t['trials']} trials: "
            f"{t['completed']} / {', '.join(str(t.get(s.summary_key, 0)) for s in columns)} / "
            f"{t['failed']} / {t['cache_hits']}{later}; {share} on cut{_prediction(s)}")


def _prediction(s: Mapping[str, Any]) -> str:
    """Stage 1's memory prediction in a search (`study.record.prediction_summary`);
    nothing for records from before it existed."""
    p = s.get("prediction")
    if not p:
        return ""
    text = f"; prediction ({s.get('memory_prediction', 'cut')}): {p['cut_before_compile']} cut"
    if p["judged"]:
        text += (f", {p['agree']}/{p['judged']} verdicts agree ({p['false_cuts']} false cuts, "
                 f"{p['missed']} missed)")
    return text


def entry_line(record: Mapping[str, Any]) -> str:
    """One line for the log: the winner, its time and its speedups."""
    winner = next(p for p in record["plans"] if p["label"] == "winner")
    s = record["speedups"]
    parts = [f"winner {winner.get('source')} {_ms(winner)} ms"]
    for key, name in (("vs_replicated", "replicated"), ("vs_default", "default"),
                      ("vs_best_expert", f"best expert {s['vs_best_expert']['reference']}"),
                      ("vs_single_device", "1 device")):
        if key in s and s[key]["speedup"] is not None:
            parts.append(f"{format_speedup(s[key])} vs {name}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- plots


def plot_speedups(suite_name: str, records: Sequence[Mapping[str, Any]],
                  path: Path) -> list[str]:
    """Bars of the winner's speedups, one panel per workload, CIs as error bars.

    Returns:
      `[]`, or a note saying why nothing was drawn.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [MATPLOTLIB_MISSING]
    refs = (("vs_replicated", "replicated"), ("vs_default", "default"),
            ("vs_best_expert", "best expert"), ("vs_single_device", "1 device"))
    workloads = list(dict.fromkeys(r["workload"] for r in records))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 4.2),
                             squeeze=False)
    for ax, name in zip(axes[0], workloads, strict=True):
        rows = [r for r in records if r["workload"] == name]
        width = 0.8 / len(refs)
        for j, (key, label) in enumerate(refs):
            xs, ys, errs = [], [], [[], []]
            for i, r in enumerate(rows):
                s = r["speedups"].get(key)
                if not s or s["speedup"] is None:
                    continue
                lo, hi = s["ratio_ci"] or (s["speedup"], s["speedup"])
                xs.append(i + (j - (len(refs) - 1) / 2) * width)
                ys.append(s["speedup"])
                errs[0].append(max(s["speedup"] - lo, 0))
                errs[1].append(max(hi - s["speedup"], 0))
            if xs:
                # Bars grow from 1x, up when the winner is faster, down when slower.
                ax.bar(xs, [y - 1 for y in ys], width, bottom=1, yerr=errs, capsize=2,
                       label=label, color=f"C{j}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([_short(r) for r in rows], rotation=30, ha="right", fontsize=8)
        ax.set_title(name)
        ax.set_ylabel("winner's speedup (x)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{suite_name}: shardsearch's winner against each reference")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return []


def _short(record: Mapping[str, Any]) -> str:
    mesh = ",".join(f"{k}={v}" for k, v in record["mesh"].items())
    spec = record["budget"]["spec"]
    return mesh + (f"\n{spec}" if spec else "")
