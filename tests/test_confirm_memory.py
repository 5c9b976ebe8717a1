"""The confirmation's re-timing and output check on devices whose memory holds
one finalist at a time (a model whose state takes most of a chip)."""

import types

import jax
import pytest

from shardsearch.base import mesh as _mesh
from shardsearch.base.warnings import ShardsearchWarning
from shardsearch.search import Candidate, make_context, resolve
from shardsearch.search.evaluation import confirm as _confirm
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.workloads import expert_plan, get_workload


@pytest.fixture
def finalists(mesh24):
    workload = get_workload("mlp:tiny")
    ctx, _ = make_context(workload, workload.init(0), mesh24, isolate=False, warmup=1)
    out = []
    for name in ("replicated", "dp"):
        plan = expert_plan(workload, mesh24, name)
        specs, _fp = resolve(Candidate(plan.state_rule, plan.batch_rule, name), ctx)
        out.append((name, specs))
    with ctx:
        yield ctx, out


def _placements(monkeypatch):
    placed = []
    real = _evaluate.place

    def place(specs, ctx):
        args = real(specs, ctx)
        placed.append(jax.tree.leaves(args))
        return args

    monkeypatch.setattr(_evaluate, "place", place)
    return placed


def test_finalists_that_do_not_fit_together_hold_the_devices_one_at_a_time(
        finalists, monkeypatch):
    ctx, pairs = finalists
    monkeypatch.setattr(_mesh, "device_memory", lambda mesh: 1)
    placed = _placements(monkeypatch)
    live_at_placement = []
    real_place = _evaluate.place

    def watching(specs, c):
        live_at_placement.append(sum(not x.is_deleted() for leaves in placed for x in leaves))
        return real_place(specs, c)

    monkeypatch.setattr(_evaluate, "place", watching)
    timings = _confirm.retime_here(pairs, ctx, rounds=3)
    assert {k: len(t.times) for k, t in timings.items()} == {"replicated": 3, "dp": 3}
    # Once per finalist for the warm-ups, then once per turn; each time the
    # arrays placed before are gone.
    assert len(placed) == 2 + 2 * 3
    assert live_at_placement == [0] * len(placed)
    assert all(x.is_deleted() for leaves in placed for x in leaves)


def test_finalists_that_fit_together_stay_on_the_devices(finalists, monkeypatch):
    ctx, pairs = finalists
    monkeypatch.setattr(_mesh, "device_memory", lambda mesh: None)
    placed = _placements(monkeypatch)
    timings = _confirm.retime_here(pairs, ctx, rounds=3)
    assert {k: len(t.times) for k, t in timings.items()} == {"replicated": 3, "dp": 3}
    assert len(placed) == 2


def test_fit_together_counts_every_argument_and_the_largest_working_set():
    def analysis(arguments, temp, peak=0):
        return types.SimpleNamespace(argument_size_in_bytes=arguments, temp_size_in_bytes=temp,
                                     peak_memory_in_bytes=peak)

    pair = [analysis(4, 7), analysis(4, 3)]
    assert _confirm.fit_together(pair, None)
    assert _confirm.fit_together(pair, 15)
    assert not _confirm.fit_together(pair, 14)
    # A TPU peak above arguments + temporaries counts as what the program needs.
    assert not _confirm.fit_together([analysis(4, 1, peak=12), analysis(4, 1)], 15)
    # The 400M llama's two finalists on a v5e (arguments 4.47 GiB, peak
    # 9.44 GiB, temporaries 7.26 GiB) against the chip's 15.75 GiB: the chip
    # refused the second's load ("Attempting to reserve 7.24G ... 6.80G free"),
    # though two arguments and one peak less arguments come to 13.9 GiB.
    gib = 2**30
    llama = analysis(int(4.47 * gib), int(7.26 * gib), peak=int(9.44 * gib))
    assert not _confirm.fit_together([llama, llama], int(15.75 * gib))
    assert _confirm.fit_together([llama], int(15.75 * gib))


def test_the_output_check_frees_the_first_step_before_the_reference_runs(
        finalists, monkeypatch):
    ctx, pairs = finalists
    placed = _placements(monkeypatch)
    match, _worst = _confirm.compare_outputs_here(pairs[1][1], pairs[0][1], ctx)
    assert match
    assert len(placed) == 2
    assert all(x.is_deleted() for x in placed[0])


def test_a_program_the_devices_compiler_refuses_over_memory_is_cut_not_failed(
        finalists, monkeypatch):
    # On a real v5e, remat=none of a 400M llama: the chip's compiler raises
    # at compile time, as it does deviceless.
    ctx, pairs = finalists

    def refuse(specs, c):
        raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
                           "required for HLO temporaries (50.23G) exceeds available HBM "
                           "(15.75G).")

    monkeypatch.setattr(_evaluate, "compile_step", refuse)
    outcome = _evaluate.compile_and_score(pairs[0][1], "fp", ctx, {})
    kind = ctx.mesh.devices.flat[0].device_kind
    assert (outcome.status, outcome.cut_stage) == (_evaluate.CUT, _evaluate.Stage.COMPILE)
    assert outcome.reason == (f"over the chip's memory: {kind}'s compiler refused it (Ran out "
                              "of memory on HBM, the total memory required for HLO temporaries "
                              "(50.23G) exceeds available HBM (15.75G))")


def test_device_memory_is_the_runtimes_limit_read_from_a_device_of_this_process(mesh24):
    import numpy as np

    assert _mesh.device_memory(mesh24) is None  # XLA:CPU reports no limit

    def device(process, limit):
        return types.SimpleNamespace(process_index=process,
                                     memory_stats=lambda: {"bytes_limit": limit})

    other, mine = device(jax.process_index() + 1, 1), device(jax.process_index(), 16 << 30)
    mesh = types.SimpleNamespace(devices=np.array([other, mine]))
    assert _mesh.device_memory(mesh) == 16 << 30

    def unimplemented():
        raise RuntimeError("UNIMPLEMENTED: GetMemoryStats is not supported")

    # A runtime that cannot report: the limit is unknown (and said so), the search goes on.
    silent = types.SimpleNamespace(process_index=jax.process_index(), memory_stats=unimplemented)
    with pytest.warns(ShardsearchWarning, match="cannot report their memory .*memory_budget="):
        assert _mesh.device_memory(types.SimpleNamespace(devices=np.array([silent]))) is None
