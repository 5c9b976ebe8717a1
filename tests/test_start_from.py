"""Starting a search from plan files: `optimize(start_from=...)`, `optimize
--start-from` and `bench --start-from`."""

import json

import optuna
import pytest

import shardsearch as ss
from shardsearch.cli import main as _cli
from shardsearch.plan.writer import logical_axis_rules_config
from shardsearch.rules.auto import AutoShardingRule
from shardsearch.rules.batch import BatchShardingRule
from shardsearch.rules.composite import CompositeShardingRule
from shardsearch.search import plan_config
from shardsearch.search.space.baselines import start_candidates
from shardsearch.workloads import get_workload

# Static: estimates are deterministic and nothing runs, so a test can compare values.
STATIC = dict(objective="static", quiet=True, confirm_rounds=0, isolate=False)


def _tp_only(mesh):
    """A plan none of the baselines is: the state over tp only, the batch over dp."""
    return CompositeShardingRule(AutoShardingRule(mesh, axis_names=("tp",))), \
        BatchShardingRule(("dp",))


def _write_plan(path, mesh, workload="mlp:tiny"):
    rule, batch = _tp_only(mesh)
    ss.write_config(plan_config(rule, batch, mesh, workload=get_workload(workload)), path)
    return path


def _storage(tmp_path):
    return f"sqlite:///{tmp_path / 'studies.db'}"


def test_a_start_plan_is_evaluated_and_can_win(mesh24, tmp_path):
    plan = _write_plan(tmp_path / "mine.json", mesh24)
    workload = get_workload("mlp:tiny")
    # Only the start plan: no baselines, one trial.
    result = ss.optimize(workload, mesh=mesh24, n_trials=1, warm_start=False,
                         start_from=[plan], storage=_storage(tmp_path), study_name="one",
                         **STATIC)
    assert [r.label for r in result.trials] == ["plan:mine"]
    assert result.best_label == "plan:mine"
    rule, batch = _tp_only(mesh24)
    state, *rest = workload.abstract()
    assert result.best_specs[0] == rule.apply(state)
    assert result.best_specs[1] == batch.apply(rest[0])


def test_beside_the_baselines_the_winner_is_never_worse_and_a_resume_skips_it(
        mesh24, tmp_path):
    plan = _write_plan(tmp_path / "mine.json", mesh24)
    kwargs = dict(mesh=mesh24, start_from=[plan], storage=_storage(tmp_path),
                  study_name="beside", **STATIC)
    result = ss.optimize(get_workload("mlp:tiny"), n_trials=9, **kwargs)
    labels = [r.label for r in result.trials]
    # Right after replicated, the reference, then the other baselines and the search.
    assert labels[:3] == ["replicated", "plan:mine", "default"] and labels[-1] == "search"
    mine = next(r for r in result.trials if r.label == "plan:mine")
    assert mine.outcome.status == "complete"
    assert result.best_time <= mine.outcome.value
    # An earlier answer is not an expert's plan.
    config = ss.export_config(result)
    assert config["results"]["best_expert"] != "plan:mine"
    assert "plan:mine" in [row["label"] for row in config["results"]["baselines"]]

    # A resumed study does not evaluate it again.
    again = ss.optimize(get_workload("mlp:tiny"), n_trials=1, **kwargs)
    assert [r.label for r in again.trials].count("plan:mine") == 1
    assert again.trials[-1].label == "search"


def test_a_logical_axis_rules_file_starts_a_search_too(mesh24, tmp_path):
    # A logical plan, written in the Flax/MaxText form (what a logical-only
    # search's winner exports to when its optimizer state stays with its
    # parameters).
    from shardsearch.search.space.logical import split_rules

    tiny = get_workload("mlp:tiny")
    axes = ss.discover_logical_axes(tiny.step, tiny.abstract())
    names = sorted({n for leaf in axes.leaves(0).values() for n in leaf.names if n})
    assert len(names) >= 2, names
    state_rule, batch_rule = split_rules(mesh24, axes, {names[0]: "tp", "batch": "dp"})
    config = plan_config(state_rule, batch_rule, mesh24, workload=tiny)
    data = logical_axis_rules_config(config)
    path = tmp_path / "axes.json"
    path.write_text(json.dumps(data))
    # Without the batch's logical names the file gives no batch rule.
    data.pop("batch")
    (tmp_path / "params-only.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="names no batch leaves"):
        start_candidates([tmp_path / "params-only.json"], mesh24)
    starts = start_candidates([path], mesh24)
    assert list(starts) == ["plan:axes"]
    assert starts["plan:axes"].state_rule.kind == "logical"
    result = ss.optimize(tiny, mesh=mesh24, n_trials=1, warm_start=False, start_from=[path],
                         storage=_storage(tmp_path), study_name="again", space="logical",
                         **STATIC)
    assert result.best_label == "plan:axes"
    assert result.best_specs == (state_rule.apply(tiny.abstract()[0]),
                                 batch_rule.apply_argument(0, tiny.abstract()[1]))


def test_bad_start_plans_fail_before_anything_runs(mesh24, tmp_path):
    with pytest.raises(ValueError, match=r"missing\.json'.*cannot read it"):
        start_candidates([tmp_path / "missing.json"], mesh24)
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match=r"list\.json: the logical_axis_rules list holds no pairs"):
        start_candidates([tmp_path / "list.json"], mesh24)
    other = ss.create_mesh((8,), ("data",))
    plan = _write_plan(tmp_path / "mine.json", mesh24)
    with pytest.raises(ValueError, match=r"axes \('dp', 'tp'\) but the mesh given has axes"):
        start_candidates([plan], other)
    (tmp_path / "sub").mkdir()
    twin = _write_plan(tmp_path / "sub" / "mine.json", mesh24)
    with pytest.raises(ValueError, match="a second file named 'mine'"):
        start_candidates([plan, twin], mesh24)
    # One path, not its characters.
    assert list(start_candidates(str(plan), mesh24)) == ["plan:mine"]
    # optimize checks them first: no study is written.
    with pytest.raises(ValueError, match="cannot read it"):
        ss.optimize(get_workload("mlp:tiny"), mesh=mesh24, n_trials=1,
                    start_from=[tmp_path / "missing.json"], storage=_storage(tmp_path),
                    study_name="never", **STATIC)
    assert "never" not in [s.study_name for s in optuna.get_all_study_summaries(
        _storage(tmp_path))]


def test_the_command_line_starts_from_a_plan(mesh24, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    plan = _write_plan(tmp_path / "mine.json", mesh24)
    argv = ["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--objective",
            "static", "--trials", "3", "--confirm-rounds", "0", "--quiet", "--no-compile-cache",
            "--no-isolate", "--storage", _storage(tmp_path), "--start-from", str(plan),
            "--out", "out.json"]
    assert _cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "plan:mine" in out
    labels = [row["label"] for row in
              json.loads((tmp_path / "out.json").read_text())["results"]["baselines"]]
    assert "plan:mine" in labels


def test_bench_starts_each_entry_from_its_plan_in_the_folder(mesh24, tmp_path, capsys):
    suite = {"schema": 1, "suite": "tiny", "platform": "cpu", "devices": 8, "simulated": True,
             "timing": {"warmup": 1, "repeats": 2, "rounds": 6},
             "entries": [{"id": f"e{i}", "workload": "mlp", "size": "tiny", "mesh": "dp=2,tp=4",
                          "trials": 2, "objective": "static"} for i in (1, 2)]}
    (tmp_path / "tiny.json").write_text(json.dumps(suite))
    (tmp_path / "earlier" / "tiny").mkdir(parents=True)
    _write_plan(tmp_path / "earlier" / "tiny" / "e1.json", mesh24)
    out = tmp_path / "out"
    argv = ["bench", "--suite", str(tmp_path / "tiny.json"), "--out", str(out), "--rules",
            str(tmp_path / "rules"), "--start-from", str(tmp_path / "earlier"), "--quiet"]
    assert _cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "starting from" in printed and "no start plan" in printed
    first = json.loads((out / "tiny" / "entries" / "e1.json").read_text())
    second = json.loads((out / "tiny" / "entries" / "e2.json").read_text())
    assert first["start_plan"].endswith("e1.json") and second["start_plan"] is None
    assert "--start-from" in json.loads((out / "tiny" / "machine.json").read_text())["command"]
    storage = f"sqlite:///{out / 'tiny' / 'studies.db'}"
    labels = {name: [t.user_attrs["label"] for t in optuna.load_study(
        study_name=f"bench/tiny/{name}/both", storage=storage).get_trials()]
        for name in ("e1", "e2")}
    assert labels["e1"].count("plan:e1") == 1 and not any(
        label.startswith("plan:") for label in labels["e2"])
