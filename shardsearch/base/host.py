"""What this host has, read from Linux's /proc files: its CPU and its memory.

Elsewhere the files do not exist and every reader returns None, which callers
take as "unknown" (no check made, nothing recorded).

Example:
  >>> meminfo_bytes("MemTotal")  # on a machine of 24 GiB, less the kernel's share
  25276194816
"""

from __future__ import annotations

from pathlib import Path


def proc_field(path: str, key: str) -> str | None:
    """The value of `key: value` in a /proc file (`proc_field("/proc/cpuinfo",
    "model name")`), stripped; None when the file or the key is missing."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return None


def meminfo_bytes(key: str) -> int | None:
    """A /proc/meminfo field in bytes ("MemTotal", "MemAvailable"); None where
    it cannot be read."""
    value = proc_field("/proc/meminfo", key)  # "24567356 kB"
    number, _, unit = (value or "").partition(" ")
    if not number.isdigit():
        return None
    return int(number) * (1024 if unit.strip().lower() == "kb" else 1)
