"""Bare-array arguments each keep their own logical axes (issue 25, item 3).

The defect: `step(state, x, y)` with x and y both f32[16, 32] and distinct
discovered axes; every bare argument's path is "", the rule's table was keyed
by path, and y was sharded with x's names (`P(None, 'tp')`) while `explain`
called the lookup "exact".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import shardsearch as ss
from shardsearch.search import Candidate
from shardsearch.search.space.logical import split_rules


def _step(state, x, y):
    def loss(w):
        return jnp.sum(jnp.tanh(x @ w["w"])) + jnp.sum(y * w["scale"])

    grads = jax.grad(loss)(state)
    return jax.tree.map(lambda a, b: a - 0.1 * b, state, grads), {"loss": loss(state)}


ARGS = ({"w": jax.ShapeDtypeStruct((32, 64), np.float32),
         "scale": jax.ShapeDtypeStruct((16, 32), np.float32)},
        jax.ShapeDtypeStruct((16, 32), np.float32),
        jax.ShapeDtypeStruct((16, 32), np.float32))


def test_two_bare_arguments_of_one_shape_get_their_own_axes(mesh24):
    axes = ss.discover_logical_axes(_step, ARGS)
    (x,), (y,) = axes.arguments[1], axes.arguments[2]
    assert x.path == y.path == "" and x.names != y.names  # the defect's precondition
    x_inner = x.names[1]  # x's contracted dim: not y's
    state_rule, batch_rule = split_rules(mesh24, axes, {x_inner: "tp"})
    specs = Candidate(state_rule, batch_rule).specs(ARGS)
    assert specs[1] == P(None, "tp")
    assert specs[2] == P()  # before: P(None, 'tp'), x's names
    explained = ss.explain_rule(batch_rule, ARGS[2], 1)
    assert [e.names for e in explained] == [y.names]
    assert explained[0].source == "logical: exact"
    # A plan file records what the search measured.
    plan = ss.search.plan_config(state_rule, batch_rule, mesh24, args=ARGS)
    assert [a[0]["spec"] for a in plan["workload"]["arguments"][1:]] == [[None, "tp"], []]


def test_apply_without_a_position_keeps_looking_in_every_argument(mesh24):
    axes = ss.discover_logical_axes(_step, ARGS)
    x_inner = axes.arguments[1][0].names[1]
    _state_rule, batch_rule = split_rules(mesh24, axes, {x_inner: "tp"})
    # A user applying the rule to one tree, position unknown: the first match.
    assert batch_rule.apply(ARGS[1]) == P(None, "tp")
    assert batch_rule.apply_argument(0, ARGS[1]) == P(None, "tp")
    assert batch_rule.apply_argument(1, ARGS[2]) == P()
