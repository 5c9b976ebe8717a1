"""Re-timing finalists interleaved, with confidence intervals, and a correctness check."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ...base import mesh as _mesh
from . import evaluate as _evaluate
from .context import Context


@dataclasses.dataclass(frozen=True)
class Timing:
    """One finalist's re-timed steps.

    Attributes:
      label: the candidate's name.
      times: seconds per step, one per round.
      median: their median.
      ci: distribution-free 95% confidence interval of the median (order
        statistics of the binomial), `(low, high)` in seconds.
    """

    label: str
    times: tuple[float, ...]
    median: float
    ci: tuple[float, float]

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "times": list(self.times), "median": self.median,
                "ci": list(self.ci)}


def median_ci(times: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Confidence interval of the median from order statistics.

    With n samples, the number below the true median is Binomial(n, 1/2); the
    interval runs between the order statistics that cover `level` of it. For
    fewer than 6 samples this is the full range.
    """
    from scipy import stats  # here: SciPy's import would add 0.8 s to every process's start

    xs = sorted(times)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    k = int(stats.binom.ppf((1 - level) / 2, n, 0.5))
    lo = max(k - 1, 0)
    return (xs[lo], xs[n - 1 - lo])


# Significance level of the paired tests (the confirmation's and the reports').
ALPHA = 0.05
# The most searched plans the re-timing tests against a baseline at once
# (finish keeps three finalists), each at ALPHA / SEARCHED_FINALISTS.
SEARCHED_FINALISTS = 3
# The fewest rounds at which the paired test can call a plan faster: with n
# rounds its smallest one-sided p-value is 1/2**n (every round faster), so
# 6 rounds (1/64) pass 0.05/3 and 5 (1/32) never do. Under it a searched
# plan could never replace the best baseline, whatever the times.
MIN_ROUNDS = next(n for n in range(1, 64) if 0.5**n < ALPHA / SEARCHED_FINALISTS)


def check_rounds(rounds: int, what: str = "", zero_ok: bool = True) -> None:
    """Refuses a number of re-timing rounds between 1 and `MIN_ROUNDS` - 1:
    too few for the paired test to say "faster", so a searched plan would
    lose to the baseline by rule. `what` names the setting in the message
    ("optimize: confirm_rounds"); `zero_ok`: whether 0 (no re-timing) is
    offered as the other way out.

    Example: `check_rounds(5, "optimize: confirm_rounds")` raises
    "optimize: confirm_rounds: 5 rounds are too few ...".
    """
    if 0 < rounds < MIN_ROUNDS:
        lead = f"{what}: " if what else ""
        other = ", or 0 to skip the re-timing" if zero_ok else ""
        raise ValueError(
            f"{lead}{rounds} rounds are too few: the paired test that lets a searched "
            f"plan replace the best baseline needs at least {MIN_ROUNDS} (with {rounds} its "
            f"smallest p-value, 1/{2**rounds}, is over {ALPHA}/{SEARCHED_FINALISTS}), so "
            f"every searched plan would lose by rule; use {MIN_ROUNDS} or more{other}")


def faster_than(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> bool:
    """True when paired samples `a` are significantly smaller than `b`
    (one-sided Wilcoxon signed-rank test on the per-round differences)."""
    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(diffs) < MIN_ROUNDS or not np.any(diffs):
        return False
    return bool(_signed_rank_p_less(diffs) < alpha)


def _signed_rank_p_less(diffs: np.ndarray) -> float:
    """The one-sided ("less") p-value of the Wilcoxon signed-rank test, as
    `scipy.stats.wilcoxon(diffs, alternative="less")` gives it.

    With ties or zeros among 13 or fewer differences, SciPy runs an exact
    permutation test that calls its statistic once per sign flip (2**n of
    them, about 2 s at 12 rounds). The same null distribution, every sign
    flip at once: zeros dropped, average ranks of |d|, the sum of the
    positive ranks, and SciPy's tolerance for equal sums (100 machine
    epsilons, relative). Other cases go to SciPy, which is quick there.
    """
    from scipy import stats

    n = len(diffs)
    nonzero = diffs[diffs != 0]
    tied = len(np.unique(np.abs(nonzero))) < len(nonzero)
    if n > 13 or not (tied or len(nonzero) < n):
        return float(stats.wilcoxon(diffs, alternative="less").pvalue)
    ranks = stats.rankdata(np.abs(nonzero))
    observed = float(ranks[nonzero > 0].sum())
    # Every sign pattern of the non-zero differences; each zero doubles every
    # pattern's count alike, which the fraction does not see.
    m = len(nonzero)
    signs = (np.arange(2**m)[:, None] >> np.arange(m)) & 1
    null = signs @ ranks
    gamma = abs(np.finfo(float).eps * 100 * observed)
    return float(np.count_nonzero(null <= observed + gamma) / 2**m)


def retime(
    finalists: Sequence[tuple[str, Sequence[Any]] | tuple[str, Sequence[Any], Context]],
    ctx: Context,
    rounds: int = 10,
) -> dict[str, Timing]:
    """Times every finalist once per round, in turn (A B C A B C …).

    Interleaving makes slow drifts of the machine hit every finalist alike,
    so the paired comparison between them is fair. Each timed step follows
    an untimed one of the same finalist, so that no finalist's time carries
    what the one before it left (a heavy plan slows the next step of
    whichever plan runs after it).

    Args:
      finalists: `(label, spec trees)` pairs; a third item, a Context, runs
        that finalist with its own step: another knob setting of `ctx`
        (`ctx.with_setting`), or, in this process only, on its own mesh (the
        benchmarks' 1-device reference).
      ctx: the study's context (compiles are counted there). The rounds run
        where its executor runs jobs, all of them in one process.
      rounds: timed steps per finalist.

    Raises:
      ValueError: a finalist has a context not derived from `ctx` while
        `ctx`'s executor runs elsewhere (interleaving across processes would
        not be fair).
      RuntimeError: the worker died or hung (isolated runs).
    """
    root = ctx.root or ctx
    if not ctx.executor.runs_here and any(len(f) > 2 and (f[2].root or f[2]) is not root
                                          for f in finalists):
        raise ValueError(
            "retime: finalists with their own context are timed in this process; "
            "build the contexts with isolate=False")
    return ctx.executor.retime(ctx, finalists, rounds)


def retime_here(
    finalists: Sequence[tuple[str, Sequence[Any]] | tuple[str, Sequence[Any], Context]],
    ctx: Context,
    rounds: int,
) -> dict[str, Timing]:
    """`retime` in this process: what every executor finally runs.

    Every finalist's arguments stay on the devices between its turns when
    they fit there together (`fit_together`); otherwise (a model whose state
    takes most of a chip) each turn places a fresh copy of its arguments and
    frees what its steps returned, so one finalist's arrays are on the
    devices at a time. Either way a timed step follows an untimed one of the
    same finalist."""
    runners = []
    for label, specs, *own in finalists:
        c = own[0] if own else ctx
        compiled, _ = _evaluate.compile_step(specs, c)
        runners.append([label, compiled, specs, None, [], c])
    together = fit_together([r[1].memory_analysis() for r in runners],
                            _mesh.device_memory(ctx.mesh))
    for runner in runners:
        _label, compiled, specs, _args, _times, c = runner
        args = tuple(_evaluate.place(specs, c))
        for _ in range(c.warmup):
            result, _metrics = compiled.monitored(*args)
            args = _evaluate.next_step(result, args)
            _evaluate.progress(c, "step")
        if together:
            runner[3] = args
        else:
            free(args)
    # One untimed step before each timed one when finalists alternate: a plan
    # that follows another pays for what that one left behind. Measured on
    # mlp:small over 8 simulated devices: fsdp's step right after dp's (0.5 s,
    # replicated parameters and moments on every device) took 55-66 ms against
    # 33-39 ms after any other plan, whichever plan came after dp; one settling
    # step in between took the whole difference (benchmarks/recheck/neighbours.py).
    # Arguments placed afresh get that step whatever the count.
    settle = 1 if len(runners) > 1 or not together else 0
    for _ in range(rounds):
        for runner in runners:
            _label, compiled, specs, args, times, c = runner
            args = args if together else tuple(_evaluate.place(specs, c))
            for _ in range(settle):
                result, _metrics = compiled.monitored(*args)
                args = _evaluate.next_step(result, args)
                _evaluate.progress(c, "step")
            result, metrics = compiled.monitored(*args)
            args = _evaluate.next_step(result, args)
            if together:
                runner[3] = args
            else:
                free(args)
            times.append(metrics["execution_time"])
            _evaluate.progress(c, "step")
    return {
        label: Timing(label, tuple(times), statistics.median(times), median_ci(times))
        for label, _c, _s, _a, times, _ctx in runners
    }


def fit_together(analyses: Sequence[Any], limit: int | None) -> bool:
    """Whether programs whose memory analyses are `analyses` can keep their
    arguments on one device together while each runs in turn: every
    program's arguments, plus the largest of what one needs beside its own
    arguments (the larger of its peak less its arguments and its
    temporaries: a v5e reserves the compiler's temporaries figure when it
    loads a program, "Attempting to reserve 7.24G" for a 400M llama whose
    peak less arguments is 4.97 GiB), within `limit` bytes (None: no limit
    known).

    Example:
      >>> a = types.SimpleNamespace(argument_size_in_bytes=4, temp_size_in_bytes=7,
      ...                           peak_memory_in_bytes=0)
      >>> fit_together([a, a], 15), fit_together([a, a], 14)
      (True, False)
    """
    if limit is None:
        return True
    arguments = [int(a.argument_size_in_bytes) for a in analyses]
    beside = [max(int(getattr(a, "peak_memory_in_bytes", 0) or 0) - n,
                  int(a.temp_size_in_bytes))
              for a, n in zip(analyses, arguments, strict=True)]
    return sum(arguments) + max(beside, default=0) <= limit


def free(tree: Any) -> None:
    """Frees the device buffers of a tree of arrays now (not when Python
    collects them), so the next program finds their memory."""
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()


def compare_outputs(
    specs: Sequence[Any], reference_specs: Sequence[Any], ctx: Context, rtol: float = 1e-5,
) -> tuple[bool, float]:
    """Runs one step under both spec trees from the same arguments: `specs`
    with the step of `ctx`'s knob setting, the reference with the step as
    given (the default setting), so a knob that changes the numbers
    (microbatches accumulating the gradient) is checked too.

    Returns `(match, worst)`: whether every metric (the step's second output)
    agrees to `rtol`, and, for the record, the worst difference over all
    outputs, state included, relative to each leaf's largest magnitude (at
    least 1e-3). Outputs that hold NaN or Inf on either side do not match,
    and their difference is infinite.

    Raises:
      RuntimeError: the worker died or hung (isolated runs).
    """
    return ctx.executor.compare_outputs(ctx, specs, reference_specs, rtol)


def compare_outputs_here(
    specs: Sequence[Any], reference_specs: Sequence[Any], ctx: Context, rtol: float = 1e-5,
) -> tuple[bool, float]:
    """`compare_outputs` in this process: what every executor finally runs."""
    outputs = []
    for s, c in ((specs, ctx), (reference_specs, ctx.with_setting(()))):
        compiled, _ = _evaluate.compile_step(s, c)
        args = _evaluate.place(s, c)
        result, _metrics = compiled.monitored(*args)
        _evaluate.progress(c, "step")
        outputs.append(_evaluate.to_host(result))
        free((args, result))  # the reference's step must find the devices empty
    (state, metrics), (ref_state, ref_metrics) = outputs
    match = True
    for got, want in zip(jax.tree.leaves(metrics), jax.tree.leaves(ref_metrics), strict=True):
        match &= bool(np.allclose(got, want, rtol=rtol, atol=0.0))
    worst = 0.0
    for got, want in zip(jax.tree.leaves((state, metrics)),
                         jax.tree.leaves((ref_state, ref_metrics)), strict=True):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if not (np.all(np.isfinite(got)) and np.all(np.isfinite(want))):
            # NaN compares as no difference at all; say it plainly instead.
            return False, math.inf
        if got.size:
            # The floor keeps leaves that are nearly zero (fresh Adam moments)
            # from turning rounding noise into huge ratios.
            scale = max(float(np.max(np.abs(want))), 1e-3)
            worst = max(worst, float(np.max(np.abs(got - want))) / scale)
    return match, worst
