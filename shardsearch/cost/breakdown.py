"""Where an estimated step's seconds go: compute, memory, and each collective.

A `Breakdown` is what `HardwareModel.breakdown` returns and what every
estimated trial records. Its parts add up to the estimate:

    total = roofline + communication - hidden
    roofline = kernels if priced per kernel, else max(compute, memory)
    hidden = overlap * min(roofline, communication)

so `overlap` 0 charges communication after the compute (nothing overlaps),
and 1 charges only the larger of the two (communication runs entirely beside
the compute, as XLA's asynchronous collectives can). `kernels`, where the
model prices each kernel of the program by its own roofline
(`HardwareModel.per_op`), is the sum over kernels of the larger of their
compute and memory seconds: never less than max(compute, memory), since a
matmul that waits for its operands and an elementwise pass that leaves the
matrix unit idle each take their own time.

Example:
  >>> b = Breakdown(compute=2.0, memory=1.0, overlap=0.5,
  ...               collectives=(CollectiveCost("all-reduce", ("dp",), 4, 4e9, 1.0),))
  >>> b.total, b.bound, b.hidden
  (2.5, 'compute', 0.5)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..base.units import format_bytes, format_seconds
from .links import positive


@dataclasses.dataclass(frozen=True)
class CollectiveCost:
    """One collective kind over one group of mesh axes, summed over the step.

    Attributes:
      kind: e.g. "all-gather".
      axes: the mesh axes its groups span, in mesh order.
      count: executions per step.
      bytes: `Collective.bytes` times executions, per device.
      seconds: the time charged for all of them.
    """

    kind: str
    axes: tuple[str, ...]
    count: int
    bytes: float
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "axes": list(self.axes), "count": self.count,
                "bytes": self.bytes, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Any, where: str) -> CollectiveCost:
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object, got {type(data).__name__}")
        axes = data.get("axes")
        if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
            raise ValueError(f"{where}.axes must be a list of axis names, got {axes!r}")
        count = data.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"{where}.count must be a whole number >= 0, got {count!r}")
        return cls(str(data.get("kind")), tuple(axes), count,
                   positive(data.get("bytes"), f"{where}.bytes", zero=True),
                   positive(data.get("seconds"), f"{where}.seconds", zero=True))


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """An estimate's parts (module doc): seconds of compute, memory traffic and
    each collective, and how much communication the compute hides.

    Attributes:
      compute: flops over the chip's throughput for their dtypes.
      memory: bytes accessed over memory bandwidth.
      collectives: one entry per (kind, axes), in order of first appearance.
      overlap: the fraction of the smaller of compute-or-memory and
        communication that runs concurrently with the other (0..1).
      kernels: the per-kernel roofline in seconds (module doc); 0.0 where
        the model does not price kernels (the roofline is then
        max(compute, memory)).
    """

    compute: float
    memory: float
    collectives: tuple[CollectiveCost, ...] = ()
    overlap: float = 0.0
    kernels: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "collectives", tuple(self.collectives))
        if not (isinstance(self.overlap, int | float) and 0 <= self.overlap <= 1):
            raise ValueError(f"Breakdown.overlap={self.overlap!r} must be in [0, 1]")
        for field in ("compute", "memory", "kernels"):
            positive(getattr(self, field), f"Breakdown.{field}", zero=True)

    @property
    def bound(self) -> str:
        """"compute" or "memory": which roofline term is charged."""
        return "compute" if self.compute >= self.memory else "memory"

    @property
    def roofline(self) -> float:
        """`kernels` where they are priced, else max(compute, memory)."""
        return self.kernels or max(self.compute, self.memory)

    @property
    def communication(self) -> float:
        return math.fsum(c.seconds for c in self.collectives)

    @property
    def hidden(self) -> float:
        """Seconds of communication taken off because they overlap."""
        return self.overlap * min(self.roofline, self.communication)

    @property
    def total(self) -> float:
        """The estimate: roofline + communication - hidden."""
        return self.roofline + self.communication - self.hidden

    def to_json(self) -> dict[str, Any]:
        """The recorded form (trials' user attrs, plan files' results rows)."""
        out = {"total": self.total, "compute": self.compute, "memory": self.memory,
               "communication": self.communication, "hidden": self.hidden,
               "overlap": self.overlap,
               "collectives": [c.to_json() for c in self.collectives]}
        if self.kernels:  # records of models that price no kernel keep their form
            out["kernels"] = self.kernels
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "breakdown") -> Breakdown:
        """Reads `to_json`'s form back (derived fields are recomputed, not trusted)."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be an object, got {type(data).__name__}")
        rows = data.get("collectives", [])
        if not isinstance(rows, list):
            raise ValueError(f"{where}.collectives must be a list, got {rows!r}")
        overlap = positive(data.get("overlap", 0.0), f"{where}.overlap", zero=True)
        return cls(positive(data.get("compute"), f"{where}.compute", zero=True),
                   positive(data.get("memory"), f"{where}.memory", zero=True),
                   tuple(CollectiveCost.from_json(r, f"{where}.collectives[{i}]")
                         for i, r in enumerate(rows)), overlap,
                   positive(data.get("kernels", 0.0), f"{where}.kernels", zero=True))

    def lines(self) -> list[str]:
        """A few readable lines, largest collective first, e.g.
        "compute 1.20 s (bound), memory 0.40 s, communication 0.30 s (0.15 s hidden)"."""
        roofline = "kernels" if self.kernels else self.bound
        out = [f"total {format_seconds(self.total)} = {roofline} {format_seconds(self.roofline)} "
               f"+ communication {format_seconds(self.communication)} - hidden "
               f"{format_seconds(self.hidden)} (overlap {self.overlap:g})",
               f"compute {format_seconds(self.compute)}, memory {format_seconds(self.memory)}"]
        for c in sorted(self.collectives, key=lambda c: -c.seconds):
            axes = ",".join(c.axes) or "-"
            out.append(f"{c.kind} over {axes}: {format_seconds(c.seconds)}, {c.count}x, "
                       f"{format_bytes(int(c.bytes))}")
        return out
