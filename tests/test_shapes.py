"""The mesh's shape searched too: `optimize(..., devices=N, axes=...)` and
`shardsearch optimize --axes` (issue 24, item 1)."""

import collections
import json
import subprocess
import sys
import warnings

import jax
import optuna
import pytest
from child_env import child_env

import shardsearch as ss
from shardsearch.base.mesh import axes_text, axis_sizes
from shardsearch.base.warnings import ShardsearchWarning
from shardsearch.search.shapes import PROBES, ShapeWarning, factorisations, mesh_shapes
from shardsearch.workloads import get_workload

STATIC = dict(objective="static", quiet=True, isolate=False, confirm_rounds=0)


def test_every_split_of_the_devices_over_the_axes():
    assert factorisations(8, 2) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert len(factorisations(8, 3)) == 10 and all(
        a * b * c == 8 for a, b, c in factorisations(8, 3))
    assert factorisations(7, 1) == [(7,)]


def test_a_shape_with_an_axis_that_divides_no_dimension_is_pruned_before_compiling():
    args = (jax.ShapeDtypeStruct((4, 6), "float32"), jax.ShapeDtypeStruct((12,), "float32"))
    kept, pruned = mesh_shapes(8, ("dp", "tp"), args)
    assert kept == [{"dp": 2, "tp": 4}, {"dp": 4, "tp": 2}]
    assert set(pruned) == {"dp=1,tp=8", "dp=8,tp=1"}
    assert "tp=8 divides no dimension of any argument" in pruned["dp=1,tp=8"]
    with pytest.raises(ValueError, match="no way to split 8 devices over dp, tp shards "
                                         "anything"):
        mesh_shapes(8, ("dp", "tp"), (jax.ShapeDtypeStruct((3, 5), "float32"),))
    with pytest.raises(ValueError, match="distinct axis names"):
        mesh_shapes(8, ("dp", "dp"), args)
    with pytest.raises(ValueError, match="devices=0"):
        mesh_shapes(0, ("dp",), args)


def test_optimize_searches_each_shape_and_the_plan_records_the_winners(tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    result = ss.optimize(get_workload("mlp:tiny"), devices=4, axes=("dp", "tp"), n_trials=9,
                         storage=storage, study_name="shapes", **STATIC)
    shapes = result.shapes
    assert shapes["devices"] == 4 and shapes["axes"] == ["dp", "tp"]
    assert set(shapes["searched"]) == {"dp=1,tp=4", "dp=2,tp=2", "dp=4,tp=1"}
    chosen = shapes["searched"][shapes["chosen"]]
    # The winner is the fastest estimate of any shape, and its result is that shape's.
    assert chosen["best_time"] == min(s["best_time"] for s in shapes["searched"].values())
    assert result.best_time == chosen["best_time"]
    assert ",".join(f"{a}={s}" for a, s in result.mesh_axes.items()) == shapes["chosen"]
    # Each shape is its own study, named after it, holding its own trials:
    # its whole warm start and a few searched trials, though 9 trials over 3
    # shapes would not reach them.
    names = {row["study_name"] for row in shapes["searched"].values()}
    assert names == {f"shapes/{text}" for text in shapes["searched"]}
    for text, row in shapes["searched"].items():
        study = optuna.load_study(study_name=row["study_name"], storage=storage)
        labels = [t.user_attrs.get("label") for t in study.trials]
        assert len(study.trials) == row["trials"] > 3, text
        assert labels.count("search") == PROBES, labels
        baselines = [label for label in labels if label != "search"]
        assert len(set(baselines)) == len(baselines), labels
        assert {"replicated", "default", "dp"} <= set(labels), labels
    assert shapes["trials"] == {"asked": 9, "run": sum(
        row["trials"] for row in shapes["searched"].values())}
    plan = ss.export_config(result)
    assert dict(zip(plan["mesh"]["axis_names"], plan["mesh"]["axis_sizes"], strict=True)) \
        == result.mesh_axes
    assert result.to_json()["shapes"] == shapes


def test_the_trials_left_after_the_warm_starts_go_to_the_better_half(tmp_path, monkeypatch):
    # Each round resumes a shape's study, and its setup warns again: the
    # search shows each such warning once per shape, not once per round.
    from shardsearch.search import loop

    real, calls = loop.optimize, collections.Counter()

    def optimize(*args, mesh, **kwargs):
        text = axes_text(axis_sizes(mesh))
        calls[text] += 1
        warnings.warn(ShardsearchWarning(f"setup of {text}"), stacklevel=2)
        return real(*args, mesh=mesh, **kwargs)

    monkeypatch.setattr(loop, "optimize", optimize)  # what a shape search calls
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ss.optimize(get_workload("mlp:tiny"), devices=4, axes=("dp", "tp"),
                             n_trials=50, storage=f"sqlite:///{tmp_path / 's.db'}", **STATIC)
    said = collections.Counter(str(w.message) for w in caught if "setup of" in str(w.message))
    assert said == {f"setup of {text}": 1 for text in calls} and max(calls.values()) > 1
    searched = result.shapes["searched"]
    assert result.shapes["trials"]["run"] == 50
    warm = min(row["trials"] for row in searched.values())
    more = sorted((text for text, row in searched.items() if row["trials"] > warm))
    # The two shapes that got more are the two best after the first round,
    # and the chosen one is among them.
    assert len(more) == 2 and result.shapes["chosen"] in more


def test_measured_shapes_are_re_timed_side_by_side(tmp_path):
    result = ss.optimize(get_workload("mlp:tiny"), devices=4, axes=("dp", "tp"), n_trials=4,
                         storage=f"sqlite:///{tmp_path / 's.db'}", objective="measured",
                         warmup=1, repeats=2, confirm_rounds=6, quiet=True, isolate=False)
    searched = result.shapes["searched"]
    assert all(len(row["retimed"]["times"]) == 6 for row in searched.values())
    assert result.shapes["verdict"] in ("faster", "tie")


def test_a_mesh_and_a_shape_search_are_one_or_the_other():
    w = get_workload("mlp:tiny")
    with pytest.raises(ValueError, match="not both"):
        ss.optimize(w, mesh=ss.create_mesh((2, 4), ("dp", "tp")), axes=("dp", "tp"))
    with pytest.raises(ValueError, match="give mesh=, or axes="):
        ss.optimize(w, devices=4)
    with pytest.raises(ValueError, match="devices=64: there are 8 cpu devices"):
        ss.optimize(w, devices=64, axes=("dp", "tp"), **STATIC)


def test_the_command_line_searches_the_shape(tmp_path):
    out = tmp_path / "plan.json"
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-m", "shardsearch", "optimize", "--workload", "mlp:tiny", "--axes",
         "dp,tp", "--devices", "4", "--trials", "6", "--objective", "static", "--quiet",
         "--no-isolate", "--out", str(out), "--storage", f"sqlite:///{tmp_path / 's.db'}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "the mesh's shape searched too: 4 cpu devices over dp,tp" in done.stdout
    lines = [line for line in done.stdout.splitlines() if line.startswith(" * ")]
    assert len(lines) == 1, done.stdout  # the chosen shape, marked
    plan = json.loads(out.read_text())
    mesh = zip(plan["mesh"]["axis_names"], plan["mesh"]["axis_sizes"], strict=True)
    assert lines[0].split()[1] == ",".join(f"{a}={s}" for a, s in mesh)


@pytest.mark.parametrize(("argv", "words"), [
    (["--mesh", "dp=2,tp=2", "--axes", "dp,tp"], "one of them"),
    ([], "give --mesh dp=2,tp=4 (one shape) or --axes dp,tp"),
    (["--axes", "dp,tp", "--target", "tpu-v5e"], "give the chip count to split"),
    (["--axes", "dp,tp", "--dcn-axes", "pp"], "'pp' is not an axis of --axes dp,tp"),
])
def test_shape_usage_errors_are_one_line(argv, words, capsys):
    from shardsearch.cli.main import main

    code = main(["optimize", "--workload", "mlp:tiny", "--trials", "1", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err


def test_a_shape_the_target_cannot_lay_out_is_pruned_with_its_reason():
    def make(shape):
        if shape["tp"] > 2:
            raise ValueError(f"tp={shape['tp']} spans more than one host")
        return ss.create_mesh(tuple(shape.values()), tuple(shape), jax.devices()[:4])

    with pytest.warns(ShapeWarning, match=r"1 split\(s\) of 4 devices over dp, tp left out "
                                          r"of the comparison: dp=1,tp=4: no mesh of this "
                                          "shape: tp=4 spans more than one host"):
        result = ss.optimize(get_workload("mlp:tiny"), devices=4, axes=("dp", "tp"),
                             n_trials=3, make_mesh=make, storage="sqlite://", **STATIC)
    assert set(result.shapes["searched"]) == {"dp=2,tp=2", "dp=4,tp=1"}
    # In memory nothing resumes: one round, every trial in it.
    assert sum(row["trials"] for row in result.shapes["searched"].values()) == 3
    assert result.shapes["pruned"] == {
        "dp=1,tp=4": "no mesh of this shape: tp=4 spans more than one host"}


def test_a_shape_where_nothing_completes_is_set_aside_and_the_others_go_on(tmp_path):
    from shardsearch.search.finish import NothingCompleted
    from shardsearch.search.loop import optimize
    from shardsearch.search.setup import SearchSettings
    from shardsearch.search.shapes import search_shapes

    def tight(step, args, *, mesh, settings):
        if dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True)) == {"dp": 1, "tp": 4}:
            raise NothingCompleted("every candidate over the budget")
        return optimize(step, args, mesh=mesh, settings=settings)

    settings = SearchSettings(n_trials=3, storage=f"sqlite:///{tmp_path / 's.db'}", **STATIC)
    with pytest.warns(ShapeWarning, match="dp=1,tp=4: every candidate over the budget"):
        result = search_shapes(get_workload("mlp:tiny"), None, 4, ("dp", "tp"), settings,
                               None, tight)
    assert result.shapes["failed"] == {"dp=1,tp=4": "every candidate over the budget"}
    assert set(result.shapes["searched"]) == {"dp=2,tp=2", "dp=4,tp=1"}

    def none_fits(step, args, *, mesh, settings):
        raise NothingCompleted("over the budget")

    with pytest.raises(NothingCompleted, match="no split of 4 devices over dp, tp completed "
                                               "a candidate: dp=1,tp=4: over the budget; "):
        search_shapes(get_workload("mlp:tiny"), None, 4, ("dp", "tp"), settings, None,
                      none_fits)


def test_no_new_trials_with_a_timeout_still_runs_each_shapes_warm_start(tmp_path):
    # The timeout is split in proportion to n_trials, which may be 0.
    result = ss.optimize(get_workload("mlp:tiny"), devices=2, axes=("dp", "tp"), n_trials=0,
                         timeout=600, storage=f"sqlite:///{tmp_path / 's.db'}", **STATIC)
    assert set(result.shapes["searched"]) == {"dp=1,tp=2", "dp=2,tp=1"}
