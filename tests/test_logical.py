"""Logical axes discovered from a step's jaxpr (`shardsearch.logical`).

Every test traces only (`jax.make_jaxpr`); nothing is compiled.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest
from child_env import child_env
from jax.extend import core as jcore

import shardsearch as ss
from shardsearch.logical.axes import LogicalAxes
from shardsearch.logical.discover import discover_logical_axes
from shardsearch.logical.primitives import reshape_groups
from shardsearch.workloads import _gpt, _registry, get_workload

f32 = jnp.float32


@pytest.fixture(scope="module", params=["gpt:tiny", "llama:tiny"])
def dense(request):
    w = get_workload(request.param)
    return w, discover_logical_axes(w.step, w.abstract())


def _names(axes: LogicalAxes, path: str, argument: int = 0) -> tuple:
    return axes.leaves(argument)[path].names


def test_front_exports_the_discovery():
    assert ss.discover_logical_axes is discover_logical_axes
    assert ss.LogicalAxes is LogicalAxes


def test_attention_projections_share_the_heads_axis(dense):
    w, axes = dense
    for layer in range(w.dims["n_layers"]):
        p = f"params/layers/{layer}/attn"
        heads = {_names(axes, f"{p}/{m}")[1] for m in ("wq", "wk", "wv")}
        assert heads == {_names(axes, f"{p}/wo")[0]} == {"heads"}
    # GQA ties query heads to KV heads; the axis counts the KV heads (NOTES).
    assert axes.axis("heads").size == w.dims["n_kv_heads"]
    assert axes.axis("heads").role == "heads"


def test_mlp_up_and_gate_share_an_axis_with_down(dense):
    w, axes = dense
    ups = ["w_up", "w_gate"] if w.name.startswith("llama") else ["w_up"]
    for layer in range(w.dims["n_layers"]):
        p = f"params/layers/{layer}/mlp"
        assert {_names(axes, f"{p}/{m}")[1] for m in ups} == {_names(axes, f"{p}/w_down")[0]}
    assert axes.axis("mlp").size == w.dims["d_ff"]


def test_untied_embedding_and_head_have_two_vocab_axes_joined_by_the_residual(dense):
    # NOTES: the lookup is driven by `tokens`, the loss by a one-hot of the
    # separate `targets`: no dataflow joins the two vocab dims.
    w, axes = dense
    table, head = _names(axes, "params/embed/tokens"), _names(axes, "params/head")
    assert (table[0], head[1]) == ("vocab", "vocab_2")
    assert axes.axis("vocab").role == axes.axis("vocab_2").role == "vocab"
    assert table[1] == head[0] == _names(axes, "params/ln_f/scale")[0] == "embed"
    assert axes.axis("vocab").size == w.dims["vocab"]


def test_parameters_and_their_adam_moments_share_axes(dense):
    _, axes = dense
    state = axes.leaves(0)
    params = {p: leaf for p, leaf in state.items() if p.startswith("params/")}
    assert len(params) > 10
    for path, leaf in params.items():
        rest = path.removeprefix("params/")
        assert state[f"opt/mu/{rest}"].names == leaf.names, path
        assert state[f"opt/nu/{rest}"].names == leaf.names, path
    assert state["opt/count"].names == ()


def test_batch_dim_of_the_inputs_is_one_axis_named_batch(dense):
    w, axes = dense
    batch = axes.leaves(1)
    assert {leaf.names for leaf in batch.values()} == {("batch", "seq")}
    assert axes.axis("batch").size == w.dims["batch"]
    assert axes.axis("seq").size == w.dims["seq"]


def test_unrolled_layers_fold_into_one_axis_per_role(dense):
    _, axes = dense
    state = axes.leaves(0)
    for path, leaf in state.items():
        if "/layers/1/" in path:
            assert state[path.replace("/layers/1/", "/layers/0/")].names == leaf.names
    # One axis per role, whatever the depth.
    assert sorted(a.name for a in axes.axes) == sorted(
        ["batch", "seq", "embed", "vocab", "vocab_2", "heads", "mlp"])
    assert axes.merges == ()
    assert axes.unhandled == ()


def test_moe_stacked_experts_are_their_own_axis():
    w = get_workload("moe:tiny")
    axes = discover_logical_axes(w.step, w.abstract())
    for layer in range(w.dims["n_layers"]):
        p = f"params/layers/{layer}/moe"
        assert {_names(axes, f"{p}/{m}")[0] for m in ("w_gate", "w_up", "w_down")} == {"experts"}
        assert _names(axes, f"{p}/router") == ("embed", "experts")
        assert _names(axes, f"{p}/w_gate")[1:] == ("embed", "mlp")
        assert _names(axes, f"{p}/w_down")[1:] == ("mlp", "embed")
    assert (axes.axis("experts").size, axes.axis("experts").role) == (w.dims["n_experts"],
                                                                       "experts")
    assert axes.axis("experts").name != axes.axis("heads").name


def test_per_head_weights_name_heads_and_head_dim_not_experts():
    # Flax-style DenseGeneral weights keep heads as their own dim; only a
    # weight that a dot_general batches over (stacked experts) is "experts".
    def loss(p, batch):
        x = jnp.take(p["emb"], batch["tokens"], axis=0)
        q, k, v = (jnp.einsum("bsd,dhk->bshk", x, p[n]) for n in ("wq", "wk", "wv"))
        s = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q, k), -1)
        y = jnp.einsum("bqhk,hkd->bqd", jnp.einsum("bhqs,bshk->bqhk", s, v), p["wo"])
        onehot = jax.nn.one_hot(batch["targets"], 100)
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(y @ p["emb"].T) * onehot, -1))

    def sd(*shape):
        return jax.ShapeDtypeStruct(shape, f32)

    state = {"emb": sd(100, 32), "wq": sd(32, 4, 8), "wk": sd(32, 4, 8), "wv": sd(32, 4, 8),
             "wo": sd(4, 8, 32)}
    batch = {"tokens": jax.ShapeDtypeStruct((8, 16), jnp.int32),
             "targets": jax.ShapeDtypeStruct((8, 16), jnp.int32)}
    axes = discover_logical_axes(lambda s, b: jax.grad(loss)(s, b), (state, batch))
    leaves = axes.leaves(0)
    assert leaves["wq"].names == leaves["wk"].names == ("embed", "heads", "head_dim")
    assert leaves["wv"].names[:2] == ("embed", "heads")
    assert leaves["wo"].names == ("heads", leaves["wv"].names[2], "embed")
    # Tied embedding: the lookup and the output head share one vocab axis.
    assert leaves["emb"].names == ("vocab", "embed")
    assert "experts" not in axes.sizes


def test_scan_stacked_layers_are_one_layers_axis():
    cfg = dataclasses.replace(_registry._PRESETS["gpt"][1]["tiny"], stacked=True, remat=True)
    w = _gpt.build("gpt:tiny", cfg)
    axes = discover_logical_axes(w.step, w.abstract())
    assert _names(axes, "params/layers/attn/wq") == ("layers", "embed", "heads")
    assert _names(axes, "params/layers/attn/wo") == ("layers", "heads", "embed")
    assert _names(axes, "params/layers/mlp/w_up") == ("layers", "embed", "mlp")
    assert _names(axes, "opt/mu/layers/mlp/w_down") == ("layers", "mlp", "embed")
    assert (axes.axis("layers").size, axes.axis("layers").role) == (2, "layers")
    assert axes.leaves(1)["tokens"].names == ("batch", "seq")


def test_size_one_dims_get_none_and_non_array_leaves_get_nothing():
    def step(state, batch):
        scale = state["scale"] if state["mode"] == "scale" else 1.0
        h = batch["x"] * state["bias"] * scale * state["lr"]
        return state, {"loss": jnp.sum(h @ state["w"])}

    state = {"w": jax.ShapeDtypeStruct((64, 32), f32), "bias": jax.ShapeDtypeStruct((1, 64), f32),
             "scale": jax.ShapeDtypeStruct((), f32), "mode": "scale", "lr": 0.1}
    batch = {"x": jax.ShapeDtypeStruct((16, 64), f32)}
    axes = discover_logical_axes(step, (state, batch))
    leaves = axes.leaves(0)
    assert leaves["mode"].shape is None and leaves["mode"].names == ()
    assert leaves["lr"].names == () and leaves["scale"].names == ()
    bias, w, x = leaves["bias"].names, leaves["w"].names, axes.leaves(1)["x"].names
    # The size-1 dim of bias broadcasts against the batch: it joins nothing.
    assert bias[0] is None and bias[1] == w[0] == x[1]
    assert x[0] == "batch" and axes.axis("batch").size == 16


@pytest.mark.slow  # three fresh processes, each importing jax
def test_names_and_order_do_not_depend_on_the_hash_seed():
    code = ("import json; from shardsearch.workloads import get_workload; "
            "from shardsearch.logical.discover import discover_logical_axes; "
            "w = get_workload('gpt:tiny'); "
            "print(json.dumps(discover_logical_axes(w.step, w.abstract()).to_json()))")
    # The three processes run side by side; each spends its time importing jax.
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=child_env(PYTHONHASHSEED=seed))
             for seed in ("0", "1", "2")]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out)
    assert outputs[0] == outputs[1] == outputs[2]
    w = get_workload("gpt:tiny")
    here = discover_logical_axes(w.step, w.abstract()).to_json()
    assert json.loads(outputs[0]) == json.loads(json.dumps(here))


class AdamState(NamedTuple):
    count: jax.Array
    mu: dict
    nu: dict


def _user_mlp():
    """A 2-layer MLP over a list of layer dicts, with a NamedTuple Adam state,
    written with jax only."""
    sizes = [(32, 48), (48, 10)]
    params = {"layers": [{"w": jax.ShapeDtypeStruct(s, f32),
                          "b": jax.ShapeDtypeStruct((s[1],), f32)} for s in sizes]}
    zeros = jax.tree.map(lambda x: x, params)
    state = {"params": params,
             "opt": AdamState(jax.ShapeDtypeStruct((), jnp.int32), zeros, zeros)}
    batch = {"x": jax.ShapeDtypeStruct((16, 32), f32), "y": jax.ShapeDtypeStruct((16,), jnp.int32)}

    def loss(params, batch):
        h = batch["x"]
        for i, layer in enumerate(params["layers"]):
            h = h @ layer["w"] + layer["b"]
            h = jax.nn.relu(h) if i == 0 else h
        logp = jax.nn.log_softmax(h)
        return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], axis=1))

    def step(state, batch):
        value, grads = jax.value_and_grad(loss)(state["params"], batch)
        opt = state["opt"]
        mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt.mu, grads)
        nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt.nu, grads)
        params = jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8),
                              state["params"], mu, nu)
        return {"params": params, "opt": AdamState(opt.count + 1, mu, nu)}, {"loss": value}

    return step, state, batch


def test_user_step_with_nested_lists_and_a_namedtuple_state():
    step, state, batch = _user_mlp()
    axes = discover_logical_axes(step, (state, batch))
    leaves = axes.leaves(0)
    for path in ("layers/0/w", "layers/0/b", "layers/1/w", "layers/1/b"):
        names = leaves[f"params/{path}"].names
        assert leaves[f"opt/mu/{path}"].names == leaves[f"opt/nu/{path}"].names == names
    w0, w1 = leaves["params/layers/0/w"].names, leaves["params/layers/1/w"].names
    assert w0[1] == w1[0] == leaves["params/layers/0/b"].names[0]
    assert len({w0[0], w0[1], w1[1]}) == 3  # input, hidden, classes stay apart
    assert axes.leaves(1)["x"].names[0] == axes.leaves(1)["y"].names[0] == "batch"
    assert axes.leaves(1)["x"].names[1] == w0[0]
    assert leaves["opt/count"].names == ()
    assert LogicalAxes.from_json(json.loads(json.dumps(axes.to_json()))) == axes


def test_a_flatten_of_two_argument_axes_is_recorded():
    def step(state, batch):
        x = batch["x"]  # [batch, seq, features]
        h = x.reshape(-1, x.shape[-1]) @ state["w"]
        return state, {"loss": jnp.sum(h)}

    state = {"w": jax.ShapeDtypeStruct((64, 128), f32)}
    batch = {"x": jax.ShapeDtypeStruct((8, 32, 64), f32)}
    axes = discover_logical_axes(step, (state, batch))
    assert axes.leaves(1)["x"].names == ("batch", "seq", axes.leaves(0)["w"].names[0])
    assert len(axes.merges) == 1
    assert "batch (8) x seq (32)" in axes.merges[0] and "carries batch" in axes.merges[0]


_unknown = jcore.Primitive("test_unknown_op")
_unknown.def_abstract_eval(lambda x: jax.core.ShapedArray((*x.shape[:-1], 3), x.dtype))
_unknown_same = jcore.Primitive("test_unknown_same_shape_op")
_unknown_same.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))


def test_unhandled_primitive_is_listed_and_couples_nothing():
    def step(state, batch):
        y = _unknown.bind(batch["x"] @ state["w"])  # [16, 64] -> [16, 3]
        z = _unknown_same.bind(batch["x"])          # same shape: elementwise
        return state, {"loss": jnp.sum(y @ state["v"]) + jnp.sum(z * state["u"])}

    state = {"w": jax.ShapeDtypeStruct((32, 64), f32), "v": jax.ShapeDtypeStruct((3, 24), f32),
             "u": jax.ShapeDtypeStruct((16, 32), f32)}
    batch = {"x": jax.ShapeDtypeStruct((16, 32), f32)}
    axes = discover_logical_axes(step, (state, batch))
    # Both are listed: the same-shape one is taken as elementwise, a guess.
    assert axes.unhandled == ("test_unknown_op", "test_unknown_same_shape_op")
    assert axes.notes()[0].startswith("unhandled: primitives with no coupling rule: "
                                      "test_unknown_op, test_unknown_same_shape_op")
    leaves = axes.leaves(0)
    # The batch dim does not flow through the unknown op to v.
    assert "batch" not in leaves["v"].names
    assert leaves["u"].names == axes.leaves(1)["x"].names
    assert "unhandled primitives" in axes.describe()


def test_control_flow_maps_through_bodies():
    def step(state, batch):
        x = batch["x"]

        def body(carry):
            i, h = carry
            return i + 1, jnp.tanh(h @ state["w"])

        _, x = jax.lax.while_loop(lambda c: c[0] < 2, body, (0, x))
        x = jax.lax.cond(jnp.sum(x) > 0, lambda h: h * state["g"], lambda h: -h, x)
        x = jax.checkpoint(lambda h: h @ state["u"])(x)
        return state, {"loss": jnp.sum(x)}

    state = {"w": jax.ShapeDtypeStruct((24, 24), f32), "g": jax.ShapeDtypeStruct((24,), f32),
             "u": jax.ShapeDtypeStruct((24, 40), f32)}
    batch = {"x": jax.ShapeDtypeStruct((16, 24), f32)}
    axes = discover_logical_axes(step, (state, batch))
    leaves = axes.leaves(0)
    features = axes.leaves(1)["x"].names[1]
    # The loop carries x, so h @ w ties w's output dim to its input dim; the
    # one leaf carrying one axis twice is reported, not hidden.
    assert leaves["w"].names == (features, features)
    assert any("'w': dims 0 and 1 both carry" in m for m in axes.merges)
    assert leaves["g"].names == (features,)
    assert leaves["u"].names[0] == features and leaves["u"].names[1] not in (features, "batch")
    assert axes.unhandled == ()


def test_arguments_must_be_a_tuple_or_list():
    with pytest.raises(TypeError, match=r"tuple or list, got dict; pass \(state, batch\)"):
        discover_logical_axes(lambda s: s, {"w": jnp.ones(3)})


def test_concrete_arrays_are_traced_abstractly():
    w = get_workload("mlp:tiny")
    state, batch = w.init(0)
    assert (discover_logical_axes(w.step, (state, batch))
            == discover_logical_axes(w.step, w.abstract()))


def test_describe_lists_each_axis_with_its_size_role_and_leaf_count():
    w = get_workload("gpt:tiny")
    text = discover_logical_axes(w.step, w.abstract()).describe()
    lines = text.splitlines()
    heads = next(line for line in lines if line.startswith("heads "))
    assert heads.split() == ["heads", "size", "4", "role", "heads", "24", "leaves"]
    assert len(lines) == 7


@pytest.mark.parametrize(("a", "b", "groups"), [
    ((8, 32, 64), (8, 32, 4, 1, 16), [([0], [0]), ([1], [1]), ([2], [2, 3, 4])]),
    ((8, 32, 4, 16), (8, 32, 64), [([0], [0]), ([1], [1]), ([2, 3], [2])]),
    ((8, 32, 1), (8, 32), [([0], [0]), ([1], [1])]),
    ((1, 8), (8,), [([0, 1], [0])]),
    ((6, 4), (4, 6), [([0, 1], [0, 1])]),
    ((2, 3, 4), (24,), [([0, 1, 2], [0])]),
])
def test_reshape_groups(a, b, groups):
    assert reshape_groups(a, b) == groups


def test_a_scans_consts_and_carries_are_read_in_either_jax_spelling():
    # jax 0.11 replaced a scan's num_consts / num_carry with a tree of its
    # inputs (ft_in: consts, carry, xs); on jax 0.11.2 (a real H200 machine)
    # reading num_consts raised KeyError and the memory prediction was off.
    from shardsearch.logical.walk import scan_counts

    w = jnp.ones((3, 4, 4), f32)

    def f(w, x):
        return jax.lax.scan(lambda c, wi: (c @ wi * w[0, 0, 0], None), x, w)[0]

    jaxpr = jax.make_jaxpr(f)(w, jnp.ones((4, 4), f32)).jaxpr
    eqn = next(e for e in jaxpr.eqns if e.primitive.name == "scan")
    found = scan_counts(eqn.params)
    inputs = len(eqn.invars)

    class Inputs:  # the 0.11 form: a tree of three groups of inputs
        def __init__(self, consts: int, carry: int) -> None:
            self.groups = ([None] * consts, [None] * carry, [None] * (inputs - consts - carry))

        def unpack(self):
            return self.groups

    newer = {k: v for k, v in eqn.params.items() if k not in ("num_consts", "num_carry")}
    assert scan_counts(dict(newer, ft_in=Inputs(*found))) == found
    assert found[1] == 1 and found[0] >= 1  # the carry x; w closed over as a const
