"""Issue 16: custom workload shapes, the published plans, and MFU → step time."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh

import shardsearch as ss
from shardsearch.base.analyzer import ShardingAnalyzer
from shardsearch.bench import load_suite
from shardsearch.bench.published import (
    Published,
    attention_flops,
    published_step_seconds,
    step_flops,
)
from shardsearch.cli import args as _args
from shardsearch.cli import main as _cli
from shardsearch.workloads import expert_plan, get_workload
from shardsearch.workloads._params import count

REPO = Path(__file__).resolve().parents[1]

# A small Llama whose head_dim (24) is not d_model / heads (64 / 4 = 16) and
# whose KV heads (2) are fewer than its query heads (4).
SMALL = {"layers": 3, "d_model": 64, "heads": 4, "kv_heads": 2, "head_dim": 24, "d_ff": 96,
         "vocab": 128, "seq": 16, "batch": 8}


def test_a_custom_shape_has_the_closed_form_parameter_count():
    w = get_workload("llama:custom", **SMALL)
    d, h, kv, dh, f, v, n = 64, 4, 2, 24, 96, 128, 3
    # Embedding and head, then per layer wq, wk+wv, wo, the SwiGLU's three
    # matrices and two RMSNorm scales, then the final norm.
    closed_form = 2 * v * d + n * (d * h * dh + 2 * d * kv * dh + h * dh * d
                                   + 3 * d * f + 2 * d) + d
    assert w.n_params == closed_form == 127_424
    state, batch = w.abstract()
    assert count(state["params"]) == closed_form
    wq = state["params"]["layers"]["attn"]["wq"]
    assert wq.shape == (n, d, h * dh)  # stacked under scan, queries 96 wide
    assert state["params"]["layers"]["attn"]["wk"].shape == (n, d, kv * dh)
    assert batch["tokens"].shape == (8, 16)


def test_a_custom_name_spells_the_shape_and_rebuilds_the_same_workload():
    w = get_workload("llama:custom", **SMALL, compute_dtype="bfloat16")
    assert w.name == ('llama:custom:{"layers":3,"d_model":64,"heads":4,"kv_heads":2,'
                      '"head_dim":24,"d_ff":96,"vocab":128,"seq":16,"batch":8,'
                      '"compute_dtype":"bfloat16"}')
    again = get_workload(w.name)
    assert (again.n_params, again.flops_per_step) == (w.n_params, w.flops_per_step)
    assert w.stacked
    state, batch = w.init(0)  # a custom shape runs: the measured objective needs it
    assert jax.tree.map(lambda x: (x.shape, x.dtype), (state, batch)) == jax.tree.map(
        lambda x: (x.shape, x.dtype), w.abstract())


def test_a_shape_whose_arrays_outgrow_the_host_is_refused_before_anything_is_made(monkeypatch):
    from shardsearch.workloads import _workload

    w = get_workload("llama:custom", **SMALL)
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(w.abstract()))
    made = []
    monkeypatch.setattr(_workload.np.random, "default_rng",
                        lambda *a: made.append(a) or pytest.fail("drew arrays"))
    monkeypatch.setattr(_workload, "meminfo_bytes",
                        lambda key: {"MemAvailable": 2 * state_bytes - 1}[key])
    with pytest.raises(ValueError, match=r"init\(\) would hold .* on this host .* is available; "
                       r"plan for it without running it \(objective 'static'"):
        w.init(0)
    assert made == []
    monkeypatch.setattr(_workload, "meminfo_bytes", lambda key: None)  # not Linux: no check
    with pytest.raises(pytest.fail.Exception, match="drew arrays"):
        w.init(0)


def test_bf16_compute_keeps_float32_weights_and_computes_in_bf16():
    w = get_workload("llama:custom", **SMALL, compute_dtype="bfloat16")
    state, batch = w.abstract()
    assert {x.dtype for x in jax.tree_util.tree_leaves(state["params"])} == {jnp.dtype("float32")}
    jaxpr = str(jax.make_jaxpr(w.step)(state, batch))
    assert "bf16" in jaxpr and "preferred_element_type=bfloat16" in jaxpr
    out_state, metrics = jax.eval_shape(w.step, state, batch)
    assert out_state["params"]["head"].dtype == jnp.float32
    assert metrics["loss"].dtype == jnp.float32


def test_the_default_compute_dtype_traces_the_presets_program_unchanged():
    # compute_dtype float32 adds no operation: the preset and its custom twin
    # (same shape, stacked with remat) trace to the same jaxpr.
    w = get_workload("llama:7b")
    spec = {"layers": 32, "d_model": 4096, "heads": 32, "d_ff": 11008, "vocab": 32000,
            "seq": 2048, "batch": 64}
    twin = get_workload("llama:custom", **spec)
    args = w.abstract()
    assert str(jax.make_jaxpr(w.step)(*args)) == str(jax.make_jaxpr(twin.step)(*args))
    assert (twin.n_params, twin.flops_per_step) == (w.n_params, w.flops_per_step)
    gpt = get_workload("gpt:1.5b")
    gpt_twin = get_workload("gpt:custom", layers=48, d_model=1600, heads=25, d_ff=6400,
                            vocab=50257, seq=1024, batch=64)
    args = gpt.abstract()
    assert str(jax.make_jaxpr(gpt.step)(*args)) == str(jax.make_jaxpr(gpt_twin.step)(*args))


def test_megatron_7b_as_gpt_custom_has_7_1b_parameters():
    w = get_workload("gpt:custom", layers=30, d_model=4096, heads=32, d_ff=16384,
                     vocab=131072, seq=4096, batch=192, compute_dtype="bfloat16")
    assert round(w.n_params / 1e9, 1) == 7.1


def test_a_published_plan_for_256_devices_validates_on_an_abstract_mesh():
    # MaxText's FSDP 256 on v5e: d_model on fsdp, nothing on the size-1 tp axis.
    w = get_workload("llama:custom", layers=2, d_model=512, heads=8, head_dim=128,
                     d_ff=1024, vocab=1024, seq=64, batch=512, compute_dtype="bfloat16")
    mesh = AbstractMesh((256, 1), ("fsdp", "tp"))
    plan = expert_plan(w, mesh, "fsdp_tp")
    args = w.abstract()
    state_specs, batch_specs = plan.specs(args, mesh)
    analyzer = ShardingAnalyzer(mesh)
    assert analyzer.validate_partition_specs(args[0], state_specs) == []
    assert analyzer.validate_partition_specs(args[1], batch_specs) == []
    wq = state_specs["params"]["layers"]["attn"]["wq"]
    assert wq == jax.sharding.PartitionSpec(None, "fsdp", "tp")
    assert batch_specs["tokens"] == jax.sharding.PartitionSpec("fsdp")


def test_activation_sharding_pins_the_batch_dim_and_is_checked():
    pinned = {**SMALL, "activation_sharding": {"mesh": {"fsdp": 8}, "batch": ["fsdp"]}}
    w = get_workload("llama:custom", **pinned)
    assert '"activation_sharding":{"mesh":{"fsdp":8},"batch":["fsdp"]}' in w.name
    assert "sharding_constraint" in str(jax.make_jaxpr(w.step)(*w.abstract()))
    assert get_workload(w.name).name == w.name
    for bad, message in [({"mesh": {"fsdp": 8}, "batch": ["dp"]}, "must name distinct axes"),
                         ({"mesh": {"fsdp": 0}, "batch": ["fsdp"]}, "sizes >= 1"),
                         ({"mesh": {"fsdp": 8}}, "must be {")]:
        with pytest.raises(ValueError, match=message):
            get_workload("llama:custom", **{**SMALL, "activation_sharding": bad})


def test_megatron_plan_on_96_devices_validates_on_an_abstract_mesh():
    w = get_workload("gpt:custom", layers=2, d_model=256, heads=4, d_ff=1024, vocab=512,
                     seq=32, batch=96, compute_dtype="bfloat16")
    mesh = AbstractMesh((48, 2), ("dp", "tp"))
    plan = expert_plan(w, mesh, "megatron")
    state_specs, _ = plan.specs(w.abstract(), mesh)
    assert ShardingAnalyzer(mesh).validate_partition_specs(w.abstract()[0], state_specs) == []
    assert state_specs["params"]["layers"]["mlp"]["w_up"] == jax.sharding.PartitionSpec(
        None, None, "tp")


def test_mfu_to_step_time_by_hand():
    # v5e-256, 16B: 61.1% of 197 TFLOP/s = 120.367 TFLOP/s per chip. A step of
    # 3.0e17 FLOPs over 256 chips: 3.0e17 / (256 * 1.20367e14) = 9.7358 s.
    by_mfu = Published(chips=256, mfu=0.611, peak_tflops=197, plan="fsdp_tp", source="t")
    assert by_mfu.throughput == pytest.approx(1.20367e14)
    assert published_step_seconds(3.0e17, by_mfu) == pytest.approx(9.7358, abs=1e-4)
    # The published TFLOP/s wins over the MFU when both are given: 120 TFLOP/s
    # gives 3.0e17 / (256 * 1.2e14) = 9.765625 s.
    both = Published(chips=256, tflops_per_chip=120, mfu=0.611, peak_tflops=197,
                     plan="fsdp_tp", source="t")
    assert published_step_seconds(3.0e17, both) == pytest.approx(9.765625)


def test_the_flop_counts_differ_by_half_the_attention():
    w = get_workload("llama:custom", **SMALL)
    # 12 * layers * batch * seq^2 * heads * head_dim = 12 * 3 * 8 * 256 * 96.
    assert attention_flops(w.dims) == 12 * 3 * 8 * 16 * 16 * 4 * 24 == 7_077_888
    assert step_flops(w, "6n+attention") == w.flops_per_step
    assert step_flops(w, "6n+causal-attention") == w.flops_per_step - 3_538_944
    # And 6 x matmul weights x tokens is the rest: tokens 128; weights per
    # layer 64*96 + 2*64*48 + 96*64 + 3*64*96 = 36864, 3 layers, head 64*128.
    assert w.flops_per_step - 7_077_888 == 6 * 128 * (3 * 36_864 + 64 * 128)


@pytest.mark.parametrize("sizes, message", [
    ({**SMALL, "depth": 3}, "unknown key 'depth'.*the keys are layers, d_model"),
    ({k: v for k, v in SMALL.items() if k != "vocab"}, "misses vocab"),
    ({**SMALL, "layers": 0}, r"sizes must be positive ints, got layers=0"),
    ({**SMALL, "d_ff": -96}, r"d_ff=-96"),
    ({**SMALL, "seq": 1.5}, r"seq=1.5"),
    ({**SMALL, "kv_heads": 3}, "heads=4 is not divisible by kv_heads=3"),
    ({**{k: v for k, v in SMALL.items() if k != "head_dim"}, "d_model": 66},
     "d_model=66 is not divisible by heads=4.*or give head_dim"),
    ({**SMALL, "head_dim": 25}, "head_dim=25 must be even"),
    ({**SMALL, "compute_dtype": "fp8"}, "compute_dtype='fp8'; choose one of"),
])
def test_bad_sizes_name_the_key_and_the_fix(sizes, message):
    with pytest.raises(ValueError, match=message):
        get_workload("llama:custom", **sizes)


def test_custom_names_and_specs_that_cannot_be_read(tmp_path):
    with pytest.raises(ValueError, match="needs its sizes"):
        get_workload("llama:custom")
    with pytest.raises(ValueError, match="takes no sizes"):
        get_workload("llama:tiny", layers=2)
    with pytest.raises(ValueError, match="only 'llama:custom' and 'gpt:custom'"):
        get_workload("moe:custom", **SMALL)
    with pytest.raises(ValueError, match="not a JSON object"):
        get_workload('llama:custom:{"layers": 2,')
    with pytest.raises(ValueError, match="unknown key 'kv_heads' in the gpt:custom spec"):
        get_workload("gpt:custom", **SMALL)
    bad = tmp_path / "bad.json"
    bad.write_text("{\"layers\": 2,")
    with pytest.raises(ValueError, match=r"bad\.json.*JSON"):
        get_workload(f"llama:custom:{bad}")


def test_the_cli_reads_a_spec_file_and_refuses_a_bad_one_in_one_line(tmp_path, capsys):
    good = tmp_path / "shape.json"
    good.write_text(json.dumps(SMALL))
    # `--workload` of every command goes through this one door.
    assert _args.workload(f"llama:custom:{good}").name.startswith('llama:custom:{"layers":3,')
    plan = REPO / "rules" / "cpu-sim8" / "gpt-small-dp2-tp4.json"
    capsys.readouterr()
    for text, message in [(json.dumps({**SMALL, "depth": 1}), "unknown key 'depth'"),
                          ("[1, 2]", "expected a JSON object of sizes"),
                          ("{\"layers\": ", "spec"),
                          (json.dumps({**SMALL, "layers": -1}), "layers=-1")]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        assert _cli.main(["show", str(plan), "--workload", f"llama:custom:{bad}"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err
    assert _cli.main(["show", str(plan), "--workload",
                      f"llama:custom:{tmp_path / 'missing.json'}"]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_the_published_suite_loads_with_its_rows_and_chips():
    suite = load_suite("published")
    assert len(suite.entries) >= 4 and suite.devices == 384
    chips = {e.id: (e.hardware, e.published.chips, e.devices) for e in suite.entries}
    assert chips["maxtext-16b-v5e256-fsdp"] == ("tpu-v5e", 256, 256)
    assert chips["maxtext-32b-v5p64-fsdp-tp4"] == ("tpu-v5p", 64, 64)
    assert chips["maxtext-22b-v4-64-fsdp"] == ("tpu-v4", 64, 64)
    assert chips["megatron-7.1b-h100-96-tp2"] == ("gpu-h100", 96, 96)
    for entry in suite.entries:
        assert entry.devices == entry.published.chips
        w = get_workload(entry.workload_name)
        assert w.name == entry.workload_name
    sixteen = get_workload(suite.entries[0].workload_name)
    assert round(sixteen.n_params / 1e9, 1) == 15.8  # MaxText's "16B"


def test_published_fields_are_checked():
    with pytest.raises(ValueError, match="give tflops_per_chip, or mfu with peak_tflops"):
        Published(chips=8, plan="fsdp", source="s", mfu=0.5)
    with pytest.raises(ValueError, match="is a fraction"):
        Published(chips=8, plan="fsdp", source="s", mfu=61.1, peak_tflops=197)
    with pytest.raises(ValueError, match="unknown field 'tflops'"):
        Published.from_json({"chips": 8, "plan": "fsdp", "source": "s", "tflops": 1})
    with pytest.raises(ValueError, match="flop_count='6n'"):
        Published(chips=8, plan="fsdp", source="s", tflops_per_chip=1, flop_count="6n")



def test_the_published_budget_is_the_chip_or_the_published_plans_footprint():
    from shardsearch import HARDWARE
    from shardsearch.bench import Entry, resolve_budget

    published = {"chips": 8, "tflops_per_chip": 100, "plan": "fsdp_tp", "source": "t"}
    entry = Entry("e", "llama", "custom", "fsdp=8,tp=1", budget="published", spec=SMALL,
                  published=published, objective="static")
    chip = HARDWARE["tpu-v5e"]
    over = {"memory_per_device": {"total": 20 * 2**30}}
    under = {"memory_per_device": {"total": 2**30}}
    # The plan ran on the chip: CPU figures above its memory stand in for it.
    assert resolve_budget(entry, None, None, published=over, hardware=chip)["bytes"] == (
        20 * 2**30)
    assert resolve_budget(entry, None, None, published=under, hardware=chip)["bytes"] == (
        16 * 2**30)
    with pytest.raises(ValueError, match="budget 'published' needs a 'published' run"):
        Entry("e", "llama", "custom", "fsdp=8,tp=1", budget="published", spec=SMALL)
    with pytest.raises(ValueError, match=r"give a spec .* exactly when the size is 'custom'"):
        Entry("e", "llama", "custom", "fsdp=8,tp=1")
    with pytest.raises(ValueError, match="unknown key 'depth'"):
        Entry("e", "llama", "custom", "fsdp=8,tp=1", spec={**SMALL, "depth": 2})


def test_a_custom_study_exports_without_naming_its_workload():
    from shardsearch.workloads._custom import is_custom_name

    w = get_workload("llama:custom", **SMALL)
    assert is_custom_name(w.name)
    assert not is_custom_name("llama:custom:shape.json") and not is_custom_name("llama:7b")


def test_the_published_plan_is_estimated_without_a_budget_and_compared():
    from shardsearch import HARDWARE
    from shardsearch.bench import estimate_published

    mesh = ss.create_mesh((4, 2), ("fsdp", "tp"))
    w = get_workload("llama:custom", **SMALL, compute_dtype="bfloat16",
                     activation_sharding={"mesh": {"fsdp": 4, "tp": 2}, "batch": ["fsdp"]})
    run = Published(chips=8, tflops_per_chip=100, plan="fsdp_tp", source="t")
    out = estimate_published(w, mesh, run, HARDWARE["tpu-v5p"])
    assert out["status"] == "complete" and out["plan"] == "fsdp_tp"
    assert out["published_seconds"] == pytest.approx(w.flops_per_step / (8 * 100e12))
    assert out["ratio"] == pytest.approx(out["estimate"] / out["published_seconds"])
    assert out["estimate"] == pytest.approx(out["breakdown"]["total"])
    assert out["fits_chip"] is True and out["memory_per_device"]["total"] > 0


def test_the_published_winner_is_read_under_its_knobs():
    """The winner's estimate is its own candidate's, specs and knob setting: the
    same specs under the default knobs are another candidate (issue 24: a
    `megatron~remat=full` winner was reported with `megatron`'s estimate)."""
    from types import SimpleNamespace

    from shardsearch.bench.published import compare
    from shardsearch.search.evaluation.outcome import fingerprint

    specs = ({"w": jax.sharding.PartitionSpec("tp")},)
    setting = (("remat", "full"),)

    def outcome(estimate):
        return SimpleNamespace(estimate=estimate, breakdown={"total": estimate},
                               memory={"total": 2**30})

    known = {fingerprint(specs): outcome(1.25), fingerprint(specs, setting): outcome(1.13)}
    entry = SimpleNamespace(published=Published(chips=8, tflops_per_chip=100,
                                                plan="megatron_do", source="t"))
    start = SimpleNamespace(label="plan:megatron_do", number=3, outcome=SimpleNamespace(
        status="complete", cut_stage=None, reason="", estimate=1.25, memory={}))
    result = SimpleNamespace(trials=[start], best_specs=specs, best_label="megatron~remat=full",
                             best_knobs={"remat": "full", "microbatches": 1})
    out = compare(entry, {"estimate": 1.25}, result, known, setting)
    assert out["winner"]["estimate"] == 1.13 and out["winner"]["knobs"] == {"remat": "full"}
    assert out["winner"]["speedup"] == pytest.approx(1.25 / 1.13)
    # The published plan met in the search from its plan file counts as met.
    assert out["in_search"]["trial"] == 3
    assert compare(entry, {"estimate": 1.25}, result, known)["winner"]["estimate"] == 1.25


def test_a_published_plan_that_is_no_expert_baseline_starts_the_search(tmp_path):
    """`megatron_do` is built only by name; the bench search starts from it (a
    plan file in the results folder) so the winner has met the plan it is
    compared with, and the report counts it as an expert's."""
    spec = {**SMALL, "compute_dtype": "bfloat16"}
    entry = {"id": "do", "workload": "llama", "size": "custom", "spec": spec,
             "mesh": "dp=4,tp=2", "trials": 8, "objective": "static", "budget": "published",
             "hardware": "tpu-v5p",
             "published": {"chips": 8, "tflops_per_chip": 100, "plan": "megatron_do",
                           "source": "t"}}
    path = tmp_path / "pub.json"
    path.write_text(json.dumps({"schema": 1, "suite": "pub", "platform": "cpu", "devices": 8,
                                "simulated": True, "entries": [entry]}))
    argv = ["bench", "--suite", str(path), "--out", str(tmp_path / "out"), "--rules",
            str(tmp_path / "rules"), "--quiet"]
    assert _cli.main(argv) == 0
    folder = tmp_path / "out" / "pub"
    assert (folder / "published-plans" / "do" / "megatron_do.json").is_file()
    record = json.loads((folder / "entries" / "do.json").read_text())
    met = record["published"]["in_search"]
    assert met is not None and met["status"] == "complete"
    row = next(p for p in record["plans"] if p["label"] == "plan:megatron_do")
    assert row["role"] == "expert" and row["fits"]
    winner = next(p for p in record["plans"] if p["role"] == "winner")
    assert record["published"]["winner"]["fingerprint"] == winner["fingerprint"]
    assert record["published"]["winner"]["estimate"] == pytest.approx(winner["median_seconds"])
    text = (folder / "results.md").read_text()
    assert "compiled here for simulated CPU devices" in text  # not a target suite
    faster = int(record["published"]["winner"]["speedup"] >= 1.10)
    assert f"{faster} of 1 rows: a winner that fits, rated at least 1.10x faster" in text


def test_a_breakdown_priced_per_kernel_reads_as_such_in_the_published_tables():
    from shardsearch.bench.published_report import _bound, _parts

    whole = {"compute": 7.95, "memory": 5.31, "communication": 3.5, "hidden": 3.5}
    assert _parts(whole) == "compute 7.95 / memory 5.31 / comm 3.5 (hidden 3.5)"
    assert _bound(whole) == "compute"
    per_kernel = {**whole, "kernels": 11.5}
    assert _parts(per_kernel) == ("kernels 11.5 (compute 7.95 / memory 5.31) / comm 3.5 "
                                  "(hidden 3.5)")
    assert _bound(per_kernel) == "per kernel"
