"""The `Workload` type: a training step plus everything needed to plan for it."""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..base.host import meminfo_bytes
from ..base.knobs import GRAD_GROUPS, MICROBATCHES, Knobs
from ..base.units import format_bytes
from . import _activations, _params, _train

StepFn = Callable[[Any, Any], tuple[Any, dict]]


# eq=False: a workload is its closures, so two builds are never "equal"; identity
# equality keeps it hashable (usable as a cache key) despite the dims mapping.
@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """A training step to shard, with concrete and abstract arguments.

    Args:
        name: how to ask for it again, e.g. "gpt:small" or "mypkg.models:make".
        step: plain (un-jitted) `step(state, batch) -> (state, metrics)`;
            `metrics["loss"]` is a float32 scalar.
        init: `init(seed) -> (state, batch)` with concrete arrays, the same
            for the same seed. Abstract-only workloads raise here.
        abstract: `abstract() -> (state, batch)` with `jax.ShapeDtypeStruct`
            leaves; allocates nothing.
        flops_per_step: analytic floating-point operations of one step
            (forward and backward); the formula is the model's to document.
        n_params: analytic number of parameters.
        stacked: True when the layers are stacked under `lax.scan` (one
            leading layer dim, paths `params/layers/attn/wq`), False when
            unrolled (paths `params/layers/3/attn/wq`).
        dims: named model sizes the expert plans check divisibility against.
            Keys they read: "batch", "n_heads", "n_kv_heads", "d_ff",
            "vocab", "d_model", "n_experts". Missing keys skip those checks.
        knobs: the step's knobs (`base.knobs.Knobs`), whose default setting
            builds `step`; `optimize(workload, knobs=True)` searches them.
            None: the step has none.

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field has an impossible value.

    Example:
        >>> w = get_workload("gpt:tiny")
        >>> state, batch = w.init(0)
        >>> state, metrics = jax.jit(w.step)(state, batch)
    """

    name: str
    step: StepFn
    init: Callable[[int], tuple[Any, Any]]
    abstract: Callable[[], tuple[Any, Any]]
    flops_per_step: float
    n_params: int
    stacked: bool = False
    dims: Mapping[str, int] = dataclasses.field(default_factory=dict)
    knobs: Knobs | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Workload name must be a non-empty str, got name={self.name!r}")
        for field in ("step", "init", "abstract"):
            if not callable(getattr(self, field)):
                raise TypeError(
                    f"Workload {self.name!r}: {field} must be callable, got "
                    f"{type(getattr(self, field)).__name__}")
        if not isinstance(self.flops_per_step, int | float) or not self.flops_per_step >= 0:
            raise ValueError(
                f"Workload {self.name!r}: flops_per_step must be a number >= 0, got "
                f"{self.flops_per_step!r}")
        object.__setattr__(self, "flops_per_step", float(self.flops_per_step))
        if isinstance(self.n_params, bool) or not isinstance(self.n_params, int | np.integer):
            raise TypeError(f"Workload {self.name!r}: n_params must be an int, got "
                            f"{self.n_params!r}")
        if self.n_params < 0:
            raise ValueError(f"Workload {self.name!r}: n_params must be >= 0, got "
                             f"{self.n_params}")
        object.__setattr__(self, "n_params", int(self.n_params))
        if not isinstance(self.stacked, bool):
            raise TypeError(f"Workload {self.name!r}: stacked must be a bool, got "
                            f"{self.stacked!r}")
        bad = [f"{k!r}: {v!r}" for k, v in dict(self.dims).items()
               if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise TypeError(f"Workload {self.name!r}: dims must map str to int; bad entries "
                            f"{', '.join(bad)}")
        # Read-only view so a frozen Workload cannot be changed through its dims.
        object.__setattr__(self, "dims", types.MappingProxyType(dict(self.dims)))
        if self.knobs is not None and not isinstance(self.knobs, Knobs):
            raise TypeError(f"Workload {self.name!r}: knobs must be a Knobs or None, got "
                            f"{type(self.knobs).__name__}")


HOST_COPIES = 2
"""Copies of a workload's state and batch `init` holds on the host at its
peak: the numpy arrays it draws and the arrays made from them."""


def _check_host_memory(name: str, n_params: int, abstract: Any) -> None:
    """Refuses an `init` whose arrays would not fit in the host's available
    memory (when Linux says what that is), before anything is allocated."""
    need = HOST_COPIES * sum(math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
                             for leaf in jax.tree_util.tree_leaves(abstract))
    available = meminfo_bytes("MemAvailable")
    if available is not None and need > available:
        raise ValueError(
            f"workload {name!r}: init() would hold {format_bytes(need)} on this host "
            f"({n_params:,} parameters, their Adam moments and a batch, {HOST_COPIES} copies "
            f"while they are made) and {format_bytes(available)} is available; plan for it "
            "without running it (objective 'static', or --target CHIP), or pick a smaller "
            "shape")


def assemble(*, name: str, param_spec: dict, batch_shapes: Mapping[str, jax.ShapeDtypeStruct],
             make_batch: Callable[[np.random.Generator], dict], loss_fn: _train.LossFn,
             adam: _train.Adam, flops_per_step: float, n_params: int, stacked: bool,
             dims: Mapping[str, int], abstract_only: bool,
             remat: tuple[str, Callable[[str], _train.LossFn]] | None = None,
             activation_sharding: _activations.ActivationSharding | None = None,
             compute_dtype: str | None = None) -> Workload:
    """Builds a built-in `Workload` from a model's pieces.

    Args:
        name: "model:size".
        param_spec: tree of `_params.Param`; layers, if any, unrolled as a list
            under the top-level key "layers".
        batch_shapes: leaf name -> shape struct of the batch.
        make_batch: draws a concrete numpy batch from the generator.
        loss_fn: `loss_fn(params, batch) -> (loss, extra_metrics)`.
        adam: optimizer hyper-parameters.
        flops_per_step: analytic flops of one step.
        n_params: analytic parameter count.
        stacked: stack the "layers" list for `lax.scan`.
        dims: named sizes for the plans' divisibility checks.
        abstract_only: `init` refuses to allocate (real-size presets); any
            other `init` refuses when its arrays would not fit the host's
            available memory.
        remat: `(the model's remat policy, loss for a policy)` when its
            blocks can be rematerialised: the `remat` knob then offers every
            policy of `REMAT_CHOICES`, the model's own first.
        activation_sharding: the batch axes the model pins its activations
            to (inside its loss); a step with `grad_groups` runs wholly under
            them, so that the kept-apart gradients take those axes too.
        compute_dtype: the model's ("bfloat16"): `grad_groups` adds the
            groups' gradients in it (None: float32).

    Returns:
        The workload, with its knobs: `microbatches` (the divisors of the
        batch up to `MICROBATCHES_MAX`; `_train.accumulate_gradients`), `remat`, and
        `grad_groups` (how many groups of each microbatch keep their
        gradients apart until the last one: the divisors of the rows of the
        largest accumulated microbatch; a combination whose microbatch it
        does not divide is refused when its step is built).
    """

    def layout(params: dict) -> dict:
        if stacked and "layers" in params:
            params = {**params, "layers": _params.stack_layers(params["layers"])}
        return params

    def abstract() -> tuple[dict, dict]:
        params = layout(_params.abstract(param_spec))
        state = {"params": params, "opt": _train.init_opt_state(params)}
        return state, dict(batch_shapes)

    def init(seed: int) -> tuple[dict, dict]:
        if abstract_only:
            gib = 3 * n_params * 4 / 2**30
            raise ValueError(
                f"workload {name!r} is abstract-only: init() would allocate {n_params:,} "
                f"parameters plus Adam moments (~{gib:,.0f} GiB of float32); use abstract() "
                "to plan for it, or a 'tiny'/'small' preset to run a step")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"{name}: init seed must be an int >= 0, got seed={seed!r}")
        _check_host_memory(name, n_params, abstract())
        rng = np.random.default_rng(int(seed))
        params = layout(_params.materialize(param_spec, rng))
        state = {"params": params, "opt": _train.init_opt_state(params)}
        batch = make_batch(rng)
        # One transfer per leaf at the end; numpy did all the drawing.
        return jax.tree_util.tree_map(jnp.asarray, (state, batch))

    batch = dims.get("batch", 1)
    choices: dict[str, tuple[Any, ...]] = {
        MICROBATCHES: tuple(k for k in range(1, MICROBATCHES_MAX + 1) if batch % k == 0)}
    if remat is not None:
        own, loss_for = remat
        choices["remat"] = (own, *(p for p in REMAT_CHOICES if p != own))
    if len(choices[MICROBATCHES]) > 1:
        # Every count the rows of the largest accumulated microbatch split
        # into evenly; a search keeps those that are the device count of a
        # group of its mesh's axes.
        rows = batch // choices[MICROBATCHES][1]
        choices[GRAD_GROUPS] = (1, *(g for g in range(2, rows + 1) if rows % g == 0))

    def make_step(microbatches: int = 1, remat: str | None = None,
                  grad_groups: int = 1) -> StepFn:
        if grad_groups > 1 and (batch // max(microbatches, 1)) % grad_groups:
            raise ValueError(f"{name}: grad_groups={grad_groups} does not divide a microbatch "
                             f"of {batch // max(microbatches, 1)} rows (batch {batch}, "
                             f"microbatches={microbatches}); pick a divisor of it")
        loss = loss_fn if remat is None or remat == choices["remat"][0] else loss_for(remat)
        step = _train.make_train_step(loss, adam, microbatches, grad_groups,
                                      None if compute_dtype in (None, "float32") else
                                      jnp.dtype(compute_dtype))
        if grad_groups == 1 or activation_sharding is None:
            return step

        def pinned(state: dict, batch: dict) -> tuple[dict, dict]:
            with _activations.placed(activation_sharding):
                return step(state, batch)

        return pinned

    return Workload(
        name=name,
        step=_train.make_train_step(loss_fn, adam),
        init=init,
        abstract=abstract,
        flops_per_step=flops_per_step,
        n_params=n_params,
        stacked=stacked,
        dims=dims,
        knobs=Knobs(make_step, choices),
    )


# The step knobs every built-in workload offers (`Workload.knobs`): gradient
# accumulation over microbatches, every count up to this one that divides the
# batch (a batch of 1536 rows: 1, 2, 3, 4, 6, 8; of a power of two: 1, 2, 4,
# 8), and for models with blocks the remat policy: "none" keeps every
# activation, "selective" and "full" as `_layers.REMAT_POLICIES`.
MICROBATCHES_MAX = 8
REMAT_CHOICES = ("none", "selective", "full")


def remat_name(remat: bool | str) -> str:
    """A config's `remat` (False, True, "full", "selective") as a knob value."""
    return {False: "none", True: "full"}.get(remat, remat)  # type: ignore[call-overload]


def token_batch(batch: int, seq: int, vocab: int) -> tuple[dict, Callable]:
    """Shapes and sampler of a next-token batch `{"tokens", "targets"}`.

    Targets are the tokens shifted by one, drawn as one `[batch, seq + 1]`
    sequence, so a model can learn something from a single batch.

    Returns:
        `(batch_shapes, make_batch)` for `assemble`.
    """
    shapes = {
        "tokens": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
        "targets": jax.ShapeDtypeStruct((batch, seq), jnp.int32),
    }

    def make_batch(rng: np.random.Generator) -> dict:
        seqs = rng.integers(0, vocab, size=(batch, seq + 1), dtype=np.int32)
        return {"tokens": seqs[:, :-1], "targets": seqs[:, 1:]}

    return shapes, make_batch


def check_positive(owner: str, **sizes: int) -> None:
    """Raises ValueError naming every size that is not a positive int."""
    bad = [f"{k}={v!r}" for k, v in sizes.items()
           if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
    if bad:
        raise ValueError(f"{owner}: sizes must be positive ints, got {', '.join(bad)}")


def check_divides(owner: str, what: str, n: int, by_name: str, by: int) -> None:
    """Raises ValueError when `by` does not divide `n`."""
    if n % by:
        raise ValueError(
            f"{owner}: {what}={n} must be divisible by {by_name}={by}; "
            f"pick {what} as a multiple of {by_name} (e.g. {math.ceil(n / by) * by})")


def token_workload(name: str, cfg: Any, param_spec: dict, loss_fn: Callable[..., Any],
                   n_params: int, flops_per_step: float, dims: Mapping[str, int]) -> Workload:
    """A language-model `Workload`: `[batch, seq]` token inputs and targets, Adam.

    `cfg` provides `batch`, `seq`, `vocab`, `learning_rate`, `stacked` and
    `abstract_only`; `loss_fn(cfg, params, batch)` the model's loss.
    """
    shapes, make_batch = token_batch(cfg.batch, cfg.seq, cfg.vocab)

    def loss_for(policy: str) -> _train.LossFn:
        changed = dataclasses.replace(cfg, remat=False if policy == "none" else policy)
        return lambda params, batch: loss_fn(changed, params, batch)

    return assemble(
        name=name, param_spec=param_spec, batch_shapes=shapes, make_batch=make_batch,
        loss_fn=lambda params, batch: loss_fn(cfg, params, batch),
        adam=_train.Adam(cfg.learning_rate), flops_per_step=flops_per_step,
        n_params=n_params, stacked=cfg.stacked, abstract_only=cfg.abstract_only, dims=dims,
        remat=(remat_name(cfg.remat), loss_for),
        activation_sharding=getattr(cfg, "activation_sharding", None),
        compute_dtype=getattr(cfg, "compute_dtype", None))
