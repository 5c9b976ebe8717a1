"""When a candidate being timed is slower than the best: the study's pruner.

A timed candidate reports each steady step's seconds as the trial's
intermediate values (its warm-ups after the first, then its timed steps:
`evaluate.time_steps`); the pruner cuts it once a one-sided rank-sum
(Mann-Whitney U) test says its steps so far are slower than the best
recorded trial's steps made `margin` slower (10%).

Why a margin: a trial's steps are timed minutes apart from the best's, and
the interleaved re-timing of the finalists at the end can reverse a search
ratio by more than a few percent (on cpu-sim8 at f74b9d3, trials the search
timed 1.09x and 1.003x behind its best came out 0.99x and 0.92x of it;
`benchmarks/results/pruning/`). A candidate that close is a finalist to
re-time, not a loser to cut.

Why not Optuna's `WilcoxonPruner`, which the search used before: it pairs
step i with the best trial's step i, and a signed-rank test of n pairs
cannot go under p = 0.1 before n = 4, however much slower the candidate is
(all 3 pairs slower is p = 1/8); the rank-sum test sets the candidate's
steps against all of the best's (7 by default), and two steps above all 7
are p = 1/36. It also read the best trial's intermediate values only, which
a baseline (an expert plan, timed without reports, never pruned) and a
cached copy of a timed trial do not have: while an expert plan was the best,
nothing was cut while timing. Here the best's steps come from its recorded
outcome. `benchmarks/pruning/replay.py` replays both rules on recorded studies.
"""

from __future__ import annotations

import math
import statistics
import warnings

import optuna
import scipy.stats

from ...base.warnings import ShardsearchWarning
from .record import TrialRecord


class SlowerThanBest(optuna.pruners.BasePruner):
    """Cuts a minimised trial whose reported steps are significantly slower
    than the best trial's timed steps.

    It cuts when the trial has at least `min_steps` finite reports, their
    mean is above the mean of the best trial's steps times `1 + margin`, and
    the one-sided Mann-Whitney U test of "the trial's steps are larger than
    the best's times `1 + margin`" has p below `p_threshold`. The best trial
    is the study's (`study.best_trial`); its steps are its intermediate
    values, else the step times of its recorded outcome (baselines and cache
    hits report none). With no best trial nothing is cut; with a best trial
    without timed steps on record (one stored before shardsearch kept them)
    nothing is cut either, and a `ShardsearchWarning` says so, once.

    Args:
      p_threshold: the test's level, in (0, 1).
      min_steps: the fewest reports a cut needs (>= 1).
      margin: how much slower than the best a trial must be shown to be
        (>= 0; 0.1: 10%).

    Example:
      >>> best = (1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0)
      >>> SlowerThanBest().slower((1.3, 1.2), best)
      True
      >>> SlowerThanBest().slower((1.06, 1.07, 1.06, 1.08), best)  # within the margin
      False
      >>> SlowerThanBest(margin=0.0).slower((1.06, 1.07, 1.06, 1.08), best)
      True
    """

    def __init__(self, p_threshold: float = 0.1, min_steps: int = 2,
                 margin: float = 0.1) -> None:
        if isinstance(p_threshold, bool) or not isinstance(p_threshold, int | float) or not (
                0 < p_threshold < 1):
            raise ValueError(f"SlowerThanBest: p_threshold={p_threshold!r}; give a level "
                             f"between 0 and 1, such as 0.1")
        if isinstance(min_steps, bool) or not isinstance(min_steps, int) or min_steps < 1:
            raise ValueError(f"SlowerThanBest: min_steps={min_steps!r}; give a whole number "
                             f"of reports >= 1")
        if isinstance(margin, bool) or not isinstance(margin, int | float) or not (
                math.isfinite(margin) and margin >= 0):
            raise ValueError(f"SlowerThanBest: margin={margin!r}; give a share >= 0, such as "
                             f"0.1 for 10%")
        self.p_threshold = float(p_threshold)
        self.min_steps = min_steps
        self.margin = float(margin)
        self._warned = False

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if study.direction != optuna.study.StudyDirection.MINIMIZE:
            raise ValueError(f"SlowerThanBest prunes a minimised study; study "
                             f"{study.study_name!r} maximises")
        steps = tuple(trial.intermediate_values.values())
        if len(steps) < self.min_steps:
            return False
        try:
            best = study.best_trial
        except ValueError:  # nothing completed yet
            return False
        best_steps = timed_steps(best)
        if not best_steps and not self._warned:
            self._warned = True
            warnings.warn(ShardsearchWarning(
                f"trial {best.number}, the study's best, has no timed steps on record (stored "
                "before shardsearch kept them), so no candidate is cut while timed until a "
                "timed one beats it"), stacklevel=2)
        return self.slower(steps, best_steps)

    def slower(self, steps: tuple[float, ...], best: tuple[float, ...]) -> bool:
        """Whether `steps` are significantly slower than `best` (both seconds)."""
        if len(steps) < self.min_steps or not best:
            return False
        if not all(math.isfinite(s) for s in (*steps, *best)):
            return False
        best = tuple(b * (1 + self.margin) for b in best)
        if statistics.fmean(steps) <= statistics.fmean(best):
            return False
        # Exact at every size: a tie among timings would make scipy's default
        # fall back to the normal approximation, which at 2 against 7 steps
        # gives 0.09 where the exact p is 1/9.
        p = scipy.stats.mannwhitneyu(steps, best, alternative="greater",
                                     method="exact").pvalue
        return bool(p < self.p_threshold)


def timed_steps(trial: optuna.trial.FrozenTrial) -> tuple[float, ...]:
    """A completed trial's steady steps, in seconds: its intermediate values
    (its steady warm-ups and timed steps), else its recorded outcome's step
    times (a baseline's or a cached copy's: timed steps only); empty when it
    has neither."""
    if trial.intermediate_values:
        return tuple(trial.intermediate_values.values())
    record = TrialRecord.from_trial(trial)
    return tuple(record.outcome.step_times) if record is not None else ()
