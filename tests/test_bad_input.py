"""Malformed input, as a hostile user would give it: one line, the right exit, no secret.

A table of command lines and one of library calls. Each command line must
end with exactly one line on stderr, `shardsearch CMD: error: ...`, saying
what was wrong, with exit code 2 and no traceback; each library call must
raise the documented exception type (never RecursionError, SystemExit or a
bare UnicodeDecodeError). Nothing anywhere may show the storage password.
The command lines run in this process through `cli.main.main(argv)`; only
what could end the interpreter runs in a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from child_env import child_env
from side_by_side import run_side_by_side

import shardsearch as ss
from shardsearch import bench
from shardsearch.base.jsonfile import read_json
from shardsearch.base.limits import MAX_JSON_DEPTH, check_simulated_devices
from shardsearch.cli import main as _cli
from shardsearch.search import parse_bytes, rule_from_config
from shardsearch.search.study.storage import open_study
from shardsearch.workloads import get_workload

SECRET = "secretpw"
ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "rules" / "cpu-sim8" / "mlp-small-dp2-tp4.json"
# Port 1 on loopback: nothing listens there, so connecting is refused at once.
REFUSED = f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:1/db"
NO_DRIVER = f"postgresql+pg8000://u:{SECRET}@127.0.0.1:1/db"
STUDY = "bad-input"
MLP = ["--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--objective", "static", "--quiet",
       "--no-compile-cache"]

FACTORIES = '''
import sys

def raises():
    raise RuntimeError("the factory broke")

def returns_none():
    return None

def exits():
    sys.exit(3)

def interrupts_nothing():
    raise KeyError("no such preset")

not_callable = 42
'''


def _plan(edit):
    data = json.loads(PLAN.read_text(encoding="utf-8"))
    edit(data)
    return json.dumps(data)


def _logical_rule(*assignment):
    """The state rule of a recorded logical plan, with another assignment."""
    recorded = ROOT / "rules" / "logical" / "cpu-static64" / "gpt-1.5b-dp16-tp4-16gib.json"
    rule = json.loads(recorded.read_text(encoding="utf-8"))["state_rule"]
    return dict(rule, assignment=[list(a) for a in assignment])


def _suite(**fields):
    data = {"suite": "tiny", "platform": "cpu", "devices": 8, "simulated": True,
            "entries": [{"id": "e1", "workload": "mlp", "size": "tiny", "mesh": "dp=2,tp=4",
                         "trials": 2}]}
    data.update(fields)
    return json.dumps(data, ensure_ascii=False)


def _deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


# Files the table's rows read, by name; str → text, bytes → raw bytes.
FILES: dict[str, str | bytes] = {
    "plan.json": PLAN.read_text(encoding="utf-8"),
    "empty.json": "",
    "truncated.json": PLAN.read_text(encoding="utf-8")[:200],
    "notjson.json": "{'schema': 1}",
    "list.json": "[1, 2]",
    "deep.json": _deep(),
    "deep-object.json": '{"a":' * 5000 + "1" + "}" * 5000,
    "latin1.json": '{"schema": 1, "name": "caf\xe9"}'.encode("latin-1"),
    "utf16.json": '{"schema": 1}'.encode("utf-16"),
    "missing-field.json": _plan(lambda d: d.pop("state_rule")),
    "schema-99.json": _plan(lambda d: d.update(schema=99)),
    "schema-str.json": _plan(lambda d: d.update(schema="1")),
    "bad-mesh.json": _plan(lambda d: d.update(mesh={"axis_names": ["dp"], "axis_sizes": [0]})),
    "unknown-kind.json": _plan(lambda d: d.update(state_rule={"kind": "nope"})),
    "state-axis.json": _plan(lambda d: d.update(
        state_rule={"kind": "auto", "axis_names": [["dp", "zz"]], "min_shard_size": None,
                    "reverse": False})),
    "batch-axis.json": _plan(lambda d: d.update(batch_rule={"kind": "batch", "axes": ["zz"]})),
    "logical-axis.json": _plan(lambda d: d.update(state_rule=_logical_rule(["mlp", ["dp", "zz"]]))),
    "path-axis.json": _plan(lambda d: d.update(
        state_rule={"kind": "path", "rules": [[".*", [None, "model"]]],
                    "fallback": "replicate"})),
    "hash.json": _plan(lambda d: d["workload"].update(hash="0" * 16)),
    "leaf-axis.json": _plan(lambda d: d["workload"]["arguments"][0][0].update(spec=["zz"])),
    "suite-deep.json": _deep(),
    "suite-latin1.json": _suite(description="caf\xe9").encode("latin-1"),
    "suite-list.json": "[]",
    "suite-devices.json": _suite(devices=100_000),
    "suite-unknown.json": _suite(colour="blue"),
    "suite-entry.json": _suite(entries=[{"id": "e 1", "workload": "mlp", "size": "tiny",
                                         "mesh": "dp=2,tp=4", "trials": 2}]),
    "badfactories.py": FACTORIES,
    "badimport.py": "raise RuntimeError('module-level failure')\n",
    "badsyntax.py": "def broken(:\n",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The table's files and a study with one finished trial, in a fresh folder."""
    d = tmp_path_factory.mktemp("bad-input")
    for name, content in FILES.items():
        path = d / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    (d / "a-folder").mkdir()
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    ss.optimize(get_workload("mlp:tiny"), mesh=mesh, n_trials=1, objective="static",
                storage=f"sqlite:///{d / 'studies.db'}", study_name=STUDY, quiet=True,
                confirm_rounds=0, isolate=False)
    return d


# --------------------------------------------------------------------------- the CLI

DB = ["--storage", "sqlite:///{d}/studies.db"]

# (id, argv with {d} for the folder, exit code, words the one line must hold)
CLI_CASES = [
    # mesh
    ("mesh-no-size", ["optimize", *MLP[:2], "--mesh", "dp=2,tp"], 2, "is not name=size"),
    ("mesh-empty", ["optimize", *MLP[:2], "--mesh", ""], 2, "is empty"),
    ("mesh-zero", ["optimize", *MLP[:2], "--mesh", "dp=0"], 2, "has size 0"),
    ("mesh-two-rest", ["optimize", *MLP[:2], "--mesh", "dp=-1,tp=-1"], 2,
     "more than one axis has size -1"),
    ("mesh-repeated", ["optimize", *MLP[:2], "--mesh", "dp=2,dp=4"], 2, "dp"),
    ("mesh-bad-name", ["optimize", *MLP[:2], "--mesh", "1dp=8"], 2, "not an identifier"),
    ("mesh-bad-size", ["optimize", *MLP[:2], "--mesh", "dp=two"], 2, "not an integer"),
    ("mesh-too-big", ["optimize", *MLP[:2], "--mesh", "dp=4,tp=4"], 2,
     "needs 16 devices but there are 8"),
    ("mesh-rest-indivisible", ["optimize", *MLP[:2], "--mesh", "dp=3,tp=-1"], 2,
     "does not divide"),
    ("show-mesh-rest", ["show", "{d}/plan.json", "--mesh", "dp=-1,tp=4"], 2, "no -1"),
    ("show-mesh-names", ["show", "{d}/plan.json", "--mesh", "data=2,model=4"], 2,
     "found on a mesh with axes ('dp', 'tp')"),
    ("show-mesh-malformed", ["show", "{d}/plan.json", "--mesh", "dp"], 2, "not name=size"),
    # budget
    ("budget-unit", ["optimize", *MLP, "--budget", "2GB?"], 2, "is not a byte count"),
    ("budget-negative", ["optimize", *MLP, "--budget", "-5"], 2, "is not a byte count"),
    ("budget-inf", ["optimize", *MLP, "--budget", "inf"], 2, "is not a byte count"),
    ("budget-zero", ["optimize", *MLP, "--budget", "0"], 2, "at least 1 byte"),
    ("budget-furlongs", ["optimize", *MLP, "--budget", "3furlongs"], 2, "unknown unit"),
    ("budget-too-small", ["optimize", *MLP, "--budget", "1KiB"], 2, "budget"),
    # workload
    ("workload-module", ["optimize", "--workload", "nope:tiny", "--mesh", "dp=8"], 2,
     "cannot import module 'nope'"),
    ("workload-size", ["optimize", "--workload", "gpt:huge", "--mesh", "dp=8"], 2,
     "unknown size 'huge'"),
    ("workload-empty", ["optimize", "--workload", "", "--mesh", "dp=8"], 2,
     "unknown workload ''"),
    ("workload-attr", ["optimize", "--workload", "os:no_such_factory", "--mesh", "dp=8"], 2,
     "has no attribute"),
    ("workload-not-callable", ["optimize", "--workload", "badfactories:not_callable",
                               "--mesh", "dp=8"], 2, "not callable"),
    ("workload-returns-str", ["optimize", "--workload", "os:getcwd", "--mesh", "dp=8"], 2,
     "returned str, expected a shardsearch.workloads.Workload"),
    ("workload-returns-none", ["optimize", "--workload", "badfactories:returns_none",
                               "--mesh", "dp=8"], 2, "returned NoneType"),
    ("workload-raises", ["optimize", "--workload", "badfactories:raises", "--mesh", "dp=8"],
     2, "could not be built: RuntimeError: the factory broke"),
    ("workload-keyerror", ["optimize", "--workload", "badfactories:interrupts_nothing",
                           "--mesh", "dp=8"], 2, "KeyError"),
    ("workload-exits", ["optimize", "--workload", "badfactories:exits", "--mesh", "dp=8"], 2,
     "raised SystemExit(3)"),
    ("workload-import-fails", ["optimize", "--workload", "badimport:make", "--mesh", "dp=8"],
     2, "module-level failure"),
    ("workload-syntax", ["optimize", "--workload", "badsyntax:make", "--mesh", "dp=8"], 2,
     "SyntaxError"),
    ("show-workload", ["show", "{d}/plan.json", "--workload", "nope:tiny"], 2,
     "cannot import module 'nope'"),
    ("export-workload", ["export", "--study", STUDY, *DB, "--workload", "gpt:huge",
                         "--out", "{d}/x.json"], 2, "unknown size 'huge'"),
    # storage
    ("storage-dir", ["optimize", *MLP, "--storage", "sqlite:////nonexistent-dir/x.db"], 2,
     "cannot open storage"),
    # (The evaluation worker never sees the storage: storage-dir keeps the
    # default, a worker started and then ended by the error; the others search
    # in this process, which spares starting one.)
    ("storage-not-url", ["optimize", *MLP, "--no-isolate", "--storage", f"{SECRET}.db"], 2,
     "cannot open storage '***'"),
    ("storage-refused", ["optimize", *MLP, "--no-isolate", "--storage", REFUSED], 2,
     "Connection refused"),
    ("storage-no-driver", ["export", "--study", "s", "--storage", NO_DRIVER, "--out",
                           "{d}/x.json"], 2, "No module named 'pg8000'"),
    ("storage-query-secret", ["export", "--study", "s", "--storage",
                              f"postgresql+psycopg2://u@127.0.0.1:1/db?password={SECRET}",
                              "--out", "{d}/x.json"], 2, "password=***"),
    ("storage-at-in-password", ["export", "--study", "s", "--storage",
                                f"postgresql+psycopg2://u:{SECRET}@{SECRET}@127.0.0.1:1/d",
                                "--out", "{d}/x.json"],
     2, "cannot open storage 'postgresql+psycopg2://***@127.0.0.1:1/d'"),
    ("storage-unknown-dialect", ["export", "--study", "s", "--storage",
                                 f"postgresql+nosuch://u:{SECRET}@db/x", "--out",
                                 "{d}/x.json"], 2, "Can't load plugin"),
    ("export-storage-refused", ["export", "--study", "s", "--storage", REFUSED, "--out",
                                "{d}/x.json"], 2, "Connection refused"),
    ("export-storage-dir", ["export", "--study", "s", "--storage",
                            "sqlite:////nonexistent-dir/x.db", "--out", "{d}/x.json"], 2,
     "cannot open storage"),
    # study
    ("study-empty", ["optimize", *MLP, "--study", ""], 2, "argument --study"),
    ("study-blank", ["optimize", *MLP, "--study", "   "], 2, "non-empty"),
    ("study-newline", ["optimize", *MLP, "--study", "a\nb"], 2, "one line"),
    ("study-control", ["optimize", *MLP, "--study", "a\x00b"], 2, "one line"),
    ("export-study-empty", ["export", "--study", "", "--out", "{d}/x.json"], 2,
     "argument --study"),
    ("export-study-newline", ["export", "--study", "x\r\ny", "--out", "{d}/x.json"], 2,
     "one line"),
    ("export-study-missing", ["export", "--study", "nope", *DB, "--out", "{d}/x.json"], 2,
     "no study named 'nope'"),
    ("export-trial-missing", ["export", "--study", STUDY, *DB, "--trial", "99", "--out",
                              "{d}/x.json"], 2, "99"),
    ("export-trial-negative", ["export", "--study", STUDY, *DB, "--trial", "-1", "--out",
                               "{d}/x.json"], 2, "must be 0 or more"),
    ("export-out-folder", ["export", "--study", STUDY, *DB, "--out", "{d}/a-folder"], 2,
     "cannot write"),
    ("export-format", ["export", "--study", STUDY, "--out", "x", "--format", "yaml"], 2,
     "invalid choice: 'yaml'"),
    # plan files
    ("plan-missing", ["show", "{d}/missing.json"], 2, "cannot read"),
    ("plan-folder", ["show", "{d}/a-folder"], 2, "cannot read"),
    ("plan-empty", ["show", "{d}/empty.json"], 2, "truncated"),
    ("plan-truncated", ["show", "{d}/truncated.json"], 2, "truncated"),
    ("plan-not-json", ["show", "{d}/notjson.json"], 2, "not valid JSON"),
    ("plan-list", ["show", "{d}/list.json"], 2, "expected a JSON object"),
    ("plan-deep", ["show", "{d}/deep.json"], 2, f"nested deeper than {MAX_JSON_DEPTH}"),
    ("plan-deep-object", ["show", "{d}/deep-object.json"], 2,
     f"nested deeper than {MAX_JSON_DEPTH}"),
    ("plan-latin1", ["show", "{d}/latin1.json"], 2, "latin1.json: not UTF-8"),
    ("plan-utf16", ["show", "{d}/utf16.json"], 2, "utf16.json: not UTF-8"),
    ("plan-missing-field", ["show", "{d}/missing-field.json"], 2, "missing field 'state_rule'"),
    ("plan-schema-99", ["show", "{d}/schema-99.json"], 2, "schema 99 is newer"),
    ("plan-schema-str", ["show", "{d}/schema-str.json"], 2, "must be a positive integer"),
    ("plan-bad-mesh", ["show", "{d}/bad-mesh.json"], 2, "mesh.axis_sizes"),
    ("plan-unknown-kind", ["show", "{d}/unknown-kind.json"], 2, "unknown rule kind 'nope'"),
    ("plan-state-axis", ["show", "{d}/state-axis.json"], 2,
     "state_rule.axis_names names axis 'zz', which is not in the plan's own mesh"),
    ("plan-batch-axis", ["show", "{d}/batch-axis.json"], 2, "batch_rule.axes names axis 'zz'"),
    ("plan-path-axis", ["show", "{d}/path-axis.json"], 2, "names axis 'model'"),
    ("plan-hash", ["show", "{d}/hash.json"], 2, "the file was edited or damaged"),
    ("plan-leaf-axis", ["show", "{d}/leaf-axis.json"], 2, "uses axis 'zz'"),
    # suite files
    ("suite-missing", ["bench", "--suite", "{d}/missing.json"], 2, "does not exist"),
    ("suite-deep", ["bench", "--suite", "{d}/suite-deep.json"], 2,
     f"nested deeper than {MAX_JSON_DEPTH}"),
    ("suite-latin1", ["bench", "--suite", "{d}/suite-latin1.json"], 2, "not UTF-8"),
    ("suite-list", ["bench", "--suite", "{d}/suite-list.json"], 2, "expected a JSON object"),
    ("suite-not-json", ["bench", "--suite", "{d}/notjson.json"], 2, "is not valid JSON"),
    ("suite-devices", ["bench", "--suite", "{d}/suite-devices.json"], 2,
     "100000 asked, at most 4096"),
    ("suite-unknown-field", ["bench", "--suite", "{d}/suite-unknown.json"], 2,
     "unknown field 'colour'"),
    ("suite-entry-id", ["bench", "--suite", "{d}/suite-entry.json"], 2, "may hold only"),
    ("suite-unknown-name", ["bench", "--suite", "nope"], 2, "unknown suite 'nope'"),
    ("suite-dir", ["bench", "--suite", "x", "--suites-dir", "{d}/nowhere"], 2,
     "no such folder"),
    # start plans
    ("start-from-missing", ["optimize", *MLP, "--start-from", "{d}/missing.json"], 2,
     "missing.json': cannot read it"),
    ("start-from-not-a-plan", ["optimize", *MLP, "--start-from", "{d}/list.json"], 2,
     "list.json: a logical_axis_rules list must be a list of [logical_name, mesh_axes_or_null] "
     "pairs"),
    ("bench-start-from-folder", ["bench", "--suite", "cpu-sim8", "--start-from",
                                 "{d}/nowhere"], 2, "no such folder"),
    # devices
    ("devices-huge", ["optimize", *MLP, "--devices", "100000"], 2, "at most 4096"),
    ("devices-zero", ["optimize", *MLP, "--devices", "0"], 2, "must be at least 1"),
    ("devices-word", ["optimize", *MLP, "--devices", "eight"], 2, "not a whole number"),
    ("bench-devices-huge", ["bench", "--suite", "cpu-sim8", "--devices", "100000"], 2,
     "at most 4096"),
    # other options
    ("trials-negative", ["optimize", *MLP, "--trials", "-1"], 2, "must be 0 or more"),
    ("timeout-zero", ["optimize", *MLP, "--timeout", "0"], 2, "must be a positive number"),
    ("timeout-nan", ["optimize", *MLP, "--timeout", "nan"], 2, "must be a positive number"),
    ("repeats-zero", ["optimize", *MLP, "--repeats", "0"], 2, "must be at least 1"),
    ("objective", ["optimize", *MLP, "--objective", "fast"], 2, "invalid choice: 'fast'"),
    ("out-folder", ["optimize", *MLP, "--out", "{d}/a-folder"], 2, "is a directory"),
    ("unknown-option", ["optimize", *MLP, "--colour", "blue"], 2, "unrecognized arguments"),
    ("unknown-command", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ("missing-required", ["optimize", "--mesh", "dp=8"], 2, "--workload"),
]


def _one_line(err: str, command: str) -> str:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    # argparse reports what no subcommand claims (an unknown option) at the top.
    assert lines[0].startswith((f"shardsearch {command}: error: ", "shardsearch: error: ")), \
        lines[0]
    return lines[0]


@pytest.mark.parametrize(("argv", "code", "words"), [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_bad_command_lines(argv, code, words, folder, monkeypatch, capfd):
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))  # the factory modules
    argv = [a.replace("{d}", str(folder)) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert _cli.main(argv) == code, err.getvalue()
    line = _one_line(err.getvalue(), argv[0])
    assert words in line
    captured = capfd.readouterr()  # what bypassed sys.stdout/err (C++ logs, handlers)
    everything = out.getvalue() + err.getvalue() + captured.out + captured.err
    assert SECRET not in everything and "Traceback" not in everything


def test_the_table_is_large_enough():
    assert len(CLI_CASES) + len(LIBRARY_CASES) + len(SUBPROCESS_CASES) >= 60
    assert len({c[0] for c in CLI_CASES}) == len(CLI_CASES)


# --------------------------------------------------------------------------- in a subprocess

# What would end the interpreter if the CLI let it: a factory calling exit.
SUBPROCESS_CASES = [
    ("builtins-exit", ["optimize", "--workload", "builtins:exit", "--mesh", "dp=1"],
     "raised SystemExit(None)"),
    ("factory-sys-exit", ["optimize", "--workload", "badfactories:exits", "--mesh", "dp=1"],
     "raised SystemExit(3)"),
    ("builtins-quit", ["show", "{d}/plan.json", "--workload", "builtins:quit"],
     "raised SystemExit(None)"),
]


@pytest.fixture(scope="module")
def exited(folder):
    """Each case's command run in its own process, all side by side (each
    spends its time importing jax): `(exit code, stderr)` by case id."""
    env = child_env()
    commands = {case: [sys.executable, "-m", "shardsearch",
                       *(a.replace("{d}", str(folder)) for a in argv)]
                for case, argv, _words in SUBPROCESS_CASES}
    return {case: (done.returncode, done.stderr)
            for case, done in run_side_by_side(commands, folder, env).items()}


@pytest.mark.parametrize(("case", "argv", "words"), SUBPROCESS_CASES,
                         ids=[c[0] for c in SUBPROCESS_CASES])
def test_factories_that_exit_do_not_end_the_command(case, argv, words, exited):
    code, err = exited[case]
    assert code == 2, err
    assert words in _one_line(err, argv[0])


# --------------------------------------------------------------------------- the library

_ARGS = (jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((8, 8), jnp.float32))


def _step(state, batch):
    return state, {"loss": jnp.sum(state * batch)}


def _optimize(**kwargs):
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    options = dict(mesh=mesh, objective="static", n_trials=1, quiet=True, warm_start=False,
                   isolate=False)
    options.update(kwargs)
    return ss.optimize(_step, _ARGS, **options)


# (id, call taking the folder, exception type, regex the message must match)
LIBRARY_CASES = [
    ("load-deep", lambda d: ss.load_plan(d / "deep.json"), ValueError,
     r"deep\.json: nested deeper than 64"),
    ("load-deep-object", lambda d: ss.load_rule(d / "deep-object.json"), ValueError,
     "nested deeper"),
    ("load-latin1", lambda d: ss.load_plan(d / "latin1.json"), ValueError,
     r"latin1\.json: not UTF-8 text \(byte 0xe9"),
    ("load-missing", lambda d: ss.load_plan(d / "missing.json"), OSError, "missing.json"),
    ("load-state-axis", lambda d: ss.load_plan(d / "state-axis.json"), ValueError,
     r"state-axis\.json: state_rule\.axis_names names axis 'zz'"),
    ("load-batch-axis", lambda d: ss.load_rule(d / "batch-axis.json"), ValueError,
     r"batch-axis\.json: batch_rule\.axes names axis 'zz'"),
    ("load-logical-axis", lambda d: ss.load_plan(d / "logical-axis.json"), ValueError,
     r"logical-axis\.json: state_rule: malformed 'logical' rule .*logical axis 'mlp' is "
     r"assigned mesh axis 'zz', which is not in the mesh"),
    ("load-other-mesh", lambda d: ss.load_plan(
        d / "plan.json", ss.abstract_mesh((8,), ("x",))), ValueError, "axis names"),
    ("from-config-list", lambda d: ss.ShardingPlan.from_config([]), ValueError,
     "expected a JSON object"),
    ("rule-unknown-kind", lambda d: rule_from_config({"kind": "nope"}), ValueError,
     "unknown rule kind"),
    ("read-json-deep", lambda d: read_json(d / "deep.json"), ValueError, "nested deeper"),
    ("read-json-utf16", lambda d: read_json(d / "utf16.json"), ValueError, "not UTF-8"),
    ("suite-deep", lambda d: bench.load_suite(str(d / "suite-deep.json")), ValueError,
     "nested deeper"),
    ("suite-devices", lambda d: bench.load_suite(str(d / "suite-devices.json")), ValueError,
     "at most 4096"),
    ("suite-unknown", lambda d: bench.load_suite("nope"), ValueError, "unknown suite"),
    ("devices-huge", lambda d: check_simulated_devices(100_000), ValueError, "at most 4096"),
    ("devices-zero", lambda d: ss.use_cpu_devices(0), ValueError, "positive integer"),
    ("workload-not-str", lambda d: get_workload(3), TypeError, "must be a str"),
    ("workload-exit", lambda d: get_workload("builtins:exit"), ValueError,
     r"raised SystemExit\(None\)"),
    ("workload-sys-exit", lambda d: get_workload("badfactories:exits"), ValueError,
     r"raised SystemExit\(3\)"),
    ("workload-not-workload", lambda d: get_workload("os:getcwd"), TypeError, "returned str"),
    ("workload-size", lambda d: get_workload("mlp:huge"), ValueError, "unknown size"),
    ("mesh-parse", lambda d: ss.parse_mesh("dp=2,tp"), ValueError, "not name=size"),
    ("mesh-not-str", lambda d: ss.parse_mesh(8), ValueError, "empty"),
    ("mesh-create-size", lambda d: ss.create_mesh((16,), ("x",)), ValueError, "16"),
    ("mesh-create-names", lambda d: ss.create_mesh((2, 4), ("x",)), ValueError,
     "one size per name"),
    ("mesh-abstract", lambda d: ss.abstract_mesh((0,), ("x",)), ValueError, "positive size"),
    ("bytes-word", lambda d: parse_bytes("lots"), ValueError, "not a byte count"),
    ("bytes-bool", lambda d: parse_bytes(True), ValueError, "not a number of bytes"),
    ("optimize-study-empty", lambda d: _optimize(study_name=""), ValueError,
     "study name ''"),
    ("optimize-study-newline", lambda d: _optimize(study_name="a\nb"), ValueError,
     "one line"),
    ("optimize-trials", lambda d: _optimize(n_trials=-1), ValueError, "n_trials"),
    ("optimize-budget", lambda d: _optimize(memory_budget="2GB?"), ValueError,
     "not a byte count"),
    ("optimize-objective", lambda d: _optimize(objective="fast"), ValueError, "fast"),
    ("optimize-refused", lambda d: _optimize(storage=REFUSED), ValueError,
     "Connection refused"),
    ("open-study-no-driver", lambda d: open_study(NO_DRIVER, "s"), ValueError, "pg8000"),
    ("open-study-empty", lambda d: open_study(f"sqlite:///{d}/studies.db", ""), ValueError,
     "study name"),
    ("open-study-refused", lambda d: open_study(REFUSED, "s", create=False), ValueError,
     r"cannot open storage 'postgresql\+psycopg2://u:\*\*\*@127\.0\.0\.1:1/db'"),
    ("export-no-trial", lambda d: ss.export_config(
        open_study(f"sqlite:///{d}/studies.db", STUDY, create=False), trial=99), ValueError,
     "99"),
    ("rule-axis-string", lambda d: ss.AutoShardingRule(axis_names="dp"), TypeError,
     "write \\('dp',\\)"),
]


@pytest.mark.parametrize(("call", "kind", "pattern"), [c[1:] for c in LIBRARY_CASES],
                         ids=[c[0] for c in LIBRARY_CASES])
def test_bad_library_calls(call, kind, pattern, folder, monkeypatch, capfd):
    monkeypatch.chdir(folder)  # a default storage would land here, not in the repository
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(kind, match=pattern) as info:
        call(folder)
    assert not isinstance(info.value, RecursionError | UnicodeDecodeError)
    text = "".join(traceback.format_exception(info.value))
    captured = capfd.readouterr()
    assert SECRET not in text + captured.out + captured.err


def test_the_plan_the_broken_ones_come_from_loads(folder):
    # Each broken plan is this one with one thing changed: that change is the error.
    assert ss.load_plan(folder / "plan.json").recorded_specs


def test_damaged_bench_entries_are_skipped_not_fatal(tmp_path):
    # An entry file is the runner's own output; a damaged one (another run
    # writing it, a bad disk) leaves the report without it, never a traceback.
    from shardsearch.bench import report

    entries = tmp_path / "entries"
    entries.mkdir()
    (entries / "deep.json").write_text(_deep(), encoding="utf-8")
    (entries / "latin1.json").write_bytes(b'{"id": "caf\xe9"}')
    assert report.load_entries(bench.load_suite("cpu-sim8"), tmp_path) == []
