"""The `published-chip` winners estimated again on the code of today.

`results.md` holds what a search estimated when it ran. After a change to
the cost model, this compiles each entry's winner again (its plan file,
`rules/published-chip/<id>.json`, knobs included) for the entry's chip,
deviceless, and estimates it as the search would (the static objective, a
study of one plan), against the published plan's estimate in
`estimates.json` (rerun that first: `python benchmarks/published-chip/run.py
--force`). Nothing is searched and nothing runs.

    python benchmarks/published-chip/reestimate.py [--entries ID,ID] [--out DIR]

writes `DIR/reestimated.json` and `DIR/reestimated.md`, default DIR
`benchmarks/results/published-chip`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import warnings
from pathlib import Path

import shardsearch as ss

ss.use_cpu_devices(1)

from shardsearch.bench import load_suite  # noqa: E402
from shardsearch.workloads import get_workload  # noqa: E402

COMMAND = "python benchmarks/published-chip/reestimate.py"
RESULTS = Path("benchmarks/results/published-chip")


def winner_estimate(suite, entry, plan_file: Path, storage: str) -> dict:
    """The winner's estimate and knobs, compiled for the entry's chip."""
    chip = entry.hardware or suite.hardware
    dims, names = ss.parse_mesh(entry.mesh)
    dcn = tuple(entry.dcn_axes or ())
    mesh = ss.target_mesh(chip, dict(zip(names, dims, strict=True)), dcn_axes=dcn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the chip-memory advice: not what is compared here
        result = ss.optimize(get_workload(entry.workload_name), mesh=mesh, n_trials=2,
                             objective="static", hardware=ss.HARDWARE[chip],
                             storage=storage, study_name=entry.id, warm_start=False,
                             start_from=[str(plan_file)], knobs=True, confirm_rounds=0,
                             quiet=True, isolate=False, dcn_axes=dcn)
    record = next(r for r in result.trials if r.label.startswith("plan:"))
    return {"status": record.outcome.status.value, "estimate": record.outcome.value,
            "knobs": dict(record.knobs or {}), "reason": record.outcome.reason}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", help="comma-separated entry ids (default: all)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    out = Path(args.out)
    published = json.loads((RESULTS / "estimates.json").read_text())["entries"]
    searched = {p.stem: json.loads(p.read_text())
                for p in (RESULTS / "entries").glob("*.json")}
    suite = load_suite("published-chip")
    entries = suite.select(args.entries.split(",") if args.entries else None)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        storage = f"sqlite:///{Path(scratch) / 'reestimate.db'}"
        for entry in entries:
            print(f"{entry.id}: compiling the winner for {entry.hardware} ...", flush=True)
            now = winner_estimate(suite, entry,
                                  Path("rules/published-chip") / f"{entry.id}.json", storage)
            then = searched[entry.id]["published"]["winner"]
            rows[entry.id] = {"winner": now, "published_estimate": published[entry.id]["estimate"],
                              "results_md": {"estimate": then["estimate"],
                                             "speedup": then["speedup"]}}
    (out / "reestimated.json").write_text(json.dumps(
        {"command": COMMAND, "commit": commit, "entries": rows}, indent=1) + "\n")
    lines = ["# The `published-chip` winners, estimated again", "",
             f"Command: `{COMMAND}` at commit {commit} (raw figures in `reestimated.json`). "
             "Each entry's winner (its plan file in `rules/published-chip/`, knobs included) "
             "compiled again for its chip and estimated by the static objective, against the "
             "published plan's estimate in `estimates.json`; *results.md* is the speedup the "
             "search reported when it ran. Nothing ran on a chip.", "",
             "| entry | winner knobs | winner estimate s (results.md) | published estimate s "
             "| speedup now | speedup in results.md |", "|---|---|---|---|---|---|"]
    for key, row in rows.items():
        win, pub = row["winner"], row["published_estimate"]
        speedup = (f"{pub / win['estimate']:.3f}x" if win["estimate"]
                   else f"- ({win['status']}: {win['reason']})")
        knobs = ", ".join(f"{k}={v}" for k, v in win["knobs"].items()) or "-"
        then = row["results_md"]
        now = f"{win['estimate']:.4g}" if win["estimate"] else "-"
        lines.append(f"| {key} | {knobs} | {now} ({then['estimate']:.4g}) | {pub:.4g} "
                     f"| {speedup} | {then['speedup']:.3f}x |")
    (out / "reestimated.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
