"""What a study searched: the step, the mesh, the objective, the space, and
everything else that changes a trial's value.

A study's trials answer one question. A run that resumes the study with
another workload, mesh, objective or space would mix answers to different
questions (or fail deep in Optuna on a parameter whose range moved), and
`shardsearch export` would then resolve the winner on the wrong model. A run
with another memory budget, hardware model, set of cross-host axes, timing
settings or (for measured values) host would rank trials valued under other
rules beside its own: a winner over the new budget, or a CPU estimate beside
an H100 one. So
`optimize` records a `StudyIdentity` in the study, and on resume refuses a
run whose identity differs before it writes anything (`bind_study`);
`export_config` checks a workload it is given against it (`check_workload`).

Studies recorded before identities were keep resuming: their `workload`,
`mesh` and `objective` attributes give the part of the identity they know,
and the first resumed run fills in the rest; those studies, and studies
recorded before `values` were, have no `values` and are compared without them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import optuna

from ...base import mesh as _mesh
from ...base import tree as _tree
from ...base.activations import BATCH_KNOB
from ..space.searchspace import SPACE_VERSION, space_version
from . import attrs as _attrs

if TYPE_CHECKING:
    from ...workloads import Workload
    from ..evaluation.context import Context

# The study user attribute that holds `StudyIdentity.to_json()`.
IDENTITY_ATTR = _attrs.IDENTITY

# The space every study searched before `space=` existed.
DEFAULT_SPACE = "rules"


@dataclasses.dataclass(frozen=True)
class StudyIdentity:
    """What one study searches; a resumed run must search the same.

    Attributes:
      workload: the workload's name ("gpt:tiny"); None for a raw step.
      arguments: for a raw step, `arguments_fingerprint` of its arguments
        (leaf paths, shapes and dtypes); None for a workload (its name says
        it) or when not known (a study recorded before identities were).
      mesh: `(axis name, size)` pairs in mesh order.
      objective: the objective's name ("measured", "static", ...).
      space: the search space's families: "rules", "logical" or "both".
      space_version: `search.space.SPACE_VERSION` of the space that proposed
        the trials (its parameter names, kinds and order).
      values: what else changes a trial's value, as `(name, value)` pairs
        (`trial_values`): the budget, and the hardware model (its name and a
        hash of its JSON) with the cross-host axes for an objective that
        estimates, the warm-up and timed steps and the host for one that
        measures. None when not recorded (an older study).

    Example:
      >>> StudyIdentity("gpt:tiny", None, (("dp", 2), ("tp", 4)), "measured").describe()
      'gpt:tiny on dp=2,tp=4'
    """

    workload: str | None
    arguments: str | None
    mesh: tuple[tuple[str, int], ...]
    objective: str
    space: str = DEFAULT_SPACE
    space_version: str = SPACE_VERSION
    values: tuple[tuple[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        mesh = tuple((str(name), int(size)) for name, size in self.mesh)
        object.__setattr__(self, "mesh", mesh)
        if self.values is not None:
            # Stored as a JSON object: lists come back for tuples.
            values = tuple((str(k), tuple(v) if isinstance(v, list) else v)
                           for k, v in dict(self.values).items())
            object.__setattr__(self, "values", values)
        for field in ("objective", "space", "space_version"):
            if not isinstance(getattr(self, field), str):
                raise TypeError(
                    f"StudyIdentity: {field} must be a str, got {getattr(self, field)!r}")

    def subject(self) -> str:
        """What was searched: the workload's name, or the raw step's arguments."""
        if self.workload is not None:
            return self.workload
        if self.arguments is not None:
            return f"a raw step on arguments {self.arguments}"
        return "a raw step"

    def describe(self, against: StudyIdentity | None = None) -> str:
        """The subject on its mesh, plus the objective and space where they
        differ from `against` (so a message shows what changed).

        Example:
          >>> a.describe(), a.describe(against=dataclasses.replace(a, objective="static"))
          ('gpt:tiny on dp=2,tp=4', 'gpt:tiny on dp=2,tp=4 with objective measured')
        """
        text = f"{self.subject()} on {','.join(f'{a}={s}' for a, s in self.mesh)}"
        extra = []
        if against is not None and against.objective != self.objective:
            extra.append(f"objective {self.objective}")
        if against is not None and (against.space, against.space_version) != (
                self.space, self.space_version):
            extra.append(f"space {self.space!r} (version {self.space_version})")
        # Values are told only between otherwise equal searches: another
        # objective's values differ wholesale, another step's follow from it
        # (its named activations: `proposals`), and would hide what changed.
        if (against is not None and None not in (self.values, against.values) and not extra
                and self.subject() == against.subject()):
            theirs = dict(against.values or ())
            extra += [f"{k} {_shown(v)}" for k, v in self.values or ()
                      if theirs.get(k, _MISSING) != v]
            extra += [f"no {k}" for k in theirs if k not in dict(self.values or ())]
        return text + (" with " + ", ".join(extra) if extra else "")

    def differs_from(self, recorded: StudyIdentity) -> bool:
        """Whether a run with this identity may not resume `recorded`'s study.

        The arguments' fingerprint is compared only when both sides have one.
        """
        if (self.workload, self.mesh, self.objective, self.space, self.space_version) != (
                recorded.workload, recorded.mesh, recorded.objective, recorded.space,
                recorded.space_version):
            return True
        if None not in (self.values, recorded.values) and \
                dict(self.values or ()) != dict(recorded.values or ()):
            return True
        return None not in (self.arguments, recorded.arguments) and \
            self.arguments != recorded.arguments

    def values_hash(self) -> str:
        """8 hex digits naming `values`: what tells the default study names of
        two runs that differ only there apart."""
        text = json.dumps(dict(self.values or ()), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def to_json(self) -> dict[str, Any]:
        out = {"workload": self.workload, "arguments": self.arguments,
               "mesh": {name: size for name, size in self.mesh},
               "objective": self.objective, "space": self.space,
               "space_version": self.space_version}
        if self.values is not None:
            out["values"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.values}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StudyIdentity:
        values = data.get("values")
        return cls(data.get("workload"), data.get("arguments"),
                   tuple(dict(data["mesh"]).items()), data["objective"],
                   data.get("space", DEFAULT_SPACE), str(data.get("space_version",
                                                                  SPACE_VERSION)),
                   None if values is None else tuple(dict(values).items()))


_MISSING = object()


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(map(str, value)) + ")"
    return "none" if value is None else str(value)


def trial_values(ctx: Context) -> tuple[tuple[str, Any], ...]:
    """What, besides the step, mesh, objective and space, changes the value of
    a trial searched with `ctx`: its `StudyIdentity.values`.

    - `budget`: per-device bytes (None: no limit); it decides what is cut.
    - For an objective that estimates (`uses_hardware`): `hardware` (the
      model's name), `hardware_hash` (12 hex digits of its JSON: a
      recalibrated model of the same name differs) and `dcn_axes`.
    - For a mesh of a chip's compile-only devices (`ctx.target`): `target`
      (chip, topology, slices), `compiler` (libtpu's or the CUDA plugin's
      version) and, for GPUs, `target_config` (a hash of its text).
    - For an objective that runs the step (`needs_host_args`): `warmup` and
      `repeats`, and `host` (the machine's name): step times from two
      machines are not comparable.
    - When the search chooses the step's knobs (`ctx.knobs`): `knobs`, each
      knob with its values, default first ("microbatches=1|2;remat=full|none"),
      a held one (`Knobs.held`) left out: a trial's setting means another
      step under other defaults.
    - When it does not choose `act_batch` and the step names a batch
      activation: `proposals`, "act_batch=batch split": each proposal runs
      with its activations' batch on its batch split
      (`space.baselines.pinned`), so its parameters mean another program
      than in a study searched before proposals were pinned (2026-12-06; in
      a search of other knobs, later that day).
    """
    out: list[tuple[str, Any]] = [("budget", ctx.budget)]
    if ctx.objective.uses_hardware:
        model = ctx.hardware_model()
        text = json.dumps(model.to_json(), sort_keys=True, default=str)
        out += [("hardware", model.name),
                ("hardware_hash", hashlib.sha256(text.encode()).hexdigest()[:12]),
                ("dcn_axes", tuple(ctx.dcn_axes))]
    if ctx.target is not None:
        # Compiled by the chip's compiler: which chip, laid out how, by which
        # compiler release (a new libtpu can decide differently).
        target = ctx.target.to_json()
        out += [("target", f"{target['chip']} {target['topology']} x{target['slices']}"),
                ("compiler", " ".join(f"{k}={v}" for k, v in target["versions"].items()))]
        if "config_sha256" in target:
            out.append(("target_config", target["config_sha256"]))
    if ctx.objective.needs_host_args:
        out += [("warmup", ctx.warmup), ("repeats", ctx.repeats),
                ("host", socket.gethostname())]
    if ctx.knobs is not None:
        out.append(("knobs", ";".join(f"{name}=" + "|".join(map(str, values))
                                      for name, values in ctx.knobs.choices.items()
                                      if name not in ctx.knobs.held)))
    if ctx.pins_proposals:
        out.append(("proposals", f"{BATCH_KNOB}=batch split"))
    return tuple(out)


def arguments_fingerprint(args: Sequence[Any]) -> str:
    """A stable hash of `(state, *batch)`'s leaves: their paths, shapes and dtypes.

    Arrays and ShapeDtypeStructs of the same shapes give the same string, in
    any process; the values do not matter.

    Example:
      >>> arguments_fingerprint(({"w": jnp.zeros((4, 8))}, jnp.zeros(4))) == \\
      ...     arguments_fingerprint(({"w": jax.ShapeDtypeStruct((4, 8), "float32")},
      ...                            jax.ShapeDtypeStruct((4,), "float32")))
      True
    """
    digest = hashlib.sha256()
    for i, tree in enumerate(args):
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            digest.update(f"{i}:{_tree.path_str(path)}:{_tree.leaf_shape(leaf)}:"
                          f"{_tree.leaf_dtype(leaf)};".encode())
    return digest.hexdigest()[:16]


def identity_of(workload: Workload | None, args: Sequence[Any], mesh: Any, objective: str,
                space: str = DEFAULT_SPACE,
                values: Sequence[tuple[str, Any]] | None = None) -> StudyIdentity:
    """The identity of a search of `workload` (or, when None, a raw step on
    `args`) on `mesh` with `objective` over `space`, its trials valued under
    `values` (`trial_values`)."""
    return StudyIdentity(
        workload.name if workload is not None else None,
        None if workload is not None else arguments_fingerprint(args),
        tuple(_mesh.axis_sizes(mesh).items()), objective, space, space_version(space),
        None if values is None else tuple(values))


def recorded_identity(attrs: Mapping[str, Any]) -> StudyIdentity | None:
    """The identity a study's user attributes record, or None for a study no
    run of `optimize` has written to.

    A study from before identities were has the attributes `optimize` always
    wrote ("workload", "mesh", "objective"): the identity they give has no
    arguments' fingerprint, and the space every study then searched.
    """
    if isinstance(attrs.get(IDENTITY_ATTR), Mapping):
        try:
            return StudyIdentity.from_json(attrs[IDENTITY_ATTR])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"the study's {IDENTITY_ATTR!r} attribute is malformed ({type(err).__name__}: "
                f"{err}): {attrs[IDENTITY_ATTR]!r}; it was written by hand or by another "
                "program: use another study") from None
    if not isinstance(attrs.get(_attrs.MESH), Mapping):
        return None
    # Studies from before objectives were recorded were measured.
    return StudyIdentity(attrs.get(_attrs.WORKLOAD), None, tuple(attrs[_attrs.MESH].items()),
                         attrs.get(_attrs.OBJECTIVE) or "measured")


class IdentityMismatch(ValueError):
    """A run that would resume a study that searched something else."""


def bind_study(study: optuna.Study, identity: StudyIdentity) -> None:
    """Checks that `study` searched what this run searches, then records `identity`.

    Call it before anything else writes to the study: a refused run must
    leave it exactly as it was.

    Raises:
      IdentityMismatch: the study searched something else, e.g. "study 'x'
        searched gpt:tiny on dp=2,tp=4; this run is mlp:tiny on dp=2,tp=4;
        ...", or the same with other values ("... with budget 37280").
    """
    recorded = recorded_identity(study.user_attrs)
    if recorded is not None and identity.differs_from(recorded):
        raise IdentityMismatch(
            f"study {study.study_name!r} searched {recorded.describe(against=identity)}; "
            f"this run is {identity.describe(against=recorded)}; a study resumes only the "
            "search that started it: give this run another study name, or drop the name "
            "to use the default one")
    if study.user_attrs.get(IDENTITY_ATTR) != identity.to_json():
        study.set_user_attr(IDENTITY_ATTR, identity.to_json())


def check_workload(study: optuna.Study, workload: Workload | None = None,
                   args: Sequence[Any] | None = None) -> None:
    """Checks that the workload (or arguments) an export resolves specs on is
    the one `study` searched.

    A study of a workload needs that workload (by name); a study of a raw
    step needs arguments (or a workload) with the leaves it searched, when it
    recorded them.

    Raises:
      ValueError: they differ, e.g. "study 'x' searched gpt:tiny; the workload
        given is mlp:tiny; ...".
    """
    recorded = recorded_identity(study.user_attrs)
    if recorded is None or (workload is None and args is None):
        return
    where = f"study {study.study_name!r}"
    if workload is not None and recorded.workload is not None:
        if workload.name != recorded.workload:
            raise ValueError(
                f"{where} searched {recorded.workload}; the workload given is "
                f"{workload.name}: its specs would not be the plan's. Give "
                f"{recorded.workload} (or no workload, for a built-in one)")
        return
    if recorded.arguments is None:
        return  # a workload's study given arrays, or a raw step's leaves not recorded
    given = arguments_fingerprint(workload.abstract() if workload is not None else args)
    if given != recorded.arguments:
        what = f"workload {workload.name}'s" if workload is not None else "the given"
        raise ValueError(
            f"{where} searched {recorded.subject()}; {what} arguments have other leaf paths, "
            f"shapes or dtypes (fingerprint {given}): give the arguments the study searched")
