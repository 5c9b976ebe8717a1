"""The processes of one multi-process search, moving through the same jobs together.

`execution.distributed` says how such a search runs; this is its engine. On
process 0 a `Lockstep` is the context's `executor`: for each job
(`evaluate`, `nonfinite`, `retime`, `compare`) it publishes the job in the
key-value store of JAX's distributed runtime, runs it here, and merges what
every process reports. The others call `Lockstep.follow`. Each process's
`execution.watchdog.Watchdog` beats, watches the others, and ends a process
stuck in a collective.

Keys, under one prefix per search (`shardsearch/<session>/`):
`job/K` (the job, pickled), `job/K/result/Q` (process Q's result),
`job/K/ready/B/Q` (whether Q compiled and may enter the steps),
`job/K/failed/Q` (Q's step failed while the others may be in a collective
with it), `beat/Q`, `bye/Q`.

Example (process 0, inside `optimize`)::

    ctx.executor = Lockstep(ctx, Distributed(timeout=30))
    outcome, log = ctx.executor.evaluate(ctx, specs, fp, memory, None, True, NO_STANDING)
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from ..evaluation import confirm as _confirm
from ..evaluation import logs as _logs
from ..evaluation.context import Context
from ..evaluation.evaluate import error_line
from ..evaluation.outcome import Outcome
from ..evaluation.stages import COMPLETE, FAILED
from ..evaluation.standing import NO_STANDING, Standing
from .base import Base
from .distributed import (
    PROCESS_TIMES_ATTR,
    Distributed,
    LeaderStopped,
    PeerFailed,
    PeerLost,
    merge_outcomes,
    runtime_client,
    signature,
)
from .inprocess import InProcess
from .watchdog import Watchdog

# How long one wait on the store lasts before the waiter looks at the beats again.
POLL_SECONDS = 1.0

# Seconds the leader waits for the others to acknowledge the end of the run.
BYE_SECONDS = 10.0

# The most characters of a candidate's log lines a process sends the leader.
LOG_CHARS = 100_000

_sessions = itertools.count()


class Lockstep(Base):
    """The processes of one search, moving through the same jobs together: an
    `Executor` (`execution.base`).

    On the leader (process 0) it is the context's `executor`: `evaluate`,
    `nonfinite_under`, `retime` and `compare_outputs` publish a job, run it
    here, and merge what every process reports. The others call `follow`.

    Args:
      ctx: the search's context (built by `make_context`, the same in every
        process).
      settings: the `Distributed` settings.
    """

    def __init__(self, ctx: Context, settings: Distributed):
        self.client, self.ctx = runtime_client(), ctx
        self.index, self.count = jax.process_index(), jax.process_count()
        self.timeout = settings.timeout
        self.compile_timeout = ctx.compile_timeout
        # Every process calls optimize the same number of times, so the session
        # numbers agree and the keys of two searches never meet.
        self.prefix = f"shardsearch/{next(_sessions)}"
        self.job = 0
        self.process_times: dict[str, list[list[float]]] = {}
        # Process 0's search sets it around each candidate it evaluates: how to
        # record that candidate's failure if this process ends stuck in it.
        self.abandon: Callable[[Outcome], None] | None = None
        self._barrier, self._echo, self._stepping = 0, False, False
        self._evaluating: tuple[str, dict[str, int]] | None = None
        self._own_failure: str | None = None  # this process's step failed, this job
        self.watch = Watchdog(self.client, self.prefix, self.index, self.count,
                              settings.timeout, ctx.execute_timeout)
        self.watch.on_stuck = self._stuck
        # Every job runs here through the in-process executor, and its progress
        # events feed this process's rendezvous and watchdog.
        self.local = InProcess()
        ctx.progress = self._progress

    @property
    def leader(self) -> bool:
        return self.index == 0

    # ----------------------------------------------------------- the leader's side

    def start(self) -> bool:
        """The isolation's start (`evaluate.preflight`): the handshake."""
        self.handshake(self.ctx)
        return True

    def handshake(self, ctx: Context) -> None:
        """Job 0: every process checks it runs the same search.

        Raises:
          ValueError: a process has other arguments, mesh or settings.
        """
        mine = signature(ctx)
        results = self._lead(ctx, ("start", mine))
        other = [i for i, (_kind, value, _err, _own) in enumerate(results) if value != mine]
        if other:
            raise ValueError(
                f"optimize: process(es) {other} run another search than process 0 (other "
                "workload, mesh, objective, budget, warmup or repeats); start every process "
                "with the same command")

    def evaluate(self, ctx: Context, specs: Sequence[Any], fp: str, memory: dict[str, int],
                 report: Callable[[int, float], bool] | None, run: bool,
                 standing: Standing = NO_STANDING) -> tuple[Outcome, _logs.LogLines]:
        """Stage 2 and the objective in every process; the merged outcome.

        `report` is not called: a pruner stopping one process part-way
        through its steps would leave the others in a collective.
        """
        del report
        self._evaluating = fp, dict(memory)
        try:
            results = self._lead(ctx, ("evaluate", tuple(specs), fp, dict(memory), run,
                                       standing, ctx.setting))
        except PeerLost:
            if self._own_failure is None:
                raise
            # This process's step failed and the others, left inside a collective,
            # ended: the candidate failed here; the next job stops the search.
            return Outcome(fp, FAILED, None, f"process 0: {self._own_failure}",
                           memory=dict(memory)), _logs.LogLines()
        finally:
            self._evaluating = None
        outcome = self._merge_outcomes(fp, memory, results)
        log = results[0][1][2] if results[0][2] is None else _logs.LogLines()
        return outcome, log

    def nonfinite_under(self, ctx: Context, specs: Sequence[Any]) -> str | None:
        """`evaluate.nonfinite_under` in every process: the first problem found."""
        job = ("nonfinite", tuple(specs), ctx.setting)
        for i, (_kind, value, err, _own) in enumerate(self._lead(ctx, job)):
            if err is None and value is not None:
                return f"process {i}: {value}"
        return None

    def retime(self, ctx: Context, finalists: Sequence[tuple[str, Sequence[Any]]],
               rounds: int) -> dict[str, Any]:
        """`confirm.retime` in every process; each round's time is the slowest's.

        Raises:
          RuntimeError: it failed in a process (named).
        """
        job = ("retime", [(f[0], tuple(f[1]), (f[2] if len(f) > 2 else ctx).setting)
                          for f in finalists], rounds)
        results = self._values(self._lead(ctx, job))
        out = {}
        for label in results[0]:
            times = tuple(max(r[label].times[j] for r in results)
                          for j in range(len(results[0][label].times)))
            out[label] = _confirm.Timing(label, times, statistics.median(times),
                                         _confirm.median_ci(times))
        return out

    def compare_outputs(self, ctx: Context, specs: Sequence[Any],
                        reference_specs: Sequence[Any], rtol: float) -> tuple[bool, float]:
        """`confirm.compare_outputs` in every process: all must match.

        Raises:
          RuntimeError: it failed in a process (named).
        """
        results = self._values(self._lead(ctx, ("compare", tuple(specs),
                                                tuple(reference_specs), rtol, ctx.setting)))
        return all(m for m, _w in results), max(w for _m, w in results)

    @contextlib.contextmanager
    def guard(self, record: Callable[[Outcome], Any]) -> Iterator[None]:
        """Around one candidate: the watchdog records its failure with `record`
        if the processes end stuck in it."""
        self.abandon = record
        try:
            yield
        finally:
            self.abandon = None

    def trial_attrs(self, outcome: Outcome) -> dict[str, Any]:
        """The extra trial attributes of an outcome this run measured: every
        process's own step times (the recorded ones are their per-step maximum)."""
        times = self.process_times.pop(outcome.fingerprint, None)
        if outcome.cache_hit or not times or not any(times):
            return {}
        return {PROCESS_TIMES_ATTR: times}

    def close(self) -> None:
        """The leader ends the run: every process stops following, and says why
        when an exception is ending the leader's search."""
        if self.watch.stopped:
            return
        if self.leader:
            error = sys.exc_info()[1]
            reason = None if error is None else (
                "it was interrupted" if isinstance(error, KeyboardInterrupt)
                else error_line(error))
            try:
                self._put(f"job/{self.job}", ("stop", reason))
                deadline = time.monotonic() + BYE_SECONDS
                for q in range(1, self.count):
                    self._get(f"bye/{q}", deadline, q, "acknowledge the end of the run")
            except PeerLost:
                pass  # a peer already gone has nothing left to hear
        self.watch.stop()

    def _lead(self, ctx: Context, job: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self.watch.lost is not None:  # noticed while the last job ended
            raise PeerLost(self.watch.lost)
        k = self.job
        self.job += 1
        self._put(f"job/{k}", job)
        results = [self._run(ctx, job, k)]
        # A process cut or failed early waits here while the others compile.
        deadline = time.monotonic() + self.compile_timeout + self.timeout
        for q in range(1, self.count):
            results.append(self._get(f"job/{k}/result/{q}", deadline, q,
                                     f"report on job {k} ({job[0]})"))
        return results

    def _values(self, results: list[tuple[Any, ...]]) -> list[Any]:
        # The process where it went wrong first, not one that stopped because of it.
        for i, (kind, _value, err, _own) in sorted(enumerate(results),
                                                   key=lambda r: not r[1][3]):
            if err is not None:
                raise RuntimeError(f"{kind} failed in process {i}: {err}")
        return [value for _kind, value, _err, _own in results]

    def _merge_outcomes(self, fp: str, memory: dict[str, int],
                        results: list[tuple[Any, ...]]) -> Outcome:
        outcomes = []
        for _kind, value, err, own in results:
            if err is not None:  # an error of ours, not a candidate's outcome
                outcomes.append((Outcome(fp, FAILED, None, err, memory=dict(memory)), own))
            else:
                outcomes.append((value[0], own and value[1]))
        merged = merge_outcomes(outcomes)
        if merged.status == COMPLETE and merged.step_times:
            self.process_times[fp] = [list(o.step_times) for o, _own in outcomes]
        return merged

    # ----------------------------------------------------------- everyone's side

    def follow(self, ctx: Context) -> None:
        """Runs the leader's jobs until it ends the run (processes 1 to N-1).

        Raises:
          PeerLost: the leader died, hangs or cannot be reached.
          LeaderStopped: the leader's search ended with an error.
        """
        try:
            while True:
                k = self.job
                self.job += 1
                job = self._get(f"job/{k}", time.monotonic() + self.timeout, 0,
                                "send the next job")
                if job[0] == "stop":
                    self._put(f"bye/{self.index}", True)
                    if job[1] is not None:
                        raise LeaderStopped(f"process 0 stopped the search: {job[1]}")
                    return
                result = self._run(ctx, job, k)
                self._put(f"job/{k}/result/{self.index}", result)
                if job[0] == "evaluate":
                    print(f"process {self.index}: {_line(job[2], result)}", flush=True)
        finally:
            self.watch.stop()

    def _run(self, ctx: Context, job: tuple[Any, ...], k: int) -> tuple[Any, ...]:
        """Runs one job here: `(kind, value, error line or None, own)`, where
        `own` is False when it failed only because another process did."""
        kind = job[0]
        self._barrier, self._echo, self._own_failure = 0, False, None
        self.watch.job = k  # the job the watchdog and the ready keys look at
        try:
            value = self._local(ctx, job)
            error = None
        except PeerFailed as failed:
            value, error, self._echo = None, str(failed), True
        except Exception as err:  # a job's error is reported, not raised, in lockstep
            value, error = None, error_line(err)
        finally:
            stepped, self._stepping = self._stepping, False
            self.watch.running_since = None
        failure = error if value is None else (
            value[0].reason or "failed" if kind == "evaluate" and value[0].status == FAILED
            else None)
        if stepped and failure is not None and not self._echo:
            # It failed after the steps began (an execution error, NaN in its
            # shards only): the others may be inside a collective this process
            # will not enter. Their watchdogs read this.
            self._own_failure = failure
            self.client.key_value_set_bytes(f"{self.prefix}/job/{k}/failed/{self.index}",
                                            failure.encode()[:2000])
        # Whoever waits to start running this job learns that this process will not.
        self._publish_ready(False, error or "this process did not get to run the step")
        if kind == "evaluate" and value is not None and \
                value[0].status == FAILED and self._echo:
            value = (value[0], False, value[2])
        return kind, value, error, not self._echo

    def _local(self, ctx: Context, job: tuple[Any, ...]) -> Any:
        kind = job[0]
        if kind == "start":
            return signature(ctx)
        if kind == "evaluate":
            _kind, specs, fp, memory, run, standing, setting = job
            outcome, log = self.local.evaluate(ctx.with_setting(setting), specs, fp, memory,
                                               None, run, standing)
            # The store's messages are small; the count and first line stay whole.
            return outcome, True, _logs.LogLines(log.text[-LOG_CHARS:], log.count, log.first)
        if kind == "nonfinite":
            return self.local.nonfinite_under(ctx.with_setting(job[2]), job[1])
        if kind == "retime":
            return self.local.retime(ctx, [(label, specs, ctx.with_setting(setting))
                                           for label, specs, setting in job[1]], job[2])
        if kind == "compare":
            return self.local.compare_outputs(ctx.with_setting(job[4]), job[1], job[2], job[3])
        raise ValueError(f"unknown lockstep job {kind!r}")

    def _progress(self, event: str) -> None:
        if event == "compiling":
            self.watch.running_since = None
        elif event == "running":
            # Before the first step, all at once: no process may enter a
            # collective that another will not.
            self._publish_ready(True, "")
            deadline = time.monotonic() + self.compile_timeout + self.timeout
            b = self._barrier - 1
            for q in range(self.count):
                if q == self.index:
                    continue
                ok, reason = self._get(f"job/{self.watch.job}/ready/{b}/{q}", deadline, q,
                                       "finish compiling")
                if not ok:
                    self._echo = True
                    raise PeerFailed(f"process {q}: {reason}")
            self._stepping = True
            self.watch.running_since = time.monotonic()
        elif event == "step":
            self.watch.running_since = time.monotonic()

    def _publish_ready(self, ok: bool, reason: str) -> None:
        b = self._barrier
        self._barrier += 1
        self._put(f"job/{self.watch.job}/ready/{b}/{self.index}", (ok, reason))

    # ----------------------------------------------------------- the store

    def _put(self, key: str, value: Any) -> None:
        try:
            self.client.key_value_set_bytes(f"{self.prefix}/{key}", pickle.dumps(value))
        except Exception as err:  # the coordinator is gone: nothing can go on
            raise PeerLost(self._unreachable(err)) from None

    def _get(self, key: str, deadline: float, who: int, what: str) -> Any:
        while True:
            if self.watch.lost is not None:
                self.watch.noticed = True
                raise PeerLost(self.watch.lost)
            wait = min(POLL_SECONDS, deadline - time.monotonic())
            if wait <= 0:
                self.watch.noticed = True
                self.watch.lost = (f"process {who} did not {what} within the timeout; it "
                                   "died or hangs, so the search stops (restart every process "
                                   "to resume it)")
                raise PeerLost(self.watch.lost)
            try:
                data = self.client.blocking_key_value_get_bytes(
                    f"{self.prefix}/{key}", max(int(wait * 1000), 1))
            except Exception as err:
                if "DEADLINE_EXCEEDED" in str(err) or "deadline" in str(err).lower():
                    continue
                self.watch.noticed = True
                raise PeerLost(self._unreachable(err)) from None
            return pickle.loads(data)

    def _unreachable(self, err: BaseException) -> str:
        line = error_line(err)
        who = "process 0 (the coordinator)" if not self.leader else "the coordination service"
        return (f"{who} cannot be reached ({line[:200]}); it died or its machine is "
                "unreachable, so the search stops (restart every process to resume it)")

    def _stuck(self, reason: str) -> None:
        """The watchdog's hook before this process ends stuck in a step:
        process 0 records the candidate as failed, with `reason` naming the
        process that failed."""
        evaluating, abandon = self._evaluating, self.abandon
        if self.leader and evaluating is not None and abandon is not None:
            fp, memory = evaluating
            abandon(Outcome(fp, FAILED, None, reason, memory=memory))


def _line(fp: str, result: tuple[Any, ...]) -> str:
    """A follower's one line about a candidate, e.g. "candidate 3fa2c1d0e4b5a697
    complete, median 12.3 ms over 7 steps (this process)"."""
    _kind, value, error, _own = result
    if error is not None:
        return f"candidate {fp} failed here: {error}"
    outcome = value[0]
    text = f"candidate {fp} {outcome.status.value}"
    if outcome.step_times:
        median = statistics.median(outcome.step_times)
        text += (f", median {median * 1e3:.3g} ms over {len(outcome.step_times)} steps "
                 "(this process)")
    elif outcome.reason:
        text += f": {outcome.reason[:200]}"
    return text
