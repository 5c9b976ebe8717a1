"""XLA's log lines, caught per candidate instead of on the terminal.

XLA writes its warnings (e.g. "[SPMD] Involuntary full rematerialization",
a sign that a sharding forces it to gather a whole tensor) straight to the
process's stderr file descriptor, below Python's `sys.stderr`. Printed raw
they interleave with the progress bar; caught per candidate they are evidence
about that candidate: each `Outcome` records how many lines its compile and
run printed and the first of them.

In a worker process (`search.isolate`) the lines arrive in the worker's log
file; in the study process `capture_stderr` redirects descriptor 2 around the
candidate's compile and run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# Longest first line kept in a study (XLA's lines quote whole HLO instructions).
FIRST_LINE_CHARS = 1000

# absl's prefix: severity, date, time, thread, file:line.
_ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [^\]]+\] ")


@dataclasses.dataclass(frozen=True)
class LogLines:
    """What a candidate printed: the text, its non-blank line count and first line.

    Example:
      >>> LogLines.of("\\nW0101 spmd.cc:1] [SPMD] Involuntary full rematerialization\\n")
      LogLines(text='...', count=1, first='W0101 spmd.cc:1] [SPMD] Involuntary ...')
    """

    text: str = ""
    count: int = 0
    first: str = ""

    @classmethod
    def of(cls, text: str) -> LogLines:
        lines = [line.rstrip() for line in text.splitlines() if line.strip()]
        return cls(text, len(lines), lines[0][:FIRST_LINE_CHARS] if lines else "")


def short(line: str, width: int = 100) -> str:
    """A log line without absl's prefix, cut to `width` characters.

    Example:
      >>> short("W1201 12:12:06.471591   28687 spmd_partitioner.cc:656] [SPMD] Involuntary")
      '[SPMD] Involuntary'
    """
    text = _ABSL_PREFIX.sub("", line.strip())
    return text if len(text) <= width else text[:width - 1] + "…"


@contextlib.contextmanager
def capture_stderr() -> Iterator[list[LogLines]]:
    """Redirects file descriptor 2 to a temporary file while the block runs.

    Yields a list that holds one `LogLines` once the block has ended. Output
    of every thread goes there meanwhile (descriptor 2 is process-wide), and
    a crash inside the block loses it: run candidates in a worker
    (`isolate=True`) to keep a crash's last words.
    """
    caught: list[LogLines] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as spool:
        os.dup2(spool.fileno(), 2)
        try:
            yield caught
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            spool.seek(0)
            caught.append(LogLines.of(spool.read().decode("utf-8", "replace")))


def echo(text: str, label: str) -> None:
    """Prints a candidate's caught lines to stderr, under its label (`--verbose`)."""
    if text.strip():
        sys.stderr.write(f"--- XLA log of {label} ---\n{text.rstrip()}\n")
        sys.stderr.flush()
