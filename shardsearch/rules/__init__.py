"""Stage 2 of the pipeline, rules: a pytree of arrays → a pytree of PartitionSpecs.

Every rule works on abstract leaves (`jax.ShapeDtypeStruct`, or anything with
`.shape` and `.dtype`), so a plan for a model too large to allocate can be made
without allocating it. Non-array leaves and arrays too small to split come out
replicated (`P()`). Specs come out canonical: trailing `None`s dropped.

One module per concept:
  base       `ShardingRule`, the registry of kinds, `rule_from_config`
  axes       axis names as rules take them (shared helpers)
  auto       `AutoShardingRule` ("auto")
  composite  `CompositeShardingRule` ("composite")
  memory     `MemoryConstrainedShardingRule` ("memory")
  patterns   `ShapeBasedShardingRule` ("shape"), `PathShardingRule` ("path")
  batch      `BatchShardingRule` ("batch")
  logical    `LogicalAxisRule` ("logical"): logical axes onto mesh axes
  optimizer  `OptimizerStateRule` ("optimizer-state"): the optimizer state
             also split over data axes (ZeRO-1, a distributed optimizer)
  explain    `explain_rule`: why each leaf got its spec, for any rule

A new kind is a `ShardingRule` subclass with a `kind` and a `from_config`;
defining it registers it (see `base`). The imports below run in the order the
built-in kinds are listed by `registered_kinds()`.
"""

from .base import ShardingRule as ShardingRule
from .base import argument_specs as argument_specs
from .base import registered_kinds as registered_kinds
from .base import rule_class as rule_class
from .base import rule_from_config as rule_from_config

# isort: off
# Kept in this order: importing a kind registers it, and the error for an
# unknown kind lists the built-in kinds in registration order.
from .auto import AutoShardingRule as AutoShardingRule
from .composite import CompositeShardingRule as CompositeShardingRule
from .memory import MemoryConstrainedShardingRule as MemoryConstrainedShardingRule
from .patterns import PathShardingRule as PathShardingRule
from .patterns import ShapeBasedShardingRule as ShapeBasedShardingRule
from .batch import BatchShardingRule as BatchShardingRule
from .logical import LogicalAxisRule as LogicalAxisRule
from .optimizer import OptimizerStateRule as OptimizerStateRule
# isort: on

__all__ = [
    "AutoShardingRule",
    "BatchShardingRule",
    "CompositeShardingRule",
    "LogicalAxisRule",
    "MemoryConstrainedShardingRule",
    "OptimizerStateRule",
    "PathShardingRule",
    "ShapeBasedShardingRule",
    "ShardingRule",
    "argument_specs",
    "registered_kinds",
    "rule_class",
    "rule_from_config",
]
