"""Loading a benchmark script as a module, for the tests of its functions."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_script(relative: str, name: str):
    """`benchmarks/...` script `relative` (from the repository root) as module
    `name`, registered in `sys.modules` (a dataclass in it reads its own
    module's namespace while the class is built)."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
