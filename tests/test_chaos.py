"""Chaos drills (issue 25): workers on one PostgreSQL study killed with kill -9,
their server restarted under them, one of their clocks in another time zone.

Each drill runs the real `shardsearch optimize` in four worker processes on
one study of the test server (`pgserver`; static objective, mlp:tiny on 8
simulated devices each), does its damage while it snapshots the study, lets
the workers finish, and then checks that the study came out whole:

- it has a winner: the study's result names the best value recorded;
- every trial once seen COMPLETE is still COMPLETE, with the same value;
- no fingerprint was compiled twice, outside the claim takeover that
  `search.study.claims` documents (a trial whose worker died before closing
  it: whoever takes its claim over compiles it again);
- no trial is left RUNNING;
- no worker dies of another's action: the workers not killed exit 0, with no
  traceback, no trial closed under them and no storage given up, and every
  failed trial belongs to a killed worker.

Pace: each trial of a worker stays open TRIAL_SECONDS before its candidate
is proposed (`drill_pace/sitecustomize.py`, on the workers' PYTHONPATH), as
while a real model compiles; mlp:tiny's few programs otherwise had the
workers run cache hits flat out, two trials a second each, taking the cores
from the rest of the suite while the drills' clocks ran.

Durations: SHARDSEARCH_CHAOS_SECONDS is the kill drill's (default 120 s
under CI=true, 15 s locally), its workers at a lower priority; the other
two search for a sixth of it, within [12, 20] s (the restart drill's workers
FIRST_SEARCH seconds more, to reach their first trials before the restart).
Each worker's setup (~10-20 s on two busy cores) and finish come on top.
The blows come from a generator seeded with SHARDSEARCH_CHAOS_SEED
(default 0): which worker is struck and when is reproducible; what it was
doing then depends on timing, and the drill prints it. Run them alone with
`pytest tests/test_chaos.py -s`.
"""

import collections
import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from child_env import child_env
from optuna.trial import FrozenTrial, TrialState
from pgserver import ONE_PROCESS, fresh_database, postgres_url, restart_server, server_dir

from shardsearch.search.evaluation.outcome import Outcome
from shardsearch.search.evaluation.stages import COMPLETE, FAILED
from shardsearch.search.finish import ESTIMATE_MARGIN
from shardsearch.search.space.candidate import is_variant
from shardsearch.search.study.ownership import (
    GRACE_SECONDS,
    INTERRUPTED,
    OWNER_ATTR,
    REASON_ATTR,
    fail_stale_trials,
)
from shardsearch.search.study.record import TrialRecord, outcome_attrs, record_attrs, summarize

pytestmark = [pytest.mark.slow, ONE_PROCESS]

STUDY = "chaos"
WORKERS = 4
SECONDS_ENV, SEED_ENV = "SHARDSEARCH_CHAOS_SECONDS", "SHARDSEARCH_CHAOS_SEED"
# Seconds the workers search after the last blow, so that its aftermath (a
# killed worker's trial failed, its claims taken over) happens inside the drill.
TAIL = 10.0
# Seconds the workers get to finish once their search time is up.
FINISH_LIMIT = 180.0
COMMAND = ["optimize", "--workload", "mlp:tiny", "--mesh", "dp=2,tp=4", "--devices", "8",
           "--objective", "static", "--space", "rules", "--study", STUDY,
           "--no-compile-cache", "--no-isolate", "--confirm-rounds", "0", "--quiet",
           # The search time (--timeout) ends each worker, not a trial count.
           "--trials", "100000"]
# Runs the CLI as a process of the machine named argv[1]. Workers of one
# machine know a dead peer by its pid; those of another only by heartbeats,
# the clock readings that a time zone could skew.
OTHER_HOST = ("import socket, sys; host = sys.argv.pop(1); socket.gethostname = lambda: host; "
              "from shardsearch.cli.main import main_entry; main_entry()")
# What a worker must never print: its own crash, a trial closed under it by
# another run (`search.loop.TrialTakenWarning`), a storage given up for lost
# (`ownership.StorageLost`), a claim waited on in vain (a second compile).
STDERR_ALARMS = ("Traceback", "TrialTakenWarning", "was closed by another run",
                 "heartbeats in a row", "evaluates it too")


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _drill_seconds() -> float:
    text = os.environ.get(SECONDS_ENV)
    return float(text) if text else (120.0 if _under_ci() else 15.0)


# How long the restart drill waits for every worker's first trial.
FIRST_TRIALS = 120.0
# Seconds of search the restart drill's workers have, beyond its short
# duration, for their first trials (their setup is not counted: `--timeout`
# starts after it). The slowest CI run seen had every worker's first trial 35 s
# into the drill, setup included; alone here, 7 s.
FIRST_SEARCH = 45.0
# The kill drill's workers run at this niceness: how fast they search does not
# matter to it (the blows come by the clock, and whatever a worker was doing is
# what it tests), while four workers at full priority for its two minutes took
# the cores from the other pytest process, whose tests then ran at a fraction
# of their speed (the suite's wall time is its CPU time over two cores).
KILL_DRILL_NICENESS = 10
# Each worker's trials stay open at least this long (`drill_pace/sitecustomize.py`).
# Unpaced, the three drills alone (`CI=true`) took 423 CPU seconds in 244 s,
# 1,064 trials in the kill drill; with 3 s, 112 CPU seconds and 160 trials,
# still 11 kills, all mid-trial (docs/testing.md).
TRIAL_SECONDS = 3.0
PACE = Path(__file__).resolve().parent / "drill_pace"


def _short_seconds() -> float:
    return min(max(_drill_seconds() / 6, 12.0), 20.0)


def _los_angeles() -> str:
    """TZ for Los Angeles: by name where the zone database has it, else the
    same rules spelled out (a TZ the C library cannot find silently means UTC)."""
    if Path("/usr/share/zoneinfo/America/Los_Angeles").is_file():
        return "America/Los_Angeles"
    return "PST8PDT,M3.2.0,M11.1.0"


def _seed() -> int:
    return int(os.environ.get(SEED_ENV, "0"))


@dataclasses.dataclass
class _Worker:
    name: str
    process: subprocess.Popen
    stderr: Path
    tz: str
    host: str | None
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def errors(self) -> str:
        return self.stderr.read_text(errors="replace")


class _Drill:
    """Workers on one study, the blows dealt to them, and what was seen meanwhile."""

    def __init__(self, tmp_path: Path, url: str, seed: int):
        self.tmp_path, self.url = tmp_path, url
        self.rng = random.Random(seed)
        self.workers: list[_Worker] = []
        self.seen: dict[int, float] = {}  # trial number → its value, once seen COMPLETE
        self.changed: list[str] = []  # COMPLETE trials seen to change or reopen
        self.snapshots = self.missed = 0
        self.restarted = False
        self.log: list[str] = []
        # One storage for every look, its tables made before any worker starts.
        self._storage = optuna.storages.RDBStorage(url)
        self._start = time.monotonic()

    def say(self, line: str) -> None:
        self.log.append(f"{time.monotonic() - self._start:6.1f}s {line}")
        print(self.log[-1], flush=True)

    def start(self, search_seconds: float, tz: str = "UTC", host: str | None = None,
              niceness: int = 0) -> _Worker:
        """A new worker that searches for `search_seconds` (after its setup),
        at `niceness` above this process's scheduling priority."""
        name = f"w{len(self.workers)}"
        env = child_env(TZ=tz, SHARDSEARCH_DRILL_TRIAL_SECONDS=str(TRIAL_SECONDS),
                        PYTHONPATH=os.pathsep.join(filter(None, [
                            str(PACE), os.environ.get("PYTHONPATH")])))
        cli = [*COMMAND, "--storage", self.url, "--timeout", f"{search_seconds:.1f}",
               "--seed", str(len(self.workers)), "--out", str(self.tmp_path / f"{name}.json")]
        argv = ([sys.executable, "-c", OTHER_HOST, host, *cli] if host
                else [sys.executable, "-m", "shardsearch", *cli])
        stderr = self.tmp_path / f"{name}.err"
        with open(stderr, "wb") as err, open(self.tmp_path / f"{name}.out", "wb") as out:
            process = subprocess.Popen(argv, cwd=self.tmp_path, env=env, stdout=out, stderr=err)
        if niceness:
            # From here, not in the child before its exec: a preexec_fn makes
            # subprocess fork this multithreaded JAX process, which JAX warns of.
            os.setpriority(os.PRIO_PROCESS, process.pid,
                           os.getpriority(os.PRIO_PROCESS, 0) + niceness)
        worker = _Worker(name, process, stderr, tz, host)
        self.workers.append(worker)
        self.say(f"started {name} (pid {worker.pid}, TZ={tz}"
                 + (f", host {host}" if host else "") + f", search {search_seconds:.0f} s)")
        return worker

    def snapshot(self) -> list[FrozenTrial] | None:
        """The study's trials now, checked against those seen before; None
        while the study is not there or the server does not answer."""
        try:
            study = optuna.load_study(study_name=STUDY, storage=self._storage)
            trials = study.get_trials()
        except KeyError:  # no worker has created the study yet
            return None
        except Exception as err:  # the server restarting: this look is lost, not the drill
            self.missed += 1
            self._disconnect()
            if self.missed == 1 or self.missed % 10 == 0:
                self.say(f"snapshot missed ({type(err).__name__})")
            return None
        self.snapshots += 1
        for t in trials:
            before = self.seen.get(t.number)
            if before is not None and (t.state != TrialState.COMPLETE or t.value != before):
                self.changed.append(f"trial {t.number}: COMPLETE {before} became "
                                    f"{t.state.name} {t.value}")
            if t.state == TrialState.COMPLETE and before is None:
                self.seen[t.number] = t.value
        return trials

    def watch(self, until: float, every: float = 1.5) -> None:
        """Snapshots the study until `time.monotonic()` reaches `until`."""
        while time.monotonic() < until:
            self.snapshot()
            time.sleep(max(0.0, min(every, until - time.monotonic())))

    def live(self) -> list[_Worker]:
        return [w for w in self.workers if w.process.poll() is None]

    def kill(self, worker: _Worker, tries: int = 30) -> bool:
        """kill -9 of `worker`, if possible while it runs a trial (frozen with
        SIGSTOP while the study is read); whether it was caught mid-trial."""
        caught = False
        for _ in range(tries):
            worker.process.send_signal(signal.SIGSTOP)
            trials = self.snapshot() or []
            caught = any(t.state == TrialState.RUNNING and _owner_pid(t) == worker.pid
                         for t in trials)
            if caught:
                break
            worker.process.send_signal(signal.SIGCONT)
            time.sleep(0.1)
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
        worker.killed = True
        self.say(f"kill -9 {worker.name} (pid {worker.pid}), "
                 + ("mid-trial" if caught else "between trials or in its setup"))
        return caught

    def finish(self) -> list[FrozenTrial]:
        """Waits for every worker; the study's trials at the end."""
        deadline = time.monotonic() + FINISH_LIMIT
        while self.live() and time.monotonic() < deadline:
            self.watch(min(deadline, time.monotonic() + 1.5))
        late = self.live()
        for worker in late:
            worker.process.kill()
            worker.process.wait()
        assert not late, "\n".join(
            f"{w.name} did not finish within {FINISH_LIMIT:.0f} s of the drill's end; its "
            f"stderr: {w.errors()[-3000:]}" for w in late)
        self.say("all workers done: " + ", ".join(
            f"{w.name}={'killed' if w.killed else w.process.returncode}" for w in self.workers))
        trials = self.snapshot()
        assert trials is not None, "the study cannot be read after the drill"
        return trials

    def result(self) -> object:
        """The study's "result" attribute (the winner's summary)."""
        return optuna.load_study(study_name=STUDY, storage=self._storage).user_attrs.get(
            "result")

    def _disconnect(self) -> None:
        # Connections cut by a restart are dropped, not returned to the pool.
        self._storage.remove_session()
        self._storage.engine.dispose()

    def close(self) -> None:
        for worker in self.live():
            worker.process.kill()
            worker.process.wait()
        self._disconnect()


@pytest.fixture
def drill(tmp_path, request):
    url = fresh_database(postgres_url(), f"shardsearch_{request.node.name[5:40]}")
    out = _Drill(tmp_path, url, _seed())
    yield out
    out.close()


def _owner_pid(trial: FrozenTrial) -> int | None:
    return (trial.user_attrs.get(OWNER_ATTR) or {}).get("pid")


def _outcome(trial: FrozenTrial) -> dict:
    return trial.user_attrs.get("outcome") or {}


def _check_whole(drill: _Drill, trials: list[FrozenTrial]) -> dict[str, int]:
    """Every invariant of the module docstring; all the problems at once.
    Returns the drill's counts, for its report."""
    problems = list(drill.changed)
    by_number = {t.number: t for t in trials}
    killed = {w.pid for w in drill.workers if w.killed}
    # Every trial seen COMPLETE during the drill is still COMPLETE, with its value.
    for number, value in drill.seen.items():
        t = by_number.get(number)
        if t is None or t.state != TrialState.COMPLETE or t.value != value:
            problems.append(f"trial {number} was COMPLETE with {value}, now "
                            + ("gone" if t is None else f"{t.state.name} {t.value}"))
    # The next run to open the study once the grace period is over fails what
    # the damage left RUNNING: a killed worker's trial (its pid is gone), and a
    # trial created but never taken (killed, or its ask's answer lost in the
    # restart, between creating the trial and writing its owner).
    if any(t.state == TrialState.RUNNING for t in trials):
        study = optuna.load_study(study_name=STUDY, storage=drill._storage)
        fail_stale_trials(study, now=time.time() + GRACE_SECONDS + 1)
        trials = study.get_trials(deepcopy=False)
        by_number = {t.number: t for t in trials}
    running = [t.number for t in trials if t.state == TrialState.RUNNING]
    if running:
        problems.append(f"trials left RUNNING: {running}")
    # Failed trials: only those of killed workers (or never taken, when the
    # drill did damage), closed as interrupted.
    damaged = bool(killed) or drill.restarted
    for t in trials:
        unowned = _owner_pid(t) is None and damaged
        if t.state == TrialState.FAIL and (
                (_owner_pid(t) not in killed and not unowned)
                or t.user_attrs.get(REASON_ATTR) != INTERRUPTED):
            problems.append(
                f"trial {t.number} of pid {_owner_pid(t)} ("
                + ("killed" if _owner_pid(t) in killed else "not killed")
                + f") failed with reason {t.user_attrs.get(REASON_ATTR)!r}, outcome "
                f"{_outcome(t).get('status')!r} {_outcome(t).get('reason')!r}")
    # Compiles per fingerprint. A killed worker's trial that never closed
    # holds a compile another worker redid on taking its claim over.
    compiled, taken_over = collections.Counter(), 0
    for t in trials:
        outcome = _outcome(t)
        if not outcome.get("fingerprint") or outcome.get("cache_hit"):
            continue
        if _owner_pid(t) in killed and t.state != TrialState.COMPLETE:
            taken_over += 1
            continue
        compiled[outcome["fingerprint"]] += 1
    # The workers' trials were paced (`TRIAL_SECONDS`): each stayed open that long.
    unpaced = [t.number for t in trials if t.state == TrialState.COMPLETE
               and (t.datetime_complete - t.datetime_start).total_seconds() < TRIAL_SECONDS]
    if unpaced:
        problems.append(f"trials open for under {TRIAL_SECONDS} s, so the drill_pace hook "
                        f"did not run in their workers: {unpaced}")
    twice = {fp: n for fp, n in compiled.items() if n > 1}
    if twice:
        problems.append(f"fingerprints compiled more than once: {twice} (trials "
                        + str({fp: [t.number for t in trials if _outcome(t).get("fingerprint")
                                    == fp and not _outcome(t).get("cache_hit")]
                               for fp in twice}) + ")")
    # Each baseline was run to an outcome once, whoever claimed it first.
    labels = collections.Counter(t.user_attrs.get("label") for t in trials
                                 if "outcome" in t.user_attrs)
    again = {k: n for k, n in labels.items() if k != "search" and n > 1}
    if again or not labels["replicated"] or not labels["default"]:
        problems.append(f"baselines run to an outcome: {dict(labels)}")
    # The workers not killed finished cleanly, and none was struck by another's fate.
    for w in drill.workers:
        if w.killed:
            continue
        text = w.errors()
        alarms = [a for a in STDERR_ALARMS if a in text]
        if w.process.returncode != 0 or alarms:
            problems.append(f"{w.name} (pid {w.pid}, TZ={w.tz}) exited "
                            f"{w.process.returncode} with {alarms}: {text[-2000:]}")
    # The study's winner is its best value, a baseline a searched plan beat
    # by less than the margin an unconfirmed winner needs (`estimated_winner`),
    # or a searched plan within that margin that moves less (`least_communication`).
    result = drill.result()
    values = [_outcome(t)["value"] for t in trials
              if _outcome(t).get("status") == "complete" and _outcome(t).get("value") is not None]
    if not isinstance(result, dict) or not values:
        problems.append(f"no winner: result {result!r}, {len(values)} complete outcomes")
    elif result["best"]["time"] != min(values) and not (
            result["best"]["label"] != "search" and not is_variant(result["best"]["label"])
            and min(values) >= result["best"]["time"] * (1 - ESTIMATE_MARGIN)) and not (
            (result["best"]["label"] == "search" or is_variant(result["best"]["label"]))
            and result["best"]["time"] <= min(values) * (1 + ESTIMATE_MARGIN)):
        problems.append(f"the winner ({result['best']['label']}, {result['best']['time']}) "
                        f"is not the best value recorded ({min(values)})")
    counts = {
        "trials": len(trials),
        "complete": sum(t.state == TrialState.COMPLETE for t in trials),
        "failed": sum(t.state == TrialState.FAIL for t in trials),
        "workers": len(drill.workers), "killed": len(killed),
        "compiles": sum(compiled.values()) + taken_over, "fingerprints": len(compiled),
        "compiles taken over": taken_over, "snapshots": drill.snapshots,
        "snapshots missed": drill.missed,
    }
    drill.say(f"counts: {counts}")
    assert not problems, "\n".join([*problems, "drill log:", *drill.log])
    return counts


def _per_worker(trials: list[FrozenTrial], drill: _Drill, after: int = -1) -> dict[str, int]:
    """Each worker's COMPLETE trials numbered above `after`."""
    pids = collections.Counter(_owner_pid(t) for t in trials
                               if t.state == TrialState.COMPLETE and t.number > after)
    return {w.name: pids[w.pid] for w in drill.workers}


def test_chaos_kill_9_workers_at_random(drill):
    seconds = _drill_seconds()
    drill.say(f"kill drill: {WORKERS} workers, {seconds:.0f} s of kill -9, seed {_seed()}")
    end = time.monotonic() + seconds
    slots = [drill.start(seconds + TAIL, niceness=KILL_DRILL_NICENESS) for _ in range(WORKERS)]
    kills = mid_trial = 0
    while True:
        at = time.monotonic() + drill.rng.uniform(6.0, 14.0)
        if at > end:
            break
        drill.watch(at)
        slot = drill.rng.randrange(WORKERS)
        if slots[slot].process.poll() is None:
            mid_trial += drill.kill(slots[slot])
            kills += 1
        slots[slot] = drill.start(max(0.0, end - time.monotonic()) + TAIL,
                                  niceness=KILL_DRILL_NICENESS)
    drill.watch(end)
    trials = drill.finish()
    counts = _check_whole(drill, trials)
    drill.say(f"kills {kills} ({mid_trial} mid-trial)")
    assert kills >= 1
    # Every kill mid-trial left a trial the others closed as interrupted.
    assert counts["failed"] >= mid_trial


def test_chaos_server_restarted_mid_study(drill):
    folder = server_dir()
    seconds = _short_seconds()
    drill.say(f"restart drill: {WORKERS} workers searching {seconds + FIRST_SEARCH:.0f} s "
              f"after their setup, {seconds:.0f} s beyond {FIRST_SEARCH:.0f} s for their "
              f"first trials (waited for at most {FIRST_TRIALS:.0f} s)")
    # Each searches long enough to go on after the restart however slowly the
    # workers reach their first trials: on a slow CI run that took 35 s, and
    # a 20 s search left one worker no trial after the restart. (A search of
    # FIRST_TRIALS beyond, 140 s, made this drill the suite's longest test.)
    for _ in range(WORKERS):
        drill.start(seconds + FIRST_SEARCH)
    # Restart once every worker has recorded a trial: all of them hold
    # connections, in the middle of their search.
    limit = time.monotonic() + FIRST_TRIALS
    while True:
        trials = drill.snapshot() or []
        if all(_per_worker(trials, drill).values()) or time.monotonic() > limit:
            break
        time.sleep(0.5)
    assert all(_per_worker(trials, drill).values()), _per_worker(trials, drill)
    time.sleep(drill.rng.uniform(0.0, 2.0))
    mark = max(t.number for t in drill.snapshot() or trials)
    took = restart_server(folder)
    drill.restarted = True
    drill.say(f"pg_ctl restart took {took:.1f} s; trials before it: up to {mark}")
    trials = drill.finish()
    _check_whole(drill, trials)
    # The workers searched on after the restart, each recording trials.
    after = _per_worker(trials, drill, after=mark)
    drill.say(f"COMPLETE trials after the restart, per worker: {after}")
    assert all(after.values()), after


def test_chaos_one_worker_in_another_time_zone(drill):
    seconds = _short_seconds()
    # Each worker as if on its own machine, so that none knows another's
    # liveness by its pid: only heartbeats tell, and one clock reads local
    # time seven or eight hours behind the others.
    odd = drill.rng.randrange(WORKERS)
    drill.say(f"time-zone drill: {WORKERS} workers on their own hosts searching "
              f"{seconds:.0f} s, w{odd} in {_los_angeles()}")
    for i in range(WORKERS):
        drill.start(seconds, tz=_los_angeles() if i == odd else "UTC",
                    host=f"chaos-host-{i}")
    drill.watch(time.monotonic() + seconds)
    trials = drill.finish()
    _check_whole(drill, trials)
    hosts = {(t.user_attrs.get(OWNER_ATTR) or {}).get("host") for t in trials}
    assert hosts == {f"chaos-host-{i}" for i in range(WORKERS)}, hosts  # the disguise held
    per_worker = _per_worker(trials, drill)
    assert all(per_worker.values()), per_worker
    assert not [t.number for t in trials if t.state == TrialState.FAIL]


def test_a_trial_recorded_halfway_is_not_read_as_recorded():
    # Found by the time-zone drill: a worker that finished while another was
    # writing a trial's attributes (outcome first, rules after) read it and
    # died of KeyError 'state_rule'; a worker killed between the two left it
    # so for every later reader.
    study = optuna.create_study()
    trial = study.ask()
    for key, value in outcome_attrs(Outcome("f00d", COMPLETE, value=0.5)).items():
        trial.set_user_attr(key, value)
    assert TrialRecord.from_trial(study.get_trials()[0]) is None  # still being recorded
    trial.set_user_attr(REASON_ATTR, INTERRUPTED)  # its run died there
    study.tell(trial, state=TrialState.FAIL)
    record = TrialRecord.from_trial(study.get_trials()[0])
    assert record is not None and record.outcome.reason == INTERRUPTED
    assert record.outcome.fingerprint == "" and record.state_rule == {}


def test_a_trial_failed_as_interrupted_after_its_record_reads_as_interrupted():
    # Found by test_interrupts' kill -9 test in CI: killed after writing its
    # outcome and rules but before the tell (its figures go in between), the
    # trial was failed as "interrupted" by the next run, yet read as its
    # outcome, so that run's summary counted no interrupted trial.
    study = optuna.create_study()
    trial = study.ask()
    record = TrialRecord(0, "dp", {}, Outcome("f00d", COMPLETE, value=0.5), {"kind": "x"},
                         {"kind": "y"}, 1.0)
    for key, value in record_attrs(record).items():
        trial.set_user_attr(key, value)
    assert TrialRecord.from_trial(study.get_trials()[0]) == record  # recorded, not yet told
    trial.set_user_attr(REASON_ATTR, INTERRUPTED)
    study.tell(trial, state=TrialState.FAIL)
    read = TrialRecord.from_trial(study.get_trials()[0])
    assert read is not None and read.label == "dp"
    assert read.outcome.status == FAILED and read.outcome.reason == INTERRUPTED
    assert summarize([read])["interrupted"] == 1
