"""A study resumes only under the values its trials were scored with: the budget,
the hardware model, the timing settings and (measured) the host.

The defect: mlp:tiny, static objective, 4 trials with no budget, then the same
study resumed with memory_budget=37280 gave the winner `default` at 42,280 B,
over the budget, and the study took the new budget as its own.
"""

from __future__ import annotations

import json
import sqlite3

import optuna
import pytest

import shardsearch as ss
from shardsearch.search.finish import FinalistWarning
from shardsearch.search.study import attrs
from shardsearch.search.study.identity import IdentityMismatch, trial_values
from shardsearch.workloads import get_workload

STATIC = dict(objective="static", confirm_rounds=0, quiet=True, space="rules", isolate=False)
# Between the smallest footprints of mlp:tiny's plans on dp=2,tp=4 (42,280 B for
# `default`) and the others': some completed trials fit it, some do not.
BUDGET = 45_000


def _storage(tmp_path):
    return f"sqlite:///{tmp_path / 'studies.db'}"


def _attrs(storage, name):
    study = optuna.load_study(study_name=name, storage=storage)
    return json.dumps(study.user_attrs, sort_keys=True), len(study.trials)


def test_a_named_study_refuses_a_run_with_another_budget_and_is_left_as_it_was(
        tmp_path, mesh24):
    storage, workload = _storage(tmp_path), get_workload("mlp:tiny")
    ss.optimize(workload, mesh=mesh24, n_trials=4, storage=storage, study_name="s", **STATIC)
    before = _attrs(storage, "s")
    with pytest.raises(IdentityMismatch, match=r"study 's' searched mlp:tiny on dp=2,tp=4 with "
                                               r"budget none.*this run is mlp:tiny on "
                                               rf"dp=2,tp=4 with budget {BUDGET}"):
        ss.optimize(workload, mesh=mesh24, n_trials=4, storage=storage, study_name="s",
                    memory_budget=BUDGET, **STATIC)
    assert _attrs(storage, "s") == before


def test_a_default_named_study_with_another_budget_starts_a_study_of_its_own(tmp_path, mesh24):
    storage, workload = _storage(tmp_path), get_workload("mlp:tiny")
    first = ss.optimize(workload, mesh=mesh24, n_trials=4, storage=storage, **STATIC)
    before = _attrs(storage, first.study.study_name)
    second = ss.optimize(workload, mesh=mesh24, n_trials=4, storage=storage,
                         memory_budget=BUDGET, **STATIC)
    assert second.study.study_name.startswith(first.study.study_name + "~")
    assert _attrs(storage, first.study.study_name) == before
    winner = next(t for t in second.trials if t.label == second.best_label)
    assert winner.outcome.memory["total"] <= BUDGET
    # Every trial of the new study was scored under the budget: none reused.
    assert all(t.outcome.memory.get("total", 0) <= BUDGET or t.outcome.status != "complete"
               for t in second.trials)
    # The same values again resume the new study.
    third = ss.optimize(workload, mesh=mesh24, n_trials=1, storage=storage,
                        memory_budget=BUDGET, **STATIC)
    assert third.study.study_name == second.study.study_name


def test_another_hardware_model_or_a_recalibrated_one_is_another_study(tmp_path, mesh24):
    storage, workload = _storage(tmp_path), get_workload("mlp:tiny")
    ss.optimize(workload, mesh=mesh24, n_trials=2, storage=storage, study_name="s",
                hardware=ss.HARDWARE["tpu-v5e"], memory_budget="1GiB", **STATIC)
    with pytest.raises(IdentityMismatch, match=r"this run is .* with hardware gpu-h100 "
                                               r"\(.*\), hardware_hash [0-9a-f]{12};"):
        ss.optimize(workload, mesh=mesh24, n_trials=2, storage=storage, study_name="s",
                    hardware=ss.HARDWARE["gpu-h100"], memory_budget="1GiB", **STATIC)
    # Same name, other figures (a recalibration): only the hash tells them apart.
    recalibrated = ss.HardwareModel.from_json(
        ss.HARDWARE["tpu-v5e"].to_json() | {"memory_bandwidth": 1e12})
    with pytest.raises(IdentityMismatch, match=r"this run is mlp:tiny on dp=2,tp=4 with "
                                               r"hardware_hash [0-9a-f]{12};"):
        ss.optimize(workload, mesh=mesh24, n_trials=2, storage=storage, study_name="s",
                    hardware=recalibrated, memory_budget="1GiB", **STATIC)


def test_measured_values_name_the_timing_settings_and_the_host(mesh24):
    ctx, _ = ss.search.make_context(get_workload("mlp:tiny"), None, mesh24, warmup=1,
                                    repeats=3)
    values = dict(trial_values(ctx))
    assert set(values) == {"budget", "warmup", "repeats", "host"}
    assert (values["warmup"], values["repeats"]) == (1, 3) and values["host"]
    static, _ = ss.search.make_context(get_workload("mlp:tiny"), None, mesh24,
                                       objective="static")
    assert set(dict(trial_values(static))) == {"budget", "hardware", "hardware_hash",
                                               "dcn_axes"}


def test_pinned_proposals_are_part_of_what_a_trial_means(tmp_path, mesh24):
    """A search that chooses no knob pins its proposals' activations to their
    batch split (step with named activations): a study searched before that,
    its same parameters another program, is not resumed by it."""
    make = ss.search.make_context
    pinned = dict(trial_values(make(get_workload("gpt:tiny"), None, mesh24,
                                    objective="static")[0]))
    assert pinned["proposals"] == "act_batch=batch split"
    # No named activations (mlp:tiny), or the knobs chosen: nothing pinned.
    assert "proposals" not in dict(trial_values(make(get_workload("mlp:tiny"), None, mesh24,
                                                     objective="static")[0]))
    chosen = dict(trial_values(make(get_workload("gpt:tiny"), None, mesh24,
                                    objective="static", knobs=("act_batch",))[0]))
    assert "proposals" not in chosen and "act_batch" in chosen["knobs"]
    # A study stored without it (as one searched before) refuses this run.
    storage, workload = _storage(tmp_path), get_workload("gpt:tiny")
    ss.optimize(workload, mesh=mesh24, n_trials=1, storage=storage, study_name="s", **STATIC)
    with sqlite3.connect(tmp_path / "studies.db") as db:
        (text,) = db.execute("SELECT value_json FROM study_user_attributes WHERE key = ?",
                             (attrs.IDENTITY,)).fetchone()
        identity = json.loads(text)
        assert identity["values"].pop("proposals") == "act_batch=batch split"
        db.execute("UPDATE study_user_attributes SET value_json = ? WHERE key = ?",
                   (json.dumps(identity), attrs.IDENTITY))
    with pytest.raises(IdentityMismatch, match="proposals"):
        ss.optimize(workload, mesh=mesh24, n_trials=1, storage=storage, study_name="s",
                    **STATIC)


def test_an_older_study_resumed_under_a_budget_never_reports_a_finalist_over_it(
        tmp_path, mesh24):
    # A study recorded before identities held values: its trials come back, and
    # the finish leaves out those over this run's budget.
    storage, workload = _storage(tmp_path), get_workload("mlp:tiny")
    ss.optimize(workload, mesh=mesh24, n_trials=6, storage=storage, study_name="old", **STATIC)
    study = optuna.load_study(study_name="old", storage=storage)
    identity = dict(study.user_attrs[attrs.IDENTITY])
    del identity["values"]
    study.set_user_attr(attrs.IDENTITY, identity)
    over = [t for t in study.trials if t.user_attrs["outcome"]["status"] == "complete"
            and t.user_attrs["outcome"]["memory"]["total"] > BUDGET]
    assert over  # the defect's precondition: some completed trials do not fit
    with pytest.warns(FinalistWarning, match=r"left out of the finalists: XLA needs \d+ bytes "
                                             rf"per device, over this run's budget of {BUDGET}"):
        result = ss.optimize(workload, mesh=mesh24, n_trials=0, storage=storage,
                             study_name="old", memory_budget=BUDGET, **STATIC)
    winner = next(t for t in result.trials if t.label == result.best_label
                  and t.outcome.status == "complete")
    assert winner.outcome.memory["total"] <= BUDGET


def test_a_stored_trial_whose_rules_now_give_other_specs_is_not_a_finalist(tmp_path, mesh24):
    storage, workload = _storage(tmp_path), get_workload("mlp:tiny")
    first = ss.optimize(workload, mesh=mesh24, n_trials=6, storage=storage, study_name="s",
                        **STATIC)
    study = optuna.load_study(study_name="s", storage=storage)
    best = next(t for t in study.trials if t.user_attrs.get("label") == first.best_label)
    # As if the rule's code changed since: its stored config now replicates.
    # (Optuna cannot change a finished trial, so the test edits the file.)
    replicate = json.dumps({"kind": "path", "rules": [], "fallback": "replicate"})
    with sqlite3.connect(tmp_path / "studies.db") as db:
        changed = db.execute("UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = ? "
                             "AND key = ?", (replicate, best._trial_id, attrs.STATE_RULE))
        assert changed.rowcount == 1
    with pytest.warns(FinalistWarning, match=rf"trial {best.number} .* stored rules now give "
                                             r"specs with fingerprint"):
        second = ss.optimize(workload, mesh=mesh24, n_trials=0, storage=storage,
                             study_name="s", **STATIC)
    assert ss.export_config(second)["results"]["winner"]["trial"] != best.number
