"""Targets: the devices of a chip you do not have, made by its own compiler.

libtpu (TPU topologies) and the CUDA plugin (GPUs, from a `GpuTargetConfig`)
give compile-only devices. A mesh over them compiles each candidate with the
chip's compiler, so its memory analysis and HLO are the chip's, not the
host's; nothing can run on it.

Example:
  >>> mesh = target_mesh("tpu-v5e", {"dp": 2, "tp": 4})    # topology v5e:2x4
  >>> target_of(mesh).describe()
  'tpu-v5e 2x4 (8 devices, libtpu 0.0.42.1)'
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import math
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from . import mesh as _mesh
from .warnings import ShardsearchWarning


class TargetLayoutWarning(ShardsearchWarning):
    """A target mesh's axes could not follow the chips' physical axes."""


class TargetUnavailable(RuntimeError):
    """The compiler plugin a target needs is not installed; the message names
    the extra that brings it."""


@dataclasses.dataclass(frozen=True)
class TargetChip:
    """What it takes to make one chip's devices without the chip.

    Attributes:
      name: the chip's name, as in `cost.chips.HARDWARE` ("tpu-v5p").
      platform: "tpu" (libtpu) or "cuda" (the CUDA plugin).
      family: libtpu's topology prefix ("v5p"), or the GPU target config's
        file stem under `base/gpu_targets/`.
      rank: the topology's dimensions: 2 for a 2D torus (v5e), 3 for a 3D one
        (v4, v5p) and for GPUs (slices × hosts × devices per host).
      per_host: GPUs per host (hosts are what `dcn_axes` cross).
      chip_config: libtpu's `chip_config_name` ("megacore": one device per v4
        chip, as MaxText runs it; libtpu's default is one per core).
    """

    name: str
    platform: str
    family: str
    rank: int
    per_host: int = 8
    chip_config: str | None = None

    @property
    def extra(self) -> str:
        """The pip extra that installs this chip's compiler."""
        return "tpu" if self.platform == "tpu" else "cuda"


TARGET_CHIPS: dict[str, TargetChip] = {
    chip.name: chip for chip in (
        TargetChip("tpu-v5e", "tpu", "v5e", 2),
        TargetChip("tpu-v5p", "tpu", "v5p", 3),
        TargetChip("tpu-v4", "tpu", "v4", 3, chip_config="megacore"),
        TargetChip("gpu-h100", "cuda", "gpu-h100", 3),
        TargetChip("gpu-h200", "cuda", "gpu-h200", 3),
    )
}

# The chips of one TPU host (2x2x1), what libtpu assumes unless told.
TPU_CHIPS_PER_HOST = 4

# The CUDA majors jax ships a plugin for (`jax[cuda12]`, `jax[cuda13]`); a GPU
# target compiles with whichever is installed, the first listed if both are.
CUDA_MAJORS = ("12", "13")


def _cuda_major() -> str | None:
    """The CUDA major of the installed plugin, or None without one."""
    for major in CUDA_MAJORS:
        if importlib.util.find_spec(f"jax_plugins.xla_cuda{major}") is not None:
            return major
    return None


def _packages(platform: str) -> tuple[str, ...]:
    """The packages whose versions say which compiler a candidate was
    compiled by (the CUDA 12 ones, reported missing, when no plugin is in)."""
    if platform == "tpu":
        return ("libtpu",)
    major = _cuda_major() or CUDA_MAJORS[0]
    return (f"jax-cuda{major}-plugin", f"jax-cuda{major}-pjrt")


def target_chip(name: str) -> TargetChip:
    """The `TargetChip` called `name`.

    Raises:
      ValueError: no such chip; the message lists the known ones.
    """
    if name not in TARGET_CHIPS:
        raise ValueError(f"unknown target chip {name!r}; known: {', '.join(TARGET_CHIPS)}")
    return TARGET_CHIPS[name]


def derive_topology(chip: str, devices: int) -> str:
    """The topology a chip's compiler is asked for, from the device count.

    A TPU torus is as square as the count allows, small dims first (v5e 8 →
    `2x4`, 256 → `16x16`, 1 → `1x1`; v5p 64 → `4x4x4`, 16 → `2x2x4`, 4 →
    `2x2x1`, 2 → `2x1x1`); GPUs are one slice of hosts with 8 devices each
    (96 → `1x12x8`, 4 → `1x1x4`).

    Raises:
      ValueError: a count the chip's topologies cannot have.
    """
    spec = target_chip(chip)
    if not isinstance(devices, int) or devices < 1:
        raise ValueError(f"{chip}: the device count must be a positive integer, got {devices!r}")
    if spec.platform == "cuda":
        if devices <= spec.per_host:
            return f"1x1x{devices}"
        if devices % spec.per_host:
            raise ValueError(
                f"{chip}: {devices} devices do not fill hosts of {spec.per_host}; use a "
                f"multiple of {spec.per_host}, or give the topology (slices x hosts x devices)")
        return f"1x{devices // spec.per_host}x{spec.per_host}"
    bits = devices.bit_length() - 1
    if devices != 1 << bits:
        raise ValueError(
            f"{chip}: {devices} devices is not a TPU topology this tool can derive (a power "
            f"of two); give the topology, e.g. --topology "
            f"{'2x2' if spec.rank == 2 else '2x2x1'}")
    exponents = [bits // spec.rank + (i < bits % spec.rank) for i in range(spec.rank)]
    dims = sorted(1 << e for e in exponents)
    # libtpu's 3D topologies put a flat dimension last (2x2x1, not 1x2x2).
    dims = [d for d in dims if d > 1] + [d for d in dims if d == 1]
    return "x".join(map(str, dims))


def _parse_topology(text: str, rank: int, where: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(x\d+)*", text or ""):
        raise ValueError(f"{where}: topology {text!r} is not like 2x4 or 4x4x4")
    dims = tuple(int(d) for d in text.split("x"))
    if len(dims) != rank or min(dims) < 1:
        raise ValueError(f"{where}: topology {text!r} needs {rank} positive dims")
    return dims


@dataclasses.dataclass(frozen=True)
class Target:
    """What candidates are compiled for: a chip, its topology, its slices.

    Attributes:
      chip: a name in `TARGET_CHIPS`.
      topology: one slice's topology in the chip compiler's terms ("4x4x4";
        for GPUs slices x hosts x devices per host, "1x12x8").
      slices: TPU slices joined by the data-center network (`dcn_axes`); 1
        for GPUs, whose hosts are what `dcn_axes` cross.
      config: for GPUs, the `GpuTargetConfig` text (default: the shipped one
        for the chip).
      dcn_axes: the mesh axes laid across slices (TPU) or hosts (GPU).
    """

    chip: str
    topology: str
    slices: int = 1
    config: str | None = None
    dcn_axes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        spec = target_chip(self.chip)
        _parse_topology(self.topology, spec.rank, f"target {self.chip}")
        if not isinstance(self.slices, int) or self.slices < 1:
            raise ValueError(f"target {self.chip}: slices must be a positive integer, "
                             f"got {self.slices!r}")
        if spec.platform == "cuda" and self.slices != 1:
            raise ValueError(f"target {self.chip}: GPU topologies have one slice; their "
                             "hosts are what dcn_axes cross")
        if spec.platform == "cuda" and self.config is None:
            object.__setattr__(self, "config", shipped_config(self.chip))

    @property
    def platform(self) -> str:
        return target_chip(self.chip).platform

    @property
    def device_count(self) -> int:
        return math.prod(_parse_topology(self.topology, target_chip(self.chip).rank,
                                         self.chip)) * self.slices

    @property
    def memory_bytes(self) -> int | None:
        """A GPU's memory as its target config states it (what the device
        reports, a little under the marketing figure); None for TPUs, whose
        compiler itself refuses a program over the chip's memory."""
        found = re.search(r"device_memory_size:\s*(\d+)", self.config or "")
        return int(found.group(1)) if found else None

    def versions(self) -> dict[str, str]:
        """The installed compiler packages and their versions."""
        return {name: _version(name) for name in _packages(self.platform)}

    def devices(self) -> list[Any]:
        """The chip's compile-only devices (made once per process).

        Raises:
          TargetUnavailable: the chip's compiler plugin is not installed.
        """
        return list(_devices(self))

    def describe(self) -> str:
        slices = f" x {self.slices} slices" if self.slices > 1 else ""
        versions = ", ".join(f"{k.removeprefix('jax-')} {v}" for k, v in self.versions().items())
        return f"{self.chip} {self.topology}{slices} ({self.device_count} devices, {versions})"

    def to_json(self) -> dict[str, Any]:
        """What a study, a plan file and a bench entry record."""
        out: dict[str, Any] = {"platform": self.platform, "chip": self.chip,
                               "topology": self.topology, "slices": self.slices,
                               "dcn_axes": list(self.dcn_axes), "versions": self.versions()}
        if self.config is not None:
            out["config_sha256"] = hashlib.sha256(self.config.encode()).hexdigest()[:16]
        return out


class TargetMemoryWarning(ShardsearchWarning):
    """A plan fits a GPU target by the compiler's figures, but a JAX run on
    the real GPU needs more than JAX's defaults give, or the fit is too close
    to trust a deviceless figure."""


# JAX preallocates this fraction of a GPU's memory for XLA unless
# XLA_PYTHON_CLIENT_MEM_FRACTION (or XLA_PYTHON_CLIENT_PREALLOCATE=false)
# says otherwise; a program needing more fails at run time.
JAX_GPU_MEMORY_FRACTION = 0.75
# How much more a real H200's autotuned program needed than the same program
# compiled deviceless: at most 1.7% of its peak (benchmarks/results/h200).
DEVICELESS_SHORTFALL = 0.02


def gpu_memory_advice(target: Target, needed: int) -> str | None:
    """What a user must know to run a plan needing `needed` bytes per device
    on a GPU target's real devices; None when nothing (and for TPUs, whose
    compiler itself refuses what does not fit).

    Example:
      >>> gpu_memory_advice(Target("gpu-h100", "1x1x8"), 70 * 2**30)
      'the plan needs 70.0 GiB per device: over the 75% of the 79.2 GiB that JAX
      preallocates on a GPU by default; run it with XLA_PYTHON_CLIENT_MEM_FRACTION=0.91
      or more'
    """
    chip = target.memory_bytes
    if target.platform != "cuda" or chip is None:
        return None
    notes = []
    if needed > JAX_GPU_MEMORY_FRACTION * chip:
        fraction = min(0.99, math.ceil(100 * needed * (1 + DEVICELESS_SHORTFALL) / chip) / 100)
        notes.append(
            f"over the {JAX_GPU_MEMORY_FRACTION:.0%} of the {chip / 2**30:.1f} GiB that JAX "
            f"preallocates on a GPU by default; run it with "
            f"XLA_PYTHON_CLIENT_MEM_FRACTION={fraction:.2f} or more")
    if needed * (1 + DEVICELESS_SHORTFALL) > chip:
        notes.append(
            f"within {DEVICELESS_SHORTFALL:.0%} of the device's memory, and a deviceless "
            "compile can come out that much under the real GPU's autotuned program: check it "
            "on the chip, or plan with a lower budget (--budget, memory_budget=)")
    if not notes:
        return None
    return f"the plan needs {needed / 2**30:.1f} GiB per device: " + "; ".join(notes)


def shipped_config(chip: str) -> str:
    """The `GpuTargetConfig` text shipped for a GPU chip."""
    name = f"{target_chip(chip).family}.txtpb"
    try:
        return (importlib.resources.files("shardsearch.base") / "gpu_targets" / name).read_text()
    except FileNotFoundError:
        raise ValueError(f"no GPU target config ships for {chip!r} ({name}); pass "
                         "target_config= with one (see docs/targets.md)") from None


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def require_plugin(chip: str) -> None:
    """Raises TargetUnavailable unless the chip's compiler plugin is installed."""
    spec = target_chip(chip)
    found = (importlib.util.find_spec("libtpu") is not None if spec.platform == "tpu"
             else _cuda_major() is not None)
    if not found:
        what = ("libtpu" if spec.platform == "tpu" else
                "a CUDA plugin (jax-cuda12-plugin or jax-cuda13-plugin)")
        raise TargetUnavailable(
            f"compiling for {chip} needs {what}, which is not installed; install it with "
            f"pip install 'shardsearch[{spec.extra}]'")


def _devices(target: Target) -> tuple[Any, ...]:
    return _topology_devices(target.chip, target.topology, target.slices, target.config)


@functools.cache
def _topology_devices(chip: str, topology: str, slices: int,
                      config: str | None) -> tuple[Any, ...]:
    from jax.experimental import topologies

    target = Target(chip, topology, slices, config)
    spec = target_chip(target.chip)
    require_plugin(target.chip)
    if spec.platform == "tpu":
        # libtpu looks for the TPU VM it runs on and warns when it finds none;
        # this machine has no TPU, so tell it there is one worker: itself.
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        # libtpu takes a lock file meant to keep two processes off one TPU;
        # compiling owns no TPU, and the study process and its worker both
        # compile.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        options: dict[str, Any] = {}
        if spec.chip_config:
            options["chip_config_name"] = spec.chip_config
        if target.slices > 1:
            options["num_slices"] = target.slices
        dims = _parse_topology(target.topology, spec.rank, target.chip)
        if math.prod(dims) < TPU_CHIPS_PER_HOST:
            # libtpu lays a topology over hosts of 2x2x1 chips and refuses one
            # smaller than a host ("v5e:1x1 is not divisible by ... 2x2x1"):
            # such a topology is one host of just its chips, as on a TPU VM
            # with fewer chips (a one-chip v5e compiles the same program:
            # benchmarks/results/v5e).
            options["chips_per_host_bounds"] = (*dims, 1, 1)[:3]
        topo = topologies.get_topology_desc(topology_name=f"{spec.family}:{target.topology}",
                                            platform="tpu", **options)
    else:
        # The plugin's version check calls the CUDA driver, which a machine
        # without a GPU lacks; compiling needs none of it.
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
        try:
            topo = topologies.get_topology_desc(platform="cuda", target_config=target.config,
                                                topology=target.topology)
        except NotImplementedError as err:
            raise TargetUnavailable(
                f"the CUDA plugin did not start ({err}); set JAX_PLATFORMS=cpu (or pass "
                "--devices) so JAX does not start it for a GPU this machine lacks, and "
                "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 before JAX's first operation") from err
    devices = tuple(topo.devices)
    if len(devices) != target.device_count:
        raise ValueError(f"target {target.describe()}: the compiler gave {len(devices)} "
                         f"devices, expected {target.device_count}")
    return devices


# The meshes `target_mesh` made, so the search knows what they compile for.
_MESHES: dict[Mesh, Target] = {}


def target_mesh(
    chip: str,
    axes: Mapping[str, int],
    topology: str | None = None,
    dcn_axes: Sequence[str] = (),
    target_config: str | None = None,
) -> Mesh:
    """A mesh over a chip's compile-only devices, with Auto axis types.

    Args:
      chip: a name in `TARGET_CHIPS` ("tpu-v5e", "tpu-v5p", "tpu-v4",
        "gpu-h100", "gpu-h200").
      axes: axis name → size, in mesh order; the sizes multiply to the device
        count.
      topology: one slice's topology ("4x4x4"; for GPUs slices x hosts x
        devices per host); default derived from the device count
        (`derive_topology`).
      dcn_axes: the axes that cross the data-center network: on TPU they span
        slices (their sizes multiply to the slice count), on GPUs hosts.
      target_config: for GPUs, a `GpuTargetConfig` in text form (or a path to
        one) instead of the shipped one.

    Raises:
      ValueError: bad axes, topology or dcn axes; the message says which.
      TargetUnavailable: the chip's compiler plugin is not installed.
    """
    where = f"target_mesh({chip!r})"
    spec = target_chip(chip)
    if not isinstance(axes, Mapping) or not axes:
        raise ValueError(f"{where}: axes must be a non-empty dict of name -> size, got {axes!r}")
    names, sizes = tuple(axes), tuple(axes.values())
    _mesh._check_axis_names(names, where)
    for name, size in axes.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"{where}: axis {name!r} has size {size!r}; sizes are positive "
                             "integers")
    unknown = [a for a in dcn_axes if a not in names]
    if unknown:
        raise ValueError(f"{where}: dcn_axes {unknown} are not mesh axes {list(names)}")
    total = math.prod(sizes)
    crossing = math.prod(axes[a] for a in dcn_axes)
    slices = crossing if spec.platform == "tpu" else 1
    if topology is None:
        topology = derive_topology(chip, total // slices)
    if target_config is not None and os.path.exists(target_config):
        with open(target_config) as f:
            target_config = f.read()
    target = Target(chip, topology, slices, target_config, tuple(dcn_axes))
    if target.device_count != total:
        raise ValueError(f"{where}: the axes {dict(axes)} make {total} devices but topology "
                         f"{topology}{f' x {slices} slices' if slices > 1 else ''} has "
                         f"{target.device_count}; change the axes or the topology")
    devices = target.devices()
    if dcn_axes and spec.platform == "cuda":
        grid = _host_grid(names, sizes, tuple(dcn_axes), devices, spec.per_host, where)
    elif dcn_axes:
        dcn = tuple(axes[a] if a in dcn_axes else 1 for a in names)
        ici = tuple(1 if a in dcn_axes else axes[a] for a in names)
        from jax.experimental import mesh_utils

        try:
            grid = mesh_utils.create_hybrid_device_mesh(
                ici, dcn, devices, process_is_granule=spec.platform == "cuda")
        except (ValueError, AssertionError) as err:
            granules = "slices" if spec.platform == "tpu" else f"hosts of {spec.per_host}"
            raise ValueError(f"{where}: dcn_axes {list(dcn_axes)} must span the {granules} "
                             f"exactly ({err})") from None
    else:
        grid = _device_grid(sizes, devices)
    mesh = Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))
    _MESHES[mesh] = target
    return mesh


def _host_grid(names: tuple[str, ...], sizes: tuple[int, ...], dcn_axes: tuple[str, ...],
               devices: Sequence[Any], per_host: int, where: str) -> np.ndarray:
    """GPUs in host order, the dcn axes outermost: the other axes stay inside
    a host, and the dcn axes span the hosts (and, when larger, part of each)."""
    leading = names[:len(dcn_axes)]
    if set(leading) != set(dcn_axes):
        raise ValueError(f"{where}: put the dcn_axes {list(dcn_axes)} first in the mesh's "
                         f"axes {list(names)}: the axes after them stay inside one host")
    inside = math.prod(sizes[len(dcn_axes):])
    if per_host % inside and len(devices) > per_host:
        raise ValueError(f"{where}: the axes after the dcn axes use {inside} GPUs, which "
                         f"do not fit evenly in hosts of {per_host}")
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    return np.array(ordered, dtype=object).reshape(sizes)


def _device_grid(sizes: tuple[int, ...], devices: Sequence[Any]) -> np.ndarray:
    from jax.experimental import mesh_utils

    try:
        return mesh_utils.create_device_mesh(sizes, list(devices))
    except (ValueError, NotImplementedError, AssertionError) as err:
        warnings.warn(TargetLayoutWarning(
            f"mesh {sizes} does not map onto the chips' physical axes ({err}); its axes "
            "split physical ones, so the compiler's collectives may differ from a "
            "real slice's laid out by JAX"), stacklevel=3)
        return mesh_utils.create_device_mesh(sizes, list(devices),
                                             allow_split_physical_axes=True)


def target_of(mesh: Any) -> Target | None:
    """The target a mesh compiles for, or None for a mesh of this host's devices.

    Raises:
      ValueError: the mesh is over compile-only devices that `target_mesh`
        did not make, so what it compiles for is not known.
    """
    if not isinstance(mesh, Mesh):
        return None
    if mesh in _MESHES:
        return _MESHES[mesh]
    platform = mesh.devices.flat[0].platform
    if platform not in {d.platform for d in jax.devices()}:
        raise ValueError(
            f"the mesh is over {platform} devices this process cannot run on; build it with "
            "shardsearch.target_mesh so the search knows the chip and topology it compiles for")
    return None


@contextlib.contextmanager
def uncached() -> Iterator[None]:
    """Compiles inside without JAX's persistent compilation cache.

    A compile-only client can write an executable to the cache but not read
    one back ("PjRtCompiler must be constructed with a Client to call
    DeserializeLoadedExecutable"): JAX then warns and compiles again. So
    nothing compiled for a target is written, and a read that fails (an
    entry some other code wrote) is not worth the warning. Process-wide for
    its duration: the compile runs on another thread.
    """
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Error reading persistent compilation "
                                    "cache entry", category=UserWarning)
            yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)
