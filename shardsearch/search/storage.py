"""Where studies live and how they are sampled: Optuna storage, sampler, compile cache.

Everything here is process-wide or outside the process: the study's storage
URL, the sampler every study is created with (recorded in plan files), and
JAX's persistent compilation cache. The trial loop (`search.loop`) only
opens a study and asks it for trials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import optuna

DEFAULT_DIR = Path(".shardsearch")


def default_storage() -> str:
    """An SQLite file under `./.shardsearch/`, created on demand."""
    DEFAULT_DIR.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(DEFAULT_DIR / 'studies.db').resolve()}"


# The search's sampler is Optuna's TPE with these options on top of its
# defaults (none: `benchmarks/efficiency` replays it against the grouped
# multivariate variant, random and grid sampling on tables of whole spaces
# timed beforehand, and over 20 seeds the grouped variant was no better; see
# `benchmarks/results/efficiency/summary.md`).
SAMPLER_OPTIONS: dict[str, Any] = {}

# Recorded with each study (and in exported files and bench entries), so a
# result says which sampler found it; derived from the options above.
SAMPLER = "TPESampler(" + ", ".join(f"{k}={v!r}" for k, v in SAMPLER_OPTIONS.items()) + ")"


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """The search's sampler (`SAMPLER`), seeded."""
    return optuna.samplers.TPESampler(seed=seed, **SAMPLER_OPTIONS)


def open_study(storage: str | None, study_name: str, sampler: Any = None,
               pruner: Any = None, create: bool = True) -> optuna.Study:
    """Creates or resumes a study; a storage that cannot be opened is a ValueError."""
    url = storage or default_storage()
    try:
        if create:
            return optuna.create_study(
                storage=url, study_name=study_name, sampler=sampler, pruner=pruner,
                direction="minimize", load_if_exists=True)
        return optuna.load_study(storage=url, study_name=study_name, sampler=sampler,
                                 pruner=pruner)
    except KeyError:
        raise ValueError(
            f"no study named {study_name!r} in storage {url!r}; list them with "
            "optuna.get_all_study_summaries or check the name") from None
    except Exception as err:
        if isinstance(err, ValueError) and "study" in str(err).lower():
            raise
        raise ValueError(
            f"cannot open storage {url!r}: {type(err).__name__}: {err}; give an Optuna "
            "storage URL such as sqlite:///path/to/studies.db") from None


def use_compile_cache(folder: str | Path) -> Path:
    """Turns on JAX's persistent compilation cache in `folder`, unless the
    process already has one; returns the folder in use."""
    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path.resolve()))
    # JAX's default threshold (1 s) would skip most small-model compiles.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path
