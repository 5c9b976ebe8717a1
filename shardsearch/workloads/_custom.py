"""Custom shapes: the built-in llama and gpt transformers at any size.

`get_workload("llama:custom", layers=32, d_model=4096, heads=64,
head_dim=128, d_ff=28672, vocab=32000, seq=2048, batch=1536,
compute_dtype="bfloat16")` builds the Llama workload at that shape; the
same keys in a JSON object (`"llama:custom:shape.json"`) do it from a file,
which is what the CLI's `--workload` takes. Its layers are stacked under
`lax.scan` with remat, as the published MaxText and Megatron-LM runs train.
It is planned for from its abstract arguments (`--target`, objective
"static"), and run (objective "measured") when its state fits the host's
available memory: `init` says so before allocating otherwise.

The workload's name spells its whole shape as compact JSON, every default
filled in, in a fixed key order (`canonical_name`), e.g.
`llama:custom:{"layers":2,"d_model":64,"heads":4,"kv_heads":2,"head_dim":32,
...,"compute_dtype":"float32"}`; `get_workload` rebuilds the same workload
from that name, so a stored study, a worker process and `shardsearch export
--workload NAME` find it again.

Keys (all sizes positive ints):

    llama: layers, d_model, heads, d_ff, vocab, seq, batch (required);
           kv_heads (default heads), head_dim (default d_model // heads),
           compute_dtype ("float32" default, or "bfloat16"),
           activation_sharding ({"mesh": {axis: size}, "batch": [axis]}:
           the activations' batch dim pinned to those axes, `_activations`),
           attention_chunk (queries per block of memory-bounded attention,
           dividing seq: the memory of the fused attention the published
           runs used, `_layers.causal_attention`; default the whole
           score matrix), remat ("full", the default: a block keeps only
           its input; "selective": also its projections' outputs, as
           Megatron-LM's selective recompute; `_layers.REMAT_POLICIES`),
           loss_chunk (positions per block of the loss, dividing seq: the
           logits made and dropped a block at a time,
           `_train.token_cross_entropy`; default all at once)
    gpt:   layers, d_model, heads, d_ff, vocab, seq, batch (required);
           compute_dtype, activation_sharding, attention_chunk, remat,
           loss_chunk
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..base.jsonfile import read_json
from . import _gpt, _llama
from ._activations import ActivationSharding
from ._layers import REMAT_POLICIES
from ._precision import COMPUTE_DTYPES
from ._workload import Workload

CUSTOM = "custom"

_REQUIRED = ("layers", "d_model", "heads", "d_ff", "vocab", "seq", "batch")
# model -> every key, in the order the canonical name spells them.
KEYS: dict[str, tuple[str, ...]] = {
    "llama": ("layers", "d_model", "heads", "kv_heads", "head_dim", "d_ff", "vocab", "seq",
              "batch", "compute_dtype", "activation_sharding", "attention_chunk", "remat",
              "loss_chunk"),
    "gpt": ("layers", "d_model", "heads", "d_ff", "vocab", "seq", "batch", "compute_dtype",
            "activation_sharding", "attention_chunk", "remat", "loss_chunk"),
}
_NOT_SIZES = ("compute_dtype", "activation_sharding", "remat")


def custom_workload(model: str, spec: Mapping[str, Any], where: str = "") -> Workload:
    """The `model` ("llama" or "gpt") workload at the shape `spec` gives.

    Args:
        model: "llama" or "gpt".
        spec: the keys of the module doc, e.g. `{"layers": 2, "d_model": 64,
            ...}`.
        where: how errors name the spec's origin (a file), e.g. "shape.json".

    Returns:
        A stacked, rematerialised workload named
        `canonical_name(model, ...)`.

    Raises:
        ValueError: unknown model or key, a missing key, a size that is not
            a positive int, sizes that do not divide (d_model by heads
            without head_dim, heads by kv_heads), an odd head_dim (llama), an
            unknown compute dtype, a malformed activation_sharding; one line
            naming the key and the fix.

    Example:
        >>> custom_workload("llama", {"layers": 2, "d_model": 64, "heads": 4,
        ...     "d_ff": 128, "vocab": 256, "seq": 32, "batch": 8}).n_params
        115008
    """
    at = f"{where}: " if where else ""
    if model not in KEYS:
        raise ValueError(f"{at}custom shapes exist for {tuple(KEYS)}, not {model!r}; use "
                         f"'llama:{CUSTOM}' or 'gpt:{CUSTOM}'")
    if not isinstance(spec, Mapping):
        raise ValueError(f"{at}a {model}:{CUSTOM} spec must be a JSON object of sizes, got "
                         f"{type(spec).__name__}")
    keys = KEYS[model]
    unknown = [k for k in spec if k not in keys]
    if unknown:
        raise ValueError(f"{at}unknown key {unknown[0]!r} in the {model}:{CUSTOM} spec; the "
                         f"keys are {', '.join(keys)}")
    missing = [k for k in _REQUIRED if k not in spec]
    if missing:
        raise ValueError(f"{at}the {model}:{CUSTOM} spec misses {', '.join(missing)}; give "
                         f"every one of {', '.join(_REQUIRED)}")
    bad = [f"{k}={v!r}" for k, v in spec.items() if k not in _NOT_SIZES and (
        isinstance(v, bool) or not isinstance(v, int) or v <= 0)]
    if bad:
        raise ValueError(f"{at}{model}:{CUSTOM} sizes must be positive ints, got "
                         f"{', '.join(bad)}")
    if spec.get("remat", "full") not in REMAT_POLICIES:
        raise ValueError(f"{at}{model}:{CUSTOM} remat={spec['remat']!r}; choose one of "
                         f"{tuple(REMAT_POLICIES)}")
    dtype = spec.get("compute_dtype", "float32")
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"{at}{model}:{CUSTOM} compute_dtype={dtype!r}; choose one of "
                         f"{COMPUTE_DTYPES}")
    _check_divisible(model, spec, at)
    try:
        activations = (None if spec.get("activation_sharding") is None else
                       ActivationSharding.from_json(spec["activation_sharding"]))
        config = _config(model, spec, dtype, activations)
    except ValueError as err:
        raise ValueError(f"{at}{model}:{CUSTOM}: {err}") from None
    values = _resolved(model, config)
    name = canonical_name(model, values)
    builder = _llama.build if model == "llama" else _gpt.build
    return builder(name, config)


def _check_divisible(model: str, spec: Mapping[str, Any], at: str) -> None:
    """The divisibility the model needs, in the spec's own key names."""
    pairs = [("heads", "kv_heads")] if model == "llama" else []
    if model == "gpt" or "head_dim" not in spec:
        pairs.insert(0, ("d_model", "heads"))
    for what, by in pairs:
        n, m = spec[what], spec.get(by, spec["heads"])
        if n % m:
            raise ValueError(
                f"{at}{model}:{CUSTOM}: {what}={n} is not divisible by {by}={m}; pick "
                f"{what} as a multiple of {by}" + (
                    " or give head_dim" if (what, by) == ("d_model", "heads")
                    and model == "llama" else ""))
    for key in ("attention_chunk", "loss_chunk"):
        chunk = spec.get(key)
        if chunk is not None and spec["seq"] % chunk:
            raise ValueError(f"{at}{model}:{CUSTOM}: {key}={chunk} does not divide "
                             f"seq={spec['seq']}; pick a divisor of seq")
    head_dim = spec.get("head_dim", spec["d_model"] // spec["heads"])
    if model == "llama" and head_dim % 2:
        raise ValueError(f"{at}{model}:{CUSTOM}: head_dim={head_dim} must be even (rotary "
                         "embeddings rotate pairs); pick an even head_dim")


def _config(model: str, spec: Mapping[str, Any], dtype: str,
            activations: ActivationSharding | None) -> Any:
    common = {"batch": spec["batch"], "seq": spec["seq"], "vocab": spec["vocab"],
              "d_model": spec["d_model"], "n_layers": spec["layers"],
              "n_heads": spec["heads"], "d_ff": spec["d_ff"], "stacked": True,
              # "full" is the default, spelled True: one name for one workload.
              "remat": True if spec.get("remat", "full") == "full" else spec["remat"],
              "abstract_only": False, "compute_dtype": dtype,
              "activation_sharding": activations,
              "attention_chunk": spec.get("attention_chunk"),
              "loss_chunk": spec.get("loss_chunk")}
    if model == "gpt":
        return _gpt.GPTConfig(**common)
    head_dim = spec.get("head_dim")
    if head_dim is not None and head_dim * spec["heads"] == spec["d_model"]:
        head_dim = None  # the default spelled out: the same config as leaving it out
    return _llama.LlamaConfig(**common, n_kv_heads=spec.get("kv_heads", spec["heads"]),
                              explicit_head_dim=head_dim)


def _resolved(model: str, config: Any) -> dict[str, Any]:
    values = {"layers": config.n_layers, "d_model": config.d_model, "heads": config.n_heads,
              "kv_heads": getattr(config, "n_kv_heads", None), "head_dim": config.head_dim,
              "d_ff": config.d_ff, "vocab": config.vocab, "seq": config.seq,
              "batch": config.batch, "compute_dtype": config.compute_dtype,
              "activation_sharding": (config.activation_sharding.to_json()
                                      if config.activation_sharding else None),
              "attention_chunk": config.attention_chunk,
              # The default (full) stays out of the name, as it always was.
              "remat": None if config.remat is True else config.remat,
              "loss_chunk": config.loss_chunk}
    return {k: values[k] for k in KEYS[model] if values[k] is not None}


def canonical_name(model: str, values: Mapping[str, Any]) -> str:
    """"model:custom:" and the shape as compact JSON, keys in `KEYS[model]`'s order
    (every default filled in; `activation_sharding` only when set).

    Example: `canonical_name("gpt", {"layers": 2, ...})` →
    `'gpt:custom:{"layers":2,"d_model":64,...,"compute_dtype":"float32"}'`.
    """
    ordered = {k: values[k] for k in KEYS[model] if k in values}
    return f"{model}:{CUSTOM}:" + json.dumps(ordered, separators=(",", ":"))


def is_custom_name(name: str) -> bool:
    """Whether `name` is a custom workload's own name (`canonical_name`'s form):
    rebuilding it reads no file and imports no code.

    Example: `is_custom_name('llama:custom:{"layers":2,...}')` → True;
    `is_custom_name("llama:custom:shape.json")` → False.
    """
    model, _, rest = name.partition(":")
    return model in KEYS and rest.startswith(f"{CUSTOM}:{{")


def from_name(model: str, rest: str, overrides: Mapping[str, Any]) -> Workload:
    """The workload `get_workload` is asked for by "model:custom[:...]".

    Args:
        model: "llama" or "gpt".
        rest: what follows "custom": "" (the sizes come as `overrides`),
            ':{"layers": ...}' (a canonical name) or ":path/to/spec.json".
        overrides: keyword sizes given to `get_workload`.

    Raises:
        ValueError: no sizes at all, sizes both in the name and as keywords,
            malformed JSON, an unreadable or malformed file, or a bad
            spec (`custom_workload`).
    """
    if not rest:
        if not overrides:
            raise ValueError(
                f"{model}:{CUSTOM} needs its sizes: get_workload('{model}:{CUSTOM}', "
                f"layers=..., d_model=..., ...) or '{model}:{CUSTOM}:shape.json' (keys "
                f"{', '.join(KEYS.get(model, KEYS['llama']))})")
        return custom_workload(model, overrides)
    if not rest.startswith(":") or len(rest) == 1:
        raise ValueError(f"unknown size {CUSTOM + rest!r} for workload {model!r}; give "
                         f"'{model}:{CUSTOM}:FILE.json' or sizes as keyword arguments")
    if overrides:
        raise ValueError(f"{model}:{CUSTOM}{rest}: give the sizes in the name or as keyword "
                         "arguments, not both")
    text = rest[1:]
    if not text.startswith("{"):
        return custom_workload(model, read_spec(text), text)
    try:
        spec = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{model}:{CUSTOM}:{text}: not a JSON object ({err}); give the "
                         "shape as JSON, e.g. {\"layers\": 32, ...}, or a .json file") from None
    return custom_workload(model, spec, f"{model}:{CUSTOM}")


def read_spec(path: str | Path) -> dict[str, Any]:
    """The JSON object in a shape file.

    Raises:
        ValueError: one line naming the file: cannot be read, not JSON, not
            an object.
    """
    where = f"workload spec {path}"
    try:
        data = read_json(path, where)
    except OSError as err:
        raise ValueError(f"{where} cannot be read: {err.strerror or err}; give a JSON file "
                         "of sizes") from None
    except ValueError as err:
        raise ValueError(" ".join(str(err).split())) from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object of sizes such as "
                         f'{{"layers": 32, "d_model": 4096, ...}}, got {type(data).__name__}')
    return data
