"""Were stage 1's memory cuts right? Each one looked up where it was compiled.

    python benchmarks/prediction/verify_cuts.py SUITE CUT RECORD OUT.md

CUT and RECORD are `shardsearch bench --out` folders of the same suite, run
with `--memory-prediction cut` (the default) and `record`. A study's
start-up trials are the sampler's seeded ones in both, and its baselines the
same, so a candidate stage 1 cut in CUT was most often compiled in RECORD:
its XLA total there, against the entry's budget, says whether the cut was
right. A cut candidate RECORD never evaluated is listed as such.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna

PREDICTED = "predicted before compiling"


def outcomes(folder: Path) -> dict[str, list[dict]]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / 'studies.db'}")
    return {s.study_name: [t.user_attrs.get("outcome") or {} for t in
                           optuna.load_study(study_name=s.study_name, storage=storage).trials]
            for s in optuna.get_all_study_summaries(storage)}


def main() -> int:
    suite, cut_dir, record_dir, out = sys.argv[1:]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cut, record = outcomes(Path(cut_dir) / suite), outcomes(Path(record_dir) / suite)
    budgets = {}
    for path in (Path(cut_dir) / suite / "entries").glob("*.json"):
        entry = json.loads(path.read_text())
        budgets[entry["search"]["study"]] = (entry["entry"]["id"], entry["budget"]["bytes"])
    lines = [f"# Stage 1's memory cuts in `{cut_dir}`, looked up in `{record_dir}`", "",
             f"Command: `python {' '.join(sys.argv)}`", "",
             "| entry | candidate | XLA total where compiled | budget | verdict |",
             "|---|---|---|---|---|"]
    counts = {"right": 0, "wrong": 0, "unknown": 0}
    for study, outs in sorted(cut.items()):
        entry_id, budget = budgets[study]
        compiled = {o.get("fingerprint"): o for o in record.get(study, [])}
        seen = set()
        for o in outs:
            fp = o.get("fingerprint")
            if not (o.get("reason") or "").startswith(PREDICTED) or fp in seen:
                continue
            seen.add(fp)
            total = (compiled.get(fp) or {}).get("memory", {}).get("total")
            verdict = "not compiled there" if total is None else (
                "right: over" if total > budget else "WRONG: fits")
            counts["unknown" if total is None else "right" if total > budget else "wrong"] += 1
            lines.append(f"| {entry_id} | {fp} | "
                         f"{'-' if total is None else f'{total / 2**30:.1f} GiB'} | "
                         f"{budget / 2**30:.1f} GiB | {verdict} |")
    lines += ["", f"{counts['right']} right, {counts['wrong']} wrong, "
                  f"{counts['unknown']} not compiled in the record run."]
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
