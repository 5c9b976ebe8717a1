"""What a trial is judged against besides itself: the study's standing.

Stages 1 and 2 judge a candidate on its own (its specs, its memory). An
objective that times steps also judges it against the study's other
trials, which change from trial to trial, so they travel with each job
(`Standing`) instead of in the study's `Context`: the estimates the study
has recorded (the "hybrid" objective's gate) and its best completed trial so
far with what that trial's compiled program costs (`Leader`).

A timed candidate whose compiled program has no less of any kind of work
than the leader's, and clearly more arithmetic or clearly more memory
traffic, is cut before it runs (`Leader.behind`): on the eight simulated
CPU devices of `cpu-sim8` a candidate cut while timing still cost three
quarters of a completed one (its compile, its arguments placed, two
warm-ups, two timed steps), and the 21 timed candidates of its recorded
studies that did 1.1x the best's flops or more with no fewer collective
bytes all ran 1.19x its time or slower
(`benchmarks/results/pruning/costs-cpu-sim8.md`). Memory traffic has a
wider margin, as it predicts time less closely: in the recorded studies
the expert plans megatron and fsdp_tp on llama dp2xtp4 moved 1.39-1.40x
the leader's bytes, with as many flops and 1.19-1.24x its collective
bytes, and ran 1.08-1.17x its time (one inside the timing cut's margin);
the 25 searched candidates at 1.5x or more, with as many flops and no fewer
collective bytes, ran 1.26x its time or slower
(`benchmarks/results/pruning/traffic-cpu-sim8.md`).
"""

from __future__ import annotations

import dataclasses

from ...base.units import format_seconds

# How much more arithmetic than the leader's a program must do to be cut
# before it runs: the timing cut's margin (`study.pruner.SlowerThanBest`).
COST_MARGIN = 0.1
# How many more bytes than the leader's a program must read and write, with
# as much arithmetic and no fewer collective bytes, to be cut before it runs.
TRAFFIC_MARGIN = 0.5
# Arithmetic within this share of the leader's counts as as much: moving a
# split changes XLA's flops count by a few parts per thousand.
SAME_FLOPS = 0.01


@dataclasses.dataclass(frozen=True)
class Leader:
    """The study's best completed trial so far, and what its compiled program
    costs per device and step (the `Outcome`'s figures).

    Attributes:
      trial: its number.
      value: its value (for a timed objective, the median step in seconds).
      flops: its program's flops, loops counted.
      collective_bytes: bytes its collectives move; None when not recorded.
      bytes_accessed: bytes it reads and writes; None when not recorded (a
        trial stored before they were kept).

    Example:
      >>> leader = Leader(7, 0.78, 7.0e9, 5.2e7, 3.1e9)
      >>> leader.behind(8.6e9, 6.4e7, 3.4e9)[:60]
      'its program does 1.23x the flops per device of the best so f'
      >>> leader.behind(8.6e9, 4.0e7, 3.4e9) is None   # it moves less: time it
      True
      >>> leader.behind(7.0e9, 5.2e7, 4.7e9)[:62]   # 1.52x the memory traffic
      'its program reads and writes 1.52x the bytes per device of the'
      >>> leader.behind(7.0e9, 5.2e7, 4.3e9) is None   # 1.39x: within the margin
      True
    """

    trial: int
    value: float
    flops: float
    collective_bytes: float | None = None
    bytes_accessed: float | None = None

    def behind(self, flops: float | None, collective_bytes: float | None,
               bytes_accessed: float | None, margin: float = COST_MARGIN,
               traffic_margin: float = TRAFFIC_MARGIN) -> str | None:
        """Why a program with these costs is clearly slower than the leader's,
        or None. It must move no fewer collective bytes and bytes accessed
        than the leader's, and either do at least `1 + margin` times its
        flops, or do as many flops (within `SAME_FLOPS`) and read and write at
        least `1 + traffic_margin` times its bytes. A figure not known on both
        sides is not compared (an older leader without bytes accessed, which
        then rules out the second reason); without both flops nothing is said.
        """
        if flops is None or self.flops <= 0:
            return None
        for mine, theirs in ((collective_bytes, self.collective_bytes),
                             (bytes_accessed, self.bytes_accessed)):
            if mine is not None and theirs is not None and mine < theirs:
                return None
        best = f"the best so far (trial {self.trial}, {format_seconds(self.value)})"
        if flops >= (1 + margin) * self.flops:
            return (f"its program does {flops / self.flops:.2f}x the flops per device of "
                    f"{best} and moves no fewer bytes through collectives or memory")
        if (bytes_accessed is not None and self.bytes_accessed
                and flops >= (1 - SAME_FLOPS) * self.flops
                and bytes_accessed >= (1 + traffic_margin) * self.bytes_accessed):
            return (f"its program reads and writes {bytes_accessed / self.bytes_accessed:.2f}x "
                    f"the bytes per device of {best}, with as many flops and no fewer "
                    "collective bytes")
        return None


@dataclasses.dataclass(frozen=True)
class Standing:
    """The study as of one trial, for the objective that scores it.

    Attributes:
      estimates: the estimates the study has recorded, one per distinct
        candidate, ascending (`study.record.recorded_estimates`; only read
        by objectives with `needs_estimates`).
      leader: its best completed trial with its program's costs
        (`study.record.recorded_leader`), or None (none yet, or the objective
        does not cut on it).
    """

    estimates: tuple[float, ...] = ()
    leader: Leader | None = None


# What a job is judged against when the study gives nothing: no estimates, no leader.
NO_STANDING = Standing()
