"""The evaluation's stages, its objectives, and the hardware model's view of a program."""

import dataclasses
import json
import re
import types

import jax
import optuna
import pytest
from jax.sharding import PartitionSpec

import shardsearch as ss
from shardsearch.base.warnings import ShardsearchWarning
from shardsearch.cost.chips import HARDWARE, LEGACY
from shardsearch.cost.hardware import HardwareModel
from shardsearch.cost.hlo import Collective, CollectiveSummary, HloCost
from shardsearch.cost.program import ProgramCost, XlaMemory
from shardsearch.search import Outcome
from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.evaluation import objectives as _objectives
from shardsearch.search.evaluation.objectives import Objective, get_objective, register_objective
from shardsearch.search.evaluation.stages import COMPLETE, CUT, FAILED, Stage, Status, stage_label
from shardsearch.search.setup import make_context
from shardsearch.search.space.baselines import baseline_candidates
from shardsearch.workloads import get_workload


def _storage(tmp_path):
    return f"sqlite:///{tmp_path / 'studies.db'}"


# --------------------------------------------------------------------------- stages


def test_stage_ints_labels_and_summary_keys_are_the_stored_ones():
    # Studies store the ints, plan files the labels, summaries the keys.
    assert [(s.id, s.label, s.summary_key) for s in Stage] == [
        (1, "check", "cut_check"), (2, "compile", "cut_compile"),
        (4, "estimate", "cut_estimate"), (3, "measure", "cut_measure")]
    for stage in Stage:
        assert Stage.from_id(stage.id) is stage
        assert Stage.parse(stage.label) is stage
        assert stage_label(stage.id) == stage_label(stage) == stage.label
    # Comparisons follow the pipeline, not the stored ids (estimate is 4, measure 3).
    assert sorted(Stage, reverse=True) == list(Stage)[::-1]
    assert Stage.ESTIMATE < Stage.MEASURE and [s.order for s in Stage] == [0, 1, 2, 3]
    assert Stage.CHECK != 1  # a stored id is not a stage
    with pytest.raises(ValueError, match=r"no evaluation stage stored as 5; the stored ids "
                                         r"are \(1, 2, 4, 3\)"):
        Stage.from_id(5)
    assert stage_label(None) is None
    with pytest.raises(ValueError, match=r"no evaluation stage labelled 'estimat'; the stages "
                                         r"are \('check', 'compile', 'estimate', 'measure'\)"):
        Stage.parse("estimat")
    assert [s.value for s in Status] == ["complete", "cut", "failed"]


def test_outcomes_keep_the_stored_form_and_check_status_against_stage():
    outcome = Outcome("ab12", "cut", 2, "over the budget")
    assert outcome.cut_stage is Stage.COMPILE and outcome.cut_stage.id == 2
    assert outcome.status is CUT and outcome.status == "cut"
    data = outcome.to_json()
    assert (type(data["status"]), type(data["cut_stage"])) == (str, int)
    assert json.loads(json.dumps(data))["cut_stage"] == 2
    assert Outcome.from_json(json.loads(json.dumps(data))) == outcome
    with pytest.raises(ValueError, match="the statuses are"):
        Outcome("ab12", "pruned")
    with pytest.raises(ValueError, match=r"cut_stage=7; the statuses .* stored ids \(1, 2, 4, 3\)"):
        Outcome("ab12", CUT, 7)
    with pytest.raises(ValueError, match="a cut outcome names the stage"):
        Outcome("ab12", CUT)
    with pytest.raises(ValueError, match="a cut outcome names the stage"):
        Outcome("ab12", FAILED, 1)


@pytest.fixture(scope="module")
def tight_static(tmp_path_factory):
    """A static search whose budget cuts the replicated plan at check."""
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    workload = get_workload("mlp:tiny")
    args = workload.abstract()
    replicated = baseline_candidates(None, mesh)["replicated"].specs(args)
    budget = ss.ShardingAnalyzer(mesh).estimate_memory_usage(
        tuple(args), replicated)["size_per_device"] // 2
    storage = f"sqlite:///{tmp_path_factory.mktemp('tight')}/s.db"
    return ss.optimize(workload, mesh=mesh, n_trials=8, objective="static",
                       memory_budget=budget, storage=storage, quiet=True, isolate=False)


def test_studies_summaries_and_plan_files_record_the_stage_forms(tight_static):
    result = tight_static
    stored = result.study.trials[0].user_attrs["outcome"]
    assert result.trials[0].label == "replicated"
    assert stored["status"] == "cut" and stored["cut_stage"] == 1
    assert result.trials[0].outcome.cut_stage is Stage.CHECK
    summary = result.summary()
    assert list(summary) == ["trials", "completed", "cut_check", "cut_compile", "cut_estimate",
                             "cut_measure", "failed", "cache_hits"]
    assert summary["cut_check"] >= 1
    rows = {row["label"]: row for row in ss.export_config(result)["results"]["baselines"]}
    assert rows["replicated"]["cut_stage"] == "check"
    assert {row["cut_stage"] for row in rows.values()} <= {None, *(s.label for s in Stage)}
    assert {row["timed_in"] for row in rows.values() if row["status"] == "complete"} == {
        "estimate"}
    # The static objective times nothing, so its trials are never pruned while timing.
    assert isinstance(result.study.pruner, optuna.pruners.NopPruner)


# --------------------------------------------------------------------------- compile options


# Where the step was traced from, in an HLO text: the tables of Python frames
# and each op's metadata (they differ with the caller when JAX traces again).
_SOURCES = re.compile(r"^(?:FileNames|FunctionNames|FileLocations|StackFrames)\n(?:.+\n)*|"
                      r", metadata=\{[^}]*\}", re.MULTILINE)


def _read(executable):
    """What the search reads of a compiled program: its optimized HLO, XLA's
    memory analysis (as the compile stage reads it) and its cost analysis."""
    return (_SOURCES.sub("", executable.as_text()), XlaMemory.from_compiled(executable),
            executable.cost_analysis())


def test_a_program_compiled_only_to_be_read_is_compiled_cheaply_and_reads_the_same(monkeypatch):
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    workload = get_workload("gpt:tiny")
    static, _ = make_context(workload, None, mesh, objective="static", quiet=True)
    specs = baseline_candidates(workload, mesh)["fsdp"].specs(static.abstract_args)
    read_only = _evaluate.compiler_options(static)
    # LLVM at -O0, and XLA:CPU's legacy fusion emitters while jaxlib has them.
    legacy = jax.__version_info__ < (0, 11)
    assert read_only == {"xla_backend_optimization_level": 0,
                         **({"xla_cpu_use_fusion_emitters": False} if legacy else {})}
    asked = []
    compile_ = jax.stages.Lowered.compile

    def watched(lowered, compiler_options=None):
        asked.append(compiler_options)
        return compile_(lowered, compiler_options)

    def compile_with(options):
        monitored = ss.create_monitored_function(
            static.step, tuple(specs), static.analyzer, out_specs=(specs[0], PartitionSpec()),
            donate_argnums=(0,), compiler_options=options)
        return monitored.compile(*static.abstract_args)[0]

    monkeypatch.setattr(jax.stages.Lowered, "compile", watched)
    compiled, _seconds = _evaluate.compile_step(specs, static)
    assert asked == [read_only]
    # LLVM's level changes nothing the search reads (XLA:CPU's default is 2).
    same_emitters = compile_with({**read_only, "xla_backend_optimization_level": 2})
    assert _read(compiled.executable) == _read(same_emitters)
    if legacy:
        # The default emitters (these tests' XLA_FLAGS choose the legacy ones,
        # which the option overrides) form some fusions differently: another
        # HLO text, the same memory to a few hundred bytes, the same estimate
        # to 0.5% (0.13% at most on cpu-static64's programs).
        default = compile_with({"xla_backend_optimization_level": 2,
                                "xla_cpu_use_fusion_emitters": True})
        assert _read(default)[0] != _read(compiled.executable)[0]
        ours = XlaMemory.from_compiled(compiled.executable)
        theirs = XlaMemory.from_compiled(default)
        assert (ours.argument, ours.output, ours.alias) == (theirs.argument, theirs.output,
                                                             theirs.alias)
        assert abs(ours.temp - theirs.temp) <= 1024
        estimate = [_objectives.estimate_program(ProgramCost.from_compiled(e), static)[0]
                    for e in (compiled.executable, default)]
        assert estimate[0] == pytest.approx(estimate[1], rel=5e-3)

    # An objective that runs the step compiles at XLA's defaults, and so does
    # a chip's compiler.
    measured, _ = make_context(workload, None, mesh, objective="measured", quiet=True)
    assert _evaluate.compiler_options(measured) is None
    assert _evaluate.compiler_options(dataclasses.replace(static, target=object())) is None


def test_a_candidate_whose_cheap_compile_fails_is_compiled_at_xla_defaults(monkeypatch):
    mesh = ss.create_mesh((2, 4), ("dp", "tp"))
    workload = get_workload("gpt:tiny")
    static, _ = make_context(workload, None, mesh, objective="static", quiet=True)
    specs = baseline_candidates(workload, mesh)["dp"].specs(static.abstract_args)
    asked = []
    compile_ = jax.stages.Lowered.compile

    def refusing(lowered, compiler_options=None):
        asked.append(compiler_options)
        if compiler_options:
            raise RuntimeError("INTERNAL: the cheap emitters cannot do this")
        return compile_(lowered, compiler_options)

    monkeypatch.setattr(jax.stages.Lowered, "compile", refusing)
    with pytest.warns(ShardsearchWarning, match=r"read-only options .* failed \(RuntimeError: "
                                                r"INTERNAL: the cheap emitters.*compiled again"):
        compiled, seconds = _evaluate.compile_step(specs, static)
    assert asked == [_evaluate.compiler_options(static), None]
    assert compiled.memory_analysis().argument_size_in_bytes > 0 and seconds > 0

    # A measured context asks for no options, so its compile errors are its own.
    measured, _ = make_context(workload, None, mesh, objective="measured", quiet=True)
    asked.clear()

    def broken(lowered, compiler_options=None):
        asked.append(compiler_options)
        raise RuntimeError("INTERNAL: broken")

    monkeypatch.setattr(jax.stages.Lowered, "compile", broken)
    with pytest.raises(RuntimeError, match="broken"):
        _evaluate.compile_step(specs, measured)
    assert asked == [None]


def test_an_option_the_cpu_compiler_refuses_is_not_asked_for(monkeypatch):
    assert _evaluate._cpu_compiler_accepts({"xla_backend_optimization_level": 0})
    assert not _evaluate._cpu_compiler_accepts({"xla_cpu_no_such_option": False})
    if jax.__version_info__ >= (0, 11):
        return
    # Refused, the legacy emitters are left out, with a warning, once per process.
    monkeypatch.setattr(_evaluate, "_cpu_compiler_accepts", lambda options: False)
    _evaluate._read_only_cpu_options.cache_clear()
    try:
        with pytest.warns(ShardsearchWarning, match="refused.*default fusion emitters"):
            assert _evaluate._read_only_cpu_options() == (("xla_backend_optimization_level", 0),)
    finally:
        _evaluate._read_only_cpu_options.cache_clear()


# --------------------------------------------------------------------------- objectives


class TempBytes(Objective):
    """Scores a compiled program by XLA's temporary bytes: an objective from outside."""

    name = "temp-bytes"

    def score(self, candidate, ctx, report):
        return candidate.outcome(COMPLETE, value=float(candidate.program.memory.temp))


def test_the_built_in_objectives_say_what_the_search_does_with_them():
    measured, static = get_objective("measured"), get_objective("static")
    assert tuple(_objectives.OBJECTIVES) == ("measured", "static", "hybrid")
    assert (measured.needs_host_args, measured.prunes_while_timing, measured.confirms,
            measured.timed_in) == (True, True, True, "search")
    assert (static.needs_host_args, static.prunes_while_timing, static.confirms,
            static.timed_in) == (False, False, False, "estimate")
    assert get_objective(static) is static


def test_bad_objectives_are_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"objective='fast'; choose one of \('measured', "
                                         r"'static', 'hybrid'\)"):
        get_objective("fast")

    class Nameless(Objective):
        pass

    with pytest.raises(TypeError, match="objective Nameless has no name"):
        Nameless()

    class Impostor(TempBytes):
        name = "static"

    with pytest.raises(ValueError, match="has the name of the registered Static"):
        get_objective(Impostor())
    with pytest.raises(ValueError, match="'static' is taken by Static; give Impostor another"):
        register_objective(Impostor())


def test_an_objective_from_outside_the_package_is_what_evaluate_calls(mesh24, tmp_path):
    # mlp:tiny, the quickest to compile: what is tested is whose score is recorded.
    workload = get_workload("mlp:tiny")
    result = ss.optimize(workload.step, workload.abstract(), mesh=mesh24, n_trials=4,
                         objective=TempBytes(), storage=_storage(tmp_path), quiet=True)
    complete = [t.outcome for t in result.trials if t.outcome.status == "complete"]
    assert complete and all(o.value == o.memory["temp"] for o in complete)
    assert result.objective == "temp-bytes" and result.verdict == "unconfirmed"
    assert result.study.user_attrs["objective"] == "temp-bytes"
    assert "/temp-bytes/" in result.study.study_name
    # A process that does not know the objective still exports the study.
    config = ss.export_config(result.study, args=workload.abstract())
    assert config["results"]["winner"]["timed_in"] == "estimate"


def test_a_registered_objective_is_found_by_name(mesh24, monkeypatch):
    monkeypatch.setattr(_objectives, "OBJECTIVES", dict(_objectives.OBJECTIVES))
    register_objective(TempBytes())
    ctx, _ = make_context(get_workload("mlp:tiny"), None, mesh24, objective="temp-bytes")
    assert ctx.objective == TempBytes() and ctx.host_args is None
    specs, fp = _evaluate.resolve(baseline_candidates(None, mesh24)["replicated"], ctx)
    outcome = _evaluate.evaluate(specs, fp, ctx)
    assert outcome.status == "complete" and outcome.value == outcome.memory["temp"]


def test_run_false_stops_only_objectives_that_run_the_step(mesh24, monkeypatch):
    measured = []
    monkeypatch.setattr(_evaluate, "measure", lambda *a: measured.append(a))
    workload = get_workload("mlp:tiny")
    for name, has_value in (("measured", False), ("static", True)):
        ctx, _ = make_context(workload, None, mesh24, objective=name)
        specs, fp = _evaluate.resolve(baseline_candidates(None, mesh24)["default"], ctx)
        outcome = _evaluate.evaluate(specs, fp, ctx, run=False)
        assert outcome.status == "complete" and (outcome.value is not None) == has_value
        assert "total" in outcome.memory and outcome.flops > 0
    assert measured == []


# --------------------------------------------------------------------------- hardware model


def test_estimate_is_the_roofline_of_flops_bytes_and_link_bytes():
    collectives = CollectiveSummary((
        Collective("all-reduce", 4096, 4, 3, "body"),
        Collective("all-gather", 8192, 2, 1, "main"),
    ))
    hlo = HloCost(dot_flops=3e9, dot_flops_once=1e9, bytes_accessed=5e8,
                  bytes_accessed_once=2e8)
    program = ProgramCost(1.5e9, 4e8, collectives, hlo, XlaMemory(100, 50, 30, 20))
    assert (program.flops, program.bytes_accessed) == (3.5e9, 7e8)
    assert program.link_bytes == 2 * 3 / 4 * 4096 * 3 + 1 / 2 * 8192
    assert program.collectives.collectives[0].group_size == 4  # each collective is kept
    assert program.memory.total == 160
    for model in LEGACY.values():  # one link for every axis, as before topology
        old = (max(3.5e9 / model.flops_per_second, 7e8 / model.memory_bandwidth)
               + program.link_bytes / model.link_bandwidth)
        assert model.estimate(program) == pytest.approx(old, rel=1e-12)


def test_a_compilers_peak_is_the_total_where_given():
    listed = XlaMemory(100, 50, 30, 20)
    assert listed.total == 160 and "peak" not in listed.to_json()
    peaked = XlaMemory(100, 50, 30, 20, peak=400)
    assert peaked.total == 400 and peaked.to_json()["peak"] == 400
    with pytest.raises(ValueError, match=r"XlaMemory\.peak=-1"):
        XlaMemory(100, 50, 30, 20, peak=-1)


def _stats_on(platform, peak):
    stats = types.SimpleNamespace(argument_size_in_bytes=100, output_size_in_bytes=50,
                                  temp_size_in_bytes=30, alias_size_in_bytes=20,
                                  peak_memory_in_bytes=peak)
    device = types.SimpleNamespace(platform=platform)
    return types.SimpleNamespace(memory_analysis=lambda: stats,
                                 input_shardings=((types.SimpleNamespace(device_set=[device]),),
                                                  {}))


def test_the_peak_is_read_on_tpu_only_and_its_absence_there_is_warned():
    assert XlaMemory.from_compiled(_stats_on("tpu", 400)).total == 400
    assert XlaMemory.from_compiled(_stats_on("cpu", 4)).total == 160  # not a peak on CPU
    with pytest.warns(ShardsearchWarning, match="gave no peak_memory_in_bytes"):
        assert XlaMemory.from_compiled(_stats_on("tpu", 0)).total == 160


def test_a_compiled_programs_estimate_uses_its_loop_aware_figures(mesh24):
    ctx, _ = make_context(get_workload("gpt:tiny"), None, mesh24, objective="static")
    specs, fp = _evaluate.resolve(baseline_candidates(None, mesh24)["default"], ctx)
    outcome = _evaluate.evaluate(specs, fp, ctx)
    compiled, _seconds = _evaluate.compile_step(specs, ctx)
    program = ProgramCost.from_compiled(compiled)
    assert program.readable and program.memory.to_json() == {
        k: v for k, v in outcome.memory.items() if k not in ("arguments", "predicted")}
    assert (outcome.flops, outcome.collective_bytes) == (program.flops, program.link_bytes)
    cpu = HARDWARE["cpu"]
    assert outcome.value == pytest.approx(max(program.flops / cpu.flops_per_second,
                                              program.bytes_accessed / cpu.memory_bandwidth)
                                          + program.link_bytes / cpu.link_bandwidth, rel=1e-12)


def test_unreadable_hlo_fails_the_static_objective_only():
    program = ProgramCost.from_hlo("not HLO", 10.0, 20.0)
    assert not program.readable and "ENTRY" in program.hlo_error
    assert (program.flops, program.bytes_accessed, program.link_bytes) == (10.0, 20.0, None)
    with pytest.raises(ValueError, match="cannot estimate a program whose HLO could not be"):
        HARDWARE["cpu"].estimate(program)
    candidate = _evaluate.CompiledCandidate("ab12", (), None, program, 0.5, {"arguments": 8})
    ctx = dataclasses.make_dataclass("Ctx", ["mesh", "hardware"])(None, None)
    outcome = get_objective("static").score(candidate, ctx, None)
    assert outcome.status == "failed" and outcome.flops == 10.0
    assert outcome.reason.startswith("cannot read the compiled HLO: ")
    with pytest.raises(ValueError, match="give collectives and hlo when the HLO was read"):
        ProgramCost(1.0, 1.0, CollectiveSummary(), None)


@dataclasses.dataclass(frozen=True)
class CollectiveCount(HardwareModel):
    """A model from outside that charges one second per collective."""

    def estimate(self, program):
        return float(len(program.collectives.collectives))


def test_a_hardware_model_subclass_is_what_the_static_objective_asks(mesh24):
    model = CollectiveCount("count", 1.0, 1.0, 1.0)
    ctx, _ = make_context(get_workload("mlp:tiny"), None, mesh24, objective="static",
                          hardware=model)
    specs, fp = _evaluate.resolve(baseline_candidates(None, mesh24)["default"], ctx)
    outcome = _evaluate.evaluate(specs, fp, ctx)
    compiled, _seconds = _evaluate.compile_step(specs, ctx)
    assert outcome.value == len(ProgramCost.from_compiled(compiled).collectives.collectives)
