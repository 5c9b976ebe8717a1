"""Make `.whl-tpu/`: the wheels a lent TPU machine needs to run shardsearch.

That machine has no network and comes with Python 3.11, jax, jaxlib, libtpu,
numpy and scipy; the rest of shardsearch's core dependencies travel as wheels
(`run`'s `carry`). This walks the installed `shardsearch`'s requirements
(extras left out), skips what the machine has, and downloads each remaining
package at the version installed here:

    python benchmarks/v5e/wheels.py            # from the repository root

then carry `.whl-tpu` (git-ignored) and start the device command with the install that
`benchmarks/results/v5e/notes.md` gives.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

# What the lent TPU machine already has (the device tool's KINDS.md), with
# what jax itself pulls in there.
PREINSTALLED = {"jax", "jaxlib", "libtpu", "numpy", "scipy", "ml-dtypes", "opt-einsum"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
FOLDER = ".whl-tpu"


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def closure(root: str = "shardsearch") -> dict[str, str]:
    """Each installed package `root` needs (extras and environment markers
    that do not hold here left out) → its installed version, less
    `PREINSTALLED`."""
    found: dict[str, str] = {}
    todo = [root]
    while todo:
        for requirement in md.requires(todo.pop()) or ():
            spec, _, marker = requirement.partition(";")
            if "extra" in marker:
                continue
            name = _name(re.match(r"\s*([A-Za-z0-9_.\-]+)", spec).group(1))
            if name in found or name in PREINSTALLED or name == _name(root):
                continue
            try:
                found[name] = md.version(name)
            except md.PackageNotFoundError:
                continue  # a marker for another platform or Python: not needed here
            todo.append(name)
    return found


def main() -> int:
    wanted = closure()
    folder = Path(FOLDER)
    folder.mkdir(exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
               *platforms, "-d", str(folder), *(f"{n}=={v}" for n, v in wanted.items())]
    print(" ".join(f"{n}=={v}" for n, v in wanted.items()), flush=True)
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
