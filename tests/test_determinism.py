"""Same inputs, same specs, whatever the process's hash seed."""

import subprocess
import sys

import pytest
from child_env import child_env

# Prints every rule kind's specs, configs and the analyzer's findings for one
# tree on a three-axis mesh whose axes all have the same size, where any
# dependence on set or hash order would show.
SCRIPT = r'''
import jax
jax.config.update("jax_num_cpu_devices", 8)
import json
import numpy as np
from jax.sharding import PartitionSpec as P
import shardsearch as ss

mesh = ss.create_mesh((2, 2, 2), ("fsdp", "sp", "tp"))
sds = lambda *s: jax.ShapeDtypeStruct(s, np.float32)
tree = {
    "embed": sds(64, 32), "layers": [
        {"attn": {"wq": sds(32, 32), "wo": sds(32, 32)}, "mlp": {"w1": sds(32, 128)},
         "norm": sds(32), "mask": sds(4, 4, 4, 4)} for _ in range(2)],
    "head": sds(32, 64), "step": 0, "tag": "v1",
}
rules = {
    "auto": ss.AutoShardingRule(mesh),
    "auto-reverse": ss.AutoShardingRule(mesh, reverse=True, min_shard_size=16),
    "auto-groups": ss.AutoShardingRule(mesh, axis_names=(("sp", "tp"), "fsdp")),
    "memory": ss.MemoryConstrainedShardingRule(1024, mesh=mesh),
    "memory-order": ss.MemoryConstrainedShardingRule(1, mesh=mesh, axis_names=("tp", "sp", "fsdp")),
    "shape": ss.ShapeBasedShardingRule({(None, 32): P("tp"), (32, None): P(None, ("fsdp", "sp"))}),
    "path": ss.PathShardingRule(
        [(r"attn/w[qo]$", P("fsdp", "tp")), (r"mlp", P(None, ("sp", "tp")))], mesh=mesh),
    "composite": ss.CompositeShardingRule(
        ss.PathShardingRule([(r"embed", P(("tp", "fsdp")))], mesh=mesh),
        ss.ShapeBasedShardingRule({(None, None): P(None, None)}),
        ss.MemoryConstrainedShardingRule(2048, mesh=mesh), ss.AutoShardingRule(mesh)),
}
analyzer = ss.ShardingAnalyzer(mesh)
for name, rule in rules.items():
    specs = rule.apply(tree)
    print(name, repr(specs))
    print(name, json.dumps(rule.to_config()))
    print(name, repr(analyzer.validate_partition_specs(tree, specs)))
    print(name, repr(analyzer.estimate_memory_usage(tree, specs)))
bad = {"w": sds(6, 6, 6)}
print(analyzer.validate_partition_specs(bad, {"w": P(("tp", "sp"), "zz", "fsdp")}))
'''


def _run(seed):
    env = child_env(PYTHONHASHSEED=str(seed))
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


@pytest.fixture(scope="module")
def outputs():
    procs = {seed: _run(seed) for seed in (0, 1, 2)}
    out = {}
    for seed, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        out[seed] = stdout
    return out


def test_specs_do_not_depend_on_the_hash_seed(outputs):
    assert outputs[0] == outputs[1] == outputs[2]
    lines = outputs[0].splitlines()
    assert len(lines) == 8 * 4 + 1
    # Every rule sharded something: the output is not trivially equal.
    assert all("P('" in line or "P(('" in line for line in lines[0::4][:8])


def test_this_process_agrees_with_the_subprocesses(outputs, capsys):
    exec(compile(SCRIPT, "<determinism script>", "exec"), {})
    assert capsys.readouterr().out == outputs[0]


def test_repeated_application_is_identical(any_mesh):
    import jax

    import shardsearch as ss

    tree = [jax.ShapeDtypeStruct((8 * k, 16), "float32") for k in range(1, 6)]
    rule = ss.CompositeShardingRule(
        ss.MemoryConstrainedShardingRule(256, mesh=any_mesh), ss.AutoShardingRule(any_mesh))
    first = rule.apply(tree)
    assert all(rule.apply(tree) == first for _ in range(5))
