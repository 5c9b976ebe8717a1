"""Tests for shardsearch.cost.hlo: collectives and their bytes from compiled HLO text."""

import re

import jax
import jax.numpy as jnp
import pytest
from hlo_text import ADD, module, only
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardsearch.cost.hlo import (
    COLLECTIVE_KINDS,
    Collective,
    CollectiveSummary,
    HloCost,
    KernelCost,
    parse_collectives,
    parse_hlo,
)
from shardsearch.cost.program import loop_aware

# --- hand-written modules ---------------------------------------------------

GROUP8 = "replica_groups={{0,1,2,3,4,5,6,7}}"


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("f32[8,128]{1,0}", 8 * 128 * 4),
        ("bf16[8,128]{1,0}", 8 * 128 * 2),
        ("f16[2,2]", 8),
        ("f64[3]{0}", 24),
        ("s8[10]{0}", 10),
        ("u8[10]{0}", 10),
        ("s16[4]{0}", 8),
        ("u16[4]{0}", 8),
        ("s32[]", 4),
        ("u32[5]{0}", 20),
        ("s64[2]{0}", 16),
        ("u64[2]{0}", 16),
        ("pred[]", 1),
        ("pred[7]{0}", 7),
        ("c64[2]{0}", 16),
        ("c128[2]{0}", 32),
        ("f8e4m3fn[16]{0}", 16),
        ("f8e5m2[16]{0}", 16),
        ("f32[8,128]{1,0:S(1)}", 8 * 128 * 4),
        ("f32[8,128]{1,0:T(8,128)S(1)}", 8 * 128 * 4),
        ("f32[<=8,4]{1,0}", 8 * 4 * 4),
        ("s4[10]{0}", 10),
        ("s4[10]{0:E(4)}", 5),
        ("(f32[4]{0}, f32[4]{0})", 32),
        ("(f32[4]{0}, (bf16[2]{0}, s32[]))", 16 + 4 + 4),
        ("(f32[1]{0}, f32[1]{0}, f32[1]{0}, f32[1]{0}, f32[1]{0}, /*index=5*/f32[1]{0})", 24),
    ],
)
def test_bytes_of_result_shape(shape, expected):
    line = f"%ar = {shape} all-reduce(%p), channel_id=1, {GROUP8}, to_apply=%add"
    assert only(module(line)).bytes == expected


def test_unknown_element_type_names_the_type_and_the_line():
    line = f"%ar = f33[4]{{0}} all-reduce(%p), {GROUP8}, to_apply=%add"
    with pytest.raises(ValueError, match=r"unknown HLO element type 'f33'.*%ar = f33\[4\]"):
        parse_collectives(module(line))


# Lines marked "CPU" are copied from jax 0.10.2's compiled CPU text.
@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ("replica_groups={{0,1,2,3},{4,5,6,7}}", 4),  # CPU, shard_map
        ("replica_groups={{0,4},{1,5},{2,6},{3,7}}", 2),  # CPU, shard_map
        ("replica_groups=[2,4]<=[8]", 4),
        ("replica_groups=[4,2]<=[2,4]T(1,0)", 2),
        ("replica_groups=[1,8]<=[8]", 8),
        ("replica_groups={}", 8),
        ("use_global_device_ids=true", 8),  # no replica_groups at all: every device
        (  # CPU, jit with NamedSharding
            "replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], "
            "device_ids=([2,4]T(1,0)) {'axis_1'}",
            4,
        ),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", 2),  # CPU
        ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}", 8),
        ("replica_groups=mesh[a=8] {a:(1)2}", 2),
        ("replica_groups=mesh['a'=2,'b'=4] {}", 1),
        ("replica_groups=maximal_mesh[device_id=0] {}", 1),
    ],
)
def test_group_size_of_each_replica_group_syntax(groups, expected):
    line = f"%ar = f32[8,128]{{1,0}} all-reduce(%p), channel_id=1, {groups}, to_apply=%add"
    assert only(module(line)).group_size == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("HloModule m", 1),  # XLA prints neither count when it is 1
        ("HloModule m, num_partitions=8", 8),
        ("HloModule m, is_scheduled=true, replica_count=2, num_partitions=4", 8),
    ],
)
def test_empty_replica_groups_mean_every_device(header, expected):
    line = "%ar = f32[8,128]{1,0} all-reduce(%p), replica_groups={}, to_apply=%add"
    summary = parse_collectives(module(line, header=header))
    assert summary.num_devices == expected
    assert summary.collectives[0].group_size == expected
    assert summary.unknown_group_sizes == ()


def test_empty_replica_groups_without_header_are_recorded_as_unknown():
    line = "%ar = f32[8,128]{1,0} all-reduce(%p), replica_groups={}, to_apply=%add"
    summary = parse_collectives(module(line, header=None))
    assert summary.num_devices is None
    assert summary.collectives[0].group_size == 1
    assert summary.unknown_group_sizes == ("ar",)
    assert summary.transferred_bytes() == 0


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ("{{0,1},{1,0}}", 2),
        ("{{0,1},{4,5},{1,2},{5,6},{2,3},{6,7},{3,0},{7,4}}", 8),  # CPU, jnp.roll
        ("{{0,0},{1,1}}", 1),  # every device keeps its own data
    ],
)
def test_collective_permute_group_from_source_target_pairs(pairs, expected):
    line = (
        f"%cp = f32[1,128]{{1,0}} collective-permute(%p), channel_id=1, source_target_pairs={pairs}"
    )
    collective = only(module(line))
    assert (collective.kind, collective.bytes, collective.group_size) == (
        "collective-permute",
        512,
        expected,
    )
    assert collective.transferred_bytes() == (512 if expected > 1 else 0)


def test_tuple_results_are_summed():
    text = module(
        f"%ar = (f32[4]{{0}}, bf16[8]{{0}}) all-reduce(%p, %p), {GROUP8}, to_apply=%add",
        "%s = f32[2,32]{1,0} slice(%p), slice={[0:2], [0:32]}",
        "%a2a = (f32[2,32]{1,0}, f32[2,32]{1,0}, f32[2,32]{1,0}, f32[2,32]{1,0}) "
        "all-to-all(%s, %s, %s, %s), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}",
        "%gte = f32[2,32]{1,0} get-tuple-element(%a2a), index=0",
    )
    assert [(c.kind, c.bytes) for c in parse_collectives(text).collectives] == [
        ("all-reduce", 32),
        ("all-to-all", 4 * 2 * 32 * 4),
    ]


# --- asynchronous forms -----------------------------------------------------


@pytest.mark.parametrize(
    ("start", "done", "kind", "expected"),
    [
        (
            f"%s = f32[8,128]{{1,0}} all-reduce-start(%p), channel_id=1, {GROUP8}, to_apply=%add",
            "%d = f32[8,128]{1,0} all-reduce-done(%s)",
            "all-reduce",
            4096,
        ),
        (  # variadic: the result is the tuple of outputs
            f"%s = (f32[4]{{0}}, f32[8]{{0}}) all-reduce-start(%p, %p), {GROUP8}, to_apply=%add",
            "%d = (f32[4]{0}, f32[8]{0}) all-reduce-done(%s)",
            "all-reduce",
            48,
        ),
        (  # wrapped by the generic async machinery: ((operands), output)
            f"%s = ((f32[8,128]{{1,0}}), f32[8,128]{{1,0}}) all-reduce-start(%p), {GROUP8}, "
            "to_apply=%add",
            "%d = f32[8,128]{1,0} all-reduce-done(%s)",
            "all-reduce",
            4096,
        ),
        (
            "%s = (f32[2,128]{1,0}, f32[8,128]{1,0}) all-gather-start(%p), channel_id=1, "
            "replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true",
            "%d = f32[8,128]{1,0} all-gather-done(%s)",
            "all-gather",
            4096,
        ),
        (
            "%s = (f32[8,128]{1,0}, f32[8,128]{1,0}, u32[], u32[]) collective-permute-start(%p),"
            " channel_id=1, source_target_pairs={{0,1},{1,0}}",
            "%d = f32[8,128]{1,0} collective-permute-done(%s)",
            "collective-permute",
            4096,
        ),
        (
            "%s = ((f32[8,128]{1,0}), f32[2,128]{1,0}) reduce-scatter-start(%p), channel_id=1, "
            "replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add",
            "%d = f32[2,128]{1,0} reduce-scatter-done(%s)",
            "reduce-scatter",
            1024,
        ),
        (
            "%s = ((f32[8,128]{1,0}), f32[8,128]{1,0}) all-to-all-start(%p), "
            "replica_groups=[2,4]<=[8], dimensions={0}",
            "%d = f32[8,128]{1,0} all-to-all-done(%s)",
            "all-to-all",
            4096,
        ),
    ],
)
def test_async_start_done_counts_once_with_the_output_bytes(start, done, kind, expected):
    collective = only(module(start, done))
    assert (collective.kind, collective.bytes, collective.name) == (kind, expected, "s")


def test_async_start_wrapper_counts_the_wrapped_collective_once():
    wrapped = """\
%wrapped_all_gather (q: f32[2,128]) -> f32[8,128] {
  %q = f32[2,128]{1,0} parameter(0)
  ROOT %ag = f32[8,128]{1,0} all-gather(%q), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}
}
"""
    text = module(
        "%s = f32[2,128]{1,0} slice(%p), slice={[0:2], [0:128]}",
        "%ags = ((f32[2,128]{1,0}), f32[8,128]{1,0}, s32[]) async-start(%s), "
        'calls=%wrapped_all_gather, async_execution_thread="main"',
        "%agu = ((f32[2,128]{1,0}), f32[8,128]{1,0}, s32[]) async-update(%ags), "
        "calls=%wrapped_all_gather",
        "ROOT %agd = f32[8,128]{1,0} async-done(%agu), calls=%wrapped_all_gather",
        computations=wrapped,
    )
    assert only(text) == Collective(
        kind="all-gather",
        bytes=4096,
        group_size=4,
        count=1,
        computation="wrapped_all_gather",
        name="ag",
    )


# --- call graph and loops ---------------------------------------------------


def loop_module(
    *, init=0, limit=5, step=1, direction="LT", swap=False, known=None, in_condition=False
):
    """ENTRY runs `for (i = init; i <direction> limit; i += step)` around an all-reduce."""
    compare = "%n, %j" if swap else "%j, %n"
    if swap:
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}[direction]
    cond_ar = f"  %car = f32[] all-reduce(%n), {GROUP8}, to_apply=%add\n" if in_condition else ""
    config = f', backend_config={{"known_trip_count":{{"n":"{known}"}}}}' if known else ""
    loops = f"""\
%body (a: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {{
  %a = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%a), index=0
  %x = f32[8,128]{{1,0}} get-tuple-element(%a), index=1
  %ar = f32[8,128]{{1,0}} all-reduce(%x), channel_id=1, {GROUP8}, to_apply=%add
  %step = s32[] constant({step})
  %next = s32[] add(%i, %step)
  ROOT %t = (s32[], f32[8,128]{{1,0}}) tuple(%next, %ar)
}}

%cond (b: (s32[], f32[8,128])) -> pred[] {{
  %b = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %j = s32[] get-tuple-element(%b), index=0
  %n = s32[] constant({limit})
{cond_ar}  ROOT %cmp = pred[] compare({compare}), direction={direction}
}}
"""
    return module(
        f"%init = s32[] constant({init})",
        "%tuple = (s32[], f32[8,128]{1,0}) tuple(%init, %p)",
        f"%while = (s32[], f32[8,128]{{1,0}}) while(%tuple), condition=%cond, body=%body{config}",
        "ROOT %out = f32[8,128]{1,0} get-tuple-element(%while), index=1",
        computations=loops,
    )


def test_known_trip_count_multiplies_the_body():
    summary = parse_collectives(loop_module(limit=99, known=12))
    assert [(c.computation, c.count) for c in summary.collectives] == [("body", 12)]
    assert summary.unknown_trip_counts == ()


def test_condition_runs_once_more_than_the_body():
    summary = parse_collectives(loop_module(known=5, in_condition=True))
    assert [(c.name, c.count) for c in summary.collectives] == [("ar", 5), ("car", 6)]


@pytest.mark.parametrize(
    ("init", "limit", "step", "direction", "swap", "trips"),
    [
        (0, 5, 1, "LT", False, 5),
        (0, 5, 1, "LT", True, 5),
        (2, 9, 1, "LT", False, 7),
        (0, 10, 3, "LT", False, 4),
        (0, 5, 1, "LE", False, 6),
        (10, 0, -2, "GT", False, 5),
        (10, 0, -2, "GE", True, 6),
    ],
)
def test_trip_count_derived_from_the_condition(init, limit, step, direction, swap, trips):
    text = loop_module(init=init, limit=limit, step=step, direction=direction, swap=swap)
    summary = parse_collectives(text)
    assert [c.count for c in summary.collectives] == [trips]
    assert summary.unknown_trip_counts == ()


def test_loop_that_never_runs_contributes_nothing():
    assert parse_collectives(loop_module(init=5, limit=5)).collectives == ()


def test_underivable_trip_count_counts_once_and_is_recorded():
    # Stepping away from the limit: not a counted loop this parser can size.
    summary = parse_collectives(loop_module(step=-1))
    assert [c.count for c in summary.collectives] == [1]
    assert summary.unknown_trip_counts == ("body",)


def _nested_loops(annotate, extra=""):
    """An outer loop of 4 trips (all-gather) around an inner one of 3 (all-reduce),
    each body also holding the line `extra` (which may use %x = f32[8,128])."""

    def config(n):
        return f', backend_config={{"known_trip_count":{{"n":"{n}"}}}}' if annotate else ""

    def loop(name, limit, inner):
        return f"""\
%{name}_cond (c: (s32[], f32[8,128])) -> pred[] {{
  %c = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant({limit})
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

%{name}_body (b: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {{
  %b = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %x = f32[8,128]{{1,0}} get-tuple-element(%b), index=1
  {extra}
{inner}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8,128]{{1,0}}) tuple(%next, %y)
}}
"""

    inner = loop("inner", 3, f"  %y = f32[8,128]{{1,0}} all-reduce(%x), {GROUP8}, to_apply=%add")
    outer = loop(
        "outer",
        4,
        f"""\
  %zero = s32[] constant(0)
  %start = (s32[], f32[8,128]{{1,0}}) tuple(%zero, %x)
  %w = (s32[], f32[8,128]{{1,0}}) while(%start), condition=%inner_cond, body=%inner_body{config(3)}
  %r = f32[8,128]{{1,0}} get-tuple-element(%w), index=1
  %s = f32[2,128]{{1,0}} slice(%r), slice={{[0:2], [0:128]}}
  %y = f32[8,128]{{1,0}} all-gather(%s), replica_groups=[2,4]<=[8], dimensions={{0}}""",
    )
    return module(
        "%zero = s32[] constant(0)",
        "%start = (s32[], f32[8,128]{1,0}) tuple(%zero, %p)",
        "%w = (s32[], f32[8,128]{1,0}) while(%start), condition=%outer_cond, "
        f"body=%outer_body{config(4)}",
        computations=inner + outer,
    )


@pytest.mark.parametrize("annotate", [True, False], ids=["known_trip_count", "derived"])
def test_nested_loops_multiply(annotate):
    summary = parse_collectives(_nested_loops(annotate))
    assert [(c.kind, c.computation, c.count) for c in summary.collectives] == [
        ("all-reduce", "inner_body", 12),
        ("all-gather", "outer_body", 4),
    ]
    assert summary.bytes_by_kind()["all-reduce"] == 12 * 4096
    assert summary.unknown_trip_counts == ()


@pytest.mark.parametrize(
    "branches",
    [
        "branch_computations={%b0, %b1}",
        "true_computation=%b0, false_computation=%b1",
    ],
)
def test_every_conditional_branch_is_counted(branches):
    computations = "".join(
        f"""\
%{name} (q: f32[8,128]) -> f32[8,128] {{
  %q = f32[8,128]{{1,0}} parameter(0)
  ROOT %{name}_ar = f32[8,128]{{1,0}} all-reduce(%q), {GROUP8}, to_apply=%add
}}
"""
        for name in ("b0", "b1")
    )
    text = module(
        "%pred = pred[] constant(true)",
        f"ROOT %c = f32[8,128]{{1,0}} conditional(%pred, %p, %p), {branches}",
        computations=computations,
    )
    assert [(c.name, c.count) for c in parse_collectives(text).collectives] == [
        ("b0_ar", 1),
        ("b1_ar", 1),
    ]


def test_calls_and_fusions_are_followed_and_uncalled_computations_ignored():
    computations = f"""\
%callee (q: f32[8,128]) -> f32[8,128] {{
  %q = f32[8,128]{{1,0}} parameter(0)
  ROOT %called_ar = f32[8,128]{{1,0}} all-reduce(%q), {GROUP8}, to_apply=%add
}}

%fused (r: f32[8,128]) -> f32[8,128] {{
  %r = f32[8,128]{{1,0}} parameter(0)
  ROOT %neg = f32[8,128]{{1,0}} negate(%r)
}}

%never_called (u: f32[8,128]) -> f32[8,128] {{
  %u = f32[8,128]{{1,0}} parameter(0)
  ROOT %dead_ar = f32[8,128]{{1,0}} all-reduce(%u), {GROUP8}, to_apply=%add
}}
"""
    text = module(
        "%c = f32[8,128]{1,0} call(%p), to_apply=%callee",
        "%f = f32[8,128]{1,0} fusion(%c), kind=kLoop, calls=%fused",
        computations=computations,
    )
    assert [(c.name, c.computation) for c in parse_collectives(text).collectives] == [
        ("called_ar", "callee")
    ]


def test_long_tuple_signatures_with_index_comments():
    # XLA marks every fifth tuple element with /*index=N*/, headers included.
    shape = ", ".join(["f32[4]"] * 5) + ", /*index=5*/f32[4]"
    text = f"""\
HloModule m, num_partitions=8

{ADD}
ENTRY %main (p: f32[4]) -> ({shape}) {{
  %p = f32[4]{{0}} parameter(0)
  ROOT %ar = ({shape}) all-reduce(%p, %p, %p, %p, %p, %p), {GROUP8}, to_apply=%add
}}
"""
    assert only(text).bytes == 6 * 16


def test_call_attributes_inside_strings_are_not_followed():
    # Undefined, so following it would raise.
    metadata = 'metadata={op_name="jit(f)/while body=%nowhere"}'
    line = f"%ar = f32[8,128]{{1,0}} all-reduce(%p), {GROUP8}, to_apply=%add, {metadata}"
    assert only(module(line)).count == 1


# --- matmul flops ------------------------------------------------------------


def cost(text):
    return parse_hlo(text)[1]


FUSED_DOT = """\
%fused_dot (param_0.1: f32[8,128], param_1.1: f32[128,32]) -> f32[8,32] {
  %param_0.1 = f32[8,128]{1,0} parameter(0)
  %param_1.1 = f32[128,32]{1,0} parameter(1)
  ROOT %dot_general.5 = f32[8,32]{1,0} dot(%param_0.1, %param_1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""  # noqa: E501  (CPU, jax 0.10.2: operands by name, shapes from the parameter lines)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (  # CPU: operands by name, shapes from the computation's own lines
            [
                "%w = f32[128,32]{1,0} parameter(1)",
                "%d = f32[8,32]{1,0} dot(%p, %w), lhs_contracting_dims={1}, "
                "rhs_contracting_dims={0}",
            ],
            2 * 8 * 32 * 128,
        ),
        (  # older printers: operands with their shapes inline, not defined here
            [
                "%d = f32[16,64]{1,0} dot(f32[16,32]{1,0} %a, f32[32,64]{1,0} %b), "
                "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
            ],
            2 * 16 * 64 * 32,
        ),
        (  # batch dims are in the result; only the contracting dims multiply
            [
                "%d = f32[4,16,8]{2,1,0} dot(f32[4,16,32]{2,1,0} %a, f32[4,32,8]{2,1,0} %b), "
                "lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, "
                "rhs_contracting_dims={1}"
            ],
            2 * 4 * 16 * 8 * 32,
        ),
        (  # two contracting dims
            [
                "%d = f32[8]{0} dot(f32[8,4,16]{2,1,0} %a, f32[4,16]{1,0} %b), "
                "lhs_contracting_dims={1,2}, rhs_contracting_dims={0,1}"
            ],
            2 * 8 * 4 * 16,
        ),
        (  # no contracting dims: an outer product
            ["%d = f32[4,8]{1,0} dot(f32[4]{0} %a, f32[8]{0} %b)"],
            2 * 4 * 8,
        ),
        (  # a bounded dynamic dim counts at its bound
            [
                "%d = f32[<=8,32]{1,0} dot(f32[<=8,128]{1,0} %a, f32[128,32]{1,0} %b), "
                "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
            ],
            2 * 8 * 32 * 128,
        ),
        (  # a fusion's calls= is followed to the dot inside
            [
                "%w = f32[128,32]{1,0} parameter(1)",
                "%f = f32[8,32]{1,0} fusion(%p, %w), kind=kCustom, calls=%fused_dot",
            ],
            2 * 8 * 32 * 128,
        ),
    ],
)
def test_dot_flops(lines, expected):
    hlo = cost(module(*lines, computations=FUSED_DOT))
    assert (hlo.dot_flops, hlo.dot_flops_once, hlo.loop_factor) == (expected, expected, 1.0)
    assert hlo.unknown_ops == ()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (  # CPU, jax 0.10.2, conv_general_dilated(feature_group_count=2)
            "%c = f32[2,16,16,4]{3,2,1,0} convolution(f32[2,16,16,8]{3,2,1,0} %x, "
            "f32[3,3,4,4]{3,2,1,0} %k), window={size=3x3 pad=1_1x1_1}, "
            "dim_labels=b01f_01io->b01f, feature_group_count=2",
            # kernel 3x3 times 8 input features / 2 groups, per output element
            2 * (2 * 16 * 16 * 4) * (3 * 3 * 4),
        ),
        (  # NCHW / OIHW labels: the kernel's "o" dim is the one left out
            "%c = f32[2,4,14,14]{3,2,1,0} convolution(f32[2,8,16,16]{3,2,1,0} %x, "
            "f32[4,8,3,3]{3,2,1,0} %k), window={size=3x3}, dim_labels=bf01_oi01->bf01",
            2 * (2 * 4 * 14 * 14) * (8 * 3 * 3),
        ),
    ],
)
def test_convolution_flops(line, expected):
    hlo = cost(module(line))
    assert (hlo.dot_flops, hlo.unknown_ops) == (expected, ())


GEMM_CONFIG = (
    'backend_config={"operation_queue_id":"0","wait_on_operation_queues":[],'
    '"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":'
    '{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],'
    '"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"alpha_imag":0,'
    '"precision_config":{"operand_precision":["DEFAULT","DEFAULT"]},"epilogue":"DEFAULT"}}'
)


@pytest.mark.parametrize("target", ["__cublas$gemm", "__cublas$lt$matmul"])
def test_cublas_gemm_custom_calls_count_like_dots(target):
    # GPU text (XLA's gemm rewriter): the result tuple holds the output, then
    # a workspace; the dot dimensions live in the backend config.
    text = module(
        "%w = f32[128,16]{1,0} parameter(1)",
        f"%g = (f32[8,16]{{1,0}}, s8[4194304]{{0}}) custom-call(%p, %w), "
        f'custom_call_target="{target}", {GEMM_CONFIG}',
        '%s = f32[8,8]{1,0} custom-call(%p), custom_call_target="__cublas$triangularSolve"',
    )
    assert cost(text).dot_flops == 2 * 8 * 16 * 128


def _dot_loop(trips, annotate=True):
    """ENTRY runs a loop of `trips` whose body calls FUSED_DOT, with a dot in ENTRY too."""
    config = f', backend_config={{"known_trip_count":{{"n":"{trips}"}}}}' if annotate else ""
    state = "(s32[], f32[8,128]{1,0}, f32[128,32]{1,0})"
    loops = f"""\
%body (a: (s32[], f32[8,128], f32[128,32])) -> (s32[], f32[8,128], f32[128,32]) {{
  %a = {state} parameter(0)
  %i = s32[] get-tuple-element(%a), index=0
  %x = f32[8,128]{{1,0}} get-tuple-element(%a), index=1
  %w = f32[128,32]{{1,0}} get-tuple-element(%a), index=2
  %f = f32[8,32]{{1,0}} fusion(%x, %w), kind=kCustom, calls=%fused_dot
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = {state} tuple(%next, %x, %w)
}}

%cond (b: (s32[], f32[8,128], f32[128,32])) -> pred[] {{
  %b = {state} parameter(0)
  %j = s32[] get-tuple-element(%b), index=0
  %n = s32[] constant({trips})
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}}
"""
    return module(
        "%w0 = f32[128,32]{1,0} parameter(1)",
        "%outside = f32[8,32]{1,0} dot(%p, %w0), lhs_contracting_dims={1}, "
        "rhs_contracting_dims={0}",
        "%zero = s32[] constant(0)",
        f"%tuple = {state} tuple(%zero, %p, %w0)",
        f"%while = {state} while(%tuple), condition=%cond, body=%body{config}",
        computations=FUSED_DOT + loops,
    )


DOT = 2 * 8 * 32 * 128  # flops of FUSED_DOT, and of the dot beside the loop


@pytest.mark.parametrize("annotate", [True, False], ids=["known_trip_count", "derived"])
def test_dot_in_a_fusion_in_a_loop_body_counts_every_trip(annotate):
    hlo = cost(_dot_loop(5, annotate))
    assert hlo.dot_flops == DOT + 5 * DOT
    assert hlo.dot_flops_once == DOT + DOT
    assert hlo.loop_factor == 3.0


def test_loop_that_never_runs_has_no_flops_but_xla_counts_it_once():
    hlo = cost(_dot_loop(0))
    assert (hlo.dot_flops, hlo.dot_flops_once, hlo.loop_factor) == (DOT, 2 * DOT, 0.5)


@pytest.mark.parametrize("annotate", [True, False], ids=["known_trip_count", "derived"])
def test_nested_loops_multiply_flops(annotate):
    dot = "%d = f32[8,8]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={1}"
    hlo = cost(_nested_loops(annotate, extra=dot))
    assert hlo.dot_flops == (12 + 4) * 2 * 8 * 8 * 128  # inner 3 x 4 trips, outer 4
    assert hlo.dot_flops_once == 2 * 2 * 8 * 8 * 128


def test_every_conditional_branch_and_call_is_counted():
    branches = "".join(
        f"""\
%{name} (q: f32[8,128]) -> f32[8,8] {{
  %q = f32[8,128]{{1,0}} parameter(0)
  ROOT %{name}_dot = f32[8,8]{{1,0}} dot(%q, %q), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}
}}
"""  # noqa: E501
        for name in ("b0", "b1")
    )
    text = module(
        "%pred = pred[] constant(true)",
        "%c = f32[8,8]{1,0} conditional(%pred, %p, %p), branch_computations={%b0, %b1}",
        "%call = f32[8,8]{1,0} call(%p), to_apply=%b0",
        computations=branches,
    )
    assert cost(text).dot_flops == 3 * 2 * 8 * 8 * 128


@pytest.mark.parametrize(
    "line",
    [
        "%d = f32[8,32]{1,0} dot(%nowhere, %p), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "%d = f32[?,32]{1,0} dot(f32[?,128]{1,0} %a, f32[128,32]{1,0} %b), "
        "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "%d = f32[8,32]{1,0} dot(%p, %p), lhs_contracting_dims={5}, rhs_contracting_dims={0}",
        "%d = f32[2,14,14,4]{3,2,1,0} convolution(f32[2,16,16,8]{3,2,1,0} %x, "
        "f32[3,3,8,4]{3,2,1,0} %k), window={size=3x3}",
    ],
    ids=["undefined operand", "dynamic dim", "contracting dim out of range", "no dim_labels"],
)
def test_unknown_operands_are_skipped_and_recorded(line):
    hlo = cost(
        module(
            line,
            "%e = f32[8,8]{1,0} dot(%p, %p), lhs_contracting_dims={1}, rhs_contracting_dims={1}",
        )
    )
    assert hlo.dot_flops == 2 * 8 * 8 * 128  # the readable one still counts
    assert hlo.unknown_ops == ("d",)


def test_parse_hlo_gives_the_collectives_of_parse_collectives():
    text = _nested_loops(True)
    assert parse_hlo(text)[0] == parse_collectives(text)


def test_hlo_cost_checks_its_fields():
    assert HloCost().loop_factor == 1.0
    assert HloCost(unknown_ops=["a"]).unknown_ops == ("a",)
    with pytest.raises(ValueError, match=r"dot_flops=-1\.0 must be a number >= 0"):
        HloCost(dot_flops=-1.0)
    with pytest.raises(ValueError, match="bytes_accessed_once=nan"):
        HloCost(bytes_accessed_once=float("nan"))


# --- bytes accessed ---------------------------------------------------------

SLICING = """\
%take_row (param_0: f32[8,128], param_1: s32[]) -> f32[128] {
  %param_0 = f32[8,128]{1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %ds = f32[1,128]{1,0} dynamic-slice(%param_0, %param_1, %zero), dynamic_slice_sizes={1,128}
  ROOT %row = f32[128]{0} bitcast(%ds)
}

%put_row (param_0: f32[8,128], param_1: f32[128], param_2: s32[]) -> f32[8,128] {
  %param_0 = f32[8,128]{1,0} parameter(0)
  %param_1 = f32[128]{0} parameter(1)
  %param_2 = s32[] parameter(2)
  %zero = s32[] constant(0)
  %b = f32[1,128]{1,0} bitcast(%param_1)
  ROOT %dus = f32[8,128]{1,0} dynamic-update-slice(%param_0, %b, %param_2, %zero)
}

%put_row_and_negate (a: f32[8,128], b: f32[128], c: s32[]) -> (f32[8,128], f32[128]) {
  %param_0 = f32[8,128]{1,0} parameter(0)
  %param_1 = f32[128]{0} parameter(1)
  %param_2 = s32[] parameter(2)
  %zero = s32[] constant(0)
  %b = f32[1,128]{1,0} bitcast(%param_1)
  %dus = f32[8,128]{1,0} dynamic-update-slice(%param_0, %b, %param_2, %zero)
  %n = f32[128]{0} negate(%param_1)
  ROOT %t = (f32[8,128]{1,0}, f32[128]{0}) tuple(%dus, %n)
}

%negate_taken_row (a: f32[8,128], b: s32[]) -> f32[128] {
  %param_0 = f32[8,128]{1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %row = f32[128]{0} fusion(%param_0, %param_1), kind=kLoop, calls=%take_row
  ROOT %n = f32[128]{0} negate(%row)
}
"""


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("%n = f32[8,128]{1,0} negate(%p)", 2 * 4096),
        ("%s = f32[2,128]{1,0} slice(%p), slice={[0:2], [0:128]}", 2 * 1024),
        (
            "%i = s32[] parameter(1)\n  %r = f32[128]{0} fusion(%p, %i), kind=kLoop, "
            "calls=%take_row",
            512 + 512 + 4,
        ),  # reads the row it takes, writes it
        (
            "%i = s32[] parameter(1)\n  %v = f32[128]{0} parameter(2)\n  "
            "%u = f32[8,128]{1,0} fusion(%p, %v, %i), kind=kLoop, calls=%put_row",
            512 + 512 + 4,
        ),  # updates the buffer in place: the row in, the row out
        (
            # A matmul fusion of a scan's body takes its layer's weights out of
            # the stacked ones through a fusion nested in its own (libtpu's):
            # the row it slices, not the whole operand.
            "%i = s32[] parameter(1)\n  %r = f32[128]{0} fusion(%p, %i), kind=kOutput, "
            "calls=%negate_taken_row",
            512 + 512 + 4,
        ),
        (
            # As a scan saves a layer's activation in its stacked buffer beside
            # another output (libtpu's multi-output fusions do): the row in,
            # the row and its negation out, the buffer updated in place.
            "%i = s32[] parameter(1)\n  %v = f32[128]{0} parameter(2)\n  "
            "%u = (f32[8,128]{1,0}, f32[128]{0}) fusion(%p, %v, %i), kind=kLoop, "
            "calls=%put_row_and_negate",
            512 + 512 + 512 + 4,
        ),
        (
            # The same fusion, asynchronous, as jax 0.11's GPU compiler runs a
            # scan's slices: its shape is ((operands), result, context).
            "%i = s32[] parameter(1)\n  %r = ((f32[8,128]{1,0}, s32[]), f32[128]{0}, u32[]) "
            "fusion-start(%p, %i), kind=kLoop, calls=%take_row\n  "
            "%d = f32[128]{0} fusion-done(%r)",
            512 + 512 + 4,
        ),
        (
            "%i = s32[] parameter(1)\n  %v = f32[128]{0} parameter(2)\n  "
            "%u = ((f32[8,128]{1,0}, f32[128]{0}, s32[]), f32[8,128]{1,0}, u32[]) "
            "fusion-start(%p, %v, %i), kind=kLoop, calls=%put_row\n  "
            "%d = f32[8,128]{1,0} fusion-done(%u)",
            512 + 512 + 4,
        ),
        (
            # The TPU compiler's asynchronous slice, printed as libtpu does.
            "%s = ((f32[8,128]{1,0:T(8,128)}), f32[2,128]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) "
            "slice-start(%p), slice={[0:2], [0:128]}\n  "
            "%d = f32[2,128]{1,0:T(8,128)S(1)} slice-done(%s)",
            2 * 1024,
        ),
        (
            "%c = (f32[8,128]{1,0:S(1)}, f32[8,128]{1,0}, u32[]{:S(2)}) copy-start(%p)\n  "
            "%d = f32[8,128]{1,0:S(1)} copy-done(%c)",
            2 * 4096,
        ),
        (
            # One operand, not a tuple of them: (operand, result, context...).
            "%c = (f32[8,128]{1,0}, f32[8,128]{1,0}, u32[], u32[]) collective-permute-start(%p), "
            "source_target_pairs={{0,1},{1,0}}\n  "
            "%d = f32[8,128]{1,0} collective-permute-done(%c)",
            2 * 4096,
        ),
        (
            "%g = (f32[8,128]{1,0}, f32[32,128]{1,0}) all-gather-start(%p), "
            "replica_groups={{0,1,2,3}}, dimensions={0}\n  "
            "%d = f32[32,128]{1,0} all-gather-done(%g)",
            4096 + 4 * 4096,
        ),
        (
            "%t = (f32[8,128]{1,0}, f32[8,128]{1,0}) tuple(%p, %p)\n  "
            "%g = f32[8,128]{1,0} get-tuple-element(%t), index=0\n  "
            "%b = f32[128,8]{0,1} bitcast(%g)",
            0,
        ),
    ],
    ids=["elementwise", "slice", "dynamic-slice fusion", "in-place update fusion",
         "slice in a nested fusion", "in-place update in a multi-output fusion",
         "async dynamic-slice fusion", "async in-place update fusion", "async slice",
         "async copy", "async collective-permute", "async all-gather", "plumbing"],
)
def test_bytes_accessed_per_instruction(line, expected):
    hlo = cost(module(line, computations=SLICING))
    assert hlo.bytes_accessed == hlo.bytes_accessed_once == expected


def test_kernels_hold_each_scheduled_instructions_flops_and_bytes_per_step():
    hlo = cost(_dot_loop(5))
    fusion = 4096 + 16384 + 1024  # reads x and w, writes the product
    kernels = sorted(((k.flops, k.bytes) for k in hlo.kernels),
                     key=lambda k: (-sum(f for _, f in k[0]), -k[1]))
    # The fusion in the body, 5 trips; the dot beside the loop; then the
    # counter's add (5 trips) and the condition's compare (6 runs), no flops.
    assert kernels == [((("f32", 5 * DOT),), 5 * fusion), ((("f32", DOT),), fusion),
                       ((), 5 * 3 * 4), ((), 6 * (2 * 4 + 1))]
    assert sum(f for k in hlo.kernels for _, f in k.flops) == hlo.dot_flops
    assert sum(k.bytes for k in hlo.kernels) == hlo.bytes_accessed
    # Every array in device memory: nothing in another memory space.
    assert all(k.spaces == () for k in hlo.kernels)
    assert sorted(k.opcode for k in hlo.kernels) == ["add", "compare", "dot", "fusion"]


def test_kernel_table_names_each_kernel_in_the_order_and_with_the_figures_of_kernels():
    from shardsearch.cost.hlo import kernel_table

    text = _dot_loop(5)
    table = kernel_table(text)
    assert [(k.flops, k.bytes, k.spaces, k.opcode) for k in table] == list(cost(text).kernels)
    # Named as a profile lists them: the loop body's fusion runs 5 times.
    fusion = next(k for k in table if k.opcode == "fusion")
    assert fusion.count == 5 and fusion.flops == (("f32", 5 * DOT),)
    assert next(k for k in table if k.opcode == "dot").count == 1
    assert f"%{fusion.name} = " in text


def test_bytes_accessed_counts_loop_trips_and_not_fused_bodies():
    hlo = cost(_dot_loop(5))
    fusion = 4096 + 16384 + 1024  # reads x and w, writes the product
    body = fusion + 3 * 4  # and the s32 counter's add
    condition = 2 * 4 + 1  # compares two s32, writes a pred
    outside = 4096 + 16384 + 1024  # the dot beside the loop
    assert hlo.bytes_accessed_once == outside + body + condition
    assert hlo.bytes_accessed == outside + 5 * body + 6 * condition


# --- errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("HloModule m\n\n" + ADD, "exactly one ENTRY"),
        (module("%c = f32[8,128]{1,0} call(%p), to_apply=%missing"), "'missing'.*not define"),
        (module("%x = f32[8,128]{1,0} negate(%p)").rstrip().removesuffix("}"), "not closed"),
        (
            module("%ar = f32[4]{0} all-reduce(%p), replica_groups=<8>, to_apply=%add"),
            "unrecognised replica_groups",
        ),
        (
            module(
                "%ar = f32[4]{0} all-reduce(%p), replica_groups=mesh['a'=8] {'b'}, to_apply=%add"
            ),
            "axis 'b' is not in the mesh",
        ),
        (module("%ar = f32[?]{0} all-reduce(%p), replica_groups={}, to_apply=%add"), "dim '\\?'"),
    ],
)
def test_malformed_text_raises(text, match):
    with pytest.raises(ValueError, match=match):
        parse_collectives(text)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "all-sum"}, "'all-sum' is not one of"),
        ({"bytes": -1}, "bytes=-1 is negative"),
        ({"count": -2}, "count=-2 is negative"),
        ({"group_size": 0}, "group_size=0 must be >= 1"),
    ],
)
def test_collective_checks_its_fields(kwargs, match):
    fields = dict(kind="all-reduce", bytes=4, group_size=2, count=1, computation="c") | kwargs
    with pytest.raises(ValueError, match=match):
        Collective(**fields)


def test_summary_rejects_non_collectives():
    with pytest.raises(TypeError, match=r"collectives\[0\] is a dict"):
        CollectiveSummary(collectives=({"kind": "all-reduce"},))


# --- summary arithmetic -----------------------------------------------------


def test_bytes_by_kind_has_every_kind_in_fixed_order():
    summary = CollectiveSummary(
        collectives=(
            Collective("collective-permute", 100, 2, 3, "c"),
            Collective("all-reduce", 10, 4, 2, "c"),
            Collective("all-reduce", 1, 4, 1, "c"),
        )
    )
    assert list(summary.bytes_by_kind().items()) == [
        ("all-reduce", 21),
        ("all-gather", 0),
        ("reduce-scatter", 0),
        ("all-to-all", 0),
        ("collective-permute", 300),
    ]
    assert tuple(summary.bytes_by_kind()) == COLLECTIVE_KINDS
    assert summary.total_bytes == 321


@pytest.mark.parametrize(
    ("kind", "n", "size", "count", "expected"),
    [
        ("all-reduce", 4, 4096, 1, 2 * 3 / 4 * 4096),
        ("all-gather", 4, 4096, 2, 2 * 3 / 4 * 4096),
        ("reduce-scatter", 4, 1024, 1, 3 * 1024),
        ("all-to-all", 8, 1024, 1, 7 / 8 * 1024),
        ("collective-permute", 2, 512, 3, 3 * 512),
        ("all-reduce", 1, 4096, 5, 0),
        ("reduce-scatter", 1, 4096, 5, 0),
    ],
)
def test_transferred_bytes_ring_factors(kind, n, size, count, expected):
    collective = Collective(kind, size, n, count, "c")
    assert collective.transferred_bytes() == pytest.approx(expected)
    assert CollectiveSummary((collective, collective)).transferred_bytes() == pytest.approx(
        2 * expected
    )


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_is_reduce_scatter_then_all_gather(n):
    # The ring all-reduce is exactly those two phases; the factors must agree.
    full = 1024 * n
    all_reduce = Collective("all-reduce", full, n, 1, "c").transferred_bytes()
    scatter = Collective("reduce-scatter", full // n, n, 1, "c").transferred_bytes()
    gather = Collective("all-gather", full, n, 1, "c").transferred_bytes()
    assert all_reduce == pytest.approx(scatter + gather)


# --- real compiled text on 8 simulated CPU devices --------------------------


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def compiled_text(mesh, f, in_specs, out_spec, *shapes):
    def sharding(spec):
        return NamedSharding(mesh, spec)

    jitted = jax.jit(
        f, in_shardings=tuple(map(sharding, in_specs)), out_shardings=sharding(out_spec)
    )
    args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    return jitted.lower(*args).compile().as_text()


def strip_trip_counts(text):
    return re.sub(r',?"known_trip_count":\{"n":"\d+"\}', "", text)


def _scan_matmul(length):
    def f(x, w):
        return lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=length)[0]

    return f


def test_real_contracting_dim_matmul_all_reduces(mesh):
    text = compiled_text(
        mesh, jnp.matmul, (P(None, "tp"), P("tp", None)), P(), (16, 128), (128, 64)
    )
    summary = parse_collectives(text)
    (collective,) = summary.collectives
    assert (collective.kind, collective.bytes, collective.group_size, collective.count) == (
        "all-reduce",
        16 * 64 * 4,
        4,
        1,
    )
    assert summary.num_devices == 8
    assert summary.transferred_bytes() == pytest.approx(2 * 3 / 4 * 16 * 64 * 4)


@pytest.mark.parametrize("strip", [False, True], ids=["known_trip_count", "derived"])
def test_real_scan_counts_every_step(mesh, strip):
    text = compiled_text(
        mesh, _scan_matmul(5), (P(None, "tp"), P("tp", None)), P(None, "tp"), (16, 128), (128, 128)
    )
    assert '"known_trip_count":{"n":"5"}' in text
    summary = parse_collectives(strip_trip_counts(text) if strip else text)
    (collective,) = summary.collectives
    assert (collective.kind, collective.bytes, collective.count) == ("all-reduce", 16 * 128 * 4, 5)
    assert summary.bytes_by_kind()["all-reduce"] == 5 * 16 * 128 * 4
    assert summary.unknown_trip_counts == ()


@pytest.mark.parametrize("strip", [False, True], ids=["known_trip_count", "derived"])
def test_real_nested_scans_multiply(mesh, strip):
    def f(x, w):
        def outer(c, _):
            return _scan_matmul(3)(c, w) @ w, None

        return lax.scan(outer, x, None, length=4)[0]

    text = compiled_text(
        mesh, f, (P(None, "tp"), P("tp", None)), P(None, "tp"), (16, 128), (128, 128)
    )
    summary = parse_collectives(strip_trip_counts(text) if strip else text)
    assert sorted(c.count for c in summary.collectives) == [4, 12]


def test_real_replicated_output_all_gathers(mesh):
    text = compiled_text(mesh, lambda x: x * 2, (P("dp", "tp"),), P(), (16, 128))
    summary = parse_collectives(text)
    assert {c.kind for c in summary.collectives} == {"all-gather"}
    # However XLA splits the gather, the last one yields the whole array.
    assert max(c.bytes for c in summary.collectives) == 16 * 128 * 4
    assert all(c.group_size in (2, 4, 8) for c in summary.collectives)


def test_real_shard_map_collectives(mesh):
    def body(block):  # block: f32[8,32] per device
        block = lax.ppermute(block, "tp", [(i, (i + 1) % 4) for i in range(4)])
        block = lax.psum(block, "dp")
        block = lax.all_gather(block, "tp", tiled=True)  # f32[32,32]
        block = lax.psum_scatter(block, "tp", tiled=True)  # f32[8,32]
        return lax.all_to_all(block, "tp", 0, 1, tiled=True)  # f32[2,128]

    def f(x):
        return jax.shard_map(body, mesh=mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp"))(x)

    summary = parse_collectives(compiled_text(mesh, f, (P("dp", "tp"),), P("dp", "tp"), (16, 128)))
    got = {c.kind: (c.bytes, c.group_size, c.count) for c in summary.collectives}
    assert got == {
        "collective-permute": (8 * 32 * 4, 8, 1),
        "all-reduce": (8 * 32 * 4, 2, 1),
        "all-gather": (32 * 32 * 4, 4, 1),
        "reduce-scatter": (8 * 32 * 4, 4, 1),
        "all-to-all": (2 * 128 * 4, 4, 1),
    }


def test_real_roll_collective_permutes(mesh):
    text = compiled_text(mesh, lambda x: jnp.roll(x, 1, axis=0), (P("tp"),), P("tp"), (16, 128))
    (collective,) = parse_collectives(text).collectives
    assert (collective.kind, collective.bytes) == ("collective-permute", 128 * 4)


def test_real_data_dependent_while_is_counted_once_and_recorded(mesh):
    def f(x, w):
        def cond(carry):
            return carry[1] < carry[0].sum()

        def step(carry):
            return jnp.tanh(carry[0] @ w), carry[1] + 1

        return lax.while_loop(cond, step, (x, 0.0))[0]

    text = compiled_text(
        mesh, f, (P(None, "tp"), P("tp", None)), P(None, "tp"), (16, 128), (128, 128)
    )
    summary = parse_collectives(text)
    assert len(summary.unknown_trip_counts) == 1
    assert summary.collectives and all(c.count == 1 for c in summary.collectives)


# --- matmul flops and bytes of real compiled text ---------------------------


def compile_cpu(f, *shapes, in_shardings=None):
    args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    jitted = jax.jit(f) if in_shardings is None else jax.jit(f, in_shardings=in_shardings)
    compiled = jitted.lower(*args).compile()
    analysis = compiled.cost_analysis()
    _, hlo = parse_hlo(compiled.as_text())
    return hlo, analysis["flops"], analysis["bytes accessed"]


def test_real_matmul_flops_equal_xla_count():
    hlo, flops, bytes_accessed = compile_cpu(lambda a: a @ a, (128, 128))
    assert hlo.dot_flops == hlo.dot_flops_once == flops == 2 * 128**3
    assert hlo.bytes_accessed == hlo.bytes_accessed_once == bytes_accessed
    assert loop_aware(flops, bytes_accessed, hlo) == (flops, bytes_accessed)


def test_real_scan_flops_count_every_step_where_xla_counts_one():
    def f(x):
        return lax.scan(lambda c, _: (c @ x, None), x, None, length=5)[0]

    hlo, flops, bytes_accessed = compile_cpu(f, (128, 128))
    assert flops == pytest.approx(2 * 128**3, rel=1e-5)  # XLA: the body once
    assert hlo.dot_flops == 5 * 2 * 128**3
    assert hlo.dot_flops_once == 2 * 128**3
    assert hlo.loop_factor == 5.0
    assert hlo.bytes_accessed_once == pytest.approx(bytes_accessed, rel=1e-3)
    # Each of the 4 trips XLA leaves out reads two f32[128,128] and writes one.
    assert hlo.bytes_accessed - hlo.bytes_accessed_once >= 4 * 3 * 128 * 128 * 4
    total_flops, total_bytes = loop_aware(flops, bytes_accessed, hlo)
    assert total_flops == pytest.approx(5 * 2 * 128**3, rel=1e-5)
    assert total_bytes == pytest.approx(hlo.bytes_accessed, rel=1e-3)


@pytest.mark.parametrize(
    ("lhs", "rhs", "all_reduce_flops"),
    [
        (P("dp", "tp"), P("tp", None), 64 * 128),  # partial sums, added up after
        (P("dp", None), P(None, "tp"), 0),
    ],
    ids=["contracting dim split", "output split"],
)
def test_real_sharded_matmul_flops_are_per_device(mesh24, lhs, rhs, all_reduce_flops):
    shardings = (NamedSharding(mesh24, lhs), NamedSharding(mesh24, rhs))
    hlo, flops, _ = compile_cpu(jnp.matmul, (128, 128), (128, 128), in_shardings=shardings)
    assert hlo.dot_flops == 2 * 128**3 / 8
    assert flops == hlo.dot_flops + all_reduce_flops


@pytest.mark.parametrize(
    ("f", "shapes", "dot_flops"),
    [
        (lambda x: jax.nn.softmax(x, -1), [(128, 128)], 0),
        (
            lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "VALID"),
            [(2, 8, 16, 16), (4, 8, 3, 3)],
            2 * (2 * 4 * 14 * 14) * (8 * 3 * 3),
        ),
        (
            lambda x, y: jnp.einsum("bij,bjk->bik", x, y),
            [(4, 16, 32), (4, 32, 8)],
            2 * 4 * 16 * 8 * 32,
        ),
    ],
    ids=["softmax", "convolution", "batched matmul"],
)
def test_real_flops_and_bytes_match_xla_without_loops(f, shapes, dot_flops):
    hlo, flops, bytes_accessed = compile_cpu(f, *shapes)
    assert hlo.bytes_accessed == hlo.bytes_accessed_once == bytes_accessed
    assert hlo.dot_flops == hlo.dot_flops_once == dot_flops
    if dot_flops:  # matmuls alone: XLA counts exactly these flops
        assert flops == dot_flops


def test_real_scanned_training_step_counts_what_unrolling_counts():
    def step(unroll):
        def loss(ws, x):
            return lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws, unroll=unroll)[0].sum()

        return lambda ws, x: ws - 0.1 * jax.grad(loss)(ws, x)

    shapes = ((4, 64, 64), (16, 64))
    scanned, flops, bytes_accessed = compile_cpu(step(1), *shapes)
    unrolled, unrolled_flops, _ = compile_cpu(step(True), *shapes)
    assert unrolled.loop_factor == 1.0
    # Forward 4 matmuls, backward 4 weight gradients and 3 input gradients:
    # the scan also computes the first layer's input gradient, unused.
    assert unrolled.dot_flops == 11 * 2 * 16 * 64 * 64
    assert scanned.dot_flops == 12 * 2 * 16 * 64 * 64
    assert flops < unrolled_flops / 3  # XLA counts one layer of the scan
    total, _ = loop_aware(flops, bytes_accessed, scanned)
    assert total == pytest.approx(unrolled_flops, rel=0.1)


# --- TPU convolutions, fast and slow line reading ------------------------------


def _pairs_brute_force(out, kernel, inputs, stride, pad_low, lhs_dilate, rhs_dilate):
    """Every (output, kernel) pair visited, as XLA's GetConvolutionFlops does."""
    pairs = 0
    for o in range(out):
        for k in range(kernel):
            index = o * stride - pad_low + k * rhs_dilate
            if index < 0 or index % lhs_dilate:
                continue
            if inputs is None or index // lhs_dilate < inputs:
                pairs += 1
    return pairs


def test_window_pairs_match_visiting_every_pair():
    import random

    from shardsearch.cost.hlo import _window_pairs

    rng = random.Random(0)
    for _ in range(3000):
        args = (rng.randint(1, 12), rng.randint(1, 6), rng.choice([None, *range(1, 12)]),
                rng.randint(1, 5), rng.randint(-3, 8), rng.randint(1, 9), rng.randint(1, 3))
        assert _window_pairs(*args) == _pairs_brute_force(*args), args


# Lines from libtpu 0.0.42.1's compiled text of gpt:tiny and a scanned Llama
# (v5e 2x2): batched matmuls written as convolutions over dilated batch dims.
# Each expected count is 2 x the multiply-adds of the einsum it computes.
@pytest.mark.parametrize(
    ("lhs", "rhs", "line", "expected"),
    [
        (  # bqkgd,bskd->bkgqs, batch 4 as a dilated spatial dim, groups 2
            "bf16[4,32,2,16]", "bf16[4,2,32,32]",
            "%c = bf16[4,2,16,32]{3,2,1,0:T(8,128)(2,1)S(1)} convolution(%a, %b), "
            "window={size=4x2 stride=3x1 lhs_dilate=4x2}, dim_labels=0f1b_01oi->01bf",
            2 * 4 * 2 * 16 * 32 * 32,
        ),
        (  # a group dim of 2 over an input of 1, padded 1_1
            "bf16[8,32,32,1]", "bf16[2,16,32,1]",
            "%c = bf16[8,32,2,16]{1,3,2,0:T(8,128)(2,1)S(1)} convolution(%a, %b), "
            "window={size=1x2 pad=0_0x1_1 rhs_reversal=0x1}, dim_labels=0bf1_1oi0->0b1f",
            2 * 8 * 32 * 2 * 16 * 32,
        ),
        (  # a dim of 2 as size 2, stride 2, padded 1_1: one position in two
            "bf16[2,32,2,16,1]", "bf16[2,2,32,32,2]",
            "%c = bf16[2,2,32,2,16]{2,4,3,1,0:T(8,128)(2,1)} convolution(%a, %b), "
            "window={size=2x2x2 stride=2x2x1 pad=1_1x1_1x1_1 rhs_reversal=1x1x1}, "
            "dim_labels=0f1b2_01io2->01f2b",
            2 * 2 * 2 * 32 * 2 * 16 * 32,
        ),
        (  # a weight gradient: the 4 tokens are the window
            "f32[4,128,64]", "f32[4,128,32]",
            "%c = f32[64,32,1]{0,1,2:T(8,128)} convolution(%a, %b), window={size=4}, "
            "dim_labels=0fb_0io->bf0",
            2 * 64 * 32 * 4 * 128,
        ),
    ],
    ids=["dilated batch", "padded group", "strided pad", "weight gradient"],
)
def test_tpu_batched_matmul_convolutions(lhs, rhs, line, expected):
    hlo = cost(module(f"%a = {lhs} parameter(1)", f"%b = {rhs} parameter(2)", line))
    assert (hlo.dot_flops, hlo.unknown_ops) == (expected, ())


@pytest.mark.parametrize(
    "line",
    [
        "%r = f32[8,128]{1,0} add(%p, %p), metadata={op_name=\"a(b)\"}",
        "ROOT %r = f32[8,128]{1,0} add(%p, %p)",
        "%r = f32[8,128]{1,0} add(f32[8,128]{1,0} %p, f32[8,128]{1,0} %p)",
        "%r = (f32[8,128]{1,0}, s32[]) tuple(%p, %c)",
        "%r = f32[8,128]{1,0} add(%p, /*x*/%p), /*y*/ sharding={replicated}",
        "%r = s32[]{:T(128)} constant(3)",
        "%r = f32[8,128]{1,0:T(8,128)} all-reduce(%p), replica_groups={}, to_apply=%add",
        "%r = f32[8,128]{1,0} add(%p,%p),,  metadata={}",
    ],
    ids=["quoted parens", "root", "inline shapes", "tuple", "comments", "tiled scalar",
         "callee", "tight commas"],
)
def test_lines_read_alike_by_the_regex_and_bracket_by_bracket(line):
    from shardsearch.cost.hlo_graph import _INSTRUCTION, _parse_instruction, parse_module

    text = module("%c = s32[] constant(1)", line)
    parsed = parse_module(text).computations["main"].instructions["r"]
    stripped = line.strip()
    match = _INSTRUCTION.match(stripped)
    assert parsed == _parse_instruction(match["name"], stripped[match.end() :], stripped)


def test_a_wrapped_instruction_is_read_whole():
    from shardsearch.cost.hlo_graph import parse_module

    text = module("%r = f32[8,128]{1,0} add(%p,", "    %p), metadata={}")
    instruction = parse_module(text).computations["main"].instructions["r"]
    assert (instruction.operands, instruction.attrs) == (("p", "p"), "metadata={}")


@pytest.mark.parametrize(
    ("calls", "match"),
    [((("b", 1), ("a", 1)), "sorted by target"), ((("a", -1),), r"calls >= 0")],
)
def test_hlo_cost_checks_its_custom_calls(calls, match):
    with pytest.raises(ValueError, match=match):
        HloCost(custom_calls_once=calls)


def test_kernels_keep_the_bytes_of_arrays_placed_in_another_memory_space_apart():
    from shardsearch.cost.hlo import kernel_table

    # As the TPU compiler prints it: the copy writes into memory space 1
    # ("S(1)"), the negate reads from there and writes to device memory, and
    # the add reads both spaces.
    text = module("%c = f32[8,128]{1,0:T(8,128)S(1)} copy(%p)",
                  "%n = f32[8,128]{1,0} negate(%c)",
                  "ROOT %s = f32[8,128]{1,0} add(%n, %c)")
    array = 8 * 128 * 4
    by_opcode = {k.opcode: k for k in cost(text).kernels}
    assert by_opcode["copy"].bytes == 2 * array and by_opcode["copy"].spaces == ((1, array),)
    assert by_opcode["negate"].spaces == ((1, array),)
    assert by_opcode["add"].bytes == 3 * array and by_opcode["add"].spaces == ((1, array),)
    # The totals are as before: where the bytes sit changes only their split.
    assert cost(text).bytes_accessed == cost(text.replace("S(1)", "")).bytes_accessed
    assert {k.name: k.spaces for k in kernel_table(text)} == {
        "c": ((1, array),), "n": ((1, array),), "s": ((1, array),)}
    # A kernel all of whose arrays sit in the space: all its bytes are there.
    inside = module("%c = f32[8,128]{1,0:S(1)} copy(%p)",
                    "%n = f32[8,128]{1,0:S(1)} negate(%c)",
                    "ROOT %s = f32[8,128]{1,0} copy(%n)")
    negate = next(k for k in cost(inside).kernels if k.opcode == "negate")
    assert negate.spaces == ((1, negate.bytes),) and negate.bytes == 2 * array


def test_a_fusion_reading_two_memory_spaces_splits_its_bytes_by_space():
    from shardsearch.cost.hlo import kernel_table

    # The fusion reads one operand from memory space 1 and one from space 2
    # and writes to device memory: its bytes split three ways, and a kernel
    # that reads only one of them (the add) has that space alone.
    fused = ("%fused (a: f32[2,128], b: f32[2,128]) -> f32[2,128] {\n"
             "  %a = f32[2,128]{1,0:S(1)} parameter(0)\n"
             "  %b = f32[2,128]{1,0:S(2)} parameter(1)\n"
             "  ROOT %m = f32[2,128]{1,0} multiply(%a, %b)\n}\n")
    text = module("%c = f32[2,128]{1,0:S(1)} slice(%p), slice={[0:2], [0:128]}",
                  "%d = f32[2,128]{1,0:S(2)} slice(%p), slice={[2:4], [0:128]}",
                  "%f = f32[2,128]{1,0} fusion(%c, %d), kind=kLoop, calls=%fused",
                  "%g = f32[2,128]{1,0} add(%f, %d)",
                  "ROOT %r = f32[8,128]{1,0} copy(%p)", computations=fused)
    quarter = 2 * 128 * 4
    kernels = {k.name: k for k in kernel_table(text)}
    assert kernels["f"].bytes == 3 * quarter
    assert kernels["f"].spaces == ((1, quarter), (2, quarter))
    assert kernels["g"].spaces == ((2, quarter),)
    assert [k.spaces for k in cost(text).kernels] == [k.spaces for k in kernels.values()]


def test_a_slice_reads_from_the_space_its_operand_is_in():
    from shardsearch.cost.hlo import kernel_table

    # %c sits in memory space 1. The fusion slices a quarter out of it (its
    # parameter's layout says S(1); the slice's own shape carries no space)
    # and writes to device memory; the plain slice %s does the same unfused;
    # %t slices device memory into space 1. Each reads from where its operand
    # is and writes where its result is.
    fused = ("%fused (a: f32[8,128]) -> f32[2,128] {\n"
             "  %a = f32[8,128]{1,0:T(8,128)S(1)} parameter(0)\n"
             "  %q = f32[2,128]{1,0} slice(%a), slice={[0:2], [0:128]}\n"
             "  ROOT %n = f32[2,128]{1,0} negate(%q)\n}\n")
    text = module("%c = f32[8,128]{1,0:T(8,128)S(1)} copy(%p)",
                  "%f = f32[2,128]{1,0} fusion(%c), kind=kLoop, calls=%fused",
                  "%s = f32[2,128]{1,0} slice(%c), slice={[2:4], [0:128]}",
                  "%t = f32[2,128]{1,0:S(1)} slice(%p), slice={[4:6], [0:128]}",
                  "ROOT %r = f32[2,128]{1,0} add(%f, %s)", computations=fused)
    quarter = 2 * 128 * 4
    kernels = {k.name: k for k in kernel_table(text)}
    for name in ("f", "s", "t"):
        assert kernels[name].bytes == 2 * quarter, name
        assert kernels[name].spaces == ((1, quarter),), name
    # In device memory throughout, nothing is in space 1, and the totals agree.
    flat = {k.name: k for k in kernel_table(text.replace("S(1)", ""))}
    assert all(not k.spaces for k in flat.values())
    assert [k.bytes for k in flat.values()] == [k.bytes for k in kernels.values()]


def test_kernel_costs_are_built_from_plain_pairs_too():
    hlo = HloCost(kernels=(((("bf16", 2.0),), 3),))
    assert hlo.kernels == (KernelCost((("bf16", 2.0),), 3.0, (), ""),)
    assert hlo.kernels[0].bytes == 3.0 and isinstance(hlo.kernels[0].bytes, float)
