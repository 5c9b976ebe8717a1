"""Check that every ratio in the recorded benchmark entries agrees with its interval.

A speedup is reported with a 95% CI and a verdict. They must agree: the point
estimate inside its interval, no "faster" whose interval holds 1, and the
figures what the plans' recorded times give with today's
`shardsearch.bench.speedup` (the median per-round ratio and its CI). The
earlier reports took a ratio of medians as the point estimate, which can fall
outside the per-round ratio's interval (`mlp-small-dp8-quarter` × default was
1.18x [1.08–1.16]).

    python benchmarks/intervals/check.py            # exit 1 and one line per problem
    python benchmarks/intervals/check.py --refresh  # recompute from the recorded times,
                                                    # rewrite entries and results.md

Nothing is re-timed: `--refresh` recomputes from the times each entry holds,
then rewrites the suite's `results.md` and plots (`bench.write_report`;
plots need the `bench` extra). `tests/test_bench.py` runs the check in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from shardsearch.bench import (
    interval_problems,
    load_entries,
    load_suite,
    refresh_speedups,
    write_report,
)

RESULTS = Path(__file__).resolve().parents[1] / "results"


def suite_folders(results: Path = RESULTS) -> list[Path]:
    """Every recorded suite folder (one with `entries/` and `machine.json`)."""
    return sorted(p.parent for p in results.rglob("entries")
                  if p.is_dir() and (p.parent / "machine.json").is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--refresh", action="store_true",
                        help="recompute every entry's speedups and rewrite the reports")
    args = parser.parse_args(argv)
    problems = []
    for folder in suite_folders(args.results):
        suite = load_suite(folder.name)
        if args.refresh:
            changed = refresh_speedups(folder)
            if changed:
                notes = write_report(suite, folder)
                print(f"{folder}: {len(changed)} entries recomputed; results.md rewritten"
                      + "".join(f"; {n}" for n in notes))
        for record in load_entries(suite, folder):
            problems += interval_problems(record)
    for line in problems:
        print(line)
    print(json.dumps({"suites": len(suite_folders(args.results)), "problems": len(problems)}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
