"""`InProcess`: the executor that runs every job here, in the calling process.

What `optimize(isolate=False)` uses, what a study falls back to when its
worker cannot start, and what the isolated worker and each lockstep process
run their jobs with. XLA's log lines of each job are caught and counted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..evaluation import confirm as _confirm
from ..evaluation import evaluate as _evaluate
from ..evaluation import logs as _logs
from ..evaluation.context import Context
from ..evaluation.outcome import Outcome
from ..evaluation.standing import Standing
from .base import Base


class InProcess(Base):
    """Runs stage 2, the objective and the timing runs in this process."""

    runs_here = True

    def evaluate(self, ctx: Context, specs: Sequence[Any], fp: str, memory: dict[str, int],
                 report: Callable[[int, float], bool] | None, run: bool,
                 standing: Standing) -> tuple[Outcome, _logs.LogLines]:
        with _logs.capture_stderr() as caught:
            outcome = _evaluate.compile_and_score(specs, fp, ctx, memory, report, run,
                                                  standing)
        return outcome, caught[0]

    def nonfinite_under(self, ctx: Context, specs: Sequence[Any]) -> str | None:
        with _logs.capture_stderr() as caught:
            try:
                problem = _evaluate.first_steps(specs, ctx)
            except Exception:  # the replicated baseline's own trial records it
                problem = None
        if ctx.verbose:
            _logs.echo(caught[0].text, "the replicated plan")
        return problem

    def retime(self, ctx: Context, finalists: Sequence[tuple[Any, ...]],
               rounds: int) -> dict[str, _confirm.Timing]:
        return _confirm.retime_here(finalists, ctx, rounds)

    def compare_outputs(self, ctx: Context, specs: Sequence[Any],
                        reference_specs: Sequence[Any], rtol: float) -> tuple[bool, float]:
        return _confirm.compare_outputs_here(specs, reference_specs, ctx, rtol)
