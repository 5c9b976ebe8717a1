"""Expert sharding plans: the hand-written baselines the search is compared with.

Each plan is a `ShardingRule` for the train state plus a spec for the batch's
leading dim. The plans that split weights (`megatron`, `fsdp_tp`, `ep`) are
written once as logical axes per parameter (MaxText / flax logical-axis
style) and each plan maps the logical axes onto mesh axes chosen by role:

    logical   what it is                         megatron  fsdp_tp  ep
    embed     d_model dims (and mlp's d_in)      -         fsdp     fsdp
    heads     query heads (n_heads*head_dim)     tensor    tensor   tensor
    kv_heads  key/value heads                    tensor*   tensor*  tensor*
    mlp       d_ff (and mlp's hidden width)      tensor    tensor   tensor
    vocab     vocabulary (and mlp's classes)     tensor*   tensor*  tensor*
    expert    the stacked expert dim             -         -        expert
    expert_embed  d_model of expert weights      -         fsdp     fsdp - expert

where "fsdp" means the data and fsdp axes together. `*`: when the size does
not divide (fewer KV heads than tensor ranks, GPT-2's 50257-token vocabulary)
that dim stays replicated, as Megatron-LM does with KV heads, rather than the
plan being dropped. Sizes that must divide (heads, d_ff, d_model, experts, the
batch) are checked and the plan is skipped with the reason otherwise.

Column-parallel layers (`wq/wk/wv`, `w_up/w_gate`, mlp's `w1`/`w3`) split
their output dim and row-parallel ones (`wo`, `w_down`, mlp's `w2`) their
input dim, so megatron needs one all-reduce per block half. Norm scales and
row-parallel biases (mlp's `b2`) stay replicated; column biases (`b1`, `b3`)
follow their layer's output dim. Patterns are path suffixes, so the Adam
moments (`opt/mu/...`, `opt/nu/...`) get their parameter's spec, and a
stacked layout (`Workload.stacked`) gets a leading `None` for the layer dim.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from jax.sharding import PartitionSpec as P

from ..base import mesh as _mesh
from ..base import tree as _tree
from ..base.analyzer import ShardingAnalyzer
from ..rules.auto import AutoShardingRule
from ..rules.composite import CompositeShardingRule
from ..rules.optimizer import OptimizerStateRule
from ..rules.patterns import PathShardingRule
from ._plans import ROLES, ExpertPlans, MeshRoles, Plan, PlanNotApplicable
from ._workload import Workload

# (path pattern, logical axis per dim, per-layer leaf). First match wins.
_LOGICAL: tuple[tuple[str, tuple[str | None, ...], bool], ...] = (
    (r"attn/wq$", ("embed", "heads"), True),
    (r"attn/w[kv]$", ("embed", "kv_heads"), True),
    (r"attn/wo$", ("heads", "embed"), True),
    (r"mlp/w_(up|gate)$", ("embed", "mlp"), True),
    (r"mlp/w_down$", ("mlp", "embed"), True),
    (r"moe/router$", ("embed", None), True),
    (r"moe/w_(up|gate)$", ("expert", "expert_embed", "mlp"), True),
    (r"moe/w_down$", ("expert", "mlp", "expert_embed"), True),
    (r"embed/tokens$", ("vocab", "embed"), False),
    (r"embed/positions$", (None, "embed"), False),
    (r"(^|/)head$", ("embed", "vocab"), False),
    # The mlp workload: w1 column-, w2 row-, w3 column-parallel over classes.
    (r"(^|/)w1$", ("embed", "mlp"), False),
    (r"(^|/)b1$", ("mlp",), False),
    (r"(^|/)w2$", ("mlp", "embed"), False),
    (r"(^|/)w3$", ("embed", "vocab"), False),
    (r"(^|/)b3$", ("vocab",), False),
)


@dataclasses.dataclass(frozen=True)
class _Context:
    workload: Workload
    mesh: Any
    sizes: dict[str, int]
    roles: MeshRoles | None
    roles_error: str
    args: tuple[Any, Any]
    batch_dims: tuple[tuple[str, int], ...]

    def ordered(self, *roles: str) -> tuple[str, ...]:
        """Axes of `roles`, in mesh order (their device-layout order)."""
        wanted = [a for r in roles for a in getattr(self.roles, r)]
        return tuple(a for a in self.mesh.axis_names if a in wanted)

    def size(self, axes: tuple[str, ...]) -> int:
        return math.prod(self.sizes[a] for a in axes)

    def describe(self, role: str, axes: tuple[str, ...]) -> str:
        names = repr(axes[0]) if len(axes) == 1 else repr(axes)
        plural = "axis" if len(axes) == 1 else "axes"
        return f"{role} {plural} {names} of size {self.size(axes)}"

    def require_roles(self, plan: str) -> MeshRoles:
        if self.roles is None:
            raise PlanNotApplicable(f"{plan} needs mesh roles: {self.roles_error}")
        return self.roles

    def check_batch(self, role: str, axes: tuple[str, ...]) -> None:
        n = self.size(axes)
        for path, dim in self.batch_dims:
            if dim % n:
                where = "" if len(self.batch_dims) == 1 else f" (leaf {path!r})"
                raise PlanNotApplicable(
                    f"batch={dim}{where} not divisible by {self.describe(role, axes)}")

    def check_dim(self, key: str, axes: tuple[str, ...]) -> bool:
        """True if `dims[key]` (when known) is divisible by the axes."""
        value = self.workload.dims.get(key)
        return value is None or not axes or value % self.size(axes) == 0

    def require_dim(self, key: str, role: str, axes: tuple[str, ...]) -> None:
        if not self.check_dim(key, axes):
            raise PlanNotApplicable(
                f"{key}={self.workload.dims[key]} not divisible by {self.describe(role, axes)}")


_TENSOR_HINT = ("name an axis tp/tensor/model/mp, or pass "
                "roles=MeshRoles(tensor=(...,), ...)")


def _entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def _batch_spec(axes: tuple[str, ...]) -> P:
    return P(_entry(axes)) if axes else P()


def _logical_rule(ctx: _Context, mapping: dict[str, tuple[str, ...]]) -> PathShardingRule:
    """A PathShardingRule from the logical table and a logical -> mesh axes map."""
    rules = []
    for pattern, logical, per_layer in _LOGICAL:
        spec = [_entry(mapping.get(name, ())) if name else None for name in logical]
        if per_layer and ctx.workload.stacked:
            spec = [None, *spec]
        rules.append((pattern, P(*spec)))
    return PathShardingRule(rules, fallback="replicate", mesh=ctx.mesh)


def _replicated(ctx: _Context) -> Plan:
    return Plan("replicated", CompositeShardingRule(), P(),
                "every leaf replicated, every device computes the whole batch")


def _dp(ctx: _Context) -> Plan:
    axes = tuple(ctx.mesh.axis_names)
    ctx.check_batch("mesh", axes)
    return Plan("dp", CompositeShardingRule(), _batch_spec(axes),
                f"batch over all axes {axes}, state replicated")


def _fsdp(ctx: _Context) -> Plan:
    axes = tuple(ctx.mesh.axis_names)
    ctx.check_batch("mesh", axes)
    return Plan("fsdp", AutoShardingRule(ctx.mesh, axis_names=(axes,)), _batch_spec(axes),
                f"ZeRO-3: each state leaf on its largest dim divisible by {axes}, batch too")


def _tensor_mapping(ctx: _Context, tensor: tuple[str, ...]) -> dict:
    """heads / kv_heads / mlp / vocab on the tensor axes, with the fallbacks."""
    ctx.require_dim("n_heads", "tensor", tensor)
    ctx.require_dim("d_ff", "tensor", tensor)
    return {
        "heads": tensor,
        "kv_heads": tensor if ctx.check_dim("n_kv_heads", tensor) else (),
        "mlp": tensor,
        "vocab": tensor if ctx.check_dim("vocab", tensor) else (),
    }


def _megatron(ctx: _Context) -> Plan:
    ctx.require_roles("megatron")
    tensor = ctx.ordered("tensor")
    if not tensor:
        raise PlanNotApplicable(
            f"megatron needs a tensor axis; mesh axes are {tuple(ctx.mesh.axis_names)} "
            f"({_TENSOR_HINT})")
    batch = ctx.ordered("data", "fsdp", "expert")
    ctx.check_batch("data", batch)
    mapping = _tensor_mapping(ctx, tensor)
    return Plan("megatron", _logical_rule(ctx, mapping), _batch_spec(batch),
                f"tensor parallel on {tensor}, data parallel on {batch}")


def _fsdp_tp(ctx: _Context) -> Plan:
    ctx.require_roles("fsdp_tp")
    tensor, fsdp = ctx.ordered("tensor"), ctx.ordered("data", "fsdp")
    if not tensor:
        raise PlanNotApplicable(
            f"fsdp_tp needs a tensor axis; mesh axes are {tuple(ctx.mesh.axis_names)} "
            f"({_TENSOR_HINT})")
    if not fsdp:
        raise PlanNotApplicable(
            f"fsdp_tp needs a data or fsdp axis; mesh axes are {tuple(ctx.mesh.axis_names)}")
    batch = ctx.ordered("data", "fsdp", "expert")
    ctx.check_batch("data", batch)
    ctx.require_dim("d_model", "fsdp", fsdp)
    mapping = {**_tensor_mapping(ctx, tensor), "embed": fsdp, "expert_embed": fsdp}
    return Plan("fsdp_tp", _logical_rule(ctx, mapping), _batch_spec(batch),
                f"d_model dims on {fsdp}, heads/mlp/vocab on {tensor}, batch on {batch}")


def _ep(ctx: _Context) -> Plan:
    if "n_experts" not in ctx.workload.dims:
        raise PlanNotApplicable(
            f"ep applies to mixture-of-experts workloads; {ctx.workload.name} has no experts "
            "(no 'n_experts' in its dims)")
    ctx.require_roles("ep")
    # Without an expert axis the data axes hold the experts, as in GShard.
    expert = ctx.ordered("expert") or ctx.ordered("data")
    if not expert:
        raise PlanNotApplicable(
            f"ep needs an expert or data axis; mesh axes are {tuple(ctx.mesh.axis_names)}")
    ctx.require_dim("n_experts", "expert", expert)
    tensor, fsdp = ctx.ordered("tensor"), ctx.ordered("data", "fsdp")
    batch = ctx.ordered("data", "fsdp", "expert")
    ctx.check_batch("data", batch)
    ctx.require_dim("d_model", "fsdp", fsdp)
    mapping = _tensor_mapping(ctx, tensor) if tensor else {}
    mapping.update(embed=fsdp, expert=expert,
                   expert_embed=tuple(a for a in fsdp if a not in expert))
    return Plan("ep", _logical_rule(ctx, mapping), _batch_spec(batch),
                f"experts on {expert}, rest as fsdp_tp (d_model on {fsdp}, tensor {tensor}), "
                f"batch on {batch}")


def _megatron_do(ctx: _Context) -> Plan:
    plan = _megatron(ctx)
    data = ctx.ordered("data", "fsdp", "expert")
    return Plan("megatron_do", OptimizerStateRule(plan.state_rule, data, mesh=ctx.mesh),
                plan.batch_spec, f"{plan.description}; Adam moments also split over {data} "
                "(Megatron-LM's distributed optimizer, ZeRO-1)")


def _dp_do(ctx: _Context) -> Plan:
    plan = _dp(ctx)
    axes = tuple(ctx.mesh.axis_names)
    return Plan("dp_do", OptimizerStateRule(plan.state_rule, axes, mesh=ctx.mesh),
                plan.batch_spec, f"batch over all axes {axes}, parameters replicated, Adam "
                "moments split over them (a distributed optimizer, ZeRO-1)")


_BUILDERS: dict[str, Callable[[_Context], Plan]] = {
    "replicated": _replicated,
    "dp": _dp,
    "fsdp": _fsdp,
    "megatron": _megatron,
    "fsdp_tp": _fsdp_tp,
    "ep": _ep,
}
PLAN_NAMES = tuple(_BUILDERS)
# Plans built only when asked for by name (`expert_plan`): the published
# Megatron-LM runs' sharding, and data parallelism with the same distributed
# optimizer (the reference for a searched plan that splits only the moments).
# Not among the baselines every search runs.
_NAMED_ONLY: dict[str, Callable[[_Context], Plan]] = {"megatron_do": _megatron_do,
                                                      "dp_do": _dp_do}
NAMED_ONLY_PLANS = tuple(_NAMED_ONLY)


def _context(workload: Workload, mesh: Any, roles: MeshRoles | None) -> _Context:
    if not isinstance(workload, Workload):
        raise TypeError(f"expected a Workload, got {type(workload).__name__}; use "
                        "get_workload('gpt:small')")
    mesh = _mesh.resolve_mesh(mesh)
    sizes = _mesh.axis_sizes(mesh)
    error = ""
    if roles is None:
        try:
            roles = MeshRoles.from_mesh(mesh)
        except ValueError as e:
            error = str(e)
    elif not isinstance(roles, MeshRoles):
        raise TypeError(f"roles must be a MeshRoles, got {type(roles).__name__}")
    else:
        missing = [a for r in ROLES for a in getattr(roles, r) if a not in sizes]
        if missing:
            raise ValueError(f"MeshRoles names axis {missing[0]!r}, which is not in the mesh "
                             f"{tuple(sizes)}; fix the roles or the mesh")
    args = workload.abstract()
    return _Context(workload, mesh, sizes, roles, error, args, _batch_dims(args[1]))


def _batch_dims(batch: Any) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []

    def visit(path: str, leaf: Any) -> None:
        shape = _tree.leaf_shape(leaf)
        if shape:
            out.append((path, shape[0]))

    _tree.map_with_path(visit, batch)
    return tuple(out)


def expert_plan(workload: Workload, mesh: Any, name: str, roles: MeshRoles | None = None) -> Plan:
    """One expert plan by name.

    Args:
        workload: the workload to shard.
        mesh: a Mesh or AbstractMesh (None: the in-context mesh).
        name: one of `PLAN_NAMES`, or one built only by name: "megatron_do"
            (megatron with the Adam moments also split over the data axes:
            Megatron-LM's distributed optimizer) or "dp_do" (dp with the
            moments split over every mesh axis: ZeRO-1).
        roles: axis roles; default `MeshRoles.from_mesh(mesh)`.

    Returns:
        The plan.

    Raises:
        PlanNotApplicable: the plan cannot apply here; the message says why.
        ValueError: unknown plan name, or roles naming axes the mesh lacks.
    """
    if name not in _BUILDERS and name not in _NAMED_ONLY:
        raise ValueError(f"unknown expert plan {name!r}; plans are "
                         f"{PLAN_NAMES + tuple(_NAMED_ONLY)}")
    ctx = _context(workload, mesh, roles)
    return _build(ctx, name)


def _build(ctx: _Context, name: str) -> Plan:
    plan = {**_BUILDERS, **_NAMED_ONLY}[name](ctx)
    # The dims the plans know about are checked by name above; this catches
    # the rest (and every dim of a user workload) before a bad plan leaves.
    try:
        state_specs, _ = plan.specs(ctx.args, ctx.mesh)
    except ValueError as e:
        raise PlanNotApplicable(f"{name}: {_first_problem(e)}") from e
    problems = ShardingAnalyzer(ctx.mesh).validate_partition_specs(ctx.args[0], state_specs)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PlanNotApplicable(f"{name}: {problems[0]}{more}")
    return plan


def _first_problem(error: ValueError) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
    return (lines[1] if len(lines) > 1 else lines[0]) + more


def expert_plans(workload: Workload, mesh: Any, roles: MeshRoles | None = None) -> ExpertPlans:
    """Every expert plan that applies to `workload` on `mesh`.

    Args:
        workload: the workload to shard.
        mesh: a Mesh or AbstractMesh (None: the in-context mesh).
        roles: axis roles; default `MeshRoles.from_mesh(mesh)`. When the
            names cannot be inferred, plans needing roles are skipped.

    Returns:
        `ExpertPlans(plans, skipped)`: plans in the order replicated, dp,
        fsdp, megatron, fsdp_tp, ep; `skipped` maps each other plan to a
        one-line reason, e.g. `"megatron needs a tensor axis; mesh axes are
        ('dp',) ..."`.

    Raises:
        TypeError: `workload` or `roles` has the wrong type.
        ValueError: `roles` names an axis the mesh lacks.

    Example:
        >>> expert_plans(get_workload("gpt:tiny"), create_mesh((2, 4), ("dp", "tp")))
        ... # plans: replicated, dp, fsdp, megatron, fsdp_tp; skipped: ep
    """
    ctx = _context(workload, mesh, roles)
    plans: dict[str, Plan] = {}
    skipped: dict[str, str] = {}
    for name in _BUILDERS:
        try:
            plans[name] = _build(ctx, name)
        except PlanNotApplicable as e:
            skipped[name] = str(e)
    return ExpertPlans(plans, skipped)
