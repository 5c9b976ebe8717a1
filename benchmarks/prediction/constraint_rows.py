"""What XLA does with a constraint that takes the batch's axis for another dim.

    python benchmarks/prediction/constraint_rows.py

The program of `tests/test_footprint.py::
test_a_constraint_that_takes_the_batchs_axis_leaves_the_values_after_it_less_split`,
compiled for 8 simulated CPU devices (dp=2, tp=4), its 64 rows split over
both axes: without the constraint, and with the columns of `tanh(x)` on dp.
Prints the row counts of the [rows, 128] arrays in each compiled program,
XLA's temporaries, and stage 1's prediction of the live bytes.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.search import predict_footprint, trace_program


def main() -> None:
    ss.use_cpu_devices(8)
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))

    def make(pinned: bool):
        def step(w, x):
            a = jnp.tanh(x)
            if pinned:
                a = jax.lax.with_sharding_constraint(
                    a, NamedSharding(mesh, P(P.UNCONSTRAINED, "dp")))
            return w, jnp.sum(jnp.tanh(a @ w))
        return step

    args = (jax.ShapeDtypeStruct((32, 128), jnp.float32),
            jax.ShapeDtypeStruct((64, 32), jnp.float32))
    specs = (P(), P(("dp", "tp")))
    for pinned in (False, True):
        step = make(pinned)
        compiled = jax.jit(step, in_shardings=tuple(NamedSharding(mesh, s) for s in specs)
                           ).lower(*args).compile()
        rows = sorted({int(n) for n in re.findall(r"f32\[(\d+),128\]", compiled.as_text())})
        live = predict_footprint(trace_program(step, args), specs, {"dp": 2, "tp": 4}).live
        print(f"{'constrained' if pinned else 'free'}: [rows, 128] arrays with {rows} rows "
              f"(w is [32, 128]); XLA temporaries {compiled.memory_analysis().temp_size_in_bytes}"
              f" bytes; predicted live {live} bytes")


if __name__ == "__main__":
    main()
