"""The tables of `benchmarks/results/h200/h200.md`, from what `run.py` brought back.

    python benchmarks/h200/report.py RAW OUT.md

RAW holds the device runs' files (`env.json`, `deviceless.json`,
`device.json`, `product.json`, `beside.json`, `profile.json`, `hlo.tar.gz`).
Every variant's HLO, deviceless and from the device, is priced again here by
the static objective's model (`HardwareModel.breakdown` of gpu-h200 on a
one-device mesh), so that each variant has an estimate beside its measured
step; nothing runs on an accelerator here.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

import shardsearch as ss

ss.use_cpu_devices(1)

from run import gib, hlo_name, hlo_texts  # noqa: E402 - beside this file

from shardsearch.search import ProgramCost, Topology, target_of  # noqa: E402

COMMANDS = {
    "device": "python benchmarks/h200/run.py device OUT --budget 360",
    "profile": "python benchmarks/h200/run.py profile OUT",
}


def priced(hlo: str) -> dict:
    """The static objective's estimate of a GPU program: the HLO's own
    loop-once figures stand in for XLA's cost analysis, which the GPU
    compiler does not give (as `ProgramCost.from_compiled` does)."""
    program = ProgramCost.from_hlo(hlo, 0.0, 0.0)
    program = dataclasses.replace(program, xla_flops=program.hlo.dot_flops_once,
                                  xla_bytes_accessed=program.hlo.bytes_accessed_once)
    parts = ss.HARDWARE["gpu-h200"].breakdown(program, Topology(("dp",), (1,)))
    return {"total": parts.total, "compute": parts.compute, "memory": parts.memory,
            "kernels": parts.kernels, "flops": program.flops, "bytes": program.bytes_accessed}


def config_table(env: dict) -> list[str]:
    torch = env["gpu"]["torch"]
    text = target_of(ss.target_mesh("gpu-h200", {"dp": 1})).config
    field = {m[1]: m[2] for m in re.finditer(r"^\s*(\w+):\s*([\d.]+)\s*$", text, re.M)}
    bandwidth = 2 * int(torch["memory_clock_rate"]) * 1000 * int(torch["memory_bus_width"]) // 8
    rows = [
        ("SMs", "core_count", torch["multi_processor_count"]),
        ("L2 bytes", "l2_cache_size", torch["L2_cache_size"]),
        ("SM clock GHz", "clock_rate_ghz", int(torch["clock_rate"]) / 1e6),
        ("memory bytes", "device_memory_size", torch["total_memory"]),
        ("memory bandwidth B/s (2 x clock x bus / 8)", "memory_bandwidth", bandwidth),
        ("shared memory per SM", "shared_memory_per_core",
         torch["shared_memory_per_multiprocessor"]),
        ("shared memory per block (opt-in)", "shared_memory_per_block_optin",
         torch["shared_memory_per_block_optin"]),
        ("registers per SM", "registers_per_core_limit", torch["regs_per_multiprocessor"]),
        ("threads per SM", "threads_per_core_limit", torch["max_threads_per_multi_processor"]),
    ]
    lines = ["| figure | `gpu-h200.txtpb` (now) | the real H200 |", "|---|---|---|"]
    for name, key, real in rows:
        lines.append(f"| {name} | {field.get(key, '-')} | {real} |")
    return lines


def memory_table(deviceless: dict, device: dict) -> list[str]:
    lines = ["| variant | arguments GiB | temporaries GiB: deviceless / device | peak GiB: "
             "deviceless / device / allocator's high-water mark | cuBLAS calls, kCustom "
             "fusions (Triton gemms): deviceless → device | collectives | compile s: deviceless / "
             "device |", "|---|---|---|---|---|---|---|"]
    seen_peak, failed = 0, False
    for k, dev in device.items():
        dl = deviceless[k]
        m_dl, m_dev = dl["memory"], dev["memory"]
        mark = dev.get("peak_bytes_in_use")
        # The allocator's mark is the process's: it says this variant's peak
        # only while it rises, and not after a variant whose run failed part
        # way through its allocations.
        mark_text = ("did not run" if mark is None else
                     "(raised by the failed run before it)" if failed else
                     gib(mark) if mark > seen_peak else "(an earlier variant's)")
        seen_peak, failed = max(seen_peak, mark or 0), failed or mark is None
        ops_dl, ops_dev = dl["ops"], dev["ops"]

        def gemms(ops):
            return f"{ops.get('custom-call:__cublas$lt$matmul', 0)}, {ops.get('fusion:kCustom', 0)}"

        coll = sum(v for o, v in {**ops_dl, **ops_dev}.items()
                   if o.startswith(("all-", "reduce-scatter", "collective-")))
        lines.append(
            f"| {k} | {gib(m_dev['argument_size_in_bytes'])} | "
            f"{gib(m_dl['temp_size_in_bytes'])} / {gib(m_dev['temp_size_in_bytes'])} "
            f"({m_dev['temp_size_in_bytes'] / m_dl['temp_size_in_bytes'] - 1:+.1%}) | "
            f"{gib(m_dl.get('peak_memory_in_bytes'))} / {gib(m_dev.get('peak_memory_in_bytes'))}"
            f" / {mark_text} | {gemms(ops_dl)} → {gemms(ops_dev)} | {coll} | "
            f"{dl['compile_seconds']:.1f} / {dev['compile_seconds']:.1f} |")
    return lines


def timing_table(device: dict, texts: dict[str, str]) -> tuple[list[str], dict]:
    lines = ["| variant | measured s/step: median (min–max of 10) | estimate s (deviceless "
             "program): total = the kernels' rooflines summed (whole program: compute, memory) "
             "| estimate s (device program) | measured / estimate (device program) |",
             "|---|---|---|---|---|"]
    estimates = {}
    for k, dev in device.items():
        e_dl = priced(texts[hlo_name("deviceless", k)])
        e_dev = priced(texts[hlo_name("device", k)])
        estimates[k] = {"deviceless": e_dl, "device": e_dev}
        times = dev.get("step_times") or []
        measured = (f"{statistics.median(times):.4f} ({min(times):.4f}–{max(times):.4f})"
                    if times else f"did not run: {dev.get('error', '')[:90]}")
        ratio = f"{statistics.median(times) / e_dev['total']:.2f}" if times else "-"
        lines.append(f"| {k} | {measured} | {e_dl['total']:.4f} = {e_dl['kernels']:.4f} "
                     f"({e_dl['compute']:.4f}, {e_dl['memory']:.4f}) | {e_dev['total']:.4f} | "
                     f"{ratio} |")
    return lines, estimates


def product_lines(product: dict) -> list[str]:
    lines = ["| workload | how | status | value s | estimate s | memory total GiB |",
             "|---|---|---|---|---|---|"]
    for part in product.values():
        for k, rec in part.items():
            name, how = k.split(" | ")
            value, estimate = rec.get("value"), rec.get("estimate")
            lines.append(f"| {name} | {how} | {rec.get('status', rec.get('error', ''))} | "
                         f"{'-' if value is None else f'{value:.4f}'} | "
                         f"{'-' if estimate is None else f'{estimate:.4f}'}"
                         f" | {gib(rec.get('memory', {}).get('total'))} |")
    return lines


def profile_lines(profile: dict, estimates: dict) -> list[str]:
    c = profile["ceilings"]
    model = ss.HARDWARE["gpu-h200"]
    lines = [f"Ceilings as JAX reaches them: an 8192³ bf16 matmul at "
             f"{c['bf16_matmul_flops_per_second'] / 1e12:.0f} TFLOP/s (the model: "
             f"{model.peak('bf16') / 1e12:.0f}); a 4 GiB `x * 2` at "
             f"{c['copy_bytes_per_second'] / 1e12:.2f} TB/s read + written (the model: "
             f"{model.memory_bandwidth / 1e12:.2f}).", "",
             "| workload | traced s/step | kernels on the one stream: gemm s / other s | the "
             "model's compute s / memory s (device program) | the model's terms at the "
             "measured ceilings: compute s + memory s = sum |", "|---|---|---|---|---|"]
    for name in ("gpt:small", "llama-1b"):
        rec = profile[name]
        (line,) = [v for v in rec["lines"].values()][:1]
        kinds = line["by_kind"]
        gemm = kinds.get("gemm", 0.0)
        other = line["seconds_per_step"] - gemm
        e = estimates[name]["device"]
        at_c = e["compute"] * model.peak("bf16") / c["bf16_matmul_flops_per_second"]
        at_m = e["bytes"] / c["copy_bytes_per_second"]
        lines.append(f"| {name} | {rec['traced_seconds_per_step']:.4f} | {gemm:.4f} / "
                     f"{other:.4f} | {e['compute']:.4f} / {e['memory']:.4f} | {at_c:.4f} + "
                     f"{at_m:.4f} = {at_c + at_m:.4f} |")
    top = profile["llama-1b"]["lines"]
    (first,) = list(top.values())[:1]
    lines += ["", "The llama-1b step's largest kernels (s per step):", ""]
    lines += [f"- `{n}`: {s:.4f}" for n, s in first["top"][:8]]
    return lines


def main() -> int:
    raw, out = Path(sys.argv[1]), Path(sys.argv[2])
    load = {name: json.loads((raw / f"{name}.json").read_text())
            for name in ("env", "deviceless", "device", "product", "beside", "profile")}
    texts = hlo_texts(raw)
    timing, estimates = timing_table(load["device"], texts)
    env = load["env"]
    versions = ", ".join(f"{k} {v}" for k, v in env["target"]["versions"].items())
    lines = [
        "# One H200: the deviceless target against the chip", "",
        f"Device runs: `{COMMANDS['device']}` and `{COMMANDS['profile']}` on one NVIDIA H200 "
        f"(driver {env['gpu']['nvidia_smi'].splitlines()[-1].split(', ')[-1]}, jax "
        f"{env['device_about']['jax']}, {versions}); "
        f"the files they wrote are in `raw/`. Tables: `python {' '.join(sys.argv)}`.", "",
        "## The target config against the device", "", *config_table(env), "",
        "## Memory and programs: deviceless against the device", "",
        *memory_table(load["deviceless"], load["device"]), "",
        "## Step time: measured against the estimate", "", *timing, "",
        "The search's own pipeline on the same chip (`make_context` + `evaluate`, the "
        "replicated plan; measured: the measured objective's median):", "",
        *product_lines(load["product"]), "",
        "## Where the time goes", "", *profile_lines(load["profile"], estimates), "",
    ]
    out.write_text("\n".join(lines))
    (out.with_suffix(".json")).write_text(json.dumps(estimates, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
