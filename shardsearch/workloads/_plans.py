"""The plan types: mesh axis roles, a plan, and why a plan does not apply."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from jax.sharding import PartitionSpec as P

from ..base import spec as _spec
from ..base.analyzer import ShardingAnalyzer
from ..rules.base import ShardingRule
from ..rules.batch import BatchShardingRule

ROLES = ("data", "fsdp", "tensor", "expert")

# Axis names from_mesh understands; anything else needs explicit MeshRoles.
_ROLE_OF_NAME = {
    "dp": "data", "data": "data", "batch": "data",
    "fsdp": "fsdp",
    "tp": "tensor", "tensor": "tensor", "model": "tensor", "mp": "tensor",
    "ep": "expert", "expert": "expert",
}


class PlanNotApplicable(ValueError):
    """An expert plan cannot shard this workload on this mesh; the message says why."""


@dataclasses.dataclass(frozen=True)
class MeshRoles:
    """Which mesh axes play which part in the expert plans.

    Args:
        data: axes that split the batch only.
        fsdp: axes that split the batch and the parameters' d_model dims.
        tensor: axes that split heads, d_ff and the vocabulary.
        expert: axes that split the experts of a mixture-of-experts layer.

    Raises:
        TypeError: an entry is not a str.
        ValueError: an axis appears in two roles (or twice in one).

    Example:
        >>> MeshRoles(data=("dp",), tensor=("tp",))
    """

    data: tuple[str, ...] = ()
    fsdp: tuple[str, ...] = ()
    tensor: tuple[str, ...] = ()
    expert: tuple[str, ...] = ()

    def __post_init__(self):
        seen: dict[str, str] = {}
        for role in ROLES:
            axes = getattr(self, role)
            axes = (axes,) if isinstance(axes, str) else tuple(axes)
            for axis in axes:
                if not isinstance(axis, str) or not axis:
                    raise TypeError(f"MeshRoles.{role}: axis names must be non-empty str, "
                                    f"got {axis!r}")
                if axis in seen:
                    raise ValueError(
                        f"MeshRoles: axis {axis!r} is in both {seen[axis]!r} and {role!r}; "
                        "give each mesh axis one role")
                seen[axis] = role
            object.__setattr__(self, role, axes)

    @classmethod
    def from_mesh(cls, mesh: Any) -> MeshRoles:
        """Infers roles from axis names: dp/data/batch -> data, fsdp -> fsdp,
        tp/tensor/model/mp -> tensor, ep/expert -> expert.

        Raises:
            ValueError: an axis name is not one of those.
        """
        roles: dict[str, list[str]] = {role: [] for role in ROLES}
        unknown = [a for a in mesh.axis_names if a not in _ROLE_OF_NAME]
        if unknown:
            raise ValueError(
                f"cannot infer the role of mesh axis {unknown[0]!r} (mesh axes "
                f"{tuple(mesh.axis_names)}); known names are {tuple(_ROLE_OF_NAME)}. Pass "
                "MeshRoles(data=..., fsdp=..., tensor=..., expert=...) explicitly")
        for axis in mesh.axis_names:
            roles[_ROLE_OF_NAME[axis]].append(axis)
        return cls(**{role: tuple(axes) for role, axes in roles.items()})


@dataclasses.dataclass(frozen=True)
class Plan:
    """A complete sharding: a rule for the train state, a spec for the batch.

    Args:
        name: the plan's name, e.g. "megatron".
        state_rule: gives every state leaf (params and Adam moments) a spec.
        batch_spec: spec of the batch's leading dim only: `P()`, `P("dp")`
            or `P(("dp", "tp"))`.
        description: one line on what the plan does on this mesh.

    Raises:
        TypeError: wrong field types.
        ValueError: `batch_spec` has more than one entry.
    """

    name: str
    state_rule: ShardingRule
    batch_spec: P
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Plan name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.state_rule, ShardingRule):
            raise TypeError(f"Plan {self.name!r}: state_rule must be a ShardingRule, got "
                            f"{type(self.state_rule).__name__}")
        if not isinstance(self.batch_spec, P):
            raise TypeError(f"Plan {self.name!r}: batch_spec must be a PartitionSpec, got "
                            f"{self.batch_spec!r}")
        if len(self.batch_spec) > 1:
            raise ValueError(
                f"Plan {self.name!r}: batch_spec={self.batch_spec} has {len(self.batch_spec)} "
                "entries; it describes the leading (batch) dim only, e.g. P(('dp', 'tp'))")
        entry = self.batch_spec[0] if len(self.batch_spec) else None
        if not (entry is None or isinstance(entry, str) or (
                isinstance(entry, tuple) and entry and all(isinstance(a, str) for a in entry))):
            raise TypeError(
                f"Plan {self.name!r}: batch_spec entry {entry!r} must be None, an axis name "
                "or a tuple of axis names")

    @property
    def batch_rule(self) -> BatchShardingRule:
        """`batch_spec` as a rule: every batch leaf's leading dim on its axes.

        `Plan("dp", rule, P(("dp", "tp"))).batch_rule == BatchShardingRule(("dp", "tp"))`.
        """
        entry = self.batch_spec[0] if len(self.batch_spec) else None
        return BatchShardingRule(_spec.entry_axes(entry))

    def specs(self, args: tuple[Any, Any], mesh: Any = None) -> tuple[Any, Any]:
        """Spec trees for `(state, batch)`.

        Args:
            args: `(state, batch)`, concrete or abstract.
            mesh: when given, the batch spec's axes and the divisibility of
                every batch leaf's leading dim are checked against it.

        Returns:
            `(state_specs, batch_specs)`: `state_rule.apply(state)`, and for
            `batch_rule.apply(batch)`: every batch leaf `P(batch_spec[0])`
            (`P()` for scalars).

        Raises:
            ValueError: `args` is not a pair, or (with `mesh`) a batch axis is
                missing from the mesh or does not divide a leaf's leading dim.
        """
        if not isinstance(args, tuple | list) or len(args) != 2:
            raise ValueError(f"Plan {self.name!r}: specs() takes a (state, batch) pair, got "
                             f"{type(args).__name__}; call plan.specs((state, batch))")
        state, batch = args
        batch_specs = self.batch_rule.apply(batch)
        if mesh is not None:
            problems = ShardingAnalyzer(mesh).validate_partition_specs(batch, batch_specs)
            if problems:
                raise ValueError(f"Plan {self.name!r}: the batch spec {self.batch_spec} does "
                                 "not fit this mesh:\n  " + "\n  ".join(problems))
        return self.state_rule.apply(state), batch_specs


class ExpertPlans(NamedTuple):
    """The plans that apply and, for the rest, why not (both insertion-ordered)."""

    plans: dict[str, Plan]
    skipped: dict[str, str]


