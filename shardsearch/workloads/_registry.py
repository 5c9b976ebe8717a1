"""Finding a workload by name: built-in presets and user factories."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from . import _custom, _gpt, _llama, _mlp, _moe
from ._workload import Workload

DEFAULT_SIZE = "small"

# model name -> (builder, size -> config). Insertion order is the order
# list_workloads() reports. Tiny presets keep every dim divisible by 8 so all
# plans apply on 8 devices. Tiny and small unroll their layers: on CPU the
# backward pass of a scan costs ~1.5 s more to compile than two unrolled
# layers. The real-size presets are abstract-only and stacked (one scanned
# block compiles in seconds at any depth) with remat.
_PRESETS: dict[str, tuple[Callable[[str, Any], Workload], dict[str, Any]]] = {
    "mlp": (_mlp.build, {
        "tiny": _mlp.MLPConfig(batch=16, d_in=64, d_hidden=64, n_classes=32,
                               learning_rate=3e-3),
        "small": _mlp.MLPConfig(batch=64, d_in=512, d_hidden=2048, n_classes=512),
    }),
    "gpt": (_gpt.build, {
        "tiny": _gpt.GPTConfig(batch=8, seq=32, vocab=256, d_model=64, n_layers=2, n_heads=4,
                               d_ff=256, learning_rate=3e-3),
        "small": _gpt.GPTConfig(batch=16, seq=128, vocab=4096, d_model=256, n_layers=4,
                                n_heads=8, d_ff=1024),
        # GPT-2 XL shapes with an untied head and no linear biases (1.64B
        # parameters; GPT-2 XL itself, tied and with biases, has 1.56B).
        # 25 heads and vocab 50257 divide few meshes: the plans say so.
        "1.5b": _gpt.GPTConfig(batch=64, seq=1024, vocab=50257, d_model=1600, n_layers=48,
                               n_heads=25, d_ff=6400, stacked=True, remat=True,
                               abstract_only=True),
    }),
    "llama": (_llama.build, {
        "tiny": _llama.LlamaConfig(batch=8, seq=32, vocab=256, d_model=64, n_layers=2,
                                   n_heads=4, n_kv_heads=2, d_ff=192, learning_rate=3e-3),
        "small": _llama.LlamaConfig(batch=16, seq=128, vocab=4096, d_model=256, n_layers=4,
                                    n_heads=8, n_kv_heads=4, d_ff=768),
        "7b": _llama.LlamaConfig(batch=64, seq=2048, vocab=32000, d_model=4096, n_layers=32,
                                 n_heads=32, n_kv_heads=32, d_ff=11008, stacked=True,
                                 remat=True, abstract_only=True),
        "70b": _llama.LlamaConfig(batch=64, seq=2048, vocab=32000, d_model=8192, n_layers=80,
                                  n_heads=64, n_kv_heads=8, d_ff=28672, stacked=True,
                                  remat=True, abstract_only=True),
    }),
    "moe": (_moe.build, {
        "tiny": _moe.MoEConfig(batch=8, seq=32, vocab=256, d_model=64, n_layers=2, n_heads=4,
                               n_kv_heads=2, d_ff=64, n_experts=4, learning_rate=3e-3),
        "small": _moe.MoEConfig(batch=16, seq=128, vocab=4096, d_model=256, n_layers=4,
                                n_heads=8, n_kv_heads=4, d_ff=256, n_experts=8),
    }),
}


def list_workloads() -> list[str]:
    """The built-in workloads as "model:size" strings, e.g. "gpt:small"."""
    return [f"{model}:{size}" for model, (_, sizes) in _PRESETS.items() for size in sizes]


def get_workload(name: str, **shape: Any) -> Workload:
    """Returns a built-in workload or the one a user factory makes.

    Built-ins are "model:size" (e.g. "gpt:small", "llama:7b"; "gpt" alone
    means "gpt:small"); `list_workloads()` names them all. "llama:custom"
    and "gpt:custom" take their shape as keyword arguments (`shape`), from a
    JSON file ("llama:custom:shape.json") or as the JSON object itself
    ('llama:custom:{"layers":32,...}', the name such a workload is given);
    see `workloads._custom`.

    Anything else of the form "package.module:function" is a user factory:
    the module is imported and `function` (a dotted attribute path is
    allowed, "module:Class.make") is called with no arguments. It must return
    a `Workload` whose `step(state, batch) -> (state, metrics)` is un-jitted,
    `metrics["loss"]` a float32 scalar, `init(seed)` gives concrete
    `(state, batch)` and `abstract()` the same tree of
    `jax.ShapeDtypeStruct`s; every batch leaf's leading dim is the global
    batch. Parameter paths that end like the built-ins' ("attn/wq",
    "mlp/w_down", "embed/tokens", "head", ...) let the expert plans shard
    them; other leaves stay replicated under those plans.

    Args:
        name: "model[:size]" or "package.module:function".
        shape: for "llama:custom" / "gpt:custom" only: layers, d_model,
            heads, d_ff, vocab, seq, batch, and optionally kv_heads,
            head_dim (llama), compute_dtype and activation_sharding.

    Returns:
        The workload.

    Raises:
        ValueError: unknown built-in model or size, a factory module /
            function that cannot be imported or found, or a factory (or its
            module, while imported) that called `sys.exit`, sizes given to
            another workload than a custom one, or a custom shape that is
            malformed (`_custom.custom_workload` names the key). Anything
            else a factory raises reaches the caller as raised.
        TypeError: `name` is not a str, the factory is not callable, or it
            returned something other than a `Workload`.

    Example:
        >>> get_workload("gpt:tiny").name
        'gpt:tiny'
        >>> get_workload("llama:custom", layers=32, d_model=4096, heads=64, head_dim=128,
        ...              d_ff=28672, vocab=32000, seq=2048, batch=1536).n_params
        15831666688
    """
    if not isinstance(name, str):
        raise TypeError(f"workload name must be a str like 'gpt:small', got {name!r}")
    model, sep, size = name.partition(":")
    if model in _custom.KEYS and size.partition(":")[0] == _custom.CUSTOM:
        return _custom.from_name(model, size[len(_custom.CUSTOM):], shape)
    if shape:
        raise ValueError(f"workload {name!r} takes no sizes (got {', '.join(shape)}); only "
                         f"'llama:{_custom.CUSTOM}' and 'gpt:{_custom.CUSTOM}' do")
    if model in _PRESETS:
        builder, sizes = _PRESETS[model]
        size = size if sep else DEFAULT_SIZE
        if size not in sizes:
            raise ValueError(f"unknown size {size!r} for workload {model!r}; sizes are "
                             f"{list(sizes)} (e.g. '{model}:{next(iter(sizes))}')")
        return builder(f"{model}:{size}", sizes[size])
    if not sep or not size:
        raise ValueError(
            f"unknown workload {name!r}; built-ins are {list(_PRESETS)} with sizes "
            f"{list_workloads()}, or give a factory as 'package.module:function'")
    return _from_factory(name, model, size)


def _from_factory(name: str, module_name: str, attr_path: str) -> Workload:
    try:
        module = importlib.import_module(module_name)
    except SystemExit as e:
        raise _exited(name, "importing its module", e) from None
    except ImportError as e:
        hint = "" if "." in module_name else (
            f"; built-in workloads are {list(_PRESETS)}")
        raise ValueError(
            f"cannot import module {module_name!r} for workload factory {name!r}: {e}; "
            f"check the module is on sys.path{hint}") from e
    factory: Any = module
    for attr in attr_path.split("."):
        if not hasattr(factory, attr):
            raise ValueError(
                f"workload factory {name!r}: module {module_name!r} has no attribute "
                f"{attr_path!r}; give 'package.module:function' naming a zero-argument "
                "function that returns a Workload")
        factory = getattr(factory, attr)
    if not callable(factory):
        raise TypeError(f"workload factory {name!r} is a {type(factory).__name__}, not "
                        "callable; it must be a zero-argument function returning a Workload")
    try:
        workload = factory()
    except SystemExit as e:
        raise _exited(name, "calling it", e) from None
    if not isinstance(workload, Workload):
        raise TypeError(
            f"workload factory {name!r} returned {type(workload).__name__}, expected a "
            "shardsearch.workloads.Workload; build one with Workload(name=..., step=..., "
            "init=..., abstract=..., flops_per_step=..., n_params=...)")
    return workload


def _exited(name: str, when: str, exit: SystemExit) -> ValueError:
    # A factory that calls sys.exit (or `builtins:exit`) must not end the
    # caller's process, least of all with exit code 0 and no word.
    return ValueError(
        f"workload factory {name!r} raised SystemExit({exit.code!r}) while {when} (it "
        "called sys.exit or exit()); a factory must return a Workload")
