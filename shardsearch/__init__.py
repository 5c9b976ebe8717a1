"""shardsearch: find a JAX sharding by compiling and timing the real step.

The public API lives here; the underscore modules behind it are private.
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
from .cost.model import HardwareModel as HardwareModel
from .plan.reader import PlanMismatchWarning as PlanMismatchWarning
from .plan.reader import ShardingPlan as ShardingPlan
from .plan.reader import load_plan as load_plan
from .plan.reader import load_rule as load_rule
from .plan.writer import partition_rules_source as partition_rules_source
from .plan.writer import plan_config as plan_config
from .plan.writer import write_config as write_config
from .rules.builtin import AutoShardingRule as AutoShardingRule
from .rules.builtin import BatchShardingRule as BatchShardingRule
from .rules.builtin import CompositeShardingRule as CompositeShardingRule
from .rules.builtin import MemoryConstrainedShardingRule as MemoryConstrainedShardingRule
from .rules.builtin import PathShardingRule as PathShardingRule
from .rules.builtin import ShapeBasedShardingRule as ShapeBasedShardingRule
from .rules.builtin import ShardingRule as ShardingRule
from .rules.builtin import rule_from_config as rule_from_config
from .search.evaluate import Outcome as Outcome
from .search.export import export_config as export_config
from .search.loop import make_context as make_context
from .search.loop import make_space as make_space
from .search.loop import optimize as optimize
from .search.record import TrialRecord as TrialRecord
from .search.result import OptimizeResult as OptimizeResult
from .search.space import Candidate as Candidate
from .search.space import SearchSpace as SearchSpace

__all__ = [
    "AutoShardingRule",
    "BatchShardingRule",
    "Candidate",
    "CompositeShardingRule",
    "HardwareModel",
    "MemoryConstrainedShardingRule",
    "OptimizeResult",
    "Outcome",
    "PathShardingRule",
    "PlanMismatchWarning",
    "SearchSpace",
    "ShapeBasedShardingRule",
    "ShardingAnalyzer",
    "ShardingPlan",
    "ShardingRule",
    "ShardingWarning",
    "TrialRecord",
    "__version__",
    "abstract_mesh",
    "barrier_sync",
    "create_mesh",
    "create_monitored_function",
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
    "rule_from_config",
    "use_cpu_devices",
    "write_config",
]
