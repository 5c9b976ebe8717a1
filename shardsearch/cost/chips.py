"""The built-in hardware models: named chips from their spec sheets, and the legacy three.

Each named chip's figures carry their public source in a comment (collected
in `../shared/ANCHORS.md`). Latencies that no spec sheet gives are marked as
assumptions. Nothing here is fitted to measured training runs.

The named chips charge communication at their links (`cost.links.Link`) and
hide it under compute with `OVERLAPPED` (XLA's latency-hiding scheduler runs
collectives asynchronously on TPU and GPU); the cost breakdown shows both
sides, so a plan bound by communication is still visible as such.

Example:
  >>> HARDWARE["tpu-v5e"].memory_bytes
  17179869184
  >>> hardware_for("cpu").name
  'cpu (one simulated device)'
"""

from __future__ import annotations

from .hardware import HardwareModel
from .links import Link

GiB = 1 << 30

OVERLAPPED = 1.0
"""The named chips' overlap: collectives run beside compute. A stated rule,
not a fit; `benchmarks/fidelity` chooses the calibrated CPU model's value."""

# Between hosts no spec sheet gives a latency; 10 us is an assumption of the
# order of an RDMA round trip through one switch.
_DCN_LATENCY = 1e-5

NAMED: dict[str, HardwareModel] = {
    "tpu-v5e": HardwareModel(
        "tpu-v5e (16 GiB HBM, 2D torus ICI)",
        # bf16 peak 1.97e14 FLOP/s (Cloud TPU v5e docs). XLA on TPU runs float32
        # matmuls as one bf16 pass at the default precision, so f32 gets it too.
        flops_per_second={"bf16": 1.97e14, "f32": 1.97e14},
        memory_bandwidth=8.1e11,  # 819 GB/s HBM2 (Cloud TPU v5e docs)
        memory_bytes=16 * GiB,  # 16 GiB HBM per chip (Cloud TPU v5e docs)
        # ~4.5e10 B/s one way per ICI link, 4 ports in a 2D torus; axes shorter
        # than 16 chips have no wraparound (JAX scaling book, "TPUs"). ~1 us per
        # hop (scaling book).
        ici=Link(bandwidth=4.5e10, latency=1e-6, torus=True, wraparound_from=16),
        # 2 x 100 Gb/s NICs per 8-chip host: ~3.1e9 B/s per chip (scaling book).
        dcn=Link(bandwidth=3.1e9, latency=_DCN_LATENCY),
        overlap=OVERLAPPED,
        about=(("source", "Cloud TPU v5e docs; JAX scaling book (tpus.md)"),),
        # Measured on one v5e: 13 programs of 0.15 s or more at 1.01-1.10x of
        # their step times priced per kernel, 0.87-1.47x as a whole; gpt:small's
        # 2 ms steps about 3x under, the chip's time outside the kernels
        # (benchmarks/results/v5e/grid.md).
        per_op=True,
        # Fitted to the traced kernels of a 400M llama's seven knob settings
        # (least squares over 400 memory-bound kernels): 690 GB/s for HBM,
        # 2.65 TB/s for what the compiler placed in memory space 1 (2.68
        # before a slice's read was counted in its operand's space); its copies
        # into that space run beside the kernels. Tested on the shapes not
        # fitted to: 37 of 42 pairs of settings ordered as the chip ran them,
        # against 14 with every byte at 810 GB/s (benchmarks/results/v5e/kernels.md).
        memory_spaces=((0, 6.9e11), (1, 2.65e12)), asynchronous=("copy-start",)),
    "tpu-v5p": HardwareModel(
        "tpu-v5p (95 GiB HBM, 3D torus ICI)",
        # bf16 peak 4.59e14 FLOP/s (Cloud TPU v5p docs); f32 matmuls as above.
        flops_per_second={"bf16": 4.59e14, "f32": 4.59e14},
        memory_bandwidth=2.765e12,  # 2765 GB/s HBM2e (Cloud TPU v5p docs)
        memory_bytes=95 * GiB,  # 95 GiB HBM per chip (Cloud TPU v5p docs)
        # ~9e10 B/s one way per link (1200 GB/s bidirectional per chip over 6
        # links; Cloud TPU v5p docs, scaling book); full-torus slices wrap every
        # axis. ~1 us per hop.
        ici=Link(bandwidth=9e10, latency=1e-6, torus=True, wraparound_from=0),
        # 50 Gb/s of data-centre network per chip: ~6.25e9 B/s (scaling book).
        dcn=Link(bandwidth=6.25e9, latency=_DCN_LATENCY),
        overlap=OVERLAPPED,
        about=(("source", "Cloud TPU v5p docs; JAX scaling book (tpus.md)"),)),
    "gpu-h100": HardwareModel(
        "gpu-h100 (80 GB HBM3, NVLink4 inside the node)",
        # bf16 dense 9.89e14 FLOP/s; TF32 dense 4.95e14, which XLA uses for
        # float32 matmuls at the default precision (NVIDIA H100 SXM datasheet).
        flops_per_second={"bf16": 9.89e14, "f16": 9.89e14, "f32": 4.95e14},
        memory_bandwidth=3.35e12,  # 3.35 TB/s (NVIDIA H100 SXM datasheet)
        memory_bytes=80 * 10**9,  # 80 GB (NVIDIA H100 SXM datasheet)
        # NVLink4 through NVSwitch: 4.5e11 B/s per direction per GPU (scaling
        # book, gpus.md). A few us per NCCL step is an assumption.
        ici=Link(bandwidth=4.5e11, latency=3e-6),
        # 8 x 400 Gb/s per 8-GPU node: 5e10 B/s per GPU (scaling book, gpus.md).
        dcn=Link(bandwidth=5e10, latency=_DCN_LATENCY),
        overlap=OVERLAPPED,
        about=(("source", "NVIDIA H100 SXM datasheet; JAX scaling book (gpus.md)"),)),
    "gpu-h200": HardwareModel(
        "gpu-h200 (141 GB HBM3e, NVLink4 inside the node)",
        # Same compute as the H100 SXM (scaling book; NVIDIA H200 datasheet).
        flops_per_second={"bf16": 9.89e14, "f16": 9.89e14, "f32": 4.95e14},
        memory_bandwidth=4.8e12,  # 4.8 TB/s (NVIDIA H200 datasheet)
        memory_bytes=141 * 10**9,  # 141 GB (NVIDIA H200 datasheet)
        # NVLink4: 9e11 B/s total per GPU, 4.5e11 per direction (scaling book).
        ici=Link(bandwidth=4.5e11, latency=3e-6),
        # Node networks vary (8-10 x 400 Gb/s); 8 x 400 Gb/s assumed, as H100.
        dcn=Link(bandwidth=5e10, latency=_DCN_LATENCY),
        overlap=OVERLAPPED,
        about=(("source", "NVIDIA H200 datasheet; JAX scaling book (gpus.md); "
                "MLCommons system descriptions"),),
        # Measured on one H200 (benchmarks/results/h200): priced per kernel, its
        # five programs rank as they ran, as they did as a whole, at 1.9-4.4x
        # under their step times where the whole-program roofline was 2.4-4.4x.
        per_op=True),
    "tpu-v4": HardwareModel(
        "tpu-v4 (32 GiB HBM, 3D torus ICI)",
        # bf16 peak 2.75e14 FLOP/s (Cloud TPU v4 docs); f32 matmuls as one bf16
        # pass at XLA's default precision, as for v5e below.
        flops_per_second={"bf16": 2.75e14, "f32": 2.75e14},
        memory_bandwidth=1.2e12,  # 1200 GB/s HBM2 (Cloud TPU v4 docs)
        memory_bytes=32 * GiB,  # 32 GiB HBM per chip (Cloud TPU v4 docs)
        # 6 ICI links in a 3D torus, ~4.5e10 B/s one way per link (JAX scaling
        # book, "TPUs"). Slices made of whole 4x4x4 cubes wrap every axis (the
        # scaling book); the published v4 rows are such slices. ~1 us per hop.
        ici=Link(bandwidth=4.5e10, latency=1e-6, torus=True, wraparound_from=0),
        # No source we have gives v4's data-centre bandwidth per chip: an
        # assumption, v5p's 50 Gb/s per chip (~6.25e9 B/s). Only meshes that
        # name dcn_axes use it; the published v4 rows run inside one slice.
        dcn=Link(bandwidth=6.25e9, latency=_DCN_LATENCY),
        overlap=OVERLAPPED,
        about=(("source", "Cloud TPU v4 docs; JAX scaling book (tpus.md)"),)),
}

# Order-of-magnitude figures for one device of each platform, one link for
# every axis; what studies recorded before the named chips and calibration.
LEGACY: dict[str, HardwareModel] = {
    "cpu": HardwareModel("cpu (one simulated device)", 5e10, 2e10, 5e9),
    "gpu": HardwareModel("gpu (H100-class, fp32 tensor cores, NVLink)", 4e14, 3.3e12, 4.5e11),
    "tpu": HardwareModel("tpu (v5e-class, bf16, ICI)", 1.97e14, 8.2e11, 1e11),
}

HARDWARE: dict[str, HardwareModel] = LEGACY | NAMED
"""Every built-in model by name: the JAX platform names ("cpu", "gpu", "tpu")
and the named chips."""


def hardware_for(platform: str, override: HardwareModel | None = None) -> HardwareModel:
    """The model for a JAX platform name, unless the caller gives one."""
    if override is not None:
        return override
    if platform not in HARDWARE:
        raise ValueError(
            f"no hardware model for platform {platform!r}; pass hardware=HardwareModel(...) "
            f"(known: {tuple(HARDWARE)})")
    return HARDWARE[platform]
