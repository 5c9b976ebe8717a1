"""shardsearch: find a JAX sharding by compiling and timing the real step.

This is the user's front: the search, its result, step knobs and activation
points, plan files, the rules, meshes and processes, the monitored step and
the analyzer, the step's logical axes, and the hardware models. Extensions and
the search's parts (the candidate, the outcome, stages, objectives' helpers,
the evaluation context) are in `shardsearch.search`; built-in models and
expert plans in `shardsearch.workloads`; benchmark suites in
`shardsearch.bench` (which this package does not import). The subpackages
behind these names are laid out along the pipeline (docs/architecture.md).
"""

from ._version import __version__ as __version__
from .base.activations import activation as activation
from .base.analyzer import ShardingAnalyzer as ShardingAnalyzer
from .base.knobs import Knobs as Knobs
from .base.mesh import abstract_mesh as abstract_mesh
from .base.mesh import create_mesh as create_mesh
from .base.mesh import get_incontext_mesh as get_incontext_mesh
from .base.mesh import parse_mesh as parse_mesh
from .base.mesh import use_cpu_devices as use_cpu_devices
from .base.monitor import ShardingWarning as ShardingWarning
from .base.monitor import barrier_sync as barrier_sync
from .base.monitor import create_monitored_function as create_monitored_function
from .base.target import target_mesh as target_mesh
from .cost.calibrate import calibrate as calibrate
from .cost.chips import HARDWARE as HARDWARE
from .cost.hardware import HardwareModel as HardwareModel
from .logical.axes import LogicalAxes as LogicalAxes
from .logical.discover import discover_logical_axes as discover_logical_axes
from .plan.reader import PlanMismatchWarning as PlanMismatchWarning
from .plan.reader import ShardingPlan as ShardingPlan
from .plan.reader import load_plan as load_plan
from .plan.reader import load_rule as load_rule
from .plan.writer import write_config as write_config
from .rules.auto import AutoShardingRule as AutoShardingRule
from .rules.base import ShardingRule as ShardingRule
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
from .search.execution.distributed import initialize as initialize_distributed
from .search.export import export_config as export_config
from .search.loop import optimize as optimize
from .search.result import OptimizeResult as OptimizeResult
from .search.setup import SearchSettings as SearchSettings

# Sorted, as ruff wants; the groups are in the module docstring's order above.
__all__ = [
    "HARDWARE",
    "AutoShardingRule",
    "BatchShardingRule",
    "CompositeShardingRule",
    "HardwareModel",
    "Hybrid",
    "Knobs",
    "LogicalAxes",
    "LogicalAxisRule",
    "MemoryConstrainedShardingRule",
    "Objective",
    "OptimizeResult",
    "PathShardingRule",
    "PlanMismatchWarning",
    "SearchSettings",
    "ShapeBasedShardingRule",
    "ShardingAnalyzer",
    "ShardingPlan",
    "ShardingRule",
    "ShardingWarning",
    "__version__",
    "abstract_mesh",
    "activation",
    "barrier_sync",
    "calibrate",
    "create_mesh",
    "create_monitored_function",
    "discover_logical_axes",
    "explain_rule",
    "export_config",
    "get_incontext_mesh",
    "initialize_distributed",
    "load_plan",
    "load_rule",
    "optimize",
    "parse_mesh",
    "register_objective",
    "target_mesh",
    "use_cpu_devices",
    "write_config",
]
