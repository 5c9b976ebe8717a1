"""Replays the timing cut on recorded studies: when would `SlowerThanBest`
have cut each timed candidate, against what the recorded pruner did?

Nothing runs: each searched trial that reported its steps (its timed steps;
in studies from b5fb3ac on, its warm-ups after the first before them, as
the search reports them) is set against the best trial completed before
it (by trial number: a suite's studies run one process each), and the rule
is asked after each of its recorded steps, from the second to the one
before the last (a cut after the last stops nothing: the trial completes,
as it does in the search). Per
study it reports the trials the recorded pruner cut while timing and after
how many steps, when the rule would have cut them, the completed trials it
would have cut (and whether one was the study's best, or a finalist it
re-timed), and the share of the study's trial time spent on trials that end up
cut, as recorded and as estimated with the rule: a trial cut earlier saves
its dropped steps at its own mean step time; a trial the rule leaves running
past where the recorded pruner stopped it is counted at its recorded time
for the low estimate and with every step it did not run (to the study's
most, its timed repeats) for the high one.

Usage:
  python benchmarks/pruning/replay.py benchmarks/results/cpu-sim8/studies.db \
      --out benchmarks/results/pruning/cpu-sim8.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import optuna

from shardsearch.search import SlowerThanBest, Stage, Status, TrialRecord, timed_steps

COMPLETE = optuna.trial.TrialState.COMPLETE


def replay(study: optuna.Study, rule: SlowerThanBest) -> dict | None:
    """The study's row, or None when no trial reported timed steps."""
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    records = {t.number: TrialRecord.from_trial(t) for t in trials}
    if not any(t.intermediate_values for t in trials):
        return None
    final_best = min((t for t in trials if t.state == COMPLETE), key=lambda t: t.value,
                     default=None)
    retimed = retimed_plans(study)
    finalists = finalist_numbers(retimed)
    row = {"study": study.study_name, "timed": 0, "recorded_cuts": [],
           "swings": swings(trials, retimed),
           "rule_cuts": [], "cuts_completed": [], "later": 0, "saved_cut": 0.0,
           "saved_completed": 0.0, "moved": 0.0, "extra": 0.0}
    repeats = max(len(t.intermediate_values) for t in trials)
    total = sum(r.seconds for r in records.values() if r is not None)
    cut_time = sum(r.seconds for r in records.values()
                   if r is not None and r.outcome.status == Status.CUT)
    best = None  # the best trial completed before this one
    for trial in trials:
        record = records[trial.number]
        steps = tuple(trial.intermediate_values.values())
        if record is None or not steps or best is None:
            best = better(best, trial)
            continue
        row["timed"] += 1
        # A cut after the last repeat stops nothing: the trial completes.
        at = next((n for n in range(rule.min_steps, min(len(steps), repeats - 1) + 1)
                   if rule.slower(steps[:n], timed_steps(best))), None)
        saved = 0.0 if at is None else (len(steps) - at) * statistics.fmean(steps)
        if record.outcome.status == Status.CUT and record.outcome.cut_stage == Stage.MEASURE:
            row["recorded_cuts"].append(len(steps))
            if at is None:
                row["later"] += 1
                row["extra"] += (repeats - len(steps)) * statistics.fmean(steps)
            else:
                row["rule_cuts"].append(at)
                row["saved_cut"] += saved
        elif at is not None:
            row["cuts_completed"].append(
                (trial.number, at, trial.value / best.value,
                 final_best is not None and trial.number == final_best.number,
                 trial.number in finalists))
            row["saved_completed"] += saved
            row["moved"] += record.seconds - saved  # now time on a cut trial
        best = better(best, trial)
    row["total"] = total
    new_total = total - row["saved_cut"] - row["saved_completed"]
    row["share"] = cut_time / total if total else None
    row["share_rule"] = ((cut_time - row["saved_cut"] + row["moved"]) / new_total
                         if new_total > 0 else None)
    return row


def retimed_plans(study: optuna.Study) -> dict:
    """The plans the study re-timed at its end, by label, with their timings."""
    return (study.user_attrs.get("result") or {}).get("confirmation") or {}


def finalist_numbers(retimed: dict) -> set[int]:
    """The trial numbers among the re-timed plans' labels (baselines have none)."""
    return {_number(label) for label in retimed} - {None}


def better(best: optuna.trial.FrozenTrial | None,
            trial: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial | None:
    """`trial` when it completed with a lower value than `best` (the first
    on a tie), else `best`."""
    if trial.state != COMPLETE or trial.value is None:
        return best
    return trial if best is None or trial.value < best.value else best


def _number(label: str) -> int | None:
    """The trial number in a re-timed plan's label ("trial 15"); None for a baseline's."""
    return int(label.split()[1]) if label.startswith("trial ") else None


def swings(trials: list, retimed: dict) -> list[tuple[str, float, float]]:
    """Each plan the search re-timed at its end: (label, its search value
    over the best search value among them, its re-timed median over that
    plan's re-timed median)."""
    def value(label: str) -> float | None:
        if (number := _number(label)) is not None:
            return next(t.value for t in trials if t.number == number)
        return min((t.value for t in trials if t.value is not None
                    and t.user_attrs.get("label") == label), default=None)

    values = {label: value(label) for label in retimed}
    values = {label: v for label, v in values.items() if v is not None}
    if len(values) < 2:
        return []
    ref = min(values, key=values.get)
    return [(label, values[label] / values[ref],
             retimed[label]["median"] / retimed[ref]["median"])
            for label in sorted(values, key=values.get)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storages", nargs="+", help="studies.db files")
    parser.add_argument("--out", type=Path, help="write the report here (else stdout)")
    parser.add_argument("--p", type=float, default=0.1, help="the rule's level (0.1)")
    parser.add_argument("--margin", type=float, default=SlowerThanBest().margin,
                        help="the rule's margin (its default)")
    parser.add_argument("--source", help="where the studies came from, for the report "
                                         "(e.g. the git command that restores them)")
    args = parser.parse_args(argv)
    rule = SlowerThanBest(args.p, 2, args.margin)
    rows = study_rows(args.storages, "replay.py", lambda study: replay(study, rule))
    if rows is None:
        return 2
    emit(render(rows, args), args.out)
    return 0


def study_rows(storages: list[str], script: str,
               row: Callable[[optuna.Study], dict | None]) -> list[dict] | None:
    """`row(study)` for every study of every storage, those it gives None
    left out; None, said on stderr, when a storage is not a file."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    for path in storages:
        if not Path(path).is_file():
            print(f"{script}: {path} is not a file; give a suite's studies.db", file=sys.stderr)
            return None
        url = f"sqlite:///{Path(path).resolve()}"
        for summary in optuna.get_all_study_summaries(url):
            found = row(optuna.load_study(study_name=summary.study_name, storage=url))
            if found is not None:
                rows.append(found)
    return rows


def emit(text: str, out: Path | None) -> None:
    """The report into `out` (its folder made), else on stdout."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    else:
        print(text)


def render(rows: list[dict], args: argparse.Namespace) -> str:
    command = "python benchmarks/pruning/replay.py " + " ".join(args.storages) + (
        f" --p {args.p}" if args.p != 0.1 else "") + (
        f" --margin {args.margin}" if args.margin != SlowerThanBest().margin else "") + (
        f" --out {args.out}" if args.out else "")
    if args.source:
        command += f' --source "{args.source}"'

    lines = [
        "# The timing cut replayed on recorded studies", "",
        f"`{command}`. Nothing ran: each searched trial that reported its timed steps is "
        f"set against the best trial completed before it, and `SlowerThanBest` (rank-sum, "
        f"p < {args.p}, margin {args.margin:.0%}, from the second step) is asked after each "
        "recorded step (`benchmarks/pruning/replay.py`'s docstring says how time is counted).",
        *(["", f"The studies: {args.source}."] if args.source else []), "",
        "- *timed*: searched trials that reported steps, with a completed trial before them.",
        "- *recorded cuts*: those the recorded pruner cut while timing, and the steps each took.",
        "- *rule*: when the rule cuts the same trials (steps), and how many it leaves running "
        "past where they were cut (*later*).",
        "- *completed, cut by the rule*: trial (step it is cut at, its median over the best's; "
        "**best** when it was the study's best trial, **finalist** when the search re-timed "
        "it at its end).",
        "- *cut share*: time on trials that end up cut over the study's trial time, recorded "
        "and estimated with the rule.", "",
        "| study | timed | recorded cuts (steps) | rule (steps) | later | completed, cut by the "
        "rule | trial time s, recorded → with the rule | cut share recorded | with the rule |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        completed = ", ".join(
            f"{n} ({at}, {ratio:.2f}x{', **best**' if best else ''}"
            f"{', **finalist**' if finalist else ''})"
            for n, at, ratio, best, finalist in r["cuts_completed"]) or "-"
        lines.append(
            f"| {r['study']} | {r['timed']} | {len(r['recorded_cuts'])} "
            f"({_steps(r['recorded_cuts'])}) | {len(r['rule_cuts'])} ({_steps(r['rule_cuts'])})"
            f" | {r['later']} | {completed} | {r['total']:.0f} → {_range(r)} | "
            f"{_pct(r['share'])} | {_pct(r['share_rule'])} |")
    timed = sum(r["timed"] for r in rows)
    recorded = [n for r in rows for n in r["recorded_cuts"]]
    ruled = [n for r in rows for n in r["rule_cuts"]]
    completed = [c for r in rows for c in r["cuts_completed"]]
    lines += ["", f"In all: {timed} timed trials; the recorded pruner cut {len(recorded)} "
              f"(mean {_mean(recorded)} steps); the rule cuts {len(ruled)} of them "
              f"(mean {_mean(ruled)} steps), leaves {sum(r['later'] for r in rows)} running "
              f"longer, and cuts {len(completed)} trials that completed "
              f"({sum(c[3] for c in completed)} of them a study's best, "
              f"{sum(c[4] for c in completed)} a finalist). Trial time "
              f"{sum(r['total'] for r in rows):.0f} s recorded, "
              f"{_range({k: sum(r[k] for r in rows) for k in _TIMES})} s estimated with the "
              "rule.", ""]
    lines += ["## The search's ratios against the re-timing's", "",
              "Each plan a study re-timed at its end (its finalists and the baselines near "
              "them): its search value over the best search value among them, and its "
              "re-timed median (interleaved rounds) over that plan's. A plan the search "
              "timed behind that comes out ahead when re-timed is one a timing cut must "
              "not take.", "",
              "| study | plan: search ratio → re-timed ratio |", "|---|---|"]
    for r in rows:
        if r["swings"]:
            lines.append(f"| {r['study']} | " + "; ".join(
                f"{label} {search:.3f} → {again:.3f}" for label, search, again in r["swings"])
                + " |")
    return "\n".join(lines) + "\n"


_TIMES = ("total", "saved_cut", "saved_completed", "extra")


def _range(r: dict) -> str:
    low = r["total"] - r["saved_cut"] - r["saved_completed"]
    high = low + r["extra"]
    return f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}–{high:.0f}"


def _steps(steps: list[int]) -> str:
    return "/".join(str(n) for n in steps) if steps else "-"


def _mean(values: list[int]) -> str:
    return f"{statistics.fmean(values):.1f}" if values else "-"


def _pct(share: float | None) -> str:
    return f"{share:.0%}" if share is not None else "-"


if __name__ == "__main__":
    raise SystemExit(main())
