"""Milliseconds the monitored wrapper adds to one call of a step, around its execution.

A training loop (and the search's timed steps) calls the step through
`shardsearch.create_monitored_function` with arguments that are already on
the devices: the state the last call returned, the batch placed once. This
times such calls on gpt:tiny's training step (megatron on dp=2,tp=4, 8
simulated CPU devices, 78 leaves) and prints the median call time, the
median `execution_time` the wrapper reports, and their difference: the
wrapper's own work (signature, placement check or `device_put`, the
readiness wait on the arguments).

Usage (from the repository root; run it at two commits to compare them):
    python benchmarks/overhead/wrapper_call.py [--calls 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from jax.sharding import NamedSharding, PartitionSpec

    import shardsearch as ss
    from shardsearch.workloads import expert_plan, get_workload

    workload = get_workload("gpt:tiny")
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    specs = tuple(expert_plan(workload, mesh, "megatron").specs(workload.abstract(), mesh))
    step = ss.create_monitored_function(
        workload.step, specs, ss.ShardingAnalyzer(mesh),
        out_specs=(specs[0], PartitionSpec()), donate_argnums=(0,))
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda s: isinstance(s, PartitionSpec))
    state_and_batch = list(jax.device_put(jax.device_get(workload.init(0)), shardings))
    (state, _), _ = step(*state_and_batch)  # compiles; later calls reuse it
    batch = state_and_batch[1:]
    leaves = len(jax.tree.leaves((state, *batch)))
    for round_ in range(args.rounds):
        calls, executions = [], []
        for _ in range(args.calls):
            start = time.perf_counter()
            (state, _), metrics = step(state, *batch)
            calls.append(time.perf_counter() - start)
            executions.append(metrics["execution_time"])
        call, execution = statistics.median(calls), statistics.median(executions)
        print(f"round {round_ + 1}: {leaves} leaves, call {call * 1e3:.2f} ms, execution "
              f"{execution * 1e3:.2f} ms, wrapper {(call - execution) * 1e3:.2f} ms "
              f"(medians of {args.calls})")


if __name__ == "__main__":
    main()
