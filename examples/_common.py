"""What every example shares: 8 simulated CPU devices, a short search, its checks.

Each example is a script (`python examples/nnx_decoder.py`) that searches a
sharding for a model written in its own framework, exports the plan, loads it
back into that framework and runs one step with it. `tests/test_examples.py`
runs them.
"""

from __future__ import annotations

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
SEARCH = dict(n_trials=6, warmup=1, repeats=3, confirm_rounds=3, quiet=True, isolate=False,
              seed=0)


def mesh() -> jax.sharding.Mesh:
    return ss.create_mesh((2, 4), ("dp", "tp"))


def workdir() -> Path:
    """Where the example writes its study and plan: argv[1], or a fresh temp folder."""
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="ssx-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def search(step, args, where: Path, name: str) -> ss.OptimizeResult:
    return ss.optimize(step, args, mesh=mesh(), storage=f"sqlite:///{where / 'studies.db'}",
                       study_name=name, **SEARCH)


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
    # The winner is the best baseline itself, or was not re-timed beside it.
    assert result.best_time <= result.baselines[best] * 1.05 or result.best_label == best, (
        f"winner {result.best_label} {result.best_time:.3g}s, {best} "
        f"{result.baselines[best]:.3g}s")
    return (f"winner {result.best_label}: {result.best_time * 1e3:.2f} ms; {best}: "
            f"{result.baselines[best] * 1e3:.2f} ms")


def export_plans(result: ss.OptimizeResult, args, where: Path) -> tuple:
    """Writes the winner's plan file and, from the best logical trial (the winner
    when it is one), a flax-rules file; reads both back.

    Returns:
      `(specs, rules, logical_specs)`: the winner's spec trees as the plan file
      gives them back for `args`, the Flax rules as `(name, mesh axes)` pairs,
      and the spec trees the logical trial measured.
    """
    from shardsearch.rules.base import argument_specs, rule_from_config

    plan = ss.load_plan(result.export(where / "plan.json"))
    assert plan.rule.to_config() == result.best_rule.to_config()
    specs = argument_specs(plan.rule, plan.batch_rule, args)
    assert specs == result.best_specs, "the plan file gives other specs than measured"
    logical = [t for t in result.trials if t.state_rule.get("kind") == "logical"
               and t.outcome.status == "complete"]
    best = min(logical, key=lambda t: t.outcome.value)
    if result.best_rule.kind == "logical":
        path = result.export(where / "rules.json", format="flax-rules")
        measured = result.best_specs
    else:
        config = ss.export_config(result.study, trial=best.number)
        path = ss.write_config(config, where / "rules.json", format="flax-rules")
        state_rule = rule_from_config(best.state_rule, mesh(), "trial")
        batch_rule = rule_from_config(best.batch_rule, mesh(), "trial")
        measured = argument_specs(state_rule, batch_rule, args)
    import json

    rules = [(n, tuple(e) if isinstance(e, list) else e)
             for n, e in json.loads(path.read_text())["rules"]]
    return specs, rules, measured


def same_specs(ours, theirs) -> int:
    """Asserts two spec trees agree leaf by leaf (canonical forms); returns the count."""
    from shardsearch.base.spec import canonical

    is_spec = lambda s: isinstance(s, jax.sharding.PartitionSpec)  # noqa: E731
    a, b = jax.tree.leaves(ours, is_leaf=is_spec), jax.tree.leaves(theirs, is_leaf=is_spec)
    assert len(a) == len(b), (len(a), len(b))
    differ = [(x, y) for x, y in zip(a, b, strict=True) if canonical(x) != canonical(y)]
    assert not differ, f"{len(differ)} of {len(a)} leaves differ: {differ[:3]}"
    return len(a)
