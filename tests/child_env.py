"""The environment of a process a test starts: this session's, whose
XLA_FLAGS conftest set (the tests' cheap compiles, no device-count flag), on
the simulated CPU devices."""

import os


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with `JAX_PLATFORMS=cpu` and `extra`."""
    return {**os.environ, "JAX_PLATFORMS": "cpu", **extra}
