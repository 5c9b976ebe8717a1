"""`shardsearch launch`: several processes of one command on this machine, to try
a search over several processes without several hosts.

    shardsearch launch --processes 2 --devices-per-process 4 -- \\
        optimize --workload gpt:tiny --mesh dp=2,tp=4 --trials 8

starts `shardsearch optimize ... --coordinator 127.0.0.1:PORT --num-processes
2 --process-id I --devices 4` for I = 0 and 1 (a free port on loopback), and
prints their output line by line, each line prefixed with its process
(`[0] ...`, `[1] ...`). It exits with the worst exit code of the processes
(the highest); Ctrl-C or SIGTERM stops them all (SIGTERM, then SIGKILL to
any still running after `STOP_GRACE` seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

from .args import Command, UsageError, device_count, positive_int

# The commands that can run as several processes.
COMMANDS = ("optimize",)

# Seconds the processes get to stop after SIGTERM before SIGKILL.
STOP_GRACE = 20.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--processes", type=positive_int, required=True, metavar="N",
                   help="how many processes to start")
    p.add_argument("--devices-per-process", type=device_count, metavar="D",
                   help="simulated CPU devices in each process (given to each as --devices "
                        "D; default: the devices JAX finds)")
    p.add_argument("--port", type=positive_int, metavar="PORT",
                   help="the coordinator's port on 127.0.0.1 (default: a free one)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help=f"the command each process runs, after --: one of {COMMANDS} with "
                        "its options")


def run(a: argparse.Namespace) -> int:
    command = list(a.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or command[0] not in COMMANDS:
        raise UsageError(f"give the command after --, e.g. `shardsearch launch --processes 2 "
                         f"-- optimize --workload gpt:tiny --mesh dp=2,tp=4`; one of "
                         f"{COMMANDS}, got {' '.join(command) or 'nothing'}")
    taken = [flag for flag in ("--coordinator", "--num-processes", "--process-id")
             if any(arg == flag or arg.startswith(flag + "=") for arg in command)]
    if taken:
        raise UsageError(f"{', '.join(taken)}: launch sets these itself; drop them")
    if a.devices_per_process is not None and any(
            arg == "--devices" or arg.startswith("--devices=") for arg in command):
        raise UsageError("--devices and --devices-per-process both given; keep "
                         "--devices-per-process")
    address = f"127.0.0.1:{a.port or free_port()}"
    children = [start(process_command(command, address, a.processes, i,
                                      a.devices_per_process))
                for i in range(a.processes)]
    lock = threading.Lock()
    readers = [threading.Thread(target=relay, args=(child.stdout, f"[{i}] ", lock),
                                daemon=True, name=f"launch-relay-{i}")
               for i, child in enumerate(children)]
    for reader in readers:
        reader.start()
    try:
        codes = [child.wait() for child in children]
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (main turns it into an exception)
        stop(children)
        raise
    finally:
        for reader in readers:
            reader.join(timeout=5.0)
    return worst(codes)


def process_command(command: Sequence[str], address: str, n: int, i: int,
                    devices: int | None) -> list[str]:
    """Process `i`'s command line: `shardsearch COMMAND ...` with the flags
    that make it one of `n`.

    Example:
      >>> process_command(["optimize", "--workload", "mlp:tiny"], "127.0.0.1:7", 2, 1, 4)[3:]
      ['optimize', '--workload', 'mlp:tiny', '--coordinator', '127.0.0.1:7', ...]
    """
    flags = ["--coordinator", address, "--num-processes", str(n), "--process-id", str(i)]
    if devices is not None:
        flags += ["--devices", str(devices)]
    return [sys.executable, "-m", "shardsearch", *command, *flags]


def free_port() -> int:
    """A TCP port free on loopback now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    # Its own session: Ctrl-C reaches the launcher, which stops each process once.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def relay(stream: IO[bytes] | None, prefix: str, lock: threading.Lock) -> None:
    """Copies a process's output to ours, each line prefixed, whole lines at a time."""
    if stream is None:
        return
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        with lock:
            sys.stdout.write(f"{prefix}{line}\n")
            sys.stdout.flush()


def stop(children: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every process still running, SIGKILL after `STOP_GRACE` seconds."""
    for child in children:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def worst(codes: Sequence[int]) -> int:
    """The launcher's exit code: the highest of the processes' (a signal's death,
    negative in Popen, counts as 128 + the signal, as a shell reports it).

    Example:
      >>> worst([0, 1]), worst([0, -9])
      (1, 137)
    """
    return max((128 - code if code < 0 else code) for code in codes)


COMMAND = Command("launch", "start several processes of one search on this machine (to try "
                            "a mesh over several hosts)", add_arguments, run)
