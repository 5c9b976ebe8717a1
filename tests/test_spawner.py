"""Workers forked from one helper process that has imported JAX (`execution.spawner`):
one helper per environment, the workers' exit statuses, the switch that turns it
off, a helper that cannot start, and nothing left behind when the study process
is killed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from child_env import child_env

from shardsearch.search.evaluation import evaluate as _evaluate
from shardsearch.search.execution import spawner
from shardsearch.search.execution.spawner import Forked, Spawner, SpawnerWarning
from shardsearch.search.setup import make_context
from shardsearch.search.space.baselines import baseline_candidates
from shardsearch.workloads import get_workload

FAST = dict(warmup=1, repeats=2)
WORKLOAD = get_workload("mlp:tiny")

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux")


def _parent(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def _started(mesh):
    """A context whose worker has started, and that worker's process object."""
    ctx, _ = make_context(WORKLOAD, None, mesh, isolate=True, **FAST)
    assert ctx.executor.start()
    return ctx, ctx.executor._live[0].process


def test_each_studys_worker_is_forked_from_the_same_helper(mesh24):
    seen = []
    for _ in range(2):
        with make_context(WORKLOAD, None, mesh24, isolate=True, **FAST)[0] as ctx:
            specs, fp = _evaluate.resolve(baseline_candidates(WORKLOAD, mesh24)["dp"], ctx)
            outcome = _evaluate.evaluate(specs, fp, ctx)
            assert outcome.status == "complete" and len(outcome.step_times) == 2
            process = ctx.executor._live[0].process
            assert isinstance(process, Forked)
            seen.append((process.pid, _parent(process.pid), process.helper))
    (first, parent, helper), (second, parent_again, helper_again) = seen
    assert first != second and helper is helper_again
    assert parent == parent_again == helper.process.pid != os.getpid()
    # Each closed worker was asked to exit, and its helper reported how it did.
    assert helper.statuses[first] == helper.statuses[second] == 0


def test_a_changed_environment_gets_its_own_helper(mesh24, monkeypatch):
    helpers = []
    for mark in ("one", "two"):
        monkeypatch.setenv("SHARDSEARCH_TEST_MARK", mark)
        ctx, process = _started(mesh24)
        with ctx:
            environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
            assert f"SHARDSEARCH_TEST_MARK={mark}".encode() in environ
            helpers.append(process.helper)
    assert helpers[0] is not helpers[1]
    # The first environment's helper had no worker left, so it was closed.
    assert helpers[0].lost and helpers[0].process.poll() is not None
    assert not helpers[1].lost


def test_a_killed_worker_reads_as_killed_by_its_signal(mesh24):
    ctx, process = _started(mesh24)
    with ctx:
        os.kill(process.pid, signal.SIGSEGV)
        assert process.wait(timeout=30) == -signal.SIGSEGV
        assert ctx.executor._live[0].death() == "worker killed by SIGSEGV"


def test_the_switch_turns_forking_off(mesh24, monkeypatch):
    monkeypatch.setenv(spawner.SWITCH, "0")
    ctx, process = _started(mesh24)
    with ctx:
        assert isinstance(process, subprocess.Popen)
        assert _parent(process.pid) == os.getpid()


def test_a_helper_that_cannot_start_forks_nothing():
    helper = Spawner({"PYTHONHOME": "/nonexistent", "PATH": os.environ.get("PATH", "")})
    assert not helper.wait_ready()
    assert helper.lost and helper.failure == "exited before it was ready"
    read, write = os.pipe()
    try:
        assert helper.fork(read, write, write, "unused") is None
    finally:
        os.close(read)
        os.close(write)


def test_a_helper_that_died_is_said_and_the_worker_starts_as_a_new_interpreter(mesh24,
                                                                              monkeypatch):
    monkeypatch.setenv("SHARDSEARCH_TEST_MARK", "dies")  # a helper of this test's own
    ctx, process = _started(mesh24)
    ctx.close()
    helper = process.helper
    os.killpg(helper.process.pid, signal.SIGKILL)
    helper.process.wait()
    with pytest.warns(SpawnerWarning, match=r"starting the worker as a new interpreter: its "
                                            r"helper is gone \(killed by SIGKILL\)"):
        ctx, process = _started(mesh24)
    with ctx:
        assert isinstance(process, subprocess.Popen) and _parent(process.pid) == os.getpid()


KILLED = """
import jax
jax.config.update("jax_num_cpu_devices", 8)
import time
import shardsearch as ss
from shardsearch.search.setup import make_context
from shardsearch.workloads import get_workload
ctx, _ = make_context(get_workload("mlp:tiny"), None, ss.create_mesh((2, 4), ("dp", "tp")),
                      isolate=True)
assert ctx.executor.start()
worker = ctx.executor._live[0].process
print(worker.pid, worker.helper.process.pid, ctx.executor.folder, flush=True)
time.sleep(600)
"""


def test_a_study_process_killed_with_9_leaves_no_process_or_folder(tmp_path):
    study = subprocess.Popen([sys.executable, "-c", KILLED], cwd=tmp_path, env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = study.stdout.readline()
        assert line, study.communicate(timeout=60)[1][-2000:]
        worker, helper, folder = line.split()
        assert _parent(int(worker)) == int(helper) and Path(folder).is_dir()
    finally:
        study.kill()
        study.communicate()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            spawner._exists(int(worker)) or spawner._exists(int(helper))
            or Path(folder).exists()):
        time.sleep(0.1)
    assert not spawner._exists(int(helper)), "the helper outlived its study process"
    assert not spawner._exists(int(worker)), "the worker outlived its study process"
    assert not Path(folder).exists(), "the worker's folder was left behind"


def test_an_interrupted_request_retires_its_helper(monkeypatch):
    # An answer left unread would be taken as the next request's: the helper
    # serves no more, and exits.
    helper = Spawner(dict(os.environ))
    assert helper.wait_ready(), helper.failure

    def interrupted(timeout):
        raise KeyboardInterrupt

    monkeypatch.setattr(helper, "_next", interrupted)
    read, write = os.pipe()
    try:
        with pytest.raises(KeyboardInterrupt):
            helper.fork(read, write, write, "unused")
    finally:
        os.close(read)
        os.close(write)
    assert helper.lost and helper.process.wait(timeout=30) is not None
