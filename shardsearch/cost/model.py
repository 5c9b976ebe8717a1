"""The static objective: a step's seconds estimated from the compiled executable.

Nothing runs. Per device: compute time from the flop count, memory time from
the bytes accessed (the larger of the two: a roofline), plus the time to move
the collectives' bytes over the device link. Flops and bytes are XLA's
``cost_analysis()`` figures made loop-aware (:func:`loop_aware`): XLA counts a
``while`` body once, so a model whose layers are stacked under ``lax.scan``
would otherwise be charged the compute of one layer but the communication of
all of them. The constants are coarse by design: the estimate ranks candidates
against each other on one machine kind, it does not predict wall-clock.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .hlo import HloCost


@dataclasses.dataclass(frozen=True)
class HardwareModel:
    """Per-device throughputs used by the static objective.

    Attributes:
      name: what the numbers describe.
      flops_per_second: sustained dense float32 (or bf16 on TPU) throughput.
      memory_bandwidth: bytes per second to device memory.
      link_bandwidth: bytes per second one device sends to its peers.
    """

    name: str
    flops_per_second: float
    memory_bandwidth: float
    link_bandwidth: float

    def __post_init__(self) -> None:
        for field in ("flops_per_second", "memory_bandwidth", "link_bandwidth"):
            if not getattr(self, field) > 0:
                raise ValueError(f"HardwareModel.{field} must be positive, got "
                                 f"{getattr(self, field)!r}")

    def seconds(self, flops: float, bytes_accessed: float, link_bytes: float) -> float:
        """Roofline compute/memory time plus communication time."""
        return (max(flops / self.flops_per_second, bytes_accessed / self.memory_bandwidth)
                + link_bytes / self.link_bandwidth)


# Order-of-magnitude figures for one device of each platform; see the module doc.
HARDWARE: dict[str, HardwareModel] = {
    "cpu": HardwareModel("cpu (one simulated device)", 5e10, 2e10, 5e9),
    "gpu": HardwareModel("gpu (H100-class, fp32 tensor cores, NVLink)", 4e14, 3.3e12, 4.5e11),
    "tpu": HardwareModel("tpu (v5e-class, bf16, ICI)", 1.97e14, 8.2e11, 1e11),
}


def hardware_for(platform: str, override: HardwareModel | None = None) -> HardwareModel:
    """The model for a JAX platform name, unless the caller gives one."""
    if override is not None:
        return override
    if platform not in HARDWARE:
        raise ValueError(
            f"no hardware model for platform {platform!r}; pass hardware=HardwareModel(...) "
            f"(known: {tuple(HARDWARE)})")
    return HARDWARE[platform]


def cost_numbers(compiled: Any) -> tuple[float, float]:
    """`(flops, bytes accessed)` per device from `compiled.cost_analysis()`."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):  # older jaxlibs give one dict per program
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


def loop_aware(flops: float, bytes_accessed: float, hlo: HloCost) -> tuple[float, float]:
    """XLA's `(flops, bytes accessed)` with the loop trips it leaves out added back.

    XLA's `cost_analysis()` counts each `while` body once. The HLO text gives
    the matmul flops and the bytes accessed both ways (loops counted, and
    each loop once), so their difference is the work of the missing trips.
    Elementwise flops inside loops are still counted once: for a scanned
    4-layer Llama they are about 2% of the step.

    Args:
      flops: `cost_analysis()["flops"]`, per device.
      bytes_accessed: `cost_analysis()["bytes accessed"]`, per device.
      hlo: the same module's `HloCost` from `_hlo.parse_hlo`.

    Returns:
      `(flops, bytes accessed)`, e.g. `(5 * 2 * 128**3, ...)` for a 5-step scan
      of f32[128,128] matmuls, where XLA reports `2 * 128**3`.
    """
    # Each difference is >= 0 unless a loop never runs; XLA counted that loop's
    # body once, so taking it away cannot go below zero by more than rounding.
    return (max(0.0, flops + hlo.dot_flops - hlo.dot_flops_once),
            max(0.0, bytes_accessed + hlo.bytes_accessed - hlo.bytes_accessed_once))
