"""Calibration: microbenchmarks fitted into a HardwareModel, its file, its command."""

import itertools
import json
import math

import jax
import pytest

import shardsearch as ss
from shardsearch.cli import main as _cli
from shardsearch.cost.calibrate import (
    CALIBRATED_OVERLAP,
    Calibration,
    Sizes,
    axis_groups,
    calibrate,
    fit_line,
)
from shardsearch.cost.hardware import HardwareModel
from shardsearch.cost.hlo import COLLECTIVE_KINDS
from shardsearch.cost.topology import Topology

TINY = Sizes(messages=(1024, 8192), matmul=32, memory=1 << 16)
GROUPS_24 = (("dp",), ("tp",), ("dp", "tp"))


@pytest.fixture(scope="module")
def calibration():
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    seen = []
    result = calibrate(mesh, sizes=TINY, repeats=1, trips=2,
                       progress=lambda done, total, label: seen.append((done, total, label)))
    return mesh, result, seen


def _finite(x, zero=False):
    return isinstance(x, float) and math.isfinite(x) and (x >= 0 if zero else x > 0)


# --------------------------------------------------------------------------- library


def test_calibration_fits_every_collective_and_axis_group(calibration):
    mesh, result, _ = calibration
    model = result.model
    assert isinstance(result, Calibration) and result.skipped == ()
    assert [key for key, _ in model.fits] == list(itertools.product(COLLECTIVE_KINDS, GROUPS_24))
    for _, fit in model.fits:
        assert _finite(fit.latency, zero=True) and _finite(fit.bandwidth)
    assert dict(model.flops_per_second).keys() == {"f32", "bf16"}
    assert all(_finite(v) for _, v in model.flops_per_second)
    assert _finite(model.memory_bandwidth)
    assert model.mesh == (("dp", 2), ("tp", 4))
    assert model.overlap == CALIBRATED_OVERLAP
    assert model.name == "calibrated cpu x8 (dp=2,tp=4)"
    about = dict(model.about)
    assert about["jax"] == jax.__version__ and about["devices"] == 8
    assert about["mesh"] == "dp=2,tp=4" and "date" in about
    assert not [k for k in about if "host" in k]
    # The model prices what it measured: each (kind, axes) by its own line.
    topology = Topology.of(mesh)
    for (kind, axes), fit in model.fits:
        assert model.fit(kind, axes, topology) == fit


def test_every_figure_is_what_its_own_samples_give(calibration):
    # Not just finite: each fitted line is the fit of the samples the file
    # lists for it, and the rates are the samples' work over their seconds.
    _mesh, result, _ = calibration
    model, samples = result.model, result.samples
    for (kind, axes), fit in model.fits:
        points = [(s.bytes, s.seconds) for s in samples if (s.kind, s.axes) == (kind, axes)]
        assert len({b for b, _ in points}) >= 2
        assert fit == fit_line(points)
        # Through two sizes, a line with positive latency and slope passes
        # through both points; only a clamped one (nnls at a bound) may not.
        clamped = fit.latency == 0 or fit.bandwidth >= 1e14
        if len(points) == 2 and not clamped:
            for nbytes, seconds in points:
                assert fit.latency + nbytes / fit.bandwidth == pytest.approx(seconds, rel=1e-6)
    for dtype, rate in model.flops_per_second:
        [matmul] = [s for s in samples if s.kind == "matmul" and s.dtype == dtype]
        assert rate == pytest.approx(matmul.flops / matmul.seconds)
    [memory] = [s for s in samples if s.kind == "memory"]
    assert model.memory_bandwidth == pytest.approx(memory.bytes / memory.seconds, rel=1e-3)


def test_samples_are_the_collectives_xla_emitted_at_each_size(calibration):
    _, result, _ = calibration
    collectives = [s for s in result.samples if s.kind in COLLECTIVE_KINDS]
    assert len(collectives) == len(COLLECTIVE_KINDS) * len(GROUPS_24) * len(TINY.messages)
    for s in collectives:
        assert s.axes in GROUPS_24 and s.bytes > 0 and s.seconds > 0 and not s.asked
        assert s.executions == 2  # the trips, as the HLO counts them
    # The x of each fit is Collective.bytes: the gathered buffer for an all-gather.
    assert {s.bytes for s in collectives if s.kind == "all-gather"} == set(TINY.messages)
    assert [s.kind for s in result.samples[:4]] == ["baseline", "matmul", "matmul", "memory"]


def test_progress_counts_every_program_to_the_end(calibration):
    _, _, seen = calibration
    total = seen[0][1]
    assert total == 1 + 2 + 1 + len(COLLECTIVE_KINDS) * len(GROUPS_24) * len(TINY.messages)
    assert [done for done, _, _ in seen] == list(range(total + 1))
    assert seen[-1] == (total, total, "done")
    assert seen[1][2] == "matmul float32"


def test_the_model_round_trips_through_its_file(calibration, tmp_path):
    _, result, _ = calibration
    path = tmp_path / "cal.json"
    result.save(path)
    assert HardwareModel.load(path) == result.model
    data = json.loads(path.read_text())
    assert len(data["samples"]) == len(result.samples)
    assert {"kind", "axes", "bytes", "seconds"} <= set(data["samples"][-1])


@pytest.mark.parametrize(("dims", "names", "groups"), [
    ((2, 4), ("dp", "tp"), GROUPS_24),
    ((8,), ("x",), (("x",),)),
    ((1, 8), ("a", "b"), (("b",),)),
    ((2, 2, 2), ("a", "b", "c"),
     (("a",), ("b",), ("c",), ("a", "b"), ("a", "c"), ("b", "c"), ("a", "b", "c"))),
    ((1,), ("x",), ()),
])
def test_axis_groups_in_mesh_order_without_size_one_axes(dims, names, groups):
    assert axis_groups(Topology(names, dims)) == groups


def test_fit_line_recovers_a_line_and_stays_finite():
    fit = fit_line([(1e3, 1e-6 + 1e3 / 1e9), (1e5, 1e-6 + 1e5 / 1e9), (1e6, 1e-6 + 1e-3)])
    assert fit.latency == pytest.approx(1e-6, rel=1e-6)
    assert fit.bandwidth == pytest.approx(1e9, rel=1e-6)
    flat = fit_line([(1e3, 5e-5), (1e6, 5e-5)])  # time that does not grow with size
    assert flat.latency == pytest.approx(5e-5) and math.isfinite(flat.bandwidth)
    falling = fit_line([(1e3, 2e-3), (1e6, 1e-3)])  # noise: latency >= 0, bandwidth > 0
    assert falling.latency >= 0 and 0 < falling.bandwidth < math.inf
    with pytest.raises(ValueError, match="two sizes or more"):
        fit_line([(1e3, 1e-5), (1e3, 2e-5)])
    with pytest.raises(ValueError, match="positive and finite"):
        fit_line([(1e3, 0.0), (1e4, 1e-5)])


def test_bad_requests_are_refused_before_anything_runs(mesh24):
    with pytest.raises(ValueError, match="abstract"):
        calibrate(ss.abstract_mesh((2, 4), ("dp", "tp")))
    with pytest.raises(ValueError, match="give one or more of"):
        calibrate(mesh24, dtypes=("int8",))
    with pytest.raises(ValueError, match="repeats=0"):
        calibrate(mesh24, repeats=0)
    with pytest.raises(ValueError, match="dcn_axes"):
        calibrate(mesh24, dcn_axes=("pp",))
    with pytest.raises(ValueError, match="has size 1"):
        calibrate(ss.create_mesh((1,), ("x",), jax.devices()[:1]))
    with pytest.raises(ValueError, match="two distinct sizes"):
        Sizes(messages=(4096, 4096))
    with pytest.raises(ValueError, match=r"Sizes.matmul=0"):
        Sizes(matmul=0)


# --------------------------------------------------------------------------- the file


def _valid(calibration):
    return calibration[1].model.to_json()


def _drop(key):
    def change(data):
        del data[key]
    return change


def _set(path, value):
    def change(data):
        target = data
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return change


@pytest.mark.parametrize(("change", "message"), [
    (_drop("memory_bandwidth"), "field 'memory_bandwidth' is missing"),
    (_drop("flops_per_second"), "field 'flops_per_second' is missing"),
    (_set(("collectives", 0, "bandwidth"), "fast"),
     "field 'collectives[0].bandwidth' must be a positive number, got 'fast'"),
    (_set(("collectives", 1, "latency"), -1e-6), "field 'collectives[1].latency'"),
    (_set(("collectives", 2, "kind"), "all-scatter"), "field 'collectives[2].kind'"),
    (_set(("collectives", 0, "axes"), []), "field 'collectives[0].axes'"),
    (_set(("memory_bandwidth",), math.nan), "field 'memory_bandwidth'"),
    (_set(("flops_per_second", "f32"), 0), "field 'flops_per_second.f32'"),
    (_set(("schema",), 2), "field 'schema' is 2"),
    (_set(("colectives",), []), "unknown field 'colectives'"),
])
def test_a_calibration_file_with_a_bad_field_is_one_line_naming_it(
        calibration, tmp_path, change, message):
    data = _valid(calibration)
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))  # NaN too, as a careless writer would
    with pytest.raises(ValueError) as err:
        HardwareModel.load(path)
    assert message in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_a_calibration_file_that_is_not_json_is_one_line(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('{"schema": 1, "name": "x", ')
    with pytest.raises(ValueError, match="not valid JSON") as err:
        HardwareModel.load(path)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- the command


def _one_line_error(err, prog):
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: ")
    return lines[0]


def test_the_command_writes_a_file_that_loads(tmp_path, capsys):
    out = tmp_path / "cal.json"
    argv = ["calibrate", "--mesh", "dp=2", "--sizes", "1KiB,8KiB", "--repeats", "1",
            "--quiet", "--out", str(out)]
    assert _cli.main(argv) == 0
    printed = capsys.readouterr().out
    model = HardwareModel.load(out)
    assert model.mesh == (("dp", 2),)
    assert [key for key, _ in model.fits] == [(k, ("dp",)) for k in COLLECTIVE_KINDS]
    assert "all-gather" in printed and f"wrote {out}" in printed
    # Written once; again only with --force.
    assert _cli.main(argv) == 2
    assert "exists; pass --force" in _one_line_error(capsys.readouterr().err,
                                                     "shardsearch calibrate")


@pytest.mark.parametrize(("argv", "message"), [
    (["--mesh", "dp=2,tp"], "part 'tp' is not name=size"),
    (["--mesh", "dp=4,tp=4"], "needs 16 devices but there are 8"),
    (["--mesh", "dp=1"], "every axis has size 1"),
    (["--mesh", "dp=2,tp=4", "--dcn-axes", "pp"], "dcn_axes ['pp'] are not mesh axes"),
    (["--mesh", "dp=2,tp=4", "--sizes", "4KiB"], "two distinct sizes"),
    (["--mesh", "dp=2,tp=4", "--sizes", "4KiB,fast"], "'fast' is not a byte count"),
    (["--mesh", "dp=2,tp=4", "--repeats", "0"], "must be at least 1"),
    (["--mesh", "dp=2,tp=4", "--out", "missing-dir/cal.json"],
     "the folder missing-dir does not exist"),
    (["--mesh", "dp=2,tp=4", "--out", "."], "is a directory"),
])
def test_bad_invocations_are_one_line_and_exit_2(argv, message, tmp_path, monkeypatch,
                                                  capsys):
    monkeypatch.chdir(tmp_path)
    assert _cli.main(["calibrate", *argv]) == 2
    assert message in _one_line_error(capsys.readouterr().err, "shardsearch calibrate")


def test_optimize_refuses_a_bad_hardware_file_in_one_line(calibration, tmp_path, monkeypatch,
                                                          capsys):
    data = _valid(calibration)
    data["collectives"][0]["bandwidth"] = "fast"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    code = _cli.main(["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4",
                      "--objective", "static", "--hardware", "bad.json", "--quiet",
                      "--storage", f"sqlite:///{tmp_path / 'db.sqlite'}", "--no-compile-cache"])
    assert code == 2
    line = _one_line_error(capsys.readouterr().err, "shardsearch optimize")
    assert "bad.json" in line and "collectives[0].bandwidth" in line
