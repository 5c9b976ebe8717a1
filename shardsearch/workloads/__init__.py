"""Built-in training-step workloads and the expert sharding plans for them.

`get_workload("gpt:small")` returns a `Workload` (a step, its concrete and
abstract arguments, flops and parameter count); `expert_plans(workload, mesh)`
returns the hand-written plans (replicated, dp, fsdp, megatron, fsdp_tp, ep)
that apply on that mesh and why the others do not; `expert_plan` builds one
by name, including those no search runs by itself (`NAMED_ONLY_PLANS`: the
distributed-optimizer plans megatron_do and dp_do).
"""

from ._experts import NAMED_ONLY_PLANS as NAMED_ONLY_PLANS
from ._experts import PLAN_NAMES as PLAN_NAMES
from ._experts import expert_plan as expert_plan
from ._experts import expert_plans as expert_plans
from ._plans import ExpertPlans as ExpertPlans
from ._plans import MeshRoles as MeshRoles
from ._plans import Plan as Plan
from ._plans import PlanNotApplicable as PlanNotApplicable
from ._registry import get_workload as get_workload
from ._registry import list_workloads as list_workloads
from ._workload import Workload as Workload

__all__ = [
    "NAMED_ONLY_PLANS",
    "PLAN_NAMES",
    "ExpertPlans",
    "MeshRoles",
    "Plan",
    "PlanNotApplicable",
    "Workload",
    "expert_plan",
    "expert_plans",
    "get_workload",
    "list_workloads",
]
