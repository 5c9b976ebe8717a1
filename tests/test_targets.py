"""Targets: candidates compiled by a chip's own compiler, without the chip.

Small shapes on a 2x2 TPU v5e and 1x1x8 H100s: the recorded memory is the
chip compiler's, an over-memory candidate is cut at compile, the search and
its isolated worker compile for the chip, the study and plan say what for.
Without libtpu or the CUDA plugin these skip, except under CI=true, where
`.ci/run` installs both extras and a skip would hide a broken target.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base import target as _target
from shardsearch.base.target import Target, TargetUnavailable, derive_topology, target_of
from shardsearch.search import Stage, Status
from shardsearch.search.evaluation.evaluate import evaluate, over_chip_memory
from shardsearch.search.setup import make_context
from shardsearch.workloads import get_workload

HAVE = {"tpu": importlib.util.find_spec("libtpu") is not None,
        "cuda": _target._cuda_major() is not None}


def _need(platform):
    if HAVE[platform]:
        return
    extra = "tpu" if platform == "tpu" else "cuda"
    message = f"the {extra} extra is not installed: pip install -e '.[{extra}]'"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (.ci/run installs it; under CI=true this test never skips)")
    pytest.skip(message)


@pytest.fixture
def v5e():
    _need("tpu")
    return ss.target_mesh("tpu-v5e", {"dp": 2, "tp": 2})


@pytest.fixture
def h100():
    _need("cuda")
    return ss.target_mesh("gpu-h100", {"dp": 2, "tp": 4})


# --------------------------------------------------------------- topologies

@pytest.mark.parametrize(("chip", "devices", "topology"), [
    ("tpu-v5e", 4, "2x2"), ("tpu-v5e", 8, "2x4"), ("tpu-v5e", 32, "4x8"),
    ("tpu-v5e", 256, "16x16"), ("tpu-v5e", 1, "1x1"), ("tpu-v5e", 2, "2x1"),
    ("tpu-v5p", 4, "2x2x1"), ("tpu-v5p", 2, "2x1x1"), ("tpu-v5p", 16, "2x2x4"),
    ("tpu-v5p", 64, "4x4x4"), ("tpu-v5p", 128, "4x4x8"), ("tpu-v4", 64, "4x4x4"),
    ("gpu-h100", 4, "1x1x4"), ("gpu-h100", 8, "1x1x8"), ("gpu-h100", 96, "1x12x8"),
    ("gpu-h200", 16, "1x2x8"),
])
def test_topology_from_the_device_count(chip, devices, topology):
    assert derive_topology(chip, devices) == topology


@pytest.mark.parametrize(("chip", "devices", "words"), [
    ("tpu-v5e", 3, "power of two"), ("tpu-v5p", 12, "power of two"),
    ("gpu-h100", 12, "multiple of 8"), ("tpu-v9", 8, "unknown target chip"),
])
def test_topologies_that_cannot_be_derived_say_why(chip, devices, words):
    with pytest.raises(ValueError, match=words):
        derive_topology(chip, devices)


def test_a_bad_topology_is_refused_when_the_target_is_built():
    with pytest.raises(ValueError, match="needs 3 positive dims"):
        Target("tpu-v5p", "4x4")
    with pytest.raises(ValueError, match="not like 2x4"):
        Target("tpu-v5e", "four")


def test_a_missing_plugin_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("libtpu", "jax_plugins.xla_cuda12",
                                                          "jax_plugins.xla_cuda13")
                        else real(name, *a))
    with pytest.raises(TargetUnavailable, match=r"pip install 'shardsearch\[tpu\]'"):
        _target.require_plugin("tpu-v5e")
    with pytest.raises(TargetUnavailable, match=r"pip install 'shardsearch\[cuda\]'"):
        _target.require_plugin("gpu-h200")


def test_the_cuda_13_plugin_compiles_gpu_targets_too(monkeypatch):
    # jax[cuda13] installs jax_plugins.xla_cuda13 and no cuda12 plugin: the
    # target must take it, and record its packages as the compiler.
    real = importlib.util.find_spec
    present = real("json")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "jax_plugins.xla_cuda12"
                        else present if name == "jax_plugins.xla_cuda13" else real(name, *a))
    _target.require_plugin("gpu-h200")
    assert set(Target("gpu-h200", "1x1x8").versions()) == {"jax-cuda13-plugin",
                                                           "jax-cuda13-pjrt"}


# ------------------------------------------------------------------- meshes

def test_a_target_mesh_is_the_chips_devices(v5e):
    target = target_of(v5e)
    assert v5e.shape == {"dp": 2, "tp": 2}
    assert {d.platform for d in v5e.devices.flat} == {"tpu"}
    assert v5e.devices.flat[0].device_kind == "TPU v5 lite"
    assert (target.chip, target.topology, target.slices) == ("tpu-v5e", "2x2", 1)
    recorded = target.to_json()
    assert recorded["platform"] == "tpu" and recorded["versions"]["libtpu"] != "missing"


@pytest.mark.parametrize(("chip", "axes", "topology", "kind"), [
    ("tpu-v5e", {"dp": 1}, "1x1", "TPU v5 lite"), ("tpu-v5e", {"tp": 2}, "2x1", "TPU v5 lite"),
    ("tpu-v5p", {"dp": 2}, "2x1x1", "TPU v5"), ("tpu-v4", {"dp": 1}, "1x1x1", "TPU v4"),
])
def test_a_target_smaller_than_a_tpu_host_has_just_its_chips(chip, axes, topology, kind):
    # libtpu refuses a topology under one host's 2x2x1 chips unless told the
    # host is that small; a user planning for one v5e chip needs it.
    _need("tpu")
    mesh = ss.target_mesh(chip, axes)
    assert target_of(mesh).topology == topology
    assert mesh.devices.size == math.prod(axes.values())
    assert {d.device_kind for d in mesh.devices.flat} == {kind}
    spec = P(*axes) if mesh.size > 1 else P()
    x = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16, sharding=NamedSharding(mesh, spec))
    compiled = jax.jit(lambda a: (a @ a.T).sum()).lower(x).compile()
    assert compiled.memory_analysis().argument_size_in_bytes == 256 * 512 * 2 // mesh.size


def test_a_gpu_target_mesh_uses_the_shipped_config(h100):
    assert h100.devices.flat[0].device_kind == "NVIDIA H100 80GB HBM3"
    target = target_of(h100)
    assert target.topology == "1x1x8"
    # What the device itself reports, a little under the marketing 80 GB.
    assert 79 * 2**30 < target.memory_bytes < 80 * 2**30
    assert "config_sha256" in target.to_json()


def test_dcn_axes_span_tpu_slices():
    _need("tpu")
    mesh = ss.target_mesh("tpu-v5e", {"dp": 2, "fsdp": 4}, dcn_axes=("dp",))
    target = target_of(mesh)
    assert (target.topology, target.slices, target.dcn_axes) == ("2x2", 2, ("dp",))
    # Each slice's devices sit on one row of the dp axis.
    for row in range(2):
        assert {d.slice_index for d in mesh.devices[row]} == {row}


def test_gpu_dcn_axes_span_hosts_and_the_rest_stays_inside_one():
    _need("cuda")
    mesh = ss.target_mesh("gpu-h100", {"dp": 8, "tp": 2}, dcn_axes=("dp",))
    assert target_of(mesh).topology == "1x2x8"
    for row in mesh.devices:  # each tp pair on one host
        assert len({d.process_index for d in row}) == 1
    assert {d.process_index for d in mesh.devices[:, 0]} == {0, 1}
    with pytest.raises(ValueError, match="put the dcn_axes"):
        ss.target_mesh("gpu-h100", {"tp": 2, "dp": 8}, dcn_axes=("dp",))


def test_mesh_errors_say_what_and_how():
    with pytest.raises(ValueError, match="dcn_axes"):
        ss.target_mesh("tpu-v5e", {"dp": 4}, dcn_axes=("pp",))
    with pytest.raises(ValueError, match="sizes are positive"):
        ss.target_mesh("tpu-v5e", {"dp": 0})
    _need("tpu")
    with pytest.raises(ValueError, match="make 4 devices but topology 2x4 has 8"):
        ss.target_mesh("tpu-v5e", {"dp": 4}, topology="2x4")


def test_a_mesh_of_unknown_compile_only_devices_is_refused():
    _need("tpu")
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
    mesh = jax.sharding.Mesh(np.array(devices), ("x",))
    with pytest.raises(ValueError, match=r"build it with shardsearch\.target_mesh"):
        target_of(mesh)


# ---------------------------------------------------------------- the search

def _compiled_memory(mesh, specs, args, step):
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                             is_leaf=lambda s: isinstance(s, P))
    # As the monitored step compiles it: the state donated, its sharding kept.
    compiled = jax.jit(step, in_shardings=shardings, donate_argnums=(0,),
                       out_shardings=(shardings[0], NamedSharding(mesh, P()))).lower(*args)
    return compiled.compile().memory_analysis()


def _replicated(args):
    return jax.tree.map(lambda _: P(), tuple(args))


@pytest.mark.parametrize("mesh_name", ["v5e", "h100"])
def test_the_recorded_memory_is_the_chip_compilers(mesh_name, request):
    mesh = request.getfixturevalue(mesh_name)
    workload = get_workload("gpt:tiny")
    ctx, _ = make_context(workload, None, mesh, objective="static")
    assert ctx.target == target_of(mesh)
    specs = _replicated(ctx.abstract_args)
    outcome = evaluate(specs, "fp", ctx)
    assert outcome.status == Status.COMPLETE, outcome.reason
    stats = _compiled_memory(mesh, specs, ctx.abstract_args, workload.step)
    assert outcome.memory["temp"] == stats.temp_size_in_bytes
    assert outcome.memory["argument"] == stats.argument_size_in_bytes
    listed = (stats.argument_size_in_bytes + stats.output_size_in_bytes
              + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
    if mesh_name == "v5e":  # the TPU compiler's own peak is what the program needs
        assert outcome.memory["total"] == outcome.memory["peak"] == stats.peak_memory_in_bytes
    else:
        assert outcome.memory["total"] == listed and "peak" not in outcome.memory
    # The CPU's program keeps other temporaries: the figure is the chip's own.
    n = len(mesh.devices.flat)
    cpu = ss.create_mesh((2, n // 2), ("dp", "tp"), jax.devices()[:n])
    host = _compiled_memory(cpu, specs, ctx.abstract_args, workload.step)
    assert outcome.memory["temp"] != host.temp_size_in_bytes


def test_the_default_budget_and_model_are_the_chips(v5e, h100):
    workload = get_workload("gpt:tiny")
    ctx, _ = make_context(workload, None, v5e, objective="static")
    assert ctx.budget == 16 * 2**30 and ctx.hardware_model() is ss.HARDWARE["tpu-v5e"]
    ctx, _ = make_context(workload, None, h100, objective="static")
    assert ctx.budget == target_of(h100).memory_bytes
    assert ctx.hardware_model() is ss.HARDWARE["gpu-h100"]


def _gather_step(w, x):
    y = x @ x.T  # x is split by rows: each device gathers the whole of it
    return w - 1e-3 * jnp.sum(y), jnp.sum(y)


def test_on_tpu_the_total_is_the_compilers_peak_which_counts_what_its_temp_size_leaves_out(v5e):
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
    args = (jax.ShapeDtypeStruct((8,), jnp.float32), x)
    ctx, _ = make_context(_gather_step, args, v5e, objective="static")
    outcome = evaluate((P(), P("dp")), "fp", ctx)
    assert outcome.status == Status.COMPLETE, outcome.reason
    memory = outcome.memory
    gathered = 1024 * 1024 * 4
    # The sum of the memory analysis's figures is under the one gathered
    # operand every device holds; the peak covers it.
    assert memory["argument"] + memory["output"] + memory["temp"] - memory["alias"] < gathered
    assert memory["total"] == memory["peak"] >= gathered


def test_objectives_that_run_the_step_are_refused_on_a_target(v5e):
    for objective in ("measured", "hybrid"):
        with pytest.raises(ValueError, match="compile-only devices, which run nothing"):
            make_context(get_workload("mlp:tiny"), None, v5e, objective=objective)


def _big_step(w, x):
    y = jnp.tanh(x @ w) @ w.T
    return w - 1e-3 * (y.T @ x), jnp.sum(y)


BIG = (jax.ShapeDtypeStruct((65536, 65536), jnp.bfloat16),
       jax.ShapeDtypeStruct((65536, 65536), jnp.bfloat16))


def test_a_candidate_the_tpu_compiler_refuses_is_cut_at_compile(v5e):
    ctx, _ = make_context(_big_step, BIG, v5e, objective="static", memory_budget="64GiB")
    outcome = evaluate((P(), P("dp")), "fp", ctx)
    assert outcome.status == Status.CUT and outcome.cut_stage == Stage.COMPILE
    assert outcome.reason.startswith("over the chip's memory: tpu-v5e's compiler refused it")
    assert "exceeds available HBM" in outcome.reason


def test_over_the_gpus_memory_is_cut_though_its_compiler_only_warns(h100):
    # 32 GiB of weights, replicated, and a gradient as large: over 80 GB. The
    # budget is the user's; it cannot lift the chip's memory.
    big = (jax.ShapeDtypeStruct((131072, 131072), jnp.bfloat16),
           jax.ShapeDtypeStruct((131072, 131072), jnp.bfloat16))
    ctx, _ = make_context(_big_step, big, h100, objective="static", memory_budget="1TiB")
    outcome = evaluate((P(), P("dp")), "fp", ctx)
    assert outcome.status == Status.CUT and outcome.cut_stage == Stage.COMPILE
    assert outcome.reason.startswith("over the chip's memory: gpu-h100's compiler needs")
    assert outcome.memory["total"] > target_of(h100).memory_bytes


def test_what_a_gpu_plan_needs_at_run_time_is_said():
    h100 = Target("gpu-h100", "1x1x8")
    chip = h100.memory_bytes
    assert _target.gpu_memory_advice(h100, int(0.5 * chip)) is None
    over_default = _target.gpu_memory_advice(h100, int(0.8 * chip))
    # 0.8 of the chip, plus the deviceless shortfall, rounded up.
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.82 or more" in over_default
    assert "check it on the chip" not in over_default
    close = _target.gpu_memory_advice(h100, int(0.99 * chip))
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.99" in close and "check it on the chip" in close
    # A TPU's compiler refuses what does not fit: nothing to add.
    assert _target.gpu_memory_advice(Target("tpu-v5e", "2x2"), 10**12) is None


def test_a_gpu_winner_over_what_jax_gives_by_default_is_warned(h100, monkeypatch):
    # A tiny step needs a sliver of the chip; a sliver is what JAX is made to
    # give it here, so the winner must come with the advice.
    monkeypatch.setattr(_target, "JAX_GPU_MEMORY_FRACTION", 1e-9)
    with pytest.warns(_target.TargetMemoryWarning, match="XLA_PYTHON_CLIENT_MEM_FRACTION"):
        ss.optimize(get_workload("mlp:tiny"), mesh=h100, objective="static", n_trials=2,
                    quiet=True)


def test_the_compilers_refusal_is_read_from_its_message():
    assert over_chip_memory(RuntimeError("INTERNAL: something else")) is None
    assert over_chip_memory(RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory "
                                         "space hbm. Used 20G of 15.75G hbm.")) == (
        "Ran out of memory in memory space hbm. Used 20G of 15.75G hbm")


def test_a_search_compiles_for_the_chip_in_its_worker(v5e, tmp_path):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    result = ss.optimize(get_workload("mlp:tiny"), mesh=v5e, objective="static", n_trials=4,
                         storage=storage, quiet=True, isolate=True)
    assert result.summary()["completed"] >= 3
    assert result.study.user_attrs["hardware"]["target"]["chip"] == "tpu-v5e"
    identity = dict(result.study.user_attrs["identity"]["values"])
    assert identity["target"] == "tpu-v5e 2x2 x1" and "libtpu=" in identity["compiler"]
    plan = ss.export_config(result)
    assert plan["hardware"]["target"]["topology"] == "2x2"
    assert plan["hardware"]["platform"] == "tpu"


def test_the_command_line_compiles_for_a_target(tmp_path):
    _need("tpu")
    env = {**os.environ, "JAX_PLATFORMS": ""}
    out = tmp_path / "plan.json"
    done = subprocess.run(
        [sys.executable, "-m", "shardsearch", "optimize", "--workload", "mlp:tiny", "--mesh",
         "dp=2,tp=2", "--target", "tpu-v5e", "--trials", "3", "--quiet", "--out", str(out),
         "--storage", f"sqlite:///{tmp_path / 's.db'}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "compiled for tpu-v5e 2x2 (4 devices, libtpu" in done.stdout
    plan = json.loads(out.read_text())
    assert plan["hardware"]["target"]["chip"] == "tpu-v5e"
    assert plan["search"]["objective"] == "static"


@pytest.mark.parametrize(("argv", "words"), [
    (["--topology", "2x2"], "--topology 2x2 is the topology of a --target chip"),
    (["--target", "tpu-v5e", "--mesh-size-of", "-1"], "with --target a size of -1 needs"),
    (["--target", "tpu-v5e", "--objective", "measured"], "estimates nothing"),
])
def test_target_usage_errors_are_one_line(argv, words, tmp_path, capsys):
    from shardsearch.cli.main import main

    mesh = "dp=2,tp=-1" if "--mesh-size-of" in argv else "dp=2,tp=2"
    argv = [a for a in argv if a not in ("--mesh-size-of", "-1")]
    code = main(["optimize", "--workload", "mlp:tiny", "--mesh", mesh, "--trials", "1", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err


def test_a_mesh_that_cannot_follow_the_physical_axes_says_so(monkeypatch):
    _need("tpu")
    from jax.experimental import mesh_utils

    real = mesh_utils.create_device_mesh

    def picky(sizes, devices, **options):
        if not options.get("allow_split_physical_axes"):
            raise NotImplementedError("no physical mapping for this shape")
        return real(sizes, devices, **options)

    monkeypatch.setattr(mesh_utils, "create_device_mesh", picky)
    with pytest.warns(_target.TargetLayoutWarning, match="does not map onto the chips"):
        mesh = ss.target_mesh("tpu-v5e", {"dp": 2, "tp": 2})
    assert mesh.shape == {"dp": 2, "tp": 2}


def test_the_shape_of_a_target_mesh_is_searched_too(tmp_path):
    _need("tpu")
    result = ss.optimize(get_workload("mlp:tiny"), devices=4, axes=("dp", "tp"),
                         make_mesh=lambda shape: ss.target_mesh("tpu-v5e", shape),
                         objective="static", n_trials=6, quiet=True, isolate=False,
                         storage=f"sqlite:///{tmp_path / 's.db'}")
    assert set(result.shapes["searched"]) == {"dp=1,tp=4", "dp=2,tp=2", "dp=4,tp=1"}
    assert result.shapes["verdict"] == "unconfirmed"  # estimates, nothing re-timed
    assert result.study.user_attrs["hardware"]["target"]["chip"] == "tpu-v5e"
