"""The search's parts, for extensions, benchmarks and studies.

Users need only `shardsearch` (optimize, plans, rules); this front names what
is behind it, laid out by job (docs/architecture.md):

- `space/`: what one trial tries: `Candidate`, `SearchSpace`, `make_space`,
  the warm-start `baseline_plans` / `baseline_candidates`, `pin_batch`
  (the expert plans with their activations' batch pinned), and
  `plan_differences` (the dimensions two plans differ in).
- `evaluation/`: judging one candidate: `Stage`, `Status`, `Outcome`,
  `fingerprint`, `Context`, `resolve`, `evaluate`, `Objective` and the
  registry (`register_objective`, `get_objective`, `OBJECTIVES`), the
  interleaved re-timing (`retime`, `Timing`, `median_ci`, `faster_than`) and
  the output check (`compare_outputs`), and what a trial is judged against
  besides itself (`Standing`: the study's recorded estimates and its best
  trial, a `Leader`, whose program a timed candidate's is held against,
  `TRAFFIC_MARGIN` its margin on memory traffic;
  `recorded_leader` finds it in a study's trials).
- `execution/`: where candidates run: the `Executor` protocol, `InProcess`.
- `study/`: `TrialRecord`, `make_sampler`, the timing cut
  (`SlowerThanBest`, and `timed_steps`: a trial's recorded steps),
  `confirm_study`'s storage, `prediction_summary` (stage 1's memory
  verdicts against XLA's).
- The driver: `SearchSettings`, `make_context`, `StudySetup`, `prepare`,
  `optimize`, `OptimizeResult`, `NothingCompleted` (no candidate completed:
  no winner), `export_config`, `confirm_study`.

Also re-exported for extensions: `ProgramCost` and `Topology` (what a
`HardwareModel` subclass prices; `KernelCost`, one kernel's work and
bytes per memory space, as `ProgramCost.hlo.kernels` holds them),
`kernel_table` and `Kernel` (a program's kernels as a per-kernel model
prices them, named, to set beside a profile), `registered_kinds` and `rule_from_config`
(rule kinds), `plan_config` (a plan's data without writing it),
`parse_bytes`, and stage 1's memory prediction (`trace_program`,
`predict_footprint`, `Footprint`, `prediction_pool` and `pool_ratios`:
which compiled candidates scale a candidate's prediction; `stage_margin`
and `over_by_prediction`: its verdict on the scaled prediction).
"""

from ..base.target import TargetUnavailable as TargetUnavailable
from ..base.target import target_of as target_of
from ..base.target import uncached as uncached
from ..base.units import parse_bytes as parse_bytes
from ..cost.footprint import Footprint as Footprint
from ..cost.footprint import predict_footprint as predict_footprint
from ..cost.footprint import trace_program as trace_program
from ..cost.hlo import Kernel as Kernel
from ..cost.hlo import KernelCost as KernelCost
from ..cost.hlo import kernel_table as kernel_table
from ..cost.hlo import parse_hlo as parse_hlo
from ..cost.program import ProgramCost as ProgramCost
from ..cost.topology import Topology as Topology
from ..plan.writer import plan_config as plan_config
from ..rules.base import registered_kinds as registered_kinds
from ..rules.base import rule_from_config as rule_from_config
from .evaluation.confirm import Timing as Timing
from .evaluation.confirm import compare_outputs as compare_outputs
from .evaluation.confirm import faster_than as faster_than
from .evaluation.confirm import median_ci as median_ci
from .evaluation.confirm import retime as retime
from .evaluation.context import Context as Context
from .evaluation.evaluate import evaluate as evaluate
from .evaluation.evaluate import over_by_prediction as over_by_prediction
from .evaluation.evaluate import pool_ratios as pool_ratios
from .evaluation.evaluate import prediction_pool as prediction_pool
from .evaluation.evaluate import resolve as resolve
from .evaluation.evaluate import stage_margin as stage_margin
from .evaluation.objectives import OBJECTIVES as OBJECTIVES
from .evaluation.objectives import Hybrid as Hybrid
from .evaluation.objectives import Objective as Objective
from .evaluation.objectives import get_objective as get_objective
from .evaluation.objectives import register_objective as register_objective
from .evaluation.outcome import Outcome as Outcome
from .evaluation.outcome import fingerprint as fingerprint
from .evaluation.stages import Stage as Stage
from .evaluation.stages import Status as Status
from .evaluation.standing import TRAFFIC_MARGIN as TRAFFIC_MARGIN
from .evaluation.standing import Leader as Leader
from .evaluation.standing import Standing as Standing
from .execution.base import Executor as Executor
from .execution.inprocess import InProcess as InProcess
from .export import export_config as export_config
from .finish import NothingCompleted as NothingCompleted
from .loop import optimize as optimize
from .reconfirm import confirm_study as confirm_study
from .result import OptimizeResult as OptimizeResult
from .setup import SearchSettings as SearchSettings
from .setup import StudySetup as StudySetup
from .setup import make_context as make_context
from .setup import prepare as prepare
from .shapes import ShapeWarning as ShapeWarning
from .space.baselines import baseline_candidates as baseline_candidates
from .space.baselines import baseline_plans as baseline_plans
from .space.baselines import make_space as make_space
from .space.baselines import pin_batch as pin_batch
from .space.candidate import Candidate as Candidate
from .space.differences import plan_differences as plan_differences
from .space.searchspace import SearchSpace as SearchSpace
from .study.pruner import SlowerThanBest as SlowerThanBest
from .study.pruner import timed_steps as timed_steps
from .study.record import TrialRecord as TrialRecord
from .study.record import prediction_summary as prediction_summary
from .study.record import recorded_leader as recorded_leader
from .study.storage import make_sampler as make_sampler

__all__ = [
    "OBJECTIVES",
    "TRAFFIC_MARGIN",
    "Candidate",
    "Context",
    "Executor",
    "Footprint",
    "Hybrid",
    "InProcess",
    "Kernel",
    "KernelCost",
    "Leader",
    "NothingCompleted",
    "Objective",
    "OptimizeResult",
    "Outcome",
    "ProgramCost",
    "SearchSettings",
    "SearchSpace",
    "ShapeWarning",
    "SlowerThanBest",
    "Stage",
    "Standing",
    "Status",
    "StudySetup",
    "TargetUnavailable",
    "Timing",
    "Topology",
    "TrialRecord",
    "baseline_candidates",
    "baseline_plans",
    "compare_outputs",
    "confirm_study",
    "evaluate",
    "export_config",
    "faster_than",
    "fingerprint",
    "get_objective",
    "kernel_table",
    "make_context",
    "make_sampler",
    "make_space",
    "median_ci",
    "optimize",
    "over_by_prediction",
    "parse_bytes",
    "parse_hlo",
    "pin_batch",
    "plan_config",
    "plan_differences",
    "pool_ratios",
    "predict_footprint",
    "prediction_pool",
    "prediction_summary",
    "prepare",
    "recorded_leader",
    "register_objective",
    "registered_kinds",
    "resolve",
    "retime",
    "rule_from_config",
    "stage_margin",
    "target_of",
    "timed_steps",
    "trace_program",
    "uncached",
]
