"""Time on cut candidates, per entry, for one or more runs of a suite.

    python benchmarks/prediction/shares.py OUT.md SUITE NAME=RESULTS [NAME=RESULTS ...]

Each RESULTS is a `shardsearch bench --out` folder; the table has, per entry
and run, the search's wall seconds, its compiles, its trials by outcome
(completed / cut at check, compile / failed / cache hits), the share of the
trials' time spent on candidates that were cut, and the memory prediction's
record where the run has one (trials it cut before compiling; its verdicts
against XLA's: judged, agree, false cuts, missed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def cell(record: dict) -> str:
    s = record["search"]
    t = s["trials"]
    text = (f"{s['wall_seconds']:.0f} s, {s['compiles']} compiles, "
            f"{t['completed']} / {t['cut_check']}, {t['cut_compile']} / {t['failed']} / "
            f"{t['cache_hits']}, **{s['cut_share']:.0%}** on cut")
    p = s.get("prediction")
    if p:
        text += (f"; predicted cuts {p['cut_before_compile']}, verdicts {p['agree']}/"
                 f"{p['judged']} ({p['false_cuts']} false, {p['missed']} missed)")
    return text


def main() -> int:
    out, suite, *runs = sys.argv[1:]
    named = [run.split("=", 1) for run in runs]
    records = {name: {p.stem: json.loads(p.read_text())
                      for p in sorted((Path(folder) / suite / "entries").glob("*.json"))}
               for name, folder in named}
    ids = sorted({i for r in records.values() for i in r})
    lines = [f"# Time on cut candidates: {suite}", "",
             f"Command: `python {' '.join(sys.argv)}`", "",
             "| entry | " + " | ".join(name for name, _ in named) + " |",
             "|---|" + "---|" * len(named)]
    for entry in ids:
        lines.append(f"| {entry} | " + " | ".join(
            cell(records[name][entry]) if entry in records[name] else "-"
            for name, _ in named) + " |")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
