"""shardsearch: find a JAX sharding by compiling and timing the real step.

The public API lives here; the subpackages behind it (`base`, `rules`, `cost`,
`plan`, `search`, `cli`, `bench`) are its implementation, laid out along the
pipeline (see docs/architecture.md). `shardsearch.workloads` (built-in models
and expert plans) and `shardsearch.bench` (benchmark suites, for scripts) have
public APIs of their own; importing this package does not import `bench`.
"""

from ._version import __version__ as __version__
from .base.analyzer import ShardingAnalyzer as ShardingAnalyzer
from .base.mesh import abstract_mesh as abstract_mesh
from .base.mesh import create_mesh as create_mesh
from .base.mesh import get_incontext_mesh as get_incontext_mesh
from .base.mesh import parse_mesh as parse_mesh
from .base.mesh import use_cpu_devices as use_cpu_devices
from .base.monitor import ShardingWarning as ShardingWarning
from .base.monitor import barrier_sync as barrier_sync
from .base.monitor import create_monitored_function as create_monitored_function
from .base.units import parse_bytes as parse_bytes
from .cost.hardware import HardwareModel as HardwareModel
from .cost.program import ProgramCost as ProgramCost
from .logical.axes import LogicalAxes as LogicalAxes
from .logical.discover import discover_logical_axes as discover_logical_axes
from .plan.reader import PlanMismatchWarning as PlanMismatchWarning
from .plan.reader import ShardingPlan as ShardingPlan
from .plan.reader import load_plan as load_plan
from .plan.reader import load_rule as load_rule
from .plan.writer import partition_rules_source as partition_rules_source
from .plan.writer import plan_config as plan_config
from .plan.writer import write_config as write_config
from .rules.auto import AutoShardingRule as AutoShardingRule
from .rules.base import ShardingRule as ShardingRule
from .rules.base import registered_kinds as registered_kinds
from .rules.base import rule_from_config as rule_from_config
from .rules.batch import BatchShardingRule as BatchShardingRule
from .rules.composite import CompositeShardingRule as CompositeShardingRule
from .rules.explain import explain_rule as explain_rule
from .rules.logical import LogicalAxisRule as LogicalAxisRule
from .rules.memory import MemoryConstrainedShardingRule as MemoryConstrainedShardingRule
from .rules.patterns import PathShardingRule as PathShardingRule
from .rules.patterns import ShapeBasedShardingRule as ShapeBasedShardingRule
from .search.evaluation.objectives import Hybrid as Hybrid
from .search.evaluation.objectives import Objective as Objective
from .search.evaluation.objectives import register_objective as register_objective
from .search.evaluation.outcome import Outcome as Outcome
from .search.evaluation.stages import Stage as Stage
from .search.export import export_config as export_config
from .search.loop import optimize as optimize
from .search.result import OptimizeResult as OptimizeResult
from .search.setup import make_context as make_context
from .search.space.baselines import baseline_plans as baseline_plans
from .search.space.baselines import make_space as make_space
from .search.space.candidate import Candidate as Candidate
from .search.space.searchspace import SearchSpace as SearchSpace
from .search.study.record import TrialRecord as TrialRecord

__all__ = [
    "AutoShardingRule",
    "BatchShardingRule",
    "Candidate",
    "CompositeShardingRule",
    "HardwareModel",
    "Hybrid",
    "LogicalAxes",
    "LogicalAxisRule",
    "MemoryConstrainedShardingRule",
    "Objective",
    "OptimizeResult",
    "Outcome",
    "PathShardingRule",
    "PlanMismatchWarning",
    "ProgramCost",
    "SearchSpace",
    "ShapeBasedShardingRule",
    "ShardingAnalyzer",
    "ShardingPlan",
    "ShardingRule",
    "ShardingWarning",
    "Stage",
    "TrialRecord",
    "__version__",
    "abstract_mesh",
    "barrier_sync",
    "baseline_plans",
    "create_mesh",
    "create_monitored_function",
    "discover_logical_axes",
    "explain_rule",
    "export_config",
    "get_incontext_mesh",
    "load_plan",
    "load_rule",
    "make_context",
    "make_space",
    "optimize",
    "parse_bytes",
    "parse_mesh",
    "partition_rules_source",
    "plan_config",
    "register_objective",
    "registered_kinds",
    "rule_from_config",
    "use_cpu_devices",
    "write_config",
]
