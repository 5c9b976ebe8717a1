"""The H200 target config against a real H200: deviceless compiles, device compiles, timed steps.

Run on a machine with one H200 (the `device` tool's machine runs its own
python 3.12, jax and CUDA plugin, and lacks optuna: carry its wheels, made
here with `pip download --no-deps --only-binary=:all: --python-version 3.12
--platform manylinux2014_x86_64 -d .whl optuna alembic sqlalchemy mako
colorlog greenlet`, and put them on PYTHONPATH with the repo):

    python benchmarks/h200/run.py device OUT

It runs three processes, each writing one JSON under OUT as it goes:

- `deviceless` (JAX_PLATFORMS=cpu, as on a machine without a GPU): every
  variant compiled for `shardsearch.target_mesh("gpu-h200", {"dp": 1})`,
  i.e. by the CUDA plugin from `base/gpu_targets/gpu-h200.txtpb`;
- `device`: the same variants compiled for the real H200, then run: warm-up
  steps, then timed steps, each fed the state the last one returned
  (donated, as a training loop runs it); the device's own properties;
- `product`: the search's own pipeline on both meshes (`make_context` +
  `evaluate`): the static objective's estimate deviceless and on the
  device's program, and the measured objective's median on the device;
  then (`beside.json`) gpt:small compiled for eight deviceless H200s in the
  process that holds the real one, as a user with one GPU plans for more.

A variant is a workload and its knobs (`Workload.knobs`); on one device every
sharding plan is the same program, so the knobs are what differ. Then

    python benchmarks/h200/run.py profile OUT

(on the device too) traces one step of each workload and sums its kernels
by name and kind (gemm or not), beside the chip's bf16 matmul rate and copy
bandwidth as JAX reaches them. `report.py` beside this file makes the
tables of what came back.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from collections import Counter
from pathlib import Path

GiB = 2**30
LLAMA_1B = dict(layers=16, d_model=2048, heads=32, kv_heads=8, d_ff=8192, vocab=32000,
                seq=2048, batch=8, compute_dtype="bfloat16")
# (workload, knobs): the step as given first, then each knob on its own.
VARIANTS = (
    ("gpt:small", {}),
    ("gpt:small", {"microbatches": 2}),
    ("llama-1b", {}),
    ("llama-1b", {"remat": "selective"}),
    ("llama-1b", {"remat": "none"}),
    ("llama-1b", {"microbatches": 2}),
)
WARMUP, TIMED = 3, 10


def key(name: str, knobs: dict) -> str:
    return name + ("" if not knobs else " " + ",".join(f"{k}={v}" for k, v in knobs.items()))


def hlo_name(label: str, variant: str) -> str:
    """The file name (without `.txt.gz`) of a variant's HLO from one phase."""
    return f"{label}.{variant.replace(' ', '.').replace(',', '.')}"


def get(name: str):
    from shardsearch.workloads import get_workload

    return get_workload("llama:custom", **LLAMA_1B) if name == "llama-1b" else get_workload(name)


def jitted(workload, knobs: dict, mesh):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    step = workload.knobs.step(workload.knobs.setting(knobs))
    abstract = workload.abstract()
    whole = NamedSharding(mesh, P())
    every = jax.tree.map(lambda _: whole, abstract)
    fn = jax.jit(step, in_shardings=every, out_shardings=(every[0], whole), donate_argnums=(0,))
    return fn, abstract


def gib(n) -> str:
    return "-" if n is None else f"{n / GiB:.3f}"


def hlo_texts(raw: Path) -> dict[str, str]:
    """Every HLO text saved in RAW's `hlo*.tar.gz` archives, by file name
    (without `.txt.gz`)."""
    texts = {}
    for archive in sorted(raw.glob("hlo*.tar.gz")):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    data = tar.extractfile(member).read()
                    name = Path(member.name).name.removesuffix(".txt.gz")
                    texts[name] = gzip.decompress(data).decode()
    return texts


def memory(compiled) -> dict:
    analysis = compiled.memory_analysis()
    return {name: int(getattr(analysis, name)) for name in dir(analysis)
            if name.endswith("_in_bytes") and isinstance(getattr(analysis, name), int)}


_OP = re.compile(r"=\s+(?:\([^=]*?\)|\S+)\s+([a-z][a-z0-9\-]*)\(")


def ops(hlo: str) -> dict:
    """Instruction counts by opcode, fusion kind and custom-call target."""
    counts: Counter = Counter()
    for line in hlo.splitlines():
        found = _OP.search(line)
        if not found:
            continue
        op = found.group(1)
        counts[op] += 1
        if op == "fusion":
            kind = re.search(r"kind=(k\w+)", line)
            counts[f"fusion:{kind.group(1) if kind else '?'}"] += 1
        if op == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', line)
            counts[f"custom-call:{target.group(1) if target else '?'}"] += 1
    return dict(sorted(counts.items()))


def compile_all(out: Path, mesh, label: str, run: bool, only: str | None) -> None:
    import jax

    records: dict = {}
    path = out / f"{label}.json"
    for name, knobs in VARIANTS:
        if only and name != only:
            continue
        k = key(name, knobs)
        rec: dict = {"workload": name, "knobs": knobs}
        try:
            workload = get(name)
            fn, abstract = jitted(workload, knobs, mesh)
            start = time.perf_counter()
            compiled = fn.lower(*abstract).compile()
            rec["compile_seconds"] = time.perf_counter() - start
            rec["memory"] = memory(compiled)
            hlo = compiled.as_text()
            rec["ops"] = ops(hlo)
            (out / "hlo").mkdir(exist_ok=True)
            with gzip.open(out / "hlo" / f"{hlo_name(label, k)}.txt.gz", "wt") as f:
                f.write(hlo)
            rec["flops_per_step"] = workload.flops_per_step
            if run:
                rec.update(time_steps(compiled, abstract))
        except Exception as err:
            rec["error"] = f"{type(err).__name__}: {err}"[:2000]
            rec["traceback"] = traceback.format_exc()[-3000:]
        records[k] = rec
        path.write_text(json.dumps(records, indent=1, default=str))
        print(label, k, {x: rec.get(x) for x in ("compile_seconds", "median_seconds", "error")},
              flush=True)
        jax.clear_caches()


def materialize(abstract):
    import jax
    import jax.numpy as jnp

    leaves, tree = jax.tree.flatten(abstract)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    made = [(jnp.abs(jax.random.normal(k, leaf.shape, jnp.float32)) * 0.02).astype(leaf.dtype)
            if jnp.issubdtype(leaf.dtype, jnp.floating) else jnp.zeros(leaf.shape, leaf.dtype)
            for k, leaf in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(tree, made)


def time_steps(compiled, abstract) -> dict:
    import jax

    state, batch = materialize(abstract)
    times, losses = [], []
    for i in range(WARMUP + TIMED):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
        losses.append(float(metrics["loss"]))
    stats = jax.devices()[0].memory_stats() or {}
    return {"step_times": times, "median_seconds": statistics.median(times),
            "losses_finite": all(map(lambda x: x == x and abs(x) != float("inf"), losses)),
            "peak_bytes_in_use": stats.get("peak_bytes_in_use")}


def phase_deviceless(out: Path, only: str | None) -> None:
    import shardsearch as ss

    mesh = ss.target_mesh("gpu-h200", {"dp": 1})
    from shardsearch.search import target_of

    (out / "target.json").write_text(json.dumps(target_of(mesh).to_json(), indent=1))
    compile_all(out, mesh, "deviceless", run=False, only=only)
    product(out, only, "deviceless", (("static", mesh, "static"),))


def phase_device(out: Path, only: str | None) -> None:
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    device = jax.devices()[0]
    about = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
             "device_kind": device.device_kind, "platform": device.platform}
    for attr in ("core_count", "compute_capability"):
        about[attr] = str(getattr(device, attr, None))
    (out / "device_about.json").write_text(json.dumps(about, indent=1))
    mesh = Mesh(np.array([device]), ("dp",), axis_types=(AxisType.Auto,))
    compile_all(out, mesh, "device", run=True, only=only)


def phase_product(out: Path, only: str | None) -> None:
    """The search's own pipeline on the device: static and measured."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    mesh = Mesh(np.array(jax.devices()[:1]), ("dp",), axis_types=(AxisType.Auto,))
    product(out, only, "device", (("static", mesh, "static"), ("measured", mesh, "measured")))
    # Planning for more GPUs than the machine has, from a machine with one:
    # the compile-only devices beside a running CUDA backend.
    import shardsearch as ss

    try:
        beside = ss.target_mesh("gpu-h200", {"dp": 8})
    except Exception as err:
        (out / "beside.json").write_text(json.dumps({"error": f"{type(err).__name__}: {err}",
                                                     "traceback": traceback.format_exc()}))
        print("beside: target_mesh failed:", err, flush=True)
        return
    compile_all(out, beside, "beside", run=False, only="gpt:small")


def product(out: Path, only: str | None, label: str, runs) -> None:
    """The search's own pipeline (`make_context` + `evaluate`) on the
    replicated plan, per (name, mesh, objective) in `runs`."""
    import shardsearch as ss
    from shardsearch.search import Candidate, evaluate, make_context, resolve
    from shardsearch.workloads import expert_plan

    records: dict = {}
    for name in ("gpt:small", "llama-1b"):
        if only and name != only:
            continue
        workload = get(name)
        for how, mesh, objective in runs:
            k = f"{name} | {how} {label}"
            rec: dict = {}
            try:
                args = None if objective == "static" else materialize(workload.abstract())
                ctx, _ = make_context(workload, args, mesh, objective=objective,
                                      hardware=ss.HARDWARE["gpu-h200"], knobs=False)
                plan = expert_plan(workload, mesh, "replicated")
                specs, fp = resolve(Candidate(plan.state_rule, plan.batch_rule, "replicated"),
                                    ctx)
                start = time.perf_counter()
                outcome = evaluate(specs, fp, ctx)
                rec = {"seconds": time.perf_counter() - start, "status": str(outcome.status),
                       "reason": outcome.reason, "value": outcome.value,
                       "estimate": outcome.estimate, "breakdown": outcome.breakdown,
                       "memory": outcome.memory, "step_times": list(outcome.step_times),
                       "compile_seconds": outcome.compile_seconds}
                ctx.close()
            except Exception as err:
                rec = {"error": f"{type(err).__name__}: {err}"[:2000],
                       "traceback": traceback.format_exc()[-3000:]}
            records[k] = rec
            (out / f"product_{label}.json").write_text(json.dumps(records, indent=1,
                                                                  default=str))
            print("product", k, {x: rec.get(x) for x in ("value", "estimate", "error")},
                  flush=True)


def phase_profile(out: Path, only: str | None) -> None:
    """Where a step's time goes on the device: one traced step per workload,
    its kernels summed by name, and the chip's own ceilings measured."""
    import glob
    import tempfile

    import jax
    import numpy as np
    from jax.profiler import ProfileData
    from jax.sharding import AxisType, Mesh

    mesh = Mesh(np.array(jax.devices()[:1]), ("dp",), axis_types=(AxisType.Auto,))
    found: dict = {"ceilings": ceilings()}
    for name in ("gpt:small", "llama-1b"):
        if only and name != only:
            continue
        rec: dict = {}
        try:
            fn, abstract = jitted(get(name), {}, mesh)
            compiled = fn.lower(*abstract).compile()
            state, batch = materialize(abstract)
            for _ in range(WARMUP):
                state, metrics = compiled(state, batch)
            jax.block_until_ready((state, metrics))
            folder = tempfile.mkdtemp()
            jax.profiler.start_trace(folder)
            start = time.perf_counter()
            for _ in range(2):
                state, metrics = compiled(state, batch)
            jax.block_until_ready((state, metrics))
            rec["traced_seconds_per_step"] = (time.perf_counter() - start) / 2
            jax.profiler.stop_trace()
            path = sorted(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True))[-1]
            rec.update(kernels(ProfileData.from_file(path), steps=2))
        except Exception as err:
            rec = {"error": f"{type(err).__name__}: {err}"[:2000],
                   "traceback": traceback.format_exc()[-3000:]}
        found[name] = rec
        (out / "profile.json").write_text(json.dumps(found, indent=1, default=str))
        print("profile", name, rec.get("traced_seconds_per_step"), rec.get("error"),
              {line: (v["seconds_per_step"], v["by_kind"])
               for line, v in rec.get("lines", {}).items()}, flush=True)


def kernels(data, steps: int) -> dict:
    """Time per step on each line of the GPU planes (streams, and any ops or
    modules lines the profiler adds): its total, by kind, and its top names."""
    lines: dict = {}
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            names = lines.setdefault(f"{plane.name} {line.name}", Counter())
            for event in line.events:
                names[event.name] += event.duration_ns

    def kind(name: str) -> str:
        low = name.lower()
        if any(t in low for t in ("gemm", "nvjet", "cutlass", "xmma", "matmul", "cublas")):
            return "gemm"
        if "triton" in low:
            return "triton"
        if any(t in low for t in ("memcpy", "memset")):
            return "copy"
        return "fusion/other"

    out = {}
    for line, names in sorted(lines.items(), key=lambda kv: -sum(kv[1].values()))[:4]:
        kinds: Counter = Counter()
        for name, ns in names.items():
            kinds[kind(name)] += ns
        out[line] = {"seconds_per_step": sum(names.values()) / steps / 1e9,
                     "by_kind": {k: v / steps / 1e9 for k, v in kinds.most_common()},
                     "top": [[n[:140], ns / steps / 1e9] for n, ns in names.most_common(30)]}
    return {"lines": out}


def ceilings() -> dict:
    """The chip's bf16 matmul rate and copy bandwidth as JAX reaches them."""
    import jax
    import jax.numpy as jnp

    def best(fn, *args, n=10):
        fn(*args).block_until_ready()
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn(*args).block_until_ready()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    out = {}
    a = jnp.ones((8192, 8192), jnp.bfloat16)
    seconds = best(jax.jit(lambda x, y: x @ y), a, a)
    out["bf16_matmul_flops_per_second"] = 2 * 8192**3 / seconds
    x = jnp.ones((2**30,), jnp.float32)
    seconds = best(jax.jit(lambda v: v * 2.0), x)
    out["copy_bytes_per_second"] = 2 * x.nbytes / seconds
    return out


def gpu_properties() -> dict:
    """What the CUDA runtime says of the GPU (through torch, which the image has)."""
    code = ("import json, torch; p = torch.cuda.get_device_properties(0); print(json.dumps("
            "{k: str(getattr(p, k)) for k in dir(p) if not k.startswith('_')}))")
    try:
        text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120).stdout.strip().splitlines()[-1]
        props = json.loads(text)
    except Exception as err:
        props = {"error": repr(err)}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm,"
                              "clocks.max.mem,driver_version", "--format=csv"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        smi = repr(err)
    return {"torch": props, "nvidia_smi": smi}


def run_device(out: Path, budget: float, only: str | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(gpu_properties(), indent=1))
    me = [sys.executable, __file__]
    me_args = ["--only", only] if only else []
    # The device phase may use nearly all of the GPU: remat "none" is meant
    # to come close to it.
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_MEM_FRACTION="0.95")
    start = time.monotonic()
    # Deviceless on the CPU (as a GPU-less machine runs it) beside the device phase.
    deviceless = subprocess.Popen([*me, "_deviceless", str(out), *me_args],
                                  env=dict(env, JAX_PLATFORMS="cpu"))
    device = subprocess.Popen([*me, "_device", str(out), *me_args], env=env)
    for proc in (device, deviceless):
        try:
            proc.wait(timeout=max(1.0, budget * 0.6 - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            proc.kill()
            print(f"{proc.args[2]} killed at the time limit", flush=True)
    left = budget - (time.monotonic() - start)
    if left > 60:
        product = subprocess.Popen([*me, "_product", str(out), *me_args], env=env)
        try:
            product.wait(timeout=left - 10)
        except subprocess.TimeoutExpired:
            product.kill()
            print("_product killed at the time limit", flush=True)
    # What comes back is at most 8 files: the small JSONs become one, the
    # HLO one archive.
    for joined, parts in (("env", ("gpu", "device_about", "target")),
                          ("product", ("product_deviceless", "product_device"))):
        whole = {}
        for name in parts:
            part = out / f"{name}.json"
            if part.exists():
                whole[name] = json.loads(part.read_text())
                part.unlink()
        (out / f"{joined}.json").write_text(json.dumps(whole, indent=1))
    summary(out)
    if (out / "hlo").exists():
        subprocess.run(["tar", "czf", str(out / "hlo.tar.gz"), "-C", str(out), "hlo"],
                       check=True)
        subprocess.run(["rm", "-rf", str(out / "hlo")], check=True)
    print(f"done in {time.monotonic() - start:.0f} s", flush=True)
    return 0


def summary(out: Path) -> None:
    """The comparison, printed (the output's tail comes back even without files)."""
    found = {}
    for label in ("deviceless", "device"):
        path = out / f"{label}.json"
        found[label] = json.loads(path.read_text()) if path.exists() else {}
    for k in found["device"]:
        a, b = found["deviceless"].get(k, {}), found["device"][k]
        same = {f: (a.get("memory", {}).get(f), b.get("memory", {}).get(f))
                for f in ("argument_size_in_bytes", "output_size_in_bytes",
                          "alias_size_in_bytes", "temp_size_in_bytes")}
        ops_a, ops_b = a.get("ops", {}), b.get("ops", {})
        differ = sorted(op for op in set(ops_a) | set(ops_b)
                        if ops_a.get(op, 0) != ops_b.get(op, 0))
        print(f"== {k}: memory (deviceless, device) {same}; {len(differ)} op kinds differ "
              f"{differ[:8]}; median {b.get('median_seconds')}; errors {a.get('error')} / "
              f"{b.get('error')}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("device", "profile", "_deviceless", "_device",
                                         "_product"))
    parser.add_argument("out")
    parser.add_argument("--budget", type=float, default=420.0,
                        help="seconds the device run may take in all")
    parser.add_argument("--only", help="one workload of the variants (a smoke run)")
    a = parser.parse_args()
    out = Path(a.out)
    if a.what == "device":
        return run_device(out, a.budget, a.only)
    out.mkdir(parents=True, exist_ok=True)
    {"_deviceless": phase_deviceless, "_device": phase_device, "_product": phase_product,
     "profile": phase_profile}[a.what](out, a.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
