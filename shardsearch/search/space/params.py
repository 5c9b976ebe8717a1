"""The space's parameter model: a `Param`, a `ParamBlock` that declares some, a `Draft`.

A block declares its parameters once; `SearchSpace.suggest` asks a trial for
them and `SearchSpace.enumerate` lists their product, both from that one
declaration, and the block turns the chosen values into its piece of the
candidate (a `Draft` passed from block to block).

Example: `Param.integer("priority_0", 0, 2)` is asked as
`trial.suggest_int("priority_0", 0, 2)` and enumerated as 0, 1, 2.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import optuna

from ...rules.base import ShardingRule
from .candidate import Candidate

if TYPE_CHECKING:
    from .searchspace import SearchSpace

# What Optuna stores for a categorical choice (its distributions' JSON form).
_CHOICE_TYPES = (type(None), bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of the space: an int range or a list of choices.

    Build one with `Param.integer` or `Param.categorical`. Optuna asks for an
    int range with `suggest_int(name, low, high)` and for choices with
    `suggest_categorical(name, choices)`, so the name, the kind and the range
    or choices are what a stored study records; changing any of them changes
    the study's space.

    Attributes:
      name: the Optuna parameter name (an identifier, unique in the space).
      low, high: the inclusive int range, or None for choices.
      choices: the categorical choices, or None for an int range.
      when: `(name, value)` pairs (or a dict) that must all hold among the
        values already chosen for the parameter to be asked; empty = always.

    Example:
      `Param.categorical("memory_fraction", (0.1, 0.5), when={"memory_rule": True})`
      is asked only of trials that chose `memory_rule=True`.
    """

    name: str
    low: int | None = None
    high: int | None = None
    choices: tuple[Any, ...] | None = None
    when: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def integer(cls, name: str, low: int, high: int,
                when: Mapping[str, Any] | None = None) -> Param:
        """An int parameter in `low..high` (both included)."""
        return cls(name, low=low, high=high, when=tuple((when or {}).items()))

    @classmethod
    def categorical(cls, name: str, choices: Sequence[Any],
                    when: Mapping[str, Any] | None = None) -> Param:
        """A parameter taking one of `choices`, in that order."""
        return cls(name, choices=tuple(choices), when=tuple((when or {}).items()))

    def __post_init__(self) -> None:
        if isinstance(self.when, Mapping):
            object.__setattr__(self, "when", tuple(self.when.items()))
        where = f"Param {self.name!r}"
        if not self.name.isidentifier():
            raise ValueError(f"{where}: the name must be an identifier (it names an "
                             "Optuna parameter); rename it")
        is_int = self.low is not None or self.high is not None
        if is_int == (self.choices is not None):
            raise ValueError(f"{where}: give either low and high or choices, not "
                             f"{self.low=}, {self.high=}, {self.choices=}")
        if is_int and not (isinstance(self.low, int) and isinstance(self.high, int)
                           and self.low <= self.high):
            raise ValueError(f"{where}: needs int low <= high, got {self.low=}, {self.high=}")
        if self.choices is not None:
            bad = [c for c in self.choices if not isinstance(c, _CHOICE_TYPES)]
            if not self.choices or bad:
                raise ValueError(f"{where}: choices must be a non-empty sequence of None, "
                                 f"bool, int, float or str; got {self.choices!r}")

    def values(self) -> tuple[Any, ...]:
        """Every value the parameter may take, in the order Optuna lists them."""
        if self.choices is not None:
            return self.choices
        return tuple(range(self.low, self.high + 1))

    def applies(self, chosen: Mapping[str, Any]) -> bool:
        """Whether the parameter is asked, given the values chosen before it."""
        return all(name in chosen and chosen[name] == value for name, value in self.when)

    def suggest(self, trial: optuna.trial.BaseTrial) -> Any:
        """Asks `trial` for this parameter's value."""
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        return trial.suggest_int(self.name, self.low, self.high)


@dataclasses.dataclass(frozen=True)
class Draft:
    """A candidate while the blocks build it, one block after another.

    Attributes:
      rules: the state rules switched on so far, by name (a name of
        `SearchSpace.rule_names()`); the composition block orders them.
      state_rule, batch_rule: the candidate's rules, once a block has built them.
      readable: the decoded values of coded parameters so far, as `(name,
        text)` pairs (`with_readable`); they become `Candidate.readable`.
      knobs: the step's knob setting (`Candidate.knobs`), once a block chose it.
    """

    rules: tuple[tuple[str, ShardingRule], ...] = ()
    state_rule: ShardingRule | None = None
    batch_rule: ShardingRule | None = None
    readable: tuple[tuple[str, str], ...] = ()
    knobs: tuple[tuple[str, Any], ...] = ()

    def with_rule(self, name: str, rule: ShardingRule) -> Draft:
        """This draft with state rule `name` switched on."""
        if any(n == name for n, _ in self.rules):
            raise ValueError(f"Draft: two blocks switched on a state rule named {name!r}; "
                             "give each block's rules their own names")
        return dataclasses.replace(self, rules=(*self.rules, (name, rule)))

    def with_readable(self, name: str, text: str) -> Draft:
        """This draft with the decoded value of coded parameters `name` noted.

        Example: `draft.with_readable("auto_order", "tp,dp")` for the Lehmer
        code `auto_order_0 = 1` over `("dp", "tp")`.
        """
        if any(n == name for n, _ in self.readable):
            raise ValueError(f"Draft: two blocks noted a readable value named {name!r}; "
                             "give each block's values their own names")
        return dataclasses.replace(self, readable=(*self.readable, (name, text)))

    def candidate(self) -> Candidate:
        """The finished candidate."""
        missing = [n for n in ("state_rule", "batch_rule") if getattr(self, n) is None]
        if missing:
            raise ValueError(f"Draft: no block built {missing}; SearchSpace.blocks() needs "
                             "a CompositionBlock (state rule) and a BatchBlock (batch rule)")
        return Candidate(self.state_rule, self.batch_rule, readable=self.readable,
                         knobs=self.knobs)


class ParamBlock(abc.ABC):
    """A group of parameters declared once, and the candidate piece they build.

    `params` and `build` both receive the space (a `SearchSpace`; typed `Any`
    here because space.py imports this module), so a block holds no copy of
    the mesh; `build` sees every value chosen in the trial, conditional
    parameters that were not asked being absent. `SearchSpace.blocks()` lists
    the blocks; its docstring says where a new one goes.

    Example:
      A block declaring `(Param.categorical("batch_mode", ["split", "replicate"]),)`
      whose `build` returns `dataclasses.replace(draft, batch_rule=...)` for
      "replicate" adds that choice to every trial and to `enumerate()`.
    """

    @abc.abstractmethod
    def params(self, space: SearchSpace) -> tuple[Param, ...]:
        """This block's parameters, in the order a trial is asked for them."""

    @abc.abstractmethod
    def build(self, space: SearchSpace, values: Mapping[str, Any], draft: Draft) -> Draft:
        """`draft` with this block's piece added, from the chosen `values`."""
