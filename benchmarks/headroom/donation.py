"""What donating the state costs a plan on simulated CPU devices.

The search times every candidate as a training loop runs it: the state is
donated (`donate_argnums=(0,)`), so the step writes the new state into the
old one's buffers. `run.py` found data parallelism's step slower on
`cpu-sim8` than the step with no collective by more than its one all-reduce
should cost; this script times the same programs with and without donating
the state, interleaved in one run (each timed step after an untimed one of
the same program, as `retime` does), on one workload and mesh:

- `dp`: the state whole on every device, the batch split (the suite's `dp`
  plan as written, not pinned);
- `zero1`: the parameters whole, the optimizer state split as `fsdp` splits
  it (ZeRO-1);
- `fsdp`: the suite's `fsdp` plan as written;
- `floor`: `run.floor_step`, no collective at all.

Each program is jitted with its state's shardings in and out; the batch is
split over every mesh axis. Run from the repository root with nothing else
running:

    python benchmarks/headroom/donation.py --workload gpt:small --mesh dp=8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import floor_step

from shardsearch import create_mesh, parse_mesh
from shardsearch.bench import format_speedup, speedup
from shardsearch.search import baseline_candidates
from shardsearch.workloads import get_workload

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="gpt:small")
    p.add_argument("--mesh", default="dp=8")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--out", help="write the times as JSON here")
    a = p.parse_args(argv)

    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    dims, names = parse_mesh(a.mesh)
    mesh = create_mesh(dims, names, devices=jax.devices()[:8])
    workload = get_workload(a.workload)
    state, batch = jax.tree_util.tree_map(np.asarray, workload.init(0))
    abstract = workload.abstract()
    baselines = baseline_candidates(workload, mesh)
    fsdp_state, _ = baselines["fsdp"].specs(abstract)
    dp_state, _ = baselines["dp"].specs(abstract)

    def whole(tree):
        return jax.tree_util.tree_map(lambda _: P(), tree)

    split = jax.tree_util.tree_map(lambda _: P(tuple(names)), batch)
    plans = {"dp": (workload.step, dp_state),
             "zero1": (workload.step, {**fsdp_state, "params": whole(state["params"])}),
             "fsdp": (workload.step, fsdp_state),
             "floor": (floor_step(workload.step, mesh, 1), whole(state))}

    def placed(tree):
        return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), tree,
                                      is_leaf=lambda x: isinstance(x, P))

    runs = {}
    for label, (step, state_specs) in plans.items():
        shardings = (placed(state_specs), placed(split))
        for donate in (False, True):
            jitted = jax.jit(step, in_shardings=shardings, out_shardings=(shardings[0], None),
                             donate_argnums=(0,) if donate else ())
            runs[f"{label}{' donated' if donate else ''}"] = [
                jitted, jax.device_put(state, shardings[0]), jax.device_put(batch, shardings[1])]
    times: dict[str, list[float]] = {label: [] for label in runs}
    for i in range(a.rounds + 1):  # round 0 warms every program up
        for label, run in runs.items():
            for timed in (False, True):
                start = time.perf_counter()
                new_state, _ = run[0](run[1], run[2])
                jax.block_until_ready(new_state)
                run[1] = new_state
                if timed and i:
                    times[label].append(time.perf_counter() - start)
    command = " ".join(["python", "benchmarks/headroom/donation.py",
                        *(sys.argv[1:] if argv is None else argv)])
    print(f"{command}: {a.workload} on {a.mesh}, {a.rounds} interleaved rounds")

    def row(label):
        ts = times[label]
        return {"label": label, "role": "timed", "status": "timed", "fingerprint": label,
                "median_seconds": float(np.median(ts)), "times": ts}

    print("| program | not donated s | donated s | not donated / donated |")
    print("|---|---|---|---|")
    for label in plans:
        kept, donated = row(label), row(f"{label} donated")
        print(f"| {label} | {kept['median_seconds']:.4f} | {donated['median_seconds']:.4f} | "
              f"{format_speedup(speedup(kept, donated))} |")
    fsdp = row("fsdp donated")
    for label in plans:
        for suffix in ("", " donated"):
            print(f"fsdp donated / {label}{suffix}: "
                  f"{format_speedup(speedup(row(label + suffix), fsdp))}")
    if a.out:
        Path(a.out).write_text(json.dumps({"command": command, "times": times}, indent=1) + "\n",
                               encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
