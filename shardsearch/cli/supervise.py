"""One of several processes runs its search in a child, to end with our exit code.

When process 0 of a multi-process search dies, JAX's runtime in every other
process learns it from the coordination service (which lived in process 0)
and aborts the process from a C++ thread: SIGABRT, exit status 134, before
any Python code of ours can run. Nothing inside the process can turn that
into the documented exit code 1 with a message of ours, so the command line
runs the search in a child process and stays outside, waiting:

- the child's exit code passes through unchanged;
- a child ended by a signal gives exit code 1 and one line saying what
  happened (for SIGABRT: JAX's runtime ended it, most likely because process
  0 is gone), after JAX's own lines;
- SIGINT and SIGTERM sent to this process are passed to the child once (the
  child runs in its own process group, so Ctrl-C in a terminal reaches it
  only through here, and only once); a child asked to stop that then dies
  of a signal gives 128 + the signal asked for, as a shell reports it;
- if this process is killed, Linux kills the child too: the child asks for
  it first thing (`die_with_supervisor`, `PR_SET_PDEATHSIG`), so no search
  outlives the command that started it.

Example:
  >>> run_supervised(["optimize", "--num-processes", "2", ...], "shardsearch optimize")
  1   # process 0 died; the line on stderr says so
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

# Set in the child's environment to the supervising process's id: the child
# runs the search itself.
SUPERVISED_ENV = "SHARDSEARCH_SUPERVISED"

_PR_SET_PDEATHSIG = 1


def supervised() -> bool:
    """Whether this process is the child of `run_supervised`."""
    return bool(os.environ.get(SUPERVISED_ENV))


def die_with_supervisor() -> None:
    """In the child: be killed when the supervising process dies (Linux),
    and leave at once if it died already."""
    parent = int(os.environ.get(SUPERVISED_ENV) or 0)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent and os.getppid() != parent:
        os._exit(1)


def run_supervised(argv: Sequence[str], prog: str) -> int:
    """Runs `python -m shardsearch ARGV` as a child (`supervise`)."""
    env = dict(os.environ, **{SUPERVISED_ENV: str(os.getpid())})
    return supervise([sys.executable, "-m", "shardsearch", *argv], prog, env)


def supervise(command: Sequence[str], prog: str, env: dict[str, str] | None = None) -> int:
    """Runs `command` as a child and returns its exit code, or, when a
    signal ended it, 1 with a line on stderr naming the signal (128 + the
    signal when this process was asked to stop and passed it on)."""
    child: subprocess.Popen[bytes] | None = None
    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        # Before the child exists, the signal is kept and passed on at its start.
        if signum not in forwarded:
            forwarded.append(signum)
            if child is not None and child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # No preexec_fn: it would make Python fork with JAX's threads running.
        child = subprocess.Popen(list(command), env=env, process_group=0)
        for signum in forwarded:
            child.send_signal(signum)
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    if code >= 0:
        return code
    sys.stdout.flush()
    if forwarded:
        # Asked to stop, it was ended on the way (JAX aborts it when process 0
        # leaves first): the exit code says it was the signal, as a shell does.
        print(f"{prog}: stopped by {_name(forwarded[0])} (the search ended on {_name(-code)} "
              "while stopping); finished trials are kept in the study, restart every "
              "process to resume it", file=sys.stderr, flush=True)
        return 128 + forwarded[0]
    print(f"{prog}: error: {_signal_line(-code)}", file=sys.stderr, flush=True)
    return 1


def _signal_line(signum: int) -> str:
    if signum == signal.SIGABRT:
        return ("JAX's runtime aborted this process (SIGABRT), which it does when the "
                "coordination service in process 0 is gone (process 0 died or cannot be "
                "reached) or reports that another process failed; JAX's own message is above. "
                "The study is consistent: restart every process to resume it")
    return (f"the search process was ended by {_name(signum)}; restart every process to "
            "resume the study")


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
