"""The examples/ run end to end, each as a user would run it (`python
examples/NAME.py WORKDIR`, 8 simulated CPU devices): a model written in Flax
NNX, Flax Linen with MaxText's logical names, or Equinox is searched, its plan
exported, loaded back into its framework and run for one step.

Each prints one JSON line; the tests read what it found, not only its exit
code. Without the example's extra (`.[flax]`, `.[equinox]`) a test skips, but
under CI=true it fails naming the extra, so a CI run that lost it is seen.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _need(extra: str, *modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    problem = (f"the {extra!r} extra is not installed (no {', '.join(missing)}); "
               f"pip install -e '.[{extra}]'")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{problem}; under CI=true the examples must run")
    pytest.skip(problem)


def _run(name: str, workdir: Path) -> dict:
    env = child_env(PYTHONHASHSEED="0")
    done = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), str(workdir)],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # Warnings the search gives on user code it should read (names, rules) fail it.
    for warning in ("UserNamesConflictWarning", "FlaxRulesWarning", "PlanMismatchWarning"):
        assert warning not in done.stderr, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["example"] == name
    # The dp/fsdp baselines ran and the winner is not slower than the better
    # of them beyond the confirmation's interval (asserted inside the example).
    assert summary["check"].startswith(f"winner {summary['winner']}: ")
    assert set(summary["baselines"]) == {"dp", "fsdp"}
    assert all(t > 0 for t in summary["baselines"].values())
    assert math.isfinite(summary["loss"]) and summary["loss"] > 0
    assert (workdir / "plan.json").is_file() and (workdir / "studies.db").is_file()
    return summary


def _flax_rules(workdir: Path, summary: dict) -> list:
    data = json.loads((workdir / "rules.json").read_text())
    assert data["format"] == "flax-rules"
    # From the winner when it is logical and Flax can express it; the better
    # logical trials Flax could not express are listed, never silently passed.
    source = summary["flax_rules_from"]
    assert source["label"].startswith("logical") or source["label"] == "search"
    assert isinstance(source["trial"], int) and isinstance(source["refused"], list)
    return data["rules"]


@pytest.mark.slow
def test_nnx_decoder(tmp_path):
    _need("flax", "flax", "optax")
    summary = _run("nnx_decoder", tmp_path)
    # The user's nnx.with_partitioning names are the axes' names.
    assert {"embed", "heads", "mlp", "vocab"} <= set(summary["axes"])
    # Flax's nnx.get_partition_spec + nn.logical_to_mesh with the exported
    # rules equal the measured specs on every leaf: 64 of the state (params
    # and both Adam moments, the step count) and the two batch arguments.
    assert summary["leaves_compared"] == 66
    assert summary["rules"] == _flax_rules(tmp_path, summary)


@pytest.mark.slow
def test_linen_maxtext(tmp_path):
    _need("flax", "flax", "optax")
    summary = _run("linen_maxtext", tmp_path)
    assert {"embed", "heads", "kv", "mlp", "vocab"} <= set(summary["axes"])
    # nn.logical_to_mesh_sharding on Linen's boxed state and the batch's
    # names: all 60 leaves as measured (every leaf of the state and batch).
    assert summary["leaves_compared"] == 60
    assert summary["rules"] == _flax_rules(tmp_path, summary)
    # The model's nn.with_logical_constraint calls: under the exported rules Flax
    # placed each as the search traced it for that trial (asserted in the
    # example); a trial that placed activations gives constraints to compare.
    # Which trials complete depends on timing, so the trial may have placed none.
    if any(v != "auto" for v in summary["trial_knobs"].values()):
        assert summary["constraints_compared"] > 0
    assert set(summary["trial_knobs"]) <= {f"act_activation_{n}" for n in (
        "batch", "length", "embed", "heads", "kv", "mlp")}


@pytest.mark.slow
def test_equinox_mlp(tmp_path):
    _need("equinox", "equinox", "optax")
    summary = _run("equinox_mlp", tmp_path)
    # No names given: the axes are the discovered ones.
    assert "batch" in summary["axes"] and "embed" in summary["axes"]
    # The plan file read back and the placed module give the measured specs on
    # every leaf of {params, opt_state}, x and y.
    assert summary["leaves_compared"] == 27


def test_import_shardsearch_loads_neither_framework():
    # The adapters are optional: the package front never imports them.
    code = ("import sys, shardsearch; "
            "print(sorted(m for m in ('flax', 'equinox', 'optax', 'shardsearch.flax', "
            "'shardsearch.equinox') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), timeout=120, check=True)
    assert done.stdout.strip() == "[]"
