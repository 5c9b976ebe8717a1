"""Hardware models: a compiled program's step seconds, estimated without running it.

A model charges a program (`cost.program.ProgramCost`, per device) three
things, and `HardwareModel.breakdown` returns them as a `cost.breakdown.Breakdown`:

- **compute**: each dtype's matmul flops over the chip's throughput for that
  dtype, and the remaining flops at the float32 figure;
- **memory**: the bytes accessed over the memory bandwidth (the roofline
  takes the larger of the two);
- **communication**: each collective of the HLO, charged by the mesh axes its
  replica groups span (`cost.topology.Topology`) with the line fitted for that
  (kind, axes) by a calibration, else with the spec-sheet figures of the links
  those axes use (`cost.links.Link`: inside the slice/node, or across hosts);
  `overlap` says how much of it the compute hides.

Flops and bytes are XLA's ``cost_analysis()`` figures made loop-aware
(`cost.program.loop_aware`).

Three kinds of model:
- **calibrated** (`HardwareModel.load(path)` of what `shardsearch calibrate`
  wrote): lines measured on this machine's devices for this mesh;
- **named chips** (`HARDWARE["tpu-v5e"]`, ...; `cost.chips`): spec-sheet
  figures with their sources, the chip's memory as the default budget;
- **legacy** ("cpu", "gpu", "tpu"): one throughput per term and one link
  bandwidth for every axis (ring-algorithm bytes), kept so that recorded
  studies and suites estimate as before.

Example:
  >>> model = HardwareModel("toy", flops_per_second=1e12, memory_bandwidth=1e11,
  ...                       link_bandwidth=1e10)
  >>> model.estimate(program)  # 2e12 flops, 1e11 bytes accessed, 1e10 link bytes
  3.0
  >>> HardwareModel.load("calibration.json").breakdown(program, Topology.of(mesh)).lines()
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from ..base.jsonfile import read_json
from .breakdown import Breakdown, CollectiveCost
from .hlo import COLLECTIVE_KINDS, Collective, KernelCost
from .links import Link, LinkFit, positive
from .program import ProgramCost
from .topology import Topology

SCHEMA = 1
"""The version of the JSON form (`to_json`, calibration files)."""

_KEYS = ("schema", "name", "flops_per_second", "memory_bandwidth", "memory_bytes",
         "link_bandwidth", "ici", "dcn", "overlap", "mesh", "collectives", "about",
         "samples", "per_op", "memory_spaces", "asynchronous")

Fits = tuple[tuple[tuple[str, tuple[str, ...]], LinkFit], ...]


@dataclasses.dataclass(frozen=True)
class HardwareModel:
    """Per-device throughputs and links, and the step seconds they give a program.

    Attributes:
      name: what the numbers describe.
      flops_per_second: sustained throughput per device: one number for
        every dtype, or a mapping from HLO dtype names ("f32", "bf16") to
        numbers (a dtype not listed is charged at the "f32" figure).
      memory_bandwidth: bytes per second to device memory.
      link_bandwidth: legacy models only: bytes per second one device sends,
        whatever axes a collective crosses (ring-algorithm bytes).
      memory_bytes: the device's memory; the static objective's default
        budget. None: unknown.
      ici: the links inside a slice or node (axes not in the topology's
        `dcn_axes`).
      dcn: the links between hosts.
      fits: calibrated lines, `((kind, axes), LinkFit)` pairs; they win over
        `ici`/`dcn` for the (kind, axes) they cover.
      mesh: `(axis, size)` pairs of the mesh the fits were measured on; a
        mesh whose axes have other sizes cannot use them.
      overlap: fraction of communication hidden under compute (0..1;
        `cost.breakdown`).
      about: `(key, value)` notes: the machine, JAX version and date of a
        calibration, the sources of a named chip.
      per_op: price each kernel of the program by its own roofline and sum
        them (`Breakdown.kernels`), instead of the whole program's
        max(compute, memory), for programs compiled for an accelerator
        (`prices_kernels`). On one TPU v5e it puts 13 programs of 0.15 s or
        more within 1.01-1.10x of their measured step times, where the
        whole-program roofline was 0.87-1.47x and ordered fewer pairs of knob
        settings as the chip did; a 2 ms step it prices about 3x under, the
        chip's time outside the kernels (benchmarks/results/v5e/grid.md).
      memory_spaces: per-kernel pricing only: bytes per second by memory
        space, ``(space, bandwidth)`` pairs. Space 0 is device memory (where
        given, it replaces `memory_bandwidth` for kernels); space ``n > 0``
        holds the arrays the compiler placed there (layouts marked ``S(n)``,
        `cost.hlo.KernelCost.spaces`; on TPU, space 1 is the core's on-chip
        memory). A space not listed is charged at `memory_bandwidth`.
      asynchronous: per-kernel pricing only: opcodes whose kernels run beside
        the others (the TPU's ``copy-start``, a DMA its profile shows under
        other kernels), so they are not charged.
    """

    name: str
    flops_per_second: float | Mapping[str, float] | tuple[tuple[str, float], ...]
    memory_bandwidth: float
    link_bandwidth: float | None = None
    memory_bytes: int | None = None
    ici: Link | None = None
    dcn: Link | None = None
    fits: Fits | Mapping[tuple[str, tuple[str, ...]], LinkFit] = ()
    mesh: tuple[tuple[str, int], ...] = ()
    overlap: float = 0.0
    about: tuple[tuple[str, Any], ...] = ()
    per_op: bool = False
    memory_spaces: tuple[tuple[int, float], ...] | Mapping[int, float] = ()
    asynchronous: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        flops = self.flops_per_second
        if isinstance(flops, Mapping | tuple):
            pairs = tuple(sorted(dict(flops).items()))
            if not pairs:
                raise ValueError("HardwareModel.flops_per_second: give at least one dtype")
            for dtype, value in pairs:
                positive(value, f"HardwareModel.flops_per_second[{dtype!r}]")
            object.__setattr__(self, "flops_per_second", pairs)
        else:
            positive(flops, "HardwareModel.flops_per_second")
        positive(self.memory_bandwidth, "HardwareModel.memory_bandwidth")
        if self.link_bandwidth is not None:
            positive(self.link_bandwidth, "HardwareModel.link_bandwidth")
        if self.memory_bytes is not None and not (
                isinstance(self.memory_bytes, int) and self.memory_bytes > 0):
            raise ValueError(f"HardwareModel.memory_bytes={self.memory_bytes!r} must be a "
                             "whole number of bytes > 0, or None")
        fits = self.fits.items() if isinstance(self.fits, Mapping) else self.fits
        fits = tuple(((kind, tuple(axes)), fit) for (kind, axes), fit in fits)
        for (kind, _axes), fit in fits:
            if kind not in COLLECTIVE_KINDS or not isinstance(fit, LinkFit):
                raise ValueError(f"HardwareModel.fits: ({kind!r}, ...) -> {fit!r}; keys are "
                                 f"(kind in {COLLECTIVE_KINDS}, axes), values LinkFit")
        object.__setattr__(self, "fits", fits)
        object.__setattr__(self, "mesh", tuple((str(a), int(s)) for a, s in self.mesh))
        object.__setattr__(self, "about", tuple(tuple(p) for p in self.about))
        spaces = dict(self.memory_spaces)
        for space, bandwidth in spaces.items():
            if not (isinstance(space, int) and not isinstance(space, bool) and space >= 0):
                raise ValueError(f"HardwareModel.memory_spaces: space {space!r} must be a "
                                 "whole number >= 0 (0: device memory, n: layouts marked S(n))")
            positive(bandwidth, f"HardwareModel.memory_spaces[{space}]")
        object.__setattr__(self, "memory_spaces", tuple(sorted(spaces.items())))
        if isinstance(self.asynchronous, str) or not all(
                isinstance(o, str) for o in self.asynchronous):
            raise ValueError(f"HardwareModel.asynchronous={self.asynchronous!r} must be a "
                             "tuple of HLO opcodes, e.g. ('copy-start',)")
        object.__setattr__(self, "asynchronous", tuple(self.asynchronous))
        positive(self.overlap, "HardwareModel.overlap", zero=True)
        if self.overlap > 1:
            raise ValueError(f"HardwareModel.overlap={self.overlap!r} must be in [0, 1]")
        if self.link_bandwidth is None and self.ici is None and not fits:
            raise ValueError(f"HardwareModel {self.name!r} cannot cost a collective: give "
                             "fits (a calibration), an ici link or a link_bandwidth")

    # --- estimating --------------------------------------------------------

    def peak(self, dtype: str) -> float:
        """Flops per second for matmuls whose operands have this HLO dtype."""
        if not isinstance(self.flops_per_second, tuple):
            return self.flops_per_second
        table = dict(self.flops_per_second)
        if dtype in table:
            return table[dtype]
        if "f32" in table:
            return table["f32"]
        return min(table.values())

    def estimate(self, program: ProgramCost, topology: Topology | None = None) -> float:
        """Seconds per step: `breakdown(program, topology).total`.

        Raises:
          ValueError: as `breakdown`.
        """
        return self.breakdown(program, topology).total

    def breakdown(self, program: ProgramCost, topology: Topology | None = None) -> Breakdown:
        """The estimate's parts (`cost.breakdown.Breakdown`).

        Args:
          program: the compiled step's cost figures.
          topology: the mesh it was compiled for, so each collective is
            charged by the axes it spans. Legacy models need none.

        Raises:
          ValueError: the HLO could not be read (its collectives and loop
            trips are unknown); the model needs a topology and got none; the
            fits were measured on a mesh whose axes have other sizes; a
            collective's axes have no fit and no link.
        """
        if program.link_bytes is None or program.hlo is None or program.collectives is None:
            raise ValueError(
                f"{self.name}: cannot estimate a program whose HLO could not be read "
                f"({program.hlo_error}); the collectives and loop trips are unknown")
        if isinstance(self.flops_per_second, tuple):
            by_dtype = dict(program.hlo.dot_flops_by_dtype)
            dot = math.fsum(by_dtype.values())
            compute = (math.fsum(f / self.peak(d) for d, f in by_dtype.items())
                       + max(0.0, program.flops - dot) / self.peak("f32"))
        else:
            compute = program.flops / self.flops_per_second
        memory = program.bytes_accessed / self.memory_bandwidth
        kernels = self._kernels(program.hlo.kernels) if self.prices_kernels(program) else 0.0
        if self.fits or self.ici is not None:
            if topology is None:
                raise ValueError(f"{self.name}: charging collectives by mesh axes needs the "
                                 "mesh's topology; pass Topology.of(mesh)")
            self._check_mesh(topology)
        rows: dict[tuple[str, tuple[str, ...]], list[float]] = {}
        for collective in program.collectives.collectives:
            axes, seconds = self._collective(collective, topology)
            row = rows.setdefault((collective.kind, axes), [0, 0.0, 0.0])
            row[0] += collective.count
            row[1] += collective.bytes * collective.count
            row[2] += seconds
        costs = tuple(CollectiveCost(kind, axes, int(n), nbytes, seconds)
                      for (kind, axes), (n, nbytes, seconds) in rows.items())
        return Breakdown(compute, memory, costs, self.overlap, kernels)

    def _kernels(self, kernels: tuple[KernelCost, ...]) -> float:
        """Seconds of the kernels, each at its own roofline: its matmul flops
        over the peak for their dtype, or its bytes over the bandwidth of the
        memory space they are in, whichever is longer."""
        bandwidth = dict(self.memory_spaces)
        device = bandwidth.get(0, self.memory_bandwidth)
        total = []
        for kernel in kernels:
            if kernel.opcode in self.asynchronous:
                continue
            placed = math.fsum(b for _, b in kernel.spaces)
            memory = (kernel.bytes - placed) / device + math.fsum(
                b / bandwidth.get(n, self.memory_bandwidth) for n, b in kernel.spaces)
            total.append(max(math.fsum(f / self.peak(d) for d, f in kernel.flops), memory))
        return math.fsum(total)

    def prices_kernels(self, program: ProgramCost) -> bool:
        """Whether `breakdown` prices `program` kernel by kernel: a `per_op`
        model, and a program not compiled by XLA:CPU. A CPU program priced
        with a chip's figures (`--hardware` without `--target`) has the CPU
        compiler's kernels, not the chip's: the published 16B v5e step so
        compiled came out 1.86x its published time priced per kernel, 1.28x
        as a whole (compiled by libtpu: 1.12x and 0.77x)."""
        return self.per_op and program.platform != "cpu"

    def _collective(self, c: Collective, topology: Topology | None
                    ) -> tuple[tuple[str, ...], float]:
        if not self.fits and self.ici is None:
            # A legacy model: ring-algorithm bytes over its one link, whatever
            # the axes (named, where the topology tells them, for the breakdown).
            try:
                axes = collective_axes(c, topology) if topology else ()
            except ValueError:
                axes = ()
            return axes, c.transferred_bytes() / self.link_bandwidth
        axes = collective_axes(c, topology)
        if not axes or c.count == 0:
            return axes, 0.0
        return axes, self.fit(c.kind, axes, topology).seconds(c.bytes) * c.count

    def fit(self, kind: str, axes: tuple[str, ...], topology: Topology) -> LinkFit:
        """The line charged for a `kind` collective spanning `axes` (mesh order).

        Raises:
          ValueError: no calibrated fit and no link for those axes.
        """
        for key, fit in self.fits:
            if key == (kind, axes):
                return fit
        crosses = topology.crosses_hosts(axes)
        link = self.dcn if crosses else self.ici
        if link is not None:
            return link.fit(kind, topology.size(axes), len(axes))
        if crosses and self.ici is not None:
            raise ValueError(f"{self.name}: axes {axes} cross hosts but the model has no "
                             "dcn link; give one or leave those axes out of dcn_axes")
        raise ValueError(
            f"{self.name}: no calibrated fit for {kind} over {axes}; calibrate that group "
            f"of axes (shardsearch calibrate --mesh ...) or use a model with links")

    def _check_mesh(self, topology: Topology) -> None:
        sizes = topology.shape
        wrong = [f"{a}={s} (mesh: {sizes.get(a)})" for a, s in self.mesh
                 if a in sizes and sizes[a] != s]
        if wrong and self.fits:
            raise ValueError(
                f"{self.name}: calibrated on {dict(self.mesh)}, but the mesh has "
                f"{sizes}: {', '.join(wrong)}; calibrate this mesh")

    # --- the JSON form -----------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The versioned JSON form, as calibration files store it."""
        flops = (dict(self.flops_per_second) if isinstance(self.flops_per_second, tuple)
                 else self.flops_per_second)
        return {
            "schema": SCHEMA, "name": self.name, "flops_per_second": flops,
            "memory_bandwidth": self.memory_bandwidth, "memory_bytes": self.memory_bytes,
            "link_bandwidth": self.link_bandwidth,
            "ici": self.ici.to_json() if self.ici else None,
            "dcn": self.dcn.to_json() if self.dcn else None,
            "overlap": self.overlap, "mesh": dict(self.mesh),
            "collectives": [{"kind": kind, "axes": list(axes), "latency": fit.latency,
                             "bandwidth": fit.bandwidth}
                            for (kind, axes), fit in self.fits],
            "about": dict(self.about),
            # Only where set: the models that price no kernel keep their form.
            **({"per_op": True} if self.per_op else {}),
            **({"memory_spaces": {str(n): b for n, b in self.memory_spaces}}
               if self.memory_spaces else {}),
            **({"asynchronous": list(self.asynchronous)} if self.asynchronous else {}),
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "hardware model") -> HardwareModel:
        """A model from `to_json`'s form; every field is checked.

        Raises:
          ValueError: one line naming `where` and the field that is missing
            or wrong, e.g. "cal.json: field 'collectives[3].bandwidth' must
            be a positive number, got -1".
        """
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        unknown = [k for k in data if k not in _KEYS]
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}; the fields are {_KEYS}")
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{where}: field 'schema' is {data.get('schema')!r}; this "
                             f"version reads schema {SCHEMA}")
        field = _Fields(data, where)
        name = field.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: field 'name' must be a non-empty string, got {name!r}")
        flops = field.get("flops_per_second")
        if isinstance(flops, dict):
            flops = {d: positive(v, f"{where}: field 'flops_per_second.{d}'")
                     for d, v in flops.items()}
        else:
            flops = positive(flops, f"{where}: field 'flops_per_second'")
        memory_bytes = field.get("memory_bytes", None)
        if memory_bytes is not None and not (isinstance(memory_bytes, int)
                                             and not isinstance(memory_bytes, bool)
                                             and memory_bytes > 0):
            raise ValueError(f"{where}: field 'memory_bytes' must be a whole number > 0 or "
                             f"null, got {memory_bytes!r}")
        mesh = field.get("mesh", {})
        if not isinstance(mesh, dict) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0
                for s in mesh.values()):
            raise ValueError(f"{where}: field 'mesh' must map axis names to sizes, got "
                             f"{mesh!r}")
        about = field.get("about", {})
        if not isinstance(about, dict):
            raise ValueError(f"{where}: field 'about' must be an object, got {about!r}")
        overlap = field.number("overlap", optional=True, zero=True) or 0.0
        if overlap > 1:
            raise ValueError(f"{where}: field 'overlap' must be in [0, 1], got {overlap!r}")
        memory_bandwidth = field.number("memory_bandwidth")
        link_bandwidth = field.number("link_bandwidth", optional=True)
        ici, dcn, fits = field.link("ici"), field.link("dcn"), field.fits()
        per_op = data.get("per_op", False)
        if not isinstance(per_op, bool):
            raise ValueError(f"{where}: field 'per_op' must be true or false, got {per_op!r}")
        spaces = field.get("memory_spaces", {})
        if not isinstance(spaces, dict) or not all(
                isinstance(n, str) and n.isdigit() for n in spaces):
            raise ValueError(f"{where}: field 'memory_spaces' must map memory spaces (\"0\", "
                             f"\"1\", ...) to bandwidths, got {spaces!r}")
        spaces = {int(n): positive(b, f"{where}: field 'memory_spaces.{n}'")
                  for n, b in spaces.items()}
        asynchronous = field.get("asynchronous", [])
        if not isinstance(asynchronous, list) or not all(
                isinstance(o, str) for o in asynchronous):
            raise ValueError(f"{where}: field 'asynchronous' must be a list of HLO opcodes, "
                             f"got {asynchronous!r}")
        try:
            return cls(name, flops, memory_bandwidth, link_bandwidth, memory_bytes, ici, dcn,
                       fits, tuple(mesh.items()), overlap, tuple(about.items()), per_op,
                       tuple(spaces.items()), tuple(asynchronous))
        except ValueError as err:  # what only the whole model can check
            raise ValueError(f"{where}: {err}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HardwareModel:
        """The model in a JSON file (what `shardsearch calibrate --out` writes).

        Raises:
          OSError: the file cannot be read.
          ValueError: not JSON, or a field missing or wrong (naming the file
            and the field).
        """
        return cls.from_json(read_json(path), str(path))

    def save(self, path: str | os.PathLike[str], **extra: Any) -> None:
        """Writes `to_json()` (plus `extra` top-level fields such as "samples")."""
        data = self.to_json() | extra
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, allow_nan=False)
            f.write("\n")


def collective_axes(c: Collective, topology: Topology) -> tuple[str, ...]:
    """The mesh axes a collective's groups span, in mesh order; () when it moves nothing.

    The groups are XLA's device ids (every syntax, the `mesh[...]` one
    included, expanded by `cost.hlo`); XLA's own axis names in that syntax
    (`axis_0`, ...) say nothing about the mesh's, so they are not used.

    Raises:
      ValueError: the groups were not printed and do not cover every device,
        so the axes are unknown.
    """
    if c.group_size <= 1:
        return ()
    if c.groups:
        return topology.axes_spanned(c.groups)
    # No groups printed (or "{}"): one group of every device.
    if c.group_size == topology.num_devices:
        return topology.axis_names
    raise ValueError(f"collective {c.name!r} spans {c.group_size} devices but its groups "
                     f"were not printed and the mesh {topology.shape} has "
                     f"{topology.num_devices}; its axes are unknown")


class _Fields:
    """Reads one model's JSON fields, each error naming the file and the field."""

    def __init__(self, data: dict[str, Any], where: str):
        self.data, self.where = data, where

    def get(self, key: str, *default: Any) -> Any:
        if key not in self.data:
            if default:
                return default[0]
            raise ValueError(f"{self.where}: field {key!r} is missing")
        return self.data[key]

    def number(self, key: str, *, optional: bool = False, zero: bool = False) -> float | None:
        value = self.get(key, None) if optional else self.get(key)
        if value is None and optional:
            return None
        return positive(value, f"{self.where}: field {key!r}", zero=zero)

    def link(self, key: str) -> Link | None:
        value = self.get(key, None)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"{self.where}: field {key!r} must be an object or null")
        sub = _Fields(value, f"{self.where}: field '{key}.")
        bandwidth = positive(sub.get("bandwidth"), f"{self.where}: field '{key}.bandwidth'")
        latency = positive(sub.get("latency"), f"{self.where}: field '{key}.latency'",
                           zero=True)
        torus, wrap = value.get("torus", False), value.get("wraparound_from", 0)
        if not isinstance(torus, bool):
            raise ValueError(f"{self.where}: field '{key}.torus' must be true or false")
        if not isinstance(wrap, int) or isinstance(wrap, bool) or wrap < 0:
            raise ValueError(f"{self.where}: field '{key}.wraparound_from' must be a "
                             f"whole number >= 0, got {wrap!r}")
        return Link(bandwidth, latency, torus, wrap)

    def fits(self) -> Fits:
        rows = self.get("collectives", [])
        if not isinstance(rows, list):
            raise ValueError(f"{self.where}: field 'collectives' must be a list")
        fits = []
        for i, row in enumerate(rows):
            at = f"{self.where}: field 'collectives[{i}]"
            if not isinstance(row, dict):
                raise ValueError(f"{at}' must be an object")
            kind, axes = row.get("kind"), row.get("axes")
            if kind not in COLLECTIVE_KINDS:
                raise ValueError(f"{at}.kind' must be one of {COLLECTIVE_KINDS}, got {kind!r}")
            if (not isinstance(axes, list) or not axes
                    or not all(isinstance(a, str) for a in axes)):
                raise ValueError(f"{at}.axes' must be a non-empty list of axis names, "
                                 f"got {axes!r}")
            for part in ("latency", "bandwidth"):
                if part not in row:
                    raise ValueError(f"{at}.{part}' is missing")
            fits.append(((kind, tuple(axes)), LinkFit(
                positive(row["latency"], f"{at}.latency'", zero=True),
                positive(row["bandwidth"], f"{at}.bandwidth'"))))
        return tuple(fits)
