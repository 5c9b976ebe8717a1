"""What one trial tries: a rule for the state, one for the batch, and the step's knobs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...base.activations import BATCH_KNOB, WHOLE
from ...base.activations import PREFIX as ACTIVATION_KNOB
from ...base.knobs import GRAD_GROUPS, MICROBATCHES, Knobs, Setting, setting_text
from ...base.spec import entry_axes
from ...base.tree import leaf_shape, specs_for_leaves
from ...rules.base import ShardingRule, argument_notes, argument_specs


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One sharding to try: a rule for the state and one for the other arguments.

    Attributes:
      state_rule: applied to the first argument (the train state).
      batch_rule: applied to every other argument (the batch).
      label: "search" for proposals, or the baseline's name ("replicated",
        "default", "fsdp", ...).
      knobs: the step's knobs that differ from their defaults, as
        `(name, value)` pairs (`base.knobs.Knobs.setting`): the step this
        candidate compiles is `knobs.step(candidate.knobs)`. `()`: the step
        as given. Where the step names activations, the expert baselines,
        and a search's proposals unless it chooses `act_batch`, set it
        (`baselines.pin_batch`, `baselines.pinned`).
      readable: the parameters that are codes, decoded, as `(name, text)`
        pairs: `(("auto_order", "tp,dp"), ("priority", "auto,memory"))` for
        the Lehmer codes `auto_order_<i>` and `priority_<i>`; empty for
        baselines. Recorded beside the trial's params so that a study reads
        without decoding (`study.record.readable_attrs`); not part of what the
        candidate is (left out of equality).

    Example:
      `Candidate(AutoShardingRule(mesh), BatchShardingRule(("dp",)), "default")`
      splits the state's leaves over the mesh and the batch dim over `dp`.
    """

    state_rule: ShardingRule
    batch_rule: ShardingRule
    label: str = "search"
    readable: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False)
    knobs: Setting = ()

    def __post_init__(self) -> None:
        for name in ("state_rule", "batch_rule"):
            if not isinstance(getattr(self, name), ShardingRule):
                raise TypeError(
                    f"Candidate.{name} must be a ShardingRule, got "
                    f"{type(getattr(self, name)).__name__}")

    @property
    def knobs_text(self) -> str:
        """The knobs as a person reads them, `"remat=full,microbatches=2"` or `"-"`."""
        return setting_text(self.knobs)

    def specs(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """Spec trees for `(state, *batch)`."""
        return argument_specs(self.state_rule, self.batch_rule, args)

    def batch_axes(self, args: Sequence[Any]) -> tuple[int | None, tuple[str, ...]]:
        """The rows of the batch (the leading dim of its first leaf that has
        one) and the mesh axes that split them, in the spec's order:
        `(None, ())` without such a leaf, `(rows, ())` when it is replicated."""
        pairs, specs = specs_for_leaves(tuple(args[1:]), tuple(self.specs(args)[1:]))
        for (_, leaf), spec in zip(pairs, specs, strict=True):
            shape = leaf_shape(leaf) or ()
            if len(shape) >= 1:
                return shape[0], tuple(entry_axes(spec[0] if spec else None))
        return None, ()

    def batch_split(self, args: Sequence[Any], axis_sizes: Mapping[str, int]
                    ) -> tuple[int | None, int]:
        """The rows of the batch (`batch_axes`) and how many devices split
        them: `(None, 1)` without a leaf that has rows, `(rows, 1)` when it
        is replicated."""
        rows, axes = self.batch_axes(args)
        return rows, math.prod(axis_sizes[a] for a in axes)

    def same_sharding(self, other: Candidate) -> bool:
        """Whether `other` splits the arguments by the same rules (its knobs aside)."""
        return (self.state_rule, self.batch_rule) == (other.state_rule, other.batch_rule)

    def notes(self, args: Sequence[Any]) -> tuple[str, ...]:
        """What its rules decided by fallback on `(state, *batch)` (`base.warnings` notes)."""
        return argument_notes(self.state_rule, self.batch_rule, args)


# Labels of a baseline's knob variants: "<baseline>~<knob>=<value>".
VARIANT_MARK = "~"

# How a candidate the step's factory will not build is cut (`search.loop`).
UNBUILDABLE = "the step cannot be built with"


def is_variant(label: str) -> bool:
    """Whether a label names a baseline's knob variant (`knob_variants`): a
    plan a person wrote, with a knob the search changed, which is no longer
    the plan they know (it wins only by being faster, like a searched one)."""
    return VARIANT_MARK in label


# The activation points sequence parallelism places on the tensor axes: the
# sequence of the residual stream, the attention's heads, the MLP's hidden
# width (the built-in transformers' names, `workloads._activations`).
SEQUENCE_PARALLEL = ("seq", "heads", "kv_heads", "mlp")


def knob_variants(candidate: Candidate, knobs: Knobs, tensor: tuple[str, ...] = (),
                  batch_devices: int = 1, batch_rows: int | None = None
                  ) -> dict[str, Candidate]:
    """`candidate`'s sharding with each single knob changed to each of its
    other values: how an expert tunes a plan they trust (remat off, two
    microbatches), one change at a time, labelled
    `"<label>~<knob>=<value>"`. Empty for a candidate whose knobs are not
    the defaults already. The activation knobs (`act_<name>`) are left to the
    sampler, a dozen values of half a dozen names, except for the one move
    experts make with them: with `tensor` axes and an `act_seq` knob, one
    variant puts every `SEQUENCE_PARALLEL` point that offers them on them
    (Megatron-LM's sequence parallelism). `grad_groups` alone changes nothing
    worth a trial; with each `microbatches` value there is one variant more
    that keeps the gradients of the `batch_devices` devices the candidate
    splits the batch over apart until the last microbatch (accumulated, and
    reduced once), where the step's factory builds it. Given `batch_rows`
    (the batch the `batch_devices` split), only `microbatches` counts that
    divide each device's rows are tried, as a person picks them: a slice of
    384 rows over 256 devices is 1.5 rows each, which XLA pads and moves
    between devices (the 16B v5e row: four microbatches estimated 13.6 s,
    two 7.95 s). An expert plan pinned to its batch split
    (`act_batch`, `baselines.pin_batch`) keeps its pin in every variant.

    Example:
      `knob_variants(fsdp, Knobs(f, {"remat": ("full", "none")}))` →
      `{"fsdp~remat=none": Candidate(fsdp's rules, knobs=(("remat", "none"),))}`
    """
    own = dict(candidate.knobs)
    if set(own) - {BATCH_KNOB}:
        return {}
    out = {}

    def add(values: dict[str, Any]) -> None:
        variant = _with_knobs(candidate, knobs.setting({**own, **values}))
        out[variant.label] = variant

    searched = knobs.searched()
    counts = tuple(k for k in searched.get(MICROBATCHES, ())[1:]
                   if _divides(k, batch_rows, batch_devices))
    for name, values in searched.items():
        if name.startswith(ACTIVATION_KNOB) or name == GRAD_GROUPS:
            continue
        for value in counts if name == MICROBATCHES else values[1:]:
            add({name: value})
    if batch_devices in searched.get(GRAD_GROUPS, ())[1:]:
        for k in counts:
            values = {MICROBATCHES: k, GRAD_GROUPS: batch_devices}
            if _builds(knobs, knobs.setting(values)):  # not too few rows per microbatch
                add(values)
    group = ",".join(tensor)
    chosen = {f"{ACTIVATION_KNOB}{n}": group for n in SEQUENCE_PARALLEL
              if group in knobs.searched().get(f"{ACTIVATION_KNOB}{n}", ())}
    if f"{ACTIVATION_KNOB}seq" in chosen:
        add(chosen)
    return out


@dataclasses.dataclass(frozen=True)
class GroupingProbe:
    """How a plan's `grad_groups` variants (`knob_variants`: one per
    microbatch count) are tried: `label` first, the one with the most
    microbatches, beside `sibling`, the variant with as many microbatches
    and the gradients reduced each time (None: there is none); the `others`
    only if the probe completed faster than its sibling, or completed where
    the sibling did not (`search.loop`).

    The most microbatches is where grouping stands best. Over k microbatches
    it saves k - 1 reductions of the gradients and costs k accumulations of
    unreduced ones, so it helps where a reduction costs more than k / (k - 1)
    accumulations, most easily at the largest k; and its accumulators' memory
    is the same at every k while the activations beside them are least
    there. On the Megatron-LM rows compiled for the H100, grouping was slower
    at 2 microbatches wherever it was at 4, and did not fit at 2 wherever it
    did not at 4 (benchmarks/results/knobs/grad-groups.md). So where it does
    not help at the most, it is not tried at fewer: on the 32B v5p row
    FSDP×TP's five grouped variants had each taken a minute of the chip's
    compile to come out 5.8x slower than their siblings."""

    label: str
    sibling: str | None
    others: tuple[str, ...]


def grouping_probe(variants: Mapping[str, Candidate]) -> GroupingProbe | None:
    """The `GroupingProbe` of a plan's `knob_variants`; None when fewer than
    two of them group the gradients (nothing to hold back)."""
    grouped = {label: dict(c.knobs) for label, c in variants.items()
               if GRAD_GROUPS in dict(c.knobs)}  # a setting names the knobs off their defaults
    if len(grouped) < 2:
        return None
    probe = max(grouped, key=lambda label: grouped[label].get(MICROBATCHES, 1))
    alone = {k: v for k, v in grouped[probe].items() if k != GRAD_GROUPS}
    sibling = next((label for label, c in variants.items()
                    if label not in grouped and dict(c.knobs) == alone), None)
    return GroupingProbe(probe, sibling, tuple(label for label in grouped if label != probe))


def knob_combinations(candidate: Candidate, knobs: Knobs, base: tuple[float, int | None],
                      completed: Mapping[Setting, tuple[float, int | None]],
                      over_memory: Sequence[Setting], per_cut: int = 2
                      ) -> dict[str, Candidate]:
    """The second round of tuning by hand, once `candidate`'s `knob_variants`
    have run: the changes that helped alone, together, and the ones that did
    not fit, with a change that saves memory.

    - Every variant faster than `candidate`, together (the fastest first; one
      that sets a knob an earlier one set is left out), when two or more are.
    - Each variant over the memory limit with the variants that completed in
      less memory than `candidate` itself, fewest bytes first, `per_cut` of
      them: "selective remat does not fit; with four microbatches it does".

    Settings that set one knob twice, that the step's factory refuses, or that
    a variant already is are left out. Labelled `"<baseline>~<setting>"`.

    Args:
      candidate: the best baseline (default knobs), or the best plan so far
        with its knobs (`activation_moves`): the settings below are changes
        to its own.
      knobs: the step's knobs.
      base: `candidate`'s value (None: it did not complete) and XLA total
        per device (None: not known).
      completed: each completed variant's changes → its value and total.
      over_memory: the changes of the variants cut over the memory limit.
      per_cut: memory-saving partners tried for each of those.

    Example:
      base 6.57 s at 55.7 GiB; `remat=selective` over the chip's memory,
      `microbatches=8` completed at 18.2 GiB and `microbatches=4` at 24.1 GiB
      → `{"fsdp_tp~microbatches=8,remat=selective": ...,
      "fsdp_tp~microbatches=4,remat=selective": ...}`.
    """
    out: dict[str, Candidate] = {}
    own = dict(candidate.knobs)
    tried = {knobs.setting({**own, **dict(s)}) for s in ((), *completed, *over_memory)}

    def add(parts: Sequence[Setting]) -> bool:
        merged, changed = dict(own), set()
        for setting in parts:
            for name, value in setting:
                if name in changed:
                    return False  # one knob set twice
                merged[name] = value
                changed.add(name)
        setting = knobs.setting(merged)
        if not setting or setting in tried or not _builds(knobs, setting):
            return False
        variant = _with_knobs(candidate, setting)
        if variant.label in out:
            return False
        out[variant.label] = variant
        return True

    value, memory = base
    faster, names = [], set()
    for setting, (seconds, _) in sorted(completed.items(), key=lambda kv: kv[1][0]):
        if value is not None and seconds < value and not names & {n for n, _ in setting}:
            faster.append(setting)
            names |= {n for n, _ in setting}
    if len(faster) >= 2:
        add(faster)
    savers = sorted((s for s, (_, total) in completed.items()
                     if memory is not None and total is not None and total < memory),
                    key=lambda s: completed[s][1])
    for cut in over_memory:
        paired = 0
        for saver in savers:
            if paired == per_cut:
                break
            paired += add((cut, saver))
    return out


def activation_moves(candidate: Candidate, knobs: Knobs,
                     tried: Sequence[Setting] = ()) -> dict[str, Candidate]:
    """The third round, from the best plan so far (`candidate`, its knobs as
    the first two rounds left them): each activation point (`act_<name>`
    knob) moved alone to each of its other values, one axis first, then
    several axes, then kept whole ("-": in the `published-chip` runs no such
    move beat its plan and most came out at the plan's own estimate, so they
    come last, where the budget runs out first). `knob_variants` leaves these
    to the sampler, whose random placements of every point at once mostly do not
    fit or compile (the `published-chip` H100 rows: 30-43% of the search's
    time); one point at a time from a plan that fits, a move costs what it
    changes. Settings in `tried`, or that the step's factory refuses, are
    left out. Labelled `"<baseline>~<setting>"`; `plan_moves`' tiers, in order.

    Example:
      `fsdp_tp~remat=full` → `{"fsdp_tp~remat=full,act_embed=tp": ...,
      "fsdp_tp~remat=full,act_batch=dp": ..., ...}`.
    """
    return {label: move for tier in plan_moves(candidate, knobs, tried)
            for label, move in tier.items()}


def plan_moves(candidate: Candidate, knobs: Knobs, tried: Sequence[Setting] = (),
               retune: bool = False, batch_rows: int | None = None, batch_devices: int = 1
               ) -> list[dict[str, Candidate]]:
    """The moves from a plan (`candidate` with its knobs), in four tiers
    that a search runs one after the other, going on from a better plan as
    soon as a tier finds one: with `retune`, each other knob changed alone
    (remat, microbatches at the counts that divide each device's
    `batch_rows / batch_devices` rows, as in `knob_variants`; empty without
    `retune`); each activation point moved to one axis; to several axes;
    kept whole (see `activation_moves`).

    `retune` is for a plan an activation move found: placing a point can free
    or cost the memory that decided remat and microbatches (the 16B H100
    row: `act_embed=tp` took full remat's plan from 13.2 to 6.4 GB per GPU,
    and without remat it then needs 62.6 GB and is estimated 0.829 s against
    0.903 s). Those knobs are a tier of their own, so that a better plan
    they find is moved from at once, not after the previous plan's
    activation moves (that row's run spent 9 of its 40 trials so).

    Example:
      `plan_moves(fsdp_tp~remat=full,act_embed=tp, knobs, retune=True)` →
      `[{"...~remat=none,act_embed=tp", "...~act_embed=tp" (selective)},
      {"...~remat=full,act_batch=dp,act_embed=tp", ...}, {several axes},
      {whole}]`.
    """
    current = dict(candidate.knobs)
    searched = knobs.searched()
    moves = []
    for name, values in searched.items():
        if name == GRAD_GROUPS or (not retune and not name.startswith(ACTIVATION_KNOB)):
            continue
        for value in values:
            if value == current.get(name, values[0]):
                continue
            if not name.startswith(ACTIVATION_KNOB):
                if name != MICROBATCHES or _divides(value, batch_rows, batch_devices):
                    moves.append((0, name, value))  # the other knobs first
                continue
            moves.append((3 if value == WHOLE else 2 if "," in str(value) else 1, name, value))
    seen = {knobs.setting(s) for s in (*tried, candidate.knobs)}
    tiers: list[dict[str, Candidate]] = [{}, {}, {}, {}]
    for tier, name, value in sorted(moves, key=lambda m: m[0]):
        setting = knobs.setting({**current, name: value})
        # Not the baseline itself (its first round ran it), nor a setting
        # tried already or that the factory refuses.
        if setting and setting not in seen and _builds(knobs, setting):
            variant = _with_knobs(candidate, setting)
            tiers[tier][variant.label] = variant
    return tiers


def _divides(count: Any, rows: int | None, devices: int) -> bool:
    """Whether `count` microbatches split each device's share of the batch's
    `rows` over `devices` evenly (True when the rows are not known or the
    count is not a count)."""
    return (rows is None or not isinstance(count, int) or count < 1
            or (rows // devices) % count == 0)


def _with_knobs(candidate: Candidate, setting: Setting) -> Candidate:
    """`candidate`'s sharding under the knob `setting`, labelled
    `"<baseline>~<setting>"` (the baseline `candidate` is, or was tuned from)."""
    label = f"{candidate.label.split(VARIANT_MARK)[0]}{VARIANT_MARK}{setting_text(setting)}"
    return dataclasses.replace(candidate, label=label, knobs=setting, readable=())


def _builds(knobs: Knobs, setting: Setting) -> bool:
    """Whether the step's factory builds the step of `setting` (it refuses, for
    example, grad_groups that do not divide a microbatch's rows)."""
    try:
        knobs.step(setting)
    except (ValueError, TypeError):
        return False
    return True
