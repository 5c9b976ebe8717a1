"""`shardsearch bench` and its suite files: one tiny suite end to end, resuming, and
every error path."""

import importlib.util
import json
from pathlib import Path

import jax
import pytest

import shardsearch as ss
from shardsearch.bench.suite import load_suite
from shardsearch.cli import main as _cli
from shardsearch.workloads import get_workload

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "benchmarks" / "suites"
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
    assert list(plans) == ["winner", "replicated", "default", "dp", "fsdp", "megatron",
                           "fsdp_tp", "single_device"]
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
    for speedup in s.values():
        assert speedup["speedup"] > 0
        assert speedup["verdict"] in ("faster", "slower", "tie", "same plan")
    assert s["vs_single_device"]["time_ratio"] == pytest.approx(
        plans["winner"]["median_seconds"] / plans["single_device"]["median_seconds"])
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


@pytest.mark.parametrize("name", sorted(p.stem for p in SUITES.glob("*.json")))
def test_the_shipped_suites_load(name):
    suite = load_suite(name, suites_dir=SUITES)
    assert suite.name == name and suite.entries
    for entry in suite.entries:
        get_workload(entry.workload_name)


def test_cpu_sim8_covers_every_workload_mesh_and_budget():
    suite = load_suite("cpu-sim8", suites_dir=SUITES)
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
    assert _cli.main(["bench", "--suite", "nope"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "unknown suite 'nope'" in line and "suites there: mine" in line
    assert _cli.main(["bench", "--suite", "mine"]) == 2
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
    spec = importlib.util.spec_from_file_location("recheck", REPO / "benchmarks/recheck/run.py")
    recheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recheck)
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
        assert rep["speedup"] == pytest.approx(rep["reference_seconds"] / rep["winner_seconds"])
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
