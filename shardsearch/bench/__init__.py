"""Benchmarks of the search: suite files, the suite runner and their reports.

This is the public API for benchmark scripts (the repository's `benchmarks/`
folder and your own): everything they need is importable from here, from
`shardsearch` and from `shardsearch.workloads`; the modules behind these
names (`suite`, `runner`, `report`, and the search's) are private.

- Suites: `load_suite`, `find_suite`, `suite_names`, `builtin_suites` (the
  suite files shipped with shardsearch, found whatever the current folder),
  `Suite`, `Entry`, `prepare_devices`.
- The runner: `run_suite`, `run_entry`, `resolve_budget`, `SuiteRun`.
- Reports: `speedup` (the winner against one reference: ratio, CI, verdict),
  `format_speedup` (as `results.md` shows it), `speedups`, `entry_line`,
  `write_report`, `load_entries`, `machine_info`.
- Pieces of the search a benchmark re-runs: `make_context`,
  `baseline_candidates`, `make_sampler`, `resolve`, `evaluate`, and the
  interleaved re-timing `retime` with `Timing`, `median_ci`, `faster_than`
  and `compare_outputs`.
- Published runs (`bench.published`): `Published` (a measured run's chips,
  throughput, FLOP count and plan), `published_step_seconds`, `step_flops`,
  `estimate_published` (the static estimate of the published plan).
- Cost models a study compares (`benchmarks/fidelity`): `HARDWARE` (the
  built-in models by name), `Topology` (a mesh's axes, for
  `HardwareModel.breakdown`) and `get_objective` (an objective by name).

`import shardsearch` does not import this package (it brings the runner's
dependencies); import it by name.

Example:
    from shardsearch import bench

    suite = bench.load_suite("cpu-sim8")           # a shipped suite, from any folder
    bench.prepare_devices(suite)                   # 8 simulated CPU devices
    run = bench.run_suite(suite, out="results", rules_dir="rules", entries=["mlp-small-dp8"])
    # results/cpu-sim8/entries/mlp-small-dp8.json, results/cpu-sim8/results.md
"""

from ..cost.chips import HARDWARE as HARDWARE
from ..cost.topology import Topology as Topology
from ..search.evaluation.confirm import Timing as Timing
from ..search.evaluation.confirm import compare_outputs as compare_outputs
from ..search.evaluation.confirm import faster_than as faster_than
from ..search.evaluation.confirm import median_ci as median_ci
from ..search.evaluation.confirm import retime as retime
from ..search.evaluation.evaluate import evaluate as evaluate
from ..search.evaluation.evaluate import resolve as resolve
from ..search.evaluation.objectives import get_objective as get_objective
from ..search.setup import make_context as make_context
from ..search.space.baselines import baseline_candidates as baseline_candidates
from ..search.study.storage import make_sampler as make_sampler
from .published import Published as Published
from .published import estimate_published as estimate_published
from .published import published_step_seconds as published_step_seconds
from .published import step_flops as step_flops
from .report import entry_line as entry_line
from .report import format_speedup as format_speedup
from .report import load_entries as load_entries
from .report import machine_info as machine_info
from .report import speedup as speedup
from .report import speedups as speedups
from .report import write_report as write_report
from .runner import SuiteRun as SuiteRun
from .runner import resolve_budget as resolve_budget
from .runner import run_entry as run_entry
from .runner import run_suite as run_suite
from .suite import PUBLISHED as PUBLISHED
from .suite import QUARTER as QUARTER
from .suite import Entry as Entry
from .suite import Suite as Suite
from .suite import builtin_suites as builtin_suites
from .suite import find_suite as find_suite
from .suite import load_suite as load_suite
from .suite import prepare_devices as prepare_devices
from .suite import suite_names as suite_names

__all__ = [
    "HARDWARE",
    "PUBLISHED",
    "QUARTER",
    "Entry",
    "Published",
    "Suite",
    "SuiteRun",
    "Timing",
    "Topology",
    "baseline_candidates",
    "builtin_suites",
    "compare_outputs",
    "entry_line",
    "estimate_published",
    "evaluate",
    "faster_than",
    "find_suite",
    "format_speedup",
    "get_objective",
    "load_entries",
    "load_suite",
    "machine_info",
    "make_context",
    "make_sampler",
    "median_ci",
    "prepare_devices",
    "published_step_seconds",
    "resolve",
    "resolve_budget",
    "retime",
    "run_entry",
    "run_suite",
    "speedup",
    "speedups",
    "step_flops",
    "suite_names",
    "write_report",
]
