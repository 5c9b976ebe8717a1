"""What the first run of a new XLA:CPU executable costs, with and without YNNPACK fusions.

The README job's "other" holds the search's warm-up steps, and most of them
is the first run of each candidate's executable: 0.1-0.2 s against a step
of 0.01-0.02 s. This compiles gpt:tiny's expert plans on dp=2,tp=4 (8
simulated CPU devices, the README job's workload and mesh) through the
monitored wrapper, as the search does, and times the first call, the second,
and the median of the next six, once at XLA's defaults and once with
`--xla_cpu_experimental_ynn_fusion_type=` (no YNNPACK fusions). Each variant
runs in a fresh process (`XLA_FLAGS` is read when the backend starts), and
the rounds alternate the two.

Usage (from the repository root, nothing else running):
    python benchmarks/overhead/first_run.py [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {"XLA's defaults": "", "no YNNPACK fusions": "--xla_cpu_experimental_ynn_fusion_type="}
PLANS = ("dp", "fsdp", "megatron", "fsdp_tp")
CALLS = 8


def child() -> None:
    """One variant in this process: a JSON line per plan."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from jax.sharding import NamedSharding, PartitionSpec

    import shardsearch as ss
    from shardsearch.workloads import expert_plan, get_workload

    workload = get_workload("gpt:tiny")
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    host = jax.device_get(workload.init(0))
    for name in PLANS:
        specs = tuple(expert_plan(workload, mesh, name).specs(workload.abstract(), mesh))
        step = ss.create_monitored_function(
            workload.step, specs, ss.ShardingAnalyzer(mesh),
            out_specs=(specs[0], PartitionSpec()), donate_argnums=(0,))
        shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                 is_leaf=lambda s: isinstance(s, PartitionSpec))
        args = list(jax.device_put(host, shardings))
        start = time.perf_counter()
        step.compile(*args)
        compile_seconds = time.perf_counter() - start
        calls = []
        for _ in range(CALLS):
            start = time.perf_counter()
            (state, _), _metrics = step(*args)
            jax.block_until_ready(state)
            calls.append(time.perf_counter() - start)
            args = [state, *args[1:]]
        print(json.dumps({"plan": name, "compile": compile_seconds, "first": calls[0],
                          "second": calls[1], "steady": statistics.median(calls[2:])}),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "first-run.md"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    rows: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        for variant, flags in VARIANTS.items():
            env = {**os.environ, "XLA_FLAGS": flags}
            out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                                 capture_output=True, text=True).stdout
            for line in out.splitlines():
                row = json.loads(line)
                rows.setdefault((row["plan"], variant), []).append(row)
            print(f"round {round_ + 1}: {variant} done", file=sys.stderr)
    lines = [
        "# The first run of a new XLA:CPU executable",
        "",
        f"Written by `python benchmarks/overhead/first_run.py --rounds {args.rounds}` on "
        f"{time.strftime('%Y-%m-%d')}; code at `{_commit()}`, load average "
        f"{os.getloadavg()[0]:.2f} at the end. gpt:tiny on dp=2,tp=4 (8 simulated CPU "
        "devices), each expert plan compiled through `create_monitored_function` and called "
        f"{CALLS} times with the state fed back; each variant in a fresh process, the rounds "
        "alternating them. Milliseconds, median over the rounds (min-max).",
        "",
        "| plan | XLA flags | compile | first call | second call | steady (median of calls 3-8) "
        "| first minus steady |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in PLANS:
        for variant in VARIANTS:
            got = rows[(name, variant)]
            cells = [_cell([r[k] for r in got]) for k in ("compile", "first", "second", "steady")]
            extra = _cell([r["first"] - r["steady"] for r in got])
            lines.append(f"| {name} | {variant} | {' | '.join(cells)} | {extra} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cell(values: list[float]) -> str:
    ms = [v * 1e3 for v in values]
    return f"{statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f})"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
