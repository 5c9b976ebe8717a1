"""One search over several JAX processes: one mesh, every candidate run in lockstep.

JAX's multi-controller runtime runs the same program in every process, and a
mesh spans the devices of all of them: every process must compile the same
program and call it the same number of times, or the collectives between
them wait forever. So in a multi-process search

- process 0 (the *leader*) owns the study: it asks Optuna for candidates,
  resolves and checks them (stage 1), reuses recorded fingerprints, records
  every trial and writes the exports;
- for each candidate it must compile or run, it publishes a *job* (the spec
  trees, pickled) in the key-value store of JAX's distributed runtime (the
  coordination service `jax.distributed.initialize` starts; no RPC of ours),
  and every process, the leader included, runs the same code the
  single-process search runs (`evaluate.compile_and_score`,
  `confirm.retime`, `confirm.compare_outputs`, `evaluate.nonfinite_under`);
- before the first step of a compiled candidate the processes agree: each
  says whether its compile succeeded (and fits), and if any did not, all
  fail the candidate instead of entering a collective alone;
- each process publishes what happened to it; the leader merges them: a
  failure in any process fails the candidate, naming that process ("process
  1: compile failed: ..."); a step's time is the slowest process's time for
  that step (the per-step maximum), and the recorded value their median.

On the leader this is the context's `isolation` (the seam `evaluate` and
`confirm` ask); the other processes run `Lockstep.follow` instead of a
search, and print one line per evaluated candidate.

Every wait is bounded. Each process beats a key every second; a process
whose beat stops for `timeout` seconds (it died, or its machine did) makes
the others stop with `PeerLost` (exit code 1 from the command line); a
process stuck in XLA, where Python cannot interrupt it (a collective whose
peer is gone), leaves with exit code 1 from a watchdog thread. A step that
does not finish within `execute_timeout` ends the run the same way: no
process can leave a collective alone. A process leaving on an error says so
in the store (`announce_exit`), and the others stop at once. When process 0
dies, JAX's own runtime ends the others at once (its coordination service
lived there; SIGABRT, with JAX's message), before any of this; the command
line turns that into exit code 1 from outside (`cli.supervise`). The study
stays consistent either way: the leader's running trial is failed as interrupted, now or by the next
run (`search.ownership`), so restarting every process resumes it.

What a single-process search does that this one does not: candidates are
not isolated in worker processes (`isolate` must not be True; a crash takes
its process and so the run down, and the restarted run resumes), and the
pruner does not stop a candidate part-way through its timed steps (every
process must make the same number of steps).

Example (every process, first thing)::

    from shardsearch.search import distributed
    distributed.initialize("10.0.0.1:7777", num_processes=2, process_id=i,
                           cpu_devices=4)
    mesh = shardsearch.create_mesh((2, 4), ("dp", "tp"))  # all 8 devices
    result = optimize(workload, mesh=mesh, isolate=False)   # None unless i == 0
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import os
import pickle
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from ..base import mesh as _mesh
from ..base import tree as _tree
from . import confirm as _confirm
from . import evaluate as _evaluate
from . import logs as _logs
from .evaluate import Context, Outcome, error_line
from .stages import COMPLETE, CUT, FAILED

# Seconds a process waits for a silent peer (no beat, no answer) by default.
DEFAULT_TIMEOUT = 120.0

# How often each process beats, and how long one wait on the store lasts
# before the waiter looks at the beats again.
BEAT_SECONDS = 1.0
POLL_SECONDS = 1.0

# Seconds the watchdog gives the main thread to notice a lost peer by itself
# (it does within POLL_SECONDS when it waits on the store) before ending the
# process: a thread inside XLA cannot be interrupted.
NOTICE_GRACE = 5.0

# Seconds the leader waits for the others to acknowledge the end of the run.
BYE_SECONDS = 10.0

# Where a process says it is leaving (`announce_exit`), whichever search it was in.
EXIT_KEY = "shardsearch/exit"

# The most characters of a candidate's log lines a process sends the leader.
LOG_CHARS = 100_000

# The trial attribute with every process's own step times, by process index.
PROCESS_TIMES_ATTR = "process_step_times"

_sessions = itertools.count()


class PeerLost(KeyboardInterrupt):
    """Another process died, hangs, or cannot be reached; this one must stop.

    A KeyboardInterrupt, as SIGTERM's `Terminated` is: the process is ending,
    and the search cleans up as after Ctrl-C (the running trial failed as
    interrupted, the storage closed). The command line exits with code 1.
    """


class LeaderStopped(RuntimeError):
    """Process 0 ended the search with an error (the others stop with it;
    the command line's exit code 1)."""


class PeerFailed(Exception):
    """Another process could not go on with the candidate (its compile
    failed, or it was cut there); this one fails the candidate too."""


@dataclasses.dataclass(frozen=True)
class Distributed:
    """How `optimize` runs when the mesh spans several processes.

    Attributes:
      timeout: seconds a process waits for another before stopping the run
        with `PeerLost`: for a peer's heartbeat, for the next job, for a
        peer's result (a peer still compiling gets `compile_timeout` more).

    Example:
      >>> optimize(workload, mesh=mesh, isolate=False, distributed=Distributed(timeout=30))
    """

    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float) \
                or not self.timeout > 0:
            raise ValueError(f"Distributed: timeout must be a positive number of seconds, got "
                             f"{self.timeout!r}")


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    cpu_devices: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> None:
    """Joins this process to a multi-process run; call it before JAX starts.

    Sets what several processes on CPUs need (gloo for the collectives
    between processes, `cpu_devices` simulated devices each), then calls
    `jax.distributed.initialize`. Values left None are found as that
    function finds them: the coordinator in `JAX_COORDINATOR_ADDRESS`, the
    rest from a cluster environment it knows (Slurm, Open MPI, Cloud TPU,
    Kubernetes).

    Args:
      coordinator: "HOST:PORT" of process 0, reachable from every process.
      num_processes: how many processes take part.
      process_id: this process's index, 0 to num_processes - 1.
      cpu_devices: simulated CPU devices in this process (None: leave JAX's
        device count alone, e.g. on GPUs or TPUs).
      timeout: as `Distributed.timeout`; JAX's own failure detection is set
        to give up later than the search, so the search's message comes
        first.

    Example:
      >>> initialize("127.0.0.1:7777", 2, 0, cpu_devices=4)   # then: 8 devices

    Raises:
      ValueError: a value is missing (and no environment gives it) or out of
        range; JAX started already.
    """
    if cpu_devices is not None:
        from ..base.mesh import use_cpu_devices

        use_cpu_devices(cpu_devices)
    try:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=num_processes,
            process_id=process_id, initialization_timeout=int(max(timeout, 30)),
            heartbeat_timeout_seconds=int(max(2 * timeout, 100)),
            shutdown_timeout_seconds=int(max(timeout, 30)))
    except (ValueError, TypeError, RuntimeError) as err:
        raise ValueError(
            f"joining the other processes failed ({coordinator=}, {num_processes=}, "
            f"{process_id=}): {err}; give --coordinator HOST:PORT --num-processes N "
            "--process-id I (or set JAX_COORDINATOR_ADDRESS in a cluster JAX detects), "
            "before JAX starts") from None


def settings(distributed: Distributed | None, isolate: bool | None) -> Distributed | None:
    """The lockstep settings of a search: None in a single process.

    Raises:
      ValueError: `distributed` given in a single process, or isolation
        asked for across processes.
    """
    if jax.process_count() == 1:
        if distributed is not None:
            raise ValueError(
                "optimize: distributed= needs several JAX processes, but this one runs "
                "alone; call shardsearch.search.distributed.initialize(...) first thing in "
                "every process (or `shardsearch launch`)")
        return None
    if isolate:
        raise ValueError(
            f"optimize: isolate=True is not available across {jax.process_count()} processes "
            "(a worker cannot join the mesh); use isolate=False")
    return distributed or Distributed()


def announce_exit(reason: str) -> None:
    """Tells the other processes that this one is leaving (and why), so they
    stop at once instead of after their timeout. Does nothing in a single
    process or when the coordinator is gone."""
    if jax.process_count() == 1:
        return
    with contextlib.suppress(Exception):
        _client().key_value_set_bytes(f"{EXIT_KEY}/{jax.process_index()}",
                                      reason.encode()[:2000], allow_overwrite=True)


def _client() -> Any:
    # JAX's distributed runtime client: its key-value store and its barriers.
    from jax._src import distributed as _jax_distributed

    client = _jax_distributed.global_state.client
    if client is None:
        raise ValueError("several JAX processes but no distributed client: start them with "
                         "jax.distributed.initialize")
    return client


def signature(ctx: Context) -> str:
    """What every process must agree on before the first job: the arguments'
    shapes, the mesh, the objective and the measuring settings."""
    shapes = jax.tree.map(lambda x: f"{_tree.leaf_shape(x)}:{_tree.leaf_dtype(x)}",
                          tuple(ctx.abstract_args))
    text = repr((jax.tree.leaves(shapes), jax.tree.structure(shapes),
                 _mesh.axis_sizes(ctx.mesh), [d.id for d in ctx.mesh.devices.flat],
                 ctx.objective.name, ctx.budget, ctx.warmup, ctx.repeats))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Lockstep:
    """The processes of one search, moving through the same jobs together.

    On the leader (process 0) it is the context's `isolation`: `evaluate`,
    `nonfinite_under`, `retime` and `compare_outputs` publish a job, run it
    here, and merge what every process reports. The others call `follow`.

    Args:
      ctx: the search's context (built by `make_context`, the same in every
        process).
      settings: the `Distributed` settings.
    """

    def __init__(self, ctx: Context, settings: Distributed):
        self.client, self.ctx = _client(), ctx
        self.index, self.count = jax.process_index(), jax.process_count()
        self.timeout, self.execute_timeout = settings.timeout, ctx.execute_timeout
        self.compile_timeout = ctx.compile_timeout
        # Every process calls optimize the same number of times, so the session
        # numbers agree and the keys of two searches never meet.
        self.prefix = f"shardsearch/{next(_sessions)}"
        self.job = 0
        self.process_times: dict[str, list[list[float]]] = {}
        self._barrier, self._k, self._echo = 0, 0, False
        self._running_since: float | None = None  # last step (or start) of a running job
        self._lost: str | None = None
        self._noticed = False
        self._stop = threading.Event()
        # The watchdog's last words must reach the terminal even while a
        # candidate's stderr is being caught (`logs.capture_stderr`).
        self._stderr = os.dup(2)
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="shardsearch-lockstep")
        self._thread.start()

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
                 report: Callable[[int, float], bool] | None,
                 run: bool) -> tuple[Outcome, _logs.LogLines]:
        """Stage 2 and the objective in every process; the merged outcome.

        `report` is not called: a pruner stopping one process part-way
        through its steps would leave the others in a collective.
        """
        del report
        results = self._lead(ctx, ("evaluate", tuple(specs), fp, dict(memory), run,
                                   tuple(ctx.estimates)))
        outcome = self._merge_outcomes(fp, memory, results)
        log = results[0][1][2] if results[0][2] is None else _logs.LogLines()
        return outcome, log

    def nonfinite_under(self, ctx: Context, specs: Sequence[Any]) -> str | None:
        """`evaluate.nonfinite_under` in every process: the first problem found."""
        for i, (_kind, value, err, _own) in enumerate(self._lead(ctx, ("nonfinite",
                                                                       tuple(specs)))):
            if err is None and value is not None:
                return f"process {i}: {value}"
        return None

    def retime(self, ctx: Context, finalists: Sequence[tuple[str, Sequence[Any]]],
               rounds: int) -> dict[str, Any]:
        """`confirm.retime` in every process; each round's time is the slowest's.

        Raises:
          RuntimeError: it failed in a process (named).
        """
        results = self._values(self._lead(ctx, ("retime", [(label, tuple(specs)) for
                                                          label, specs in finalists], rounds)))
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
                                                tuple(reference_specs), rtol)))
        return all(m for m, _w in results), max(w for _m, w in results)

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
        if self._stop.is_set():
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
        self._stop.set()

    def _lead(self, ctx: Context, job: tuple[Any, ...]) -> list[tuple[Any, ...]]:
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
            self._stop.set()

    def _run(self, ctx: Context, job: tuple[Any, ...], k: int) -> tuple[Any, ...]:
        """Runs one job here: `(kind, value, error line or None, own)`, where
        `own` is False when it failed only because another process did."""
        kind = job[0]
        self._barrier, self._k, self._echo = 0, k, False
        saved = ctx.isolation, ctx.progress
        ctx.isolation, ctx.progress = None, self._progress
        try:
            value = self._local(ctx, job)
            error = None
        except PeerFailed as failed:
            value, error, self._echo = None, str(failed), True
        except Exception as err:  # a job's error is reported, not raised, in lockstep
            value, error = None, error_line(err)
        finally:
            ctx.isolation, ctx.progress = saved
            self._running_since = None
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
            _kind, specs, fp, memory, run, estimates = job
            ctx.estimates = estimates
            with _logs.capture_stderr() as caught:
                outcome = _evaluate.compile_and_score(specs, fp, ctx, memory, None, run)
            log = caught[0]
            # The store's messages are small; the count and first line stay whole.
            return outcome, True, _logs.LogLines(log.text[-LOG_CHARS:], log.count, log.first)
        if kind == "nonfinite":
            return _evaluate.nonfinite_under(job[1], ctx)
        if kind == "retime":
            return _confirm.retime(job[1], ctx, job[2])
        if kind == "compare":
            return _confirm.compare_outputs(job[1], job[2], ctx, job[3])
        raise ValueError(f"unknown lockstep job {kind!r}")

    def _progress(self, event: str) -> None:
        if event == "compiling":
            self._running_since = None
        elif event == "running":
            # Before the first step, all at once: no process may enter a
            # collective that another will not.
            self._publish_ready(True, "")
            deadline = time.monotonic() + self.compile_timeout + self.timeout
            b = self._barrier - 1
            for q in range(self.count):
                if q == self.index:
                    continue
                ok, reason = self._get(f"job/{self._k}/ready/{b}/{q}", deadline, q,
                                       "finish compiling")
                if not ok:
                    self._echo = True
                    raise PeerFailed(f"process {q}: {reason}")
            self._running_since = time.monotonic()
        elif event == "step":
            self._running_since = time.monotonic()

    def _publish_ready(self, ok: bool, reason: str) -> None:
        b = self._barrier
        self._barrier += 1
        self._put(f"job/{self._k}/ready/{b}/{self.index}", (ok, reason))

    # ----------------------------------------------------------- the store

    def _put(self, key: str, value: Any) -> None:
        try:
            self.client.key_value_set_bytes(f"{self.prefix}/{key}", pickle.dumps(value))
        except Exception as err:  # the coordinator is gone: nothing can go on
            raise PeerLost(self._unreachable(err)) from None

    def _get(self, key: str, deadline: float, who: int, what: str) -> Any:
        while True:
            if self._lost is not None:
                self._noticed = True
                raise PeerLost(self._lost)
            wait = min(POLL_SECONDS, deadline - time.monotonic())
            if wait <= 0:
                self._noticed = True
                self._lost = (f"process {who} did not {what} within the timeout; it died or "
                              "hangs, so the search stops (restart every process to resume "
                              "it)")
                raise PeerLost(self._lost)
            try:
                data = self.client.blocking_key_value_get_bytes(
                    f"{self.prefix}/{key}", max(int(wait * 1000), 1))
            except Exception as err:
                if "DEADLINE_EXCEEDED" in str(err) or "deadline" in str(err).lower():
                    continue
                self._noticed = True
                raise PeerLost(self._unreachable(err)) from None
            return pickle.loads(data)

    def _unreachable(self, err: BaseException) -> str:
        line = error_line(err)
        who = "process 0 (the coordinator)" if not self.leader else "the coordination service"
        return (f"{who} cannot be reached ({line[:200]}); it died or its machine is "
                "unreachable, so the search stops (restart every process to resume it)")

    # ----------------------------------------------------------- the watchdog

    def _watch(self) -> None:
        beat = 0
        seen: dict[int, tuple[bytes | None, float]] = {}
        since = time.monotonic()
        while not self._stop.wait(BEAT_SECONDS):
            now = time.monotonic()
            beat += 1
            # The coordinator's absence shows in the main thread's waits.
            with contextlib.suppress(Exception):
                self.client.key_value_set_bytes(f"{self.prefix}/beat/{self.index}",
                                                str(beat).encode(), allow_overwrite=True)
            lost = None
            for q in range(self.count):
                if q == self.index:
                    continue
                try:
                    value = self.client.key_value_try_get_bytes(f"{self.prefix}/beat/{q}")
                except Exception:  # not beating yet, or the store is gone
                    value = None
                try:
                    gone = self.client.key_value_try_get_bytes(f"{EXIT_KEY}/{q}")
                except Exception:  # still there (or the store is gone: the waits say so)
                    gone = None
                if gone is not None:
                    lost = (f"process {q} stopped ({gone.decode(errors='replace')}), so the "
                            "search stops (restart every process to resume it)")
                    break
                last_value, last_change = seen.get(q, (None, since))
                if value != last_value:
                    seen[q] = (value, now)
                elif now - last_change > self.timeout:
                    lost = (f"process {q} sent no heartbeat for {self.timeout:g} s: it died or "
                            "its machine is unreachable, so the search stops (restart every "
                            "process to resume it)")
                    break
            running = self._running_since
            if lost is None and running is not None and now - running > self.execute_timeout:
                lost = (f"no step finished within {self.execute_timeout:g} s in process "
                        f"{self.index}: the processes are stuck in a collective (a peer "
                        "failed or hangs), which cannot be cancelled; restart every process "
                        "to resume the search")
            if lost is not None and self._lost is None:
                self._lost = lost
                self._end_unless_noticed(lost, stuck=running is not None)
                return

    def _end_unless_noticed(self, message: str, stuck: bool) -> None:
        if not stuck:
            deadline = time.monotonic() + NOTICE_GRACE
            while time.monotonic() < deadline:
                if self._noticed or self._stop.is_set():
                    return
                time.sleep(0.1)
        os.write(self._stderr, f"shardsearch: error in process {self.index}: {message}\n"
                 .encode())
        os._exit(1)


def merge_outcomes(outcomes: Sequence[tuple[Outcome, bool]]) -> Outcome:
    """One candidate's outcome from every process's, in process order.

    Each comes with `own`: False when that process failed only because
    another one did (it learned so before its first step). The first process
    that failed on its own fails the candidate, named in the reason; else a
    cut (the same in every process, as their programs are the same) stands;
    else, all complete, a step's time is the slowest process's time for it,
    and the value their median.

    Example:
      >>> merge_outcomes([(Outcome("f", "complete", value=2.0, step_times=(1.0, 2.0, 3.0)), True),
      ...                 (Outcome("f", "complete", value=2.0, step_times=(2.0, 1.0, 3.5)), True)])
      Outcome(fingerprint='f', status=<Status.COMPLETE: ...>, value=2.0,
              step_times=(2.0, 2.0, 3.5), ...)
    """
    for i, (outcome, own) in enumerate(outcomes):
        if outcome.status == FAILED and own:
            return dataclasses.replace(outcome, reason=f"process {i}: {outcome.reason}")
    for outcome, _own in outcomes:
        if outcome.status == CUT:
            return outcome
    for i, (outcome, _own) in enumerate(outcomes):
        if outcome.status == FAILED:
            return dataclasses.replace(outcome, reason=f"process {i}: {outcome.reason}")
    first = outcomes[0][0]
    times = [o.step_times for o, _own in outcomes]
    if first.status != COMPLETE or not first.step_times or len({len(t) for t in times}) != 1:
        return first
    slowest = tuple(max(step) for step in zip(*times, strict=True))
    value = statistics.median(slowest) if first.value is not None else None
    return dataclasses.replace(first, step_times=slowest, value=value)


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
