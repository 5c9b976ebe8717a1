"""Reading a JSON file someone else wrote: UTF-8, bounded nesting, errors that name it.

Every JSON file shardsearch reads (plan files, `shardsearch show`, benchmark
suites) goes through `read_json`. Python's `json` recurses once per nesting
level, so a file of ten thousand `[` would end in a RecursionError far from
the file that caused it; `read_json` counts the nesting first and refuses a
file deeper than `MAX_DEPTH` levels (`limits.MAX_JSON_DEPTH`) with a
ValueError that names the file and the limit. Bytes that are not UTF-8 and
text that is not JSON are ValueErrors naming the file too.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Protocol

from .limits import MAX_JSON_DEPTH as MAX_DEPTH

# How `read_json` words a file that is not JSON, unless its caller words it.
INVALID = "{where}: the file is {problem}"

# A JSON string (skipped: brackets inside it do not nest) or one bracket.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


class _Readable(Protocol):
    def read_bytes(self) -> bytes: ...


def read_json(path: str | os.PathLike[str] | _Readable, where: str | None = None,
              *, invalid: str = INVALID, max_depth: int = MAX_DEPTH) -> Any:
    """The parsed contents of a JSON file, checked before they are parsed.

    Args:
      path: the file (a path, or anything with `read_bytes()`, such as a
        package resource).
      where: how errors name the file (default: the path).
      invalid: the message for text that is not JSON, a template with
        `{where}` and `{problem}` (e.g. "not valid JSON (empty or cut short:
        truncated): Expecting value at line 1 column 1"); default
        "{where}: the file is {problem}".
      max_depth: nesting levels allowed (`MAX_DEPTH`).

    Returns:
      What `json.loads` gives for the text.

    Raises:
      OSError: the file cannot be read (missing, a folder, no permission).
      ValueError: naming the file: not UTF-8, nested deeper than `max_depth`,
        or not JSON (saying when it looks cut short).

    Example:
      >>> read_json("plan.json")["schema"]
      1
      >>> read_json("deep.json")  # '[' * 100000
      ValueError: deep.json: nested deeper than 64 levels of [ and { (...)
    """
    where = str(path) if where is None else where
    file = Path(path) if isinstance(path, str | os.PathLike) else path
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{where}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); "
            "JSON files must be saved as UTF-8") from None
    return parse_json(text, where, invalid=invalid, max_depth=max_depth)


def parse_json(text: str, where: str, *, invalid: str = INVALID,
               max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads(text)` with the nesting checked first; errors name `where`.

    Example: `parse_json('{"a": [1]}', "inline")` → `{"a": [1]}`.
    """
    depth = nesting(text, max_depth)
    if depth > max_depth:
        raise ValueError(
            f"{where}: nested deeper than {max_depth} levels of [ and {{, the limit for JSON "
            "files shardsearch reads; check that it is the right file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        cut = " (empty or cut short: truncated)" if looks_truncated(text) else ""
        problem = f"not valid JSON{cut}: {err.msg} at line {err.lineno} column {err.colno}"
        raise ValueError(invalid.format(where=where, problem=problem)) from None
    except RecursionError:  # only when the caller raised max_depth past Python's limit
        raise ValueError(f"{where}: nested too deeply for Python's JSON parser") from None


def nesting(text: str, stop: int | None = None) -> int:
    """How deep `[` and `{` nest in JSON text (brackets in strings do not count).

    Counting stops once past `stop`, so a huge file is not scanned to its end.

    Example: `nesting('{"a": [1, "]"]}')` → 2.
    """
    depth = deepest = 0
    for token in _TOKEN.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop is not None and deepest > stop:
                    break
        elif char in "]}":
            depth -= 1
    return deepest


def looks_truncated(text: str) -> bool:
    """True when JSON text is empty, ends inside a string or leaves brackets open."""
    if not text.strip():
        return True
    depth, in_string, escaped = 0, False, False
    for char in text:
        if escaped:
            escaped = False
        elif in_string:
            escaped = char == "\\"
            in_string = char != '"'
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return in_string or depth > 0
