"""Tests for shardsearch.workloads: models, presets, factories and expert plans."""

import dataclasses
import functools
import itertools
import math
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from child_env import child_env
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch import workloads as wl
from shardsearch.workloads import _gpt, _llama, _moe, _registry

TINY = ["mlp:tiny", "gpt:tiny", "llama:tiny", "moe:tiny"]
ABSTRACT_ONLY = ["gpt:1.5b", "llama:7b", "llama:70b"]


def _paths(tree):
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="/"): x for p, x in leaves}


def _is_spec(x):
    return isinstance(x, P)


@functools.cache
def _mesh24():
    return ss.create_mesh((2, 4), ("dp", "tp"))


@functools.cache
def _compiled(name, plan_name):
    """(compiled step, placed args) for a tiny workload under one plan on (2, 4)."""
    mesh = _mesh24()
    workload = wl.get_workload(name)
    plan = wl.expert_plans(workload, mesh).plans[plan_name]
    args = workload.init(0)
    state_specs, batch_specs = plan.specs(args, mesh)
    state_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), state_specs, is_leaf=_is_spec)
    batch_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), batch_specs, is_leaf=_is_spec)
    step = jax.jit(workload.step, in_shardings=(state_sh, batch_sh),
                   out_shardings=(state_sh, NamedSharding(mesh, P())))
    args = jax.device_put(args, (state_sh, batch_sh))
    return step.lower(*args).compile(), args


# --- registry -------------------------------------------------------------------------


def test_list_workloads_names_every_preset():
    names = wl.list_workloads()
    assert names[:2] == ["mlp:tiny", "mlp:small"]
    for name in [*TINY, "gpt:small", "llama:small", "moe:small", *ABSTRACT_ONLY]:
        assert name in names
    assert [wl.get_workload(n).name for n in names] == names


def test_size_defaults_to_small():
    assert wl.get_workload("gpt").name == "gpt:small"


def test_gpt_small_matches_the_spec_scale():
    w = wl.get_workload("gpt:small")
    assert 5.2e6 < w.n_params < 5.4e6
    assert dict(w.dims) | {"batch": 16, "seq": 128, "vocab": 4096, "d_model": 256} == dict(w.dims)


# --- structure ------------------------------------------------------------------------


def test_gpt_paths_and_shapes():
    state, batch = wl.get_workload("gpt:tiny").abstract()
    paths = _paths(state)
    d, f, v, s = 64, 256, 256, 32
    expected = {
        "params/embed/tokens": (v, d), "params/embed/positions": (s, d),
        "params/layers/1/attn/wq": (d, d), "params/layers/1/attn/wo": (d, d),
        "params/layers/1/mlp/w_up": (d, f), "params/layers/1/mlp/w_down": (f, d),
        "params/layers/1/ln1/scale": (d,), "params/ln_f/bias": (d,), "params/head": (d, v),
        "opt/mu/layers/0/attn/wk": (d, d), "opt/nu/head": (d, v), "opt/count": (),
    }
    for path, shape in expected.items():
        assert paths[path].shape == shape, path
    assert paths["opt/count"].dtype == jnp.int32
    assert {k: (x.shape, x.dtype) for k, x in _paths(batch).items()} == {
        "tokens": ((8, s), jnp.int32), "targets": ((8, s), jnp.int32)}


def test_llama_grouped_kv_heads_and_stacked_layout():
    paths = _paths(wl.get_workload("llama:tiny").abstract()[0])
    # d_model 64, 4 heads and 2 KV heads of 16.
    assert paths["params/layers/1/attn/wq"].shape == (64, 64)
    assert paths["params/layers/1/attn/wk"].shape == (64, 32)
    assert paths["params/layers/0/mlp/w_gate"].shape == (64, 192)
    assert "params/embed/positions" not in paths
    w = wl.get_workload("llama:70b")
    assert w.stacked
    paths = _paths(w.abstract()[0])
    assert paths["params/layers/attn/wq"].shape == (80, 8192, 8192)
    assert paths["params/layers/attn/wk"].shape == (80, 8192, 1024)
    assert paths["opt/mu/layers/mlp/w_down"].shape == (80, 28672, 8192)


def test_moe_expert_weights_lead_with_the_expert_dim():
    paths = _paths(wl.get_workload("moe:tiny").abstract()[0])
    assert paths["params/layers/0/moe/w_up"].shape == (4, 64, 64)
    assert paths["params/layers/0/moe/w_down"].shape == (4, 64, 64)
    assert paths["params/layers/1/moe/router"].shape == (64, 4)


def test_mlp_batch_and_params():
    state, batch = wl.get_workload("mlp:tiny").abstract()
    assert {k: x.shape for k, x in _paths(batch).items()} == {"x": (16, 64), "y": (16,)}
    assert list(state["params"]) == ["b1", "b2", "b3", "w1", "w2", "w3"]


@pytest.mark.parametrize("name", TINY)
def test_init_matches_abstract_and_is_deterministic(name):
    w = wl.get_workload(name)
    concrete = w.init(0)
    abstract = w.abstract()
    assert jax.tree.structure(concrete) == jax.tree.structure(abstract)
    for x, a in zip(jax.tree.leaves(concrete), jax.tree.leaves(abstract), strict=True):
        assert (x.shape, x.dtype) == (a.shape, a.dtype)
    again = w.init(0)
    other = w.init(1)
    leaves, leaves_again = jax.tree.leaves(concrete), jax.tree.leaves(again)
    assert all(np.array_equal(a, b) for a, b in zip(leaves, leaves_again, strict=True))
    assert not np.array_equal(concrete[0]["params"]["head" if name != "mlp:tiny" else "w1"],
                              other[0]["params"]["head" if name != "mlp:tiny" else "w1"])


# --- presets: counts and flops --------------------------------------------------------


@pytest.mark.parametrize("name", _registry.list_workloads())
def test_n_params_matches_the_abstract_tree(name):
    w = wl.get_workload(name)
    params = w.abstract()[0]["params"]
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == w.n_params
    tokens = w.dims["batch"] * w.dims.get("seq", 1)
    # Within a small factor of the 6 * N * tokens rule (attention adds, embeddings
    # and routing subtract).
    assert 0.4 < w.flops_per_step / (6 * w.n_params * tokens) < 2.0


def test_real_size_parameter_counts():
    assert 6.7e9 <= wl.get_workload("llama:7b").n_params <= 6.8e9
    assert abs(wl.get_workload("llama:70b").n_params - 69e9) <= 1.5e9
    assert 1.5e9 <= wl.get_workload("gpt:1.5b").n_params <= 1.7e9


@pytest.mark.parametrize("name", ABSTRACT_ONLY)
def test_real_size_presets_are_abstract_only_and_stacked(name):
    w = wl.get_workload(name)
    assert w.stacked
    with pytest.raises(ValueError, match="abstract-only"):
        w.init(0)


# --- running --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY)
def test_every_plan_matches_the_replicated_loss(name):
    plans = wl.expert_plans(wl.get_workload(name), _mesh24()).plans
    expected = ["replicated", "dp", "fsdp", "megatron", "fsdp_tp"]
    assert list(plans) == expected + (["ep"] if name.startswith("moe") else [])
    losses = {}
    for plan_name in plans:
        step, args = _compiled(name, plan_name)
        state, metrics = step(*args)
        assert metrics["loss"].dtype == jnp.float32 and metrics["loss"].shape == ()
        losses[plan_name] = float(metrics["loss"])
        assert int(state["opt"]["count"]) == 1
    ref = losses["replicated"]
    assert np.isfinite(ref)
    for plan_name, loss in losses.items():
        assert loss == pytest.approx(ref, rel=1e-5), plan_name


@pytest.mark.parametrize("name", TINY)
def test_loss_falls_over_five_steps(name):
    step, (state, batch) = _compiled(name, "replicated")
    losses = []
    for _ in range(5):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert all(b < a for a, b in itertools.pairwise(losses)), losses


@pytest.mark.slow
@pytest.mark.parametrize("module, name",
                         [(_gpt, "gpt:tiny"), (_llama, "llama:tiny"), (_moe, "moe:tiny")])
def test_stacked_remat_layout_computes_the_same_loss(module, name):
    # The real-size presets run stacked under remat; check that path on the
    # tiny numbers against the unrolled preset.
    cfg = _registry._PRESETS[name.split(":")[0]][1]["tiny"]
    assert not cfg.stacked
    stacked = module.build(name, dataclasses.replace(cfg, stacked=True, remat=True))
    assert stacked.stacked
    s_state, batch = stacked.init(0)
    step, (u_state, _) = _compiled(name, "replicated")
    np.testing.assert_array_equal(s_state["params"]["layers"]["attn"]["wq"][1],
                                  u_state["params"]["layers"][1]["attn"]["wq"])
    s_loss = jax.jit(stacked.step)(s_state, batch)[1]["loss"]
    assert float(s_loss) == pytest.approx(float(step(u_state, batch)[1]["loss"]), rel=1e-5)


def test_moe_reports_its_balance_loss():
    step, args = _compiled("moe:tiny", "replicated")
    metrics = step(*args)[1]
    assert float(metrics["loss"]) == pytest.approx(
        float(metrics["cross_entropy"] + metrics["aux_loss"]), rel=1e-6)
    assert float(metrics["aux_loss"]) > 0


# --- expert plans ---------------------------------------------------------------------


def test_llama_70b_plans_and_memory_without_allocating():
    mesh = jax.sharding.AbstractMesh((8, 8), ("dp", "tp"))
    w = wl.get_workload("llama:70b")
    start = time.perf_counter()
    args = w.abstract()
    result = wl.expert_plans(w, mesh)
    analyzer = ss.ShardingAnalyzer(mesh)
    memory = {}
    for name, plan in result.plans.items():
        state_specs, batch_specs = plan.specs(args, mesh)
        assert analyzer.validate_partition_specs(args, (state_specs, batch_specs)) == []
        memory[name] = analyzer.estimate_memory_usage(args[0], state_specs)["size_per_device"]
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0
    assert list(result.plans) == ["replicated", "dp", "fsdp", "megatron", "fsdp_tp"]
    assert result.plans["dp"].batch_spec == P(("dp", "tp"))
    assert result.plans["fsdp"].state_rule == ss.AutoShardingRule(mesh, axis_names=(("dp", "tp"),))
    total = 3 * 4 * w.n_params  # params and two Adam moments in float32
    assert memory["replicated"] == memory["dp"] == pytest.approx(total, rel=1e-6)
    assert memory["megatron"] < total / 7
    assert memory["fsdp"] < total / 60 and memory["fsdp_tp"] < total / 60


def test_stacked_megatron_specs_for_llama_7b():
    mesh = ss.abstract_mesh((8, 8), ("dp", "tp"))
    w = wl.get_workload("llama:7b")
    plan = wl.expert_plans(w, mesh).plans["megatron"]
    state_specs, batch_specs = plan.specs(w.abstract())
    specs = _paths(state_specs)
    assert specs["params/layers/attn/wq"] == P(None, None, "tp")
    assert specs["opt/mu/layers/attn/wq"] == P(None, None, "tp")
    assert specs["opt/nu/layers/attn/wo"] == P(None, "tp")
    assert specs["params/layers/mlp/w_down"] == P(None, "tp")
    assert specs["params/embed/tokens"] == P("tp")
    assert specs["params/head"] == P(None, "tp")
    assert specs["params/layers/ln1/scale"] == P()
    assert _paths(batch_specs) == {"tokens": P("dp"), "targets": P("dp")}


def test_fsdp_tp_and_ep_specs_for_moe():
    mesh = ss.abstract_mesh((2, 4), ("dp", "tp"))
    result = wl.expert_plans(wl.get_workload("moe:tiny"), mesh)
    fsdp_tp = _paths(result.plans["fsdp_tp"].specs(wl.get_workload("moe:tiny").abstract())[0])
    ep = _paths(result.plans["ep"].specs(wl.get_workload("moe:tiny").abstract())[0])
    assert fsdp_tp["params/layers/0/attn/wq"] == P("dp", "tp")
    assert fsdp_tp["params/layers/0/moe/w_up"] == P(None, "dp", "tp")
    assert ep["params/layers/0/moe/w_up"] == P("dp", None, "tp")
    assert ep["opt/mu/layers/1/moe/w_down"] == P("dp", "tp")
    assert ep["params/embed/tokens"] == P("tp", "dp")
    # 2 KV heads cannot split over tp=4: K and V stay replicated along tp.
    assert fsdp_tp["params/layers/0/attn/wk"] == P("dp")


def test_data_only_mesh_skips_tensor_plans_with_reasons():
    mesh = ss.abstract_mesh((8,), ("dp",))
    gpt = wl.expert_plans(wl.get_workload("gpt:tiny"), mesh)
    assert list(gpt.plans) == ["replicated", "dp", "fsdp"]
    assert "megatron needs a tensor axis" in gpt.skipped["megatron"]
    assert "('dp',)" in gpt.skipped["megatron"]
    assert "fsdp_tp needs a tensor axis" in gpt.skipped["fsdp_tp"]
    assert "mixture-of-experts" in gpt.skipped["ep"]
    assert gpt.plans["dp"].batch_spec == P("dp")
    moe = wl.expert_plans(wl.get_workload("moe:small"), mesh)
    assert list(moe.plans) == ["replicated", "dp", "fsdp", "ep"]
    ep = _paths(moe.plans["ep"].specs(wl.get_workload("moe:small").abstract())[0])
    assert ep["params/layers/0/moe/w_gate"] == P("dp")
    tiny = wl.expert_plans(wl.get_workload("moe:tiny"), mesh)
    assert tiny.skipped["ep"] == "n_experts=4 not divisible by expert axis 'dp' of size 8"


def test_indivisible_heads_skip_tensor_plans():
    mesh = ss.abstract_mesh((8, 8), ("dp", "tp"))
    result = wl.expert_plans(wl.get_workload("gpt:1.5b"), mesh)
    assert list(result.plans) == ["replicated", "dp", "fsdp"]
    assert result.skipped["megatron"] == "n_heads=25 not divisible by tensor axis 'tp' of size 8"


def test_indivisible_batch_skips_with_the_batch_size():
    mesh = ss.abstract_mesh((4, 4), ("dp", "tp"))
    result = wl.expert_plans(wl.get_workload("gpt:tiny"), mesh)
    reason = result.skipped["dp"]
    assert reason == "batch=8 (leaf 'targets') not divisible by mesh axes ('dp', 'tp') of size 16"
    assert "megatron" in result.plans


def test_explicit_roles_and_uninferable_names():
    mesh = ss.abstract_mesh((2, 4), ("a", "b"))
    w = wl.get_workload("gpt:tiny")
    inferred = wl.expert_plans(w, mesh)
    assert list(inferred.plans) == ["replicated", "dp", "fsdp"]
    assert "MeshRoles" in inferred.skipped["megatron"]
    explicit = wl.expert_plans(w, mesh, wl.MeshRoles(data=("a",), tensor=("b",)))
    assert "megatron" in explicit.plans and "fsdp_tp" in explicit.plans
    assert explicit.plans["megatron"].batch_spec == P("a")
    with pytest.raises(ValueError, match="not in the mesh"):
        wl.expert_plans(w, mesh, wl.MeshRoles(tensor=("tp",)))


def test_expert_plan_by_name():
    mesh = ss.abstract_mesh((8,), ("dp",))
    w = wl.get_workload("gpt:tiny")
    assert wl.expert_plan(w, mesh, "fsdp").name == "fsdp"
    with pytest.raises(wl.PlanNotApplicable, match="tensor axis"):
        wl.expert_plan(w, mesh, "megatron")
    with pytest.raises(ValueError, match="unknown expert plan"):
        wl.expert_plan(w, mesh, "zero")


def test_mesh_roles_from_mesh():
    mesh = ss.abstract_mesh((2, 2, 2), ("data", "fsdp", "model"))
    roles = wl.MeshRoles.from_mesh(mesh)
    assert roles == wl.MeshRoles(data=("data",), fsdp=("fsdp",), tensor=("model",))
    assert wl.MeshRoles(tensor="tp").tensor == ("tp",)


def test_plans_do_not_depend_on_the_hash_seed():
    code = (
        "import jax, shardsearch as ss\n"
        "from shardsearch import workloads as wl\n"
        "w = wl.get_workload('moe:small')\n"
        "r = wl.expert_plans(w, ss.abstract_mesh((2, 2, 2), ('dp', 'ep', 'tp')))\n"
        "print(sorted(r.skipped.items()))\n"
        "for name, plan in r.plans.items():\n"
        "    print(name, jax.tree.leaves(plan.specs(w.abstract()), is_leaf=lambda x: "
        "isinstance(x, jax.sharding.PartitionSpec)))\n")
    # The two processes run side by side; each spends its time importing jax.
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=child_env(PYTHONHASHSEED=seed))
             for seed in ("0", "12345")]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out)
    assert outputs[0] == outputs[1]
    assert "ep [" in outputs[0]


# --- errors ---------------------------------------------------------------------------


def test_unknown_workload_and_size():
    with pytest.raises(ValueError, match=r"unknown workload 'nope'.*built-ins"):
        wl.get_workload("nope")
    with pytest.raises(ValueError, match="cannot import module 'nope'"):
        wl.get_workload("nope:small")
    with pytest.raises(ValueError, match=r"unknown size 'huge' for workload 'gpt'.*tiny"):
        wl.get_workload("gpt:huge")
    with pytest.raises(TypeError, match="must be a str"):
        wl.get_workload(3)


@pytest.fixture
def factories(monkeypatch):
    module = types.ModuleType("fake_workload_factories")
    module.good = lambda: wl.get_workload("mlp:tiny")
    module.bad = lambda: {"step": None}
    module.constant = 3
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


def test_factories(factories):
    assert wl.get_workload(f"{factories}:good").name == "mlp:tiny"
    with pytest.raises(TypeError, match=r"returned dict, expected a .*Workload"):
        wl.get_workload(f"{factories}:bad")
    with pytest.raises(TypeError, match="not callable"):
        wl.get_workload(f"{factories}:constant")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        wl.get_workload(f"{factories}:missing")
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_pkg\.models'"):
        wl.get_workload("no_such_pkg.models:make")


def test_user_workload_gets_generic_plans():
    def step(state, batch):
        loss = jnp.mean((batch["x"] @ state["params"]["kernel"]) ** 2)
        return state, {"loss": loss}

    shapes = ({"params": {"kernel": jax.ShapeDtypeStruct((64, 32), jnp.float32)}},
              {"x": jax.ShapeDtypeStruct((16, 64), jnp.float32)})
    w = wl.Workload(name="custom", step=step, init=lambda seed: shapes,
                    abstract=lambda: shapes, flops_per_step=2 * 16 * 64 * 32, n_params=64 * 32)
    result = wl.expert_plans(w, ss.abstract_mesh((2, 4), ("dp", "tp")))
    assert result.plans["fsdp"].specs(shapes)[0]["params"]["kernel"] == P(("dp", "tp"))
    assert "mixture-of-experts" in result.skipped["ep"]


def test_workload_and_plan_validation():
    with pytest.raises(TypeError, match="step must be callable"):
        wl.Workload(name="x", step=None, init=print, abstract=print, flops_per_step=1.0,
                    n_params=1)
    with pytest.raises(ValueError, match="n_params must be >= 0"):
        wl.Workload(name="x", step=print, init=print, abstract=print, flops_per_step=1.0,
                    n_params=-1)
    with pytest.raises(ValueError, match=r"leading \(batch\) dim only"):
        wl.Plan("p", ss.CompositeShardingRule(), P("dp", "tp"))
    with pytest.raises(TypeError, match="entry 3 must be None, an axis name"):
        wl.Plan("p", ss.CompositeShardingRule(), P(3))
    with pytest.raises(TypeError, match="state_rule must be a ShardingRule"):
        wl.Plan("p", None, P())
    with pytest.raises(ValueError, match="in both 'data' and 'tensor'"):
        wl.MeshRoles(data=("dp",), tensor=("dp",))
    with pytest.raises(ValueError, match="Pass MeshRoles"):
        wl.MeshRoles.from_mesh(ss.abstract_mesh((2, 4), ("x", "y")))
    with pytest.raises(ValueError, match="d_model=60 must be divisible by n_heads=8"):
        _gpt.GPTConfig(batch=1, seq=1, vocab=1, d_model=60, n_layers=1, n_heads=8, d_ff=1)


def test_plan_specs_checks_the_batch_against_a_mesh():
    plan = wl.Plan("p", ss.CompositeShardingRule(), P(("dp", "tp")))
    assert plan.batch_rule == ss.BatchShardingRule(("dp", "tp"))
    assert wl.Plan("r", ss.CompositeShardingRule(), P()).batch_rule == ss.BatchShardingRule(())
    args = wl.get_workload("mlp:tiny").abstract()
    with pytest.raises(ValueError, match="not divisible"):
        plan.specs(args, ss.abstract_mesh((4, 8), ("dp", "tp")))
    with pytest.raises(ValueError, match=r"\(state, batch\) pair"):
        plan.specs(args[0])


@pytest.mark.parametrize("model", ["llama", "gpt"])
def test_chunked_attention_computes_the_dense_loss_and_gradients(model):
    # Memory-bounded attention (queries in blocks, recomputed in the backward
    # pass) is the same function as the whole score matrix: same loss, same
    # gradients, on a causal mask that crosses block edges.
    from shardsearch.workloads import _layers

    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (2, 16, 4, 8))
    k = jax.random.normal(keys[1], (2, 16, 2 if model == "llama" else 4, 8))
    v = jax.random.normal(keys[2], k.shape)

    def loss(q, k, v, chunk):
        return jnp.sum(jnp.sin(_layers.causal_attention(q, k, v, chunk)))

    dense = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v, None)
    chunked = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v, 4)
    np.testing.assert_allclose(chunked[0], dense[0], rtol=1e-5)
    for got, want in zip(chunked[1], dense[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_custom_shape_takes_an_attention_chunk_that_divides_seq():
    shape = {"layers": 2, "d_model": 64, "heads": 4, "d_ff": 128, "vocab": 256, "seq": 32,
             "batch": 8, "attention_chunk": 8}
    w = wl.get_workload("llama:custom", **shape)
    assert '"attention_chunk":8' in w.name and wl.get_workload(w.name).name == w.name
    without = wl.get_workload("llama:custom", **{k: v for k, v in shape.items()
                                              if k != "attention_chunk"})
    assert "attention_chunk" not in without.name
    with pytest.raises(ValueError, match="attention_chunk=12 does not divide seq=32"):
        wl.get_workload("llama:custom", **{**shape, "attention_chunk": 12})


def test_a_custom_shape_takes_a_remat_policy():
    shape = {"layers": 2, "d_model": 64, "heads": 4, "d_ff": 128, "vocab": 256, "seq": 32,
             "batch": 8}
    full = wl.get_workload("gpt:custom", **shape)
    assert wl.get_workload("gpt:custom", **shape, remat="full").name == full.name
    selective = wl.get_workload("gpt:custom", **shape, remat="selective")
    assert '"remat":"selective"' in selective.name
    assert wl.get_workload(selective.name).name == selective.name
    with pytest.raises(ValueError, match="remat='some'; choose one of"):
        wl.get_workload("gpt:custom", **shape, remat="some")
    # Selective recompute keeps the projections' outputs: the step saves more
    # for the backward pass than full remat, which keeps only each block's input.
    def temporaries(w):
        return jax.jit(w.step).lower(*w.abstract()).compile().memory_analysis().temp_size_in_bytes
    assert temporaries(selective) > temporaries(full)


def test_a_chunked_loss_gives_the_same_loss_and_gradients():
    # A loss over blocks of positions (loss_chunk) must not change the numbers.
    from shardsearch.workloads import _params

    for module, config in ((_llama, _llama.LlamaConfig(
            batch=4, seq=16, vocab=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
            d_ff=64, stacked=True, remat=True)),
            (_gpt, _gpt.GPTConfig(batch=4, seq=16, vocab=64, d_model=32, n_layers=2,
                                  n_heads=4, d_ff=64))):
        params = _params.materialize(module.param_spec(config), np.random.default_rng(0))
        if config.stacked:
            params["layers"] = _params.stack_layers(params["layers"])
        params = jax.tree.map(jnp.asarray, params)
        tokens = jax.random.randint(jax.random.key(1), (4, 16), 0, 64)
        batch = {"tokens": tokens, "targets": jnp.roll(tokens, -1, axis=1)}

        def loss(p, cfg=config, m=module, batch=batch):
            return m.loss_fn(cfg, p, batch)[0]

        whole, g_whole = jax.value_and_grad(loss)(params)
        chunked = functools.partial(loss, cfg=dataclasses.replace(config, loss_chunk=4))
        parts, g_parts = jax.value_and_grad(chunked)(params)
        np.testing.assert_allclose(parts, whole, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(g_parts), jax.tree.leaves(g_whole), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_custom_shape_takes_a_loss_chunk_that_divides_seq():
    shape = {"layers": 2, "d_model": 64, "heads": 4, "d_ff": 128, "vocab": 256, "seq": 32,
             "batch": 8}
    w = wl.get_workload("gpt:custom", **shape, loss_chunk=8)
    assert '"loss_chunk":8' in w.name and wl.get_workload(w.name).name == w.name
    assert "loss_chunk" not in wl.get_workload("gpt:custom", **shape).name
    with pytest.raises(ValueError, match="loss_chunk=12 does not divide seq=32"):
        wl.get_workload("llama:custom", **shape, loss_chunk=12)
