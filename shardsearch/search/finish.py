"""The end of a search: re-time the finalists interleaved, pick the winner, check it.

The values the search recorded were measured minutes apart; the finalists
(the best distinct plans and every baseline near them) are timed again side
by side, and `pick_winner` decides with paired tests. The winner's outputs
are then compared with the replicated plan's.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from ..base import mesh as _mesh
from ..base.target import TargetMemoryWarning, gpu_memory_advice
from ..base.warnings import ShardsearchWarning
from ..rules.base import rule_from_config
from .evaluation import confirm as _confirm
from .evaluation.outcome import fingerprint
from .evaluation.stages import COMPLETE
from .result import OptimizeResult
from .setup import StudySetup
from .space.candidate import Candidate, is_variant
from .study.record import TrialRecord

# Baselines whose search time is within this factor of the best are re-timed
# with the finalists.
CONFIRM_WITHIN = 1.5

# Where nothing is re-timed (the static objective), a plan that is no
# baseline takes the best baseline's place only with a value lower by at
# least this share: the model's figures are not that exact, and on a tie the
# plan a person knows is the better answer (on the published v5e row,
# microbatches=2 "won" by 0.002%).
ESTIMATE_MARGIN = 0.01


class NothingCompleted(RuntimeError):
    """No candidate of a study completed (within this run's budget): there is
    no winner to pick. `setup` is the study's `StudySetup` when it got that
    far (None otherwise)."""

    def __init__(self, message: str, setup: StudySetup | None = None):
        super().__init__(message)
        self.setup = setup


def finish(
    setup: StudySetup,
    study: optuna.Study,
    records: list[TrialRecord],
    rounds: int,
    specs: dict[str, tuple[Any, ...]] | None = None,
    candidates: Mapping[int, Candidate] | None = None,
) -> OptimizeResult:
    """The search's result from its records: the finalists re-timed in
    `rounds` interleaved rounds when the objective confirms, the winner
    picked, its outputs checked against replicated.

    Args:
      setup: the study's setup (context, replicated reference).
      study, records: the study and every trial's record, in order.
      rounds: interleaved re-timing rounds (0: none).
      specs: spec trees by fingerprint that this run resolved (the search
        loop's); filled in here for finalists it lacks.
      candidates: candidates by trial number that this run evaluated; used
        as they are. Trials of an earlier run or another worker, which the
        study holds as JSON only, are rebuilt from their stored rules.

    Raises:
      NothingCompleted: no candidate completed, or none within the budget.
    """
    ctx, mesh = setup.context, setup.context.mesh
    specs = {} if specs is None else specs
    candidates = candidates or {}
    complete = [r for r in records if r.outcome.status == COMPLETE]
    if not complete:
        raise NothingCompleted(
            f"no candidate completed in study {study.study_name!r}: "
            + "; ".join(sorted({r.outcome.reason for r in records})[:3])
            + " — raise the budget, n_trials or compile_timeout", setup)
    by_fp: dict[str, TrialRecord] = {}
    for r in sorted(complete, key=lambda r: r.outcome.value):
        by_fp.setdefault(r.outcome.fingerprint, r)
    baselines: dict[str, float] = {}
    for r in complete:
        if r.label != "search":
            baselines.setdefault(r.label, r.outcome.value)
    # A baseline's knob variant is reported beside it but competes as a
    # searched plan: it must be faster to win.
    known = [r for r in complete if r.label != "search" and not is_variant(r.label)]
    checked: dict[int, bool] = {}

    def usable(r: TrialRecord) -> bool:
        if r.number not in checked:
            checked[r.number] = _usable(r, setup, specs)
        return checked[r.number]

    finalists = [r for r in by_fp.values() if usable(r)][:_confirm.SEARCHED_FINALISTS]
    if not finalists:
        raise NothingCompleted(
            f"no completed candidate of study {study.study_name!r} fits this run's budget of "
            f"{ctx.budget} bytes per device with the rules it recorded; raise the budget or "
            "start another study", setup)
    base_records = [r for r in sorted(known, key=lambda r: r.outcome.value) if usable(r)]
    # The best baseline and every other one close to the best time: values
    # from the search were measured minutes apart, and a plan 20% behind
    # there can come out ahead when timed side by side.
    seen = {f.outcome.fingerprint for f in finalists}
    for i, r in enumerate(base_records):
        if r.outcome.fingerprint not in seen and (
                i == 0 or r.outcome.value <= finalists[0].outcome.value * CONFIRM_WITHIN):
            finalists.append(r)
            seen.add(r.outcome.fingerprint)
    confirmation: dict[str, Any] = {}
    verdict = "unconfirmed"
    winner = estimated_winner(finalists[0], base_records[0] if base_records else None)
    if winner.label == "search" or is_variant(winner.label):
        close = [r for r in by_fp.values()
                 if r.outcome.value <= winner.outcome.value * (1 + ESTIMATE_MARGIN) and usable(r)]
        winner = least_communication(close)
    if ctx.objective.confirms and rounds > 0 and len(finalists) > 1:
        labelled = [(_name(r), specs[r.outcome.fingerprint], ctx.with_setting(r.knobs))
                    for r in finalists]
        confirmation = _confirm.retime(labelled, ctx, rounds)
        base_fps = {r.outcome.fingerprint for r in base_records}
        winner, verdict = pick_winner(
            [(r, confirmation[_name(r)].times, r.outcome.fingerprint in base_fps,
              r.outcome.memory.get("total")) for r in finalists])
    best_specs = specs[winner.outcome.fingerprint]
    _advise_gpu_memory(ctx, winner)
    outputs_match = worst = None
    if ctx.objective.confirms:
        outputs_match, worst = _confirm.compare_outputs(
            best_specs, setup.reference_specs, ctx.with_setting(winner.knobs))
    best_time = (confirmation[_name(winner)].median if confirmation else winner.outcome.value)
    # The winner as this run evaluated it; a record that only the study holds
    # (an earlier run's, another worker's) is rebuilt from its stored rules.
    best = candidates.get(winner.number) or _stored_candidate(winner, mesh)
    return OptimizeResult(
        best_rule=best.state_rule,
        best_batch_rule=best.batch_rule,
        best_label=winner.label, best_specs=best_specs, best_time=best_time,
        baselines=baselines, confirmation=confirmation, verdict=verdict,
        outputs_match=outputs_match, max_relative_error=worst, trials=records,
        study=study, objective=ctx.objective.name, budget=ctx.budget,
        mesh_axes=_mesh.axis_sizes(mesh), compiles=ctx.compiles,
        best_memory=winner.outcome.memory.get("total"), setup=setup,
        best_knobs=(ctx.knobs.values(winner.knobs) if ctx.knobs is not None
                    else dict(winner.knobs)))


def estimated_winner(best: TrialRecord, baseline: TrialRecord | None) -> TrialRecord:
    """The winner by the values the search recorded: `best` (the lowest), or
    `baseline` (the best baseline, no knob variant) when `best` is not one
    and is lower by less than `ESTIMATE_MARGIN` of it. The interleaved
    re-timing, where the objective has one, decides again (`pick_winner`).

    Example:
      search 5.30 s against fsdp_tp 6.57 s → the search's plan;
      fsdp_tp~microbatches=2 7.9523 s against fsdp_tp 7.9525 s → fsdp_tp.
    """
    if (baseline is None or best is baseline or best.label == baseline.label
            or best.outcome.value < baseline.outcome.value * (1 - ESTIMATE_MARGIN)):
        return best
    return baseline


def least_communication(close: Sequence[TrialRecord]) -> TrialRecord:
    """Of searched plans whose values are within `ESTIMATE_MARGIN` of the
    best (the first), the one whose breakdown charges the least
    communication, then the least memory per device. An estimate cannot
    tell them apart, and the plan that moves less data leans less on the
    model's overlap of communication with compute: on the published v5p 32B
    row 8 microbatches and 4 came out at one estimate, moving 4.60 s and
    2.75 s of collectives. Plans without a breakdown (a measured value) keep
    their order.

    Example:
      8 microbatches 5.300 s, communication 4.60 s; 4 microbatches 5.301 s,
      communication 2.75 s → the 4.
    """
    def key(r: TrialRecord) -> tuple[float, float]:
        comm = (r.outcome.breakdown or {}).get("communication")
        memory = r.outcome.memory.get("total")
        return (math.inf if comm is None else comm, math.inf if memory is None else memory)

    best = close[0]
    if key(best)[0] == math.inf:
        return best
    return min(close, key=key)  # stable: the lower value on equal figures


def pick_winner(
    finalists: Sequence[tuple[Any, Sequence[float], bool] | tuple[Any, Sequence[float], bool,
                                                                  int | None]],
) -> tuple[Any, str]:
    """The winner of the interleaved re-timing, and its verdict.

    Args:
      finalists: `(item, paired times, is_baseline[, bytes per device])`; at
        least two, each with the same number of rounds.

    The fastest median wins, except that

    - a searched plan must be significantly faster (one-sided paired
      Wilcoxon, at 5% divided by the number of searched finalists) than the
      fastest baseline among the finalists to take its place: picking the
      lowest of a few noisy medians favours whichever got lucky, and on a tie
      the plan a person already knows is the better answer;
    - when the winner is a baseline, the baselines it is not significantly
      faster than, and whose medians' 95% intervals overlap its own, tie
      with it; of those that also tie with every tied baseline faster than
      them, the one with the smallest
      per-device memory wins (unknown memory counts as largest): the same
      speed with more headroom, and a choice that does not flip between two
      runs with the noise (data parallel against FSDP on a simulated mesh).

    Verdict: "faster" when the winner is significantly faster than the
    fastest of the others, else "tie".
    """
    order = sorted(finalists, key=lambda f: statistics.median(f[1]))
    winner = order[0]
    base = next((f for f in order if f[2]), None)
    searched = sum(not f[2] for f in finalists)
    # The fastest of several searched plans is tested, so the level is split
    # among them (Bonferroni): the best of three noisy medians beats a
    # baseline at 5% far more often than one plan that is no faster does.
    if not winner[2] and base is not None and not _confirm.faster_than(
            winner[1], base[1], alpha=_confirm.ALPHA / searched):
        winner = base
    if winner[2]:
        tied = [f for f in order if f[2] and (f is winner or _ties(winner[1], f[1]))]
        # A tie is not transitive: through a fastest plan with a wide interval,
        # two plans may both tie with it while one is slower in every round
        # than the other. A plan wins on memory only if it ties with every
        # tied plan faster than it.
        tied = [f for i, f in enumerate(tied) if all(_ties(g[1], f[1]) for g in tied[:i])]
        winner = min(tied, key=_footprint)  # stable: the faster on equal memory
    runner_up = next(f for f in order if f is not winner)
    return winner[0], "faster" if _confirm.faster_than(winner[1], runner_up[1]) else "tie"


def _ties(fastest: Sequence[float], other: Sequence[float]) -> bool:
    """Whether `other` may count as the same speed as `fastest`: not
    significantly slower, and the 95% intervals of their medians overlap.
    Under 6 rounds the paired test can never say "slower"; the intervals
    (the whole range, then) still can: a plan slower in every round is
    slower, whatever memory it saves."""
    return (not _confirm.faster_than(fastest, other)
            and _confirm.median_ci(other)[0] <= _confirm.median_ci(fastest)[1])


def _footprint(finalist: tuple[Any, ...]) -> float:
    memory = finalist[3] if len(finalist) > 3 else None
    return math.inf if memory is None else memory


def _advise_gpu_memory(ctx: Any, winner: TrialRecord) -> None:
    """Warns when the winner, planned for GPUs, needs more than JAX gives a
    program by default or fits too closely to trust (`gpu_memory_advice`)."""
    total = winner.outcome.memory.get("total")
    advice = (gpu_memory_advice(ctx.target, total)
              if ctx.target is not None and total is not None else None)
    if advice:
        warnings.warn(TargetMemoryWarning(f"{_name(winner)}: {advice}"),
                      stacklevel=4)


def _name(record: TrialRecord) -> str:
    return record.label if record.label != "search" else f"trial {record.number}"


class FinalistWarning(ShardsearchWarning):
    """A completed trial left out of the finalists: over this run's budget, or
    its stored rules no longer give the specs it was evaluated with."""


def _usable(record: TrialRecord, setup: StudySetup, specs: dict[str, tuple[Any, ...]]) -> bool:
    """Whether a completed trial may be a finalist of this run: within its
    budget, and (for a trial only the study holds) its stored rules still
    give the specs whose fingerprint it recorded. Fills `specs` for it."""
    ctx, fp = setup.context, record.outcome.fingerprint
    total = record.outcome.memory.get("total")
    if ctx.budget is not None and total is not None and total > ctx.budget:
        warnings.warn(FinalistWarning(
            f"trial {record.number} ({record.label}) is left out of the finalists: XLA "
            f"needs {total} bytes per device, over this run's budget of {ctx.budget}"),
            stacklevel=4)
        return False
    if fp not in specs:
        rebuilt = _stored_candidate(record, ctx.mesh).specs(ctx.abstract_args)
        if fingerprint(rebuilt, record.knobs) != fp:
            warnings.warn(FinalistWarning(
                f"trial {record.number} ({record.label}) is left out of the finalists: its "
                f"stored rules now give specs with fingerprint "
                f"{fingerprint(rebuilt, record.knobs)}, not the "
                f"{fp} it was evaluated with (the rules' code changed since)"), stacklevel=4)
            return False
        specs[fp] = rebuilt
    return True


def _stored_candidate(record: TrialRecord, mesh: Any) -> Candidate:
    """The candidate of a stored trial, from its rules as the study holds them."""
    return Candidate(rule_from_config(record.state_rule, mesh),
                     rule_from_config(record.batch_rule, mesh), record.label,
                     knobs=record.knobs)
