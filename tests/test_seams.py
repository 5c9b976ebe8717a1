"""The extension seams of docs/architecture.md: each claim of "touches only
these files" is shown by an extension defined here, outside the package.

Rule kinds, parameter blocks, objectives and cost models have theirs in
test_rule_registry.py, test_space.py and test_stages_objectives.py; this file
holds the executor's, and checks that the architecture page names files and
tests that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import shardsearch as ss
from shardsearch.search import (
    InProcess,
    Stage,
    Standing,
    baseline_candidates,
    compare_outputs,
    evaluate,
    make_context,
    resolve,
    retime,
)
from shardsearch.search.evaluation.evaluate import nonfinite_under
from shardsearch.search.execution.base import Base, Executor
from shardsearch.workloads import get_workload

ROOT = Path(__file__).resolve().parent.parent


class Counting(Base):
    """An executor of our own: runs every job here, and counts them."""

    runs_here = True

    def __init__(self):
        self.inner, self.calls = InProcess(), []

    def evaluate(self, ctx, specs, fp, memory, report, run, standing):
        self.calls.append(("evaluate", fp, standing.estimates))
        return self.inner.evaluate(ctx, specs, fp, memory, report, run, standing)

    def nonfinite_under(self, ctx, specs):
        self.calls.append(("nonfinite",))
        return self.inner.nonfinite_under(ctx, specs)

    def retime(self, ctx, finalists, rounds):
        self.calls.append(("retime", tuple(f[0] for f in finalists), rounds))
        return self.inner.retime(ctx, finalists, rounds)

    def compare_outputs(self, ctx, specs, reference_specs, rtol):
        self.calls.append(("compare",))
        return self.inner.compare_outputs(ctx, specs, reference_specs, rtol)


def test_an_executor_defined_outside_the_package_runs_every_job(mesh24):
    executor = Counting()
    assert isinstance(executor, Executor)  # the protocol's methods, all present
    ctx, workload = make_context(get_workload("mlp:tiny"), None, mesh24, warmup=1, repeats=2)
    ctx.executor = executor
    plans = baseline_candidates(workload, mesh24)
    dp, dp_fp = resolve(plans["dp"], ctx)
    replicated, _ = resolve(plans["replicated"], ctx)

    outcome = evaluate(dp, dp_fp, ctx, standing=Standing((0.5,)))
    assert outcome.status == "complete" and len(outcome.step_times) == 2
    assert nonfinite_under(replicated, ctx) is None
    timings = retime([("dp", dp), ("replicated", replicated)], ctx, 3)
    assert {k: len(v.times) for k, v in timings.items()} == {"dp": 3, "replicated": 3}
    match, _worst = compare_outputs(dp, replicated, ctx)
    assert match
    assert executor.calls == [("evaluate", dp_fp, (0.5,)), ("nonfinite",),
                              ("retime", ("dp", "replicated"), 3), ("compare",)]
    # Stage 1 never reaches the executor: a plan over the budget is cut before it.
    small = make_context(workload, None, mesh24, memory_budget=20_000, objective="static")[0]
    small.executor = Counting()
    cut = evaluate(*resolve(plans["replicated"], small), small)
    assert cut.cut_stage is Stage.CHECK and small.executor.calls == []


def test_an_executor_elsewhere_refuses_finalists_with_their_own_context(mesh24):
    ctx, workload = make_context(get_workload("mlp:tiny"), None, mesh24, warmup=1, repeats=2)
    ctx.executor = Counting()
    ctx.executor.runs_here = False
    specs, _ = resolve(baseline_candidates(workload, mesh24)["dp"], ctx)
    # A context of its own (another study's, another mesh's), not one derived
    # from ctx for a knob setting, which an executor elsewhere can rebuild.
    other, _ = make_context(get_workload("mlp:tiny"), None, mesh24, warmup=1, repeats=2)
    with pytest.raises(ValueError, match="finalists with their own context are timed in this "
                                         "process"):
        retime([("dp", specs, other)], ctx, 2)
    assert ctx.executor.calls == []


ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def _seams() -> list[tuple[str, str]]:
    parts = re.split(r"^### ", ARCHITECTURE.split("## The seams", 1)[1], flags=re.M)[1:]
    return [(p.splitlines()[0], p.split("\n## ", 1)[0]) for p in parts]


@pytest.mark.parametrize("title,text", _seams(), ids=[t for t, _ in _seams()])
def test_every_seam_names_the_files_it_touches_and_an_existing_test(title, text):
    assert "**Touches:**" in text and "**Checked by**" in text, title
    touches = text.split("**Touches:**", 1)[1].split("**Checked by**", 1)[0]
    for path in re.findall(r"`((?:search|cost|cli|logical|rules|bench)/[\w/<>.]+\.py)`",
                           touches):
        if "<" not in path:  # `search/space/<family>.py` names a file to write
            assert (ROOT / "shardsearch" / path).is_file(), f"{title}: {path}"
    checked = text.split("**Checked by**", 1)[1]
    tests = re.findall(r"`(tests/test_\w+\.py)`", checked)
    assert tests, title
    for path in tests:
        assert (ROOT / path).is_file(), f"{title}: {path}"


def test_the_seams_page_covers_the_extension_points():
    titles = {t for t, _ in _seams()}
    assert {"A rule kind", "A block of search parameters", "A search family", "A cut stage",
            "An objective", "A cost model", "A place to run candidates", "A command",
            "A benchmark suite"} <= titles
    assert ss.optimize  # the page's front names exist


def test_each_timed_round_of_several_finalists_follows_a_settling_step(mesh24):
    """A heavy plan slows the next step of whichever plan runs after it
    (benchmarks/recheck/neighbours.py); the re-timing takes an untimed step
    of each finalist before its timed one, and none for a lone finalist."""
    ctx, workload = make_context(get_workload("mlp:tiny"), None, mesh24, warmup=1, repeats=2)
    plans = baseline_candidates(workload, mesh24)
    dp, _ = resolve(plans["dp"], ctx)
    replicated, _ = resolve(plans["replicated"], ctx)
    steps = []
    ctx.progress = steps.append
    retime([("dp", dp), ("replicated", replicated)], ctx, 3)
    # Per finalist: 1 warm-up, then 3 rounds of a settling step and a timed one.
    assert steps.count("step") == 2 * (1 + 2 * 3)
    steps.clear()
    retime([("dp", dp)], ctx, 3)
    assert steps.count("step") == 1 + 3
