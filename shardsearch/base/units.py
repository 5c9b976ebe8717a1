"""Byte sizes written by people: "16GiB", "512MB", "1.5e9"."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """Bytes from an int or a string such as `"16GiB"` (binary) or `"2GB"` (decimal).

    Raises:
      ValueError: not a positive size, or an unknown unit; the message lists
        the units.
    """
    if isinstance(value, bool):
        raise ValueError(f"size {value!r} is not a number of bytes")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    elif isinstance(value, str) and (match := _SIZE.match(value)):
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise ValueError(
            f"size {value!r} is not a byte count; write e.g. 16GiB, 512MiB, 2GB or 1000000")
    if unit not in _UNITS:
        raise ValueError(
            f"size {value!r} has unknown unit {unit!r}; use one of B, KB, MB, GB, TB, "
            "KiB, MiB, GiB, TiB")
    total = number * _UNITS[unit]
    # Below one byte would truncate to 0 and infinity cannot become an int.
    if not (math.isfinite(total) and total >= 1):
        raise ValueError(f"size {value!r} must be positive, finite and at least 1 byte")
    return int(total)


def format_bytes(n: int | None) -> str:
    """A byte count for people: `format_bytes(3 * 2**20) == "3.0 MiB"`; "-" for None."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_seconds(seconds: float) -> str:
    """A duration for people, three significant digits: 0.0021 → "2.1 ms",
    1.9e-05 → "19 us", 12.5 → "12.5 s"."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
