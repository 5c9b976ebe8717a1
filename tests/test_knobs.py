"""Step knobs (issue 24 item 4): a step built by a factory, its knobs searched
with the sharding, checked against the step as given, and exported."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optuna
import pytest
from jaxprs import constraints

import shardsearch as ss
from shardsearch.base.activations import under_rules
from shardsearch.base.knobs import setting_text
from shardsearch.cli import main as _cli
from shardsearch.cost.hlo import parse_collectives
from shardsearch.search import (
    Candidate,
    baseline_candidates,
    compare_outputs,
    evaluate,
    fingerprint,
    make_context,
    resolve,
)
from shardsearch.search.execution.transport import jaxpr_digest
from shardsearch.search.space.candidate import (
    activation_moves,
    knob_combinations,
    knob_variants,
    plan_moves,
)
from shardsearch.workloads import get_workload
from shardsearch.workloads._activations import ActivationSharding
from shardsearch.workloads._llama import LlamaConfig
from shardsearch.workloads._llama import build as build_llama
from shardsearch.workloads._train import accumulate_gradients


def make_step(chunks: int = 1, scale: float = 1.0):
    """A least-squares step whose gradient is averaged over `chunks` slices."""

    def step(state, x):
        def loss(w, xb):
            return jnp.mean((xb @ w) ** 2) * scale

        slices = x.reshape(chunks, -1, x.shape[-1])
        g = sum(jax.grad(loss)(state["w"], slices[i]) for i in range(chunks)) / chunks
        return {"w": state["w"] - 0.1 * g}, {"loss": loss(state["w"], x)}

    return step


@pytest.fixture
def mesh8():
    return ss.create_mesh((8,), ("dp",))


def _args():
    x = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    return ({"w": jnp.full((16, 16), 0.01, jnp.float32)}, jnp.asarray(x))


# ---------------------------------------------------------------- the declaration


@pytest.mark.parametrize("choices, match", [
    ({}, "must map each knob"),
    ({"bad-name": (1, 2)}, "identifier"),
    ({"chunks": ()}, "non-empty"),
    ({"chunks": (1, 1)}, "listed twice"),
    ({"chunks": ([1],)}, "None, bool, int, float or str"),
    ({"chunks": "12"}, "as a sequence"),
])
def test_a_malformed_declaration_is_refused_naming_the_knob(choices, match):
    with pytest.raises(ValueError, match=match):
        ss.Knobs(make_step, choices)


def test_a_setting_keeps_only_what_differs_from_the_defaults_in_declaration_order():
    knobs = ss.Knobs(make_step, {"chunks": (1, 2, 4), "scale": (1.0, 0.5)})
    assert knobs.setting({"scale": 0.5, "chunks": 1}) == (("scale", 0.5),)
    assert knobs.setting({"scale": 1.0, "chunks": 4}) == (("chunks", 4),)
    assert knobs.setting({}) == ()
    assert knobs.values((("chunks", 2),)) == {"chunks": 2, "scale": 1.0}
    assert knobs.step((("chunks", 2),)) is knobs.step((("chunks", 2),))  # built once
    with pytest.raises(ValueError, match=r"knob chunks=3 is not one of its values \(1, 2, 4\)"):
        knobs.setting({"chunks": 3})
    with pytest.raises(ValueError, match=r"knobs \['remat'\] are not declared"):
        knobs.setting({"remat": "full"})
    # True is not 1: a bool knob value is its own choice.
    assert ss.Knobs(make_step, {"chunks": (1, True)}).setting({"chunks": True}) == \
        (("chunks", True),)
    only = knobs.only(["scale"])
    assert only.searched() == {"scale": (1.0, 0.5)}
    assert only.choices["chunks"] == (1,)


def test_the_default_setting_fingerprints_as_a_study_without_knobs():
    specs = (jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec("dp"))
    assert fingerprint(specs, ()) == fingerprint(specs)
    assert fingerprint(specs, (("chunks", 2),)) != fingerprint(specs)
    assert fingerprint(specs, (("chunks", 2),)) != fingerprint(specs, (("chunks", 4),))


# ---------------------------------------------------------------- the built-in knobs


@pytest.mark.parametrize("name", ["gpt:tiny", "llama:tiny", "moe:tiny"])
def test_accumulated_gradients_equal_the_unaccumulated_ones(name):
    """The numerics check: k microbatches give the whole batch's loss and
    gradient, to float32 rounding."""
    w = get_workload(name)
    state, batch = w.init(0)
    # The workload's one-microbatch step and its four-microbatch step update alike.
    one = jax.jit(w.knobs.step(()))(state, batch)
    four = jax.jit(w.knobs.step((("microbatches", 4),)))(state, batch)
    np.testing.assert_allclose(one[1]["loss"], four[1]["loss"], rtol=1e-6)
    # Adam's first moment is (1 - b1) * gradient: compare the gradients themselves.
    for got, want in zip(jax.tree.leaves(four[0]["opt"]["mu"]),
                         jax.tree.leaves(one[0]["opt"]["mu"]), strict=True):
        scale = max(float(np.max(np.abs(want))), 1e-6)
        assert float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) / scale < 1e-4


def test_accumulate_gradients_is_the_mean_over_slices_and_refuses_an_uneven_batch():
    def grad_fn(w, b):
        loss = jnp.mean((b["x"] @ w) ** 2)
        return (loss, {"n": jnp.float32(b["x"].shape[0])}), jax.grad(
            lambda w: jnp.mean((b["x"] @ w) ** 2))(w)

    w = jnp.eye(4, dtype=jnp.float32)
    batch = {"x": jnp.arange(32.0, dtype=jnp.float32).reshape(8, 4) / 10}
    (loss, extra), grads = accumulate_gradients(grad_fn, w, batch, 4)
    (want_loss, _), want = grad_fn(w, batch)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(grads, want, rtol=1e-6)
    assert float(extra["n"]) == 2.0  # each slice's own metric, averaged
    with pytest.raises(ValueError, match=r"microbatches=3 must divide"):
        accumulate_gradients(grad_fn, w, batch, 3)


@pytest.mark.parametrize("groups", [2, 4])
def test_gradients_kept_apart_by_group_are_the_whole_batchs(groups):
    def grad_fn(w, b):
        loss = jnp.mean((b["x"] @ w) ** 2)
        return (loss, {"top": jnp.max(b["x"])}), jax.grad(
            lambda w: jnp.mean((b["x"] @ w) ** 2))(w)

    w = jnp.arange(16.0, dtype=jnp.float32).reshape(4, 4) / 16
    batch = {"x": jnp.arange(64.0, dtype=jnp.float32).reshape(16, 4) / 50}
    (loss, extra), grads = accumulate_gradients(grad_fn, w, batch, 2, groups)
    (want_loss, _), want = grad_fn(w, batch)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(grads, want, rtol=1e-6)
    assert loss.shape == () and extra["top"].shape == ()
    # Each block's own metric, averaged over slices and blocks: the blocks
    # are contiguous rows of each slice, slice j holding rows j, j + 2, ...
    rows = np.arange(16).reshape(8, 2).T.reshape(2, groups, -1)  # [slice, block, row]
    tops = np.asarray(batch["x"]).max(axis=1)[rows].max(axis=2)
    np.testing.assert_allclose(extra["top"], tops.mean(), rtol=1e-6)
    with pytest.raises(ValueError, match=r"grad_groups=3 must divide every microbatch's "
                                         r"rows; got 8"):
        accumulate_gradients(grad_fn, w, batch, 2, 3)
    # Added over the groups in bfloat16 (a bfloat16 model's one reduction):
    # the same gradient to bfloat16's precision, in the parameters' dtype.
    (_, _), low = accumulate_gradients(grad_fn, w, batch, 2, groups, jnp.bfloat16)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, want, rtol=2e-2)
    assert not np.array_equal(np.asarray(low), np.asarray(grads))  # it was rounded


def _all_reduces(mesh, state, batch, *steps):
    """Per step, compiled on `mesh` with the state replicated and the batch
    split over dp: `(all-reduce ops, their bytes, the step's output)`."""
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("dp"))
    shardings = (jax.tree.map(lambda _: rep, state), jax.tree.map(lambda _: split, batch))
    out = []
    for step in steps:
        jitted = jax.jit(step, in_shardings=shardings)
        summary = parse_collectives(jitted.lower(state, batch).compile().as_text())
        ops = [c for c in summary.collectives if c.kind == "all-reduce"]
        out.append((sum(c.count for c in ops), sum(c.bytes * c.count for c in ops),
                    jitted(state, batch)))
    return out


def test_grad_groups_move_the_data_parallel_reduction_out_of_the_microbatch_loop(mesh8):
    """The point of `grad_groups`: on dp=8 with 2 microbatches the gradient's
    all-reduce runs once per microbatch (in the loop) with one group, and once
    per step (after it) with the 8 devices' groups; the update is the same."""
    w = get_workload("mlp:tiny")
    (each, _, plain), (once, _, grouped) = _all_reduces(
        mesh8, *w.init(0), w.knobs.step((("microbatches", 2),)),
        w.knobs.step((("microbatches", 2), ("grad_groups", 8))))
    # mlp:tiny has 4 parameter leaves: 2 microbatches x 4 reductions, against
    # 4 once (XLA may fuse the leaves' reductions into fewer ops, never more).
    assert once < each and each >= 2 * once, (each, once)
    np.testing.assert_allclose(grouped[1]["loss"], plain[1]["loss"], rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grouped[0]), jax.tree.leaves(plain[0]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_grad_groups_take_the_axes_the_steps_rules_put_its_batch_on():
    """With a rule placing the activations' batch dims (a searched act_batch,
    a model's activation_sharding), the groups take those axes and each
    group's own rows are left to XLA: it compiles (the rule would otherwise
    name dp twice in one constraint), reduces once, and updates alike."""
    mesh = ss.create_mesh((4,), ("dp",), devices=jax.devices()[:4])
    w = get_workload("gpt:tiny")  # batch 8: 4 rows at 2 microbatches
    (each, _, plain), (once, _, grouped) = _all_reduces(mesh, *w.init(0), *(
        under_rules(w.knobs.step(setting), {"batch": "dp"}, (("dp", 4),))
        for setting in ((("microbatches", 2),), (("microbatches", 2), ("grad_groups", 4)))))
    assert each > once, (each, once)
    np.testing.assert_allclose(grouped[1]["loss"], plain[1]["loss"], rtol=1e-5)


def test_grad_groups_leave_to_xla_other_dims_ruled_onto_the_batchs_axes():
    """A rule putting another dim on the batch's axes (act_embed=dp beside
    act_batch=dp, found by the cpu-static64-knobs search) is left to XLA
    inside the groups, whose mapped dim took dp: the step traces and updates
    as without the groups (before, tracing failed: "spmd_axis_name ('dp',)
    cannot appear in with_sharding_constraint spec")."""
    mesh = ss.create_mesh((4,), ("dp",), devices=jax.devices()[:4])
    w = get_workload("gpt:tiny")
    rules = {"batch": "dp", "embed": "dp"}
    (each, _, plain), (once, _, grouped) = _all_reduces(mesh, *w.init(0), *(
        under_rules(w.knobs.step(setting), rules, (("dp", 4),))
        for setting in ((("microbatches", 2),), (("microbatches", 2), ("grad_groups", 4)))))
    assert each > once, (each, once)
    np.testing.assert_allclose(grouped[1]["loss"], plain[1]["loss"], rtol=1e-5)


def test_grad_groups_on_a_model_that_pins_its_batch_reduce_once_in_its_dtype():
    """A bfloat16 model with `activation_sharding` (the published rows): the
    whole step runs under the model's batch rule, the groups take dp, and the
    one reduction is in bfloat16: fewer all-reduces over dp, and fewer bytes
    than the two per-microbatch ones (float32 once would move as many)."""
    mesh = ss.create_mesh((4,), ("dp",), devices=jax.devices()[:4])
    cfg = LlamaConfig(vocab=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192,
                      seq=32, batch=8, compute_dtype="bfloat16",
                      activation_sharding=ActivationSharding((("dp", 4),), ("dp",)))
    w = build_llama("llama:pinned", cfg)
    step = w.knobs.step((("microbatches", 2), ("grad_groups", 4)))
    (each_ops, each_bytes, plain), (once_ops, once_bytes, grouped) = _all_reduces(
        mesh, *w.init(0), w.knobs.step((("microbatches", 2),)), step)
    assert once_ops < each_ops and once_bytes <= each_bytes / 2, (each_bytes, once_bytes)
    np.testing.assert_allclose(grouped[1]["loss"], plain[1]["loss"], rtol=1e-3)
    # XLA:CPU widens bfloat16, so the bytes cannot show the dtype; the program can.
    args = w.abstract()
    # The kept-apart sums are placed on dp, which the model's rule alone (inside
    # its loss) would not do: the step runs under it.
    assert any(spec[:1] == ("dp",) for spec in constraints(step, *args))
    # The one reduction over the groups is a bfloat16 sum of [4, ...] values.
    text = str(jax.make_jaxpr(step)(*args))
    assert re.search(r"bf16\[[\d,]*\] = reduce_sum\[[^\]]*axes=\(0,\)[^\n]*\n?", text) and \
        re.search(r":bf16\[4,", text), "no bfloat16 sum over the groups"


def test_grad_groups_are_offered_at_the_meshs_group_sizes_and_refused_where_they_cannot_be(
        mesh8, mesh24):
    w = get_workload("mlp:tiny")  # batch 16: 8 rows at 2 microbatches
    assert w.knobs.choices["grad_groups"] == (1, 2, 4, 8)
    ctx, _ = make_context(w, None, mesh8, knobs=True)
    assert ctx.knobs.choices["grad_groups"] == (1, 8)  # dp=8: only 8 devices split a batch
    ctx, _ = make_context(w, None, mesh24, knobs=True)
    assert ctx.knobs.choices["grad_groups"] == (1, 2, 4, 8)  # dp, tp, dp x tp
    with pytest.raises(ValueError, match=r"grad_groups=4 does not divide a microbatch of 2 "
                                         r"rows \(batch 16, microbatches=8\)"):
        w.knobs.step((("microbatches", 8), ("grad_groups", 4)))
    with pytest.raises(ValueError, match=r"microbatches=1 accumulates nothing"):
        w.knobs.step((("grad_groups", 2),))
    # gpt:tiny's batch of 8 cannot be kept apart over 8 devices: no such knob on dp=8.
    ctx, _ = make_context(get_workload("gpt:tiny"), None, mesh8,
                          knobs=("microbatches", "grad_groups"))
    assert set(ctx.knobs.searched()) == {"microbatches"}


def test_the_best_baselines_variants_accumulate_and_reduce_once(mesh8):
    w = get_workload("mlp:tiny")
    ctx, _ = make_context(w, None, mesh8, knobs=True)
    dp = baseline_candidates(w, mesh8)["dp"]
    rows, devices = dp.batch_split(ctx.abstract_args, {"dp": 8})
    assert (rows, devices) == (16, 8)
    labels = set(knob_variants(dp, ctx.knobs, (), devices))
    assert labels == {"dp~microbatches=2", "dp~microbatches=4", "dp~microbatches=8",
                      "dp~microbatches=2,grad_groups=8"}  # 4 and 8 leave 4 and 2 rows
    # Told the batch, only the counts that divide each device's 2 rows.
    assert set(knob_variants(dp, ctx.knobs, (), devices, rows)) == {
        "dp~microbatches=2", "dp~microbatches=2,grad_groups=8"}
    # So do a later round's moves from a plan with microbatches (16 rows on 2
    # devices: 8 each; on 8: 2 each, which only 2 divides).
    two = dataclasses.replace(dp, knobs=(("microbatches", 2),))
    assert list(plan_moves(two, ctx.knobs, retune=True, batch_rows=16, batch_devices=2)[0]) == [
        "dp~microbatches=4", "dp~microbatches=8"]
    assert plan_moves(two, ctx.knobs, retune=True, batch_rows=16, batch_devices=8) == [{}] * 4
    # A batch on fewer devices than any offered group: no such variant.
    assert not any("grad_groups" in label
                   for label in knob_variants(dp, ctx.knobs, (), 2))


def test_the_second_round_combines_what_helped_and_rescues_what_did_not_fit(mesh8):
    """After the variants: the faster ones together, and each one over the
    memory limit with the variants that saved the most memory (issue 24:
    remat=selective did not fit the 32B v5p row, microbatches=8 saved two
    thirds of its memory, and nothing tried both)."""
    def make(remat="full", microbatches=1, sp=False):
        if remat == "none" and microbatches == 8:
            raise ValueError("too few rows per microbatch")
        return make_step()

    knobs = ss.Knobs(make, {"remat": ("full", "selective", "none"),
                            "microbatches": (1, 2, 4, 8), "sp": (False, True)})
    w = get_workload("mlp:tiny")
    base = baseline_candidates(w, mesh8)["dp"]
    gib = 2**30
    completed = {(("microbatches", 2),): (6.56, 36 * gib), (("microbatches", 4),): (6.56, 24 * gib),
                 (("microbatches", 8),): (6.55, 18 * gib), (("sp", True),): (6.50, 31 * gib),
                 (("remat", "selective"), ("sp", True)): (7.0, 60 * gib)}
    over = [(("remat", "selective"),), (("remat", "none"),)]
    got = knob_combinations(base, knobs, (6.57, 55 * gib), completed, over)
    assert list(got) == [
        "dp~microbatches=8,sp=True",  # the fastest two that set different knobs
        "dp~remat=selective,microbatches=8", "dp~remat=selective,microbatches=4",
        # remat=none with 8 microbatches is refused by the factory: the next savers
        "dp~remat=none,microbatches=4", "dp~remat=none,sp=True"]
    assert got["dp~remat=selective,microbatches=8"].knobs == (("remat", "selective"),
                                                              ("microbatches", 8))
    assert all(c.state_rule == base.state_rule for c in got.values())
    # Nothing faster but one, nothing over: nothing to combine.
    assert knob_combinations(base, knobs, (6.0, None), completed, []) == {}
    # A setting that was tried already is not tried again.
    assert "dp~remat=selective,sp=True" not in knob_combinations(
        base, knobs, (6.57, 55 * gib), completed, [(("remat", "selective"),)], per_cut=5)


def test_the_third_round_moves_one_activation_point_at_a_time_from_the_best_plan(mesh8):
    """Random placements of every point at once mostly did not fit or compile
    (30-43% of the published-chip H100 rows' search time); from the best plan
    so far, one point moves at a time: one axis first, then several axes,
    then whole; the moves that helped then run together."""
    def make(remat="full", act_embed="auto", act_mlp="auto"):
        if act_mlp == "tp,dp":
            raise ValueError("refused")
        return make_step()

    knobs = ss.Knobs(make, {"remat": ("full", "none"),
                            "act_embed": ("auto", "-", "dp", "tp"),
                            "act_mlp": ("auto", "-", "dp", "dp,tp", "tp,dp")})
    base = baseline_candidates(get_workload("mlp:tiny"), mesh8)["dp"]
    plan = dataclasses.replace(base, label="dp~remat=none", knobs=(("remat", "none"),))
    moves = activation_moves(plan, knobs, tried=[(("remat", "none"), ("act_mlp", "dp"))])
    assert list(moves) == [
        "dp~remat=none,act_embed=dp", "dp~remat=none,act_embed=tp",  # one axis
        "dp~remat=none,act_mlp=dp,tp",  # act_mlp=dp was tried, tp,dp is refused
        "dp~remat=none,act_embed=-", "dp~remat=none,act_mlp=-"]      # whole
    assert all(m.same_sharding(base) for m in moves.values())
    # A plan with a point placed moves it back to XLA's choice too, unless
    # that is the baseline itself, which the first round ran.
    placed = dataclasses.replace(base, label="dp~act_embed=tp", knobs=(("act_embed", "tp"),))
    assert list(activation_moves(placed, knobs))[:2] == ["dp~act_embed=dp",
                                                         "dp~act_embed=tp,act_mlp=dp"]
    both = dataclasses.replace(placed, knobs=(("remat", "none"), ("act_embed", "tp")))
    assert "dp~remat=none" in activation_moves(both, knobs)
    # The moves that helped, together, from the plan's own knobs.
    gib = 2**30
    completed = {(("act_embed", "tp"),): (0.91, 18 * gib),
                 (("act_mlp", "dp,tp"),): (0.93, 20 * gib), (("act_mlp", "-"),): (0.99, 20 * gib)}
    assert list(knob_combinations(plan, knobs, (0.95, 28 * gib), completed, ())) == [
        "dp~remat=none,act_embed=tp,act_mlp=dp,tp"]


def test_when_no_baseline_fits_the_one_closest_to_fitting_is_tuned():
    """The 22B v4 row: every expert plan compiled over v4's 32 GiB, so no
    baseline completed and no knob variant ran; the one with the least XLA
    total is the one a person would tune."""
    from types import SimpleNamespace

    from shardsearch.search.evaluation.stages import COMPLETE, CUT, Stage
    from shardsearch.search.loop import variant_bases

    def record(label, status, stage=None, total=None, value=None):
        memory = {} if total is None else {"total": total}
        return SimpleNamespace(label=label, outcome=SimpleNamespace(
            status=status, cut_stage=stage, memory=memory, value=value))

    order = dict.fromkeys(("replicated", "default", "fsdp", "fsdp_tp"))
    over = [record("replicated", CUT, Stage.CHECK),
            record("default", CUT, Stage.COMPILE, 40_853_869_568),
            record("fsdp", CUT, Stage.COMPILE, 40_853_607_936),
            record("fsdp_tp", CUT, Stage.COMPILE),  # refused with no figure
            record("search", CUT, Stage.COMPILE, 1)]  # not a baseline
    assert [r.label for r in variant_bases(over, order)] == ["fsdp"]
    done = [*over, record("fsdp_tp", COMPLETE, value=2.0), record("default", COMPLETE, value=1.0)]
    # The fastest that completed.
    assert [r.label for r in variant_bases(done, order)] == ["default"]
    assert variant_bases(over[:1], order) == []
    # An expert plan within TIE of the fastest ties with it, whatever the
    # sign of the values (an objective may score negative); the default
    # plan is no expert's and is not tuned for a tie.
    tied = [*over, record("fsdp", COMPLETE, value=-2.0), record("fsdp_tp", COMPLETE, value=-1.999),
            record("default", COMPLETE, value=-1.9999)]
    assert [r.label for r in variant_bases(tied, order)] == ["fsdp", "fsdp_tp"]
    apart = [*over, record("fsdp", COMPLETE, value=2.0), record("fsdp_tp", COMPLETE, value=2.01)]
    assert [r.label for r in variant_bases(apart, order)] == ["fsdp"]


def test_a_knob_setting_the_factory_refuses_is_cut_before_compiling(mesh8, tmp_path):
    """The sampler draws knobs independently, so a factory may be asked for a
    combination it refuses (grad_groups that does not divide a microbatch):
    that trial is cut with the factory's reason, and the search goes on."""
    def picky(chunks: int = 1):
        if chunks == 3:
            raise ValueError("chunks=3 does not divide the batch of 32")
        return make_step(chunks)

    result = ss.optimize(ss.Knobs(picky, {"chunks": (1, 2, 3)}), _args(), mesh=mesh8,
                         n_trials=12, storage=f"sqlite:///{tmp_path / 's.db'}",
                         study_name="k", quiet=True, warmup=1, repeats=2, confirm_rounds=0,
                         isolate=False)
    refused = [t for t in result.trials if dict(t.knobs).get("chunks") == 3]
    assert refused, [t.label for t in result.trials]  # the best baseline's variant at least
    for t in refused:
        assert (t.outcome.status, t.outcome.cut_stage) == ("cut", ss.search.Stage.CHECK)
        assert t.outcome.reason == ("the step cannot be built with chunks=3: chunks=3 does "
                                    "not divide the batch of 32")
    assert any(dict(t.knobs).get("chunks") == 2 and t.outcome.status == "complete"
               for t in result.trials)


def test_a_workloads_default_setting_is_its_step():
    for name in ("mlp:tiny", "gpt:tiny", "llama:tiny"):
        w = get_workload(name)
        args = w.abstract()
        assert jaxpr_digest(jax.make_jaxpr(w.knobs.step(()))(*args)) == \
            jaxpr_digest(jax.make_jaxpr(w.step)(*args)), name
    assert get_workload("mlp:tiny").knobs.describe() == {"microbatches": [1, 2, 4, 8],
                                                        "grad_groups": [1, 2, 4, 8]}
    assert get_workload("llama:7b").knobs.choices["remat"] == ("full", "none", "selective")
    # Every count up to 8 that divides the batch: 3 and 6 of 12 rows too.
    twelve = get_workload('gpt:custom:{"layers":1,"d_model":16,"heads":2,"d_ff":32,'
                          '"vocab":64,"seq":8,"batch":12}')
    assert twelve.knobs.choices["microbatches"] == (1, 2, 3, 4, 6)
    assert get_workload("gpt:tiny").knobs.choices["remat"] == ("none", "selective", "full")


# ---------------------------------------------------------------- the search


def test_optimize_searches_a_factorys_knobs_and_exports_them(mesh8, tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    knobs = ss.Knobs(make_step, {"chunks": (1, 2, 4)})
    # 12 trials: the four baselines and the knob variants of the best ones
    # (two tied experts would bring two each) can leave 9 trials one or two
    # searched ones, whose first draw is chunks=1 (9 failed once, on a slow
    # machine, in a fresh-clone CI run of 0056bad).
    result = ss.optimize(knobs, _args(), mesh=mesh8, n_trials=12, storage=storage,
                         study_name="k", quiet=True, warmup=1, repeats=2, confirm_rounds=6,
                         isolate=False)
    space = result.setup.space
    assert [p.name for p in space.params()][-1] == "knob_chunks"
    assert {dict(params)["knob_chunks"] for params in space.enumerate()} == {1, 2, 4}
    searched = [t for t in result.trials if t.label == "search"]
    settings = {t.knobs for t in searched}
    assert settings - {()}, "no searched trial changed the knob"
    assert all(t.knobs == () for t in result.trials if t.label != "search" and "~" not in t.label)
    assert all(t.knobs for t in result.trials if "~" in t.label)  # the best baseline's variants
    # A trial's knobs are stored and read back; its fingerprint covers them.
    stored = optuna.load_study(study_name="k", storage=storage)
    for t in searched:
        attrs = stored.trials[t.number].user_attrs
        assert attrs.get("knobs", {}) == dict(t.knobs)
        assert attrs["outcome"]["fingerprint"] == t.outcome.fingerprint
    assert result.best_knobs["chunks"] in (1, 2, 4) and set(result.best_knobs) == {"chunks"}
    # The output check compared the winner's step with the step as given.
    assert result.outputs_match is True
    # A trial that changed the knob exports them; the plan file reads them back.
    knobbed = next(t for t in searched if t.knobs)
    config = ss.export_config(stored, trial=knobbed.number)
    assert config["knobs"] == dict(knobbed.knobs)
    path = tmp_path / "plan.json"
    ss.write_config(config, path)
    assert ss.load_plan(path).knobs == dict(knobbed.knobs)
    assert json.loads(path.read_text())["knobs"] == dict(knobbed.knobs)


def test_a_study_resumed_with_other_knobs_is_refused(mesh8, tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    common = dict(mesh=mesh8, n_trials=3, storage=storage, study_name="k", quiet=True,
                  warmup=1, repeats=2, confirm_rounds=0, isolate=False)
    ss.optimize(ss.Knobs(make_step, {"chunks": (1, 2)}), _args(), **common)
    with pytest.raises(ValueError, match=r"knobs chunks=1\|2\|4"):
        ss.optimize(ss.Knobs(make_step, {"chunks": (1, 2, 4)}), _args(), **common)
    with pytest.raises(ValueError, match="no knobs"):
        ss.optimize(make_step(), _args(), **common)


def test_knobs_asked_of_a_step_that_declares_none_say_how(mesh8):
    with pytest.raises(ValueError, match=r"declares no knobs and places no activations; "
                                         r"pass the step as shardsearch.Knobs\(make_step"):
        make_context(make_step(), _args(), mesh8, knobs=True)
    with pytest.raises(ValueError, match=r"knobs \['remat'\] are not declared; the step's "
                                         r"knobs are \['microbatches', 'grad_groups'\]"):
        make_context(get_workload("mlp:tiny"), None, mesh8, knobs=("remat",))
    # A workload's knobs are opt-in: its defaults are what it publishes.
    ctx, _ = make_context(get_workload("mlp:tiny"), None, mesh8)
    assert ctx.knobs is None
    with pytest.raises(ValueError, match="has no knobs"):
        ctx.with_setting((("microbatches", 2),))


def test_a_worker_builds_the_step_of_each_setting(mesh24):
    """Isolated: the setting travels with the job, the worker rebuilds the
    workload's step for it, and the outcome is the one in-process gives."""
    workload = get_workload("gpt:tiny")
    dp = baseline_candidates(workload, mesh24)["dp"]
    candidate = Candidate(dp.state_rule, dp.batch_rule, "dp", knobs=(("microbatches", 2),))
    outcomes = {}
    for isolate in (False, True):
        ctx, _ = make_context(workload, None, mesh24, knobs=True, isolate=isolate,
                              warmup=1, repeats=2)
        with ctx:
            assert (type(ctx.executor).__name__ == "Isolation") == isolate
            specs, fp = resolve(candidate, ctx)
            knobbed = ctx.with_setting(candidate.knobs)
            outcomes[isolate] = evaluate(specs, fp, knobbed)
            assert ctx.compiles == 1  # counted on the study's context too
            match, worst = compare_outputs(specs, specs, knobbed)
            assert match and worst < 1e-3
    assert outcomes[True].status.value == outcomes[False].status.value == "complete"
    assert outcomes[True].flops == outcomes[False].flops
    assert outcomes[True].memory["temp"] == outcomes[False].memory["temp"]
    plain, _ = resolve(dp, ctx)
    assert outcomes[True].fingerprint != fingerprint(plain)


def test_the_cli_searches_a_workloads_knobs_and_refuses_unknown_ones(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.chdir(tmp_path)
    common = ["--workload", "mlp:tiny", "--mesh", "dp=8", "--objective", "static", "--quiet",
              "--no-isolate", "--no-compile-cache", "--confirm-rounds", "0"]
    argv = ["optimize", *common, "--trials", "8", "--knobs", "microbatches", "--space",
            "rules", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", "plan.json"]
    assert _cli.main(argv) == 0
    assert "step built with microbatches=" in capsys.readouterr().out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["knobs"]["microbatches"] in (1, 2, 4, 8)
    assert _cli.main(["show", "plan.json"]) == 0
    assert plan["knobs"]["grad_groups"] == 1  # every knob the workload declares, by value
    assert (f"step knobs: grad_groups=1, microbatches={plan['knobs']['microbatches']}"
            in capsys.readouterr().out)
    argv = ["optimize", *common, "--trials", "2", "--knobs", "remat", "--storage",
            f"sqlite:///{tmp_path / 't.db'}"]
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert "knobs ['remat'] are not declared" in err


def test_the_output_check_compares_a_setting_with_the_step_as_given(mesh8):
    """A knob that changes the numbers (here the loss's scale) fails the
    check: the reference runs the default setting, not the candidate's."""
    ctx, _ = make_context(ss.Knobs(make_step, {"scale": (1.0, 0.5), "chunks": (1, 4)}),
                          _args(), mesh8, warmup=1, repeats=2)
    specs, _ = resolve(baseline_candidates(None, mesh8, ctx.abstract_args)["replicated"], ctx)
    assert compare_outputs(specs, specs, ctx.with_setting((("chunks", 4),)))[0] is True
    match, worst = compare_outputs(specs, specs, ctx.with_setting((("scale", 0.5),)))
    assert match is False and worst > 0.1


def test_the_best_baselines_knob_variants_run_after_the_baselines(mesh8, tmp_path):
    workload = get_workload("mlp:tiny")
    result = ss.optimize(workload, mesh=mesh8, n_trials=14, objective="static",
                         knobs=("microbatches",), storage=f"sqlite:///{tmp_path / 's.db'}",
                         study_name="v", quiet=True, isolate=False, space="rules")
    labels = [t.label for t in result.trials]
    order = list(result.setup.run_order())
    assert labels[:len(order)] == order
    done = [t for t in result.trials[:len(order)] if t.outcome.status.value == "complete"]
    best = min(done, key=lambda t: t.outcome.value)
    variants = result.trials[len(order):len(order) + 3]
    assert [t.label for t in variants] == [f"{best.label}~microbatches={k}" for k in (2, 4, 8)]
    assert [t.knobs for t in variants] == [(("microbatches", k),) for k in (2, 4, 8)]
    assert all(t.state_rule == best.state_rule and t.batch_rule == best.batch_rule
               for t in variants)
    assert labels[len(order) + 3:] == ["search"] * (14 - len(order) - 3)
    # Reported beside the baselines, never counted as an expert's plan.
    config = ss.export_config(result)
    rows = {row["label"] for row in config["results"]["baselines"]}
    assert {t.label for t in variants} <= rows
    assert "~" not in (config["results"]["best_expert"] or "")


def test_a_pinned_best_baseline_is_still_tuned_knob_by_knob(mesh24, tmp_path):
    """Searching act_batch, the experts run with their activations' batch on
    their split (`pin_batch`): the best one still gets its remat variants,
    each keeping that pin (`knob_variants` had returned none for a plan
    with knobs set)."""
    workload = get_workload("gpt:tiny")
    result = ss.optimize(workload, mesh=mesh24, n_trials=8, objective="static",
                         knobs=("remat", "act_batch"),
                         storage=f"sqlite:///{tmp_path / 's.db'}", study_name="pinned",
                         quiet=True, isolate=False, space="rules")
    order = result.setup.run_order()
    first = result.trials[:len(order)]
    best = min((t for t in first if t.outcome.status.value == "complete"),
               key=lambda t: t.outcome.value)
    pin = dict(best.knobs)
    assert list(pin) == ["act_batch"]  # the best expert is pinned
    variants = result.trials[len(order):len(order) + 2]
    assert [t.label for t in variants] == [
        f"{best.label}~remat={r},act_batch={pin['act_batch']}" for r in ("selective", "full")]
    assert [dict(t.knobs) for t in variants] == [{"remat": r, **pin}
                                                 for r in ("selective", "full")]
    assert all((t.state_rule, t.batch_rule) == (best.state_rule, best.batch_rule)
               for t in variants)


def test_after_the_knob_rounds_the_best_plan_moves_its_activation_points(mesh24, tmp_path):
    workload = get_workload("gpt:tiny")
    # 6 baselines, no microbatch variant of fsdp (the best), 5 act_mlp moves:
    # one trial is left for the sampler.
    n_trials = 12
    result = ss.optimize(workload, mesh=mesh24, n_trials=n_trials, objective="static",
                         knobs=("microbatches", "act_mlp"),
                         storage=f"sqlite:///{tmp_path / 's.db'}", study_name="moves",
                         quiet=True, isolate=False, space="rules")
    labels = [t.label for t in result.trials]
    # The best baseline's variants: the microbatch counts that divide each
    # device's rows of the batch (none when it splits the 8 rows over all 8
    # devices, as fsdp does); nothing to combine (one knob).
    order = result.setup.run_order()
    first = min((t for t in result.trials[:len(order)] if t.outcome.status.value == "complete"),
                key=lambda t: t.outcome.value)
    rows, devices = order[first.label].batch_split(result.setup.context.abstract_args,
                                                   {"dp": 2, "tp": 4})
    counts = [k for k in (2, 4, 8) if (rows // devices) % k == 0]
    assert labels[len(order):len(order) + len(counts)] == [
        f"{first.label}~microbatches={k}" for k in counts]
    last = len(order) + len(counts) - 1
    done = [t for t in result.trials[:last + 1] if t.outcome.status.value == "complete"]
    best = min(done, key=lambda t: t.outcome.value)
    # The best plan of the first rounds, then each act_mlp value it does not
    # have, one axis first; one act_mlp point: nothing to move together.
    values = [v for v in result.setup.context.knobs.searched()["act_mlp"]
              if v != dict(best.knobs).get("act_mlp", "auto")]
    values.sort(key=lambda v: 2 if v == "-" else 1 if "," in v else 0)
    root = best.label.split("~")[0]
    expected = [f"{root}~{setting_text((*best.knobs, ('act_mlp', v)))}" for v in values]
    assert labels[last + 1:last + 1 + len(values)] == expected
    moved = result.trials[last + 1:last + 1 + len(values)]
    assert all((t.state_rule, t.batch_rule) == (best.state_rule, best.batch_rule) for t in moved)
    assert labels[last + 1 + len(values):] == ["search"] * (n_trials - last - 1 - len(values))
    assert labels[-1] == "search"


class _ScoredRunner:
    """Stands in for the loop's runner in `_search`: runs candidates in the
    order given and scores each by `score(knobs)` (no compile), plus its
    plan's `offsets` entry (by the label before "~"), so the rounds' order
    can be followed exactly."""

    def __init__(self, score, offsets=None):
        self.score, self.offsets, self.records, self.ran = score, offsets or {}, [], []

    def run(self, candidates, n, timeout, roster):
        from shardsearch.search.evaluation.outcome import Outcome
        from shardsearch.search.study.record import TrialRecord

        for label, candidate in list(candidates.items())[:n]:
            self.ran.append(label)
            value = self.score(dict(candidate.knobs)) + self.offsets.get(label.split("~")[0], 0)
            outcome = Outcome(label, "complete", None, value=value)
            self.records.append(TrialRecord(len(self.records), label, {}, outcome,
                                            candidate.state_rule.to_config(),
                                            candidate.batch_rule.to_config(), 0.0,
                                            candidate.knobs))
        if not candidates:
            self.ran.extend(["search"] * n)


def _rounds_setup(mesh, tmp_path, knobs, n_trials):
    """A gpt:tiny study's setup searching `knobs`, made by a one-trial run
    without warm-starting, then set to warm-start `n_trials`: what `_search`
    takes, for a `_ScoredRunner` to follow its rounds."""
    result = ss.optimize(get_workload("gpt:tiny"), mesh=mesh, n_trials=1, objective="static",
                         knobs=knobs, warm_start=False, storage=f"sqlite:///{tmp_path / 's.db'}",
                         study_name="rounds", quiet=True, isolate=False, space="rules")
    return dataclasses.replace(result.setup, settings=dataclasses.replace(
        result.setup.settings, n_trials=n_trials, warm_start=True))


def test_the_changes_that_helped_a_pinned_expert_are_combined(mesh24, tmp_path):
    """A pinned expert's variants share its `act_batch`: their changes, not
    their settings, are combined (two settings that both set act_batch
    would read as one knob set twice, and nothing would be combined)."""
    from shardsearch.search.loop import _search

    setup = _rounds_setup(mesh24, tmp_path, ("remat", "microbatches", "act_batch"), 30)
    knobs, order = setup.context.knobs, list(setup.run_order())
    assert dict(setup.run_order()["megatron"].knobs) == {"act_batch": "dp"}

    # megatron (the first baseline on act_batch=dp) is the best; selective
    # remat and two microbatches each help it.
    def score(setting):
        return (1.0 - 0.1 * (setting.get("act_batch") == "dp")
                - 0.02 * (setting.get("remat") == "selective")
                - 0.01 * (setting.get("microbatches") == 2))

    # fsdp_tp, also on act_batch=dp, just behind: no tie.
    runner = _ScoredRunner(score, {"fsdp_tp": 0.01})
    _search(runner, setup, None)

    def label(**values):
        return "megatron~" + setting_text(knobs.setting({"act_batch": "dp", **values}))

    # 4 rows per device of megatron's dp split: 2 and 4 microbatches.
    variants = [label(microbatches=2), label(microbatches=4), label(remat="selective"),
                label(remat="full")]
    assert runner.ran[len(order):len(order) + 5] == [
        *variants, label(remat="selective", microbatches=2)]


def test_expert_plans_tied_with_the_best_are_tuned_too(mesh24, tmp_path):
    """The 64B v5p row: pinned FSDP beat FSDP×TP by 7 parts per million, so
    only FSDP's knobs were tuned, and the winner fell from 1.24x (FSDP×TP
    with 4 microbatches) to 1.15x. Every expert plan within `TIE` of the
    best gets its variants; the combinations of the base whose best plan is
    now the fastest run first."""
    from shardsearch.search.loop import TIE, _search

    setup = _rounds_setup(mesh24, tmp_path, ("remat", "microbatches"), 40)
    knobs, order = setup.context.knobs, list(setup.run_order())
    pins = {label: dict(c.knobs)["act_batch"] for label, c in setup.run_order().items()
            if c.knobs}
    assert pins == {"dp": "dp,tp", "fsdp": "dp,tp", "megatron": "dp", "fsdp_tp": "dp"}

    # fsdp is the best, megatron within TIE of it, fsdp_tp just outside.
    # Selective remat helps every plan, two microbatches more (only plans
    # splitting the batch over dp alone have the rows for them).
    offsets = {"replicated": 1.0, "default": 0.5, "dp": 0.2, "fsdp": 0.0,
               "megatron": TIE / 2, "fsdp_tp": 2 * TIE}

    def score(setting):
        return (1.0 - 0.02 * (setting.get("remat") == "selective")
                - 0.03 * (setting.get("microbatches") == 2))

    runner = _ScoredRunner(score, offsets)
    _search(runner, setup, None)

    def label(plan, **values):
        return f"{plan}~" + setting_text(knobs.setting({"act_batch": pins[plan], **values}))

    assert runner.ran[:len(order)] == order
    assert runner.ran[len(order):len(order) + 7] == [
        # fsdp's variants: one row per device, so no microbatches.
        label("fsdp", remat="selective"), label("fsdp", remat="full"),
        label("megatron", microbatches=2), label("megatron", microbatches=4),
        label("megatron", remat="selective"), label("megatron", remat="full"),
        # megatron's two changes together (fsdp's one has nothing to join).
        label("megatron", remat="selective", microbatches=2)]
    assert not any(r.startswith("fsdp_tp~") for r in runner.ran[:len(order) + 7])


@pytest.mark.parametrize("grouping", [-0.1, 0.1], ids=["helps", "hurts"])
def test_gradient_grouping_is_tried_at_the_most_microbatches_first(mesh24, tmp_path, grouping):
    """The 32B v5p row: FSDP×TP's five variants that group the gradients
    each took a minute of the chip's compile to come out 5.8x slower than
    the same microbatches without. The one with the most microbatches, where
    grouping stands best, runs first (after its sibling); the others only
    where it was faster than that sibling."""
    from shardsearch.search.loop import _search

    # 16 rows per device of megatron's dp split: 2, 4 and 8 microbatches,
    # each also with the gradients of the 2 dp ranks kept apart.
    workload = get_workload("gpt:custom", layers=1, d_model=16, heads=4, d_ff=32, vocab=64,
                            seq=8, batch=32)
    result = ss.optimize(workload, mesh=mesh24, n_trials=1, objective="static",
                         knobs=("microbatches", "grad_groups"),
                         storage=f"sqlite:///{tmp_path / 's.db'}", study_name="grouping",
                         quiet=True, isolate=False, space="rules")
    setup = dataclasses.replace(result.setup, settings=dataclasses.replace(
        result.setup.settings, n_trials=30))
    knobs, order = setup.context.knobs, list(setup.run_order())

    def score(setting):
        return 1.0 + grouping * ("grad_groups" in setting)

    runner = _ScoredRunner(score, {"megatron": -0.5})  # the best plan, by far
    _search(runner, setup, None)

    def label(**values):
        return "megatron~" + setting_text(knobs.setting({"act_batch": "dp", **values}))

    probe = label(microbatches=8, grad_groups=2)
    others = [label(microbatches=k, grad_groups=2) for k in (2, 4)]
    assert runner.ran[len(order):len(order) + 4] == [
        *(label(microbatches=k) for k in (2, 4, 8)), probe]
    after = runner.ran[len(order) + 4:]
    if grouping < 0:
        assert after[:2] == others
    else:
        assert not set(others) & set(runner.ran)
        assert after == ["search"] * (30 - len(order) - 4)


def test_moves_go_on_from_each_better_plan_and_retune_the_other_knobs_there(mesh24, tmp_path):
    """Round after round from each better plan, a tier at a time (from the
    second round the other knobs, then one axis, several, whole), going on
    as soon as a tier finds one (the 16B H100 row: `act_embed=tp` freed the
    memory that full remat had saved, and without remat it was 10% faster)."""
    from shardsearch.search.loop import _search

    setup = _rounds_setup(mesh24, tmp_path, ("remat", "act_mlp", "act_embed"), 60)
    knobs = setup.context.knobs
    assert knobs.searched()["act_mlp"] == ("auto", "-", "dp", "tp", "dp,tp", "tp,dp")

    # act_mlp=tp helps alone; with it, full remat; with both, act_embed=dp.
    def score(setting):
        mlp, embed = setting.get("act_mlp", "auto"), setting.get("act_embed", "auto")
        full = setting.get("remat", "none") == "full"
        return (1.0 - 0.1 * (mlp == "tp") - 0.05 * (mlp == "tp" and full)
                - 0.02 * (mlp == "tp" and full and embed == "dp"))

    order = list(setup.run_order())
    root = order[0]  # ahead of every other baseline by more than a tie
    runner = _ScoredRunner(score, {label: 0.01 for label in order[1:]})
    _search(runner, setup, None)

    def labels(fixed, *changes):
        return [f"{root}~{setting_text(knobs.setting({**fixed, name: value}))}"
                for name, value in changes]

    tp = {"act_mlp": "tp"}
    full = {**tp, "remat": "full"}
    dp = {**full, "act_embed": "dp"}
    expected = [
        *labels({}, ("remat", "selective"), ("remat", "full")),  # the baseline's variants
        # Round 1, one axis: act_mlp=tp is better, so the round ends there.
        *labels({}, ("act_embed", "dp"), ("act_embed", "tp"), ("act_mlp", "dp"),
                ("act_mlp", "tp")),
        # Round 2 from it: remat first, a tier of its own; full is better.
        *labels(tp, ("remat", "selective"), ("remat", "full")),
        # Round 3: its remat moves were run; act_embed=dp is better.
        *labels(full, ("act_embed", "dp"), ("act_embed", "tp"), ("act_mlp", "dp")),
        # Round 4 finds nothing better in any tier: the other knobs, one axis
        # (a point back to XLA's choice too), several, whole.
        *labels(dp, ("remat", "none"), ("remat", "selective")),
        *labels(dp, ("act_mlp", "auto"), ("act_mlp", "dp")),
        *labels(dp, ("act_embed", "dp,tp"), ("act_embed", "tp,dp"), ("act_mlp", "dp,tp"),
                ("act_mlp", "tp,dp")),
        *labels(dp, ("act_embed", "-"), ("act_mlp", "-"))]
    assert runner.ran[:len(order)] == order
    assert runner.ran[len(order):] == expected + ["search"] * (60 - len(order) - len(expected))
    # The tiers of a plan, everything untried: the other knobs, one axis,
    # several axes, whole; activation_moves is the points' moves alone.
    start = setup.run_order()[root]
    plan = dataclasses.replace(start, knobs=knobs.setting(dp))
    assert [len(t) for t in plan_moves(plan, knobs, retune=True)] == [2, 4, 4, 2]
    assert [len(t) for t in plan_moves(plan, knobs)] == [0, 4, 4, 2]
    assert list(activation_moves(start, knobs)) == labels(
        {}, *[(n, v) for rank in ("one", "several", "whole") for n in ("act_embed", "act_mlp")
              for v in ("dp", "tp", "dp,tp", "tp,dp", "-")
              if rank == ("whole" if v == "-" else "several" if "," in v else "one")])
