"""Confirming a stored study: its finalists re-timed side by side, after the search.

Workers that share a study leave the confirmation to the one that finishes
last (`search.claims.Roster`). `confirm_study` does it on its own, for a
study whose workers ran with no confirmation rounds, or whose last worker
died before its own: the finalists of every trial recorded are re-timed on
this process's devices, the winner is picked and checked as `optimize` does
(`search.finish`), and the result is stored in the study, saying it came from
here ("confirmed_by").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import optuna

from ..base import mesh as _mesh
from .evaluation import confirm as _confirm
from .evaluation.objectives import get_objective
from .finish import finish
from .result import OptimizeResult
from .setup import SearchSettings, make_context, prepare
from .study import attrs as _attrs
from .study.identity import check_workload
from .study.record import TrialRecord
from .study.storage import open_study

if TYPE_CHECKING:
    from ..workloads import Workload

# The "confirmed_by" of a result `confirm_study` stored.
CONFIRMED_BY_COMMAND = "shardsearch confirm"


class NotRecorded(RuntimeError):
    """The finalists were re-timed but the study could not store the result
    (a read-only SQLite file, a lost connection). `result` holds it, so the
    re-timing is not lost: write its plan file from it."""

    def __init__(self, message: str, result: OptimizeResult):
        super().__init__(message)
        self.result = result


def confirm_study(
    storage: str | None,
    study_name: str,
    *,
    mesh: jax.sharding.Mesh,
    workload: Workload | None = None,
    rounds: int = 10,
    warmup: int = 2,
    repeats: int = 7,
) -> OptimizeResult:

    """Re-times the finalists of a stored study on `mesh` and records the winner.

    Args:
      storage: the study's Optuna storage URL (None: the default SQLite file).
      study_name: the study.
      mesh: a mesh with the study's axes, in order, and sizes.
      workload: the `Workload` the study searched; default its built-in one.
      rounds: interleaved re-timing rounds (at least 1).
      warmup, repeats: as for `optimize` (the output check's steps).

    Returns:
      The `OptimizeResult`, as `optimize` would have returned it; the study's
      "result" is replaced with it, "confirmed_by": "shardsearch confirm".

    Raises:
      NotRecorded: the study could not store the result (it holds it).
      ValueError: no such study, one shardsearch did not write, an objective
        that re-times nothing ("static"), another mesh or workload than the
        study's, or no completed trial.

    Example:
      >>> confirm_study("postgresql://u:pw@db/shardsearch", "gpt-dp2-tp4", mesh=mesh)
    """
    if rounds < 1:
        raise ValueError(f"confirm_study: need rounds >= 1, got {rounds=}")
    _confirm.check_rounds(rounds, "confirm_study: rounds")
    study = open_study(storage, study_name, create=False)
    attrs = study.user_attrs
    where = f"study {study_name!r}"
    if _attrs.MESH not in attrs or _attrs.OBJECTIVE not in attrs:
        raise ValueError(f"{where} has no shardsearch attributes; confirm studies that "
                         "`shardsearch optimize` ran")
    objective = get_objective(attrs[_attrs.OBJECTIVE])
    if not objective.confirms:
        raise ValueError(f"{where} used objective {objective.name!r}, which re-times "
                         "nothing; its result needs no confirmation")
    recorded = {str(k): int(v) for k, v in dict(attrs[_attrs.MESH]).items()}
    if _mesh.axis_sizes(mesh) != recorded:
        raise ValueError(
            f"{where} searched mesh {_axes(recorded)}; this mesh is "
            f"{_axes(_mesh.axis_sizes(mesh))}")
    if workload is None:
        from .export import _builtin_workload

        if attrs.get(_attrs.WORKLOAD) is None:
            raise ValueError(f"{where} searched a raw step; confirm it from Python with its "
                             "workload")
        workload = _builtin_workload(attrs[_attrs.WORKLOAD], where)
    check_workload(study, workload, None)
    records = [r for t in study.get_trials(deepcopy=False)
               if (r := TrialRecord.from_trial(t)) is not None]
    # The knobs the trials set, so that a finalist's step can be built with
    # its setting (a study searched with --knobs has variants).
    knobs = tuple(sorted({name for r in records for name, _ in r.knobs})) or None
    # The rules space needs no logical axes: the finalists come from the study.
    settings = SearchSettings(memory_budget=attrs.get(_attrs.BUDGET), objective=objective,
                              seed=attrs.get(_attrs.SEED) or 0, warmup=warmup,
                              repeats=repeats, space="rules", study_name=study_name,
                              isolate=False, knobs=knobs)
    ctx, workload = make_context(workload, None, mesh, settings)
    with ctx:
        result = finish(prepare(ctx, workload, settings, {}), study, records, rounds)
    result.confirmed_by = CONFIRMED_BY_COMMAND
    summary = result.to_json()
    del summary["trials"]
    try:
        study.set_user_attr(_attrs.RESULT, summary)
    except optuna.exceptions.StorageInternalError as err:
        cause = err.__cause__ or err
        raise NotRecorded(f"{where}: re-timed, but the result could not be stored: "
                          f"{str(cause).splitlines()[0]}", result) from err
    return result


def _axes(sizes: dict[str, int]) -> str:
    return _mesh.axes_text(sizes)
