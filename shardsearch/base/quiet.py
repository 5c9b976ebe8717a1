"""Importing JAX without the CUDA plugin's start-up chatter.

With the `cuda` extra installed (to compile for GPUs deviceless), `import
jax` loads the CUDA plugin, whose C++ logging prints, on a machine without a
GPU driver, lines like `cudart_stub.cc:31] Could not find cuda drivers on
your machine` to the process's stderr, below Python. A command that owes its
user one line on stderr cannot have them, so the import runs with stderr
captured and everything but those known lines is written back.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

# The lines dropped: the plugin's note that this machine has no CUDA driver,
# and absl's note that logging is not set up yet, which precedes it.
_CHATTER = re.compile(r"cudart_stub\.cc:\d+\] Could not find cuda drivers"
                      r"|^WARNING: All log messages before absl::InitializeLog\(\) is called")


def import_jax() -> None:
    """Imports jax (if not yet imported), keeping all of its stderr output
    except the CUDA plugin's no-driver chatter."""
    if "jax" in sys.modules:
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (AttributeError, OSError, ValueError):  # no real stderr (embedded interpreters)
        import jax

        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import jax  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    kept = "".join(line for line in text.splitlines(keepends=True) if not _CHATTER.search(line))
    if kept:
        sys.stderr.write(kept)
