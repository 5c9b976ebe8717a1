"""Where the calibrated model goes wrong: refit its parts against the measurements.

Reads a fidelity study's `results.json` and, for each entry, fits the measured
step time as a non-negative combination of the calibrated breakdown's parts
(compute, memory, and the communication of each collective kind) by least
squares, in sample. The coefficients say which term the model under- or
over-charges (1 = as calibrated), and the Kendall tau of the refit is an upper
bound for any re-weighting of those parts: what recalibrating constants alone
could buy, before changing the model's form. Prints a markdown table.

    python benchmarks/fidelity/refit.py benchmarks/results/fidelity/results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy import optimize, stats


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: refit.py RESULTS.json", file=sys.stderr)
        return 2
    data = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    kinds = sorted({k["kind"] for e in data["entries"] for c in e["candidates"]
                    for k in (c["estimates"].get("calibrated", {}).get("breakdown") or {})
                    .get("collectives", [])})
    print("| workload | mesh | τ as calibrated | τ refit | compute | memory | "
          + " | ".join(kinds) + " |")
    print("|---" * (5 + len(kinds)) + "|")
    for e in data["entries"]:
        rows = [c for c in e["candidates"] if c["status"] == "complete"
                and c.get("median_seconds") and "breakdown" in c["estimates"].get(
                    "calibrated", {})]
        if len(rows) < 3:
            continue
        measured = np.array([c["median_seconds"] for c in rows])
        parts = [c["estimates"]["calibrated"]["breakdown"] for c in rows]
        x = np.array([[b["compute"], b["memory"]]
                      + [sum(k["seconds"] for k in b["collectives"] if k["kind"] == kind)
                         for kind in kinds] for b in parts])
        coef, _ = optimize.nnls(x, measured)
        as_is = stats.kendalltau([b["total"] for b in parts], measured).statistic
        refit = stats.kendalltau(x @ coef, measured).statistic
        used = [f"{c:.2f}" if x[:, i].any() else "-" for i, c in enumerate(coef)]
        print(f"| {e['workload']} | {e['mesh']} | {as_is:.2f} | {refit:.2f} | "
              + " | ".join(used) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
