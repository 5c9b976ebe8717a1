"""benchmarks/fidelity/run.py: a tiny study end to end, its resume, its refusals and
its statistics."""

import json

import pytest
from bench_scripts import load_script

import shardsearch as ss

fidelity_run = load_script("benchmarks/fidelity/run.py", "fidelity_run")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """mlp:tiny on dp=2,tp=4, three searched candidates, with a "calibrated" model
    (a link-bandwidth model saved as calibration files are), run once."""
    folder = tmp_path_factory.mktemp("fidelity")
    calib = folder / "calib"
    calib.mkdir()
    ss.HardwareModel("test link model", 3e10, 1e10, 2e9,
                     mesh=(("dp", 2), ("tp", 4))).save(calib / "cpu-dp2-tp4.json")
    out = folder / "out"
    argv = ["--workloads", "mlp:tiny", "--meshes", "dp=2,tp=4", "--candidates", "3",
            "--no-baselines", "--repeats", "2", "--warmup", "1", "--calibration", str(calib),
            "--out", str(out)]
    assert fidelity_run.main(argv) == 0
    return argv, out, json.loads((out / "results.json").read_text())


def test_every_candidate_is_estimated_by_each_model_and_measured(study):
    argv, out, result = study
    [entry] = result["entries"]
    assert (entry["workload"], entry["mesh"]) == ("mlp:tiny", "dp=2,tp=4")
    candidates = entry["candidates"]
    fps = [c["fingerprint"] for c in candidates]
    assert len(fps) == len(set(fps)) == 3
    assert all(c["labels"] == ["search"] and c["params"] for c in candidates)
    for c in candidates:
        assert c["status"] == "complete" and c["median_seconds"] > 0
        assert len(c["step_times"]) == 2 and c["compile_seconds"] > 0
        assert set(c["estimates"]) == {"default", "calibrated"}
        for got in c["estimates"].values():
            # One breakdown per model; its parts are the estimate.
            assert got["seconds"] > 0 and got["breakdown"]["total"] == got["seconds"]
            by = [got["by_overlap"][str(x)] for x in fidelity_run.OVERLAPS]
            assert by == sorted(by, reverse=True)  # more overlap hides more
    for label in ("default", "calibrated"):
        assert entry["stats"][label]["n"] == 3
        assert set(entry["sweep"][label]) == {str(x) for x in fidelity_run.OVERLAPS}
    assert entry["models"]["calibrated"] == "test link model"
    chosen = result["overlap"]
    assert chosen["chosen_on"] == ["mlp:tiny@dp=2,tp=4"] and chosen["held_out"] == []
    taus = [v for v in chosen["mean_tau_chosen_on"].values() if v is not None]
    assert (chosen["chosen"] in fidelity_run.OVERLAPS) if taus else chosen["chosen"] is None
    md = (out / "results.md").read_text()
    assert " ".join(argv) in md and "| overlap |" in md
    assert (out / "estimate-vs-measured.png").is_file() or result["plot_note"]


def test_a_rerun_resumes_without_measuring_again(study, capsys):
    argv, out, result = study
    log = out / "mlp-tiny-dp2-tp4.jsonl"
    before = log.read_text()
    assert fidelity_run.main(argv) == 0
    assert "[1/" not in capsys.readouterr().out  # nothing compiled or timed
    assert log.read_text() == before
    again = json.loads((out / "results.json").read_text())
    assert ([c["fingerprint"] for c in again["entries"][0]["candidates"]]
            == [c["fingerprint"] for c in result["entries"][0]["candidates"]])
    assert fidelity_run.main([*argv, "--report-only"]) == 0


def test_a_log_from_other_settings_is_refused(study, capsys):
    argv, _out, _result = study
    assert fidelity_run.main([*argv, "--repeats", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fresh" in err[0]


def test_a_missing_calibration_is_refused_before_anything_runs(tmp_path, capsys):
    code = fidelity_run.main(["--workloads", "mlp:tiny", "--meshes", "dp=2,tp=4",
                              "--calibration", str(tmp_path), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cpu-dp2-tp4.json is missing" in err[0]
    assert not (tmp_path / "o").exists()


def test_fidelity_statistics():
    f = fidelity_run.fidelity
    same = f([(1.0, 10.0, "a"), (2.0, 20.0, "b"), (3.0, 30.0, "c")])
    assert same["kendall_tau"] == pytest.approx(1.0) and same["spearman"] == pytest.approx(1.0)
    assert same["top1_regret"] == 1.0 and same["median_ratio"] == pytest.approx(0.1)
    reverse = f([(3.0, 10.0, "a"), (2.0, 20.0, "b"), (1.0, 30.0, "c")])
    assert reverse["kendall_tau"] == pytest.approx(-1.0) and reverse["top1_regret"] == 3.0
    # Tied first choices are broken by fingerprint, and counted.
    tied = f([(1.0, 30.0, "b"), (1.0, 10.0, "a"), (2.0, 20.0, "c")])
    assert tied["top1_regret"] == 1.0 and tied["tied_first"] == 2
    one = f([(1.0, 2.0, "a")])
    assert one["kendall_tau"] is None and one["top1_regret"] is None
    assert one["median_ratio"] == 0.5


def test_the_overlap_is_chosen_on_its_mesh_only():
    def entry(mesh, taus):
        sweep = {str(x): {"kendall_tau": t} for x, t in zip(fidelity_run.OVERLAPS, taus,
                                                             strict=True)}
        return {"workload": "w", "mesh": mesh, "stats": {"calibrated": {}},
                "sweep": {"calibrated": sweep}}

    entries = [entry("dp=2,tp=4", [0.1, 0.5, 0.9, 0.9, 0.2]),
               entry("dp=8", [1.0, 0.0, 0.0, 0.0, 0.0])]  # held out: does not vote
    got = fidelity_run.choose_overlap(entries, "dp=2,tp=4")
    assert got["chosen"] == 0.5  # the first of the equal best
    assert got["mean_tau_held_out"]["0.0"] == 1.0 and got["held_out"] == ["w@dp=8"]
    assert fidelity_run.choose_overlap(entries[1:], "dp=2,tp=4")["chosen"] is None
