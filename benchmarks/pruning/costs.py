"""Replays the cut on program costs on recorded studies: which timed
candidates would `Leader.behind` have cut before they ran, and were they
really slower?

Nothing runs. Each searched trial that was timed (it has steps, and is not a
cached copy; baselines, which the search never holds against the leader, are
left out) is set against the study's best trial completed before it
(`recorded_leader` on the trials numbered before it: a suite's studies run
one process each) and the rule is asked with the trial's recorded flops,
collective bytes and bytes accessed (studies recorded before the bytes
accessed were kept compare the other two; the report says which). Per study
it reports the trials the rule cuts, each with its recorded median over the
leader's value and how it ended (cut while timed, or completed); a cut trial
whose median was within the timing cut's margin of the leader's, or that
became the study's best or a finalist, is one the rule must not take. The
time saved is each cut trial's warm-ups and timed steps (its compile stays);
the share of trial time on trials that end up cut is given as recorded and
with the rule.

Usage:
  python benchmarks/pruning/costs.py benchmarks/results/pruning/cpu-sim8-f23c2fb.db \
      --out benchmarks/results/pruning/costs-cpu-sim8-f23c2fb.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import optuna

from shardsearch.search import (
    TRAFFIC_MARGIN,
    SlowerThanBest,
    Stage,
    Status,
    TrialRecord,
    recorded_leader,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import better, emit, finalist_numbers, retimed_plans, study_rows

COMPLETE = optuna.trial.TrialState.COMPLETE


def replay(study: optuna.Study, margin: float, traffic_margin: float) -> dict | None:
    """The study's row, or None when no searched trial was timed."""
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    records = {t.number: TrialRecord.from_trial(t) for t in trials}
    final = min((t for t in trials if t.state == COMPLETE and t.value is not None),
                key=lambda t: (t.value, t.number), default=None)
    finalists = finalist_numbers(retimed_plans(study))
    row = {"study": study.study_name, "timed": 0, "cuts": [], "saved_cut": 0.0,
           "saved_completed": 0.0, "moved": 0.0, "bytes_accessed": False}
    total = sum(r.seconds for r in records.values() if r is not None)
    cut_time = sum(r.seconds for r in records.values()
                   if r is not None and r.outcome.status == Status.CUT)
    best = None  # the best trial completed before this one
    for trial in trials:
        record = records[trial.number]
        # The search's leader is the best completed trial before it (`better`'s
        # first on a tie is `recorded_leader`'s) with its costs, if it has them.
        leader = None if best is None else recorded_leader([best])
        best = better(best, trial)
        # Baselines are timed whatever the leader (the search holds only its
        # own proposals against it); those with readings have params too.
        if (record is None or record.label != "search" or record.outcome.cache_hit
                or not record.outcome.step_times or leader is None):
            continue
        o = record.outcome
        row["timed"] += 1
        row["bytes_accessed"] |= o.bytes_accessed is not None
        if leader.behind(o.flops, o.collective_bytes, o.bytes_accessed, margin,
                         traffic_margin) is None:
            continue
        saved = sum(o.warmup_times) + sum(o.step_times)
        ratio = statistics.median(o.step_times) / leader.value
        timed_cut = o.status == Status.CUT and o.cut_stage == Stage.MEASURE
        row["cuts"].append({
            "trial": trial.number, "ratio": ratio, "flops": o.flops / leader.flops,
            "traffic": (o.bytes_accessed / leader.bytes_accessed
                        if o.bytes_accessed and leader.bytes_accessed else None),
            "ended": "cut while timed" if timed_cut else o.status.value,
            "best": final is not None and trial.number == final.number,
            "finalist": trial.number in finalists, "within": ratio < 1 + margin})
        if timed_cut:
            row["saved_cut"] += saved
        else:
            row["saved_completed"] += saved
            row["moved"] += record.seconds - saved  # now time on a cut trial
    if not row["timed"]:
        return None
    row["total"] = total
    row["new_total"] = total - row["saved_cut"] - row["saved_completed"]
    row["share"] = cut_time / total if total else None
    row["share_rule"] = ((cut_time - row["saved_cut"] + row["moved"]) / row["new_total"]
                         if row["new_total"] > 0 else None)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storages", nargs="+", help="studies.db files")
    parser.add_argument("--out", type=Path, help="write the report here (else stdout)")
    parser.add_argument("--margin", type=float, default=SlowerThanBest().margin,
                        help="the rule's margin on the flops (the timing cut's, by default)")
    parser.add_argument("--traffic-margin", type=float, default=TRAFFIC_MARGIN,
                        help="the rule's margin on the bytes accessed (the search's, by "
                             "default)")
    parser.add_argument("--source", help="where the studies came from, for the report")
    args = parser.parse_args(argv)
    rows = study_rows(args.storages, "costs.py", lambda study: replay(study, args.margin,
                                                                    args.traffic_margin))
    if rows is None:
        return 2
    emit(render(rows, args), args.out)
    return 0


def render(rows: list[dict], args: argparse.Namespace) -> str:
    command = "python benchmarks/pruning/costs.py " + " ".join(args.storages) + (
        f" --margin {args.margin}" if args.margin != SlowerThanBest().margin else "") + (
        f" --traffic-margin {args.traffic_margin}" if args.traffic_margin != TRAFFIC_MARGIN
        else "") + (
        f" --out {args.out}" if args.out else "")
    if args.source:
        command += f' --source "{args.source}"'
    compared = ("flops, collective bytes and bytes accessed"
                if all(r["bytes_accessed"] for r in rows) else
                "flops and collective bytes (these studies did not record bytes accessed, "
                "which the search also compares: it cuts no more than this)")
    lines = [
        "# The cut on program costs replayed on recorded studies", "",
        f"`{command}`. Nothing ran: each searched trial that was timed is set against the "
        "best trial completed before it, and cut when its program moved no fewer bytes "
        f"and did at least {1 + args.margin:g}x that trial's flops per device, or as many "
        f"flops and at least {1 + args.traffic_margin:g}x its bytes accessed "
        f"(`Leader.behind`; compared here: {compared}).",
        *(["", f"The studies: {args.source}."] if args.source else []), "",
        "- *timed*: searched trials that were timed, with a completed trial before them.",
        "- *cut by the rule*: trial (its flops over the leader's, and its bytes accessed "
        "where recorded; its recorded median over "
        "the leader's value; how it ended). **within** marks a median within the margin of "
        "the leader's, **best** the study's best trial, **finalist** one it re-timed at "
        "its end: the cuts the rule must not make.",
        "- *trial time*: recorded, and less each cut trial's warm-ups and timed steps.",
        "- *cut share*: time on trials that end up cut over the trial time.", "",
        "| study | timed | cut by the rule | trial time s, recorded → with the rule | cut "
        "share recorded | with the rule |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cuts = "; ".join(
            f"{c['trial']} ({c['flops']:.2f}x flops, "
            + (f"{c['traffic']:.2f}x bytes, " if c["traffic"] is not None else "")
            + f"{c['ratio']:.2f}x time, {c['ended']}"
            + "".join(f", **{flag}**" for flag in ("within", "best", "finalist") if c[flag])
            + ")" for c in r["cuts"]) or "-"
        lines.append(f"| {r['study']} | {r['timed']} | {cuts} | {r['total']:.0f} → "
                     f"{r['new_total']:.0f} | {_pct(r['share'])} | {_pct(r['share_rule'])} |")
    cuts = [c for r in rows for c in r["cuts"]]
    wrong = [c for c in cuts if c["within"] or c["best"] or c["finalist"]]
    ratios = [c["ratio"] for c in cuts]
    lines += ["", f"In all: {sum(r['timed'] for r in rows)} timed trials; the rule cuts "
              f"{len(cuts)} of them before they run"
              + (f" (recorded medians {min(ratios):.2f}x to {max(ratios):.2f}x the leader's)"
                 if ratios else "")
              + f", {len(wrong)} within the margin, a study's best or a finalist. Trial time "
              f"{sum(r['total'] for r in rows):.0f} s recorded, "
              f"{sum(r['new_total'] for r in rows):.0f} s with the rule.", ""]
    return "\n".join(lines)


def _pct(share: float | None) -> str:
    return f"{share:.0%}" if share is not None else "-"


if __name__ == "__main__":
    raise SystemExit(main())
