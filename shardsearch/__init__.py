"""shardsearch: find a JAX sharding by compiling and timing the real step.

The public API lives here; the underscore modules behind it are private.
"""

from ._analyzer import ShardingAnalyzer as ShardingAnalyzer
from ._cost import HardwareModel as HardwareModel
from ._evaluate import Outcome as Outcome
from ._export import export_config as export_config
from ._export import partition_rules_source as partition_rules_source
from ._export import plan_config as plan_config
from ._export import write_config as write_config
from ._mesh import abstract_mesh as abstract_mesh
from ._mesh import create_mesh as create_mesh
from ._mesh import get_incontext_mesh as get_incontext_mesh
from ._mesh import parse_mesh as parse_mesh
from ._mesh import use_cpu_devices as use_cpu_devices
from ._monitor import ShardingWarning as ShardingWarning
from ._monitor import barrier_sync as barrier_sync
from ._monitor import create_monitored_function as create_monitored_function
from ._plan import PlanMismatchWarning as PlanMismatchWarning
from ._plan import ShardingPlan as ShardingPlan
from ._plan import load_plan as load_plan
from ._plan import load_rule as load_rule
from ._result import OptimizeResult as OptimizeResult
from ._result import TrialRecord as TrialRecord
from ._rules import AutoShardingRule as AutoShardingRule
from ._rules import BatchShardingRule as BatchShardingRule
from ._rules import CompositeShardingRule as CompositeShardingRule
from ._rules import MemoryConstrainedShardingRule as MemoryConstrainedShardingRule
from ._rules import PathShardingRule as PathShardingRule
from ._rules import ShapeBasedShardingRule as ShapeBasedShardingRule
from ._rules import ShardingRule as ShardingRule
from ._rules import rule_from_config as rule_from_config
from ._search import make_context as make_context
from ._search import make_space as make_space
from ._search import optimize as optimize
from ._space import Candidate as Candidate
from ._space import SearchSpace as SearchSpace
from ._units import parse_bytes as parse_bytes
from ._version import __version__ as __version__

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
