"""Warnings, not silence (issue 25, item 4): what an analysis could not read
is a `ShardsearchWarning`, shown once per study, stored, and printed.

The defects: an unknown primitive whose operands share a shape was taken as
elementwise and not listed in `unhandled`; `unhandled`, merges, unknown trip
counts, unreadable ops and permutes without pairs were read nowhere outside
their modules; `LogicalAxisRule` replicated unknown leaves silently.
"""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optuna
import pytest
from jax.extend.core import Primitive
from jax.interpreters import mlir

import shardsearch as ss
from shardsearch.base.warnings import (
    KINDS,
    ShardsearchWarning,
    UncountedCostWarning,
    UngroupedCollectiveWarning,
    UnhandledPrimitiveWarning,
    UnnamedLeafWarning,
    note,
    warn_notes,
)
from shardsearch.cli import main as _cli
from shardsearch.cost.hlo import Collective, CollectiveSummary, HloCost
from shardsearch.cost.program import ProgramCost
from shardsearch.search.space.logical import split_rules
from shardsearch.search.study import attrs

# A primitive the logical-axes analysis has no rule for, that XLA can run.
_double = Primitive("test_double")
_double.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(_double, mlir.lower_fun(lambda x: x * 2, multiple_results=False))


def _step(state, x):
    y = _double.bind(x)  # the batch, not differentiated: no JVP needed

    def loss(w):
        return jnp.mean(jnp.tanh(y @ w))

    grads = jax.grad(loss)(state)
    return state - 0.01 * grads, {"loss": loss(state)}


ARGS = (np.ones((32, 64), np.float32), np.ones((16, 32), np.float32))


def test_every_warning_is_one_family_and_every_note_kind_has_a_class():
    for name in ("ShardingWarning", "PlanMismatchWarning"):
        assert issubclass(getattr(ss, name), ShardsearchWarning)
    from shardsearch.search.execution.isolate import IsolationWarning
    from shardsearch.search.finish import FinalistWarning
    from shardsearch.search.loop import TrialTakenWarning
    from shardsearch.search.space.baselines import LogicalAxesWarning

    for cls in (IsolationWarning, FinalistWarning, TrialTakenWarning, LogicalAxesWarning,
                *KINDS.values()):
        assert issubclass(cls, ShardsearchWarning)
    with pytest.raises(ValueError, match="note kind 'odd'; the kinds are"):
        note("odd", "x")


def test_notes_are_warned_once_each_as_their_kind():
    shown: set[str] = set()
    with pytest.warns(UncountedCostWarning) as caught:
        warn_notes([note("uncounted", "a"), note("uncounted", "a")], shown)
        warn_notes([note("uncounted", "a")], shown)
    assert len(caught) == 1 and str(caught[0].message) == "shardsearch: uncounted: a"


def test_the_cost_model_names_what_it_could_not_count():
    read = ProgramCost(1.0, 1.0, CollectiveSummary(), HloCost())
    assert read.notes() == ()
    permute = Collective("collective-permute", 64, 1, 1, "main", "cp.1")
    program = ProgramCost(
        1.0, 1.0, CollectiveSummary((permute,), ("%body.7",), ("all-gather.3",)),
        HloCost(unknown_ops=("custom-call.2",)))
    notes = program.notes()
    assert notes == (
        "uncounted: loop bodies with an unknown trip count, counted once: %body.7",
        "uncounted: instructions whose flops or bytes are unknown, counted as none: "
        "custom-call.2",
        "ungrouped: collectives whose group size is unknown, costed as within one device: "
        "all-gather.3",
        "ungrouped: collective-permutes without source-target pairs, costed as moving "
        "nothing: cp.1")
    unreadable = ProgramCost(1.0, 1.0, None, None, hlo_error="line 3: no ENTRY")
    assert unreadable.notes()[0].startswith("uncounted: the HLO text could not be read "
                                            "(line 3: no ENTRY)")
    with pytest.warns(ShardsearchWarning) as caught:
        warn_notes(notes)
    assert [w.category for w in caught] == [UncountedCostWarning, UncountedCostWarning,
                                            UngroupedCollectiveWarning,
                                            UngroupedCollectiveWarning]


def test_a_logical_rule_names_the_leaves_it_left_replicated(mesh24):
    axes = ss.discover_logical_axes(_step, ARGS)
    state_rule, _batch = split_rules(mesh24, axes, {})
    assert state_rule.notes(np.ones((32, 64), np.float32), 0) == ()
    bigger = {"w": np.ones((32, 64), np.float32), "extra": np.ones((8, 8), np.float32)}
    [text] = state_rule.notes(bigger, 0)
    assert text.startswith("unnamed: leaves with no logical names in the rule's table, left "
                           "replicated: ")
    assert "extra" in text
    with pytest.warns(UnnamedLeafWarning):
        warn_notes([text])


def test_an_unhandled_primitive_is_listed_warned_once_stored_and_printed(
        tmp_path, mesh24, monkeypatch, capsys):
    axes = ss.discover_logical_axes(_step, ARGS)
    assert axes.unhandled == ("test_double",)  # same shape: before, not listed at all
    storage = f"sqlite:///{tmp_path / 's.db'}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ss.optimize(_step, ARGS, mesh=mesh24, n_trials=6, objective="static",
                             confirm_rounds=0, quiet=True, isolate=False, storage=storage,
                             study_name="s")
    ours = [w for w in caught if issubclass(w.category, UnhandledPrimitiveWarning)]
    assert len(ours) == 1 and "test_double" in str(ours[0].message)
    study = optuna.load_study(study_name="s", storage=storage)
    assert study.user_attrs[attrs.NOTES] == list(axes.notes())
    plan = tmp_path / "plan.json"
    result.export(plan)
    assert json.loads(plan.read_text())["search"]["notes"] == list(axes.notes())
    monkeypatch.chdir(tmp_path)
    assert _cli.main(["show", str(plan)]) == 0
    assert "warning: unhandled: primitives with no coupling rule: test_double" in (
        capsys.readouterr().out)
    # The result's plan records the raw step's leaves: explain prints the note too.
    assert _cli.main(["explain", str(plan)]) == 0
    assert "warning: unhandled: primitives with no coupling rule: test_double" in (
        capsys.readouterr().out)
    # A plan from the stored study has no leaves: explain needs a workload.
    stored = ss.write_config(ss.export_config(study), tmp_path / "stored.json")
    assert _cli.main(["explain", str(stored)]) == 2
    assert "records no leaves" in capsys.readouterr().err


def test_the_memory_prediction_says_once_which_primitives_it_could_not_follow(tmp_path, mesh24):
    # The rules space discovers no logical axes: the prediction's walk is the
    # one that meets the primitive, and its note is warned once per search.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ss.optimize(_step, ARGS, mesh=mesh24, n_trials=6, objective="static",
                             confirm_rounds=0, quiet=True, isolate=False, space="rules",
                             storage=f"sqlite:///{tmp_path / 's.db'}")
    ours = [w for w in caught if issubclass(w.category, UnhandledPrimitiveWarning)]
    assert len(ours) == 1 and "no coupling rule: test_double" in str(ours[0].message)
    assert all(any("test_double" in n for n in t.outcome.notes)
               for t in result.trials if "predicted" in t.outcome.memory)


def _gspmd_step(state, x):
    # A constraint built from an HLO sharding (a GSPMDSharding, as code that
    # converts shardings from XLA's form makes): it names no PartitionSpec.
    from jax._src.sharding_impls import GSPMDSharding

    devices = tuple(jax.devices()[:8])
    rows = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices).reshape(2, 4),
                                                        ("dp", "tp")),
                                      jax.sharding.PartitionSpec("dp"))
    h = jax.lax.with_sharding_constraint(
        x @ state["w"], GSPMDSharding(devices, rows._to_xla_hlo_sharding(2)))
    loss = jnp.mean(h ** 2)
    return {"w": state["w"] - 0.1 * loss}, {"loss": loss}


def test_the_memory_prediction_says_which_constraints_it_cannot_read(tmp_path, mesh24):
    args = ({"w": jnp.ones((16, 32), jnp.float32)}, jnp.ones((8, 16), jnp.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ss.optimize(_gspmd_step, args, mesh=mesh24, n_trials=4, objective="static",
                             confirm_rounds=0, quiet=True, isolate=False,
                             storage=f"sqlite:///{tmp_path / 's.db'}")
    ours = [w for w in caught if issubclass(w.category, KINDS["unread"])]
    assert len(ours) == 1 and "(GSPMDSharding) are not followed" in str(ours[0].message)
    predicted = [t for t in result.trials if "predicted" in t.outcome.memory]
    assert predicted and all(any(n.startswith("unread: ") for n in t.outcome.notes)
                             for t in predicted)
