"""cpu-static256's winners compiled by the v5p's own compiler, deviceless.

The suite searches on 256 simulated CPU devices and prices XLA:CPU's program
with the v5p model. This compiles an entry's exported winner
(`rules/cpu-static256/<id>.json`) and the expert plans named after it for a
deviceless v5p topology of the entry's mesh (`shardsearch.target_mesh`),
and prints, one JSON line per plan, the compiler's peak memory and the v5p
model's estimate of the chip's program (each plan's step built with its
knobs: the winner's plan file's, an expert's `act_batch` pinned to its
batch split, as the search runs it):

    python benchmarks/cpu-static256/target_check.py llama-70b-dp32-tp8 dp=32,tp=8 winner fsdp_tp

`check` does the same for another suite's entries, chip and workload
(`benchmarks/cpu-static64/target_check.py`).
"""

import dataclasses
import json
import sys
import time

import shardsearch as ss

ss.use_cpu_devices(1)

import jax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from shardsearch.search import ProgramCost, Topology  # noqa: E402
from shardsearch.workloads import expert_plan, get_workload  # noqa: E402


def main(entry: str, mesh_text: str, labels: list[str]) -> None:
    check("cpu-static256", "llama:70b", "tpu-v5p", entry, mesh_text, labels)


def check(suite: str, workload_name: str, chip: str, entry: str, mesh_text: str,
          labels: list[str]) -> None:
    """One JSON line per plan of `labels` ("winner": `rules/<suite>/<entry>.json`;
    else an expert plan's name), compiled for `chip` on the entry's mesh."""
    sizes, names = ss.parse_mesh(mesh_text)
    dims = dict(zip(names, sizes, strict=True))
    workload = get_workload(workload_name)
    args = workload.abstract()
    mesh = ss.target_mesh(chip, dims)
    plan = ss.load_plan(f"rules/{suite}/{entry}.json", mesh)
    model = ss.HARDWARE[chip]
    for label in labels:
        if label == "winner":
            specs, carrier = plan.apply(args), plan
        else:
            # An expert plan as the search runs it: its activations' batch on
            # the axes of its batch split (`act_batch`, `pin_batch`).
            expert = expert_plan(workload, mesh, label)
            specs = expert.specs(args, mesh)
            axes = expert.batch_spec[0] if len(expert.batch_spec) else None
            axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
            carrier = dataclasses.replace(
                plan, knobs={"act_batch": ",".join(axes)} if axes else {})
        step = carrier.build_step(workload.knobs if workload.knobs is not None
                                  else workload.step)
        shard = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda x: isinstance(x, PartitionSpec))
        start = time.perf_counter()
        try:
            compiled = jax.jit(step, in_shardings=shard,
                               donate_argnums=0).lower(*args).compile()
        except Exception as err:  # the compiler's refusal is the answer
            print(json.dumps({"entry": entry, "plan": label, "knobs": carrier.knobs,
                              "error": str(err)[:400],
                              "seconds": time.perf_counter() - start}), flush=True)
            continue
        seconds = time.perf_counter() - start
        b = model.breakdown(ProgramCost.from_compiled(compiled), Topology.of(mesh))
        m = compiled.memory_analysis()
        peak = getattr(m, "peak_memory_in_bytes", None)
        print(json.dumps({"entry": entry, "plan": label, "knobs": carrier.knobs,
                          "compile_s": round(seconds, 1),
                          "estimate_s": b.total, "kernels_s": b.kernels, "compute_s": b.compute,
                          "memory_s": b.memory, "communication_s": b.communication,
                          "hidden_s": b.hidden, "peak_gib": peak / 2**30 if peak else None,
                          "args_gib": m.argument_size_in_bytes / 2**30,
                          "temp_gib": m.temp_size_in_bytes / 2**30}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
