"""Benchmarks of the search: suite files, the suite runner and their reports.

This is the public API for benchmark scripts (the repository's `benchmarks/`
folder and your own): what they need is importable from here, from
`shardsearch`, from `shardsearch.search` (the search's parts a benchmark
re-runs: `make_context`, `baseline_candidates`, `resolve`, `evaluate`,
`retime`, `make_sampler`, ...) and from `shardsearch.workloads`; the modules
behind these names (`suite`, `runner`, `report`) are private.

- Suites: `load_suite`, `find_suite`, `suite_names`, `builtin_suites` (the
  suite files shipped with shardsearch, found whatever the current folder),
  `Suite`, `Entry`, `prepare_devices`.
- The runner: `run_suite`, `run_entry`, `resolve_budget`, `SuiteRun`,
  `record_differences` (what each winner changes, for entries recorded without it),
  `plan_file_specs` (a winner's exported plan file read as the runner recorded it),
  `plan_row` (a plan's row, its fit to the budget checked as the runner checks it).
- Reports: `speedup` (the winner against one reference: ratio, CI, verdict),
  `interval_problems` (a record's ratios that disagree with their intervals),
  `refresh_speedups` (recompute a folder's entries from their recorded times),
  `format_speedup` (as `results.md` shows it), `speedups`, `entry_line`,
  `write_report`, `load_entries`, `machine_info`.
- Published runs (`bench.published`): `Published` (a measured run's chips,
  throughput, FLOP count and plan), `published_step_seconds`, `step_flops`,
  `estimate_published` (the static estimate of the published plan).

`import shardsearch` does not import this package (it brings the runner's
dependencies); import it by name.

Example:
    from shardsearch import bench

    suite = bench.load_suite("cpu-sim8")           # a shipped suite, from any folder
    bench.prepare_devices(suite)                   # 8 simulated CPU devices
    run = bench.run_suite(suite, out="results", rules_dir="rules", entries=["mlp-small-dp8"])
    # results/cpu-sim8/entries/mlp-small-dp8.json, results/cpu-sim8/results.md
"""

from .published import Published as Published
from .published import estimate_published as estimate_published
from .published import published_step_seconds as published_step_seconds
from .published import step_flops as step_flops
from .report import entry_line as entry_line
from .report import format_speedup as format_speedup
from .report import interval_problems as interval_problems
from .report import load_entries as load_entries
from .report import machine_info as machine_info
from .report import refresh_speedups as refresh_speedups
from .report import speedup as speedup
from .report import speedups as speedups
from .report import write_report as write_report
from .runner import SuiteRun as SuiteRun
from .runner import entry_mesh as entry_mesh
from .runner import plan_file_specs as plan_file_specs
from .runner import plan_row as plan_row
from .runner import record_differences as record_differences
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
    "PUBLISHED",
    "QUARTER",
    "Entry",
    "Published",
    "Suite",
    "SuiteRun",
    "builtin_suites",
    "entry_line",
    "entry_mesh",
    "estimate_published",
    "find_suite",
    "format_speedup",
    "interval_problems",
    "load_entries",
    "load_suite",
    "machine_info",
    "plan_file_specs",
    "plan_row",
    "prepare_devices",
    "published_step_seconds",
    "record_differences",
    "refresh_speedups",
    "resolve_budget",
    "run_entry",
    "run_suite",
    "speedup",
    "speedups",
    "step_flops",
    "suite_names",
    "write_report",
]
