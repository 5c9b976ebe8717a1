"""Bounds on what an input may ask for, checked before any work starts.

A file nested ten thousand levels deep or a request for 100000 simulated
devices is not a plan or a mesh anyone means; without a bound the first ends
in a RecursionError and the second spends minutes and gigabytes before
printing a word. The bounds are fixed numbers, not functions of the machine,
so an input is accepted or refused the same way everywhere.
"""

from __future__ import annotations

# Nesting levels of `[` and `{` a JSON file may have (`base.jsonfile`). A plan
# file uses under ten; the bound leaves room for hand-written files while
# staying far below Python's recursion limit for the code that walks them.
MAX_JSON_DEPTH = 64

# Simulated CPU devices one process may ask for. Each is a device of XLA's CPU
# client with its own threads and buffers: 4096 start in about 6 s and 600 MB,
# 100000 took 5 minutes and 11 GB before the first trial.
MAX_SIMULATED_DEVICES = 4096


def check_simulated_devices(n: int, where: str = "simulated devices") -> int:
    """`n` when it is a device count this process may simulate; else a ValueError.

    Example: `check_simulated_devices(8)` → 8; `check_simulated_devices(100000)`
    raises "simulated devices: 100000 asked, at most 4096 ...".
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{where}: must be a whole number >= 1, got {n!r}")
    if n > MAX_SIMULATED_DEVICES:
        raise ValueError(
            f"{where}: {n} asked, at most {MAX_SIMULATED_DEVICES} can be simulated (each "
            "is a CPU device with its own threads and memory in this process; "
            f"{MAX_SIMULATED_DEVICES} take seconds and hundreds of MB to start, many more "
            "take minutes and gigabytes); simulate a smaller mesh with the same axis "
            "names: a plan's rules apply to other sizes (`shardsearch show --mesh`)")
    return n
