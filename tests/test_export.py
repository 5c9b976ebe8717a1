"""The plan file: writing, loading back, partition rules, errors, determinism."""

import json
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from child_env import child_env
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.search import plan_config
from shardsearch.workloads import get_workload

sds = lambda *s, dtype=np.float32: jax.ShapeDtypeStruct(s, dtype)  # noqa: E731

TREE = {
    "embed": sds(64, 32),
    "layers": [{"attn": {"wq": sds(32, 32), "wo": sds(32, 32)}, "norm": sds(32)}
               for _ in range(2)],
    "head": sds(32, 64),
    "step": sds(dtype=np.int32),
}
BATCH = {"tokens": sds(16, 8, dtype=np.int32)}


def _rules(mesh):
    """One rule of every kind, with non-default parameters."""
    return {
        "auto": ss.AutoShardingRule(mesh, axis_names=("tp", "dp"), min_shard_size=64,
                                    reverse=True),
        "auto_groups": ss.AutoShardingRule(mesh, axis_names=(("dp", "tp"),)),
        "memory": ss.MemoryConstrainedShardingRule(2048, mesh=mesh, axis_names=("tp", "dp")),
        "shape": ss.ShapeBasedShardingRule({(None, 32): P("tp"), (64, None): P(("dp", "tp"))}),
        "path": ss.PathShardingRule([(r"attn/w[qo]$", P(None, "tp")), (r"embed", P("dp"))],
                                    fallback="replicate", mesh=mesh),
        "batch": ss.BatchShardingRule(("dp", "tp")),
        "composite": ss.CompositeShardingRule(
            ss.PathShardingRule([(r"head", P(None, ("dp", "tp")))], mesh=mesh),
            ss.MemoryConstrainedShardingRule(4096, mesh=mesh),
            ss.ShapeBasedShardingRule({(32,): P("tp")}),
            ss.AutoShardingRule(mesh, axis_names=("dp",))),
    }


@pytest.mark.parametrize("kind", list(_rules(ss.abstract_mesh((2, 4), ("dp", "tp")))))
def test_every_rule_kind_round_trips_through_a_file(kind, tmp_path, mesh24):
    rule = _rules(mesh24)[kind]
    batch_rule = ss.BatchShardingRule(("dp",))
    path = ss.write_config(plan_config(rule, batch_rule, mesh24), tmp_path / "plan.json")
    loaded = ss.load_rule(path, mesh24)
    assert type(loaded) is type(rule)
    assert loaded.to_config() == rule.to_config()
    assert loaded.apply(TREE) == rule.apply(TREE)
    # Without a mesh the rule is bound to the recorded axes: same specs, no devices.
    assert ss.load_rule(path).apply(TREE) == rule.apply(TREE)
    plan = ss.load_plan(path)
    assert plan.batch_rule.apply(BATCH) == {"tokens": P("dp")}
    assert plan.batch_spec == P("dp")


def test_recorded_specs_and_fingerprint(tmp_path, mesh24):
    rule = _rules(mesh24)["composite"]
    config = plan_config(rule, ss.BatchShardingRule(("dp",)), mesh24, args=(TREE, BATCH))
    path = ss.write_config(config, tmp_path / "plan.json")
    data = json.loads(path.read_text())
    leaves = {leaf["path"]: leaf for leaf in data["workload"]["arguments"][0]}
    assert leaves["head"] == {"path": "head", "shape": [32, 64], "dtype": "float32",
                              "spec": [None, ["dp", "tp"]]}
    assert leaves["step"]["shape"] == [] and leaves["step"]["dtype"] == "int32"
    plan = ss.load_plan(path)
    assert plan.mismatch((TREE, BATCH)) is None
    assert plan.recorded_specs[1] == {"tokens": P("dp")}
    assert plan.apply((TREE, BATCH)) == (rule.apply(TREE), {"tokens": P("dp")})


def test_other_shapes_reapply_the_rule_and_warn(tmp_path, mesh24):
    rule = ss.AutoShardingRule(mesh24)
    config = plan_config(rule, ss.BatchShardingRule(("dp",)), mesh24, args=(TREE, BATCH))
    plan = ss.load_plan(ss.write_config(config, tmp_path / "plan.json"))
    bigger = {**TREE, "embed": sds(128, 32)}
    with pytest.warns(ss.PlanMismatchWarning, match=r"plan\.json: .*'embed' is float32\[128, "
                      r"32\], the plan recorded float32\[64, 32\]"):
        specs = plan.apply((bigger, BATCH))
    assert specs[0] == rule.apply(bigger)
    # Same names, other sizes: the recorded specs may not divide, so the rule runs again.
    plan8 = ss.load_plan(tmp_path / "plan.json", ss.abstract_mesh((1, 8), ("dp", "tp")))
    with pytest.warns(ss.PlanMismatchWarning, match="mesh has sizes"):
        plan8.apply((TREE, BATCH))


def test_shardings_need_a_concrete_mesh_with_the_same_axes(tmp_path, mesh24):
    config = plan_config(ss.AutoShardingRule(), ss.BatchShardingRule(("dp",)), mesh24,
                            args=(TREE, BATCH))
    path = ss.write_config(config, tmp_path / "plan.json")
    shardings = ss.load_plan(path, mesh24).shardings((TREE, BATCH))
    assert shardings[1]["tokens"].spec == P("dp")
    with pytest.raises(ValueError, match=r"plan\.json: shardings need a concrete Mesh"):
        ss.load_plan(path).shardings((TREE, BATCH))


def test_partition_rules_reproduce_the_specs(tmp_path, mesh24):
    workload = get_workload("gpt:tiny")
    rule = _rules(mesh24)["composite"]
    config = plan_config(rule, ss.BatchShardingRule(("dp",)), mesh24, workload=workload)
    path = ss.write_config(config, tmp_path / "rules.py", format="partition-rules")
    text = path.read_text()
    assert "from jax.sharding import PartitionSpec as P\n" in text
    assert '(r"^params/head$", P(None, ("dp", "tp"))),' in text
    namespace = {}
    exec(compile(text, str(path), "exec"), namespace)  # the test may; the library never does
    state, batch = workload.abstract()
    pairs = namespace["PARTITION_RULES"]
    assert ss.PathShardingRule(pairs, fallback="error", mesh=mesh24).apply(state) == \
        rule.apply(state)
    assert ss.PathShardingRule(namespace["BATCH_PARTITION_RULES"], mesh=mesh24).apply(batch) \
        == ss.BatchShardingRule(("dp",)).apply(batch)


def test_partition_rules_need_resolved_specs(tmp_path, mesh24):
    config = plan_config(ss.AutoShardingRule(), ss.BatchShardingRule(), mesh24)
    with pytest.raises(ValueError, match="partition rules need the winner's resolved specs"):
        ss.write_config(config, tmp_path / "rules.py", format="partition-rules")


# --------------------------------------------------------------------------- load errors


@pytest.fixture
def plan_file(tmp_path, mesh24):
    config = plan_config(_rules(mesh24)["composite"], ss.BatchShardingRule(("dp",)),
                            mesh24, args=(TREE, BATCH))
    return ss.write_config(config, tmp_path / "plan.json")


def _rewrite(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def test_malformed_json(plan_file):
    plan_file.write_text("{'schema': 1}")
    with pytest.raises(ValueError, match=re.escape(str(plan_file)) + ": the file is not valid"):
        ss.load_plan(plan_file)


def test_truncated_file(plan_file):
    text = plan_file.read_text()
    plan_file.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=re.escape(str(plan_file)) + r": .*truncated"):
        ss.load_rule(plan_file)
    plan_file.write_text("")
    with pytest.raises(ValueError, match=re.escape(str(plan_file)) + r": .*truncated"):
        ss.load_rule(plan_file)


def test_newer_schema(plan_file):
    _rewrite(plan_file, lambda d: d.update(schema=2))
    with pytest.raises(ValueError, match=re.escape(str(plan_file)) + r": schema 2 is newer .* "
                       "upgrade shardsearch"):
        ss.load_plan(plan_file)


@pytest.mark.parametrize("field", ["schema", "mesh", "state_rule", "batch_rule"])
def test_missing_field(plan_file, field):
    _rewrite(plan_file, lambda d: d.pop(field))
    with pytest.raises(ValueError, match=re.escape(str(plan_file)) + f": missing field '{field}'"):
        ss.load_plan(plan_file)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["mesh"].update(axis_sizes=[2]), r"'mesh.axis_sizes' must list one positive"),
    (lambda d: d["mesh"].update(axis_names=["dp", "dp"]), r"'mesh.axis_names' must be"),
    (lambda d: d["state_rule"].update(kind="magic"), r"state_rule: unknown rule kind 'magic'"),
    (lambda d: d["workload"]["arguments"][0][0].update(shape=[1, 2]), r"hash is .* edited"),
    (lambda d: d["workload"]["arguments"][0][0].update(spec=["zz"]), r"uses axis 'zz'"),
    (lambda d: d["workload"]["arguments"][0].append(3), r"arguments\[0\]\[\d+\] must be an obj"),
    (lambda d: d.update(results=[1]), r"'results' must be an object"),
])
def test_malformed_field(plan_file, edit, message):
    _rewrite(plan_file, edit)
    with pytest.raises(ValueError, match=re.escape(str(plan_file)) + ".*" + message):
        ss.load_plan(plan_file)


def test_mesh_with_other_axis_names(plan_file):
    other = ss.abstract_mesh((2, 4), ("data", "model"))
    with pytest.raises(ValueError, match=re.escape(str(plan_file)) + r": the plan was found on "
                       r"a mesh with axes \('dp', 'tp'\) but the mesh given has axes "
                       r"\('data', 'model'\)"):
        ss.load_rule(plan_file, other)


def test_loading_never_imports_or_evaluates(plan_file):
    # A kind naming a module is just an unknown kind: nothing is imported.
    _rewrite(plan_file, lambda d: d.update(state_rule={"kind": "os:system", "x": "__import__"}))
    with pytest.raises(ValueError, match="unknown rule kind 'os:system'"):
        ss.load_plan(plan_file)


# --------------------------------------------------------------------------- from a study


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('study')}/s.db"


@pytest.fixture(scope="module")
def static_result(storage):
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    return ss.optimize(get_workload("mlp:tiny"), mesh=mesh, n_trials=5, objective="static",
                    storage=storage, study_name="static", quiet=True, isolate=False)


def test_export_from_result_equals_export_from_stored_study(static_result, storage):
    import optuna

    study = optuna.load_study(study_name="static", storage=storage)
    from_result = ss.export_config(static_result)
    assert ss.export_config(study) == from_result
    assert from_result["search"] == {"study": "static", "workload": "mlp:tiny",
                                     "objective": "static", "seed": 0,
                                     "sampler": "TPESampler()",
                                     "budget": None}
    results = from_result["results"]
    assert results["winner"]["label"] == static_result.best_label
    assert results["winner"]["median_seconds"] == static_result.best_time
    assert results["trials"] == static_result.summary()
    assert {row["label"] for row in results["baselines"]} == set(static_result.baselines)
    assert from_result["hardware"]["device_count"] == 8
    assert set(from_result["versions"]) >= {"shardsearch", "jax", "jaxlib", "optuna"}


def test_exported_specs_are_the_winners(static_result, tmp_path):
    path = ss.write_config(ss.export_config(static_result), tmp_path / "plan.json")
    state, batch = get_workload("mlp:tiny").abstract()
    assert ss.load_plan(path).apply((state, batch)) == static_result.best_specs
    assert ss.load_rule(path).apply(state) == static_result.best_specs[0]


def test_export_a_chosen_trial(static_result):
    record = static_result.trials[0]
    config = ss.export_config(static_result, trial=record.number)
    assert config["state_rule"] == record.state_rule
    assert config["results"]["selected"] == "trial"
    assert config["results"]["winner"]["trial"] == record.number
    with pytest.raises(ValueError, match=r"study 'static' has no shardsearch trial number 99"):
        ss.export_config(static_result, trial=99)


def test_an_unfinished_study_exports_its_best_completed_trial(static_result, storage):
    import optuna

    study = optuna.load_study(study_name="static", storage=storage)
    summary = study.user_attrs["result"]
    study.set_user_attr("result", None)  # as if the run had been killed before the end
    try:
        config = ss.export_config(study)
    finally:
        study.set_user_attr("result", summary)
    best = min((r for r in static_result.trials if r.outcome.status == "complete"),
               key=lambda r: (r.outcome.value, r.number))
    assert config["results"]["winner"]["trial"] == best.number
    assert config["results"]["verdict"] == "unconfirmed"
    assert config["results"]["compiles"] is None


def test_a_raw_step_result_exports_its_specs_and_a_stored_study_needs_args(tmp_path):
    mesh = ss.create_mesh((8,), ("x",))

    def step(state, batch):
        return {"w": state["w"] - 0.1 * batch.mean()}, {"loss": batch.sum()}

    args = ({"w": jax.ShapeDtypeStruct((64, 8), np.float32)},
            jax.ShapeDtypeStruct((16, 8), np.float32))
    result = ss.optimize(step, args, mesh=mesh, n_trials=2, objective="static",
                      storage=f"sqlite:///{tmp_path}/s.db", quiet=True, isolate=False)
    # The result carries the arguments it searched on: its plan has the specs.
    config = ss.export_config(result)
    assert config["search"]["workload"] is None
    assert [leaf["path"] for leaf in config["workload"]["arguments"][0]] == ["w"]
    assert ss.load_plan(ss.write_config(config, tmp_path / "p.json")).leaves is not None
    # The stored study does not: without args its plan has rules only.
    stored = ss.export_config(result.study)
    assert stored["workload"] is None
    assert ss.load_plan(ss.write_config(stored, tmp_path / "q.json")).leaves is None
    resolved = ss.export_config(result.study, args=args)["workload"]
    assert [leaf["path"] for leaf in resolved["arguments"][0]] == ["w"]


# --------------------------------------------------------------------------- determinism


def test_same_search_same_file_whatever_the_hash_seed(tmp_path):
    """Two processes, two hash seeds: the files differ under "results" only."""
    procs = []
    for seed in (1, 2):
        env = child_env(PYTHONHASHSEED=str(seed))
        out = tmp_path / f"plan{seed}.json"
        procs.append((out, subprocess.Popen(
            [sys.executable, "-m", "shardsearch", "optimize", "--workload", "mlp:tiny",
             "--mesh", "dp=2,tp=4", "--devices", "8", "--trials", "6", "--objective", "static",
             "--storage", f"sqlite:///{tmp_path}/s{seed}.db", "--out", str(out), "--quiet",
             # In the process itself: a worker would only estimate, and estimates
             # are under "results"; the plan's rules and specs are found here.
             "--no-isolate"],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    files = []
    for out, proc in procs:
        _stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        files.append(json.loads(out.read_text()))
    first, second = files
    first.pop("results"), second.pop("results")
    assert first == second
    assert first["workload"]["name"] == "mlp:tiny"


def test_a_baseline_that_compiles_to_a_finalists_program_shows_its_re_timing():
    # Seen on the README's job: logical_megatron gives megatron's specs (a
    # cache hit, one program). The re-timing timed it as megatron, and the
    # table showed logical_megatron's older search number beside it, rated
    # the best expert, with the winner "0.91x" of itself.
    from shardsearch.cli.render import results_table
    from shardsearch.search.evaluation.outcome import Outcome
    from shardsearch.search.export import _results
    from shardsearch.search.study.record import TrialRecord

    def record(number, label, fp, value):
        return TrialRecord(number, label, {}, Outcome(fp, "complete", value=value,
                                                     step_times=(value,) * 3),
                           {"kind": "x"}, {"kind": "y"}, 1.0)

    records = [record(0, "replicated", "aa", 0.030), record(1, "megatron", "bb", 0.0116),
               record(2, "dp", "cc", 0.0140), record(3, "logical_megatron", "bb", 0.0116)]
    confirmation = {name: {"median": median, "ci": [median * 0.9, median * 1.1], "times": []}
                    for name, median in (("megatron", 0.0127), ("dp", 0.0141))}
    results = _results(records[1], records, {"confirmation": confirmation}, True, "measured",
                       "best")
    rows = {row["label"]: row for row in results["baselines"]}
    twin = rows["logical_megatron"]
    assert (twin["median_seconds"], twin["timed_in"], twin["timing_of"]) == (
        0.0127, "confirmation", "megatron")
    assert "timing_of" not in rows["megatron"] and "timing_of" not in results["winner"]
    # The search's numbers stay where nothing re-timed that program.
    assert (rows["replicated"]["median_seconds"], rows["replicated"]["timed_in"]) == (
        0.030, "search")
    # Tied at one timing, the row timed as itself is the best expert.
    assert results["best_expert"] == "megatron"
    assert results["winner"]["speedup_vs_best_expert"] == 1.0
    table = results_table({"results": results})
    assert re.search(r"logical_megatron +12\.700 .* confirmation \(as megatron\)", table), table
