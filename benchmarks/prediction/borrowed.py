"""Stage 1 borrowing ratios from other pools, replayed on finished suites' studies.

    python benchmarks/prediction/borrowed.py OUT.md FOLDER [FOLDER ...]

Each FOLDER is a `shardsearch bench --out` suite folder (`<out>/<suite>`)
with `studies.db`, `entries/` and `machine.json` (whose command made it).
For every entry with a memory limit (its budget, or its hardware model's
memory), every candidate XLA compiled, with its total and its prediction
recorded, is judged in trial order by stage 1's rule (the least ratio XLA
total / prediction among the candidates before it, times the prediction,
over the limit by more than the square root of those ratios' spread), with
its ratios taken three ways:

- *own pool*: its pool's alone (`prediction_pool`), judged once the pool
  holds three: stage 1 before 2026-12-07's borrowing;
- *borrowed when placed*: `pool_ratios` as stage 1 calls it now: a candidate
  whose activations' batch is placed, its pool holding fewer than three,
  borrows those of every candidate whose batch is placed;
- *borrowed always*: every candidate borrows the study's ratios while its
  pool holds fewer than three, its batch placed or not.

*right*: a cut the compiler also put over the limit; *false*: a cut of a
candidate it fit; *missed*: over the limit, not cut. *seconds*: the trial
seconds of the right cuts, what cutting before compiling saves. A replay:
the trials stay as they ran, where a cut would have changed what the
sampler proposed next. Studies run with `--memory-prediction record`
compiled every candidate; the others compiled only what stage 1 let
through, so their candidates cut before compiling are not judged here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
from margins import SAMPLES, suite_studies, write_report  # beside this file

from shardsearch.search import over_by_prediction, pool_ratios, prediction_pool, stage_margin

WAYS = ("own pool", "borrowed when placed", "borrowed always")


def ratios_for(way: str, by_pool: dict, knobs: dict) -> tuple[tuple[float, ...], bool]:
    """The ratios a candidate of `knobs` is scaled by, and whether borrowed."""
    if way == "borrowed when placed":
        return pool_ratios(by_pool, knobs)
    own = tuple(by_pool.get(prediction_pool(knobs), ()))
    if way == "own pool" or len(own) >= SAMPLES:
        return own, False
    every = tuple(r for values in by_pool.values() for r in values)
    return (every, True) if len(every) >= SAMPLES else (own, False)


def judge(trials: list, limit: int, way: str) -> tuple[list[float], list[str]]:
    """`[right, false, missed, seconds]` and a line per borrowed or false cut."""
    counts, lines = [0, 0, 0, 0.0], []
    by_pool: dict = {}
    seen: set[str] = set()
    for trial in trials:
        outcome = trial.user_attrs.get("outcome") or {}
        memory = outcome.get("memory") or {}
        total, predicted = memory.get("total"), memory.get("predicted")
        fingerprint = outcome.get("fingerprint") or f"trial {trial.number}"
        if not total or not predicted or fingerprint in seen:
            continue
        seen.add(fingerprint)
        knobs = trial.user_attrs.get("knobs") or {}
        ratios, borrowed = ratios_for(way, by_pool, knobs)
        if len(ratios) >= SAMPLES:
            margin = stage_margin(ratios)
            cut = over_by_prediction(predicted, ratios, limit, margin)
            if cut and total > limit:
                counts[0] += 1
                counts[3] += trial.user_attrs.get("seconds") or 0.0
            elif cut:
                counts[1] += 1
            elif total > limit:
                counts[2] += 1
            if cut and (borrowed or total <= limit):
                lines.append(
                    f"trial {trial.number} ({json.dumps(knobs) if knobs else 'no knobs'}): "
                    f"predicted {predicted / 2**30:.1f} GiB x {min(ratios):.2f}, margin "
                    f"{margin:.2f}, limit {limit / 2**30:.1f} GiB; compiled "
                    f"{total / 2**30:.1f} GiB: {'right' if total > limit else 'FALSE'}"
                    + (f" (borrowed {len(ratios)} ratios)" if borrowed else ""))
        by_pool.setdefault(prediction_pool(knobs), []).append(total / predicted)
    return counts, lines


def main(argv: list[str]) -> int:
    out, folders = Path(argv[0]), [Path(f) for f in argv[1:]]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    lines = ["# Stage 1 borrowing ratios from other pools, replayed", "",
             f"Command: `python benchmarks/prediction/borrowed.py {' '.join(argv)}`", "",
             "The studies (each folder's `machine.json` command):", ""]
    rows, notes = [], []
    totals = {way: [0, 0, 0, 0.0] for way in WAYS}
    for folder in folders:
        machine = json.loads((folder / "machine.json").read_text())
        lines.append(f"- `{folder}`: `{machine.get('command')}` "
                     f"({machine.get('recorded_at', '?')[:10]})")
        for name, limit, trials in suite_studies(folder):
            cells = []
            for way in WAYS:
                counts, said = judge(trials, limit, way)
                totals[way] = [a + b for a, b in zip(totals[way], counts, strict=True)]
                cells.append(f"{counts[0]} / {counts[1]} / {counts[2]}")
                notes += [f"- {name}, {way}: {s}" for s in said]
            rows.append(f"| {name} | {limit / 2**30:.0f} | " + " | ".join(cells) + " |")
    lines += ["", "Right / false / missed cuts per entry (module docstring):", "",
              "| entry | limit GiB | " + " | ".join(WAYS) + " |",
              "|---|---|" + "---|" * len(WAYS), *rows,
              "| all | | " + " | ".join(f"**{r} / {f} / {m}** ({s:.0f} s)"
                                      for r, f, m, s in totals.values()) + " |",
              "", "Cuts made on borrowed ratios, and false cuts:", "", *notes]
    return write_report(out, lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
