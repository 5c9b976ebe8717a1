"""Compile time per candidate in a results folder's studies, as a markdown table.

Reads every study of an Optuna storage (the `studies.db` that `shardsearch
bench` leaves in a suite's results folder) and prints, per study: trials,
candidates compiled (cache hits left out), and the median, largest and total
compile seconds those trials recorded.

    python benchmarks/studies/compile_times.py benchmarks/results/cpu-static256/studies.db
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import optuna


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_file():
        print("usage: compile_times.py STUDIES.db (an existing file)", file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{Path(args[0]).resolve()}"
    print("| study | trials | compiled | compile s, median | largest | total |")
    print("|---|---|---|---|---|---|")
    for summary in sorted(optuna.get_all_study_summaries(storage), key=lambda s: s.study_name):
        trials = optuna.load_study(study_name=summary.study_name,
                                   storage=storage).get_trials(deepcopy=False)
        outcomes = [t.user_attrs.get("outcome") for t in trials]
        outcomes = [json.loads(o) if isinstance(o, str) else o for o in outcomes if o]
        seconds = [o["compile_seconds"] for o in outcomes
                   if o.get("compile_seconds") and not o.get("cache_hit")]
        if not seconds:
            continue
        print(f"| {summary.study_name} | {len(trials)} | {len(seconds)} | "
              f"{statistics.median(seconds):.1f} | {max(seconds):.1f} | {sum(seconds):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
