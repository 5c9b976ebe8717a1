"""The built-in transformers' activation points, and pinning their batch dim.

The search's rules shard a step's arguments only; XLA's sharding propagation
decides the rest. The built-in transformers name their activations through
`shardsearch.activation` (`base.activations`), so a search can place them
(`optimize(..., knobs=True)`: the `act_<name>` knobs):

- the residual stream, `RESIDUAL` (at the embedding and every block's input);
- the attention's queries, `HEADS`, its keys and values, `KV`, and its
  score matrix, `SCORES`;
- the MLP's hidden state, `HIDDEN`.

An `ActivationSharding` is one fixed choice of that space, as MaxText's
logical constraints make it (`nn.with_logical_constraint(x,
("activation_batch", ...))`): the `batch` dim of every point on the given
mesh axes, the other dims left to XLA. On a pure FSDP plan (each weight's
d_model dim and the batch on the same axis) propagation may otherwise keep the
weights where they are and gather the batch instead, all-reducing whole
activations: for MaxText's 16B on 256 chips that is tens of TB per step. It
is a model's default: a search's `act_batch` knob overrides it.

The constraint names a mesh (an `AbstractMesh` of the given axis sizes), so a
workload that carries one compiles only on a mesh with those axes and sizes.

Example:
    >>> ActivationSharding.from_json({"mesh": {"fsdp": 256, "tp": 1}, "batch": ["fsdp"]})
    ActivationSharding(mesh=(('fsdp', 256), ('tp', 1)), batch=('fsdp',))
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

from ..base.activations import activation_rules


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


def placed(sharding: ActivationSharding | None) -> contextlib.AbstractContextManager[None]:
    """The points traced inside with their batch dim on `sharding.batch`
    (unless a search places it), or nothing for None."""
    if sharding is None:
        return contextlib.nullcontext()
    entry = sharding.batch[0] if len(sharding.batch) == 1 else sharding.batch
    return activation_rules({"batch": entry}, sharding.mesh, fill=True)


# The names of the built-in transformers' points, one per dim.
RESIDUAL = ("batch", "seq", "embed")
HEADS = ("batch", "seq", "heads", None)
KV = ("batch", "seq", "kv_heads", None)
SCORES = ("batch", "kv_heads", None, None, None)
HIDDEN = ("batch", "seq", "mlp")
