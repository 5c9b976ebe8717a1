"""The command line: optimize → export → show, exit codes, one-line errors."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys

import pytest
from child_env import child_env

import shardsearch as ss
from shardsearch.base import spec as _spec
from shardsearch.base import tree as _tree
from shardsearch.cli import main as _cli
from shardsearch.search import plan_config
from shardsearch.workloads import get_workload

PLAN = "shardsearch-mlp-tiny-dp2-tp4.json"


def _subprocess(*argv, cwd, timeout=300, **env):
    return subprocess.run([sys.executable, "-m", "shardsearch", *argv], cwd=cwd,
                          env=child_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def _one_line_error(err, prog="shardsearch"):
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A static search run in-process with the default storage and --out, in a fresh folder."""
    folder = tmp_path_factory.mktemp("cli")
    here, out = os.getcwd(), io.StringIO()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out):
            # (--no-isolate: static estimates need no worker; the defaults under
            # test are the storage and the plan file's name.)
            code = _cli.main(["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4",
                              "--trials", "5", "--objective", "static", "--quiet",
                              "--no-compile-cache", "--no-isolate"])
    finally:
        os.chdir(here)
    assert code == 0, out.getvalue()
    return folder, out.getvalue()


def test_optimize_prints_the_table_and_writes_the_plan(searched):
    folder, out = searched
    assert (folder / PLAN).is_file()
    assert (folder / ".shardsearch" / "studies.db").is_file()
    assert re.search(r"estimated ms .* vs replicated +vs best expert +memory/device", out)
    assert re.search(r"^\s*\* ", out, re.MULTILINE)  # the exported row is marked
    assert re.search(r"^  replicated +[0-9.]+ +- +1\.00x", out, re.MULTILINE)
    assert "trials: 5 run, 5 completed; cut 0 at check" in out
    assert "study: 'mlp:tiny@dp=2,tp=4/static/" in out
    assert out.rstrip().endswith(f"wrote {PLAN}")


def _study_name(out):
    return re.search(r"^study: '([^']+)'", out, re.MULTILINE).group(1)


def test_export_from_the_default_storage(searched, monkeypatch, capsys):
    folder, out = searched
    monkeypatch.chdir(folder)
    assert _cli.main(["export", "--study", _study_name(out), "--out", "again.json"]) == 0
    # The same study exported twice gives the same bytes: export is a pure read.
    assert (folder / "again.json").read_bytes() == (folder / PLAN).read_bytes()
    assert "wrote again.json (json)" in capsys.readouterr().out
    assert _cli.main(["export", "--study", _study_name(out), "--trial", "0",
                      "--out", "rules.py", "--format", "partition-rules"]) == 0
    assert (folder / "rules.py").read_text().count("PARTITION_RULES = [") == 2  # + BATCH_


def test_show_with_a_workload_lists_every_leaf(searched, capsys):
    folder, _ = searched
    assert _cli.main(["show", str(folder / PLAN), "--workload", "mlp:tiny"]) == 0
    out = capsys.readouterr().out
    assert "state rule:" in out and "batch rule:" in out
    assert re.search(r"^path +shape +dtype +spec +bytes/device$", out, re.MULTILINE)
    assert re.search(r"^state/params/w1 +\[64,64\] +float32 +P\(", out, re.MULTILINE)
    assert re.search(r"^batch/x +\[16,64\] +float32", out, re.MULTILINE)
    assert re.search(r"^per device: [0-9.]+ KiB of arguments$", out, re.MULTILINE)


def test_show_on_another_mesh_and_a_resized_model(searched, capsys):
    folder, _ = searched
    code = _cli.main(["show", str(folder / PLAN), "--workload", "mlp:small",
                      "--mesh", "dp=4,tp=8"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "leaves on mesh dp=4,tp=8" in captured.out
    assert captured.err.startswith("note: ") and "applying the plan's rules afresh" in \
        captured.err


@pytest.mark.parametrize(("argv", "message"), [
    (["optimize", "--workload", "nope:tiny", "--mesh", "dp=2,tp=4"], "cannot import module"),
    (["optimize", "--workload", "gpt:huge", "--mesh", "dp=2,tp=4"], "unknown size 'huge'"),
    (["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp"], "part 'tp' is not name=size"),
    (["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--budget", "2GB?"],
     "'2GB?' is not a byte count"),
    (["optimize", "--workload", "mlp:tiny", "--mesh", "dp=4,tp=4"],
     "needs 16 devices but there are 8"),
    (["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--objective", "static",
      "--no-isolate", "--storage", "sqlite:////nonexistent-dir/x.db"], "cannot open storage"),
    (["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--trials", "x"],
     "argument --trials: not a whole number"),
    (["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--objective", "fast"],
     "invalid choice: 'fast'"),
    (["export", "--study", "nope", "--out", "x.json"], "no study named 'nope'"),
    (["export", "--study", "nope", "--storage", "sqlite:////nonexistent-dir/x.db",
      "--out", "x.json"], "cannot open storage"),
    (["show", "missing.json"], "cannot read missing.json"),
])
def test_bad_invocations_are_one_line_and_exit_2(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _cli.main(argv) == 2
    captured = capsys.readouterr()
    assert message in _one_line_error(captured.err, f"shardsearch {argv[0]}")


def test_bad_plan_files_and_trials_exit_2(searched, tmp_path, monkeypatch, capsys):
    folder, out = searched
    bad = tmp_path / "bad.json"
    bad.write_text((folder / PLAN).read_text()[:100])
    assert _cli.main(["show", str(bad)]) == 2
    assert "truncated" in _one_line_error(capsys.readouterr().err, "shardsearch show")
    assert _cli.main(["show", str(folder / PLAN), "--mesh", "data=2,model=4"]) == 2
    assert "the plan was found on a mesh with axes ('dp', 'tp')" in _one_line_error(
        capsys.readouterr().err, "shardsearch show")
    monkeypatch.chdir(folder)
    assert _cli.main(["export", "--study", _study_name(out), "--trial", "99",
                      "--out", "x.json"]) == 2
    assert "has no shardsearch trial number 99" in _one_line_error(
        capsys.readouterr().err, "shardsearch export")


def test_help_of_every_command(capsys):
    for command in ("optimize", "export", "show"):
        assert _cli.main([command, "--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: shardsearch {command}")
    assert _cli.main([]) == 2
    assert "optimize" in capsys.readouterr().out


def test_more_devices_than_simulated_is_a_usage_error(tmp_path):
    done = _subprocess("optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4",
                       "--devices", "4", cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert "needs 8 devices but there are 4" in _one_line_error(done.stderr,
                                                                "shardsearch optimize")


def test_end_to_end_optimize_export_show_load(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    done = _subprocess("optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4",
                       "--devices", "8", "--trials", "4", "--repeats", "2", "--warmup", "1",
                       "--confirm-rounds", "6", "--storage", storage, "--study", "e2e",
                       "--out", "plan.json", "--quiet", cwd=tmp_path,
                       # The tests' cheap compiles (conftest) take under the
                       # command's 0.5 s threshold; JAX's own setting wins.
                       JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    assert done.returncode == 0, done.stderr
    assert re.search(r"median ms +95% CI ms", done.stdout)
    assert "wrote plan.json" in done.stdout
    # The persistent compilation cache is on by default, under ./.shardsearch/.
    assert any((tmp_path / ".shardsearch" / "jax-cache").iterdir())
    done = _subprocess("export", "--study", "e2e", "--storage", storage, "--out", "e.py",
                       "--format", "partition-rules", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _cli.main(["show", str(tmp_path / "plan.json"), "--workload", "mlp:tiny"]) == 0

    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["schema"] == 1 and plan["search"]["objective"] == "measured"
    assert plan["results"]["winner"]["ci_seconds"] is not None
    recorded = {leaf["path"]: _spec.spec_from_json(leaf["spec"])
                for leaf in plan["workload"]["arguments"][0]}
    state, _batch = get_workload("mlp:tiny").abstract()
    specs = ss.load_rule(tmp_path / "plan.json").apply(state)
    assert dict(_tree.leaf_specs(specs)) == recorded
    namespace = {}
    exec((tmp_path / "e.py").read_text(), namespace)
    from_rules = ss.PathShardingRule(namespace["PARTITION_RULES"], fallback="error",
                                     mesh=ss.abstract_mesh((2, 4), ("dp", "tp"))).apply(state)
    assert from_rules == specs


FACTORY = '''import dataclasses

from shardsearch.workloads import get_workload


def make():
    return dataclasses.replace(get_workload("mlp:tiny"), name="ss_test_factory:make")
'''


def test_a_factory_workload_is_imported_only_when_named(tmp_path, monkeypatch, capsys):
    (tmp_path / "ss_test_factory.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the folder on it
    monkeypatch.delitem(sys.modules, "ss_test_factory", raising=False)
    storage = f"sqlite:///{tmp_path}/f.db"
    assert _cli.main(["optimize", "--workload", "ss_test_factory:make", "--mesh", "dp=2,tp=4",
                      "--trials", "3", "--objective", "static", "--storage", storage,
                      "--study", "f", "--quiet", "--no-compile-cache"]) == 0
    assert (tmp_path / "shardsearch-ss_test_factory-make-dp2-tp4.json").is_file()
    capsys.readouterr()
    export = ["export", "--study", "f", "--storage", storage, "--out", "p.json"]
    assert _cli.main(export) == 2
    assert "pass that workload explicitly (--workload ss_test_factory:make)" in \
        _one_line_error(capsys.readouterr().err, "shardsearch export")
    assert _cli.main([*export, "--workload", "ss_test_factory:make"]) == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["workload"]["name"] == "ss_test_factory:make"


def test_show_exits_1_when_the_plan_does_not_fit(tmp_path, capsys):
    mesh = ss.abstract_mesh((2, 4), ("dp", "tp"))
    path = ss.write_config(plan_config(ss.AutoShardingRule(), ss.BatchShardingRule(("dp",)),
                                          mesh), tmp_path / "plan.json")
    assert _cli.main(["show", str(path), "--workload", "mlp:tiny", "--mesh", "dp=3,tp=4"]) == 1
    err = capsys.readouterr().err
    assert "the plan does not fit mlp:tiny on mesh dp=3,tp=4: 2 problem(s):" in err
    assert "batch/x: dim 0 has size 16, not divisible by mesh axis 'dp' of size 3" in err


@pytest.mark.parametrize("setting, threshold", [(None, "0.5"), ("2.5", "2.5")])
def test_the_compile_caches_threshold_is_half_a_second_unless_jax_is_told(
        tmp_path, setting, threshold):
    code = ("import jax; from shardsearch.search.study.storage import use_compile_cache; "
            "use_compile_cache('cache'); "
            "print(jax.config.jax_persistent_cache_min_compile_time_secs)")
    env = child_env()
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    if setting is not None:
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = setting
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == threshold
    assert (tmp_path / "cache").is_dir()
