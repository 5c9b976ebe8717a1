"""Calibration: this machine's devices measured, and fitted into a `HardwareModel`.

`calibrate(mesh)` runs microbenchmarks on the mesh's devices, every device
busy at once: the cost model charges per-device work, and devices that share
cores, caches or memory (simulated CPU devices share the host's) are slower
together than alone.

- **matmul**, per dtype: each device multiplies its own square blocks. The
  throughput is the program's matmul flops per device, as `cost.hlo` counts
  them for the cost model, over its time.
- **memory**: each device streams an array through an elementwise op. The
  bandwidth is the program's bytes accessed per device, as
  `cost.program.ProgramCost` counts them for the cost model, over its time.
- **collectives**: each kind of `cost.hlo.COLLECTIVE_KINDS` over each group
  of mesh axes (`axis_groups`), at several message sizes, `trips` times in
  one loop whose carry feeds the next collective (so XLA can neither fold nor
  hoist them). A sample's x is the `Collective.bytes` read from the compiled
  HLO, exactly what the cost model charges, and its seconds are the
  program's time less an empty program's, over the executions the HLO
  counts. A line `latency + bytes / bandwidth` (`cost.links.LinkFit`) is
  fitted per (kind, axes) by `fit_line`.

Each program's collective is checked against what was asked: the kind XLA
emitted is the kind recorded (a `reduce-scatter` XLA turned into an
`all-reduce` would be an all-reduce sample), and a program whose collective
spans other axes than its group, or that holds several collectives, is
skipped with the reason in `Calibration.skipped`.

The model's `overlap` is `CALIBRATED_OVERLAP`. `dcn_axes` are checked and
recorded only: the lines were measured per group of axes, so they already
price the links each axis uses.

Example:
  >>> mesh = create_mesh((2, 4), ("dp", "tp"))
  >>> cal = calibrate(mesh)                       # about a minute on 2 CPU cores
  >>> cal.model.fit("all-gather", ("tp",), Topology.of(mesh))
  LinkFit(latency=6.1e-05, bandwidth=2300000000.0)
  >>> cal.save("calib.json")
  >>> HardwareModel.load("calib.json") == cal.model
  True
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..base.mesh import axes_text, axis_sizes, device_count, device_memory
from ..base.units import format_bytes
from .hardware import HardwareModel, collective_axes
from .hlo import COLLECTIVE_KINDS
from .links import LinkFit
from .program import ProgramCost
from .topology import Topology

CALIBRATED_OVERLAP = 0.0
"""The `HardwareModel.overlap` of a calibrated model: the fraction of
communication taken to hide under compute. 0.0 (nothing hidden), the value
the fidelity study chose (`benchmarks/results/fidelity/analysis.md`): on the
simulated CPU devices the calibrated model ranks candidates best with it, on
the meshes it was chosen on and on the held-out ones alike."""

TRIPS = 8
"""Collectives per calibration program: enough that one program's launch,
which the empty-program baseline estimates, is not most of its time."""

MIN_SECONDS = 1e-9
"""The floor of a measured time once the baseline is taken off: a collective
faster than the timer's noise still costs something, and the fits need
times > 0."""

_COMPUTE_TRIPS = 2  # matmuls or elementwise passes per compute program
_MAX_SECONDS_PER_BYTE_FLOOR = 1e-15  # 1 PB/s: a line that does not rise with size

_HLO_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}

Progress = Callable[[int, int, str], None]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big the calibration's programs are.

    Attributes:
      messages: bytes of each collective's full buffer per device (the
        gathered result of an all-gather, the operand of a reduce-scatter,
        both of the others), at least two distinct sizes; each is rounded to
        whole float32 elements that split evenly over the group. The fits'
        x is what the HLO says (`Collective.bytes`: a reduce-scatter's
        scattered result), whatever was asked.
      matmul: the side of each device's square blocks.
      memory: bytes of the array each device streams.

    Example:
      >>> Sizes(messages=(4096, 65536), matmul=64, memory=2**20)  # for tests
    """

    messages: tuple[int, ...] = (1 << 10, 16 << 10, 256 << 10, 2 << 20, 16 << 20)
    matmul: int = 512
    memory: int = 16 << 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        for name, value in (("matmul", self.matmul), ("memory", self.memory),
                            *((f"messages[{i}]", m) for i, m in enumerate(self.messages))):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Sizes.{name}={value!r} must be a whole number >= 1")
        if len(set(self.messages)) < 2:
            raise ValueError(f"Sizes.messages={self.messages} needs at least two distinct "
                             "sizes to fit a latency and a bandwidth")

    def text(self) -> str:
        """One line for the model's `about`: "messages=4096,65536 matmul=64 memory=1048576"."""
        return (f"messages={','.join(map(str, self.messages))} matmul={self.matmul} "
                f"memory={self.memory}")


DEFAULT_SIZES = Sizes()
"""Messages of 1 KiB to 16 MiB (the built-in workloads' collectives on 8
devices range from a few KiB to about 25 MB), 512x512 matmul blocks, a
16 MiB stream (past a 2-core machine's caches once 8 devices stream at
once)."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One measurement, as calibration files list them under "samples".

    Attributes:
      kind: "baseline" (the empty program, taken off every other time),
        "matmul", "memory", or a collective kind (the one XLA emitted).
      seconds: per execution of the measured op (per matmul, per elementwise
        pass, per collective): the program's median time less the baseline,
        over `executions`, at least `MIN_SECONDS`.
      program_seconds: the program's median time, baseline included.
      executions: how often the op runs in the program (from the HLO).
      axes: the mesh axes a collective spans.
      bytes: a collective's `Collective.bytes`, or the memory program's
        bytes accessed per execution, per device.
      flops: a matmul program's matmul flops per execution, per device.
      dtype: a matmul's HLO dtype ("f32", "bf16").
      asked: the collective kind the program asked for, when XLA emitted
        another; "" otherwise.
    """

    kind: str
    seconds: float
    program_seconds: float
    executions: int
    axes: tuple[str, ...] = ()
    bytes: int = 0
    flops: float = 0.0
    dtype: str = ""
    asked: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON form, leaving out fields that do not apply to the kind."""
        data = dataclasses.asdict(self)
        data["axes"] = list(self.axes)
        return {k: v for k, v in data.items() if v or k in ("seconds", "program_seconds")}


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What `calibrate` returns: the model, and the evidence for it.

    Attributes:
      model: the fitted `HardwareModel` (fits for every (kind, axes) with
        samples at two or more sizes).
      samples: every measurement, in the order taken.
      skipped: why a program gave no sample, or a (kind, axes) no fit; one
        line each.
      seconds: the calibration's wall time.
    """

    model: HardwareModel
    samples: tuple[Sample, ...]
    skipped: tuple[str, ...] = ()
    seconds: float = 0.0

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the model's JSON with the samples (`HardwareModel.load` reads it).

        Raises:
          OSError: the file cannot be written.
        """
        self.model.save(path, samples=[s.to_json() for s in self.samples])


def axis_groups(topology: Topology) -> tuple[tuple[str, ...], ...]:
    """Every non-empty group of the mesh's axes of size > 1, in mesh order, fewest first.

    An axis of size 1 moves nothing, so a group with one spans the same
    devices as the group without it.

    Example:
      >>> axis_groups(Topology(("dp", "tp"), (2, 4)))
      (('dp',), ('tp',), ('dp', 'tp'))
    """
    axes = [a for a, s in zip(topology.axis_names, topology.axis_sizes, strict=True) if s > 1]
    return tuple(group for r in range(1, len(axes) + 1)
                 for group in itertools.combinations(axes, r))


def fit_line(points: Sequence[tuple[float, float]]) -> LinkFit:
    """The line `seconds = latency + bytes / bandwidth` through `(bytes, seconds)` points.

    Least squares on relative errors (each residual over its point's
    seconds), so a 4 KiB message counts as much as a 4 MiB one, with
    latency >= 0 and 1 / bandwidth >= 0 (`scipy.optimize.nnls`); a line that
    does not rise with size gets a bandwidth of 1 PB/s, finite.

    Example:
      >>> fit_line([(1e3, 2e-6), (1e6, 1.001e-3)])
      LinkFit(latency=1e-06, bandwidth=1000000000.0)

    Raises:
      ValueError: fewer than two distinct sizes, or a size or time that is
        not a positive finite number.
    """
    from scipy.optimize import nnls

    x = np.array([p[0] for p in points], dtype=np.float64)
    y = np.array([p[1] for p in points], dtype=np.float64)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0)
            and np.all(y > 0)):
        raise ValueError(f"fit_line: sizes and times must be positive and finite, got "
                         f"{list(points)}")
    if len(set(x.tolist())) < 2:
        raise ValueError(f"fit_line: {len(points)} points at {len(set(x.tolist()))} size(s); "
                         "a latency and a bandwidth need two sizes or more")
    rows = np.stack([1 / y, x / y], axis=1)
    scale = np.linalg.norm(rows, axis=0)  # columns differ by orders of magnitude
    coef, _ = nnls(rows / scale, np.ones_like(y))
    latency, per_byte = (coef / scale).tolist()
    return LinkFit(latency, 1 / max(per_byte, _MAX_SECONDS_PER_BYTE_FLOOR))


def calibrate(
    mesh: jax.sharding.Mesh,
    *,
    sizes: Sizes = DEFAULT_SIZES,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    repeats: int = 5,
    trips: int = TRIPS,
    dcn_axes: Sequence[str] = (),
    progress: Progress | None = None,
) -> Calibration:
    """Measures the mesh's devices and fits a `HardwareModel` for that mesh.

    Args:
      mesh: a concrete `jax.sharding.Mesh`; its devices run the programs.
      sizes: how big the programs are (`Sizes`).
      dtypes: matmul dtypes ("float32", "bfloat16", "float16"); the model's
        `flops_per_second` has one entry per dtype, by HLO name ("f32").
      repeats: timed runs per program (after one untimed); the median counts.
      trips: collectives per collective program.
      dcn_axes: mesh axes that cross hosts; checked and recorded.
      progress: called as `progress(done, total, label)` before each
        program and once at the end (`done == total`, label "done").

    Returns:
      A `Calibration`. Its model is named like "calibrated cpu x8
      (dp=2,tp=4)", with `mesh` the mesh's (axis, size) pairs, `overlap`
      `CALIBRATED_OVERLAP`, `memory_bytes` the device's "bytes_limit" when
      JAX reports one, and `about` the machine, JAX version, date and sizes.

    Raises:
      ValueError: an abstract mesh, a mesh whose axes all have size 1, an
        unknown dtype, a dcn axis the mesh lacks, repeats or trips < 1 (all
        checked before anything runs).
      RuntimeError: no collective could be fitted (the reasons in the
        message), or XLA left no matmul flops or bytes to time.
    """
    start = time.perf_counter()
    topology = Topology.of(mesh, dcn_axes)
    if not isinstance(mesh, jax.sharding.Mesh):
        raise ValueError("calibrate needs a mesh of real devices (jax.sharding.Mesh), not "
                         f"an abstract one: {mesh!r}")
    for name, value in (("repeats", repeats), ("trips", trips)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"calibrate: {name}={value!r} must be a whole number >= 1")
    if not isinstance(sizes, Sizes):
        raise ValueError(f"calibrate: sizes={sizes!r} must be a Sizes")
    dtypes = tuple(dict.fromkeys(dtypes))  # one program per dtype, in the order given
    unknown = [d for d in dtypes if d not in _HLO_DTYPES]
    if unknown or not dtypes:
        raise ValueError(f"calibrate: dtypes {list(dtypes)}: give one or more of "
                         f"{tuple(_HLO_DTYPES)}")
    groups = axis_groups(topology)
    if not groups:
        raise ValueError(f"calibrate: every axis of the mesh {axis_sizes(mesh)} has size 1, "
                         "so no collective moves anything; calibrate a mesh with an axis "
                         "of size 2 or more")
    bench = _Bench(mesh, repeats)
    jobs: list[tuple[str, Callable[[], None]]] = [("baseline", bench.measure_baseline)]
    jobs += [(f"matmul {d}", lambda d=d: bench.matmul(d, sizes.matmul)) for d in dtypes]
    jobs.append(("memory", lambda: bench.memory(sizes.memory)))
    jobs += [(f"{kind} {','.join(group)} {format_bytes(nbytes)}",
              lambda k=kind, g=group, b=nbytes: bench.collective(k, g, b, trips, topology))
             for kind in COLLECTIVE_KINDS for group in groups for nbytes in sizes.messages]
    for done, (label, job) in enumerate(jobs):
        if progress is not None:
            progress(done, len(jobs), label)
        job()
    if progress is not None:
        progress(len(jobs), len(jobs), "done")

    fits, skipped = _fit_collectives(bench.samples, groups, bench.skipped)
    if not fits:
        raise RuntimeError(f"calibrate: no collective could be fitted: {'; '.join(skipped)}")
    seconds = time.perf_counter() - start
    device = mesh.devices.flat[0]
    limit = device_memory(mesh)
    mesh_text = axes_text(axis_sizes(mesh))
    about = _about(device, device_count(mesh), mesh_text, topology, sizes, repeats, trips,
                   seconds, skipped)
    model = HardwareModel(
        f"calibrated {device.platform} x{device_count(mesh)} ({mesh_text})",
        flops_per_second=dict(bench.flops),
        memory_bandwidth=bench.memory_bandwidth,
        memory_bytes=limit,
        fits=fits, mesh=tuple(axis_sizes(mesh).items()), overlap=CALIBRATED_OVERLAP,
        about=about)
    return Calibration(model, tuple(bench.samples), tuple(skipped), seconds)


# --- the programs -------------------------------------------------------------


class _Bench:
    """Builds, compiles and times programs that run on every device of the mesh.

    Each program is a `shard_map` over all the mesh's axes: every device gets
    its own zero-filled blocks (zeros cost what other values cost, and keep
    sums finite), so all of them work at once.
    """

    def __init__(self, mesh: jax.sharding.Mesh, repeats: int):
        self.mesh, self.repeats = mesh, repeats
        self.spec = P(tuple(mesh.axis_names))
        self.devices = device_count(mesh)
        self.baseline = 0.0
        self.samples: list[Sample] = []
        self.skipped: list[str] = []
        self.flops: dict[str, float] = {}
        self.memory_bandwidth = 0.0

    def measure_baseline(self) -> None:
        # A program that does next to nothing: what launching one costs.
        _, self.baseline = self._run(lambda x: x + 1, ((8,), jnp.float32), repeats=3)
        self.samples.append(Sample("baseline", self.baseline, self.baseline, 1))

    def matmul(self, dtype: str, side: int) -> None:
        def per_device(a, b):
            return lax.fori_loop(0, _COMPUTE_TRIPS, lambda i, c: c @ b, a)

        block = ((side, side), jnp.dtype(dtype))
        program, seconds = self._run(per_device, block, block)
        flops = program.hlo.dot_flops if program.hlo is not None else 0.0
        if not flops > 0:
            raise RuntimeError(f"calibrate: the {dtype} matmul program has no matmul flops "
                               f"in its HLO ({program.hlo_error or 'XLA removed them'})")
        per_run = max(seconds - self.baseline, MIN_SECONDS)
        key = _HLO_DTYPES[dtype]
        self.flops[key] = flops / per_run
        self.samples.append(Sample("matmul", per_run / _COMPUTE_TRIPS, seconds,
                                   _COMPUTE_TRIPS, flops=flops / _COMPUTE_TRIPS, dtype=key))

    def memory(self, nbytes: int) -> None:
        def per_device(x):
            return lax.fori_loop(0, _COMPUTE_TRIPS, lambda i, c: c * 0.5 + 1.0, x)

        program, seconds = self._run(per_device, ((max(1, nbytes // 4),), jnp.float32))
        moved = program.bytes_accessed
        if not moved > 0:
            raise RuntimeError("calibrate: XLA reports no bytes accessed for the memory "
                               "program")
        per_run = max(seconds - self.baseline, MIN_SECONDS)
        self.memory_bandwidth = moved / per_run
        self.samples.append(Sample("memory", per_run / _COMPUTE_TRIPS, seconds,
                                   _COMPUTE_TRIPS, bytes=round(moved / _COMPUTE_TRIPS)))

    def collective(self, kind: str, axes: tuple[str, ...], nbytes: int, trips: int,
                   topology: Topology) -> None:
        n = topology.size(axes)
        # The full buffer's elements per device: whole, and split evenly over the group.
        full = n * max(1, round(nbytes / 4 / n))
        carry = full // n if kind == "all-gather" else full
        step = _collective_step(kind, axes, n)

        def per_device(x):
            return lax.fori_loop(0, trips, step, x)

        program, seconds = self._run(per_device, ((carry,), jnp.float32))
        label = f"{kind} over {axes} at {nbytes} B"
        if program.collectives is None:
            self.skipped.append(f"{label}: the HLO could not be read ({program.hlo_error})")
            return
        found = [c for c in program.collectives.collectives
                 if c.bytes > 0 and c.count > 0 and c.group_size > 1]
        if len(found) != 1:
            self.skipped.append(
                f"{label}: XLA emitted {[c.kind for c in found] or 'no collective'}, not one "
                "collective; its time cannot be put on one")
            return
        (c,) = found
        spanned = collective_axes(c, topology)
        if spanned != axes:
            self.skipped.append(f"{label}: XLA's {c.kind} spans {spanned}, not {axes}")
            return
        per_run = max((seconds - self.baseline) / c.count, MIN_SECONDS)
        self.samples.append(Sample(c.kind, per_run, seconds, c.count, axes=axes,
                                   bytes=c.bytes, asked="" if c.kind == kind else kind))

    def _run(self, per_device: Callable[..., Any], *blocks: tuple[tuple[int, ...], Any],
             repeats: int | None = None) -> tuple[ProgramCost, float]:
        """Compiles `per_device` over blocks of these (shape, dtype) on every device;
        returns its cost figures and its median time."""
        sharding = NamedSharding(self.mesh, self.spec)
        # Each device's block made where it lives: no global array on the host,
        # and no program to compile for it.
        args = [jax.make_array_from_callback(
                    (self.devices * shape[0], *shape[1:]), sharding,
                    lambda index, s=shape, d=dtype: np.zeros(s, d))
                for shape, dtype in blocks]
        fn = jax.jit(jax.shard_map(per_device, mesh=self.mesh,
                                   in_specs=(self.spec,) * len(blocks), out_specs=self.spec,
                                   check_vma=False))
        compiled = fn.lower(*args).compile()
        program = ProgramCost.from_compiled(compiled)
        jax.block_until_ready(compiled(*args))  # the first run allocates
        times = []
        for _ in range(self.repeats * (repeats or 1)):
            begin = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - begin)
        return program, statistics.median(times)


def _collective_step(kind: str, axes: tuple[str, ...], n: int) -> Callable[[Any, Any], Any]:
    """One loop trip: the collective, its result shaped back into the carry."""
    if kind == "all-reduce":
        return lambda i, c: lax.psum(c, axes)
    if kind == "all-gather":
        def gather(i, c):
            y = lax.all_gather(c, axes, tiled=True)
            # A slice that moves with the trip, so XLA cannot keep only the
            # device's own part and drop the gather.
            return lax.dynamic_slice_in_dim(y, (i % n) * c.shape[0], c.shape[0])
        return gather
    if kind == "reduce-scatter":
        def scatter(i, c):
            y = lax.psum_scatter(c, axes, tiled=True)
            # Written back in place: the carry keeps its size at a slice's cost.
            return lax.dynamic_update_slice_in_dim(c, y, (i % n) * y.shape[0], 0)
        return scatter
    if kind == "all-to-all":
        return lambda i, c: lax.all_to_all(c, axes, 0, 0, tiled=True)
    if kind == "collective-permute":
        ring = [(j, (j + 1) % n) for j in range(n)]
        return lambda i, c: lax.ppermute(c, axes, ring)
    raise ValueError(f"unknown collective kind {kind!r}; one of {COLLECTIVE_KINDS}")


# --- the model ----------------------------------------------------------------


def _fit_collectives(samples: Sequence[Sample], groups: Sequence[tuple[str, ...]],
                     skipped: Sequence[str]
                     ) -> tuple[tuple[tuple[tuple[str, tuple[str, ...]], LinkFit], ...],
                                list[str]]:
    points: dict[tuple[str, tuple[str, ...]], list[tuple[float, float]]] = {}
    for s in samples:
        if s.kind in COLLECTIVE_KINDS:
            points.setdefault((s.kind, s.axes), []).append((s.bytes, s.seconds))
    notes = list(skipped)
    fits = []
    for kind, axes in itertools.product(COLLECTIVE_KINDS, groups):
        found = points.get((kind, axes), [])
        if len({b for b, _ in found}) < 2:
            notes.append(f"{kind} over {axes}: no fit, samples at "
                         f"{len({b for b, _ in found})} size(s)")
            continue
        fits.append(((kind, axes), fit_line(found)))
    return tuple(fits), notes


def _about(device: Any, n: int, mesh_text: str, topology: Topology, sizes: Sizes,
           repeats: int, trips: int, seconds: float, skipped: Sequence[str]
           ) -> tuple[tuple[str, Any], ...]:
    """What was measured where; JSON scalars only, so the model round-trips equal."""
    about: list[tuple[str, Any]] = [
        ("machine", platform.machine()),
        ("processor", _processor()),
        ("cpu_count", os.cpu_count() or 0),
        ("platform", device.platform),
        ("device_kind", device.device_kind),
        ("devices", n),
        ("jax", jax.__version__),
        ("jaxlib", _version("jaxlib")),
        ("date", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")),
        ("mesh", mesh_text),
        ("dcn_axes", ",".join(topology.dcn_axes)),
        ("sizes", sizes.text()),
        ("repeats", repeats),
        ("trips", trips),
        ("seconds", round(seconds, 3)),
    ]
    if skipped:
        about.append(("skipped", "; ".join(skipped)))
    return tuple(about)


def _processor() -> str:
    # platform.processor() is empty on most Linux systems; /proc/cpuinfo names it.
    name = platform.processor()
    if not name and os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.partition(":")[2].strip()
    return name


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
