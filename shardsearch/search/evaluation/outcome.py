"""What happened to one candidate (`Outcome`), and the fingerprint of its spec trees.

An `Outcome` is stored in the study as a trial's user attribute, so a
resumed study reuses it; the fingerprint (`fingerprint`) is the cache key of
every evaluation, the same string in any process for the same specs.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

from ...base import spec as _spec
from ...base import tree as _tree
from .stages import CUT, Stage, Status

# How the reason of a candidate whose outputs hold NaN or Inf begins.
NONFINITE = "non-finite loss"
# How the reason of a candidate stage 1 cut on its predicted memory begins.
PREDICTED = "predicted before compiling"
# Compiled candidates (of one `prediction_pool`) a study needs before stage 1
# cuts on the predicted memory: fewer leave the scale too uncertain.
PREDICTION_SAMPLES = 3


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one candidate.

    Attributes:
      fingerprint: hash of the resolved spec trees ("" when they could not be
        resolved).
      status: a `Status`: "complete", "cut" or "failed" (a string given is
        converted).
      cut_stage: the `Stage` that cut the candidate (stored as its id:
        1 check, 2 compile, 4 estimate, 3 measure); None unless cut.
      reason: why it was cut or failed; "" when complete.
      value: the objective in seconds (median measured step, or the static
        estimate); None unless complete.
      compile_seconds: lower + compile wall time; 0 when not compiled.
      step_times: every timed repeat, in order.
      warmup_times: the untimed warm-up steps before them, in order, timed
        the same way (the first includes the runtime's work on an
        executable's first run); stored only when there are some.
      memory: per-device bytes: "arguments" (analyzer estimate), "predicted"
        (stage 1's prediction from the jaxpr, `cost.footprint`, unscaled) and,
        once compiled, XLA's "argument", "output", "temp", "alias" and "total".
      flops: flops per device per step: XLA's count with the matmul flops of
        the loop trips it leaves out added back (`ProgramCost.flops`); XLA's
        own count when the HLO text could not be read; None before compiling.
      collective_bytes: bytes moved by collectives per device per step.
      bytes_accessed: bytes the compiled program reads and writes per device
        per step, loops counted (`ProgramCost.bytes_accessed`); None before
        compiling, and in outcomes stored before it was kept.
      cache_hit: the result was reused from an earlier identical fingerprint.
      log_count: non-blank lines XLA (or the step) printed to stderr while
        the candidate compiled and ran, e.g. "[SPMD] Involuntary full
        rematerialization" warnings; 0 in studies from before they were kept.
      log_first: the first of them ("" when none), at most
        `logs.FIRST_LINE_CHARS` characters.
      estimate: the hardware model's seconds per step for the compiled
        program, for objectives that estimate ("static": the value itself;
        "hybrid": what decided whether it was timed); None otherwise.
      breakdown: the estimate's parts (`cost.breakdown.Breakdown.to_json()`:
        compute, memory, each collective kind x axes); None when not
        estimated or the model gives only a number (a subclass overriding
        `HardwareModel.estimate`).
      notes: what could not be read while judging it (`base.warnings`
        notes: leaves a logical rule had no names for, loops or ops the cost
        model could not count, collectives without groups); stored only when
        there are some.
      compiler_estimate: the chip compiler's own seconds per step, loops
        counted (`cost.program.ProgramCost.compiler_seconds`: TPU targets),
        a second estimator beside `estimate`; stored only when there is one.

    `to_json` is the form of the trial attribute "outcome", which predates
    `estimate` and `breakdown`: the study stores those two beside it, in
    attributes of their own (`search.record`).

    Example:
      >>> Outcome("ab12", "cut", 1, "invalid specs: ...").cut_stage
      <Stage.CHECK: 'check'>
    """

    fingerprint: str
    status: Status
    cut_stage: Stage | None = None
    reason: str = ""
    value: float | None = None
    compile_seconds: float = 0.0
    step_times: tuple[float, ...] = ()
    warmup_times: tuple[float, ...] = ()
    memory: dict[str, int] = dataclasses.field(default_factory=dict)
    flops: float | None = None
    collective_bytes: float | None = None
    bytes_accessed: float | None = None
    cache_hit: bool = False
    log_count: int = 0
    log_first: str = ""
    estimate: float | None = None
    breakdown: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    compiler_estimate: float | None = None

    def __post_init__(self) -> None:
        # Stored outcomes come back with the plain string and int.
        try:
            status = Status(self.status)
            stage = (None if self.cut_stage is None else self.cut_stage
                     if isinstance(self.cut_stage, Stage) else Stage.from_id(self.cut_stage))
        except ValueError:
            raise ValueError(
                f"Outcome {self.fingerprint!r}: status={self.status!r}, cut_stage="
                f"{self.cut_stage!r}; the statuses are {tuple(s.value for s in Status)} and "
                f"the stages' stored ids {tuple(s.id for s in Stage)}") from None
        if (status == CUT) != (stage is not None):
            raise ValueError(
                f"Outcome {self.fingerprint!r}: status={status.value!r} with cut_stage="
                f"{self.cut_stage!r}; a cut outcome names the stage that cut it, no other does")
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "cut_stage", stage)

    def to_json(self) -> dict[str, Any]:
        """The stored "outcome" attribute: every field but `estimate` and `breakdown`."""
        out = dataclasses.asdict(self)
        del out["estimate"], out["breakdown"]
        out["status"] = self.status.value
        out["cut_stage"] = None if self.cut_stage is None else self.cut_stage.id
        out["step_times"] = list(self.step_times)
        # Older outcomes have none of these: an outcome without them keeps their form.
        for key in ("notes", "warmup_times"):
            if out[key]:
                out[key] = list(out[key])
            else:
                del out[key]
        for key in ("compiler_estimate", "bytes_accessed"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        data = dict(data)
        data["step_times"] = tuple(data.get("step_times", ()))
        data["notes"] = tuple(data.get("notes", ()))
        data["warmup_times"] = tuple(data.get("warmup_times", ()))
        return cls(**data)


def fingerprint(specs: Sequence[Any], knobs: Sequence[tuple[str, Any]] = ()) -> str:
    """Stable hash of spec trees and the step's knob setting: same specs and
    knobs, same string, in any process. The default setting `()` adds
    nothing, so a study without knobs keeps the fingerprints it had."""
    digest = hashlib.sha256()
    for i, tree in enumerate(specs):
        for path, spec in _tree.leaf_specs(tree):
            digest.update(f"{i}:{path}={_spec.canonical(spec)};".encode())
    for name, value in knobs:
        digest.update(f"knob:{name}={value!r};".encode())
    return digest.hexdigest()[:16]
