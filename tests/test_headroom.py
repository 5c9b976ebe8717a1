"""The headroom script's programs (`benchmarks/headroom/run.py`): the floor has
no collective and gives each device the step on its own share of the batch;
the optimizer step does the update and nothing else."""

import jax
import numpy as np
import pytest
from bench_scripts import load_script
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.workloads import get_workload

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute")


@pytest.fixture(scope="module")
def run():
    return load_script("benchmarks/headroom/run.py", "headroom_run")


@pytest.mark.parametrize("names,dims", [(("dp",), (8,)), (("dp", "tp"), (2, 4))])
def test_the_floor_runs_each_devices_share_with_no_collective(run, names, dims):
    workload = get_workload("gpt:tiny")
    mesh = ss.create_mesh(dims, names, devices=jax.devices()[:8])
    state, batch = workload.init(0)
    floor = jax.jit(run.floor_step(workload.step, mesh, 1))
    whole = jax.tree_util.tree_map(lambda x: jax.device_put(x, NamedSharding(mesh, P())), state)
    split = jax.tree_util.tree_map(
        lambda x: jax.device_put(x, NamedSharding(mesh, P(names))), batch)
    text = floor.lower(whole, split).compile().as_text()
    assert not [op for op in COLLECTIVES if f" {op}(" in text or f" {op}-start(" in text]

    new_state, metrics = floor(whole, split)
    rows = jax.tree_util.tree_leaves(batch)[0].shape[0] // 8
    first = jax.tree_util.tree_map(lambda x: x[:rows], batch)
    want_state, want = jax.jit(workload.step)(state, first)
    # Device 0 holds the step on the first eighth of the batch, unreduced.
    got = metrics["loss"].addressable_shards[0].data
    np.testing.assert_allclose(np.asarray(got), np.asarray(want["loss"]), rtol=1e-5)
    leaf = jax.tree_util.tree_leaves(new_state["params"])[0]
    np.testing.assert_allclose(np.asarray(leaf.addressable_shards[0].data),
                               np.asarray(jax.tree_util.tree_leaves(want_state["params"])[0]),
                               rtol=1e-5, atol=1e-6)


def test_the_optimizer_step_updates_every_parameter_and_moment(run):
    state, batch = get_workload("mlp:tiny").init(0)
    new, metrics = jax.jit(run.optimizer_step)(state, batch)
    def trees(s):
        return s["params"], s["opt"]["mu"], s["opt"]["nu"]

    for before, after in zip(trees(state), trees(new), strict=True):
        assert jax.tree_util.tree_structure(after) == jax.tree_util.tree_structure(before)
        leaves = zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after),
                     strict=True)
        assert all(b.shape == a.shape for b, a in leaves)
    # The parameters stand in for the gradients: every leaf not all zero
    # moves, and so do its moments.
    for p, upd, mu in zip(*(jax.tree_util.tree_leaves(t) for t in
                            (state["params"], new["params"], new["opt"]["mu"])), strict=True):
        if np.any(p):
            assert not np.array_equal(np.asarray(upd), p) and np.any(np.asarray(mu))
    assert int(new["opt"]["count"]) == int(state["opt"]["count"]) + 1
    assert float(metrics["loss"]) == 0.0
    with pytest.raises(KeyError):
        run.optimizer_step({"weights": state["params"]}, batch)
