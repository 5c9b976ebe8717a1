"""Stage 1's memory prediction: live bytes of the step's jaxpr under a candidate's
specs (`cost.footprint`), and the cut it allows before compiling."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import optuna
import pytest
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base.warnings import ShardsearchWarning
from shardsearch.cost.footprint import predict_footprint as predict
from shardsearch.cost.footprint import trace_program
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.evaluation.outcome import PREDICTED, Outcome
from shardsearch.search.evaluation.stages import COMPLETE, CUT, Stage
from shardsearch.search.setup import SearchSettings, make_context
from shardsearch.search.space.baselines import baseline_candidates
from shardsearch.search.study.record import TrialRecord, prediction_summary
from shardsearch.workloads import expert_plans, get_workload

F32 = jnp.float32


def _sds(*shape):
    return jax.ShapeDtypeStruct(shape, F32)


def test_live_bytes_of_a_chain_follow_last_uses_and_the_donated_state():
    def step(x, y):
        a = x * 2.0       # 4 KiB
        b = a + 1.0       # 4 KiB while a is still live, then a dies
        return b * y      # the new state: takes x's buffer

    program = trace_program(step, (_sds(1024), _sds(1024)))
    whole = predict(program, (P(), P()), {"x": 4})
    assert (whole.arguments, whole.live) == (8192, 8192)
    # Split 4 ways, every value of the chain is split with its operands.
    split = predict(program, (P("x"), P("x")), {"x": 4})
    assert (split.arguments, split.live, split.total) == (2048, 2048, 4096)


def test_a_broadcast_is_not_stored_it_is_computed_where_it_is_read():
    def step(x, y):
        threes = jnp.full_like(y, 3.0)   # a broadcast: never stored
        doubled = y * 2.0                # 4 KiB
        return x, doubled + threes       # 4 KiB more while doubled is live

    program = trace_program(step, (_sds(8), _sds(1024)))
    assert predict(program, (P(), P()), {}).live == 8192


def test_the_steps_constraints_place_activations_before_the_arguments_do(mesh24):
    def step(x):
        t = jnp.tanh(x)                  # between the argument and the constraint
        h = jax.lax.with_sharding_constraint(t, jax.sharding.NamedSharding(mesh24, P("tp")))
        return x, jnp.sum(h * 2.0)

    program = trace_program(step, (_sds(64, 64),))
    sizes = {"dp": 2, "tp": 4}
    # As XLA holds to the constraint, the argument's split does not decide t's.
    assert predict(program, (P("dp"),), sizes).live == predict(program, (P("tp"),), sizes).live


def test_a_matmuls_output_takes_the_batch_split_of_one_operand_and_the_column_split_of_the_other():
    def step(w, x):
        h = x @ w                    # [8, 32]: dp from x's rows, tp from w's columns
        return w, jnp.sum(h)

    program = trace_program(step, (_sds(16, 32), _sds(8, 16)))
    sizes = {"dp": 2, "tp": 4}
    megatron = predict(program, (P(None, "tp"), P("dp")), sizes)
    # w 2048 B / 4 + x 512 B / 2; h 1024 B / 8 beside the 4-byte sum.
    assert (megatron.arguments, megatron.live) == (512 + 256, 128 + 4)
    replicated = predict(program, (P(), P()), sizes)
    assert (replicated.arguments, replicated.live) == (2560, 1024 + 4)
    # A contracting dim's split does not reach the output.
    rows = predict(program, (P("tp"), P()), sizes)
    assert rows.live == 1024 + 4


def test_a_split_that_does_not_divide_a_dim_pads_its_last_shards_as_xla_does():
    def step(x):
        # Two microbatches of 12 rows, as `accumulate_gradients` slices a batch.
        return x, jnp.tanh(x.reshape(12, 2, 256).swapaxes(0, 1))

    program = trace_program(step, (_sds(24, 256),))
    live = {n: predict(program, (P("x"),), {"x": n}).live for n in (4, 8, 24)}
    # 12 rows over 4 devices are 3 on each; over 8, 2 on each (1.5 rounded up,
    # the last shards padded), not all 12 for want of an even split; over 24,
    # 1 on each (12 devices hold only padding).
    assert live[8] * 3 == live[4] * 2
    assert live[24] * 3 == live[4]


def test_a_constraint_that_takes_the_batchs_axis_leaves_the_values_after_it_less_split(mesh24):
    def step(w, x):
        a = jnp.tanh(x)                          # [64, 32], rows split as x's: dp and tp
        # The columns on dp: the rows, left to XLA, keep only tp.
        a = jax.lax.with_sharding_constraint(
            a, jax.sharding.NamedSharding(mesh24, P(P.UNCONSTRAINED, "dp")))
        h = a @ w                                # [64, 128]: its rows follow a's, tp alone
        return w, jnp.sum(jnp.tanh(h))

    program = trace_program(step, (_sds(32, 128), _sds(64, 32)))
    sizes = {"dp": 2, "tp": 4}
    pinned = predict(program, (P(), P(("dp", "tp"))), sizes)
    free = predict(trace_program(lambda w, x: (w, jnp.sum(jnp.tanh(jnp.tanh(x) @ w))),
                                 (_sds(32, 128), _sds(64, 32))),
                   (P(), P(("dp", "tp"))), sizes)
    # h and tanh(h), 64 x 128 x 4 bytes each: over tp's 4 devices once the
    # constraint holds dp, over all 8 without it.
    assert pinned.live - free.live >= 2 * (64 * 128 * 4 // 4 - 64 * 128 * 4 // 8)


def test_a_sharding_constraint_inside_the_step_splits_what_it_constrains(mesh24):
    def step(x):
        h = jnp.tanh(x) * 3.0
        h = jax.lax.with_sharding_constraint(h, jax.sharding.NamedSharding(mesh24, P("tp")))
        return jnp.exp(h) + 1.0

    free = trace_program(lambda x: jnp.exp(jnp.tanh(x) * 3.0) + 1.0, (_sds(64, 64),))
    pinned = trace_program(step, (_sds(64, 64),))
    sizes = {"dp": 2, "tp": 4}
    assert predict(pinned, (P(),), sizes).live < predict(free, (P(),), sizes).live


def test_knobs_sharding_and_microbatches_each_change_a_workloads_prediction(mesh24):
    w = get_workload("gpt:small")
    args = w.abstract()
    sizes = {"dp": 2, "tp": 4}
    plans = expert_plans(w, mesh24).plans

    def total(setting, plan):
        program = trace_program(w.knobs.step(w.knobs.setting(setting)), args)
        return predict(program, plans[plan].specs(args, mesh24), sizes)

    plain = total({}, "replicated")
    assert total({}, "dp").live < plain.live / 2          # the activations follow the batch
    assert total({}, "fsdp").arguments < plain.arguments / 4
    assert total({"remat": "full"}, "replicated").live < plain.live / 2
    assert total({"microbatches": 2}, "replicated").live < plain.live


def _static_context(mesh, **settings):
    ctx, _ = make_context(get_workload("gpt:tiny"), None, mesh,
                          SearchSettings(objective="static", **settings))
    specs, fp = _evaluate.resolve(baseline_candidates(None, mesh)["default"], ctx)
    return ctx, specs, fp


def test_stage_one_cuts_on_the_scaled_prediction_only_with_enough_compiled_samples(mesh24):
    ctx, specs, fp = _static_context(mesh24)
    none, memory = _evaluate.check(specs, fp, ctx)
    predicted = memory["predicted"]
    assert none is None and predicted > memory["arguments"] > 0
    tight = dataclasses.replace(ctx, budget=int(predicted / 1.5) - 1)
    # Two samples are not enough to scale by; three are: scaled by the least
    # (1.0), it is over the budget by more than the square root of their
    # spread (1.22).
    assert _evaluate.check(specs, fp, tight, ratios=(1.0, 1.0))[0] is None
    cut, memory = _evaluate.check(specs, fp, tight, ratios=(1.0, 1.5, 1.2))
    assert (cut.status, cut.cut_stage) == (CUT, Stage.CHECK)
    assert cut.reason.startswith(PREDICTED) and "over the budget of" in cut.reason
    assert cut.memory["predicted"] == predicted
    # Scaled by 0.8, it is over, but not by the square root of the spread
    # (1.37): left to XLA.
    assert _evaluate.check(specs, fp, tight, ratios=(0.8, 1.5, 1.2))[0] is None
    # "record" predicts but never cuts on it; "off" does not predict.
    record = dataclasses.replace(tight, memory_prediction="record")
    none, memory = _evaluate.check(specs, fp, record, ratios=(1.0, 1.0, 1.0))
    assert none is None and memory["predicted"] == predicted
    off = dataclasses.replace(tight, memory_prediction="off", traced={})
    assert "predicted" not in _evaluate.check(specs, fp, off, ratios=(1.0, 1.0, 1.0))[1]


def _wide_step(state, batch):
    """A step whose memory is its [4096, 1024] hidden activation: where the
    batch is not split, it needs several times the budget below."""
    def loss(w):
        return jnp.mean((jnp.tanh(batch["x"] @ w["a"]) @ w["b"]) ** 2)

    value, grads = jax.value_and_grad(loss)(state)
    return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), {"loss": value}


WIDE_ARGS = ({"a": _sds(64, 1024), "b": _sds(1024, 64)}, {"x": _sds(4096, 64)})


def test_a_search_cuts_before_compiling_what_xla_would_have_cut(mesh24, tmp_path):
    # Replicated, default and dp calibrate (XLA needs 0.53-0.75 of the
    # prediction); past them, candidates that leave the batch whole are
    # predicted at ~34 MB, which scaled (x0.53) is over 12 MB by more than the
    # square root of the ratios' spread (1.19, of 1.41). n_trials=11: the
    # searched trials are the sampler's seeded start-up ones, the same in
    # both runs.
    budget = 12_000_000
    runs = {mode: ss.optimize(_wide_step, WIDE_ARGS, mesh=mesh24, n_trials=11,
                              objective="static", memory_budget=budget,
                              memory_prediction=mode, quiet=True, confirm_rounds=0,
                              storage=f"sqlite:///{tmp_path / mode}.db")
            for mode in ("record", "cut")}
    recorded = {t.outcome.fingerprint: t.outcome for t in runs["record"].trials}
    assert not any(o.reason.startswith(PREDICTED) for o in recorded.values())
    assert all("predicted" in o.memory for o in recorded.values() if "total" in o.memory)
    cut = [t.outcome for t in runs["cut"].trials if t.outcome.reason.startswith(PREDICTED)]
    assert cut and all(o.cut_stage == Stage.CHECK and o.compile_seconds == 0 for o in cut)
    for outcome in cut:
        # The same candidate, compiled in the run that only recorded: XLA's
        # verdict was the prediction's.
        compiled = recorded[outcome.fingerprint]
        assert compiled.compile_seconds > 0 and compiled.memory["total"] > budget
        assert compiled.memory["predicted"] == outcome.memory["predicted"]
    summary = prediction_summary(runs["cut"].trials, budget)
    assert summary["cut_before_compile"] == len({o.fingerprint for o in cut})
    judged = prediction_summary(runs["record"].trials, budget)
    assert judged["cut_before_compile"] == 0 and judged["flagged"] >= len(cut)
    assert judged["false_cuts"] == 0
    assert judged["agree"] + judged["false_cuts"] + judged["missed"] == judged["judged"]


def _record(number, total, predicted, knobs=()):
    outcome = Outcome(f"fp{number}", COMPLETE, memory={"total": total, "predicted": predicted})
    return TrialRecord(number, "search", {}, outcome, {}, {}, 0.0, knobs)


def test_the_prediction_summary_judges_each_candidate_by_the_samples_before_it():
    # margin 1: the verdict is the scaled prediction against the limit itself.
    records = [_record(0, 100, 100), _record(1, 80, 100), _record(2, 90, 100),
               # scale 0.8 from here: 0.8 * 200 > 150 flagged, and XLA agrees
               _record(3, 170, 200),
               # flagged (0.8 * 250 = 200 > 150) but XLA fit it: a false cut
               _record(4, 140, 250),
               # not flagged (0.8 * 150 = 120) but over: missed
               _record(5, 160, 150),
               # another knob setting has no samples yet: not judged
               _record(6, 500, 100, (("remat", "full"),))]
    assert prediction_summary(records, 150, margin=1.0) == {
        "cut_before_compile": 0, "judged": 3, "over": 2, "flagged": 2, "agree": 1,
        "false_cuts": 1, "missed": 1}
    assert prediction_summary(records, None)["judged"] == 0
    # With a margin, only the prediction far over the limit is flagged.
    assert prediction_summary(records, 150, margin=1.3)["flagged"] == 1
    # Stage 1's own margin is the square root of the spread of the ratios
    # seen: 1.118 at #3 and #4 (0.8 to 1.0), so #3 (160 < 167.7) is not
    # flagged and #4 (200) is.
    assert prediction_summary(records, 150) == {
        "cut_before_compile": 0, "judged": 3, "over": 2, "flagged": 1, "agree": 0,
        "false_cuts": 1, "missed": 2}
    # 0.8 x 215 = 172 is over 167.7 (the spread itself, 187.5, let it through).
    records[3] = _record(3, 180, 215)
    assert prediction_summary(records, 150)["agree"] == 1
    assert prediction_summary(records, 150, margin=1.25)["agree"] == 0


def test_candidates_apart_only_in_where_activations_go_calibrate_each_other():
    placed = (("act_batch", "dp"),)
    records = [_record(0, 100, 100, placed),
               _record(1, 80, 100, (*placed, ("act_mlp", "tp"))),
               _record(2, 90, 100, (("act_batch", "dp,tp"), ("act_embed", "tp"))),
               # Its points are none of the above's, its pool theirs: judged
               # (0.8 x 200 = 160 > 150) and XLA agrees.
               _record(3, 170, 200, (("act_batch", "tp"), ("act_heads", "dp"))),
               # The batch left to XLA ("auto" or not named): another pool,
               # with no samples before them, and it borrows none.
               _record(4, 500, 100, (("act_mlp", "tp"),)),
               _record(5, 500, 100, (("act_batch", "auto"),)),
               # Other step knobs, the batch placed: its own pool is empty, so
               # it borrows the four placed ones (0.8 x 100 = 80 < 150): judged,
               # and missed.
               _record(6, 500, 100, (*placed, ("remat", "full")))]
    assert prediction_summary(records, 150, margin=1.0) == {
        "cut_before_compile": 0, "judged": 2, "over": 2, "flagged": 1, "agree": 1,
        "false_cuts": 0, "missed": 1}
    # Stage 1 reads the same pools off the study's trials.
    from shardsearch.search.study import attrs
    from shardsearch.search.study.record import memory_ratios

    trials = [optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, value=1.0,
        user_attrs={attrs.OUTCOME: r.outcome.to_json(), attrs.KNOBS: dict(r.knobs)})
        for r in records]
    assert memory_ratios(trials, (("act_batch", "fsdp"), ("act_seq", "tp"))) == (
        (1.0, 0.8, 0.9, 0.85), False)
    assert memory_ratios(trials, ()) == memory_ratios(trials, (("act_mlp", "dp"),)) == (
        (5.0, 5.0), False)
    # One of its own, so it borrows every placed candidate's, its own among them.
    assert memory_ratios(trials, (("remat", "full"), ("act_batch", "tp"))) == (
        (1.0, 0.8, 0.9, 0.85, 5.0), True)
    # Left to XLA, it borrows nothing, however many placed ones there are.
    assert memory_ratios(trials, (("remat", "none"),)) == ((), False)


def test_a_placed_candidate_of_a_thin_pool_is_cut_on_borrowed_ratios(mesh24):
    from shardsearch.search.evaluation.evaluate import pool_ratios

    placed, loose = (("act_batch", True),), (("act_batch", False),)
    full = (("act_batch", True), ("remat", "full"))
    by_pool = {placed: [1.0, 1.2], full: [1.1], loose: [0.5, 0.6, 0.7]}
    # Own pool first once it holds three; before, the placed pools' together.
    assert pool_ratios(by_pool, (("act_batch", "dp"),)) == ((1.0, 1.2, 1.1), True)
    assert pool_ratios({**by_pool, placed: [1.0, 1.2, 1.3]}, (("act_batch", "dp"),)) == (
        (1.0, 1.2, 1.3), False)
    # Fewer than three placed in all: nothing to borrow.
    assert pool_ratios({placed: [1.0], loose: [0.5, 0.6, 0.7]}, (("act_batch", "dp"),)) == (
        (1.0,), False)
    # The batch left to XLA: its own pool only, never the placed ones.
    assert pool_ratios({placed: [1.0, 1.2, 1.3]}, ()) == ((), False)
    # The cut says where its ratios came from.
    ctx, specs, fp = _static_context(mesh24)
    tight = dataclasses.replace(ctx, budget=_evaluate.check(specs, fp, ctx)[1]["predicted"] // 2)
    cut, _ = _evaluate.check(specs, fp, tight, ratios=(1.0, 1.0, 1.0), borrowed=True)
    assert cut is not None and "whose activations' batch is placed" in cut.reason
    cut, _ = _evaluate.check(specs, fp, tight, ratios=(1.0, 1.0, 1.0))
    assert cut is not None and "with its step knobs and batch placement" in cut.reason


def test_stage_1_cuts_by_the_square_root_of_the_spread():
    from shardsearch.search.evaluation.evaluate import over_by_prediction, stage_margin

    assert stage_margin((0.5, 1.0, 2.0)) == pytest.approx(2.0)
    assert stage_margin((1.1, 1.1, 1.1)) == pytest.approx(1.0)
    # Scaled by the least ratio, 0.5: 100 is not over 50 x 2, 125 is.
    assert not over_by_prediction(200, (0.5, 1.0, 2.0), 50)
    assert over_by_prediction(250, (0.5, 1.0, 2.0), 50)
    assert not over_by_prediction(250, (0.5, 1.0, 2.0), 50, margin=4.0)


def test_an_unknown_memory_prediction_is_refused():
    with pytest.raises(ValueError, match="memory_prediction='maybe'; choose one of"):
        SearchSettings(memory_prediction="maybe")


def test_a_step_it_cannot_predict_is_said_once_and_left_to_the_compiler(mesh24, monkeypatch):
    ctx, specs, fp = _static_context(mesh24)

    def untraceable(step, args):
        raise TypeError("a primitive the walk cannot follow")

    monkeypatch.setattr(_evaluate._footprint, "trace_program", untraceable)
    with pytest.warns(ShardsearchWarning, match="cannot be predicted before compiling"):
        cut, memory = _evaluate.check(specs, fp, ctx, ratios=(9.0, 9.0, 9.0))
    assert cut is None and "predicted" not in memory
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not said again for the same knobs
        assert "predicted" not in _evaluate.check(specs, fp, ctx)[1]
