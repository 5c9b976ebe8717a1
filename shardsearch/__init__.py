"""shardsearch: find a JAX sharding by compiling and timing the real step.

The public API lives here; the underscore modules behind it are private.
"""

from ._analyzer import ShardingAnalyzer as ShardingAnalyzer
from ._mesh import abstract_mesh as abstract_mesh
from ._mesh import create_mesh as create_mesh
from ._mesh import get_incontext_mesh as get_incontext_mesh
from ._mesh import parse_mesh as parse_mesh
from ._mesh import use_cpu_devices as use_cpu_devices
from ._monitor import ShardingWarning as ShardingWarning
from ._monitor import barrier_sync as barrier_sync
from ._monitor import create_monitored_function as create_monitored_function
from ._rules import AutoShardingRule as AutoShardingRule
from ._rules import CompositeShardingRule as CompositeShardingRule
from ._rules import MemoryConstrainedShardingRule as MemoryConstrainedShardingRule
from ._rules import PathShardingRule as PathShardingRule
from ._rules import ShapeBasedShardingRule as ShapeBasedShardingRule
from ._rules import ShardingRule as ShardingRule
from ._rules import rule_from_config as rule_from_config
from ._units import parse_bytes as parse_bytes
from ._version import __version__ as __version__

__all__ = [
    "AutoShardingRule",
    "CompositeShardingRule",
    "MemoryConstrainedShardingRule",
    "PathShardingRule",
    "ShapeBasedShardingRule",
    "ShardingAnalyzer",
    "ShardingRule",
    "ShardingWarning",
    "__version__",
    "abstract_mesh",
    "barrier_sync",
    "create_mesh",
    "create_monitored_function",
    "get_incontext_mesh",
    "parse_bytes",
    "parse_mesh",
    "rule_from_config",
    "use_cpu_devices",
]
