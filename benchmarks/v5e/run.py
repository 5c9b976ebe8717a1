"""The TPU v5e target against one real v5e chip: deviceless compiles, device compiles, timed steps.

The TPU twin of `benchmarks/h200/run.py`, whose helpers it borrows (the
jitted step, memory fields, op counts, materialised arguments, timed steps).
A variant is a workload and its knobs (`Workload.knobs`); on one device every
sharding plan is the same program, so the knobs are what differ. Here, on a
machine without a TPU (libtpu compiles for a chip it does not have):

    python benchmarks/v5e/run.py deviceless benchmarks/results/v5e/raw

On a machine with one v5e chip, with jax, jaxlib and libtpu installed and
shardsearch's other dependencies on PYTHONPATH (their wheels made here by
`python benchmarks/v5e/wheels.py`, installed there with `pip install
--no-index --no-deps --target /tmp/site .whl-tpu/*.whl`; the whole command
in `benchmarks/results/v5e/notes.md`):

    PYTHONPATH=$PYTHONPATH:/tmp/site:$PWD python3 benchmarks/v5e/run.py device OUT

(about 8 minutes: `--budget`, default 490 s, bounds it).

Then `python benchmarks/v5e/report.py RAW benchmarks/results/v5e/v5e.md`
(RAW: the deviceless files and the device's, in one folder) makes the tables.

What each writes (a folder of at most 8 files, JSON written as it goes so a
run cut short keeps what it did):

- `deviceless` (JAX_PLATFORMS=cpu): every variant compiled for one v5e chip
  by libtpu (`deviceless.json`: the compiler's memory analysis, cost
  analysis, op counts, compile seconds, the compiler's refusal when a
  variant does not fit, the static model's estimate of the program, HLO in
  `hlo-deviceless.tar.gz`); then the search's own pipeline (`make_context`
  + `evaluate`, objective "static", `hardware=HARDWARE["tpu-v5e"]`) on the
  replicated plan with each variant's knobs.
- `device`: in one process (each process that opens the chip costs ~15 s),
  the same variants compiled for the real chip (a Mesh over
  `jax.devices()[:1]`) and run: warm-up steps, then timed steps, each fed
  the state the last one returned (donated); a variant that does not fit is
  recorded as failed. Then the search's pipeline on the chip with objective
  "hybrid": it prices the compiled program exactly as "static" does
  (`estimate_program`) and then times it exactly as "measured" does
  (`measure`: warm-up 2, repeats 7, the median), so one compile gives both.
  Then, the chip released, the deviceless compiles again on the device's
  machine (`deviceless-there.json`, its libtpu), if time is left.
  `--platform cpu` runs all of it on this machine's CPU (a smoke run).

Both deviceless meshes, the compiles' and the pipeline's, are
`shardsearch.target_mesh("tpu-v5e", {"dp": 1})`: libtpu's `v5e:1x1`
topology on a host of one chip, recorded in `deviceless.json` (`about.mesh`);
the device's own host bounds are in `device.json` (`about.env`). Before
32e99d4 `target_mesh` could not make a one-chip v5e (libtpu refused
topologies smaller than a 2x2x1 host).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

CHIP = "tpu-v5e"
# A 400M-parameter Llama (12 blocks of width 1536, 12 query heads of 128, 4
# KV heads, SwiGLU 4096, 32k vocabulary) trained on 8 x 2048 tokens in
# bfloat16 with float32 Adam: its state is 4.5 GiB and, deviceless, its step
# needs 9.4 GiB of the chip's 15.75 at its peak with full remat (the
# default), 14.4 GiB with selective remat (close to the chip: a test of the
# deviceless verdict), 9.2 GiB with 2 microbatches; keeping every activation
# (remat "none") needs 50 GiB of temporaries, which libtpu refuses.
LLAMA = dict(layers=12, d_model=1536, heads=12, kv_heads=4, d_ff=4096, vocab=32000,
             seq=2048, batch=8, compute_dtype="bfloat16")
LLAMA_NAME = "llama-400m"
# (workload, knobs): the step as given first, then each knob on its own.
VARIANTS = (
    ("gpt:small", {}),
    ("gpt:small", {"microbatches": 2}),
    (LLAMA_NAME, {}),
    (LLAMA_NAME, {"remat": "selective"}),
    (LLAMA_NAME, {"remat": "none"}),
    (LLAMA_NAME, {"microbatches": 2}),
)
# The packages whose versions say which compiler and runtime a figure came from.
PACKAGES = ("jax", "jaxlib", "libtpu", "libtpu-nightly", "numpy", "scipy", "ml_dtypes",
            "optuna")
# Environment variables that steer libtpu or XLA, recorded where they are set.
ENV_NAMES = ("JAX_PLATFORMS", "XLA_FLAGS", "LIBTPU_INIT_ARGS", "TPU_ACCELERATOR_TYPE",
             "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS",
             "TPU_PROCESS_BOUNDS", "TPU_VISIBLE_CHIPS", "TPU_SKIP_MDS_QUERY",
             "TPU_WORKER_HOSTNAMES", "ALLOW_MULTIPLE_LIBTPU_LOAD")
# Seconds a phase keeps in hand: it starts no variant with less than this left.
MARGIN = 40.0


def _load_h200():
    """benchmarks/h200/run.py as a module (both scripts are called run.py)."""
    path = Path(__file__).resolve().parent.parent / "h200" / "run.py"
    spec = importlib.util.spec_from_file_location("h200_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_H200 = _load_h200()
key, hlo_name, jitted = _H200.key, _H200.hlo_name, _H200.jitted
gib, hlo_texts = _H200.gib, _H200.hlo_texts
memory, ops, materialize, time_steps = _H200.memory, _H200.ops, _H200.materialize, _H200.time_steps


def get(name: str):
    from shardsearch.workloads import get_workload

    return get_workload("llama:custom", **LLAMA) if name == LLAMA_NAME else get_workload(name)


def wanted(only: str | None) -> list[tuple[str, dict]]:
    return [(name, knobs) for name, knobs in VARIANTS if only is None or name == only]


def versions() -> dict[str, str]:
    import shardsearch as ss

    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "missing"
    found["shardsearch"] = ss.__version__
    return found


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def about_devices(devices) -> dict:
    d = devices[0]
    out = {"device_count": len(devices), "devices": [str(x) for x in devices[:8]],
           "device_kind": d.device_kind, "platform": d.platform}
    for attr in ("coords", "core_on_chip", "num_cores"):
        value = getattr(d, attr, None)
        out[attr] = None if value is None else str(value)
    try:
        out["platform_version"] = d.client.platform_version
    except Exception as err:  # compile-only devices have no client to ask
        out["platform_version"] = f"({type(err).__name__}: {err})"[:300]
    return out


def about() -> dict:
    return {"argv": sys.argv[1:], "python": sys.version.split()[0], "versions": versions(),
            "commit": commit(),
            "env": {k: os.environ[k] for k in ENV_NAMES if k in os.environ},
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def cost(compiled) -> dict:
    """`cost_analysis()`'s whole-program figures (flops, bytes accessed,
    optimal_seconds, transcendentals), without the per-operand ones
    ("bytes accessed0{}", "utilization3{}", ...)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else {}
    return {k: float(v) for k, v in sorted((analysis or {}).items())
            if isinstance(v, int | float) and "{" not in k}


def estimate(compiled) -> dict:
    """The static objective's model on this program: `HardwareModel.breakdown`
    of tpu-v5e on a one-device mesh, as `evaluate` prices a candidate."""
    import shardsearch as ss
    from shardsearch.search import ProgramCost, Topology

    program = ProgramCost.from_compiled(compiled)
    parts = ss.HARDWARE[CHIP].breakdown(program, Topology(("dp",), (1,)))
    return {**parts.to_json(), "flops": program.flops, "bytes": program.bytes_accessed,
            "compiler_seconds": program.compiler_seconds}


def refusal(text: str) -> str | None:
    """The compiler's words when it refused a program over the chip's memory."""
    if "RESOURCE_EXHAUSTED" not in text:
        return None
    return next(line for line in text.splitlines() if "RESOURCE_EXHAUSTED" in line).strip()


def compile_variant(name: str, knobs: dict, mesh, label: str, out: Path, run: bool,
                    workload=None) -> dict:
    """One variant compiled for `mesh` (and run on it when `run`); its record.
    `workload`: the workload to use instead of `get(name)`."""
    import gzip

    workload = get(name) if workload is None else workload
    rec: dict = {"workload": name, "knobs": knobs, "flops_per_step": workload.flops_per_step,
                 "n_params": workload.n_params}
    fn, abstract = jitted(workload, knobs, mesh)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        compiled = fn.lower(*abstract).compile()
    except Exception as err:
        text = f"{type(err).__name__}: {err}"
        rec.update(compile_seconds=time.perf_counter() - wall,
                   compile_cpu_seconds=time.process_time() - cpu, error=text[:6000],
                   refused=refusal(text), stage="compile")
        return rec
    rec["compile_seconds"] = time.perf_counter() - wall
    rec["compile_cpu_seconds"] = time.process_time() - cpu
    rec["memory"] = memory(compiled)
    rec["cost"] = cost(compiled)
    hlo = compiled.as_text()
    rec["ops"] = ops(hlo)
    rec["hlo_sha256"] = hashlib.sha256(hlo.encode()).hexdigest()
    (out / "hlo").mkdir(exist_ok=True)
    with gzip.open(out / "hlo" / f"{hlo_name(label, key(name, knobs))}.txt.gz", "wt") as f:
        f.write(hlo)
    try:
        rec["estimate"] = estimate(compiled)
    except Exception as err:
        rec["estimate_error"] = f"{type(err).__name__}: {err}"[:2000]
    if run:
        try:
            rec.update(time_steps(compiled, abstract))
        except Exception as err:
            rec.update(error=f"{type(err).__name__}: {err}"[:6000], stage="run",
                       traceback=traceback.format_exc()[-3000:])
    return rec


def compile_all(records: dict, save, mesh, label: str, out: Path, run: bool,
                only: str | None, until: float) -> None:
    import jax

    for name, knobs in wanted(only):
        k = key(name, knobs)
        if time.time() > until - MARGIN:
            records[k] = {"workload": name, "knobs": knobs, "skipped": "out of time"}
            save()
            continue
        try:
            rec = compile_variant(name, knobs, mesh, label, out, run)
        except Exception as err:
            rec = {"workload": name, "knobs": knobs, "error": f"{type(err).__name__}: {err}"[:3000],
                   "traceback": traceback.format_exc()[-3000:], "stage": "setup"}
        records[k] = rec
        save()
        print(label, k, {x: rec.get(x) for x in ("compile_seconds", "median_seconds", "refused",
                                                 "error")}, flush=True)
        jax.clear_caches()


def host_args(workload):
    """Concrete arguments kept on the host: the measured objective places
    fresh copies itself, so no device buffer is held beside them."""
    import jax
    import numpy as np

    return jax.tree.map(np.asarray, jax.device_get(materialize(workload.abstract())))


def product(records: dict, save, mesh, objective: str, only: str | None, until: float) -> None:
    """The search's own pipeline (`make_context` + `evaluate`) on the
    replicated plan, each variant's knobs set on the candidate."""
    import shardsearch as ss
    from shardsearch.search import Candidate, evaluate, make_context, resolve
    from shardsearch.workloads import expert_plan

    names = list(dict.fromkeys(name for name, _ in wanted(only)))
    for name in names:
        variants = [knobs for n, knobs in wanted(only) if n == name]
        if time.time() > until - MARGIN:
            for knobs in variants:
                records[key(name, knobs)] = {"skipped": "out of time"}
            save()
            continue
        try:
            workload = get(name)
            searched = tuple(dict.fromkeys(n for knobs in variants for n in knobs))
            args = None if objective == "static" else host_args(workload)
            ctx, _ = make_context(workload, args, mesh, objective=objective,
                                  hardware=ss.HARDWARE[CHIP], knobs=searched or False)
            plan = expert_plan(workload, mesh, "replicated")
        except Exception as err:
            for knobs in variants:
                records[key(name, knobs)] = {"error": f"{type(err).__name__}: {err}"[:3000],
                                             "traceback": traceback.format_exc()[-3000:]}
            save()
            continue
        with ctx:
            for knobs in variants:
                k = key(name, knobs)
                if time.time() > until - MARGIN:
                    records[k] = {"skipped": "out of time"}
                    save()
                    continue
                try:
                    setting = workload.knobs.setting(knobs)
                    candidate = Candidate(plan.state_rule, plan.batch_rule, "replicated",
                                          knobs=setting)
                    specs, fp = resolve(candidate, ctx)
                    start = time.perf_counter()
                    outcome = evaluate(specs, fp, ctx.with_setting(setting))
                    rec = {"objective": objective, "seconds": time.perf_counter() - start,
                           "status": str(outcome.status), "cut_stage": str(outcome.cut_stage),
                           "reason": outcome.reason, "value": outcome.value,
                           "estimate": outcome.estimate, "breakdown": outcome.breakdown,
                           "compiler_estimate": outcome.compiler_estimate,
                           "memory": outcome.memory, "flops": outcome.flops,
                           "step_times": list(outcome.step_times),
                           "warmup_times": list(outcome.warmup_times),
                           "compile_seconds": outcome.compile_seconds,
                           "notes": [str(n) for n in outcome.notes]}
                except Exception as err:
                    rec = {"error": f"{type(err).__name__}: {err}"[:3000],
                           "traceback": traceback.format_exc()[-3000:]}
                records[k] = rec
                save()
                print("product", objective, k, {x: rec.get(x) for x in
                                                ("status", "value", "estimate", "error")},
                      flush=True)


def writer(path: Path, whole: dict):
    def save() -> None:
        path.write_text(json.dumps(whole, indent=1, default=str))
    return save


def phase_deviceless(out: Path, label: str, only: str | None, until: float,
                     with_product: bool) -> None:
    """Every variant compiled for one deviceless v5e chip, then the pipeline's
    static estimate on the same mesh."""
    import shardsearch as ss
    from shardsearch.search import target_of

    whole: dict = {"about": about(), "variants": {}, "product": {}}
    save = writer(out / f"{label}.json", whole)
    mesh = ss.target_mesh(CHIP, {"dp": 1})
    whole["about"]["mesh"] = {"target": target_of(mesh).to_json(),
                              **about_devices(list(mesh.devices.flat))}
    save()
    compile_all(whole["variants"], save, mesh, label, out, run=False, only=only, until=until)
    if with_product:
        product(whole["product"], save, mesh, "static", only, until)
        save()


def phase_device(out: Path, only: str | None, until: float, objective: str) -> None:
    """The variants compiled for the chip this process holds and run; then the
    pipeline's estimate and measurement on it."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    whole: dict = {"about": about(), "variants": {}, "product": {}}
    save = writer(out / "device.json", whole)
    devices = jax.devices()
    whole["about"]["mesh"] = about_devices(devices)
    stats = devices[0].memory_stats() or {}
    whole["about"]["memory_stats"] = {k: v for k, v in stats.items() if isinstance(v, int)}
    save()
    mesh = Mesh(np.array(devices[:1]), ("dp",), axis_types=(AxisType.Auto,))
    compile_all(whole["variants"], save, mesh, "device", out, run=True, only=only, until=until)
    product(whole["product"], save, mesh, objective, only, until)
    save()


def run_device(out: Path, budget: float, only: str | None, platform: str | None,
               objective: str) -> int:
    start = time.time()
    until = start + budget
    out.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, __file__]
    tail = [*(["--only", only] if only else []), "--objective", objective]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if platform:
        env["JAX_PLATFORMS"] = platform
    # The chip first, in one process; the deviceless compiles on this machine
    # after it has let the chip go (only one process may hold it).
    steps = (("_device", env, until - 60), ("_deviceless", dict(env, JAX_PLATFORMS="cpu"), until))
    for what, child_env, deadline in steps:
        left = deadline - time.time()
        if left < 2 * MARGIN:
            print(f"{what}: skipped, {left:.0f} s left", flush=True)
            continue
        proc = subprocess.Popen([*me, what, str(out), "--until", str(deadline), *tail],
                                env=child_env)
        try:
            proc.wait(timeout=left + 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"{what} killed at the time limit", flush=True)
        print(f"{what} exited {proc.returncode} at {time.time() - start:.0f} s", flush=True)
    pack(out, "hlo-device.tar.gz")
    summary(out)
    print(f"done in {time.time() - start:.0f} s", flush=True)
    return 0


def pack(out: Path, name: str) -> None:
    """The HLO files as one archive (at most 8 files come back from the device)."""
    if (out / "hlo").exists():
        subprocess.run(["tar", "czf", str(out / name), "-C", str(out), "hlo"], check=True)
        subprocess.run(["rm", "-rf", str(out / "hlo")], check=True)


def summary(out: Path) -> None:
    """The comparison in brief, printed (the output's tail comes back even
    without files): each variant's peak deviceless here (the run this tree
    carries, if any), deviceless there and on the device, whether their op
    counts are equal, and the device's median step against the estimate."""
    found = {}
    here = Path(__file__).resolve().parent.parent / "results" / "v5e" / "raw"
    for label, folder in (("deviceless", here), ("deviceless-there", out), ("device", out)):
        path = folder / f"{label}.json"
        found[label] = json.loads(path.read_text()).get("variants", {}) if path.exists() else {}
    print("about:", json.dumps((json.loads((out / "device.json").read_text())["about"]
                                if (out / "device.json").exists() else {}).get("mesh")),
          flush=True)
    for k, b in found["device"].items():
        peaks = [found[label].get(k, {}).get("memory", {}).get("peak_memory_in_bytes")
                 for label in found]
        same_ops = [found[label].get(k, {}).get("ops") == b.get("ops")
                    for label in ("deviceless", "deviceless-there")]
        times = b.get("step_times") or []
        print(f"== {k}: peak here/there/device {peaks}; ops equal here/there {same_ops}; "
              f"median {statistics.median(times) if times else None}; estimate "
              f"{(b.get('estimate') or {}).get('total')}; {(b.get('error') or '')[:160]}",
              flush=True)
    path = out / "device.json"
    for k, rec in (json.loads(path.read_text())["product"] if path.exists() else {}).items():
        print(f"== pipeline {k}: {rec.get('status')} value {rec.get('value')} estimate "
              f"{rec.get('estimate')} {(rec.get('reason') or rec.get('error') or '')[:160]}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("deviceless", "device", "_device", "_deviceless"))
    parser.add_argument("out")
    parser.add_argument("--budget", type=float, default=490.0,
                        help="seconds `device` may take in all (default 490)")
    parser.add_argument("--only", help="one workload of the variants, e.g. gpt:small (a smoke run)")
    parser.add_argument("--platform", help="`device` on this JAX platform instead of the TPU, "
                        "e.g. cpu (a smoke run without a chip)")
    parser.add_argument("--objective", default="hybrid", choices=("hybrid", "measured"),
                        help="the pipeline's objective on the device (hybrid: static's "
                        "estimate and measured's median from one compile)")
    parser.add_argument("--no-product", action="store_true",
                        help="`deviceless` without the pipeline's run")
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    out = Path(a.out)
    if a.what == "device":
        return run_device(out, a.budget, a.only, a.platform, a.objective)
    out.mkdir(parents=True, exist_ok=True)
    until = a.until if a.until is not None else float("inf")
    if a.what == "_device":
        phase_device(out, a.only, until, a.objective)
    elif a.what == "_deviceless":
        phase_deviceless(out, "deviceless-there", a.only, until, with_product=False)
    else:
        # libtpu compiles here; JAX itself must not look for a TPU or a GPU.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        phase_deviceless(out, "deviceless", a.only, until, with_product=not a.no_product)
        pack(out, "hlo-deviceless.tar.gz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
