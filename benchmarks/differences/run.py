"""Name what each recorded winner changes against the best expert plan.

A suite run records, beside each winner, the dimensions in which it differs
from the best expert plan that fits (the report's *winner changes*: the
parameters', optimizer state's and batch's splits, and each step knob).
Entries recorded before that was kept lack it; this script adds it from each
winner's exported plan file and the expert plan rebuilt on the entry's mesh
(abstract arguments only: nothing compiles or runs), then rewrites the
suite's `results.md` and plots.

    python benchmarks/differences/run.py --suite cpu-static64 --results benchmarks/results/logical
    python benchmarks/differences/run.py --suite cpu-sim8 --results benchmarks/results

Run from the repository root (the entries' `rule_file` paths are relative
to it), shardsearch installed (`pip install -e .`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shardsearch.bench import load_suite, prepare_devices, record_differences, write_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", required=True, help="suite name or file (as for `bench`)")
    p.add_argument("--results", default="benchmarks/results",
                   help="where the suite's results are (default benchmarks/results)")
    a = p.parse_args(argv)
    try:
        suite = load_suite(a.suite)
        prepare_devices(suite)
        folder = Path(a.results) / suite.name
        changed, skipped = record_differences(suite, folder)
    except ValueError as err:
        p.error(str(err))
    for name, why in skipped.items():
        print(f"{folder}/entries/{name}: left as it is: {why}")
    if not changed:
        print(f"{folder}: every entry names its winner's changes already")
        return 0
    notes = write_report(suite, folder)
    print(f"{folder}: {len(changed)} entries given their winner's changes; results.md "
          "rewritten" + "".join(f"; {n}" for n in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
