"""Which mesh axes a collective crosses, and which of them leave the host.

A compiled SPMD program names the devices of each collective by partition
id: a device's position in the mesh's flattened (row-major) device order.
`Topology` unravels those ids in the mesh's shape, so a replica group whose
ids differ only in the `tp` coordinate is a `tp` collective, and one whose ids
differ in `dp` and `tp` spans both. The cost model (`cost.hardware`) charges
each collective with the link of the axes it spans; `dcn_axes` says which of
them cross hosts (data-centre network, InfiniBand) instead of the fast links
inside a slice or node (ICI, NVLink).

Example:
  >>> topo = Topology(("dp", "tp"), (2, 4), dcn_axes=("dp",))
  >>> topo.axes_spanned([(0, 1, 2, 3), (4, 5, 6, 7)])
  ('tp',)
  >>> topo.axes_spanned([(0, 4), (1, 5)]), topo.crosses_hosts(("dp",))
  (('dp',), True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Topology:
    """A mesh's axes in device order, and which of them cross hosts.

    Attributes:
      axis_names: the mesh's axis names, outermost first.
      axis_sizes: the size of each axis.
      dcn_axes: the axes whose neighbours sit on different hosts; every
        other axis runs over the links inside a slice or node.
    """

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    dcn_axes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "axis_names", tuple(self.axis_names))
        object.__setattr__(self, "axis_sizes", tuple(int(s) for s in self.axis_sizes))
        object.__setattr__(self, "dcn_axes", tuple(self.dcn_axes))
        if len(self.axis_names) != len(self.axis_sizes):
            raise ValueError(f"Topology: {len(self.axis_names)} axis names "
                             f"{self.axis_names} but {len(self.axis_sizes)} sizes "
                             f"{self.axis_sizes}; give one size per axis")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ValueError(f"Topology: repeated axis name in {self.axis_names}")
        for name, size in zip(self.axis_names, self.axis_sizes, strict=True):
            if size < 1:
                raise ValueError(f"Topology: axis {name!r} has size {size}; sizes are >= 1")
        unknown = [a for a in self.dcn_axes if a not in self.axis_names]
        if unknown:
            raise ValueError(f"Topology: dcn_axes {unknown} are not mesh axes "
                             f"{self.axis_names}; name axes of the mesh")

    @classmethod
    def of(cls, mesh: Any, dcn_axes: Iterable[str] = ()) -> Topology:
        """The topology of a `jax.sharding.Mesh` or `AbstractMesh`."""
        names = tuple(mesh.axis_names)
        shape = mesh.shape  # an ordered name -> size mapping on both kinds
        return cls(names, tuple(int(shape[n]) for n in names), tuple(dcn_axes))

    @property
    def shape(self) -> dict[str, int]:
        """`{axis: size}` in mesh order."""
        return dict(zip(self.axis_names, self.axis_sizes, strict=True))

    @property
    def num_devices(self) -> int:
        return math.prod(self.axis_sizes)

    def size(self, axes: Sequence[str]) -> int:
        """Devices in a group spanning `axes` (the product of their sizes)."""
        return math.prod(self.shape[a] for a in axes)

    def crosses_hosts(self, axes: Sequence[str]) -> bool:
        """Whether a collective over `axes` uses the network between hosts."""
        return any(a in self.dcn_axes for a in axes)

    def axes_spanned(self, groups: Iterable[Sequence[int]]) -> tuple[str, ...]:
        """The axes along which the ids of any one group differ, in mesh order.

        Args:
          groups: device-id groups (replica groups, or a permute's
            (source, target) pairs) in partition-id numbering.

        Raises:
          ValueError: an id outside the mesh (the program was compiled for
            another mesh).
        """
        n = self.num_devices
        varying = [False] * len(self.axis_names)
        for group in groups:
            first = None
            for device in group:
                if not 0 <= device < n:
                    raise ValueError(
                        f"device id {device} in a replica group is outside the "
                        f"{n}-device mesh {self.shape}; "
                        "estimate the program with the mesh it was compiled for")
                coords = self._coords(device)
                if first is None:
                    first = coords
                    continue
                for i, (a, b) in enumerate(zip(first, coords, strict=True)):
                    varying[i] = varying[i] or a != b
        return tuple(name for name, v in zip(self.axis_names, varying, strict=True) if v)

    def _coords(self, device: int) -> tuple[int, ...]:
        coords = []
        for size in reversed(self.axis_sizes):
            device, c = divmod(device, size)
            coords.append(c)
        return tuple(reversed(coords))
