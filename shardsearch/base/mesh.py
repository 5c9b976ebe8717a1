"""Meshes: building them, parsing them, finding the one in context.

Every rule and the analyzer take either a concrete `jax.sharding.Mesh` or an
`jax.sharding.AbstractMesh` (names and sizes, no devices), so plans for meshes
larger than this machine can be made without the devices.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh

from .warnings import ShardsearchWarning

AnyMesh = Mesh | AbstractMesh

_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def axis_sizes(mesh: AnyMesh) -> dict[str, int]:
    """Returns `{axis name: size}` in the mesh's axis order."""
    return dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))


def axes_text(sizes: Mapping[str, int]) -> str:
    """Axis sizes as the `--mesh` spelling: `{"dp": 2, "tp": 4}` → "dp=2,tp=4"."""
    return ",".join(f"{a}={s}" for a, s in sizes.items())


def device_count(mesh: AnyMesh) -> int:
    """Number of devices in `mesh`: the product of its axis sizes."""
    return math.prod(mesh.axis_sizes)


def device_memory(mesh: Mesh) -> int | None:
    """Bytes one device of `mesh` can hold, as its runtime reports them
    ("bytes_limit" of `memory_stats()`), read from a device of this process
    (in a mesh across processes the others' have no statistics here); None
    where the runtime reports none (CPU devices) or cannot (a backend whose
    `memory_stats` raises, as some plugins' do: unknown, not a crash)."""
    here = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    try:
        stats = (here or list(mesh.devices.flat))[0].memory_stats() or {}
    except (NotImplementedError, RuntimeError) as err:  # jaxlib's XlaRuntimeError is one
        warnings.warn(ShardsearchWarning(
            f"the devices' runtime cannot report their memory ({type(err).__name__}: "
            f"{str(err)[:200]}): no memory limit is known, so none is applied by default; "
            "give one with memory_budget= (--budget)"), stacklevel=2)
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if isinstance(limit, int | float) and limit > 0 else None


def create_mesh(
    axis_dims: Sequence[int],
    axis_names: Sequence[str],
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """Builds a mesh whose axes all have `AxisType.Auto`.

    `jax.make_mesh` defaults to Explicit axes, under which `in_shardings`
    propagation (what the search relies on) behaves differently; this helper
    always asks for Auto.

    Args:
      axis_dims: size of each axis; at most one may be `-1`, meaning "all the
        devices the other axes leave".
      axis_names: one name per axis, distinct.
      devices: devices to lay out; default `jax.devices()`.

    Returns:
      A `jax.sharding.Mesh`, e.g. `create_mesh((2, -1), ("dp", "tp"))` on 8
      devices gives `Mesh('dp': 2, 'tp': 4)`.

    Raises:
      ValueError: names and dims differ in length, a name repeats, more than
        one `-1`, a non-positive size, or sizes that do not multiply to the
        device count.
    """
    dims = tuple(int(d) for d in axis_dims)
    names = tuple(axis_names)
    _check_axis_names(names, where="create_mesh")
    if len(dims) != len(names):
        raise ValueError(
            f"create_mesh: {len(dims)} axis sizes {dims} but {len(names)} axis names "
            f"{names}; give one size per name")
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if dims.count(-1) > 1:
        raise ValueError(
            f"create_mesh: axis_dims={dims} has more than one -1; at most one axis "
            "may take the remaining devices")
    bad = [d for d in dims if d != -1 and d < 1]
    if bad:
        raise ValueError(
            f"create_mesh: axis sizes must be positive (or -1 once), got {dims}")
    if -1 in dims:
        rest = math.prod(d for d in dims if d != -1)
        if n % rest:
            raise ValueError(
                f"create_mesh: the fixed axes {dims} use {rest} devices, which does not "
                f"divide the {n} available; change the sizes")
        dims = tuple(n // rest if d == -1 else d for d in dims)
    if math.prod(dims) != n:
        raise ValueError(
            f"create_mesh: axis sizes {dict(zip(names, dims, strict=True))} multiply to "
            f"{math.prod(dims)} but there are {n} devices; make the product {n} "
            "(or use -1 for one axis)")
    return jax.make_mesh(
        dims, names, axis_types=(AxisType.Auto,) * len(dims), devices=devices)


def abstract_mesh(axis_dims: Sequence[int], axis_names: Sequence[str]) -> AbstractMesh:
    """An `AbstractMesh` with Auto axes: for planning meshes this machine lacks."""
    dims = tuple(int(d) for d in axis_dims)
    names = tuple(axis_names)
    _check_axis_names(names, where="abstract_mesh")
    if len(dims) != len(names) or any(d < 1 for d in dims):
        raise ValueError(
            f"abstract_mesh: need one positive size per name, got sizes {dims} for "
            f"names {names}")
    return AbstractMesh(dims, names, axis_types=(AxisType.Auto,) * len(dims))


def parse_mesh(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Parses a mesh written as `"dp=2,tp=4"`.

    Returns:
      `(axis_dims, axis_names)`, ready for `create_mesh(*parse_mesh(text))`:
      `parse_mesh("dp=2,tp=-1") == ((2, -1), ("dp", "tp"))`.

    Raises:
      ValueError: naming the malformed part, e.g. `"dp=2,tp"`.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"mesh {text!r} is empty; write it as name=size pairs, e.g. 'dp=2,tp=4'")
    dims: list[int] = []
    names: list[str] = []
    for part in text.split(","):
        name, eq, size = part.strip().partition("=")
        name, size = name.strip(), size.strip()
        if not eq or not name or not size:
            raise ValueError(
                f"mesh {text!r}: part {part.strip()!r} is not name=size; write e.g. "
                "'dp=2,tp=4'")
        if not _AXIS_NAME.match(name):
            raise ValueError(
                f"mesh {text!r}: axis name {name!r} is not an identifier; use letters, "
                "digits and '_'")
        try:
            value = int(size)
        except ValueError:
            raise ValueError(
                f"mesh {text!r}: size {size!r} of axis {name!r} is not an integer; "
                "write e.g. 'dp=2,tp=4'") from None
        if value < 1 and value != -1:
            raise ValueError(
                f"mesh {text!r}: axis {name!r} has size {value}; sizes are positive "
                "(or -1 once for 'the rest')")
        dims.append(value)
        names.append(name)
    _check_axis_names(tuple(names), where=f"mesh {text!r}")
    if dims.count(-1) > 1:
        raise ValueError(f"mesh {text!r}: more than one axis has size -1; use it once")
    return tuple(dims), tuple(names)


def use_cpu_devices(n: int) -> None:
    """Asks JAX for `n` simulated CPU devices, or fails if that is too late.

    Must run before JAX initialises its backend (before the first array is
    made); after that JAX would silently keep the devices it started with, so
    this raises instead when the count differs.

    Raises:
      ValueError: `n` is not a positive integer.
      RuntimeError: the backend already started with another device count.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"use_cpu_devices: n must be a positive integer, got {n!r}")
    try:
        # Simulated devices are CPU devices; an installed accelerator plugin
        # (the tpu or cuda extra, for compiling deviceless) must not become
        # the default backend, nor start looking for its hardware.
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", n)
        return
    except RuntimeError:
        pass  # the backend is up already; fine only if it has the count asked for
    have = jax.device_count()
    if have != n:
        raise RuntimeError(
            f"asked for {n} simulated CPU devices but JAX already runs with {have}: "
            "the count must be set before JAX's first operation. Call "
            "use_cpu_devices (or pass --devices) first thing in the process, or set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n}")


def get_incontext_mesh() -> Mesh:
    """Returns the mesh the caller has set.

    Finds a mesh set with `jax.set_mesh(mesh)` (or `jax.sharding.use_mesh`) and,
    for older code, the deprecated `with mesh:` form.

    Raises:
      RuntimeError: no mesh is set; the message says how to set one.
    """
    mesh = jax.sharding.get_mesh()
    if mesh is not None and not mesh.empty:
        return mesh
    # The legacy `with mesh:` context is only visible through pxla's thread
    # resources; reading them warns about the deprecation, which is the user's
    # choice, not ours to surface on every rule application.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.interpreters import pxla

        legacy = pxla.thread_resources.env.physical_mesh
    if legacy is not None and not legacy.empty:
        return legacy
    abstract = jax.sharding.get_abstract_mesh()
    if abstract is not None and not abstract.empty:
        return abstract
    raise RuntimeError(
        "no mesh is set: pass mesh=... explicitly, or wrap the call in "
        "`with jax.set_mesh(shardsearch.create_mesh((2, 4), ('dp', 'tp'))):`")


def resolve_mesh(mesh: AnyMesh | None) -> AnyMesh:
    """`mesh` itself, or the in-context mesh when it is None."""
    if mesh is None:
        return get_incontext_mesh()
    if not isinstance(mesh, Mesh | AbstractMesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh or AbstractMesh, got "
            f"{type(mesh).__name__}; build one with shardsearch.create_mesh")
    return mesh


def _check_axis_names(names: tuple[str, ...], where: str) -> None:
    seen: list[str] = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: axis name {name!r} must be a non-empty string")
        if name in seen:
            raise ValueError(
                f"{where}: axis {name!r} is listed twice in {names}; give each axis a "
                "distinct name")
        seen.append(name)


def named_shardings(mesh: AnyMesh, specs: Any) -> Any:
    """A tree of PartitionSpecs as `NamedSharding`s on `mesh`, same structure.

    Example: `named_shardings(mesh, {"w": P("tp")})` → `{"w": NamedSharding(mesh, P("tp"))}`.
    """
    return jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, s), specs,
                        is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
