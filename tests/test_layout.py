"""The package's layout: one-way imports between the stages, a light public front.

These tests read the source (every `import`, including those inside
functions) rather than running it, so a cycle hidden behind a lazy import is
found too. Imports under `if TYPE_CHECKING:` are annotations only (they never
run), so they are not edges. `docs/architecture.md` explains the order they
enforce.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

import shardsearch

PACKAGE = Path(shardsearch.__file__).parent
ROOT = PACKAGE.parent

# Subpackages from the bottom of the pipeline up; a module may import from its
# own stage and from stages listed before it, never after. Plan files are read
# and written below the search, so a training script that loads a plan needs
# none of the search's machinery; the search's export turns a study into one.
STAGES = ("base", "logical", "rules", "workloads", "cost", "plan", "search", "bench", "cli")

# Inside `search/`, by job and from the bottom up; the driver (`loop`, `finish`,
# `setup`, `result`, `export`, `reconfirm`) sits on top. `execution` and
# `study` share a level: neither imports the other.
SEARCH_LEVELS = (("space",), ("evaluation",), ("execution", "study"), ("driver",))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> list[str]:
    """Every package module `name` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[str] = []
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "shardsearch"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "shardsearch":
                continue
            # `from pkg import mod` imports the module; `from mod import name` the module.
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            out += subs or [target]
    return [m for m in out if m in known]


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` but those under `if TYPE_CHECKING:` (annotations only)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for target in _imports(name, path, set(modules)):
            if target != name:
                graph.add_edge(name, target)
    return graph


def test_no_import_cycle_among_the_package_modules():
    graph = _graph()
    # The public front imports everything by design; nothing imports it back.
    assert not list(graph.predecessors("shardsearch")), (
        f"modules import the package front: {sorted(graph.predecessors('shardsearch'))}; "
        "import the defining module instead")
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_the_walk_sees_function_level_imports():
    # The checker itself: a lazy import inside a function is an edge too.
    graph = _graph()
    assert graph.has_edge("shardsearch.cli.bench", "shardsearch.bench.runner")


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in STAGES else None


def test_stages_import_only_downward():
    wrong = []
    for source, target in _graph().edges:
        a, b = _stage(source), _stage(target)
        if a is None or b is None or a == b:
            continue
        if STAGES.index(b) > STAGES.index(a):
            wrong.append(f"{source} -> {target}")
    assert not wrong, "imports against the pipeline's direction:\n  " + "\n  ".join(wrong)


def _search_level(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["shardsearch", "search"] or len(parts) < 3:
        return None
    job = parts[2] if len(parts) > 3 else "driver"
    return next(i for i, jobs in enumerate(SEARCH_LEVELS) if job in jobs or jobs == ("driver",))


def test_search_jobs_import_only_downward_and_execution_never_meets_study():
    wrong = []
    for source, target in _graph().edges:
        a, b = _search_level(source), _search_level(target)
        if a is None or b is None:
            continue
        job_a, job_b = source.split(".")[2], target.split(".")[2]
        if b > a or (a == b and a == 2 and job_a != job_b):
            wrong.append(f"{source} -> {target}")
    assert not wrong, "imports against search/'s layers:\n  " + "\n  ".join(wrong)


def test_no_module_imports_the_search_front():
    # `shardsearch.search` re-exports the search's names for extensions; the
    # modules behind it import each other by their own paths.
    graph = _graph()
    assert not [m for m in graph.predecessors("shardsearch.search") if m != "shardsearch"]


def test_the_type_checking_filter_is_not_vacuous():
    # evaluation.context names its executor's type for annotations only.
    source = (PACKAGE / "search" / "evaluation" / "context.py").read_text(encoding="utf-8")
    assert "from ..execution.base import Executor" in source
    assert not _graph().has_edge("shardsearch.search.evaluation.context",
                                 "shardsearch.search.execution.base")


def test_the_stored_process_times_key_is_the_one_study_attrs_names():
    from shardsearch.search.execution.distributed import PROCESS_TIMES_ATTR
    from shardsearch.search.study import attrs

    assert PROCESS_TIMES_ATTR == attrs.PROCESS_STEP_TIMES


def test_import_shardsearch_loads_no_benchmark_or_cli_code():
    code = (
        "import json, sys, shardsearch\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('shardsearch'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    loaded = json.loads(out.stdout)
    assert "shardsearch.search.loop" in loaded  # the walk is not vacuous
    assert not [m for m in loaded if m.startswith(("shardsearch.bench", "shardsearch.cli"))]


def _front_imports(front: str) -> dict[str, tuple[str, str]]:
    """A front's re-exports: public name -> (defining module, name there)."""
    module = importlib.import_module(front)
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), front)
            for alias in node.names:
                out[alias.asname or alias.name] = (target, alias.name)
    return out


@pytest.mark.parametrize("front", ["shardsearch", "shardsearch.search"])
def test_every_public_name_is_defined_outside_its_front(front):
    module = importlib.import_module(front)
    imports = _front_imports(front)
    assert len(module.__all__) == len(set(module.__all__))
    for name in module.__all__:
        source, there = imports[name]  # a KeyError: a name defined in the front itself
        assert source.startswith("shardsearch.") and source != front, name
        assert getattr(importlib.import_module(source), there) is getattr(module, name)


def test_the_user_front_stays_small():
    # The user's workflow; the search's parts live in shardsearch.search.
    assert len(shardsearch.__all__) <= 40
    assert not {"Candidate", "Outcome", "TrialRecord", "make_context"} & set(shardsearch.__all__)


RECORDED_PLANS = sorted((ROOT / "rules").rglob("*.json"))
RECORDED_SUITES = sorted(str(p.parent.relative_to(ROOT / "benchmarks" / "results"))
                         for p in (ROOT / "benchmarks" / "results").rglob("entries")
                         if p.is_dir())


@pytest.mark.parametrize("path", RECORDED_PLANS, ids=lambda p: str(p.relative_to(ROOT / "rules")))
def test_recorded_plans_still_load_and_give_their_recorded_specs(path):
    plan = shardsearch.load_plan(path)
    recorded = plan.recorded_specs
    assert recorded is not None and recorded[0]
    # The rules, rebuilt through the registry, still produce what was recorded.
    config = json.loads(path.read_text(encoding="utf-8"))
    assert plan.rule.to_config() == config["state_rule"]
    assert plan.batch_rule.to_config() == config["batch_rule"]


@pytest.mark.parametrize("suite", RECORDED_SUITES)
def test_recorded_suite_reports_regenerate_byte_for_byte(suite):
    from shardsearch import bench
    from shardsearch.bench import report

    folder = ROOT / "benchmarks" / "results" / suite
    loaded = bench.load_suite(folder.name)
    records = report.load_entries(loaded, folder)
    machine = json.loads((folder / "machine.json").read_text(encoding="utf-8"))
    assert records
    assert report.markdown(loaded, records, machine, report.load_rechecks(folder, records)) == (
        folder / "results.md").read_text(encoding="utf-8")
