"""What one collective costs: a fitted line per (kind, axes), or a link's figures.

Every collective is charged `latency + bytes / bandwidth` seconds per
execution (`LinkFit`), where `bytes` is what `cost.hlo.Collective.bytes`
reads from the HLO: the per-device result (for an all-gather the gathered
buffer, for a reduce-scatter the scattered one). A calibration
(`cost.calibrate`) measures such a line for each collective kind and each
group of mesh axes on the devices at hand. A named chip has no measurements,
so `Link` turns spec-sheet figures into the same line with the collective
formulas of the JAX scaling book (see `../shared/ANCHORS.md`):

- all-gather of a V-byte array over n devices: V (n-1)/n / W;
- reduce-scatter: the same, with V = n x the scattered bytes;
- all-reduce: twice the all-gather;
- all-to-all: a quarter of the all-gather of the whole array on a torus,
  (n-1)/n of the local buffer at the egress bandwidth on a switch;
- collective-permute: the buffer over one link.

W is the bandwidth one device drives on that axis: a torus link's one-way
figure, doubled where the ring wraps around (both directions carry data) and
multiplied by the number of axes spanned; on a switch (NVLink, a data-centre
network) it is the device's egress bandwidth.

Example:
  >>> ici = Link(bandwidth=4.5e10, latency=1e-6, torus=True, wraparound_from=16)
  >>> fit = ici.fit("all-gather", group_size=4, num_axes=1)
  >>> round(fit.seconds(34e6) * 1e6)  # 34 MB gathered over 4 v5e chips, no wraparound
  570
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .hlo import COLLECTIVE_KINDS


def positive(value: Any, where: str, *, zero: bool = False) -> float:
    """`value` as a float, checked finite and > 0 (>= 0 with `zero`).

    Raises:
      ValueError: naming `where`, e.g. "calibration.json: field
        'collectives[2].bandwidth' must be a positive number, got 'fast'".
    """
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value) and (value >= 0 if zero else value > 0))
    if not ok:
        raise ValueError(f"{where} must be a {'non-negative' if zero else 'positive'} "
                         f"number, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class LinkFit:
    """Seconds for one execution of a collective: `latency + bytes / bandwidth`.

    Attributes:
      latency: seconds per execution whatever its size (>= 0).
      bandwidth: bytes of `Collective.bytes` moved per second (> 0).
    """

    latency: float
    bandwidth: float

    def __post_init__(self) -> None:
        positive(self.latency, "LinkFit.latency", zero=True)
        positive(self.bandwidth, "LinkFit.bandwidth")

    def seconds(self, nbytes: float) -> float:
        """The time of one execution moving `nbytes` (per device, as XLA reports)."""
        return self.latency + nbytes / self.bandwidth


@dataclasses.dataclass(frozen=True)
class Link:
    """A class of links, from spec-sheet figures: inside a slice or node, or across.

    Attributes:
      bandwidth: bytes per second one device sends in one direction on one
        axis (a torus link, or the device's share of a switch's egress).
      latency: seconds per hop (torus) or per step of a collective (switch).
      torus: neighbours are wired in rings (TPU ICI); False for a switch
        (NVLink/NVSwitch, InfiniBand, a data-centre network), where every
        device reaches every other at `bandwidth`.
      wraparound_from: on a torus, axes of at least this many devices close
        their ring and send both ways; shorter ones are lines, one way.
        0 means every axis wraps.
    """

    bandwidth: float
    latency: float
    torus: bool = False
    wraparound_from: int = 0

    def __post_init__(self) -> None:
        positive(self.bandwidth, "Link.bandwidth")
        positive(self.latency, "Link.latency", zero=True)
        if not isinstance(self.wraparound_from, int) or self.wraparound_from < 0:
            raise ValueError(f"Link.wraparound_from={self.wraparound_from!r} must be a "
                             "whole number >= 0")

    def fit(self, kind: str, group_size: int, num_axes: int) -> LinkFit:
        """The line for one `kind` of collective over `group_size` devices on
        `num_axes` mesh axes (see the module doc for the formulas).

        Raises:
          ValueError: an unknown kind, or a group smaller than 2.
        """
        if kind not in COLLECTIVE_KINDS:
            raise ValueError(f"unknown collective kind {kind!r}; one of {COLLECTIVE_KINDS}")
        n = group_size
        if n < 2:
            raise ValueError(f"a {kind} over {n} device moves nothing; nothing to fit")
        width = self.bandwidth * max(num_axes, 1) if self.torus else self.bandwidth
        if self.torus and n >= self.wraparound_from:
            width *= 2
        # Steps of a ring: a torus sends both ways, so half the ring's length.
        steps = (n - 1) / 2 if self.torus and n >= self.wraparound_from else n - 1
        gather = n / (n - 1) * width  # bytes of the gathered V per second
        line = {
            "all-gather": (steps, gather),
            "reduce-scatter": (steps, width / (n - 1)),
            "all-reduce": (2 * steps, gather / 2),
            "all-to-all": ((steps, 4 * width / (n - 1)) if self.torus
                           else (steps, n / (n - 1) * width)),
            "collective-permute": (1.0, self.bandwidth),
        }
        hops, bandwidth = line[kind]
        return LinkFit(self.latency * hops, bandwidth)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
