"""Pinning the activations' batch dim to mesh axes, as MaxText's logical constraints do.

The search's rules shard a step's arguments only; XLA's sharding propagation
decides the rest. On a pure FSDP plan (each weight's d_model dim and the batch
on the same axis) propagation may keep the weights where they are and gather
the batch instead, all-reducing whole activations: for MaxText's 16B on 256
chips that is tens of TB per step. MaxText avoids it by constraining the
activations (`nn.with_logical_constraint(x, ("activation_batch", ...))`), and
Megatron-LM by construction. An `ActivationSharding` does the same for the
built-in transformers: the residual stream's batch dim is constrained to the
given mesh axes at the embedding and at every block's input; its other dims
are left to XLA.

The constraint names a mesh (an `AbstractMesh` of the given axis sizes), so a
workload that carries one compiles only on a mesh with those axes and sizes.

Example:
    >>> ActivationSharding.from_json({"mesh": {"fsdp": 256, "tp": 1}, "batch": ["fsdp"]})
    ActivationSharding(mesh=(('fsdp', 256), ('tp', 1)), batch=('fsdp',))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class ActivationSharding:
    """The mesh a step is planned for and the axes its activations' batch dim is on.

    Args:
        mesh: `(axis name, size)` pairs, in mesh order.
        batch: the axes the batch dim of every activation is constrained to
            (at least one; each an axis of `mesh`).

    Raises:
        ValueError: no axes, a size that is not a positive int, a batch axis
            the mesh lacks or named twice.
    """

    mesh: tuple[tuple[str, int], ...]
    batch: tuple[str, ...]

    def __post_init__(self):
        mesh = tuple((str(a), s) for a, s in self.mesh)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "batch", tuple(self.batch))
        bad = [f"{a}={s!r}" for a, s in mesh
               if isinstance(s, bool) or not isinstance(s, int) or s < 1]
        if not mesh or bad:
            raise ValueError(f"activation_sharding.mesh must map axis names to sizes >= 1, got "
                             f"{dict(mesh)!r}")
        names = [a for a, _ in mesh]
        stray = [a for a in self.batch if a not in names]
        if not self.batch or stray or len(set(self.batch)) != len(self.batch):
            raise ValueError(f"activation_sharding.batch={list(self.batch)!r} must name "
                             f"distinct axes of the mesh {names}, at least one")

    def constrain(self, x: jax.Array) -> jax.Array:
        """`x` with its leading (batch) dim on `batch`, its other dims left to XLA."""
        names = tuple(a for a, _ in self.mesh)
        mesh = AbstractMesh(tuple(s for _, s in self.mesh), names)
        entry = self.batch[0] if len(self.batch) == 1 else self.batch
        spec = P(entry, *([P.UNCONSTRAINED] * (x.ndim - 1)))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def to_json(self) -> dict[str, Any]:
        return {"mesh": dict(self.mesh), "batch": list(self.batch)}

    @classmethod
    def from_json(cls, data: Any) -> ActivationSharding:
        """From `{"mesh": {"fsdp": 256, "tp": 1}, "batch": ["fsdp"]}`.

        Raises:
            ValueError: not that form.
        """
        if not isinstance(data, Mapping) or set(data) != {"mesh", "batch"} or not isinstance(
                data["mesh"], Mapping) or not isinstance(data["batch"], list | tuple):
            raise ValueError(
                "activation_sharding must be {\"mesh\": {axis: size, ...}, \"batch\": [axis, "
                f"...]}}, got {data!r}")
        return cls(tuple(data["mesh"].items()), tuple(data["batch"]))


def constrain(sharding: ActivationSharding | None, x: jax.Array) -> jax.Array:
    """`sharding.constrain(x)`, or `x` itself (no operation traced) for None."""
    return x if sharding is None else sharding.constrain(x)
