"""What a compiled program costs, read once from the executable.

`ProgramCost.from_compiled` gathers every figure a cost model may want from a
compiled step, per device: XLA's ``cost_analysis()`` flops and bytes accessed
made loop-aware (:func:`loop_aware`), the collectives parsed from the HLO
text (each one, with its kind, bytes, group and trips), XLA's memory
analysis, and on TPU the compiler's own time estimate made loop-aware
(`ProgramCost.compiler_seconds`), a second estimator beside the hardware
models. Hardware models (`cost.hardware`) and objectives receive the whole
summary, so a model that charges each collective by the links it crosses
needs no new plumbing.

Example::

    compiled = jax.jit(step, in_shardings=..., out_shardings=...).lower(*args).compile()
    program = ProgramCost.from_compiled(compiled)
    program.flops, program.bytes_accessed, program.link_bytes
    program.collectives.collectives  # (Collective(kind="all-reduce", ...), ...)
    program.memory.total  # argument + output + temp - alias bytes (TPU: its peak)
    program.compiler_seconds  # TPU: the compiler's estimate, loops counted; else None
    program.compiler_seconds_problem  # why it is None, e.g. "... gives no optimal_seconds"
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Any

import jax

from ..base.warnings import ShardsearchWarning, note
from .hlo import CollectiveSummary, HloCost, parse_hlo


@dataclasses.dataclass(frozen=True)
class XlaMemory:
    """Per-device bytes from XLA's memory analysis of a compiled program.

    What a program needs is, on most compilers, its arguments, outputs and
    temporaries less what the outputs reuse of the arguments. The TPU
    compiler's ``temp_size_in_bytes`` is not its temporaries' peak: for the
    MaxText 22B step on v4 (fsdp 64) it says 33.6 GiB where its own buffer
    assignment lays every temporary out in 24.7 GiB, and for a
    ``[1024,1024]`` matmul on a 2x2 v5e it says 0 beside a 4 MiB gather.
    The TPU compiler's ``peak_memory_in_bytes`` (29.2 GiB and 4.5 MiB there)
    agrees with its buffer assignment (29.2 GiB with the arguments, the
    figure it checks against the chip's HBM before refusing a program), so
    on TPU that peak is the total. On GPU the peak equals the sum (76.69 GiB
    both, for the 7.1B Megatron step on H100s); on CPU it is not a peak (it
    leaves out the temporaries), so neither is read.

    Attributes:
      argument, output, temp, alias: XLA's `*_size_in_bytes` figures.
      peak: the compiler's own peak (`peak_memory_in_bytes`) where it stands
        for the program's need (TPU); 0 where the sum does.
    """

    argument: int
    output: int
    temp: int
    alias: int
    peak: int = 0

    def __post_init__(self) -> None:
        for field in ("argument", "output", "temp", "alias", "peak"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"XlaMemory.{field}={value!r} must be a whole number >= 0")

    @property
    def total(self) -> int:
        """What the compile stage compares with the budget: `peak` where it is
        given, else argument + output + temp − alias."""
        return self.peak or self.argument + self.output + self.temp - self.alias

    def to_json(self) -> dict[str, int]:
        """`{"argument", "output", "temp", "alias", "total"}` and `"peak"` when
        given, as outcomes record them."""
        out = {"argument": self.argument, "output": self.output, "temp": self.temp,
               "alias": self.alias, "total": self.total}
        return {**out, "peak": self.peak} if self.peak else out

    @classmethod
    def from_compiled(cls, compiled: Any) -> XlaMemory:
        """Reads `compiled.memory_analysis()`, and its peak when the program
        was compiled for TPU devices (`compiled.input_shardings` say where)."""
        stats = compiled.memory_analysis()
        peak = 0
        if _platform(compiled) == "tpu":
            peak = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
            if not peak:
                warnings.warn(
                    "shardsearch: the TPU compiler gave no peak_memory_in_bytes; the program's "
                    "memory is the sum of its memory analysis, whose temporaries are not their "
                    "peak on TPU (docs/targets.md): fit verdicts may be wrong either way",
                    ShardsearchWarning, stacklevel=2)
        return cls(int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes),
                   int(stats.temp_size_in_bytes), int(stats.alias_size_in_bytes), peak)


def _platform(compiled: Any) -> str | None:
    """The platform of the devices a compiled program's arguments sit on
    (its results', for a program without arguments), or None when neither
    has a sharding to say."""
    for shardings in ("input_shardings", "output_shardings"):
        for sharding in jax.tree.leaves(getattr(compiled, shardings, None)):
            devices = getattr(sharding, "device_set", None)
            if devices:
                return next(iter(devices)).platform
    return None


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """The cost figures of one compiled program, per device and step.

    Attributes:
      xla_flops: `cost_analysis()["flops"]`, which counts each loop body once.
        Where the compiler has no cost analysis (GPU), `from_compiled` puts
        the HLO's matmul flops with each loop once here
        (`HloCost.dot_flops_once`), so that `flops` is the HLO's count.
      xla_bytes_accessed: `cost_analysis()["bytes accessed"]`, likewise
        (`HloCost.bytes_accessed_once` on GPU).
      collectives: every collective of the HLO, with bytes, group size and
        trips (`cost.hlo.CollectiveSummary`); None when the HLO could not be
        read.
      hlo: the HLO's matmul flops and bytes accessed, loops counted and not
        (`cost.hlo.HloCost`); None when the HLO could not be read.
      memory: XLA's memory analysis, or None when not read (a summary built
        from HLO text alone).
      hlo_error: why the HLO text could not be read; "" when it was.
      xla_seconds: `cost_analysis()["optimal_seconds"]` as the compiler gave
        it (TPU only: XLA:CPU and the GPU compiler give none), loops counted
        once and unchecked: it can be negative. None when absent. Read it
        through `compiler_seconds`.
      platform: the platform of the devices it was compiled for ("tpu",
        "gpu", "cpu"), or None when not known (a summary of HLO text).
    """

    xla_flops: float
    xla_bytes_accessed: float
    collectives: CollectiveSummary | None
    hlo: HloCost | None
    memory: XlaMemory | None = None
    hlo_error: str = ""
    xla_seconds: float | None = None
    platform: str | None = None

    def __post_init__(self) -> None:
        if self.xla_seconds is not None and (
                isinstance(self.xla_seconds, bool)
                or not isinstance(self.xla_seconds, int | float)):
            raise TypeError(f"ProgramCost.xla_seconds={self.xla_seconds!r} must be a number "
                            "(any, checked by compiler_seconds) or None")
        for field in ("xla_flops", "xla_bytes_accessed"):
            if not getattr(self, field) >= 0:
                raise ValueError(f"ProgramCost.{field}={getattr(self, field)!r} must be a "
                                 "number >= 0")
        read = not self.hlo_error
        if (self.collectives is not None) != read or (self.hlo is not None) != read:
            raise ValueError(
                "ProgramCost: give collectives and hlo when the HLO was read, and neither "
                "(with hlo_error saying why) when it was not; got "
                f"collectives={'given' if self.collectives is not None else None}, "
                f"hlo={'given' if self.hlo is not None else None}, {self.hlo_error=}")

    @classmethod
    def from_compiled(cls, compiled: Any) -> ProgramCost:
        """Everything above, from a compiled executable (`jit(...).lower(...).compile()`)."""
        analysis = _analysis(compiled)
        flops, bytes_accessed = _numbers(analysis)
        seconds = analysis.get("optimal_seconds")
        program = cls.from_hlo(compiled.as_text(), flops, bytes_accessed,
                               XlaMemory.from_compiled(compiled),
                               None if seconds is None else float(seconds),
                               _platform(compiled))
        if "flops" not in analysis and program.hlo is not None:
            # The GPU compiler has no cost analysis: the HLO's own loop-once
            # figures stand in, so that the loop-aware ones are the HLO's.
            program = dataclasses.replace(program, xla_flops=program.hlo.dot_flops_once,
                                          xla_bytes_accessed=program.hlo.bytes_accessed_once)
        return program

    @classmethod
    def from_hlo(cls, hlo_text: str, xla_flops: float, xla_bytes_accessed: float,
                 memory: XlaMemory | None = None,
                 xla_seconds: float | None = None,
                 platform: str | None = None) -> ProgramCost:
        """The summary of HLO text and XLA's figures for it.

        Text that `cost.hlo.parse_hlo` cannot read gives a summary with
        `hlo_error` set (a measured objective needs none of the HLO's
        figures, so this is not an error here).
        """
        try:
            collectives, hlo = parse_hlo(hlo_text)
        except ValueError as err:
            return cls(xla_flops, xla_bytes_accessed, None, None, memory, str(err) or
                       "unreadable HLO text", xla_seconds, platform)
        return cls(xla_flops, xla_bytes_accessed, collectives, hlo, memory,
                   xla_seconds=xla_seconds, platform=platform)

    def notes(self) -> tuple[str, ...]:
        """What the model could not count in this program, as notes
        (`base.warnings`): unreadable HLO, loops whose trip count is unknown
        (counted once), instructions whose cost is unknown, collectives whose
        group size is unknown, and permutes without source-target pairs
        (costed as moving nothing). Empty for a program read whole.

        Example: `("uncounted: loop bodies with an unknown trip count, counted
        once: %body.12",)`.
        """
        if self.hlo_error:
            return (note("uncounted", f"the HLO text could not be read ({self.hlo_error}); "
                                      "XLA's own figures, which count each loop once, are "
                                      "used"),)
        out = []
        loops = self.collectives.unknown_trip_counts if self.collectives else ()
        if loops:
            out.append(note("uncounted", "loop bodies with an unknown trip count, counted "
                                         f"once: {_listed(loops)}"))
        ops = self.hlo.unknown_ops if self.hlo else ()
        if ops:
            out.append(note("uncounted", f"instructions whose flops or bytes are unknown, "
                                         f"counted as none: {_listed(ops)}"))
        sizes = self.collectives.unknown_group_sizes if self.collectives else ()
        if sizes:
            out.append(note("ungrouped", "collectives whose group size is unknown, costed "
                                         f"as within one device: {_listed(sizes)}"))
        pairless = [c.name for c in (self.collectives.collectives if self.collectives else ())
                    if c.kind == "collective-permute" and not c.groups]
        if pairless:
            out.append(note("ungrouped", "collective-permutes without source-target pairs, "
                                         f"costed as moving nothing: {_listed(pairless)}"))
        return tuple(out)

    @property
    def readable(self) -> bool:
        """Whether the HLO text was read (the collectives and loop trips are known)."""
        return not self.hlo_error

    @property
    def flops(self) -> float:
        """Loop-aware flops (:func:`loop_aware`); XLA's own count when the HLO
        could not be read."""
        if self.hlo is None:
            return self.xla_flops
        return loop_aware(self.xla_flops, self.xla_bytes_accessed, self.hlo)[0]

    @property
    def bytes_accessed(self) -> float:
        """Loop-aware bytes accessed; XLA's own count when the HLO could not be read."""
        if self.hlo is None:
            return self.xla_bytes_accessed
        return loop_aware(self.xla_flops, self.xla_bytes_accessed, self.hlo)[1]

    @property
    def compiler_seconds(self) -> float | None:
        """The chip compiler's own estimate of the step, loops counted, in
        seconds; None where there is none to trust (`compiler_seconds_problem`
        says why).

        The TPU compiler's `optimal_seconds` sums a roofline time per
        instruction (the slowest of its flops, bytes and transcendentals at
        the chip's rates), counting each `while` body once. Two corrections:

        - libtpu charges each `ConcatBitcast` custom-call -1 s, a sentinel
          (measured on libtpu 0.0.42.1: programs holding 30, 33, 42, 64, 122
          and 182 of them gave -29.997, -32.998, -41.989, -63.997, -121.997
          and -181.971 s); they are given back, counted as the compiler
          counts them (`HloCost.custom_calls_once`).
        - the missing loop trips: the estimate is scaled by the loop-aware
          over the loop-once bytes accessed (`bytes_accessed /
          xla_bytes_accessed`). Measured against the same Llama unrolled
          (v5e 2x2, bf16, 4 layers, d_model 512 and 1024), this came 7-23%
          above the unrolled program's estimate, the flops' ratio 35-150%:
          at these sizes the step is mostly memory time outside the layer
          loop (the optimizer's update), where the flops are not. When the
          layers dominate, both ratios near the number of layers.

        None when the compiler gave none (XLA:CPU, GPU), it is not finite,
        the HLO could not be read (the trips are unknown), or it is not
        above 0 after the correction.
        """
        return self._compiler_estimate()[0]

    @property
    def compiler_seconds_problem(self) -> str:
        """Why `compiler_seconds` is None, e.g. "the compiler gave no
        optimal_seconds (XLA:CPU and the GPU compiler give none)"; "" when it
        is a number."""
        return self._compiler_estimate()[1]

    def _compiler_estimate(self) -> tuple[float | None, str]:
        raw = self.xla_seconds
        if raw is None:
            return None, ("the compiler gave no optimal_seconds (XLA:CPU and the GPU compiler "
                          "give none)")
        if not math.isfinite(raw):
            return None, f"the compiler's optimal_seconds={raw!r} is not finite"
        if self.hlo is None:
            return None, ("the HLO text could not be read, so the loop trips the compiler's "
                          f"optimal_seconds={raw!r} leaves out are unknown")
        calls = dict(self.hlo.custom_calls_once)
        seconds = raw - sum(calls.get(target, 0) * value
                            for target, value in _SENTINEL_SECONDS.items())
        if not seconds > 0:
            return None, (f"the compiler's optimal_seconds={raw!r} ({seconds!r} without its "
                          "sentinels) is not above 0; its estimate of this program is unusable")
        scale = self.bytes_accessed / self.xla_bytes_accessed if self.xla_bytes_accessed else 1.0
        return seconds * scale, ""

    @property
    def link_bytes(self) -> float | None:
        """Bytes each device sends over its links per step (ring-algorithm
        estimate summed over the collectives); None when the HLO could not be read."""
        return None if self.collectives is None else self.collectives.transferred_bytes()


def _listed(names: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


# Seconds libtpu's optimal_seconds charges per custom-call of these targets,
# instead of a time (see ProgramCost.compiler_seconds).
_SENTINEL_SECONDS = {"ConcatBitcast": -1.0}


def cost_numbers(compiled: Any) -> tuple[float, float]:
    """`(flops, bytes accessed)` per device from `compiled.cost_analysis()`."""
    return _numbers(_analysis(compiled))


def _analysis(compiled: Any) -> dict[str, Any]:
    analysis = compiled.cost_analysis()  # None on GPU
    if isinstance(analysis, list | tuple):  # older jaxlibs give one dict per program
        analysis = analysis[0] if analysis else {}
    return analysis or {}


def _numbers(analysis: dict[str, Any]) -> tuple[float, float]:
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
      hlo: the same module's `HloCost` from `cost.hlo.parse_hlo`.

    Returns:
      `(flops, bytes accessed)`, e.g. `(5 * 2 * 128**3, ...)` for a 5-step scan
      of f32[128,128] matmuls, where XLA reports `2 * 128**3`.
    """
    # Each difference is >= 0 unless a loop never runs; XLA counted that loop's
    # body once, so taking it away cannot go below zero by more than rounding.
    return (max(0.0, flops + hlo.dot_flops - hlo.dot_flops_once),
            max(0.0, bytes_accessed + hlo.bytes_accessed - hlo.bytes_accessed_once))
