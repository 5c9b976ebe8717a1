"""The executor seam: where stage 2, the objective and the timing runs happen.

Stage 1 always runs in the study process. Everything that compiles or runs
the step goes through the context's `executor`, one object per study that
satisfies `Executor`:

- `InProcess` (`execution.inprocess`): here, in the study process;
- `Isolation` (`execution.isolate`): in one supervised worker process, so
  a candidate that crashes or hangs fails alone;
- `Lockstep` (`execution.lockstep`): in every JAX process of a mesh that
  spans several, together, the outcomes merged.

`search.evaluation` calls only these methods (through `ctx.executor`) and
never asks which executor it has; the search loop asks only `guard` and
`trial_attrs`. A new place to run candidates is one class with these
methods, chosen in `search.setup`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..evaluation.confirm import Timing
    from ..evaluation.context import Context
    from ..evaluation.logs import LogLines
    from ..evaluation.outcome import Outcome
    from ..evaluation.standing import Standing


@runtime_checkable
class Executor(Protocol):
    """Runs the jobs of one study's evaluations somewhere.

    Attributes:
      runs_here: the jobs run in this process, so a finalist may bring its
        own context (the benchmarks' 1-device reference) to `retime`.
    """

    runs_here: bool

    def start(self) -> bool:
        """Gets ready before the first trial; False to fall back to `InProcess`."""
        ...

    def close(self) -> None:
        """Releases what `start` took (a worker process, a session)."""
        ...

    def evaluate(self, ctx: Context, specs: Sequence[Any], fp: str, memory: dict[str, int],
                 report: Callable[[int, float], bool] | None, run: bool,
                 standing: Standing) -> tuple[Outcome, LogLines]:
        """Stage 2 and the objective (`evaluation.evaluate.compile_and_score`),
        with the candidate's log lines; `standing` is the study as of this
        trial (`evaluation.standing.Standing`)."""
        ...

    def nonfinite_under(self, ctx: Context, specs: Sequence[Any]) -> str | None:
        """Where the first steps under `specs` give NaN or Inf, or None."""
        ...

    def retime(self, ctx: Context, finalists: Sequence[tuple[Any, ...]],
               rounds: int) -> dict[str, Timing]:
        """The finalists timed in interleaved rounds (`evaluation.confirm`)."""
        ...

    def compare_outputs(self, ctx: Context, specs: Sequence[Any],
                        reference_specs: Sequence[Any], rtol: float) -> tuple[bool, float]:
        """One step under both spec trees: `(metrics match, worst difference)`."""
        ...

    def guard(self, record: Callable[[Outcome], Any]) -> contextlib.AbstractContextManager[Any]:
        """Around one candidate's evaluation: how to record its failure if the
        executor ends stuck in it (a lockstep peer lost inside a collective)."""
        ...

    def trial_attrs(self, outcome: Outcome) -> dict[str, Any]:
        """Extra trial attributes for an outcome it produced (each process's
        step times in lockstep); usually none."""
        ...


class Base:
    """Defaults an executor may inherit: nothing to start, guard or add."""

    runs_here = False

    def start(self) -> bool:
        return True

    def close(self) -> None:
        return None

    def guard(self, record: Callable[[Outcome], Any]) -> contextlib.AbstractContextManager[Any]:
        del record
        return contextlib.nullcontext()

    def trial_attrs(self, outcome: Outcome) -> dict[str, Any]:
        del outcome
        return {}
