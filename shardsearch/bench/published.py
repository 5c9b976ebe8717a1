"""Measured runs others published, and the static estimate of the same run.

A suite entry with a `published` field describes a training run someone
measured on hardware we do not have (MaxText on TPU, Megatron-LM on H100,
`../shared/ANCHORS.md`): how many chips, its throughput (TFLOP/s per chip or
MFU), how the publisher counted a step's FLOPs, and which of the workload's
expert plans is the sharding it used. From that:

- `published_step_seconds`: the throughput turned back into seconds per
  step, `flops_per_step / (chips * TFLOP/s per chip)`, with the publisher's
  FLOP count (`step_flops`);
- `estimate_published`: the hardware model's estimate of the same plan on
  the same mesh (compiled here for simulated devices; nothing runs), with its
  breakdown, whatever its memory (a plan that ran on the hardware fits there,
  whatever XLA's CPU figures say).

Nothing here is fitted: the published figures are only ever compared with.

Example:
    >>> p = Published(chips=256, tflops_per_chip=120.0, plan="fsdp_tp", source="...")
    >>> published_step_seconds(3.1e17, p)  # 3.1e17 / (256 * 120e12)
    10.09...
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

# How a publisher counted the FLOPs of a step (forward and backward):
#   "6n+attention": 6 x weights used in matmuls x tokens, plus the attention
#       products QK^T and AV over the full seq x seq scores (12 x layers x
#       tokens x seq x heads x head_dim); MaxText's count before it halved the
#       causal attention, and Megatron-LM's `num_floating_point_operations`.
#   "6n+causal-attention": the same with the attention term halved (MaxText's
#       later count, which skips the masked half of the scores).
FLOP_COUNTS = ("6n+attention", "6n+causal-attention")
_KEYS = ("chips", "tflops_per_chip", "mfu", "peak_tflops", "flop_count", "plan", "source",
         "sharding", "note")


@dataclasses.dataclass(frozen=True)
class Published:
    """A measured run: its size, throughput and sharding, and where it was published.

    Attributes:
      chips: chips (GPUs) the run used; the entry's mesh has as many devices.
      tflops_per_chip: the published model TFLOP/s per chip; None when only
        `mfu` is given.
      mfu: the published model-FLOPs utilisation (0..1); used when
        `tflops_per_chip` is None (with `peak_tflops`), else only reported.
      peak_tflops: the chip's bf16 peak the MFU is relative to (TFLOP/s).
      flop_count: how the publisher counted a step's FLOPs (`FLOP_COUNTS`).
      plan: the expert plan (`workloads.expert_plans`) that is the published
        sharding on the entry's mesh, e.g. "fsdp_tp" for MaxText's FSDP x TP;
        the search runs it as one of its baselines.
      source: where the figures come from.
      sharding: the sharding in the publisher's words, e.g. "FSDP 256".
      note: anything the report should say with the row.

    Example: `Published(chips=96, tflops_per_chip=466, plan="megatron",
    source="Megatron-LM README", sharding="TP2 x DP48")`.
    """

    chips: int
    plan: str
    source: str
    tflops_per_chip: float | None = None
    mfu: float | None = None
    peak_tflops: float | None = None
    flop_count: str = "6n+attention"
    sharding: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.chips, bool) or not isinstance(self.chips, int) or self.chips < 1:
            raise ValueError(f"published.chips must be a whole number >= 1, got {self.chips!r}")
        for name in ("plan", "source"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"published.{name} must be a non-empty string, got {value!r}")
        for name in ("tflops_per_chip", "mfu", "peak_tflops"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, int | float) or not math.isfinite(value) or value <= 0):
                raise ValueError(f"published.{name} must be a positive number or null, got "
                                 f"{value!r}")
        if self.mfu is not None and self.mfu > 1:
            raise ValueError(f"published.mfu={self.mfu!r} is a fraction (0.611 for 61.1%), "
                             "not a percentage")
        if self.tflops_per_chip is None and (self.mfu is None or self.peak_tflops is None):
            raise ValueError("published: give tflops_per_chip, or mfu with peak_tflops, to "
                             "turn the run's throughput into a step time")
        if self.flop_count not in FLOP_COUNTS:
            raise ValueError(f"published.flop_count={self.flop_count!r}; choose one of "
                             f"{FLOP_COUNTS}")

    @property
    def throughput(self) -> float:
        """Model FLOP/s per chip the run reached: the published TFLOP/s, or
        MFU x peak. Example: `mfu=0.611, peak_tflops=197` → 1.2037e14."""
        if self.tflops_per_chip is not None:
            return self.tflops_per_chip * 1e12
        assert self.mfu is not None and self.peak_tflops is not None  # __post_init__
        return self.mfu * self.peak_tflops * 1e12

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Published:
        """From a suite entry's "published" object.

        Raises:
          ValueError: not an object, an unknown or missing field, a bad value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"published must be an object with {_KEYS}, got "
                             f"{type(data).__name__}")
        unknown = [k for k in data if k not in _KEYS]
        if unknown:
            raise ValueError(f"published: unknown field {unknown[0]!r}; fields are "
                             f"{', '.join(_KEYS)}")
        missing = [k for k in ("chips", "plan", "source") if k not in data]
        if missing:
            raise ValueError(f"published: missing {missing[0]!r}")
        return cls(**data)


def attention_flops(dims: Mapping[str, int]) -> float:
    """The attention products' FLOPs of one step over the full score matrix:
    `12 * layers * batch * seq * seq * heads * head_dim` (forward 2 products
    x 2 FLOPs per multiply-add, backward twice that), from a workload's
    `dims`. Example: layers 2, batch 8, seq 32, heads 4, head_dim 16 →
    12 * 2 * 8 * 32 * 32 * 64 = 12,582,912."""
    return 12.0 * dims["n_layers"] * dims["batch"] * dims["seq"] ** 2 * (
        dims["n_heads"] * dims["head_dim"])


def step_flops(workload: Any, flop_count: str) -> float:
    """A step's FLOPs as the publisher counted them.

    The built-in llama and gpt workloads' `flops_per_step` is
    "6n+attention" (6 x matmul weights x tokens + the full attention
    products); "6n+causal-attention" takes half of the attention term away.
    """
    if flop_count not in FLOP_COUNTS:
        raise ValueError(f"flop_count={flop_count!r}; choose one of {FLOP_COUNTS}")
    flops = workload.flops_per_step
    if flop_count == "6n+causal-attention":
        flops -= attention_flops(workload.dims) / 2
    return flops


def published_step_seconds(flops_per_step: float, published: Published) -> float:
    """Seconds per step of the published run: `flops / (chips * FLOP/s per chip)`.

    Example: 3.166e17 FLOPs on 256 chips at 120 TFLOP/s each →
    3.166e17 / (256 * 1.2e14) = 10.31 s.
    """
    return flops_per_step / (published.chips * published.throughput)


def estimate_published(workload: Any, mesh: Any, published: Published, hardware: Any,
                       dcn_axes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The hardware model's estimate of the published plan, and the published time.

    The plan is compiled for `mesh` (abstract arguments; nothing runs) with
    no memory budget, and estimated with `hardware` on the mesh's topology.

    Returns:
      `plan` (its name), `flops_per_step` and `step_seconds` under each FLOP
      count, `published_seconds` (under the publisher's count), `estimate`,
      `ratio` (estimate / published), `breakdown` (`Breakdown.to_json()`),
      `compiler_estimate` (the chip compiler's own, loops counted: TPU
      targets only), `memory_per_device` (XLA's figures for the devices the
      mesh holds: a target's are the chip compiler's),
      `fits_chip` (XLA's total within the chip's memory), `status` and
      `reason` (when it could not be estimated).
    """
    from ..search.evaluation.evaluate import evaluate, resolve
    from ..search.evaluation.outcome import fingerprint
    from ..search.setup import make_context
    from ..search.space.candidate import Candidate
    from ..workloads import expert_plan

    plan = expert_plan(workload, mesh, published.plan)
    ctx, _ = make_context(workload, None, mesh, memory_budget=None, objective="static",
                          hardware=hardware, dcn_axes=dcn_axes)
    # The run fitted on the chip, so no budget: the estimate is what is compared.
    ctx = dataclasses.replace(ctx, budget=None)
    specs, why = resolve(Candidate(plan.state_rule, plan.batch_rule, published.plan), ctx)
    counts = {count: step_flops(workload, count) for count in FLOP_COUNTS}
    out: dict[str, Any] = {
        "plan": published.plan, "plan_description": plan.description,
        "flops_per_step": counts,
        "step_seconds": {c: published_step_seconds(f, published) for c, f in counts.items()},
        "throughput_per_chip": published.throughput,
    }
    out["published_seconds"] = out["step_seconds"][published.flop_count]
    if specs is None:
        return {**out, "status": "invalid", "reason": why, "estimate": None, "ratio": None}
    outcome = evaluate(specs, fingerprint(specs), ctx, run=False)
    memory = dict(sorted(outcome.memory.items()))
    chip = hardware.memory_bytes
    out.update(status=str(outcome.status), reason=outcome.reason, estimate=outcome.estimate,
               compiler_estimate=outcome.compiler_estimate,
               breakdown=outcome.breakdown, memory_per_device=memory,
               fits_chip=(None if chip is None or "total" not in memory
                          else memory["total"] <= chip))
    out["ratio"] = (outcome.estimate / out["published_seconds"]
                    if outcome.estimate is not None else None)
    return out


def compare(entry: Any, estimated: Mapping[str, Any], result: Any,
            known: Mapping[str, Any], setting: Sequence[tuple[str, Any]] = ()
            ) -> dict[str, Any]:
    """An entry's `published` record: `estimated` (`estimate_published`'s
    record), plus what the search made of the published plan (`in_search`:
    its baseline trial's status under the entry's budget) and its winner
    (`winner`: label, the knobs it sets off their defaults, estimate,
    breakdown, and `speedup` = the published plan's estimate / the winner's,
    above 1 when the model rates the winner faster).

    Args:
      entry: the suite entry (its `published`).
      estimated: `estimate_published(...)` for the entry.
      result: the search's `OptimizeResult`.
      known: fingerprint → the search's `Outcome`s.
      setting: the winner's knob setting (`Knobs.setting`: the knobs off
        their defaults). The same specs under the step's default knobs are
        another candidate, with another estimate.
    """
    from ..search.evaluation.outcome import fingerprint
    from ..search.space.baselines import START_PREFIX

    published = entry.published
    out = dict(estimated)
    # An expert baseline, or the plan file the runner starts the search from.
    labels = (published.plan, START_PREFIX + published.plan)
    trials = [r for r in result.trials if r.label in labels]
    if trials:
        o = trials[0].outcome
        out["in_search"] = {"trial": trials[0].number, "status": str(o.status),
                            "cut_stage": o.cut_stage.label if o.cut_stage else None,
                            "reason": o.reason, "estimate": o.estimate,
                            "memory_per_device": dict(sorted(o.memory.items()))}
    else:
        out["in_search"] = None
    win_fp = fingerprint(result.best_specs, setting)
    win = known.get(win_fp)
    estimate = win.estimate if win is not None else None
    out["winner"] = {
        "label": result.best_label, "knobs": dict(setting),
        "fingerprint": win_fp, "estimate": estimate,
        "breakdown": win.breakdown if win is not None else None,
        "memory_per_device": dict(sorted(win.memory.items())) if win is not None else {},
        "speedup": (out["estimate"] / estimate if estimate and out.get("estimate")
                    else None)}
    return out
