"""Hardware models: a compiled program's step seconds, estimated without running it.

The built-in model is a roofline per device: compute time from the flop
count, memory time from the bytes accessed (the larger of the two), plus the
time to move the collectives' bytes over the device link. Flops and bytes are
XLA's ``cost_analysis()`` figures made loop-aware (`cost.program.loop_aware`):
XLA counts a ``while`` body once, so a model whose layers are stacked under
``lax.scan`` would otherwise be charged the compute of one layer but the
communication of all of them. The constants are coarse by design: the
estimate ranks candidates against each other on one machine kind, it does
not predict wall-clock.

A model receives the whole `ProgramCost`, so a finer one (charging each
collective by the mesh axes it spans, say) is a subclass overriding
`HardwareModel.estimate`.
"""

from __future__ import annotations

import dataclasses

from .program import ProgramCost


@dataclasses.dataclass(frozen=True)
class HardwareModel:
    """Per-device throughputs, and the step seconds they give a compiled program.

    Attributes:
      name: what the numbers describe.
      flops_per_second: sustained dense float32 (or bf16 on TPU) throughput.
      memory_bandwidth: bytes per second to device memory.
      link_bandwidth: bytes per second one device sends to its peers.

    Example:
      >>> model = HardwareModel("toy", flops_per_second=1e12, memory_bandwidth=1e11,
      ...                       link_bandwidth=1e10)
      >>> model.estimate(program)  # program: a ProgramCost with 2e12 flops, 1e11
      ...                          # bytes accessed and 1e10 link bytes
      3.0
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

    def estimate(self, program: ProgramCost) -> float:
        """Seconds per step: roofline compute/memory time plus communication time.

        Raises:
          ValueError: the program's HLO could not be read, so its
            communication and loop trips are unknown.
        """
        if program.link_bytes is None:
            raise ValueError(
                f"{self.name}: cannot estimate a program whose HLO could not be read "
                f"({program.hlo_error}); the collectives and loop trips are unknown")
        return (max(program.flops / self.flops_per_second,
                    program.bytes_accessed / self.memory_bandwidth)
                + program.link_bytes / self.link_bandwidth)


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
