"""The cost model on the chips' own HLO: loop-aware flops, async pairs, bf16.

Each program is compiled for a chip this machine lacks, by that chip's own
compiler (`shardsearch.target_mesh`): a 2x2 TPU v5e (libtpu) and a 1x1x8
H100 (the CUDA plugin). Shapes are tiny, a few seconds per compile. Without
the plugin a test skips, except under CI=true, where it fails naming the
extra to install.
"""

import functools
import os
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.base.target import TargetUnavailable, uncached
from shardsearch.cost.hlo import COLLECTIVE_KINDS, parse_hlo
from shardsearch.cost.hlo_graph import parse_module
from shardsearch.cost.program import ProgramCost
from shardsearch.workloads import expert_plan, get_workload

# platform -> (chip, mesh axes, topology, pip extra)
CHIPS = {
    "tpu": ("tpu-v5e", {"dp": 2, "tp": 2}, None, "tpu"),
    "gpu": ("gpu-h100", {"dp": 4, "tp": 2}, "1x1x8", "cuda"),
}
PLATFORMS = list(CHIPS)

# `compiled_workload` compiles each program once per process: the module's
# tests in one process (under `--dist loadgroup`) compile each once in all,
# where spread over the suite's processes they compiled the same H100
# programs (5-6 CPU seconds each) up to three times.
pytestmark = pytest.mark.xdist_group("chip_hlo")

# A scanned, rematerialised Llama (the custom workloads are stacked with remat,
# as the real-size presets): 3 layers, so the loop runs 3 trips.
STACKED = {"layers": 3, "d_model": 64, "heads": 4, "kv_heads": 2, "d_ff": 128, "vocab": 256,
           "seq": 32, "batch": 8, "compute_dtype": "bfloat16"}


@functools.cache
def _target(platform):
    chip, axes, topology, extra = CHIPS[platform]
    try:
        return ss.target_mesh(chip, axes, topology=topology), None
    except TargetUnavailable as err:
        return None, f"{err} (from a checkout: pip install '.[{extra}]')"


def chip_mesh(platform):
    mesh, problem = _target(platform)
    if mesh is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {platform} cannot compile here: {problem}")
        pytest.skip(problem)
    return mesh


def compile_on(mesh, f, *args):
    with uncached():  # a compile-only client cannot read the cache back
        return jax.jit(f).lower(*args).compile()


@functools.cache
def compiled_workload(platform, name, plan, **shape):
    mesh = chip_mesh(platform)
    workload = get_workload(name, **shape)
    abstract = workload.abstract()
    specs = expert_plan(workload, mesh, plan).specs(abstract, mesh)
    args = jax.tree.map(
        lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec)),
        abstract, specs)
    return workload, mesh, compile_on(mesh, workload.step, *args)


def remat_flops(dims):
    """What `jax.checkpoint` recomputes of a Llama's layers in the backward
    pass, which `flops_per_step` (6·N·tokens plus attention) leaves out: each
    layer's forward but its last matmul (`w_down`, whose output the backward
    pass does not need), attention's two products included."""
    tokens = dims["batch"] * dims["seq"]
    d, heads, kv, dh = dims["d_model"], dims["n_heads"], dims["n_kv_heads"], dims["head_dim"]
    matmul = 2 * d * dh * (heads + kv) + 2 * d * dims["d_ff"]  # w_down left out
    attention = 4 * tokens * dims["seq"] * heads * dh
    return dims["n_layers"] * (2 * tokens * matmul + attention)


CASES = [
    ("gpt:tiny", "megatron", {}, False),
    ("llama:tiny", "megatron", {}, False),
    ("llama:custom", "megatron", STACKED, True),
    ("llama:custom", "dp", STACKED, True),
]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(("name", "plan", "shape", "remat"), CASES,
                         ids=["gpt-tiny", "llama-tiny", "llama-scanned", "llama-scanned-dp"])
def test_loop_aware_flops_match_the_closed_form(platform, name, plan, shape, remat):
    workload, mesh, compiled = compiled_workload(platform, name, plan, **shape)
    _, cost = parse_hlo(compiled.as_text())
    closed = workload.flops_per_step + (remat_flops(workload.dims) if remat else 0)
    assert cost.dot_flops == pytest.approx(closed / mesh.size, rel=0.05)
    assert cost.unknown_ops == ()
    if workload.stacked:  # the scan's body counted once per layer, not once
        assert cost.dot_flops > 2 * cost.dot_flops_once


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_scans_trip_count_is_applied(platform):
    workload, _, compiled = compiled_workload(platform, "llama:custom", "megatron", **STACKED)
    module = parse_module(compiled.as_text())
    entry = module.computations[module.entry]
    loops = [i for i in entry.instructions.values() if i.opcode == "while"]
    assert len(loops) == 2  # the layers forward, and backward
    bodies = [loop.attrs.split("body=")[1].split(",")[0].lstrip("%") for loop in loops]
    assert [module.counts[body] for body in bodies] == [workload.dims["n_layers"]] * 2
    assert [module.counts_once[body] for body in bodies] == [1, 1]
    assert module.unknown_trip_counts == ()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(("name", "shape"), [("gpt:tiny", {}), ("llama:custom", STACKED)],
                         ids=["gpt-tiny", "llama-scanned"])
def test_each_async_pair_is_one_collective(platform, name, shape):
    _, _, compiled = compiled_workload(platform, name, "megatron", **shape)
    text = compiled.as_text()
    module = parse_module(text)
    summary, _ = parse_hlo(text)
    opcodes = [i.opcode for c in module.computations.values() if module.counts[c.name]
               for i in c.instructions.values()]
    for kind in COLLECTIVE_KINDS:
        starts = opcodes.count(f"{kind}-start")
        assert opcodes.count(f"{kind}-done") == starts
        found = [c for c in summary.collectives if c.kind == kind]
        assert len(found) == starts + opcodes.count(kind), kind
    if platform == "gpu":  # the GPU compiler makes all-reduces asynchronous (jax 0.11's
        # leaves some synchronous beside them: each counted once, as above)
        assert opcodes.count("all-reduce-start") > 0


@pytest.mark.parametrize("platform", PLATFORMS)
def test_bf16_keeps_two_bytes_an_element(platform):
    mesh = chip_mesh(platform)
    x = jax.ShapeDtypeStruct((64, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P("dp")))

    def gather(x):  # an all-gather of the rows over dp
        return jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P()))

    compiled = compile_on(mesh, gather, x)
    text = compiled.as_text()
    if platform == "tpu":
        assert ":T(8,128)(2,1)}" in text  # TPU tiled layouts parse
    summary, cost = parse_hlo(text)
    (collective,) = [c for c in summary.collectives if c.kind == "all-gather"]
    assert collective.bytes == 64 * 256 * 2
    assert cost.unknown_ops == ()


def test_tpu_batched_matmuls_count_what_the_compiler_counts():
    # The TPU compiler writes these as convolutions whose batch dims are
    # dilated spatial dims; its own cost analysis counts only the positions
    # that meet an element, and so must the parser.
    mesh = chip_mesh("tpu")
    spec = NamedSharding(mesh, P("dp"))
    q = jax.ShapeDtypeStruct((8, 32, 2, 2, 16), jnp.bfloat16, sharding=spec)
    k = jax.ShapeDtypeStruct((8, 32, 2, 16), jnp.bfloat16, sharding=spec)

    def scores(q, k):
        return jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=jnp.float32)

    compiled = compile_on(mesh, scores, q, k)
    _, cost = parse_hlo(compiled.as_text())
    assert cost.dot_flops == 2 * 4 * 32 * 32 * 2 * 2 * 16  # per device: batch 8 / dp
    assert cost.dot_flops == compiled.cost_analysis()["flops"]


# --- the compiler's own estimate ---------------------------------------------


def test_the_tpu_compilers_estimate_counts_the_loop_trips():
    _, _, compiled = compiled_workload("tpu", "gpt:tiny", "megatron")
    unrolled = ProgramCost.from_compiled(compiled)
    assert unrolled.xla_seconds > 0
    assert unrolled.compiler_seconds == pytest.approx(unrolled.xla_seconds)
    _, _, compiled = compiled_workload("tpu", "llama:custom", "megatron", **STACKED)
    scanned = ProgramCost.from_compiled(compiled)
    loops = scanned.bytes_accessed / scanned.xla_bytes_accessed
    assert loops > 1.1
    assert scanned.compiler_seconds == pytest.approx(scanned.xla_seconds * loops)
    assert scanned.compiler_seconds_problem == ""


def test_the_gpu_compiler_gives_no_estimate():
    _, _, compiled = compiled_workload("gpu", "gpt:tiny", "megatron")
    program = ProgramCost.from_compiled(compiled)
    assert program.xla_seconds is None and program.compiler_seconds is None
    assert "no optimal_seconds" in program.compiler_seconds_problem


@pytest.mark.parametrize(("name", "shape"), [("gpt:tiny", {}), ("llama:custom", STACKED)],
                         ids=["gpt-tiny", "llama-scanned"])
def test_without_a_cost_analysis_the_hlo_counts_stand_in(name, shape):
    # The GPU compiler's cost_analysis() is None: the program's flops and
    # bytes are the HLO's own, loops counted.
    _, _, compiled = compiled_workload("gpu", name, "megatron", **shape)
    assert compiled.cost_analysis() is None
    program = ProgramCost.from_compiled(compiled)
    assert program.flops == program.hlo.dot_flops > 0
    assert program.bytes_accessed == program.hlo.bytes_accessed > 0


CONCAT = ('%c{n} = f32[8,128]{{1,0:T(8,128)}} custom-call(%p, %p), '
          'custom_call_target="ConcatBitcast"')


def tpu_text(*lines):
    body = "\n".join(f"  {line}" for line in lines)
    return ("HloModule m\n\nENTRY %main (p: f32[4,128]) -> f32[4,128] {\n"
            f"  %p = f32[4,128]{{1,0:T(8,128)}} parameter(0)\n{body}\n"
            "  ROOT %n = f32[4,128]{1,0:T(8,128)} negate(%p)\n}\n")


@pytest.mark.parametrize(
    ("seconds", "lines", "expected", "problem"),
    [
        (0.25, [], 0.25, ""),
        # libtpu charges each ConcatBitcast -1 s; given back, 0.5 s is left.
        (-1.5, [CONCAT.format(n=1), CONCAT.format(n=2)], 0.5, ""),
        (-19.8, [], None, r"optimal_seconds=-19\.8 .* is not above 0"),
        (0.0, [], None, "is not above 0"),
        (float("nan"), [], None, "is not finite"),
        (float("inf"), [], None, "is not finite"),
        (None, [], None, "gave no optimal_seconds"),
    ],
    ids=["plain", "sentinels", "negative", "zero", "nan", "inf", "absent"],
)
def test_the_compilers_estimate_is_checked(seconds, lines, expected, problem):
    program = ProgramCost.from_hlo(tpu_text(*lines), 1e6, 4096.0, xla_seconds=seconds)
    assert program.compiler_seconds == (expected if expected is None else pytest.approx(expected))
    if problem:
        assert re.search(problem, program.compiler_seconds_problem)
    else:
        assert program.compiler_seconds_problem == ""


def test_the_compilers_estimate_is_a_number():
    with pytest.raises(TypeError, match=r"xla_seconds='fast' must be a number"):
        ProgramCost(1.0, 1.0, None, None, hlo_error="unread", xla_seconds="fast")


def test_the_compilers_estimate_needs_the_hlo_for_its_loops():
    program = ProgramCost.from_hlo("not HLO", 1e6, 4096.0, xla_seconds=0.5)
    assert program.compiler_seconds is None
    assert "loop trips" in program.compiler_seconds_problem


def test_custom_calls_are_counted_as_the_compiler_counts_them():
    cost = parse_hlo(tpu_text(CONCAT.format(n=1), CONCAT.format(n=2)))[1]
    assert cost.custom_calls_once == (("ConcatBitcast", 2),)


# Dims the TPU's (8, 128) tiles divide, so that no buffer is padded: the
# parser counts the bytes a shape holds, XLA's cost analysis the tiles'.
ALIGNED = {"layers": 2, "d_model": 512, "heads": 4, "kv_heads": 4, "head_dim": 128, "d_ff": 1024,
           "vocab": 1024, "seq": 256, "batch": 8, "compute_dtype": "bfloat16"}


@pytest.mark.parametrize("plan", ["megatron", "fsdp"])
def test_tpu_bytes_are_what_the_tpu_compiler_counts(plan):
    # The TPU compiler slices the stacked weights asynchronously
    # (`slice-start`, shape ((operand), slice, context)): read as an
    # instruction of its own, each charged the whole stack twice, and the
    # program came to 1.41 (megatron) and 1.29 (fsdp) times XLA's own count.
    _, _, compiled = compiled_workload("tpu", "llama:custom", plan, **ALIGNED)
    text = compiled.as_text()
    assert " slice-start(" in text
    _, cost = parse_hlo(text)
    assert cost.bytes_accessed_once == pytest.approx(
        compiled.cost_analysis()["bytes accessed"], rel=0.2)
