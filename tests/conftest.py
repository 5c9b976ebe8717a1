"""Test setup: 8 simulated CPU devices, asked for before JAX starts its backend,
and one JAX compilation cache for the whole session."""

import atexit
import importlib.metadata
import os
import shutil
import tempfile

# The tests run on simulated CPU devices even where libtpu or the CUDA plugin
# is installed (the `tpu` and `cuda` extras): those compile for their chips
# deviceless (`shardsearch.target_mesh`) beside the CPU devices. The
# environment carries the choice to the subprocesses the tests start.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The tests assert behaviour, never speed, so XLA:CPU compiles them cheaply:
# LLVM at -O0 and the legacy fusion emitters take about a third of the
# default's compile time on the tiny workloads (docs/testing.md). The flags
# replace any XLA_FLAGS of the shell (a --xla_force_host_platform_device_count
# there would fight jax_num_cpu_devices below), and the processes the tests
# start inherit them (`child_env.child_env`).
# jax 0.11's XLA has only the new emitters and aborts on the flag.
_JAXLIB = tuple(int(p) for p in importlib.metadata.version("jaxlib").split(".")[:2])
os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0" + (
    " --xla_cpu_use_fusion_emitters=false" if _JAXLIB < (0, 11) else "")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import pytest  # noqa: E402

import shardsearch as ss  # noqa: E402
from shardsearch.search.study.storage import use_compile_cache  # noqa: E402

# The persistent compilation cache, as `shardsearch optimize` turns it on (the
# same threshold: compiles over 0.5 s), in a folder of this session's own. The
# same candidate compiled by several tests (and by their workers, which copy
# this process's cache folder) is compiled once. The first in-process CLI
# search would otherwise turn the process-wide cache on midway through the
# session, in its own temporary folder, so that whether a test compiles or
# reads from disk depended on whether it ran before or after that one.
# Under pytest-xdist the processes of one run share the folder, so a candidate
# one compiled is read from disk by the other (JAX writes an entry in place: a
# half-written one is a warning and a recompile, see pyproject's filterwarnings):
# the first process (the controller) makes it, its workers inherit the
# variable, and the controller removes it at the end.
_COMPILE_CACHE = os.environ.get("SHARDSEARCH_TESTS_JAX_CACHE", "")
if not (os.environ.get("PYTEST_XDIST_WORKER") and os.path.isdir(_COMPILE_CACHE)):
    _COMPILE_CACHE = tempfile.mkdtemp(prefix="shardsearch-tests-jax-cache-")
    os.environ["SHARDSEARCH_TESTS_JAX_CACHE"] = _COMPILE_CACHE
    atexit.register(shutil.rmtree, _COMPILE_CACHE, True)
use_compile_cache(_COMPILE_CACHE)

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


def pytest_itemcollected(item):
    """Under `--dist loadgroup`, the tests of a module that use its
    module-scoped fixtures (a whole suite run or search, for some) run in one
    process, which builds each once; a test already in a group
    (`pgserver.ONE_PROCESS`) keeps it. Marked as each test is collected,
    before pytest-xdist reads the groups."""
    if item.get_closest_marker("xdist_group"):
        return
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        definitions = info.name2fixturedefs.get(name) if info else None
        if definitions and definitions[-1].scope == "module":
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
            return
