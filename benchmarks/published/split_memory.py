"""How much of each published row's memory term is the attention score matrix.

The static estimate of the published plan (`shardsearch bench --suite
published`) is memory-bound on some rows: the bytes XLA's CPU program
accesses, over the chip's HBM bandwidth. The published runs use fused
attention kernels (MaxText's splash attention, Megatron-LM's flash attention)
that keep the `[batch, heads, seq, seq]` scores on chip; the built-in
workloads write them to memory. This script separates the two parts without
reading the HLO: it estimates the published plan again at half the sequence
and twice the batch (the same tokens, so every other tensor keeps its size,
while the scores, quadratic in seq, halve):

    M(seq) = rest + scores,  M(seq / 2) = rest + scores / 2
    =>  scores = 2 * (M(seq) - M(seq / 2)),  rest = M(seq) - scores

and reports the estimate with the scores' traffic taken out (what a fused
kernel would leave). A decomposition of the model's own figures, not a fit:
nothing here reads the published step times except to print the ratio.

Usage (from the repository root; writes `results/published/split_memory.md`):

    python benchmarks/published/split_memory.py [--entries ID,ID]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import jax

from shardsearch import HARDWARE, create_mesh
from shardsearch.bench import estimate_published, load_suite, prepare_devices
from shardsearch.workloads import get_workload

OUT = Path("benchmarks/results/published/split_memory.md")


def _halved(entry):
    """The entry's workload at seq/2 and batch*2: the same tokens."""
    spec = dict(entry.spec)
    spec.update(seq=spec["seq"] // 2, batch=spec["batch"] * 2)
    return get_workload(f"{entry.workload}:custom", **spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", help="ids to run (default all)")
    parser.add_argument("--out", default=str(OUT))
    a = parser.parse_args(argv)
    suite = load_suite("published")
    prepare_devices(suite)
    ids = a.entries.split(",") if a.entries else None
    rows = []
    for entry in suite.select(ids):
        dims = [int(part.split("=")[1]) for part in entry.mesh.split(",")]
        names = [part.split("=")[0] for part in entry.mesh.split(",")]
        mesh = create_mesh(tuple(dims), tuple(names), devices=jax.devices()[:math.prod(dims)])
        hardware = HARDWARE[entry.hardware]
        full = estimate_published(get_workload(entry.workload_name), mesh, entry.published,
                                  hardware, entry.dcn_axes)
        half = estimate_published(_halved(entry), mesh, entry.published, hardware,
                                  entry.dcn_axes)
        b_full, b_half = full["breakdown"], half["breakdown"]
        scores = 2 * (b_full["memory"] - b_half["memory"])
        rest = b_full["memory"] - scores
        # The estimate's own formula (cost.breakdown) with the scores' traffic taken out.
        roofline = max(b_full["compute"], rest)
        comm = b_full["communication"]
        without = roofline + comm - b_full["overlap"] * min(roofline, comm)
        rows.append({
            "id": entry.id, "published": full["published_seconds"],
            "estimate": full["estimate"], "compute": b_full["compute"],
            "memory": b_full["memory"], "memory_half_seq": b_half["memory"],
            "scores": scores, "rest": rest, "without_scores": without,
            "ratio": full["estimate"] / full["published_seconds"],
            "ratio_without_scores": without / full["published_seconds"],
        })
        print(json.dumps(rows[-1]), flush=True)
    lines = [
        "# The attention scores' share of the memory term", "",
        f"Command: `python benchmarks/published/{Path(__file__).name}"
        + (f" --entries {a.entries}" if a.entries else "") + "` (the estimates of the "
        "published plans at seq and at seq/2 with twice the batch, on the published "
        "mesh, by the entry's chip model; see the script's docstring). Seconds per step.",
        "",
        "| entry | published s | estimate s | compute s | memory s | memory at seq/2 s | "
        "scores' traffic s | the rest s | estimate without the scores' traffic s | "
        "ratio | ratio without |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        lines.append("| " + " | ".join([r["id"]] + [f"{r[k]:.3g}" for k in (
            "published", "estimate", "compute", "memory", "memory_half_seq", "scores",
            "rest", "without_scores", "ratio", "ratio_without_scores")]) + " |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
