"""`Knobs`: a step built by a factory from a few named settings (remat, microbatches).

A plain step is one program. Some of what makes a plan fast is not where
the arguments live but how the step is written: how much of the forward pass
the backward pass recomputes, or over how many microbatches the gradient is
accumulated. A step that offers such choices is given as a factory and the
choices it takes:

    >>> knobs = Knobs(make_step, {"remat": ("none", "full"), "microbatches": (1, 2, 4)})
    >>> knobs.step(knobs.setting({"microbatches": 2}))   # make_step(remat="none", microbatches=2)

The first choice of each knob is its default: `knobs.step(())` is the step as
its author wrote it, what the baselines are timed with. A **setting** is the
knobs that differ from their defaults, as `(name, value)` pairs in declaration
order, so the default setting is `()` whatever the knobs are, and a study with
no knobs fingerprints its candidates exactly as before.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Setting = tuple[tuple[str, Any], ...]

# The knob over how many slices of the batch the gradient is accumulated
# (`workloads._train.accumulate_gradients`); a search tunes it by hand only at
# the counts that divide each device's rows (`search.space.candidate`).
MICROBATCHES = "microbatches"

# The knob over how many groups of each microbatch the gradient is kept apart
# until the last one (`workloads._train.accumulate_gradients`): a search
# offers it only at the device counts of its mesh's axis groups, where the
# groups can be the devices' shares of the batch (`search.setup`).
GRAD_GROUPS = "grad_groups"

# What a knob's value may be: it is an Optuna categorical choice and goes into
# plan files as JSON.
_VALUE_TYPES = (type(None), bool, int, float, str)


@dataclasses.dataclass(frozen=True, eq=False)
class Knobs:
    """A step factory and the values each of its keyword arguments may take.

    Args:
      make_step: `make_step(**values) -> step`, called with every knob by name;
        `step(state, *batch) -> (state, metrics)` as `optimize` takes it.
      choices: knob name -> its values, the default first. Names are Python
        identifiers (they become the factory's keywords and, prefixed
        `knob_`, the search's parameters); values are None, bool, int, float
        or str.
      held: knobs a setting may set to any of their values but a search
        never varies (`searched` leaves them out): a pinned plan's
        `act_batch` where the search chooses other knobs (`holding`).

    Raises:
      TypeError: `make_step` is not callable.
      ValueError: a knob with no values, a repeated value, a name that is not
        an identifier, or a value of another type; a held name not declared.
    """

    make_step: Callable[..., Callable[..., Any]]
    choices: Mapping[str, tuple[Any, ...]]
    held: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not callable(self.make_step):
            raise TypeError(f"Knobs: make_step must be callable, got "
                            f"{type(self.make_step).__name__}")
        if not isinstance(self.choices, Mapping) or not self.choices:
            raise ValueError(f"Knobs: choices must map each knob's name to its values, got "
                             f"{self.choices!r}")
        checked = {}
        for name, values in self.choices.items():
            where = f"Knobs: knob {name!r}"
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"{where}: the name must be a Python identifier (it is "
                                 "make_step's keyword); rename it")
            if isinstance(values, str) or not isinstance(values, Iterable):
                raise ValueError(f"{where}: give its values as a sequence, default first, "
                                 f"e.g. {name}=({values!r},), got {values!r}")
            values = tuple(values)
            bad = [v for v in values if not isinstance(v, _VALUE_TYPES)]
            if not values or bad:
                raise ValueError(f"{where}: values must be a non-empty sequence of None, "
                                 f"bool, int, float or str; got {values!r}")
            if len(set(map(repr, values))) != len(values):
                raise ValueError(f"{where}: a value is listed twice in {values!r}")
            checked[name] = values
        object.__setattr__(self, "choices", types.MappingProxyType(checked))
        object.__setattr__(self, "held", tuple(self.held))
        self._check_declared(self.held)
        object.__setattr__(self, "_steps", {})

    @property
    def defaults(self) -> dict[str, Any]:
        """Each knob's default (its first value)."""
        return {name: values[0] for name, values in self.choices.items()}

    def searched(self) -> dict[str, tuple[Any, ...]]:
        """The knobs with more than one value and not held: those a search chooses."""
        return {name: values for name, values in self.choices.items()
                if len(values) > 1 and name not in self.held}

    def holding(self, name: str, values: Iterable[Any]) -> Knobs:
        """These knobs with `name` taking `values` (its default first), held:
        a setting may carry any of them, the search varies none (`held`).

        Example:
          `Knobs(f, {"remat": ("none", "full"), "act_batch": ("auto",)})
          .holding("act_batch", ("auto", "dp"))` accepts the setting
          `(("act_batch", "dp"),)`, and `searched()` is `{"remat": ...}`.

        Raises:
          ValueError: `name` is not a knob of these.
        """
        self._check_declared([name])
        return Knobs(self.make_step, {**self.choices, name: tuple(values)},
                     (*(n for n in self.held if n != name), name))

    def only(self, names: Iterable[str]) -> Knobs:
        """These knobs as declared, every other one fixed at its default.

        Raises:
          ValueError: a name that is not a knob (the message names the knobs).
        """
        names = tuple(names)
        self._check_declared(names)
        return Knobs(self.make_step, {n: (v if n in names else v[:1])
                                      for n, v in self.choices.items()})

    def setting(self, values: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Setting:
        """The setting of chosen `values`: the knobs that differ from their
        defaults, in declaration order.

        Raises:
          ValueError: an unknown knob or a value it does not take.
        """
        values = dict(values)
        self._check_declared(values)
        for name, value in values.items():
            if not any(_same(value, v) for v in self.choices[name]):
                raise ValueError(f"knob {name}={value!r} is not one of its values "
                                 f"{self.choices[name]!r}")
        return tuple((n, values[n]) for n, default in self.defaults.items()
                     if n in values and not _same(values[n], default))

    def _check_declared(self, names: Iterable[str]) -> None:
        unknown = [n for n in names if n not in self.choices]
        if unknown:
            raise ValueError(f"knobs {unknown} are not declared; the step's knobs are "
                             f"{list(self.choices)}")

    def narrowed(self, name: str, keep: Callable[[Any], bool]) -> Knobs:
        """These knobs with `name`'s values cut to its default and those `keep`
        accepts (itself when `name` is not a knob)."""
        if name not in self.choices:
            return self
        first, *rest = self.choices[name]
        return Knobs(self.make_step, {**self.choices,
                                      name: (first, *(v for v in rest if keep(v)))},
                     self.held)

    def values(self, setting: Setting) -> dict[str, Any]:
        """Every knob's value under `setting` (its defaults filled in)."""
        return self.defaults | dict(setting)

    def step(self, setting: Setting = ()) -> Callable[..., Any]:
        """The step under `setting`, built once per setting."""
        setting = self.setting(setting)
        steps = self._steps  # type: ignore[attr-defined]
        if setting not in steps:
            steps[setting] = self.make_step(**self.values(setting))
        return steps[setting]

    def describe(self) -> dict[str, list[Any]]:
        """The declaration as JSON data: knob name -> its values, default first."""
        return {name: list(values) for name, values in self.choices.items()}


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same type (True is not 1 here)."""
    return type(a) is type(b) and a == b


def setting_text(setting: Setting) -> str:
    """A setting as a person reads it: `"remat=full,microbatches=2"`, or `"-"`."""
    return ",".join(f"{n}={v}" for n, v in setting) or "-"
