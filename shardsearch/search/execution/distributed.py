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

The engine is `search.lockstep.Lockstep`: on the leader it is the
context's `isolation` (the seam `evaluate` and `confirm` ask); the other
processes run `Lockstep.follow` instead of a search, and print one line per
evaluated candidate. This module holds the settings, joining the processes,
and merging their outcomes.

Every wait is bounded (`search.watchdog`). Each process beats a key every
second; a process whose beat stops for `timeout` seconds (it died, or its
machine did) makes the others stop with `PeerLost` (exit code 1 from the
command line); a process stuck in XLA, where Python cannot interrupt it (a
collective whose peer is gone), leaves with exit code 1 from the watchdog
thread. A step that fails in one process only (an execution error there)
leaves the others inside a collective it will never enter: it says so in
the store, and they end within seconds, process 0 first recording the
candidate as failed, naming that process, so the restarted search does not
try it again. A step that does not finish within `execute_timeout` ends the
run the same way. A process leaving on an error says so in the store
(`announce_exit`), and the others stop at once. When process 0 dies, JAX's
own runtime ends the others at once (its coordination service lived there;
SIGABRT, with JAX's message), before any of this; the command line turns
that into exit code 1 from outside (`cli.supervise`). The study stays
consistent either way: the leader's running trial is failed as interrupted,
now or by the next run (`search.ownership`), so restarting every process
resumes it.

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
import statistics
from collections.abc import Sequence
from typing import Any

import jax

from ...base import mesh as _mesh
from ...base import tree as _tree
from ..evaluation.context import Context
from ..evaluation.outcome import Outcome
from ..evaluation.stages import COMPLETE, CUT, FAILED

# Seconds a process waits for a silent peer (no beat, no answer) by default.
DEFAULT_TIMEOUT = 120.0

# Where a process says it is leaving (`announce_exit`), whichever search it was in.
EXIT_KEY = "shardsearch/exit"

# The trial attribute with every process's own step times, by process index.
PROCESS_TIMES_ATTR = "process_step_times"


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
        from ...base.mesh import use_cpu_devices

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
                "alone; call shardsearch.initialize_distributed(...) first thing in "
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
        runtime_client().key_value_set_bytes(f"{EXIT_KEY}/{jax.process_index()}",
                                             reason.encode()[:2000], allow_overwrite=True)


def runtime_client() -> Any:
    """JAX's distributed runtime client: its key-value store (`jax._src`;
    JAX has no public handle on it)."""
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
