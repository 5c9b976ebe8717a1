"""Seconds per `cost.hlo.parse_hlo` of real programs: this tree against a git revision.

The search parses each candidate's HLO (`ProgramCost.from_compiled`), the
first part of a trial's "other" time (README.md). This compiles gpt:tiny's
training step (megatron on dp=2,tp=4 over 8 CPU devices, and, where libtpu
and the CUDA plugin are installed, on a 2x2 TPU v5e and a 1x1x8 H100), then
times the parse of each text by this tree's `shardsearch.cost` and by the
same modules at `--against` (default HEAD, read with `git show`), the two
interleaved so that the machine's load falls on both alike.

Usage (from the repository root):
    python benchmarks/overhead/parse_speed.py [--against HEAD] [--repeats 11] [HLO files...]

Prints one line per text: size, lines, min and median milliseconds of each,
and the ratio of the medians. The two must agree on the module parsed
(computations, instructions, counts) and the collectives; that is checked.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[2]
MODULES = ("hlo", "hlo_graph", "hlo_types", "replica_groups")


def texts() -> dict[str, str]:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from jax.sharding import NamedSharding

    import shardsearch as ss
    from shardsearch.search import TargetUnavailable, uncached
    from shardsearch.workloads import expert_plan, get_workload

    workload = get_workload("gpt:tiny")
    meshes = {"cpu": lambda: ss.create_mesh((2, 4), ("dp", "tp")),
              "tpu-v5e": lambda: ss.target_mesh("tpu-v5e", {"dp": 2, "tp": 2}),
              "gpu-h100": lambda: ss.target_mesh("gpu-h100", {"dp": 2, "tp": 4},
                                                 topology="1x1x8")}
    out = {}
    for name, make in meshes.items():
        try:
            mesh = make()
        except TargetUnavailable as err:
            print(f"{name}: skipped ({err})")
            continue
        abstract = workload.abstract()
        specs = expert_plan(workload, mesh, "megatron").specs(abstract, mesh)
        args = jax.tree.map(lambda a, s, m=mesh: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=NamedSharding(m, s)), abstract, specs)
        with uncached():
            out[f"gpt:tiny megatron, {name}"] = jax.jit(workload.step).lower(*args).compile(
            ).as_text()
    return out


def revision_package(revision: str, folder: str) -> str:
    """`shardsearch.cost`'s parser modules at `revision`, as package `parse_<rev>`."""
    package = "parse_" + "".join(c if c.isalnum() else "_" for c in revision)
    os.makedirs(os.path.join(folder, package), exist_ok=True)
    Path(folder, package, "__init__.py").write_text("")
    for module in MODULES:
        source = subprocess.run(
            ["git", "show", f"{revision}:shardsearch/cost/{module}.py"], cwd=ROOT,
            check=True, capture_output=True, text=True).stdout
        Path(folder, package, f"{module}.py").write_text(source)
    sys.path.insert(0, folder)
    return package


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("files", nargs="*", help="HLO texts to parse instead of compiling")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from shardsearch.search import parse_hlo

    programs = {Path(f).name: Path(f).read_text() for f in args.files} or texts()
    with tempfile.TemporaryDirectory() as folder:
        then = importlib.import_module(revision_package(args.against, folder) + ".hlo")
        print(f"parse_hlo, this tree against {args.against}, {args.repeats} parses each:")
        for name, text in programs.items():
            # The collectives must come out the same (the flops may not: a
            # revision before the TPU convolution fix counts them otherwise).
            if repr(parse_hlo(text)[0]) != repr(then.parse_hlo(text)[0]):
                print(f"{name}: the two parse its collectives differently")
                return 1
            times: dict[str, list[float]] = {"then": [], "now": []}
            for _ in range(args.repeats):
                for key, parse in (("then", then.parse_hlo), ("now", parse_hlo)):
                    start = time.perf_counter()
                    parse(text)
                    times[key].append(time.perf_counter() - start)
            old, new = times["then"], times["now"]
            print(f"{name}: {len(text) / 1e3:.0f} kB, {text.count(chr(10))} lines; "
                  f"{args.against} {min(old) * 1e3:.1f} / {statistics.median(old) * 1e3:.1f} ms, "
                  f"now {min(new) * 1e3:.1f} / {statistics.median(new) * 1e3:.1f} ms "
                  f"(min / median), {statistics.median(old) / statistics.median(new):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
