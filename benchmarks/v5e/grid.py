"""A grid of step shapes and knobs timed on one v5e chip: data to judge the cost model by.

`run.py` checks that the deviceless program is the chip's; this script asks
whether the static model ranks programs as the chip does, over more shapes
than run.py's two: llama and gpt blocks of several widths, sequence lengths
and batches, each with the remat policies and microbatch counts that fit.
On the machine with the chip (the install line as in
`benchmarks/results/v5e/notes.md`):

    PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD python3 benchmarks/v5e/grid.py device $OUT

It compiles each variant for the chip, runs warm-up and timed steps (run.py's
`compile_variant`, so the records have the same fields), writes
`OUT/grid.json` as it goes and the HLO as `OUT/hlo-grid.tar.gz`. The
deviceless program equals the chip's (run.py's check, to the byte on every
variant so far), so the models can be judged here from the HLO alone:

    python benchmarks/v5e/grid.py report benchmarks/results/v5e/raw benchmarks/results/v5e/grid.md

writes the estimates beside the measured steps, for these programs and
run.py's, and how many pairs of variants each estimate orders as the chip
did.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path


def _load_run():
    path = Path(__file__).resolve().parent / "run.py"
    spec = importlib.util.spec_from_file_location("v5e_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUN = _load_run()
VOCAB = 32000
# name -> (model, shape): the shapes of the grid, bfloat16 compute, float32
# Adam state, each small enough that full remat fits one chip's 15.75 GiB.
SHAPES = {
    "llama-150m-s1024-b16": ("llama", dict(layers=8, d_model=1024, heads=8, kv_heads=4,
                                           d_ff=2816, seq=1024, batch=16)),
    "llama-400m-s4096-b4": ("llama", dict(RUN.LLAMA, seq=4096, batch=4)),
    "llama-500m-s2048-b4": ("llama", dict(layers=8, d_model=2048, heads=16, kv_heads=8,
                                          d_ff=5632, seq=2048, batch=4)),
    "llama-400m-s2048-b16": ("llama", dict(RUN.LLAMA, batch=16)),
    "gpt-200m-s1024-b16": ("gpt", dict(layers=12, d_model=1024, heads=16, d_ff=4096,
                                       seq=1024, batch=16)),
}
VARIANTS = (
    ("llama-150m-s1024-b16", {}),
    ("llama-150m-s1024-b16", {"remat": "selective"}),
    ("llama-150m-s1024-b16", {"remat": "none"}),
    ("llama-150m-s1024-b16", {"microbatches": 2}),
    ("gpt-200m-s1024-b16", {}),
    ("gpt-200m-s1024-b16", {"remat": "selective"}),
    ("gpt-200m-s1024-b16", {"remat": "none"}),
    ("gpt-200m-s1024-b16", {"microbatches": 2}),
    ("llama-500m-s2048-b4", {}),
    ("llama-500m-s2048-b4", {"remat": "selective"}),
    ("llama-500m-s2048-b4", {"microbatches": 2}),
    ("llama-400m-s4096-b4", {}),
    ("llama-400m-s4096-b4", {"remat": "selective"}),
    ("llama-400m-s4096-b4", {"microbatches": 2}),
    ("llama-400m-s2048-b16", {}),
    ("llama-400m-s2048-b16", {"microbatches": 2}),
    ("llama-400m-s2048-b16", {"microbatches": 4}),
)


def workload(name: str):
    from shardsearch.workloads import get_workload

    model, shape = SHAPES[name]
    return get_workload(f"{model}:custom", **{"vocab": VOCAB, "compute_dtype": "bfloat16",
                                                **shape})


def device(out: Path, budget: float) -> int:
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    whole: dict = {"about": RUN.about(), "shapes": SHAPES, "variants": {}}
    save = RUN.writer(out / "grid.json", whole)
    devices = jax.devices()
    whole["about"]["mesh"] = RUN.about_devices(devices)
    mesh = Mesh(np.array(devices[:1]), ("dp",), axis_types=(AxisType.Auto,))
    for name, knobs in VARIANTS:
        k = RUN.key(name, knobs)
        if time.time() - start > budget - RUN.MARGIN:
            whole["variants"][k] = {"workload": name, "knobs": knobs, "skipped": "out of time"}
            save()
            continue
        try:
            rec = RUN.compile_variant(name, knobs, mesh, "grid", out, run=True,
                                      workload=workload(name))
        except Exception as err:
            rec = {"workload": name, "knobs": knobs, "stage": "setup",
                   "error": f"{type(err).__name__}: {err}"[:3000]}
        whole["variants"][k] = rec
        save()
        print(k, {x: rec.get(x) for x in ("compile_seconds", "median_seconds", "refused",
                                          "error")}, flush=True)
        jax.clear_caches()
    RUN.pack(out, "hlo-grid.tar.gz")
    print(f"done in {time.time() - start:.0f} s", flush=True)
    return 0


def _estimates(text: str, record: dict) -> dict[str, float]:
    """The v5e model's estimates of one program: priced per kernel (the
    model as it is) and as a whole (the same model with `per_op` off)."""
    import dataclasses

    import shardsearch as ss
    from shardsearch.search import ProgramCost, Topology

    cost = record.get("cost", {})
    program = ProgramCost.from_hlo(text, cost.get("flops", 0.0), cost.get("bytes accessed", 0.0))
    one = Topology(("dp",), (1,))
    model = ss.HARDWARE[RUN.CHIP]
    return {"kernels": model.breakdown(program, one).total,
            "whole": dataclasses.replace(model, per_op=False).breakdown(program, one).total}


ESTIMATES = (("recorded", "whole program, as recorded on the device (a4b068c)"),
             ("whole", "whole program, now"),
             ("kernels", "per kernel, now (the model's default)"),
             ("libtpu", "libtpu's own"))


def report(raw: Path, out: Path) -> None:
    """`grid.md` from run.py's and this script's device records in `raw`."""
    import itertools
    import statistics

    texts = RUN.hlo_texts(raw)
    rows = []
    for label, name in (("device", "device.json"), ("grid", "grid.json")):
        for k, rec in json.loads((raw / name).read_text())["variants"].items():
            times = rec.get("step_times") or []
            text = texts.get(RUN.hlo_name(label, k))
            if not times or text is None:
                continue
            shape = rec["workload"]
            rows.append({"shape": shape, "variant": k[len(shape):].strip() or "as given",
                         "measured": statistics.median(times), "low": min(times),
                         "high": max(times), "n": len(times),
                         "recorded": rec["estimate"]["total"],
                         "libtpu": rec["estimate"].get("compiler_seconds"),
                         **_estimates(text, rec)})
    command = f"python benchmarks/v5e/grid.py report {raw} {out}"
    lines = ["# One v5e chip: the cost model's estimates against measured steps", "",
             f"Made by `{command}` from the device runs' records in `{raw}`: "
             "`device.json` (`python3 benchmarks/v5e/run.py device $OUT`) and `grid.json` "
             "(`python3 benchmarks/v5e/grid.py device $OUT --budget 480`), each program's HLO "
             "as compiled on the chip (`hlo-device.tar.gz`, `hlo-grid.tar.gz`). Measured: "
             "the median of the timed steps (min-max, n). Estimates, in seconds, with "
             "measured / estimate beside each: " + "; ".join(
                 f"*{name}*: {what}" for name, what in ESTIMATES) + ".", "",
             "| shape | variant | measured s (min-max, n) | " + " | ".join(
                 f"{name} s (ratio)" for name, _ in ESTIMATES) + " |",
             "|---|---|---|" + "---|" * len(ESTIMATES)]
    for r in rows:
        cells = [f"{r[name]:.4g} ({r['measured'] / r[name]:.2f})" if r[name] else "-"
                 for name, _ in ESTIMATES]
        lines.append(f"| {r['shape']} | {r['variant']} | {r['measured']:.4g} ({r['low']:.4g}-"
                     f"{r['high']:.4g}, {r['n']}) | " + " | ".join(cells) + " |")
    agree = {name: [0, 0] for name, _ in ESTIMATES}
    ties = 0
    for _shape, group in itertools.groupby(rows, key=lambda r: r["shape"]):
        for a, b in itertools.combinations(list(group), 2):
            if abs(a["measured"] - b["measured"]) < 0.01 * min(a["measured"], b["measured"]):
                ties += 1
                continue
            for name, _ in ESTIMATES:
                if a[name] and b[name]:
                    agree[name][1] += 1
                    agree[name][0] += (a[name] < b[name]) == (a["measured"] < b["measured"])
    ratios = {name: [r["measured"] / r[name] for r in rows if r[name]] for name, _ in ESTIMATES}
    lines += ["", "Pairs of variants of one shape whose measured medians differ by 1% or "
              f"more, ordered by the estimate as the chip ordered them ({ties} pairs closer "
              "than 1% left out), and the spread of measured / estimate:", "",
              "| estimate | pairs ordered as measured | measured / estimate, min-max |",
              "|---|---|---|"]
    for name, _ in ESTIMATES:
        got, of = agree[name]
        lines.append(f"| {name} | {got}/{of} | {min(ratios[name]):.2f}-{max(ratios[name]):.2f} |")
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("device", "report"))
    parser.add_argument("folder", help="device: the folder to write; report: the raw folder")
    parser.add_argument("out", nargs="?", help="report: the markdown file to write")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds the device run may take (default 480)")
    a = parser.parse_args(argv)
    if a.what == "report":
        if not a.out:
            parser.error("report needs the markdown file to write")
        report(Path(a.folder), Path(a.out))
        return 0
    return device(Path(a.folder), a.budget)


if __name__ == "__main__":
    sys.exit(main())
