"""`shardsearch optimize`: search a workload's sharding on a mesh and write its plan."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..base.mesh import axes_text
from ..base.target import TARGET_CHIPS, target_of
from ..cost.chips import HARDWARE
from ..search.evaluation.context import EXECUTE_TIMEOUT
from ..search.evaluation.objectives import OBJECTIVES, Hybrid
from ..search.execution.distributed import DEFAULT_TIMEOUT as DEFAULT_LOCKSTEP_TIMEOUT
from .args import (
    Command,
    UsageError,
    WorkFailed,
    add_storage,
    count,
    device_count,
    positive_float,
    positive_int,
    read_file,
    rounds,
    study_name,
    usage,
    workload,
)
from .render import axes, axes_of, results_table
from .supervise import die_with_supervisor, run_supervised, supervised


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, metavar="NAME",
                   help="a built-in workload (gpt:small, llama:tiny, mlp:tiny, ...), a "
                        "shape of your own as llama:custom:SHAPE.json or gpt:custom:SHAPE.json "
                        "(a JSON object of layers, d_model, heads, d_ff, vocab, seq, batch, ...; "
                        "see docs/workloads.md), or a factory 'package.module:function' "
                        "returning a Workload")
    p.add_argument("--mesh", metavar="AXES",
                   help="mesh axes as name=size pairs, e.g. dp=2,tp=4 (one size may be -1: "
                        "the remaining devices)")
    p.add_argument("--axes", type=axis_list, metavar="AXES",
                   help="instead of --mesh: search the mesh's shape too, every split of the "
                        "devices (--devices N, default all) over these axes, e.g. dp,fsdp,tp; "
                        "each shape is its own study, the plan records the winner's")
    p.add_argument("--devices", type=device_count, metavar="N",
                   help="simulate N CPU devices (for trying meshes this machine lacks); with "
                        "--axes, the devices to split (with --target, the chip count)")
    p.add_argument("--trials", type=count, default=40, metavar="N",
                   help="trials to run, the baselines included (default 40)")
    p.add_argument("--timeout", type=positive_float, metavar="S",
                   help="stop starting trials after S seconds")
    p.add_argument("--budget", metavar="BYTES",
                   help="per-device memory budget, e.g. 16GiB (default: the device's memory "
                        "where JAX reports it, else none)")
    p.add_argument("--objective", choices=tuple(OBJECTIVES), default=None,
                   help="measured: median step time on the mesh (default); static: estimated "
                        "from the compiled program, nothing runs (the default with --target); "
                        "hybrid: every candidate estimated, only those near the best "
                        "estimates measured")
    p.add_argument("--target", choices=tuple(TARGET_CHIPS), metavar="CHIP",
                   help="compile every candidate with this chip's own compiler, without the "
                        f"chip ({', '.join(TARGET_CHIPS)}; needs the tpu or cuda extra): the "
                        "mesh is the chip's compile-only devices, memory verdicts are the "
                        "chip's; implies --hardware CHIP and --objective static (see "
                        "docs/targets.md)")
    p.add_argument("--topology", metavar="DIMS",
                   help="with --target: the chip's topology, e.g. 4x4x4 (TPU) or 1x12x8 "
                        "(GPU: slices x hosts x devices per host); default derived from the "
                        "mesh's device count")
    p.add_argument("--hardware", metavar="NAME|FILE",
                   help="the hardware model the static and hybrid objectives estimate with: "
                        f"one of {', '.join(HARDWARE)}, or a JSON model (what `shardsearch "
                        "calibrate` writes); default: the built-in one for the devices' "
                        "platform. For static, a model that states its memory (the named "
                        "chips) is the default --budget")
    p.add_argument("--dcn-axes", type=axis_list, default=(), metavar="AXES",
                   help="mesh axes whose devices sit on different hosts, e.g. dp or dp,pp: "
                        "the hardware model charges collectives over them at the network "
                        "between hosts (default: none)")
    p.add_argument("--hybrid-factor", type=at_least_one, metavar="X",
                   help=f"hybrid: measure candidates whose estimate is within X times the best "
                        f"estimate so far (default {Hybrid.factor:g})")
    p.add_argument("--hybrid-top-k", type=count, metavar="K",
                   help=f"hybrid: also measure the K smallest estimates so far (default "
                        f"{Hybrid.top_k})")
    p.add_argument("--space", choices=("rules", "logical", "both"), default="both",
                   help="rules: the seed rules (auto, memory); logical: one assignment of the "
                        "step's logical axes (heads, mlp, ...) to mesh axes; both: the search "
                        "picks the family per trial (default)")
    p.add_argument("--knobs", nargs="?", const=True, default=None, type=knob_list,
                   metavar="NAMES",
                   help="search the workload's step knobs too (remat policy, microbatches): "
                        "all of them, or those named (e.g. --knobs remat); the plan file "
                        "records the chosen values")
    p.add_argument("--memory-prediction", choices=("cut", "record", "off"), default="cut",
                   help="cut: predict each candidate's memory from the step's jaxpr and, once "
                        "three compiled candidates calibrated it, cut those over the budget "
                        "before compiling (default); record: predict and record only; off")
    p.add_argument("--start-from", action="append", default=[], metavar="PLAN",
                   help="a plan file to evaluate beside the baselines, labelled "
                        "plan:<file name> (an earlier winner, another space's, a smaller "
                        "model's); repeat for several")
    add_storage(p)
    p.add_argument("--study", type=study_name, metavar="NAME",
                   help="study name (default from workload, mesh, objective and shapes); the "
                        "same name and storage resume a study")
    p.add_argument("--seed", type=count, default=0, metavar="N",
                   help="sampler seed (default 0)")
    p.add_argument("--out", metavar="FILE",
                   help="plan file to write (default ./shardsearch-<workload>-<mesh>.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true",
                   help="print XLA's log lines of each candidate (always counted in the study "
                        "and the plan's results; `show` prints the first)")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="compile and run candidates in a supervised worker process, so one "
                        "that crashes or hangs fails alone (default: on when the step can "
                        "reach a worker; --no-isolate runs them in this process)")
    p.add_argument("--execute-timeout", type=positive_float, default=EXECUTE_TIMEOUT,
                   metavar="S",
                   help="an isolated candidate that finishes no step for S seconds fails "
                        "(default %(default)s)")
    p.add_argument("--compile-cache", default=".shardsearch/jax-cache", metavar="DIR",
                   help="JAX's persistent compilation cache, so a resumed study compiles "
                        "from disk (default: %(default)s)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="leave JAX's compilation cache settings alone")
    processes = p.add_argument_group(
        "several processes (one mesh over several hosts; `shardsearch launch` tries it on one)")
    processes.add_argument("--coordinator", metavar="HOST:PORT",
                           help="process 0's address, the same in every process (default: "
                                "JAX_COORDINATOR_ADDRESS, as jax.distributed.initialize "
                                "reads it)")
    processes.add_argument("--num-processes", type=positive_int, metavar="N",
                           help="how many processes run this search (default: from the "
                                "cluster environment JAX detects: Slurm, Open MPI, TPU)")
    processes.add_argument("--process-id", type=count, metavar="I",
                           help="this process's index, 0 to N-1; process 0 records the study "
                                "and writes the plan (default: from the cluster environment)")
    processes.add_argument("--lockstep-timeout", type=positive_float, metavar="S",
                           help="seconds a process waits for a silent peer before the run "
                                "stops with exit code 1 (default "
                                f"{DEFAULT_LOCKSTEP_TIMEOUT:g})")
    timing = p.add_argument_group("timing")
    timing.add_argument("--warmup", type=count, default=2, metavar="N",
                        help="untimed steps per candidate (default 2)")
    timing.add_argument("--repeats", type=positive_int, default=7, metavar="N",
                        help="timed steps per candidate (default 7)")
    timing.add_argument("--confirm-rounds", type=rounds, default=10, metavar="N",
                        help="interleaved re-timing rounds of the finalists (default 10; 0 "
                             "skips)")


def run(a: argparse.Namespace) -> int:
    several = distributed_requested(a)
    if (a.mesh is None) == (a.axes is None):
        raise UsageError("give --mesh dp=2,tp=4 (one shape) or --axes dp,tp (search the "
                         "shape too), one of them")
    if a.axes is not None and several:
        raise UsageError(f"--axes {','.join(a.axes)} searches the shapes of one process's "
                         "devices; across processes give --mesh")
    if a.axes is not None and a.target is not None and a.devices is None \
            and a.topology is None:
        raise UsageError(f"--axes {','.join(a.axes)} with --target {a.target}: give the chip "
                         "count to split, --devices N (or --topology)")
    if a.objective is None:
        a.objective = "static" if a.target else "measured"
    if a.topology is not None and a.target is None:
        raise UsageError(f"--topology {a.topology} is the topology of a --target chip; add "
                         "--target CHIP or drop it")
    if a.target is not None:
        if several:
            raise UsageError(f"--target {a.target} compiles in one process (its devices run "
                             "nothing); drop the options that start several processes")
        # Nothing runs on a target's devices: keep JAX from starting a plugin
        # for an accelerator this machine lacks (unless the user chose).
        if not os.environ.get("JAX_PLATFORMS"):
            import jax

            jax.config.update("jax_platforms", "cpu")
    if several and a.isolate:
        raise UsageError("--isolate is not available across processes (a worker cannot join "
                         "the mesh); drop it")
    if several and not supervised():
        # JAX aborts a process whose coordinator died; from outside it, that
        # still ends with our exit code and message (`cli.supervise`).
        return run_supervised(a.argv, "shardsearch optimize")
    if several:
        die_with_supervisor()
    if a.isolate is not False and not several:
        # On GPUs a study process that preallocates leaves its worker little memory.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # Before anything asks JAX for devices: the count is fixed at backend start.
    if a.devices is not None:
        simulate_devices(a.devices)
    if not several:
        return search(a, several)
    join_processes(a)
    try:
        code = search(a, several)
    except BaseException as err:  # every way out of one of several processes
        leave_processes(err)
        raise
    # Together, so JAX's shutdown barrier finds every process there.
    import jax

    jax.distributed.shutdown()
    return code


def search(a: argparse.Namespace, several: bool) -> int:
    """`run` once JAX is set up: the search, then the plan (process 0)."""
    from ..base.mesh import parse_mesh
    from ..base.units import parse_bytes
    from ..search.loop import optimize
    from ..search.study.storage import default_storage

    dims, names = usage(parse_mesh, a.mesh) if a.mesh is not None else (None, a.axes)
    budget = usage(parse_bytes, a.budget) if a.budget is not None else None
    unknown = [axis for axis in a.dcn_axes if axis not in names]
    if unknown:
        given = f"--mesh {a.mesh}" if a.mesh is not None else f"--axes {','.join(a.axes)}"
        raise UsageError(f"--dcn-axes {','.join(a.dcn_axes)}: {', '.join(map(repr, unknown))} "
                         f"is not an axis of {given} (axes: {', '.join(names)})")
    objective = objective_option(a)
    hardware = hardware_option(a.hardware or a.target, objective)
    chosen = workload(a.workload)
    if a.out is not None and Path(a.out).is_dir():
        raise UsageError(f"--out {a.out} is a directory; give a file name")
    if dims is None:
        return search_shapes(a, chosen, budget, objective, hardware)
    mesh = (make_target_mesh(a.target, dims, names, a.topology, a.dcn_axes) if a.target
            else make_mesh(dims, names))
    out = Path(a.out or f"shardsearch-{slug(chosen.name)}-{slug(axes(mesh))}.json")
    storage = a.storage or default_storage()
    n = mesh.devices.size
    if several:
        from ..search.execution.distributed import Distributed

        distributed = Distributed(timeout=a.lockstep_timeout or DEFAULT_LOCKSTEP_TIMEOUT)
        rank = process_index()
        if rank != 0:
            print(f"process {rank}: following process 0 on mesh {axes(mesh)} ({n} devices)",
                  flush=True)
    else:
        distributed = rank = None
    if not rank:
        devices = (f"{n} {mesh.devices.flat[0].platform} devices" if a.target is None
                   else f"compiled for {target_of(mesh).describe()}")
        print(f"shardsearch {__version__}: {chosen.name} on mesh {axes(mesh)} ({devices}), "
              f"{a.trials} trials, objective {a.objective}", flush=True)
    result = searched(lambda: optimize(
        chosen, mesh=mesh, **options(a, budget, objective, hardware, storage),
        isolate=False if several else a.isolate,
        **({"distributed": distributed} if several else {})), storage)
    if result is None:  # another process than 0: that one records and writes
        print(f"process {rank}: done; process 0 wrote the plan", flush=True)
        return 0
    return write_plan(result, chosen, out, storage)


def options(a: argparse.Namespace, budget: int | None, objective: Any, hardware: Any,
            storage: str) -> dict[str, Any]:
    """`optimize`'s keywords from the command line, but the mesh and the executor's."""
    return dict(
        n_trials=a.trials, timeout=a.timeout, memory_budget=budget, objective=objective,
        storage=storage, study_name=a.study, seed=a.seed, warmup=a.warmup,
        repeats=a.repeats, confirm_rounds=a.confirm_rounds,
        compile_cache=None if a.no_compile_cache else a.compile_cache, quiet=a.quiet,
        space=a.space, execute_timeout=a.execute_timeout, verbose=a.verbose,
        hardware=hardware, dcn_axes=a.dcn_axes, start_from=a.start_from, knobs=a.knobs,
        memory_prediction=a.memory_prediction)


def search_shapes(a: argparse.Namespace, chosen: Any, budget: int | None, objective: Any,
                  hardware: Any) -> int:
    """`--axes`: the shape searched too (`search.shapes`), then the plan."""
    import jax

    from ..base.target import Target, TargetUnavailable, target_mesh
    from ..search.loop import optimize
    from ..search.study.storage import default_storage

    storage = a.storage or default_storage()
    if a.target is not None:
        n = a.devices or usage(Target, a.target, a.topology).device_count

        def make(shape: Any) -> Any:
            # A shape the chip cannot lay out is pruned (ValueError), not a usage error.
            try:
                return target_mesh(a.target, dict(shape), topology=a.topology,
                                   dcn_axes=tuple(a.dcn_axes))
            except TargetUnavailable as err:
                raise UsageError(str(err)) from None
        where = f"{a.target}'s compile-only devices"
    else:
        n, make = a.devices or len(jax.devices()), None
        where = f"{jax.devices()[0].platform} devices"
    print(f"shardsearch {__version__}: {chosen.name}, the mesh's shape searched too: {n} "
          f"{where} over {','.join(a.axes)}, {a.trials} trials, objective {a.objective}",
          flush=True)
    result = searched(lambda: optimize(
        chosen, devices=n, axes=a.axes, make_mesh=make,
        **options(a, budget, objective, hardware, storage), isolate=a.isolate), storage)
    assert result is not None and result.shapes is not None  # one process
    print(shapes_table(result.shapes))
    out = Path(a.out or f"shardsearch-{slug(chosen.name)}-{slug(axes_text(result.mesh_axes))}.json")
    return write_plan(result, chosen, out, storage)


def shapes_table(shapes: dict[str, Any]) -> str:
    """One line per shape: searched (its winner, time, trials) or pruned (why)."""
    lines = [f"mesh shapes ({shapes['verdict']}):"]
    for text, row in shapes["searched"].items():
        retimed = row.get("retimed")
        timing = (f"re-timed median {retimed['median'] * 1e3:.3f} ms" if retimed
                  else f"{row['best_time'] * 1e3:.3f} ms")
        mark = "*" if text == shapes["chosen"] else " "
        lines.append(f" {mark} {text:<22} {row['best_label']:<18} {timing}, "
                     f"{row['trials']} trials")
    lines += [f"   {text:<22} pruned: {why}" for text, why in shapes["pruned"].items()]
    lines += [f"   {text:<22} nothing completed: {why}"
              for text, why in shapes.get("failed", {}).items()]
    return "\n".join(lines)


def searched(run: Any, storage: str) -> Any:
    """`run()`, an `optimize` call, with its errors as the command line reports them."""
    from ..search.study.storage import is_resumable

    try:
        return run()
    except ValueError as err:  # optimize checks its inputs before any trial
        raise UsageError(str(err)) from None
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: main says what is kept
        note = (f"finished trials are kept in the study, {kept(storage)}"
                if is_resumable(storage)
                else "the study was in memory and is gone")
        # A lost process (`search.distributed.PeerLost`) says which, first.
        stop.args = (f"{stop}; {note}" if str(stop) else note,)
        raise
    except (RecursionError, NotImplementedError):
        raise  # bugs, not failed work: keep their traceback
    except RuntimeError as err:  # no candidate completed; XLA failing on the devices
        raise WorkFailed(str(err)) from None


def kept(storage: str) -> str:
    """What becomes of a study in `storage` after this process."""
    from ..search.study.storage import is_resumable

    return ("the same command resumes it" if is_resumable(storage)
            else "in memory: it ends with this process")


def write_plan(result: Any, chosen: Any, out: Path, storage: str) -> int:
    """Writes the winner's plan file and says where the study is."""
    from ..base.secrets import redact_url as redact
    from ..plan.writer import write_config
    from ..search.export import export_config

    config = export_config(result, workload=chosen)
    try:
        written = write_config(config, out)
    except OSError as err:
        raise WorkFailed(
            f"the search finished but {out} could not be written ({err}); export it with "
            f"`shardsearch export --study '{result.study.study_name}' --storage "
            f"'{redact(storage)}' --out FILE`") from None
    print(results_table(config))
    print(f"study: {result.study.study_name!r} in {redact(storage)} ({kept(storage)})")
    print(f"wrote {written}")
    return 0


def distributed_requested(a: argparse.Namespace) -> bool:
    """Whether this run is one of several processes: any of the flags given,
    or JAX_COORDINATOR_ADDRESS set (as for `jax.distributed.initialize`)."""
    given = (a.coordinator, a.num_processes, a.process_id, a.lockstep_timeout)
    return any(v is not None for v in given) or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


def join_processes(a: argparse.Namespace) -> None:
    """Joins the other processes (`search.distributed.initialize`), before
    JAX starts: `--devices` is then the count of each process."""
    from ..search.execution.distributed import initialize

    if a.num_processes is not None and a.process_id is not None and \
            a.process_id >= a.num_processes:
        raise UsageError(f"--process-id {a.process_id} must be below --num-processes "
                         f"{a.num_processes} (processes count from 0)")
    try:
        initialize(a.coordinator, a.num_processes, a.process_id,
                   timeout=a.lockstep_timeout or DEFAULT_LOCKSTEP_TIMEOUT)
    except ValueError as err:
        raise UsageError(str(err)) from None


def process_index() -> int:
    import jax

    return jax.process_index()


def leave_processes(err: BaseException) -> None:
    """How one of several processes ends on an error: the others are told at
    once (`search.distributed.announce_exit`), then this one leaves with its
    exit code and one line on stderr, without JAX's shutdown barrier, which
    would wait for processes that are gone. Ctrl-C and SIGTERM are left to
    `main` (every process got the signal)."""
    from ..search.execution.distributed import PeerLost, announce_exit

    if isinstance(err, KeyboardInterrupt) and not isinstance(err, PeerLost):
        announce_exit("it was interrupted")
        return
    code = 2 if isinstance(err, UsageError) else \
        int(err.code or 0) if isinstance(err, SystemExit) else 1
    message = " | ".join(line.strip() for line in str(err).splitlines() if line.strip())
    announce_exit(message or type(err).__name__)
    if not isinstance(err, UsageError | WorkFailed | PeerLost | SystemExit):
        import traceback

        traceback.print_exception(err)
    sys.stdout.flush()
    sys.stderr.write(f"shardsearch optimize: error: {message}\n")
    sys.stderr.flush()
    os._exit(code)


def objective_option(a: argparse.Namespace) -> Any:
    """The objective `--objective` and the hybrid options name: its name, or a
    `Hybrid` with the settings given."""
    hybrid = {k: v for k, v in (("factor", a.hybrid_factor), ("top_k", a.hybrid_top_k))
              if v is not None}
    if not hybrid:
        return a.objective
    if a.objective != Hybrid.name:
        given = " and ".join(f"--hybrid-{k.replace('_', '-')}" for k in hybrid)
        raise UsageError(f"{given} set the hybrid objective; add --objective hybrid (the "
                         f"objective is {a.objective})")
    return usage(Hybrid, **hybrid)


def hardware_option(text: str | None, objective: Any) -> Any:
    """The `HardwareModel` `--hardware` names: a built-in by name, or a JSON file.

    A file that cannot be read, or holds a missing or wrong field, is a usage
    error naming the file and the field.
    """
    if text is None:
        return None
    from ..search.evaluation.objectives import get_objective

    if not get_objective(objective).uses_hardware:
        raise UsageError(f"--hardware {text}: objective {get_objective(objective).name!r} "
                         "estimates nothing; use --objective static or hybrid")
    if text in HARDWARE:
        return HARDWARE[text]
    if not Path(text).exists():
        raise UsageError(f"--hardware {text}: neither a built-in model ({', '.join(HARDWARE)}) "
                         "nor a file; give a name or the path of a JSON model (`shardsearch "
                         "calibrate --out FILE` writes one)")
    from ..cost.hardware import HardwareModel

    return read_file(HardwareModel.load, text)


def axis_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated axis names ("dp,pp" → ("dp", "pp"))."""
    return _names(text, "axis", "dp or dp,pp")


def knob_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated knob names ("remat,microbatches")."""
    return _names(text, "knob", "remat or remat,microbatches")


def _names(text: str, what: str, example: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"not a list of {what} names: {text!r}; e.g. "
                                         f"{example}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a{'n' if what[0] in 'aeiou' else ''} {what} is "
                                         f"named twice in {text!r}")
    return names


def at_least_one(text: str) -> float:
    """An argparse type: a finite number >= 1 ("1.5" → 1.5; "0.9" is refused)."""
    value = positive_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def simulate_devices(n: int) -> None:
    """Makes JAX start with `n` simulated CPU devices; too late is a usage error."""
    import jax

    from ..base.mesh import use_cpu_devices

    # Simulated devices are CPU devices: keep an accelerator from becoming the default.
    jax.config.update("jax_platforms", "cpu")
    try:
        use_cpu_devices(n)
    except (RuntimeError, ValueError) as err:
        raise UsageError(str(err)) from None


def make_mesh(dims: Sequence[int], names: Sequence[str]) -> Any:
    """The mesh on JAX's first devices; more devices than there are is a usage error."""
    import jax

    from ..base.mesh import create_mesh

    devices = jax.devices()
    if -1 not in dims and math.prod(dims) < len(devices):
        devices = devices[:math.prod(dims)]  # a smaller mesh runs on the first devices
    if -1 not in dims and math.prod(dims) > len(devices):
        raise UsageError(
            f"mesh {axes_of(dims, names)} needs {math.prod(dims)} devices but there are "
            f"{len(devices)}; shrink the mesh or simulate more with --devices "
            f"{math.prod(dims)}")
    return usage(create_mesh, dims, names, devices)


def make_target_mesh(chip: str, dims: Sequence[int], names: Sequence[str],
                     topology: str | None, dcn_axes: Sequence[str]) -> Any:
    """The mesh over `chip`'s compile-only devices (`base.target.target_mesh`);
    bad sizes, a bad topology or a missing plugin are usage errors."""
    from ..base.target import Target, TargetUnavailable, target_chip, target_mesh

    if -1 in dims:
        if topology is None:
            raise UsageError(f"--mesh {axes_of(dims, names)}: with --target a size of -1 "
                             "needs --topology, which fixes the device count; give every size")
        total = usage(Target, chip, topology).device_count
        if target_chip(chip).platform == "tpu":
            total *= math.prod(d for d, n in zip(dims, names, strict=True) if n in dcn_axes)
        known = math.prod(d for d in dims if d != -1)
        if total % known:
            raise UsageError(f"--mesh {axes_of(dims, names)}: the other axes do not divide "
                             f"the {total} devices of topology {topology}")
        dims = [total // known if d == -1 else d for d in dims]
    try:
        return target_mesh(chip, dict(zip(names, dims, strict=True)), topology=topology,
                           dcn_axes=tuple(dcn_axes))
    except (ValueError, TargetUnavailable) as err:
        raise UsageError(str(err)) from None


def slug(text: str) -> str:
    """Text fit for a file name: "dp=2,tp=4" → "dp2-tp4", "mlp:tiny" → "mlp-tiny"."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", text.replace("=", "")).strip("-")


COMMAND = Command("optimize", "search for the fastest sharding of a workload and write its plan",
                  add_arguments, run)
