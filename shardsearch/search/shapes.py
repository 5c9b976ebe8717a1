"""The mesh's shape as part of the search: N devices over named axes.

`optimize(step, args, devices=8, axes=("dp", "tp"))` searches how to split
the 8 devices over the axes as well as the sharding on each split:

- `mesh_shapes` lists the factorisations of N over the axes in order
  (`(1, 8), (2, 4), (4, 2), (8, 1)`) and drops, before anything compiles,
  those where an axis of size > 1 divides no dimension of any argument:
  every array would be replicated over it, the plans of a smaller mesh on
  more devices (`pruned`, with the reason);
- each shape left is searched as its own study, `optimize` on that mesh,
  named after its shape (`<name>/dp=2,tp=4` for a name given; the default
  name already spells the mesh), so a killed run resumes shape by shape
  and a shape's trials are never mixed with another's. In a first round
  every shape runs its warm start whole and `PROBES` searched trials (a
  shape is judged by its best known plans, and by a few searched ones where
  none of those fits), or half the trials split evenly if that is more;
  so `n_trials` below shapes x (baselines + probes) is exceeded, and the
  result says by how much. The trials left go to the better half of the shapes
  by what the first round found: their studies resume. The timeout is
  split in proportion to the trials. On a storage that does not outlive a
  call (in memory) there is one round, `n_trials` split evenly;
- a shape none of whose candidates completes (all over the budget) is
  set aside with the reason (`shapes["failed"]`), and the others go on;
- the shapes' winners are then compared: re-timed interleaved in this
  process when the objective re-times (measured), else by their estimates;
  `finish.pick_winner` decides, so a shape wins on a tie only with less
  memory per device, and the verdict says whether it is significantly
  faster than the runner-up.

The result is the winning shape's `OptimizeResult`, its plan file records
that shape, and its `shapes` says what every shape gave.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from ..base import mesh as _mesh
from ..base import tree as _tree
from ..base.warnings import ShardsearchWarning
from .evaluation import confirm as _confirm
from .finish import NothingCompleted, pick_winner
from .result import OptimizeResult
from .setup import SearchSettings
from .study.storage import is_resumable

MeshMaker = Callable[[Mapping[str, int]], jax.sharding.Mesh]

# Searched trials each shape runs in the first round beyond its warm start:
# where every baseline is over the memory (a plan without the distributed
# optimizer on a large model), only a searched one can say the shape fits.
PROBES = 4

# How a split whose mesh could not be made is recorded in `shapes["pruned"]`.
NO_MESH = "no mesh of this shape"


class ShapeWarning(ShardsearchWarning):
    """A split of the devices was left out of the shapes compared: its mesh
    could not be made (a target that cannot lay it out), or nothing of it
    completed (every candidate over the memory)."""


def factorisations(n: int, k: int) -> list[tuple[int, ...]]:
    """Every ordered `k`-tuple of positive ints whose product is `n`.

    Example:
      >>> factorisations(8, 2)
      [(1, 8), (2, 4), (4, 2), (8, 1)]
    """
    if k == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0
            for rest in factorisations(n // d, k - 1)]


def mesh_shapes(devices: int, axes: Sequence[str], args: Any
                ) -> tuple[list[dict[str, int]], dict[str, str]]:
    """The shapes of `devices` over `axes` worth searching for `args`, and
    those pruned with the reason.

    Raises:
      ValueError: `devices` below 1, no axes or a repeated one, or every
        shape pruned (with the dims there are).
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices={devices!r}: give the number of devices to split, an int >= 1")
    axes = tuple(axes)
    if not axes or len(set(axes)) != len(axes) or not all(isinstance(a, str) and a
                                                           for a in axes):
        raise ValueError(f"axes={axes!r}: give distinct axis names, e.g. ('dp', 'tp')")
    dims = sorted({d for leaf in jax.tree.leaves(args) for d in _tree.leaf_shape(leaf)})
    kept, pruned = [], {}
    for sizes in factorisations(devices, len(axes)):
        shape = dict(zip(axes, sizes, strict=True))
        idle = [f"{a}={s}" for a, s in shape.items() if s > 1 and not any(d % s == 0
                                                                            for d in dims)]
        if idle:
            pruned[_mesh.axes_text(shape)] = (f"{' and '.join(idle)} divides no dimension of any "
                                         "argument: every array would be replicated over it")
        else:
            kept.append(shape)
    if not kept:
        raise ValueError(
            f"no way to split {devices} devices over {', '.join(axes)} shards anything: the "
            f"arguments' dimensions are {dims[:12]}; use fewer devices or other axes")
    return kept, pruned


def host_meshes(devices: int) -> MeshMaker:
    """Meshes over the first `devices` of this process's devices.

    Raises:
      ValueError: fewer devices than that.
    """
    available = jax.devices()
    if devices > len(available):
        raise ValueError(
            f"devices={devices}: there are {len(available)} {available[0].platform} devices; "
            "use fewer, or simulate more CPU devices (shardsearch.use_cpu_devices)")

    def make(shape: Mapping[str, int]) -> jax.sharding.Mesh:
        return _mesh.create_mesh(tuple(shape.values()), tuple(shape), available[:devices])

    return make


def search_shapes(step: Any, args: Sequence[Any] | None, devices: int, axes: Sequence[str],
                  settings: SearchSettings, make_mesh: MeshMaker | None,
                  optimize: Callable[..., OptimizeResult | None]) -> OptimizeResult:
    """`optimize` over every shape `mesh_shapes` keeps; see the module docstring.

    Raises:
      ValueError: bad devices or axes, several JAX processes, or what
        `optimize` raises for a shape (before that shape's first trial).
    """
    if jax.process_count() > 1:
        raise ValueError("devices/axes search the shapes of this process's devices; across "
                         "processes give mesh= (one shape)")
    if args is None and not callable(getattr(step, "abstract", None)):
        raise ValueError("optimize(step, args, devices=..., axes=...): give args (or a "
                         "Workload, whose arguments it has)")
    probe = args if args is not None else step.abstract()
    shapes, pruned = mesh_shapes(devices, axes, probe)
    make_mesh = make_mesh or host_meshes(devices)
    meshes = {}
    for shape in shapes:
        try:
            meshes[_mesh.axes_text(shape)] = make_mesh(shape)
        except ValueError as err:
            # A target that cannot lay the shape out (a GPU's tensor axis
            # wider than one host): that shape is not there to search.
            pruned[_mesh.axes_text(shape)] = f"{NO_MESH}: {err}"
    if not meshes:
        raise ValueError(f"no split of {devices} devices over {', '.join(axes)} makes a "
                         f"mesh: {'; '.join(f'{k}: {v}' for k, v in pruned.items())}")
    results: dict[str, OptimizeResult] = {}
    failed: dict[str, str] = {}
    setups: dict[str, Any] = {}
    said: dict[str, set[tuple[type, str]]] = {}

    def run(text: str, trials: int) -> None:
        share = dataclasses.replace(
            settings, n_trials=trials,
            timeout=(None if settings.timeout is None
                     else settings.timeout * trials / max(settings.n_trials, 1)),
            study_name=(None if settings.study_name is None
                        else f"{settings.study_name}/{text}"))
        try:
            with _said_once(said.setdefault(text, set())):
                result = optimize(step, args, mesh=meshes[text], settings=share)
        except NothingCompleted as err:
            # Nothing of this shape fits (or ran): the others may.
            failed[text] = str(err)
            if err.setup is not None:
                setups.setdefault(text, err.setup)
            return
        if result.setup is not None:
            setups.setdefault(text, result.setup)
        assert result is not None  # one process: it searches and records
        results[text] = result
        failed.pop(text, None)

    # A storage that ends with each call cannot resume: one round, split evenly.
    if not is_resumable(settings.storage):
        for text, trials in _split(max(settings.n_trials, len(meshes)), list(meshes)).items():
            run(text, trials)
        return _pick(results, pruned, failed, devices, axes, settings)
    # First round: every shape gets its warm start whole (a shape is judged
    # by its best known plans, not by whichever baselines a short share
    # reached), and half the trials if that is more.
    names = list(meshes)
    share, spent = max(settings.n_trials // 2 // len(names), 1), 0
    for text in names:
        run(text, share)
        warm = len(setups[text].run_order()) + PROBES if text in setups else 0
        if warm > share:
            run(text, warm - share)
        spent += max(share, warm)
    # Second round: what is left, over the better half of the shapes (their
    # studies resume where the first round left them).
    if len(names) > 1 and settings.n_trials > spent:
        ranked = sorted(results, key=lambda text: _rank(results[text]))
        better = ranked[:math.ceil(len(ranked) / 2)]
        for text, trials in _split(settings.n_trials - spent, better).items():
            if trials:
                run(text, trials)
    return _pick(results, pruned, failed, devices, axes, settings)


@contextlib.contextmanager
def _said_once(said: set[tuple[type, str]]) -> Iterator[None]:
    """Warnings issued inside, each shown (at the place that issued it, once
    the shape's round ends) unless `said`, the same shape's earlier rounds,
    already holds its class and text.

    A shape's study resumes in a later round and its setup warns again (the
    search's `catch_warnings` blocks reset Python's once-per-place memory),
    so without this a shape search printed each setup warning once per round.
    The caller's filters still apply where a warning is issued ("error"
    raises there).
    """
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
    finally:  # a shape where nothing completed raises, and its warnings count
        for w in caught:
            if (w.category, str(w.message)) not in said:
                said.add((w.category, str(w.message)))
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _split(n: int, names: list[str]) -> dict[str, int]:
    """`n` trials over `names` as evenly as ints allow, the first ones taking the rest."""
    return {name: n // len(names) + (i < n % len(names)) for i, name in enumerate(names)}


def _rank(result: OptimizeResult) -> tuple[float, float]:
    """Faster first; on equal times, less memory per device."""
    memory = result.best_memory
    return (result.best_time, math.inf if memory is None else memory)


def _pick(results: dict[str, OptimizeResult], pruned: dict[str, str], failed: dict[str, str],
          devices: int, axes: Sequence[str], settings: SearchSettings) -> OptimizeResult:
    """The winning shape's result, with `shapes` saying what each gave.

    Raises:
      NothingCompleted: no shape completed a candidate.
    """
    if not results:
        raise NothingCompleted(
            f"no split of {devices} devices over {', '.join(axes)} completed a candidate: "
            + "; ".join(f"{text}: {why}" for text, why in failed.items()))
    # Left out for another reason than dividing nothing (which is the point of
    # pruning): the mesh could not be made, or nothing of it completed.
    left = {text: why for text, why in pruned.items() if why.startswith(NO_MESH)} | failed
    if left:
        warnings.warn(ShapeWarning(
            f"{len(left)} split(s) of {devices} devices over {', '.join(axes)} left out of "
            "the comparison: " + "; ".join(f"{text}: {why}" for text, why in left.items())
            + " (result.shapes['pruned'] and ['failed'] keep them)"), stacklevel=4)
    retimed: dict[str, _confirm.Timing] = {}
    first = next(iter(results.values()))
    if (len(results) > 1 and first.setup is not None
            and first.setup.context.objective.confirms and settings.confirm_rounds > 0):
        # Each winner on its own mesh, all in this process, in turn per round.
        finalists = [(text, r.best_specs, r.setup.context) for text, r in results.items()
                     if r.setup is not None]
        retimed = _confirm.retime_here(finalists, first.setup.context, settings.confirm_rounds)
    if retimed:
        winner, verdict = pick_winner([(text, retimed[text].times, True, r.best_memory)
                                       for text, r in results.items()])
    else:
        winner = min(results, key=lambda text: _rank(results[text]))
        verdict = "unconfirmed"
    chosen = results[winner]
    chosen.shapes = {
        "devices": devices, "axes": list(axes), "chosen": winner, "verdict": verdict,
        "searched": {text: {"study_name": r.study.study_name, "best_label": r.best_label,
                            "best_time": r.best_time, "trials": len(r.trials),
                            **({"retimed": retimed[text].to_json()} if text in retimed else {})}
                     for text, r in results.items()},
        "pruned": dict(pruned),
        "failed": dict(failed),
        "trials": {"asked": settings.n_trials,
                   "run": sum(len(r.trials) for r in results.values())},
    }
    return chosen
