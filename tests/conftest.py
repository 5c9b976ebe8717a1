"""Test setup: 8 simulated CPU devices, asked for before JAX starts its backend."""

import jax

jax.config.update("jax_num_cpu_devices", 8)

import pytest  # noqa: E402

import shardsearch as ss  # noqa: E402

MESH_SHAPES = {
    "8": ((8,), ("x",)),
    "2x4": ((2, 4), ("dp", "tp")),
    "1x8": ((1, 8), ("a", "b")),
    "2x2x2": ((2, 2, 2), ("a", "b", "c")),
}


@pytest.fixture(params=list(MESH_SHAPES), ids=list(MESH_SHAPES))
def any_mesh(request):
    """Each of the four standard test meshes in turn."""
    dims, names = MESH_SHAPES[request.param]
    return ss.create_mesh(dims, names)


@pytest.fixture
def mesh24():
    return ss.create_mesh((2, 4), ("dp", "tp"))
