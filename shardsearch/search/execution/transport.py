"""How a study's step reaches a worker process (`search.isolate`).

In order of preference:

1. **A `jax.export` program**: the step, traced on the abstract arguments
   without shardings (`nr_devices == 1`) and serialized once per study. JAX
   lets a one-device export be called under `jax.jit` on any mesh, with the
   candidate's shardings as the jit's in/out shardings, so one export serves
   every candidate and the worker compiles exactly the program the study
   process traced. Works for any step JAX can export, a notebook's lambda
   included. It cannot carry host callbacks (`jax.debug.callback`,
   `pure_callback`, `io_callback`: JAX refuses to serialize them), custom
   pytree nodes without a registered serialization, or `shard_map` over the
   study's mesh (JAX refuses), nor `custom_partitioning` (a one-device
   export silently lowers it to its plain body, so the step's jaxpr is
   checked for it first); and it needs the `flatbuffers` package.
2. **By reference**: a `Workload` whose name `get_workload` resolves
   ("gpt:tiny", "package.module:function") is rebuilt in the worker, and a
   module-level step function is imported there by its qualified name. The
   worker refuses to start when the step it rebuilt traces to another
   program (`jaxpr_digest`: the jaxpr and the functions it calls back).
3. Otherwise the step cannot travel: `isolate=None` (the default of
   `optimize`) evaluates in the study process and says why with an
   `IsolationWarning`; `isolate=True` raises ValueError.

Example:
  >>> program, why = package_step(step, None, abstract_args, "cpu")
  >>> program[0]
  'export'
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.util
import pickle
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import jax

from ...base.activations import PREFIX, split_setting
from ...base.knobs import Knobs, Setting
from ..evaluation.evaluate import error_line

if TYPE_CHECKING:
    from ...workloads import Workload


def package_step(step: Any, workload: Workload | None, abstract_args: Sequence[Any],
                 platform: str, knobs: Knobs | None = None,
                 setting: Setting = ()) -> tuple[tuple[Any, ...] | None, str]:
    """How `step` can reach a worker: `(("export", bytes), "")`, or by reference
    `(("workload", name, digest, setting) | ("function", step, digest, rules) |
    ("factory", make_step, digest, values, rules), "")`, or `(None, why not)`.
    A reference carries `jaxpr_digest` of the step, which the worker checks
    against the step it rebuilt, and the activation rules of the setting's
    `act_` knobs (`base.activations`), which it applies to it.

    `step` is the step under the knob `setting` of `knobs` (`()` and None:
    the step as given): the workload rebuilt by name builds it from its own
    knobs, a module-level factory is called with the setting's values.

    Example:
      >>> package_step(lambda s, b: (s, {}), None, args, "cpu")[0][0]
      'export'
    """
    problems = []
    try:
        traced = jax.make_jaxpr(step)(*abstract_args)
    except Exception as err:  # make_context traced it already; this is belt and braces
        return None, f"the step cannot be traced ({error_line(err)})"
    _, rules = split_setting(setting)
    dependent = _mesh_dependent(traced.jaxpr)
    if dependent:
        problems.append(f"the step uses {dependent}, whose rules a one-device export would "
                        "drop")
    elif rules:
        problems.append("the step places its activations on the mesh, which a one-device "
                        "export would drop")
    else:
        try:
            exported = jax.export.export(jax.jit(step), platforms=(platform,))(*abstract_args)
            return ("export", bytes(exported.serialize())), ""
        except Exception as err:  # anything JAX cannot export: callbacks, mesh-bound ops, ...
            problems.append(f"jax.export failed ({error_line(err)})")
    digest = jaxpr_digest(traced)
    # The activation knobs' rules travel apart: the worker places the points
    # of the step it rebuilt (`base.activations.under_rules`).
    make_step = getattr(knobs.make_step, "base", knobs.make_step) if knobs else None
    if workload is not None:
        if _resolvable(workload.name):
            return ("workload", workload.name, digest, tuple(setting)), ""
        problems.append(f"workload {workload.name!r} is neither built in nor a "
                        "'package.module:function' factory")
    elif make_step is not None:
        if _importable(make_step):
            values = {n: v for n, v in knobs.values(setting).items()
                      if not n.startswith(PREFIX)}
            return ("factory", make_step, digest, values, rules), ""
        problems.append(f"{getattr(make_step, '__qualname__', 'make_step')} is not a "
                        "module-level function of an importable module")
    elif _importable(plain := getattr(step, "__wrapped__", step) if rules else step):
        return ("function", plain, digest, rules), ""
    else:
        problems.append(f"{getattr(step, '__qualname__', type(step).__name__)} is not a "
                        "module-level function of an importable module")
    return None, "; ".join(problems)


def jaxpr_digest(traced: Any) -> str:
    """A hash of a traced step that two processes agree on: its jaxpr's text
    without the addresses of the Python objects it names, and the qualified
    names of the functions its equations call back (host callbacks, custom
    partitioning rules), which the text hides behind JAX's own wrappers."""
    digest = hashlib.sha256(re.sub(r" at 0x[0-9a-fA-F]+", "", str(traced)).encode())
    for name in _called_back(traced.jaxpr):
        digest.update(name.encode())
    return digest.hexdigest()[:16]


def _called_back(jaxpr: Any) -> Iterator[str]:
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(item, "jaxpr", item)
                if hasattr(inner, "eqns"):
                    yield from _called_back(inner)
                else:
                    yield from _functions(item, 3)


def _functions(value: Any, depth: int) -> Iterator[str]:
    """"module.qualname" of the functions in `value`, its closure, or its
    fields, `depth` levels down."""
    if depth == 0:
        return
    if callable(value) and hasattr(value, "__code__"):
        yield f"{value.__module__}.{value.__qualname__}"
        for cell in value.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                yield from _functions(cell.cell_contents, depth - 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _functions(getattr(value, field.name), depth - 1)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for field in vars(value).values():
            yield from _functions(field, depth - 1)


# Primitives whose lowering depends on the devices it is lowered for: exported
# for one device they lower to their plain body, and the worker would compile
# another program than the study process.
MESH_DEPENDENT = ("custom_partitioning",)


def _mesh_dependent(jaxpr: Any) -> str | None:
    """The first `MESH_DEPENDENT` primitive in a jaxpr or the jaxprs it calls."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in MESH_DEPENDENT:
            return eqn.primitive.name
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(item, "jaxpr", item)  # a ClosedJaxpr holds its Jaxpr
                found = _mesh_dependent(inner) if hasattr(inner, "eqns") else None
                if found:
                    return found
    return None


def _resolvable(name: str) -> bool:
    from ...workloads import list_workloads

    module, sep, attr = name.partition(":")
    if name in list_workloads() or module in {n.partition(":")[0] for n in list_workloads()}:
        return True
    try:
        return bool(sep and attr) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _importable(fn: Any) -> bool:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return False
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return False
    return found is fn


def travels(value: Any) -> str:
    """"" when `value` pickles to something another process can load, else why not."""
    cls = type(value)
    if cls.__module__ == "__main__" or "<" in cls.__qualname__:
        return f"{cls.__qualname__} is defined in __main__ or inside a function"
    try:
        pickle.loads(pickle.dumps(value))
    except Exception as err:
        return f"{cls.__qualname__} cannot be pickled ({error_line(err)})"
    return ""
