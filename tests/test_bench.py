"""`shardsearch bench` and its suite files: one tiny suite end to end, resuming, and
every error path."""

import ast
import importlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path

import jax
import pytest
from bench_scripts import load_script
from child_env import child_env

import shardsearch as ss
from shardsearch import bench
from shardsearch.base.warnings import ShardsearchWarning
from shardsearch.bench import format_speedup, report
from shardsearch.bench.suite import builtin_suites, load_suite, suite_names
from shardsearch.cli import bench as _cli_bench
from shardsearch.cli import main as _cli
from shardsearch.workloads import get_workload

REPO = Path(__file__).resolve().parent.parent
TINY = {"workload": "mlp", "size": "tiny", "mesh": "dp=2,tp=4", "trials": 3}


def _suite(folder, entries, **fields):
    data = {"schema": 1, "suite": "tiny", "platform": "cpu", "devices": 8, "simulated": True,
            "timing": {"warmup": 1, "repeats": 2, "rounds": 6}, "entries": entries, **fields}
    path = folder / "tiny.json"
    path.write_text(json.dumps(data))
    return path


def _one_line_error(err):
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("shardsearch bench: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The tiny suite run once through the CLI, in-process: no budget and "quarter"."""
    folder = tmp_path_factory.mktemp("bench")
    path = _suite(folder, [{"id": "free", **TINY}, {"id": "tight", **TINY, "budget": "quarter"}])
    argv = ["bench", "--suite", str(path), "--out", str(folder / "out"),
            "--rules", str(folder / "rules"), "--quiet"]
    code = _cli.main(argv)
    assert code == 0
    out = folder / "out" / "tiny"
    entries = {p.stem: json.loads(p.read_text()) for p in (out / "entries").glob("*.json")}
    return folder, argv, out, entries


def test_every_plan_is_compared_in_one_run(ran):
    _folder, _argv, _out, entries = ran
    record = entries["free"]
    plans = {p["label"]: p for p in record["plans"]}
    # The suite's entries search both families (the default space), so the
    # megatron-style plan built from the step's logical axes is timed too.
    assert list(plans) == ["winner", "replicated", "default", "dp", "fsdp", "megatron",
                           "fsdp_tp", "logical_megatron", "single_device"]
    assert plans["winner"]["family"] in ("rules", "logical")
    for plan in plans.values():
        assert plan["fits"] and plan["status"] == "timed"
        assert len(plan["times"]) == 6  # the suite's rounds, all from the same run
        assert plan["ci_seconds"][0] <= plan["median_seconds"] <= plan["ci_seconds"][1]
        assert {"arguments", "total"} <= set(plan["memory_per_device"])
    # The winner is one of the plans or a searched candidate; twins are timed once.
    twins = [p for p in plans.values() if p["fingerprint"] == plans["winner"]["fingerprint"]
             and p["role"] not in ("winner", "single_device")]
    assert all(p["timed_as"] == "winner" for p in twins)
    s = record["speedups"]
    assert set(s) == {"vs_replicated", "vs_default", "vs_best_expert", "vs_single_device"}
    assert s["vs_best_expert"]["reference"] in ("dp", "fsdp", "megatron", "fsdp_tp")
    # What the winner changes against that plan: nothing only when it is that plan.
    differs = plans["winner"]["differs"]
    assert differs["reference"] == s["vs_best_expert"]["reference"]
    same = plans[differs["reference"]]["fingerprint"] == plans["winner"]["fingerprint"]
    assert (differs["dimensions"] == []) == same
    assert all(line.split(":")[0] in ("parameters", "optimizer state", "batch")
               for line in differs["dimensions"])
    for speedup in s.values():
        assert speedup["speedup"] > 0
        assert speedup["verdict"] in ("faster", "slower", "tie", "same plan")
    # The median per-round ratio (one device / winner), as every speedup is.
    per_round = [o / w for o, w in zip(plans["single_device"]["times"],
                                       plans["winner"]["times"], strict=True)]
    assert s["vs_single_device"]["time_ratio"] == pytest.approx(
        1 / statistics.median(per_round))
    search = record["search"]
    assert search["trials"]["trials"] == 3 and search["trials_before"] == 0
    assert search["compiles"] >= 1 and search["wall_seconds"] > 0
    assert 0 <= search["cut_share"] <= 1
    assert search["outputs_match"] is True
    # optimize's own confirmation picked the winner, with as many rounds as the comparison.
    confirmation = search["confirmation"]
    assert confirmation["rounds"] == 6
    assert confirmation["verdict"] in ("faster", "tie")
    assert len(confirmation["timings"]) >= 2
    for timing in confirmation["timings"].values():
        assert len(timing["times"]) == 6
    names = set(confirmation["timings"])
    if search["winner"]["label"] == "search":
        assert any(name.startswith("trial ") for name in names)
    else:
        assert search["winner"]["label"] in names
    assert record["timing"] == {"warmup": 1, "repeats": 2, "rounds": 6, "trials": 3,
                                "overridden": False}


def test_a_tight_budget_lists_the_plans_that_do_not_fit(ran):
    _folder, _argv, _out, entries = ran
    record = entries["tight"]
    budget = record["budget"]
    assert budget["spec"] == "quarter"
    assert budget["bytes"] == budget["replicated_total"] // 4
    plans = {p["label"]: p for p in record["plans"]}
    for name in ("replicated", "dp"):  # the parameters replicated: cannot fit
        assert plans[name]["status"] == "does not fit" and not plans[name]["fits"]
        assert plans[name]["median_seconds"] is None and plans[name]["times"] == []
        assert plans[name]["memory_per_device"]["arguments"] > budget["bytes"]
    assert plans["winner"]["fits"]
    assert plans["winner"]["memory_per_device"]["total"] <= budget["bytes"]
    assert record["speedups"]["vs_replicated"]["speedup"] is None
    assert record["speedups"]["vs_replicated"]["note"] == "replicated: does not fit"
    # The 1-device reference is not a plan under the budget: it is always timed.
    assert plans["single_device"]["status"] == "timed"


def test_files_written(ran):
    folder, _argv, out, entries = ran
    assert set(entries) == {"free", "tight"}
    machine = json.loads((out / "machine.json").read_text())
    assert machine["cores"] >= 1 and machine["memory_bytes"] > 0 and machine["cpu"]
    assert set(machine["versions"]) >= {"jax", "jaxlib", "optuna"}
    assert machine["devices"] == {"platform": "cpu", "device_kind": "cpu", "count": 8}
    assert machine["command"].startswith("shardsearch bench --suite ")
    table = (out / "results.md").read_text()
    assert "| free | mlp:tiny | dp=2,tp=4 | none |" in table
    assert "| tight | mlp:tiny | dp=2,tp=4 |" in table and "(quarter)" in table
    # The winner's changes against the best expert have their column, and its legend.
    assert "| × best expert | winner changes | × 1 device |" in table
    assert "- *winner changes*: the dimensions" in table
    row = next(line for line in table.splitlines() if line.startswith("| free |"))
    assert report.winner_changes(next(p for p in entries["free"]["plans"]
                                      if p["label"] == "winner")) in row
    for name in ("free", "tight"):
        rule = folder / "rules" / "tiny" / f"{name}.json"
        assert entries[name]["rule_file"] == str(rule)
        plan = ss.load_plan(rule)
        assert plan.workload == "mlp:tiny"
    drawn = (out / "speedups.png").is_file()
    assert drawn == (importlib.util.find_spec("matplotlib") is not None)
    assert "Winner against the best expert plan that fits: " in table


def test_the_report_names_the_command_of_every_entry():
    from shardsearch.bench.report import _commands

    def record(entry, command):
        return {"entry": {"id": entry}, "machine": {"command": command}}

    whole = "shardsearch bench --suite s"
    assert _commands([record("a", whole), record("b", whole)], {}) == f"Command: `{whole}`"
    assert _commands([], {"command": whole}) == f"Command: `{whole}`"
    some = [record(e, whole) for e in "abcd"] + [record("e", whole + " --entries e")]
    assert _commands(some, {}) == (
        f"Commands: `{whole}` (4 entries); `{whole} --entries e` (e).")


def test_versus_expert_counts_verdicts_and_names_every_slower_entry():
    from shardsearch.bench.report import versus_expert

    def record(entry, speedup, verdict, reference="fsdp", ci=(0.9, 1.1)):
        return {"entry": {"id": entry}, "speedups": {"vs_best_expert": {
            "reference": reference, "speedup": speedup, "verdict": verdict,
            "ratio_ci": list(ci) if ci else None, "note": None}}}

    records = [record("a", 1.3, "faster", ci=(1.2, 1.4)), record("b", 1.0, "tie"),
               record("c", 0.95, "slower", ci=(0.93, 0.97)), record("d", 1.0, "same plan"),
               record("e", None, None, reference=None)]
    assert versus_expert(records) == [
        "Winner against the best expert plan that fits: 1 faster, 1 tie, 1 same plan, "
        "1 slower, 1 no expert fits. Slower: c 0.95x [0.93–0.97] slower. "
        "Largest speedup: a 1.30x [1.20–1.40] faster."]
    assert versus_expert([]) == []
    # Static estimates have no test: they are told apart by the estimate alone.
    static = [record("s1", 1.0, None, ci=None), record("s2", 1.2, None, ci=None),
              record("s3", 0.5, None, ci=None), record("s4", 1.0, "same plan")]
    assert versus_expert(static) == [
        "Winner against the best expert plan that fits: 1 faster (est.), 1 equal (est.), "
        "1 same plan, 1 slower (est.). Slower: s3 0.50x. Largest speedup: s2 1.20x."]
    # No speedup to name when no winner is faster: ties are not speedups.
    assert versus_expert([static[0], static[3]]) == [
        "Winner against the best expert plan that fits: 1 equal (est.), 1 same plan."]
    assert versus_expert([record("t", 1.04, "tie")]) == [
        "Winner against the best expert plan that fits: 1 tie."]


def test_expert_plans_that_do_not_apply_are_listed_once_per_reason(ran):
    from shardsearch.bench.report import skipped_experts

    _folder, _argv, out, entries = ran
    # The tiny suite's mlp has no experts to split: ep is skipped, with its reason.
    assert "ep" in entries["free"]["experts_skipped"]
    assert "Expert plans that do not apply (not timed):" in (out / "results.md").read_text()
    records = [{"entry": {"id": e}, "experts_skipped": skipped} for e, skipped in [
        ("a", {"megatron": "n_heads=25 not divisible", "fsdp_tp": "n_heads=25 not divisible",
               "ep": "no experts"}),
        ("b", {"megatron": "n_heads=25 not divisible"}), ("c", {})]]
    assert skipped_experts(records) == [
        "Expert plans that do not apply (not timed):", "",
        "- ep on a: no experts",
        "- fsdp_tp, megatron on a, b: n_heads=25 not divisible", ""]
    assert skipped_experts(records[2:]) == []


def test_a_second_run_keeps_finished_entries(ran, capsys):
    _folder, argv, out, _entries = ran
    before = {p.name: p.read_bytes() for p in (out / "entries").glob("*.json")}
    assert _cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "free: done already" in printed and "tight: done already" in printed
    assert "0 entries run, 2 already done, 0 failed" in printed
    assert {p.name: p.read_bytes() for p in (out / "entries").glob("*.json")} == before


def test_a_forced_rerun_keeps_the_cost_of_the_search_it_resumes(ran):
    _folder, argv, out, entries = ran
    first = entries["free"]["search"]
    assert first["earlier_runs"] == []
    assert _cli.main([*argv, "--force", "--entries", "free"]) == 0
    again = json.loads((out / "entries" / "free.json").read_text())["search"]
    assert again["trials_before"] == 3 and again["trials"]["trials"] == 3  # no new trial
    assert again["earlier_runs"] == [{
        "finished_at": entries["free"]["finished_at"], "wall_seconds": first["wall_seconds"],
        "compiles": first["compiles"], "trials_before": 0, "new_trials": 3}]
    row = next(line for line in (out / "results.md").read_text().splitlines()
               if line.startswith("| free |"))
    assert (f"{first['wall_seconds']:.0f} s, {first['compiles']} compiles in the earlier run; "
            "resumed, no new trial") in row


def test_a_failing_entry_is_reported_and_left_for_the_next_run(tmp_path, capsys):
    path = _suite(tmp_path, [{"id": "small", **TINY, "budget": "1KB"}])
    code = _cli.main(["bench", "--suite", str(path), "--out", str(tmp_path / "out"),
                      "--rules", str(tmp_path / "rules"), "--quiet"])
    captured = capsys.readouterr()
    assert code == 1
    assert "small: FAILED: ValueError: optimize: memory_budget=1000" in captured.out
    assert "1 entries failed (small); the same command retries them" in _one_line_error(
        captured.err)
    assert not (tmp_path / "out" / "tiny" / "entries" / "small.json").exists()


def test_list_shows_the_entries(tmp_path, capsys):
    path = _suite(tmp_path, [{"id": "a", **TINY}, {"id": "b", **TINY, "budget": "quarter"}])
    assert _cli.main(["bench", "--suite", str(path), "--list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "a: mlp:tiny on dp=2,tp=4, measured, 3 trials, budget none",
        "b: mlp:tiny on dp=2,tp=4, measured, 3 trials, budget quarter"]


@pytest.mark.parametrize("name", suite_names())
def test_the_shipped_suites_load(name):
    suite = load_suite(name)
    assert suite.name == name and suite.entries
    for entry in suite.entries:
        get_workload(entry.workload_name)


def test_the_shipped_suites_are_package_data_named_in_the_help(capsys):
    names = suite_names()
    assert names == ["cpu-sim8", "cpu-sim8-activations", "cpu-sim8-knobs", "cpu-static256",
                     "cpu-static64", "cpu-static64-knobs", "gpu-1", "gpu-8", "published",
                     "published-chip", "tpu-v5e-8"]
    assert list(_cli_bench.BUILTIN_SUITES) == names
    # Shipped with the package (not only present in this checkout): pyproject's
    # package data covers every suite file.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    globs = pyproject["tool"]["setuptools"]["package-data"]["shardsearch.bench"]
    package = Path(ss.__file__).parent / "bench"
    shipped = {p.relative_to(package) for g in globs for p in package.glob(g)}
    assert shipped == {Path("suites") / f"{n}.json" for n in names}
    assert Path(str(builtin_suites())) == package / "suites"
    assert _cli.main(["bench", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in names)
    assert "relative to the current folder" in text


def test_a_shipped_suite_is_found_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _cli.main(["bench", "--suite", "cpu-sim8", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(load_suite("cpu-sim8").entries)
    assert lines[0] == "mlp-small-dp8: mlp:small on dp=8, measured, 40 trials, budget none"
    assert list(tmp_path.iterdir()) == []  # listing writes nothing
    assert _cli.main(["bench", "--suite", "nope", "--list"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "unknown suite 'nope': shardsearch ships no such suite (its suites: cpu-sim8, " \
        "cpu-sim8-activations, cpu-sim8-knobs, cpu-static256, cpu-static64, " \
        "cpu-static64-knobs, gpu-1, gpu-8, published, published-chip, tpu-v5e-8)" in line


def test_the_console_entry_lists_a_shipped_suite_outside_the_repository(tmp_path):
    env = child_env()
    done = subprocess.run([sys.executable, "-m", "shardsearch", "bench", "--suite",
                           "cpu-static64", "--list"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("llama-7b-dp8-tp8: llama:7b on dp=8,tp=8, "
                                                  "static")


def test_suites_dir_looks_names_up_in_a_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "mine").mkdir()
    _suite(tmp_path / "mine", [{"id": "a", **TINY}])
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert _cli.main(["bench", "--suite", "tiny", "--suites-dir", "../mine", "--list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "a: mlp:tiny on dp=2,tp=4, measured, 3 trials, budget none"]
    # The folder replaces the shipped suites for names; a path still works.
    assert _cli.main(["bench", "--suite", "cpu-sim8", "--suites-dir", "../mine"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "unknown suite 'cpu-sim8'" in line and "suites there: tiny" in line
    assert _cli.main(["bench", "--suite", "../mine/tiny.json", "--suites-dir", "../mine",
                      "--list"]) == 0
    assert capsys.readouterr().out.startswith("a: mlp:tiny")
    assert load_suite("tiny", tmp_path / "mine").path == tmp_path / "mine" / "tiny.json"


@pytest.mark.parametrize("where", ["nowhere", "tiny.json"])
def test_a_bad_suites_dir_is_one_line_exit_2(where, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _suite(tmp_path, [{"id": "a", **TINY}])  # tiny.json: a file, not a folder
    assert _cli.main(["bench", "--suite", "cpu-sim8", "--suites-dir", where, "--list"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"--suites-dir {where} (in {tmp_path}): no such folder" in line
    with pytest.raises(ValueError, match=rf"suites folder {re.escape(where)} \(in .*\) does "
                       "not exist or is not a folder; give a folder"):
        load_suite("cpu-sim8", where)


def test_cpu_sim8_covers_every_workload_mesh_and_budget():
    suite = load_suite("cpu-sim8")
    keys = {(e.workload_name, e.mesh, e.budget) for e in suite.entries}
    for model in ("mlp", "gpt", "llama", "moe"):
        for mesh in ("dp=8", "dp=2,tp=4"):
            for budget in (None, "quarter"):
                assert (f"{model}:small", mesh, budget) in keys
    assert ("gpt:small", "dp=4,tp=2", None) in keys
    assert all(e.objective == "measured" for e in suite.entries)


def _entry(**fields):
    return {"id": "e1", **TINY, **fields}


@pytest.mark.parametrize(("suite", "message"), [
    ({"entries": [{"id": "e1", "workload": "mlp", "size": "tiny"}]},
     "entry 0 ('e1'): missing 'mesh'"),
    ({"entries": [_entry(mesh="dp=2,tp")]}, "entry 0 ('e1'): mesh 'dp=2,tp': part 'tp'"),
    ({"entries": [_entry(objective="fast")]}, "entry 0 ('e1'): objective 'fast'"),
    ({"entries": [_entry(budget="lots")]}, "entry 0 ('e1'): size 'lots' is not a byte count"),
    ({"entries": [_entry(trials=None)]}, "entry 0 ('e1'): give trials or timeout"),
    ({"entries": [_entry(), _entry()]}, "entry 1 ('e1'): the id is used twice"),
    ({"entries": [_entry(mesh="dp=4,tp=4")]}, "mesh dp=4,tp=4 needs 16 devices but the "
                                              "suite has 8"),
    ({"entries": [_entry(tirals=3)]}, "entry 0 ('e1'): unknown field 'tirals'"),
    ({"entries": []}, "'entries' must be a non-empty list"),
    ({"entries": [_entry()], "platform": "ipu"}, "platform 'ipu'"),
])
def test_malformed_suite_files_name_the_file_and_entry(suite, message, tmp_path, capsys):
    path = _suite(tmp_path, **suite)
    assert _cli.main(["bench", "--suite", str(path), "--out", str(tmp_path)]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert f"suite file {path}" in line and message in line


def test_unknown_suites_and_unreadable_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benchmarks" / "suites").mkdir(parents=True)
    (tmp_path / "benchmarks" / "suites" / "mine.json").write_text("{")
    mine = ["--suites-dir", "benchmarks/suites"]
    assert _cli.main(["bench", "--suite", "nope", *mine]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "unknown suite 'nope'" in line and "suites there: mine" in line
    assert _cli.main(["bench", "--suite", "mine", *mine]) == 2
    assert "mine.json is not valid JSON" in _one_line_error(capsys.readouterr().err)
    assert _cli.main(["bench", "--suite", "missing.json"]) == 2
    assert "suite file missing.json does not exist" in _one_line_error(capsys.readouterr().err)
    path = _suite(tmp_path, [_entry()])
    assert _cli.main(["bench", "--suite", str(path), "--entries", "e1,e9"]) == 2
    assert "suite 'tiny' has no entry 'e9'; its entries are e1" in _one_line_error(
        capsys.readouterr().err)


@pytest.mark.parametrize(("fields", "message"), [
    ({"platform": "gpu", "simulated": False}, "is for 8 gpu devices, but JAX has 8 cpu devices"),
    ({"devices": 16, "simulated": False}, "is for 16 cpu devices, but JAX has 8 cpu devices; "
                                          "simulate them with --devices 16"),
    ({"devices": 16}, "asked for 16 simulated CPU devices but JAX already runs with 8"),
])
def test_a_suite_for_other_devices_is_refused(fields, message, tmp_path, capsys):
    jax.devices()  # the backend is up, as in any process that has run JAX
    path = _suite(tmp_path, [_entry()], **fields)
    assert _cli.main(["bench", "--suite", str(path), "--out", str(tmp_path)]) == 2
    assert message in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "tiny").exists()  # refused before anything was written


def test_search_cost_of_a_rerun_over_a_finished_study_says_so():
    from shardsearch.bench.report import _search

    trials = {"trials": 40, "completed": 30, "cut_check": 1, "cut_compile": 2,
              "cut_measure": 7, "failed": 0, "cache_hits": 10}
    first = {"trials": trials, "cut_share": 0.25, "wall_seconds": 600.0, "compiles": 30,
             "trials_before": 0, "trial_seconds": 580.0}
    assert _search(first).startswith("600 s, 30 compiles; 40 trials: 30 / 1, 2, 7 / 0 / 10")
    rerun = {**first, "wall_seconds": 50.0, "compiles": 4, "trials_before": 40}
    assert _search(rerun).startswith(
        "580 s in trials; resumed, no new trial (this run 50 s, 4 compiles); 40 trials")
    # The runs that searched, when the entry kept them, give the cost instead.
    earlier = [{"wall_seconds": 400.0, "compiles": 20, "new_trials": 25},
               {"wall_seconds": 250.0, "compiles": 12, "new_trials": 15},
               {"wall_seconds": 45.0, "compiles": 5, "new_trials": 0}]
    assert _search({**rerun, "earlier_runs": earlier[2:]}).startswith("580 s in trials; ")
    assert _search({**rerun, "earlier_runs": earlier[1:]}).startswith(
        "250 s, 12 compiles in the earlier run; resumed, no new trial (this run 50 s")
    assert _search({**rerun, "earlier_runs": earlier}).startswith(
        "650 s, 32 compiles in 2 earlier runs; resumed, no new trial (this run 50 s")
    # Trials of a killed run have no recorded wall time: the count says so.
    earlier[1]["trials_before"] = 25
    assert _search({**rerun, "earlier_runs": earlier[1:]}).startswith(
        "250 s, 12 compiles in the earlier run (+ 25 earlier trials); resumed")
    assert _search({**first, "trials_before": 25}).startswith(
        "600 s, 30 compiles (+ 25 earlier trials); 40 trials")


def test_recheck_retimes_the_exported_winner_against_a_reference(ran, tmp_path, capsys):
    folder, _argv, out, _entries = ran
    recheck = _load_recheck()
    args = ["--suite", str(folder / "tiny.json"), "--results", str(out.parent),
            "--entries", "free", "--times", "2", "--rounds", "6", "--out", str(tmp_path)]
    plans = json.loads((out / "entries" / "free.json").read_text())["plans"]
    winner = plans[0]["fingerprint"]
    other = next(p["label"] for p in plans[1:] if p["fingerprint"] != winner)
    twin = next((p["label"] for p in plans[1:] if p["fingerprint"] == winner), None)
    assert recheck.main([*args, "--against", other]) == 0
    data = json.loads((tmp_path / "recheck.json").read_text())
    [entry] = data["entries"]
    assert entry["entry"] == "free" and entry["reference"] == other
    assert len(entry["repetitions"]) == 2
    for rep in entry["repetitions"]:
        assert len(rep["winner_times"]) == len(rep["reference_times"]) == 6
        ratios = [r / w for r, w in zip(rep["reference_times"], rep["winner_times"], strict=True)]
        assert rep["speedup"] == pytest.approx(statistics.median(ratios))
        assert rep["ratio_ci"][0] <= rep["speedup"] <= rep["ratio_ci"][1]
        assert rep["verdict"] in ("faster", "slower", "tie")
    assert "| free |" in (tmp_path / "recheck.md").read_text()
    # A plan the entry does not have is a usage error naming the entry and its plans.
    with pytest.raises(SystemExit) as exit_:
        recheck.main([*args, "--against", "nosuch"])
    assert exit_.value.code == 2
    assert "entry free has no plan 'nosuch'; its plans are winner, replicated" in (
        capsys.readouterr().err)
    if twin is not None:  # the winner against itself is refused, not timed
        with pytest.raises(SystemExit):
            recheck.main([*args, "--against", twin])
        assert "winner is the plan" in capsys.readouterr().err


def test_recheck_against_a_plan_the_suite_did_not_run(ran, tmp_path, capsys):
    """dp_do (ZeRO-1) is built by name for the entry's mesh: re-timed unless
    it is the winner's very plan, with no recorded figure, and by default
    written apart from the rechecks the suite's report shows."""
    from shardsearch.search import Candidate, fingerprint
    from shardsearch.workloads import expert_plan, get_workload

    folder, _argv, out, _entries = ran
    copy = tmp_path / "tiny"
    shutil.copytree(out, copy)
    recheck = _load_recheck()
    assert recheck.main(["--suite", str(folder / "tiny.json"), "--results", str(tmp_path),
                         "--entries", "free", "--times", "1", "--rounds", "6",
                         "--against", "dp_do"]) == 0
    assert not (copy / "recheck.json").exists()  # the suite's own rechecks untouched
    [entry] = json.loads((copy / "versus-dp_do" / "recheck.json").read_text())["entries"]
    assert entry["reference"] == "dp_do" and entry["recorded"] is None
    workload = get_workload("mlp:tiny")
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    plan = expert_plan(workload, mesh, "dp_do")
    zero1 = fingerprint(Candidate(plan.state_rule, plan.batch_rule, "dp_do").specs(
        workload.abstract()))
    winner = json.loads((copy / "entries" / "free.json").read_text())["plans"][0]
    if zero1 == winner["fingerprint"]:
        assert entry["same_plan"] and entry["repetitions"] == []
        assert "same plan: nothing to time" in (copy / "versus-dp_do" / "recheck.md").read_text()
    else:
        [rep] = entry["repetitions"]
        assert len(rep["winner_times"]) == len(rep["reference_times"]) == 6
        assert "| free |" in (copy / "versus-dp_do" / "recheck.md").read_text()
        assert "not run by the suite" in (copy / "versus-dp_do" / "recheck.md").read_text()
    # Under the quarter budget dp_do (every weight whole) does not fit: said
    # with the reason, and not timed.
    assert recheck.main(["--suite", str(folder / "tiny.json"), "--results", str(tmp_path),
                         "--entries", "tight", "--times", "1", "--rounds", "6",
                         "--against", "dp_do"]) == 0
    data = json.loads((copy / "versus-dp_do" / "recheck.json").read_text())
    assert [e["entry"] for e in data["entries"]] == ["free", "tight"]  # merged
    tight = data["entries"][1]
    assert tight["reference_status"] == "does not fit" and tight["repetitions"] == []
    assert "budget" in tight["reference_reason"]
    assert "dp_do does not fit: " in (copy / "versus-dp_do" / "recheck.md").read_text()
    # A plan file that is not the recorded winner's (another run wrote it) is
    # refused before anything is timed, whatever the reference.
    record = json.loads((copy / "entries" / "free.json").read_text())
    record["plans"][0]["fingerprint"] = "0" * 16
    (copy / "entries" / "free.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit) as exit_:
        recheck.main(["--suite", str(folder / "tiny.json"), "--results", str(tmp_path),
                      "--entries", "free", "--against", "replicated", "--out",
                      str(tmp_path / "refused")])
    assert exit_.value.code == 2
    assert "the entry's winner has 0000000000000000: the file is another run's plan" in (
        capsys.readouterr().err)
    assert not (tmp_path / "refused").exists()


def test_a_plan_the_recheck_builds_by_name_is_pinned_as_the_suite_pins_its_experts(tmp_path):
    """dp_do on gpt (which names its activations) runs with its activations'
    batch on its batch split, as the suite's expert plans do, not left to
    XLA's propagation beside a winner that is pinned."""
    from shardsearch.search import fingerprint, plan_config
    from shardsearch.workloads import expert_plan

    path = _suite(tmp_path, [{"id": "g", "workload": "gpt", "size": "tiny",
                              "mesh": "dp=2,tp=4", "trials": 3}])
    suite = load_suite(str(path))
    workload, mesh = get_workload("gpt:tiny"), ss.create_mesh((2, 4), ("dp", "tp"))
    # The winner's plan file: FSDP as an expert writes it (its knobs unset).
    fsdp = expert_plan(workload, mesh, "fsdp")
    rule_file = ss.write_config(plan_config(fsdp.state_rule, fsdp.batch_rule, mesh),
                                tmp_path / "g.json")
    specs, setting, _ = bench.plan_file_specs(workload, rule_file, mesh, workload.abstract())
    record = {"entry": {"id": "g"}, "budget": {"bytes": None}, "rule_file": str(rule_file),
              "plans": [{"label": "winner", "fingerprint": fingerprint(specs, setting)}]}
    prepared = _load_recheck().prepare(suite, record, "dp_do")
    row = prepared["plans"]["dp_do"]
    # dp_do splits the batch over every axis of the mesh.
    assert row["knobs"] == {"act_batch": "dp,tp"} and row["fits"]
    pinned = (("act_batch", "dp,tp"),)
    assert row["fingerprint"] == fingerprint(prepared["specs"]["dp_do"], pinned)
    assert prepared["contexts"]["dp_do"].setting == pinned


def test_winner_changes_are_recorded_afterwards_as_the_run_records_them(ran, tmp_path):
    folder, _argv, out, _entries = ran
    copy = tmp_path / "tiny"
    shutil.copytree(out, copy)
    # As the folder holds them now: a test before this one may have re-run the
    # suite in it (`--force`), which may have timed another best expert.
    entries = {}
    for path in (copy / "entries").glob("*.json"):
        entries[path.stem] = json.loads(path.read_text())
        record = json.loads(path.read_text())
        del record["plans"][0]["differs"]
        path.write_text(json.dumps(record))
    suite = load_suite(str(folder / "tiny.json"))
    changed, skipped = bench.record_differences(suite, copy)
    assert sorted(changed) == ["free.json", "tight.json"] and skipped == {}
    for name, record in entries.items():
        again = json.loads((copy / "entries" / f"{name}.json").read_text())
        assert again["plans"][0]["differs"] == record["plans"][0]["differs"]
    assert bench.record_differences(suite, copy) == ([], {})  # nothing left to add
    # A plan file that is not the entry's winner (another run overwrote it) is
    # left out, with the reason; one that is gone is named, with the fix.
    record = json.loads((copy / "entries" / "free.json").read_text())
    del record["plans"][0]["differs"]
    tight = json.loads((copy / "entries" / "tight.json").read_text())
    (copy / "entries" / "free.json").write_text(json.dumps({**record,
                                                            "rule_file": tight["rule_file"]}))
    changed, skipped = bench.record_differences(suite, copy)
    if tight["plans"][0]["fingerprint"] == record["plans"][0]["fingerprint"]:
        assert changed == ["free.json"]  # the same plan: it is the winner's
    else:
        assert changed == [] and "not its plan" in skipped["free.json"]
    (copy / "entries" / "free.json").write_text(json.dumps({**record, "rule_file": "gone.json"}))
    with pytest.raises(ValueError, match=r"free.json: its winner's plan file gone.json is "
                                         r"missing; pass the folder"):
        bench.record_differences(suite, copy)


def _load_recheck():
    return load_script("benchmarks/recheck/run.py", "recheck")


def test_the_report_shows_each_recheck_beside_its_headline(ran, tmp_path):
    folder, _argv, out, _entries = ran
    copy = tmp_path / "tiny"
    shutil.copytree(out, copy)
    recheck = _load_recheck()
    suite = load_suite(str(folder / "tiny.json"))

    def reference(entry):
        plans = json.loads((copy / "entries" / f"{entry}.json").read_text())["plans"]
        return next(p["label"] for p in plans[1:]
                    if p["fits"] and p["fingerprint"] != plans[0]["fingerprint"])

    base = ["--suite", str(folder / "tiny.json"), "--results", str(tmp_path), "--times", "1",
            "--rounds", "6"]
    assert recheck.main([*base, "--entries", "free", "--against", reference("free")]) == 0
    # A recheck of another entry keeps the first one's, with the command that made it.
    assert recheck.main([*base, "--entries", "tight", "--against", reference("tight")]) == 0
    data = json.loads((copy / "recheck.json").read_text())
    assert [e["entry"] for e in data["entries"]] == ["free", "tight"]
    assert all("--entries " + e["entry"] in e["command"] for e in data["entries"])
    assert "Commands: " in (copy / "recheck.md").read_text()
    records = report.load_entries(suite, copy)
    rechecks = report.load_rechecks(copy, records)
    assert set(rechecks) == {"free", "tight"} and None not in rechecks.values()
    # The recheck rewrote the suite's report (its own results folder).
    table = (copy / "results.md").read_text()
    assert "| rechecked in a fresh process |" in table
    for e in data["entries"]:
        row = next(line for line in table.splitlines() if line.startswith(f"| {e['entry']} |"))
        assert format_speedup(e["repetitions"][0]) in row
    assert "Rechecked in a fresh process: 2 entries, 2 runs: " in table
    # A damaged recheck file is said, not silently left out of the report.
    good = (copy / "recheck.json").read_text()
    (copy / "recheck.json").write_text(good[:40])
    with pytest.warns(ShardsearchWarning, match="cannot be read as a recheck"):
        assert report.load_rechecks(copy, records) == {}
    (copy / "recheck.json").write_text(good)
    # A rerun of the entry makes the recheck stale: it timed another winner.
    path = copy / "entries" / "free.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "finished_at": "2030-01-01T00:00:00+00:00"}))
    report.write_report(suite, copy)
    table = (copy / "results.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| free |"))
    assert "stale (an earlier run's winner)" in row
    assert "fresh process: 1 entry, 1 run: " in table
    assert "(1 more rechecked an earlier run)" in table


# --------------------------------------------------------------------------- scripts' API

# What a benchmark script may import from shardsearch: these modules' `__all__`.
PUBLIC_MODULES = ("shardsearch", "shardsearch.search", "shardsearch.bench", "shardsearch.workloads")


def _dotted(node):
    """`a.b.c` as "a.b.c" (None for anything but names and attributes)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _not_public(name):
    """Why `name` (dotted, from shardsearch) is not public API, or None."""
    front = max((m for m in PUBLIC_MODULES if name == m or name.startswith(m + ".")),
                key=len, default=None)
    if front is None:
        return "not a shardsearch module"
    rest = name[len(front) + 1:].split(".")[0] if name != front else ""
    if rest and rest not in importlib.import_module(front).__all__:
        return f"{rest!r} is not in {front}.__all__"
    return None


def _private_uses(source, where):
    """Every import or attribute in `source` that reaches past shardsearch's public API."""
    tree = ast.parse(source)
    bound = {}  # local name -> the shardsearch module it stands for
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "shardsearch":
                    continue
                if alias.name not in PUBLIC_MODULES:
                    problems.append(f"{where}:{node.lineno}: import {alias.name}: a private "
                                    "module")
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound["shardsearch"] = "shardsearch"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == \
                "shardsearch":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                why = ("a private module" if node.module not in PUBLIC_MODULES
                       else None if full in PUBLIC_MODULES else _not_public(full))
                if why:
                    problems.append(f"{where}:{node.lineno}: from {node.module} import "
                                    f"{alias.name}: {why}")
                if full in PUBLIC_MODULES:
                    bound[alias.asname or alias.name] = full
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        name = _dotted(node)
        head = name.split(".")[0] if name else None
        if head in bound:
            full = bound[head] + name[len(head):]
            why = _not_public(full)
            if why:
                problems.append(f"{where}:{node.lineno}: {name}: {why}")
    return problems


SCRIPTS = sorted((REPO / "benchmarks").rglob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(REPO)) for p in SCRIPTS])
def test_benchmark_scripts_use_only_public_api(path):
    problems = _private_uses(path.read_text(encoding="utf-8"), path.relative_to(REPO))
    assert not problems, ("benchmark scripts must import only names in the __all__ of "
                          f"{', '.join(PUBLIC_MODULES)}:\n  " + "\n  ".join(problems))


def test_the_scripts_checker_finds_private_uses():
    assert len(SCRIPTS) >= 2  # the walk is not vacuous
    private = [
        "from shardsearch.search import confirm as _confirm",
        "from shardsearch.search.loop import make_context",
        "from shardsearch.bench import report",
        "from shardsearch.bench import _private",
        "from shardsearch import base",
        "import shardsearch.bench.report",
        "import shardsearch as ss\nss.search.loop.make_context",
        "from shardsearch import bench\nbench.report.format_speedup",
        "import shardsearch.bench as sb\nsb._report",
        "from shardsearch.bench import retime",
        "import shardsearch as ss\nss.make_context",
    ]
    for source in private:
        assert len(_private_uses(source, "x.py")) == 1, source
    public = [
        "from shardsearch import bench, load_plan\nbench.speedup(a, b)",
        "from shardsearch.search import retime, make_context",
        "from shardsearch import search\nsearch.retime",
        "import shardsearch as ss\nss.optimize\nss.bench.format_speedup",
        "import shardsearch.bench\nshardsearch.bench.load_suite",
        "from shardsearch.workloads import get_workload",
        "import jax\njax.devices()",
    ]
    for source in public:
        assert _private_uses(source, "x.py") == [], source


def test_a_target_suite_compiles_every_entry_for_its_chip(tmp_path):
    if importlib.util.find_spec("libtpu") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("libtpu is missing: .ci/run installs the tpu extra")
        pytest.skip("the tpu extra is not installed: pip install -e '.[tpu]'")
    entry = {"id": "chip", "workload": "mlp", "size": "tiny", "mesh": "dp=2,tp=2", "trials": 3,
             "objective": "static", "hardware": "tpu-v5e"}
    path = _suite(tmp_path, [entry], target=True)
    argv = ["bench", "--suite", str(path), "--out", str(tmp_path / "out"), "--rules",
            str(tmp_path / "rules"), "--quiet"]
    assert _cli.main(argv) == 0
    record = json.loads((tmp_path / "out" / "tiny" / "entries" / "chip.json").read_text())
    assert record["target"]["chip"] == "tpu-v5e" and record["target"]["topology"] == "2x2"
    plan = json.loads((tmp_path / "rules" / "tiny" / "chip.json").read_text())
    assert plan["hardware"]["target"]["platform"] == "tpu"
    measured = {**entry, "objective": "measured"}
    with pytest.raises(ValueError, match="a target suite compiles for the entry's chip"):
        load_suite(str(_suite(tmp_path, [measured], target=True)))


def test_an_entry_may_search_the_workloads_knobs(tmp_path):
    entry = {**TINY, "id": "knobbed", "trials": 10, "objective": "static", "space": "rules",
             "knobs": ["microbatches"]}
    path = _suite(tmp_path, [entry])
    assert load_suite(str(path)).entries[0].to_json()["knobs"] == ["microbatches"]
    argv = ["bench", "--suite", str(path), "--out", str(tmp_path / "out"), "--rules",
            str(tmp_path / "rules"), "--quiet"]
    assert _cli.main(argv) == 0
    record = json.loads((tmp_path / "out" / "tiny" / "entries" / "knobbed.json").read_text())
    plan = json.loads((tmp_path / "rules" / "tiny" / "knobbed.json").read_text())
    winner = next(p for p in record["plans"] if p["role"] == "winner")
    assert winner["knobs"] == plan["knobs"] and plan["knobs"]["microbatches"] in (1, 2, 4, 8)
    # A winner accumulating over microbatches says so against the expert's one batch.
    changed = [line for line in winner["differs"]["dimensions"] if line.startswith("micro")]
    assert changed == ([] if plan["knobs"]["microbatches"] == 1 else
                       [f"microbatches: {plan['knobs']['microbatches']} (other: 1)"])
    # An entry without knobs keeps the form entries had before them.
    assert "knobs" not in load_suite(str(_suite(tmp_path, [{**TINY, "id": "a"}]))) \
        .entries[0].to_json()
    with pytest.raises(ValueError, match=r"knobs 'remat': give true"):
        load_suite(str(_suite(tmp_path, [{**TINY, "id": "b", "knobs": "remat"}])))
