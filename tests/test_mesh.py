"""Meshes: building, parsing, the in-context mesh, simulated CPU devices."""

import os
import subprocess
import sys
import textwrap

import jax
import pytest
from jax.sharding import AbstractMesh, AxisType, Mesh

import shardsearch as ss


@pytest.mark.parametrize("dims, names, sizes", [
    ((8,), ("x",), (8,)),
    ((2, 4), ("dp", "tp"), (2, 4)),
    ((1, 8), ("a", "b"), (1, 8)),
    ((2, 2, 2), ("a", "b", "c"), (2, 2, 2)),
    ((2, -1), ("dp", "tp"), (2, 4)),
    ((-1, 2, 2), ("a", "b", "c"), (2, 2, 2)),
    ((-1,), ("x",), (8,)),
], ids=str)
def test_create_mesh(dims, names, sizes):
    mesh = ss.create_mesh(dims, names)
    assert isinstance(mesh, Mesh)
    assert mesh.axis_names == names
    assert mesh.axis_sizes == sizes
    assert mesh.axis_types == (AxisType.Auto,) * len(names)
    assert mesh.devices.size == 8


def test_create_mesh_on_some_devices():
    mesh = ss.create_mesh((2, 2), ("dp", "tp"), devices=jax.devices()[:4])
    assert mesh.axis_sizes == (2, 2)
    assert set(mesh.devices.flat) == set(jax.devices()[:4])


@pytest.mark.parametrize("dims, names, match", [
    ((3, 2), ("dp", "tp"), r"axis sizes \{'dp': 3, 'tp': 2\} multiply to 6 but there are 8 "
                           "devices; make the product 8"),
    ((4, 4), ("dp", "tp"), "multiply to 16 but there are 8 devices"),
    ((-1, -1), ("dp", "tp"), r"axis_dims=\(-1, -1\) has more than one -1"),
    ((3, -1), ("dp", "tp"), "use 3 devices, which does not divide the 8 available"),
    ((0, 8), ("dp", "tp"), r"axis sizes must be positive \(or -1 once\), got \(0, 8\)"),
    ((-2, 4), ("dp", "tp"), "axis sizes must be positive"),
    ((2, 4), ("dp",), r"2 axis sizes \(2, 4\) but 1 axis names \('dp',\)"),
    ((2, 4), ("dp", "dp"), "axis 'dp' is listed twice"),
    ((8,), ("",), "axis name '' must be a non-empty string"),
], ids=str)
def test_create_mesh_errors(dims, names, match):
    with pytest.raises(ValueError, match=match):
        ss.create_mesh(dims, names)


def test_abstract_mesh():
    mesh = ss.abstract_mesh((16, 16), ("dp", "tp"))
    assert isinstance(mesh, AbstractMesh)
    assert mesh.axis_names == ("dp", "tp")
    assert mesh.axis_sizes == (16, 16)
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)


@pytest.mark.parametrize("dims, names, match", [
    ((16, 0), ("dp", "tp"), "need one positive size per name"),
    ((16,), ("dp", "tp"), "need one positive size per name"),
    ((-1, 4), ("dp", "tp"), "need one positive size per name"),
    ((4, 4), ("dp", "dp"), "listed twice"),
], ids=str)
def test_abstract_mesh_errors(dims, names, match):
    with pytest.raises(ValueError, match=match):
        ss.abstract_mesh(dims, names)


@pytest.mark.parametrize("text, expected", [
    ("dp=2,tp=4", ((2, 4), ("dp", "tp"))),
    (" dp = 2 , tp=-1 ", ((2, -1), ("dp", "tp"))),
    ("x=8", ((8,), ("x",))),
    ("fsdp=2,sp=2,tp=2", ((2, 2, 2), ("fsdp", "sp", "tp"))),
    ("data_1=1,model=8", ((1, 8), ("data_1", "model"))),
], ids=str)
def test_parse_mesh(text, expected):
    assert ss.parse_mesh(text) == expected


def test_parse_mesh_feeds_create_mesh():
    mesh = ss.create_mesh(*ss.parse_mesh("dp=2,tp=-1"))
    assert dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True)) == {"dp": 2, "tp": 4}


@pytest.mark.parametrize("text, match", [
    ("dp=2,tp", r"mesh 'dp=2,tp': part 'tp' is not name=size"),
    ("dp=x", r"mesh 'dp=x': size 'x' of axis 'dp' is not an integer"),
    ("", r"mesh '' is empty; write it as name=size pairs"),
    ("   ", "is empty"),
    ("dp=2,dp=4", r"axis 'dp' is listed twice"),
    ("dp=0", r"axis 'dp' has size 0; sizes are positive"),
    ("dp=-2", r"axis 'dp' has size -2"),
    ("dp=-1,tp=-1", "more than one axis has size -1"),
    ("dp=2,,tp=4", r"part '' is not name=size"),
    ("=2", r"part '=2' is not name=size"),
    ("dp=", r"part 'dp=' is not name=size"),
    ("2dp=2", r"axis name '2dp' is not an identifier"),
    ("dp=2.5", r"size '2.5' of axis 'dp' is not an integer"),
], ids=repr)
def test_parse_mesh_errors(text, match):
    with pytest.raises(ValueError, match=match):
        ss.parse_mesh(text)


def test_parse_mesh_rejects_non_strings():
    with pytest.raises(ValueError, match="is empty"):
        ss.parse_mesh(None)


# --------------------------------------------------------------------------
# use_cpu_devices
# --------------------------------------------------------------------------

def test_use_cpu_devices_after_start_with_the_same_count_is_fine():
    jax.devices()  # make sure the backend is up
    ss.use_cpu_devices(8)
    assert jax.device_count() == 8


def test_use_cpu_devices_after_start_with_another_count_fails():
    jax.devices()  # make sure the backend is up, so nothing can change any more
    with pytest.raises(RuntimeError, match=(
            r"asked for 4 simulated CPU devices but JAX already runs with 8.*"
            r"XLA_FLAGS=--xla_force_host_platform_device_count=4")):
        ss.use_cpu_devices(4)
    assert jax.device_count() == 8


@pytest.mark.parametrize("n", [0, -1, True, 2.0, "8"], ids=repr)
def test_use_cpu_devices_bad_count(n):
    with pytest.raises(ValueError, match="n must be a positive integer"):
        ss.use_cpu_devices(n)


def test_use_cpu_devices_before_start_sets_the_count():
    script = textwrap.dedent("""
        import shardsearch as ss
        ss.use_cpu_devices(4)
        import jax
        print(jax.device_count())
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4"


# --------------------------------------------------------------------------
# get_incontext_mesh
# --------------------------------------------------------------------------

def test_no_mesh_is_an_error_that_says_how():
    with pytest.raises(RuntimeError, match=r"no mesh is set: pass mesh=\.\.\. explicitly.*"
                                           r"jax\.set_mesh"):
        ss.get_incontext_mesh()


def test_set_mesh_is_found(mesh24):
    with jax.set_mesh(mesh24):
        assert ss.get_incontext_mesh() is mesh24
    with pytest.raises(RuntimeError):
        ss.get_incontext_mesh()


def test_legacy_with_mesh_is_found(mesh24):
    with pytest.warns(DeprecationWarning, match="with mesh"), mesh24:
        found = ss.get_incontext_mesh()
        rule_spec = ss.AutoShardingRule().apply(jax.ShapeDtypeStruct((16, 8), "float32"))
    assert found == mesh24
    assert rule_spec == jax.sharding.PartitionSpec("dp", "tp")


def test_abstract_context_mesh_is_found():
    am = ss.abstract_mesh((16, 16), ("dp", "tp"))
    with jax.sharding.use_abstract_mesh(am):
        assert ss.get_incontext_mesh() == am


def test_innermost_mesh_wins(mesh24, any_mesh):
    with jax.set_mesh(mesh24), jax.set_mesh(any_mesh):
        assert ss.get_incontext_mesh() is any_mesh
