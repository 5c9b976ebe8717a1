"""What a traced step contains, for the tests that check where it is constrained."""

import jax


def constraints(fn, *args) -> list[tuple]:
    """The specs of the sharding constraints `fn` traces on `args`, in order,
    nested jaxprs (grads, scans, remat) included: one tuple of entries each."""
    return [tuple(s.spec) for s in constraint_shardings(fn, *args)]


def constraint_shardings(fn, *args) -> list:
    """The shardings of those constraints, in the same order."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "sharding_constraint":
                found.append(eqn.params["sharding"])
            for value in eqn.params.values():
                for item in value if isinstance(value, tuple | list) else (value,):
                    inner = getattr(item, "jaxpr", item)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found
