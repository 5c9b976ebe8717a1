"""What every example shares: 8 simulated CPU devices, a short search, its checks.

Each example is a script (`python examples/nnx_decoder.py`) that searches a
sharding for a model written in its own framework, exports the plan, loads it
back into that framework and runs one step with it. `tests/test_examples.py`
runs them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

# Before JAX starts: 8 CPU devices stand in for accelerators.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import shardsearch as ss  # noqa: E402

# A handful of trials and short timing: each example runs in well under a minute.
SEARCH = dict(n_trials=6, warmup=1, repeats=3, confirm_rounds=6, quiet=True, isolate=False,
              seed=0)


def mesh() -> jax.sharding.Mesh:
    return ss.create_mesh((2, 4), ("dp", "tp"))


def workdir() -> Path:
    """Where the example writes its study and plan: argv[1], or a fresh temp folder."""
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="ssx-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def search(step, args, where: Path, name: str, **options) -> ss.OptimizeResult:
    return ss.optimize(step, args, mesh=mesh(), storage=f"sqlite:///{where / 'studies.db'}",
                       study_name=name, **{**SEARCH, **options})


def trial_plan(result: ss.OptimizeResult, trial: int, where: Path) -> Path:
    """The plan file of one trial of the search (its rules and knobs)."""
    return ss.write_config(ss.export_config(result, trial=trial), where / f"trial-{trial}.json")


def constraint_specs(step, *args) -> list:
    """The sharding constraints `step` traces, in order, as canonical specs;
    one that leaves every dim to XLA constrains nothing and is left out."""
    from shardsearch.base.spec import canonical

    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "sharding_constraint":
                spec = eqn.params["sharding"].spec
                if any(e is not jax.sharding.PartitionSpec.UNCONSTRAINED for e in spec):
                    found.append(canonical(spec))
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple | list) else (value,):
                    inner = getattr(item, "jaxpr", item)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(lambda *a: step(*a))(*args).jaxpr)
    return found


def check_against_baselines(result: ss.OptimizeResult) -> str:
    """The dp and fsdp baselines ran, and the winner is not slower than the
    better of them beyond the confirmation's 95% interval. Returns a line."""
    missing = [b for b in ("dp", "fsdp") if b not in result.baselines]
    assert not missing, f"baselines {missing} did not run: {sorted(result.baselines)}"
    best = min(("dp", "fsdp"), key=lambda b: result.baselines[b])
    win, base = result.confirmation.get(result.best_label), result.confirmation.get(best)
    if win is not None and base is not None:
        assert win.ci[0] <= base.ci[1], (
            f"winner {result.best_label} ({win.median:.3g}s, CI {win.ci}) is slower than "
            f"{best} ({base.median:.3g}s, CI {base.ci})")
        return (f"winner {result.best_label}: {win.median * 1e3:.2f} ms "
                f"(CI {win.ci[0] * 1e3:.2f}-{win.ci[1] * 1e3:.2f}); best of dp/fsdp: {best} "
                f"{base.median * 1e3:.2f} ms (CI {base.ci[0] * 1e3:.2f}-{base.ci[1] * 1e3:.2f})")
    # The winner is the best baseline itself, or was not re-timed beside it:
    # compare the study's medians, like with like (a re-timed median against
    # a study median would compare two runs).
    mine = result.baselines.get(result.best_label, result.best_time)
    assert mine <= result.baselines[best] * 1.05 or result.best_label == best, (
        f"winner {result.best_label} {mine:.3g}s in the study, {best} "
        f"{result.baselines[best]:.3g}s")
    return (f"winner {result.best_label}: {mine * 1e3:.2f} ms; {best}: "
            f"{result.baselines[best] * 1e3:.2f} ms")


def baseline_times(result: ss.OptimizeResult) -> dict[str, float]:
    """The dp and fsdp baselines' step times (s), for the example's summary."""
    return {b: result.baselines[b] for b in ("dp", "fsdp")}


def export_plans(result: ss.OptimizeResult, args, where: Path, prefer=None) -> tuple:
    """Writes the winner's plan file and a flax-rules file; reads both back.

    The flax-rules file comes from the best logical trial whose specs Flax's
    rules can give (the winner when it is one; with `prefer`, the best of the
    trials `prefer(trial)` holds for, if any): an assignment where two names
    on one mesh axis meet in leaves of opposite dim order at equal sizes (wq
    `(embed, heads)`, wo `(heads, embed)`) has no one order of pairs, and the
    export refuses it (`FlaxRulesMismatch`), naming the leaves.

    Returns:
      `(specs, data, logical_specs, source)`: the winner's spec trees as the
      plan file gives them back for `args`, the flax-rules file as read
      (`rules(data)` gives its `(name, mesh axes)` pairs), the spec trees that
      logical trial measured, and `{"trial", "label", "refused"}`: which trial
      the rules are from, and the better logical trials Flax could not express.
    """
    from shardsearch.rules.base import argument_specs, rule_from_config
    from shardsearch.rules.logical import FlaxRulesMismatch

    plan = ss.load_plan(result.export(where / "plan.json"))
    assert plan.rule.to_config() == result.best_rule.to_config()
    specs = argument_specs(plan.rule, plan.batch_rule, args)
    assert specs == result.best_specs, "the plan file gives other specs than measured"
    winner = result.best_rule.to_config()
    logical = sorted((t for t in result.trials if t.state_rule.get("kind") == "logical"
                      and t.outcome.status == "complete"),
                     key=lambda t: (prefer is not None and not prefer(t),
                                    t.state_rule != winner, t.outcome.value))
    assert logical, "no logical trial completed"
    refused = []
    for trial in logical:
        config = ss.export_config(result.study, trial=trial.number)
        try:
            path = ss.write_config(config, where / "rules.json", format="flax-rules")
        except FlaxRulesMismatch:
            refused.append(f"{trial.label} #{trial.number}")
            continue
        state_rule = rule_from_config(trial.state_rule, mesh(), "trial")
        batch_rule = rule_from_config(trial.batch_rule, mesh(), "trial")
        measured = argument_specs(state_rule, batch_rule, args)
        source = {"trial": trial.number, "label": trial.label, "refused": refused}
        return specs, json.loads(path.read_text()), measured, source
    raise AssertionError(f"Flax's rules express none of the logical trials: {refused}")


def rules(data: dict) -> list[tuple]:
    """A flax-rules file's `rules` as the pairs Flax takes (tuples for several axes)."""
    return [(n, tuple(e) if isinstance(e, list) else e) for n, e in data["rules"]]


def flax_specs(logical_state, data: dict) -> tuple:
    """The spec trees Flax's own `nn.logical_to_mesh` gives `(state, *batch)` with
    a flax-rules file's `rules`: the state from its logical names (what
    `nn.get_partition_spec` / `nnx.get_partition_spec` read off its boxes), each
    batch argument from the names the file records for it."""
    import flax.linen as nn

    pairs = rules(data)
    batch = [nn.logical_to_mesh_axes(argument[0][2], pairs) for argument in data["batch"]]
    return (nn.logical_to_mesh(logical_state, pairs), *batch)


def is_box(x) -> bool:
    """A Flax Linen box (`nn.LogicallyPartitioned`, `nn.Partitioned`)."""
    import flax.linen as nn

    return isinstance(x, nn.Partitioned)


def is_spec(s) -> bool:
    return isinstance(s, jax.sharding.PartitionSpec)


def same_specs(ours, theirs) -> int:
    """Asserts two spec trees agree leaf by leaf (canonical forms); returns the count."""
    from shardsearch.base.spec import canonical

    a, b = jax.tree.leaves(ours, is_leaf=is_spec), jax.tree.leaves(theirs, is_leaf=is_spec)
    assert len(a) == len(b), (len(a), len(b))
    differ = [(x, y) for x, y in zip(a, b, strict=True) if canonical(x) != canonical(y)]
    assert not differ, f"{len(differ)} of {len(a)} leaves differ: {differ[:3]}"
    return len(a)
