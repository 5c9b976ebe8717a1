"""Wall-clock timers on named functions, for `run.py --trace` (not a benchmark).

Put this folder first on PYTHONPATH and set OVERHEAD_TRACE to a folder: every
Python process started with that environment (the study process, and its
worker, which gets the study process's `sys.path` and environment) wraps the
functions named in `TARGETS` as their modules load, and writes
`<role>-<pid>.json` there at exit: for each chain of nested timed calls
("_Runner._one/evaluate/Isolation.evaluate"), how many calls and how many
seconds, and every call as (chain, start, seconds) on the monotonic clock
all processes share, so that `run.py` can sum the worker's calls inside each
trial of the study process. Names are strings, looked up when the module
loads: a target that moved is listed under "missing" rather than failing (so
this file names internal functions without importing them, and
`tests/test_bench.py`'s public-API check has nothing to flag).

The monitored wrapper (`create_monitored_function`) is wrapped too: each call
is timed, apart the first (the first warm-up), the other calls outside
`repeat` (the other warm-ups) and those inside it (the timed steps), each
with the part its own `execution_time` leaves out, the wrapper's cost per
step. Its `repeat` is replayed here call for call (warm-ups, `feed`,
`on_repeat` and its early stop, as `base/monitor.py` does), because the
original calls the unwrapped function; a change to that loop there must be
copied here.
"""

from __future__ import annotations

import os

TARGETS = {
    # The study process: one trial, propose to record.
    "shardsearch.search.loop": ["_Runner._one", "_Runner.record", "_Runner.one"],
    "shardsearch.search.space.searchspace": ["SearchSpace.suggest"],
    "shardsearch.search.study.claims": ["CompileClaims.acquire"],
    "shardsearch.search.study.ownership": ["BaselineClaims.ask"],
    "shardsearch.search.study.record": ["recorded_estimates"],
    "shardsearch.search.execution.isolate": [
        "Isolation.evaluate", "Isolation._request", "_Worker.send", "_Worker.recv",
        "_Worker.take_log", "Isolation._worker"],
    "shardsearch.search.execution.inprocess": ["InProcess.evaluate"],
    # A knob setting's step, packed in the study process and rebuilt in the worker.
    "shardsearch.search.execution.transport": ["package_step", "jaxpr_digest"],
    "shardsearch.search.execution.worker": ["_step"],
    "optuna.trial._trial": ["Trial.report", "Trial.should_prune", "Trial.set_user_attr"],
    "optuna.study.study": ["Study.tell", "Study.ask"],
    # Both: the pipeline of one candidate.
    "shardsearch.search.evaluation.evaluate": [
        "resolve", "check", "evaluate", "compile_and_score", "compile_step", "monitored_step",
        "measure", "time_steps", "place", "check_finite", "first_steps"],
    "shardsearch.search.evaluation.confirm": ["retime", "compare_outputs"],
    "shardsearch.base.monitor": ["compile_within"],
    # Stage 1's trace of the step (per knob setting), which a compile in the
    # same process reuses: `run.py` reports it apart.
    "shardsearch.logical.discover": ["_shared_trace"],
    "shardsearch.cost.program": ["ProgramCost.from_compiled", "ProgramCost.from_hlo",
                                 "cost_numbers", "XlaMemory.from_compiled"],
    "jax": ["clear_caches"],
}


def _install(folder: str) -> None:
    import atexit
    import functools
    import importlib.abc
    import json
    import sys
    import threading
    import time

    totals: dict[str, list[float]] = {}
    missing: list[str] = []
    # (key, start, seconds). `perf_counter` is CLOCK_MONOTONIC on Linux, one clock
    # for every process of the machine, and never stepped as the wall clock can be.
    events: list[tuple[str, float, float]] = []
    local = threading.local()

    def timed(name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            stack = getattr(local, "stack", None)
            if stack is None:
                stack = local.stack = []
            stack.append(name)
            key = "/".join(stack)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                entry = totals.setdefault(key, [0, 0.0])
                entry[0] += 1
                entry[1] += seconds
                events.append((key, start, seconds))
                stack.pop()
        return wrapper

    def add(name: str, seconds: float) -> None:
        key = "/".join([*getattr(local, "stack", []), name])
        entry = totals.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        events.append((key, time.perf_counter() - seconds, seconds))

    def monitored_factory(create):
        # The wrapper's calls: warm-ups (not in `repeat`) and timed repeats, each
        # with what `execution_time` leaves out.
        @functools.wraps(create)
        def wrapper(*args, **kwargs):
            monitored = create(*args, **kwargs)
            state = {"in_repeat": False, "calls": 0}

            def call(*a, **k):
                start = time.perf_counter()
                result, metrics = monitored(*a, **k)
                seconds = time.perf_counter() - start
                state["calls"] += 1
                kind = ("repeat" if state["in_repeat"] else
                         "first, outside repeat" if state["calls"] == 1 else "outside repeat")
                add(f"monitored call ({kind})", seconds)
                add(f"monitored call ({kind}) minus execution_time",
                    seconds - metrics["execution_time"])
                return result, metrics

            def repeat(*a, **k):
                state["in_repeat"] = True
                start = time.perf_counter()
                try:
                    # The original `repeat` calls the unwrapped closure: time it here.
                    return _repeat(*a, **k)
                finally:
                    state["in_repeat"] = False
                    add("monitored.repeat", time.perf_counter() - start)

            def _repeat(*a, repeats, warmup=0, feed=None, on_repeat=None):
                result, timed_ = None, []
                for i in range(warmup + repeats):
                    result, metrics = call(*a)
                    if feed is not None:
                        a = tuple(feed(result, a))
                    if i < warmup:
                        continue
                    timed_.append(metrics)
                    if on_repeat is not None:
                        start = time.perf_counter()
                        stop = on_repeat(i - warmup, metrics)
                        add("monitored.repeat/on_repeat (report round trip)",
                            time.perf_counter() - start)
                        if stop:
                            break
                return result, timed_

            call.__wrapped__ = monitored.__wrapped__
            call.compile = monitored.compile
            call.repeat = repeat
            return call
        return wrapper

    def patch(module) -> None:
        for target in TARGETS.get(module.__name__, ()):
            owner, _, attr = target.rpartition(".")
            holder = module
            try:
                for part in filter(None, owner.split(".")):
                    holder = getattr(holder, part)
                fn = holder.__dict__[attr] if isinstance(holder, type) else getattr(holder, attr)
            except (AttributeError, KeyError):
                missing.append(f"{module.__name__}:{target}")
                continue
            if isinstance(fn, classmethod):
                setattr(holder, attr, classmethod(timed(target, fn.__func__)))
            elif isinstance(fn, staticmethod):
                setattr(holder, attr, staticmethod(timed(target, fn.__func__)))
            else:
                setattr(holder, attr, timed(target, fn))
        if module.__name__ == "shardsearch.base.monitor":
            module.create_monitored_function = monitored_factory(module.create_monitored_function)

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name not in TARGETS and name != "shardsearch.base.monitor":
                return None
            for finder in sys.meta_path:
                if finder is self:
                    continue
                spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            original = loader.exec_module

            def exec_module(module):
                original(module)
                patch(module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())
    # A worker is `python -c ... READ_FD WRITE_FD PAYLOAD` (`execution/isolate.py`),
    # or forked from the spawner's helper, `python -c ... SOCKET_FD`
    # (`execution/spawner.py`), which imports the modules (patched here as they
    # load) and forks each worker: the child is a worker from the fork on, and
    # leaves through `os._exit`, which runs no atexit hook.
    worker = sys.argv[:1] == ["-c"] and sys.argv[-1].endswith("payload.pkl")
    helper = sys.argv[:1] == ["-c"] and len(sys.argv) == 2
    state = {"role": "worker" if worker else "helper" if helper else "study",
             "started": time.perf_counter()}

    def dump() -> None:
        role = state["role"]
        out = {"role": role, "argv": sys.argv, "wall": time.perf_counter() - state["started"],
               "missing": missing, "totals": totals, "events": events}
        with open(os.path.join(folder, f"{role}-{os.getpid()}.json"), "w") as f:
            json.dump(out, f, indent=1)

    def forked() -> None:
        if state["role"] == "helper":
            state.update(role="worker", started=time.perf_counter())
            totals.clear()
            events.clear()

    real_exit = os._exit

    def exit_(code: int) -> None:
        if state["role"] == "worker":
            dump()
        real_exit(code)

    os.register_at_fork(after_in_child=forked)
    os._exit = exit_
    atexit.register(dump)


if os.environ.get("OVERHEAD_TRACE"):
    _install(os.environ["OVERHEAD_TRACE"])
