"""Where a step's time goes on one v5e chip, kernel by kernel, beside what the cost model charges each.

The per-kernel model (`HardwareModel.per_op`) ranks most knob settings as
the chip runs them (grid.md), but it prices many microbatches 10-15% over the
chip's step and puts 8 microbatches with selective remat behind selective
remat alone, the other way round from the chip. A whole step's time cannot
say which kernels it misprices; a trace can. On the machine with the chip
(the install line as in `benchmarks/results/v5e/notes.md`):

    PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD python3 benchmarks/v5e/kernels.py device $OUT

compiles each setting of the 400M llama (run.py's shape) for the chip, times
it as run.py does (`compile_variant`), then traces two more steps with
`jax.profiler` and sums the device's events by name per step, for every
line of the TPU's plane (`OUT/kernels.json`, written as it goes, and the
HLO as `OUT/hlo-kernels.tar.gz`). The deviceless HLO is the chip's (run.py's
check), so instruction names match, and the comparison runs here:

    python benchmarks/v5e/kernels.py report benchmarks/results/v5e/raw benchmarks/results/v5e/kernels.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from collections import Counter
from pathlib import Path


def _load(name: str):
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"v5e_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUN = _load("run")
NAME = RUN.LLAMA_NAME
SETTINGS = ({}, {"microbatches": 2}, {"microbatches": 4}, {"microbatches": 8},
            {"remat": "selective"}, {"remat": "selective", "microbatches": 2},
            {"remat": "selective", "microbatches": 8})
TRACED = 2


def trace_steps(compiled, abstract, steps: int) -> dict:
    """`steps` steps of `compiled` under the profiler after one untraced one:
    each device line's events summed by name, per step, in seconds."""
    import glob
    import tempfile

    import jax
    from jax.profiler import ProfileData

    state, batch = RUN.materialize(abstract)
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    folder = tempfile.mkdtemp()
    jax.profiler.start_trace(folder)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    wall = (time.perf_counter() - start) / steps
    jax.profiler.stop_trace()
    del state, batch, metrics
    path = sorted(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True))[-1]
    lines: dict[str, Counter] = {}
    counts: dict[str, Counter] = {}
    planes = []
    for plane in ProfileData.from_file(path).planes:
        planes.append(plane.name)
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            key = f"{plane.name} | {line.name}"
            names, seen = lines.setdefault(key, Counter()), counts.setdefault(key, Counter())
            for event in line.events:
                names[event.name] += event.duration_ns
                seen[event.name] += 1
    return {"traced_seconds_per_step": wall, "planes": planes,
            "lines": {key: {"seconds_per_step": sum(names.values()) / steps / 1e9,
                            "events": {n: [ns / steps / 1e9, counts[key][n] / steps]
                                       for n, ns in names.most_common()}}
                      for key, names in lines.items()}}


def device(out: Path, budget: float, name: str, first: int = 0) -> int:
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    whole: dict = {"about": RUN.about(), "settings": {}}
    save = RUN.writer(out / "kernels.json", whole)
    devices = jax.devices()
    whole["about"]["mesh"] = RUN.about_devices(devices)
    mesh = Mesh(np.array(devices[:1]), ("dp",), axis_types=(AxisType.Auto,))
    for knobs in SETTINGS[first:]:
        k = RUN.key(name, knobs)
        if time.time() - start > budget - RUN.MARGIN:
            whole["settings"][k] = {"knobs": knobs, "skipped": "out of time"}
            save()
            continue
        try:
            rec = RUN.compile_variant(name, knobs, mesh, "kernels", out, run=True)
            if rec.get("step_times"):
                fn, abstract = RUN.jitted(RUN.get(name), knobs, mesh)
                rec["trace"] = trace_steps(fn.lower(*abstract).compile(), abstract, TRACED)
        except Exception as err:
            rec = {"knobs": knobs, "error": f"{type(err).__name__}: {err}"[:3000],
                   "traceback": traceback.format_exc()[-3000:]}
        whole["settings"][k] = rec
        save()
        print(k, {x: rec.get(x) for x in ("median_seconds", "error")},
              {line: v["seconds_per_step"] for line, v in rec.get("trace", {}).get("lines", {}).items()},
              flush=True)
        jax.clear_caches()
    RUN.pack(out, "hlo-kernels.tar.gz")
    print(f"done in {time.time() - start:.0f} s", flush=True)
    return 0


def report(raw: Path, out: Path) -> None:
    raise NotImplementedError("report: written once the device's trace is in")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="phase", required=True)
    on = sub.add_parser("device", help="compile, time and trace on the chip")
    on.add_argument("out", type=Path)
    on.add_argument("--budget", type=float, default=480.0)
    on.add_argument("--first", type=int, default=0, help="skip the settings before this index")
    on.add_argument("--workload", default=NAME, help="a smoke run's smaller workload (gpt:small)")
    rep = sub.add_parser("report", help="the traced kernels beside the model's prices")
    rep.add_argument("raw", type=Path)
    rep.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.phase == "device":
        return device(args.out, args.budget, args.workload, args.first)
    report(args.raw, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
