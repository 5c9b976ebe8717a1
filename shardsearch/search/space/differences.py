"""What sets two plans for one step apart, named by the dimensions experts tune.

A plan is a spec for every argument of `step(state, *batch)`, a setting of
the step's knobs, and the mesh it runs on. `plan_differences` names the
dimensions in which two plans differ: the mesh's shape, the parameters'
split, the optimizer state's split, the batch's split and each knob (remat,
microbatches, grad_groups, the activation points). A report uses it to say
what a winner changed against the plan it beat.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...base.activations import PREFIX as ACTIVATION_KNOB
from ...base.knobs import Setting
from ...base.spec import canonical
from ...base.tree import specs_for_leaves
from ...rules.optimizer import OPTIMIZER_PATHS

# The groups of argument leaves, in the order they are reported.
PARAMETERS, OPTIMIZER_STATE, BATCH = "parameters", "optimizer state", "batch"
MESH_SHAPE = "mesh shape"


def plan_differences(args: Sequence[Any], specs: Sequence[Any], other: Sequence[Any],
                     knobs: Setting = (), other_knobs: Setting = (), *,
                     defaults: Mapping[str, Any] | None = None,
                     mesh: Mapping[str, int] | None = None,
                     other_mesh: Mapping[str, int] | None = None) -> list[str]:
    """The dimensions in which plan `(specs, knobs, mesh)` differs from
    `(other, other_knobs, other_mesh)`, both for the arguments `args`
    (`(state, *batch)`, arrays or `ShapeDtypeStruct`s).

    Args:
      specs, other: spec trees for `(state, *batch)` (`Candidate.specs`).
      knobs, other_knobs: knob settings (`Knobs.setting`: the knobs off their
        defaults).
      defaults: the knobs' defaults (`Knobs.defaults`), to name the value a
        setting leaves out; without it a left-out knob reads "default".
      mesh, other_mesh: axis sizes; compared only when both are given.

    Returns:
      One line per dimension, in a fixed order: `"mesh shape: dp=8,tp=8
      (other: dp=16,tp=4)"`, `"parameters: 12 of 18 leaves"`, `"optimizer
      state: 24 of 37 leaves"`, `"batch: 2 of 2 leaves"`, then a line per knob,
      `"remat: none (other: full)"`, with the activation knobs gathered into
      one `"activations: act_seq=tp (other: -)"`. Empty: the same plan.
      The state's optimizer leaves are those under `opt/` or `opt_state/`
      (`rules.optimizer.OPTIMIZER_PATHS`); its other leaves are parameters.

    Raises:
      ValueError: a spec tree does not match `args`.
    """
    out = []
    if mesh is not None and other_mesh is not None and dict(mesh) != dict(other_mesh):
        out.append(f"{MESH_SHAPE}: {_mesh_text(mesh)} (other: {_mesh_text(other_mesh)})")
    counts = {PARAMETERS: [0, 0], OPTIMIZER_STATE: [0, 0], BATCH: [0, 0]}
    for index, arg in enumerate(args):
        pairs, mine = specs_for_leaves(arg, specs[index])
        _, theirs = specs_for_leaves(arg, other[index])
        for (path, _leaf), a, b in zip(pairs, mine, theirs, strict=True):
            group = (BATCH if index else OPTIMIZER_STATE
                     if re.search(OPTIMIZER_PATHS, path) else PARAMETERS)
            counts[group][1] += 1
            counts[group][0] += canonical(a) != canonical(b)
    out += [f"{group}: {changed} of {total} leaves"
            for group, (changed, total) in counts.items() if changed]
    out += _knob_lines(dict(knobs), dict(other_knobs), dict(defaults or {}))
    return out


def _knob_lines(mine: dict[str, Any], theirs: dict[str, Any],
                defaults: dict[str, Any]) -> list[str]:
    def value(setting: dict[str, Any], name: str) -> Any:
        return setting.get(name, defaults.get(name, "default"))

    names = list(dict.fromkeys([*defaults, *mine, *theirs]))
    changed = [n for n in names if value(mine, n) != value(theirs, n)]
    plain = [n for n in changed if not n.startswith(ACTIVATION_KNOB)]
    lines = [f"{n}: {value(mine, n)} (other: {value(theirs, n)})" for n in plain]
    points = [n for n in changed if n.startswith(ACTIVATION_KNOB)]
    if points:
        def text(setting: dict[str, Any]) -> str:
            return ",".join(f"{n}={_axes(value(setting, n))}" for n in points)

        lines.append(f"activations: {text(mine)} (other: {text(theirs)})")
    return lines


def _axes(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return "+".join(str(v) for v in value) or "-"
    return str(value)


def _mesh_text(mesh: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in mesh.items())
