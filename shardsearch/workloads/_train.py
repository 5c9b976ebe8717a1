"""The training step every built-in workload shares: loss, gradients, Adam.

Adam is written by hand (no optax) so the optimizer state is a plain dict
whose moment trees mirror the parameters: `opt/mu/<param path>` and
`opt/nu/<param path>`, which lets one path pattern shard a parameter and its
moments alike.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..base import activations as _activations

LossFn = Callable[[Any, dict], tuple[jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class Adam:
    """Adam hyper-parameters (Kingma & Ba, no weight decay).

    Args:
        learning_rate: step size.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the root of the second moment.
    """

    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"Adam learning_rate must be > 0, got {self.learning_rate=}")
        for name in ("b1", "b2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"Adam {name} must be in [0, 1), got {name}={value!r}")
        if not self.eps > 0:
            raise ValueError(f"Adam eps must be > 0, got {self.eps=}")


def init_opt_state(params: Any) -> dict:
    """Adam state for concrete (numpy) or abstract parameters.

    Returns:
        `{"mu": zeros like params, "nu": zeros like params, "count": int32 0}`,
        as numpy arrays for numpy params and `ShapeDtypeStruct`s for abstract
        ones.
    """

    def zeros(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype)
        return np.zeros(x.shape, x.dtype)

    abstract = isinstance(jax.tree_util.tree_leaves(params)[0], jax.ShapeDtypeStruct)
    count = jax.ShapeDtypeStruct((), jnp.int32) if abstract else np.zeros((), np.int32)
    return {
        "mu": jax.tree_util.tree_map(zeros, params),
        "nu": jax.tree_util.tree_map(zeros, params),
        "count": count,
    }


def adam_update(adam: Adam, params: Any, grads: Any, opt: dict) -> tuple[Any, dict]:
    """One Adam step with bias correction.

    Returns:
        `(new_params, new_opt)` with the same structure as the inputs.
    """
    count = opt["count"] + 1
    t = count.astype(jnp.float32)
    mu = jax.tree_util.tree_map(lambda m, g: adam.b1 * m + (1 - adam.b1) * g, opt["mu"], grads)
    nu = jax.tree_util.tree_map(
        lambda v, g: adam.b2 * v + (1 - adam.b2) * jnp.square(g), opt["nu"], grads)
    mu_scale = 1.0 / (1.0 - adam.b1**t)
    nu_scale = 1.0 / (1.0 - adam.b2**t)

    def update(p, m, v):
        return p - adam.learning_rate * (m * mu_scale) / (jnp.sqrt(v * nu_scale) + adam.eps)

    params = jax.tree_util.tree_map(update, params, mu, nu)
    return params, {"mu": mu, "nu": nu, "count": count}


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over all positions, in float32.

    The target logit is picked with a one-hot product rather than a gather:
    with the class dim sharded (vocab-parallel head) that stays a local
    multiply plus one reduction instead of a sharded gather.

    Args:
        logits: `[..., classes]` scores.
        targets: `[...]` int class ids.

    Returns:
        A float32 scalar.
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.sum(logits * jax.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype), -1)
    return jnp.mean(log_z - picked)


def token_cross_entropy(hidden: jax.Array, head: jax.Array, targets: jax.Array,
                        chunk: int | None = None) -> jax.Array:
    """`cross_entropy(hidden @ head, targets)`, optionally over blocks of positions.

    With `chunk`, the positions are taken `chunk` at a time under a
    rematerialised `lax.scan`: a block's logits are made, reduced to its
    loss and dropped, and made again in the backward pass. The float32
    logits over a large vocabulary (`[batch, seq, vocab]`, several copies
    live in the loss and its gradient) are then one block at a time, which
    is what lets a long-sequence step with a 32k vocabulary fit a 32 GiB
    chip. The loss is the same; the head's matmul runs once more.

    Args:
        hidden: `[batch, seq, width]` final hidden states.
        head: `[width, vocab]` output projection.
        targets: `[batch, seq]` int class ids.
        chunk: positions per block, dividing seq; None: all at once.

    Returns:
        A float32 scalar, the mean over all positions.
    """
    b, s, d = hidden.shape
    if chunk is None or chunk >= s:
        return cross_entropy(hidden @ head, targets)
    if s % chunk:
        raise ValueError(f"token_cross_entropy: chunk={chunk} does not divide seq={s}")
    blocks = hidden.reshape(b, s // chunk, chunk, d).swapaxes(0, 1)
    block_targets = targets.reshape(b, s // chunk, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def block(total: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        h, t = xs
        return total + cross_entropy(h @ head, t) * (b * chunk), None

    total, _ = jax.lax.scan(block, jnp.zeros((), jnp.float32), (blocks, block_targets))
    return total / (b * s)


def make_train_step(loss_fn: LossFn, adam: Adam, microbatches: int = 1, grad_groups: int = 1,
                    reduce_dtype: Any = None) -> Callable[[dict, dict], tuple[dict, dict]]:
    """Builds `step(state, batch) -> (state, metrics)` around a loss.

    Args:
        loss_fn: `loss_fn(params, batch) -> (loss, extra_metrics)`, where
            `loss` is the float32 scalar being minimised (a mean over the
            batch).
        adam: optimizer hyper-parameters.
        microbatches: accumulate the gradient over this many slices of the
            batch (`accumulate_gradients`), one Adam update at the end: the
            same update on the same global batch, with the activations of
            one slice alive at a time. 1: the whole batch at once.
        grad_groups: keep the gradients of this many groups of each slice
            apart and add them up once, after the last slice
            (`accumulate_gradients`); with one group per device the batch is
            split over, the data-parallel reduction runs once per step
            instead of once per slice. Only with `microbatches` > 1.
        reduce_dtype: the dtype the groups' gradients are added in (None:
            float32); the model's compute dtype moves what a per-slice
            reduction of its gradients would (bfloat16: half of float32).

    Returns:
        An un-jitted step. `state` is `{"params": ..., "opt": {"mu", "nu",
        "count"}}`; `metrics` is `{"loss": loss, **extra_metrics}`, computed
        on the parameters before the update.
    """
    for name, value in (("microbatches", microbatches), ("grad_groups", grad_groups)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"make_train_step: {name} must be an int >= 1, got {value!r}")
    if grad_groups > 1 and microbatches == 1:
        raise ValueError(f"make_train_step: grad_groups={grad_groups} keeps the gradients "
                         "of the microbatches' groups apart, but microbatches=1 accumulates "
                         "nothing; pass microbatches > 1 or grad_groups=1")
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state: dict, batch: dict) -> tuple[dict, dict]:
        if microbatches == 1:
            (loss, extra), grads = grad_fn(state["params"], batch)
        else:
            (loss, extra), grads = accumulate_gradients(grad_fn, state["params"], batch,
                                                        microbatches, grad_groups, reduce_dtype)
        params, opt = adam_update(adam, state["params"], grads, state["opt"])
        return {"params": params, "opt": opt}, {"loss": loss, **extra}

    return step


def accumulate_gradients(grad_fn: Callable[[Any, Any], tuple[tuple[jax.Array, dict], Any]],
                         params: Any, batch: Any, k: int, groups: int = 1,
                         reduce_dtype: Any = None) -> tuple[tuple[jax.Array, dict], Any]:
    """`grad_fn(params, batch)` as the mean over `k` equal slices of the batch.

    Slice `j` takes rows `j, j + k, j + 2k, ...` of every batch leaf (a
    `[B, ...]` leaf is viewed as `[B/k, k, ...]`), so a batch split over
    data-parallel devices in contiguous blocks gives every device its share
    of every slice and nothing moves between devices. The slices run one at a
    time under `lax.scan`, summing the gradients in float32; the mean loss,
    gradient and extra metrics are those of the whole batch when the loss is
    a mean over it (to rounding).

    With `groups` > 1 each slice is cut again into `groups` contiguous blocks
    of rows, and `grad_fn` runs on each block apart (`jax.vmap`): the sum
    carried from slice to slice holds one gradient per block, `[groups,
    *param.shape]`, and the blocks are added once, after the scan. When the
    blocks are the devices' shares of the batch (groups = the devices the
    batch dim is split over), no device needs another's gradient until then,
    so the reduction over the batch axes (an all-reduce, or a reduce-scatter
    for sharded parameters) runs once per step, not once per slice. The
    price: each device holds its block's whole float32 gradient until then,
    also where XLA would have reduce-scattered each slice's gradient into a
    sum split over those axes (parameters split over them, FSDP, or an
    optimizer state split over them, ZeRO-2: 17-20 GiB per GPU more on the
    16B and 32B Megatron rows, `benchmarks/results/knobs/grad-groups.md`). The
    groups' gradients are added in `reduce_dtype` (float32 when None): the
    one reduction moves those bytes, so a bfloat16 model's, reduced in
    bfloat16 as XLA reduces its per-slice gradients, moves half.

    Raises:
        ValueError: a batch leaf's leading dim is not divisible by `k`, or a
            slice's by `groups`.
    """
    def split(x: jax.Array) -> jax.Array:
        if x.ndim == 0 or x.shape[0] % k:
            raise ValueError(f"microbatches={k} must divide every batch leaf's leading dim; "
                             f"got a leaf of shape {tuple(x.shape)}")
        if (x.shape[0] // k) % groups:
            raise ValueError(f"grad_groups={groups} must divide every microbatch's rows; got "
                             f"{x.shape[0] // k} (a leaf of shape {tuple(x.shape)}, "
                             f"microbatches={k})")
        x = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
        return x if groups == 1 else x.reshape(k, groups, -1, *x.shape[2:])

    slices = jax.tree_util.tree_map(split, batch)
    each = grad_fn
    if groups > 1:
        # The groups take the axes the step's rules put its batch dims on (a
        # searched `act_batch`, a model's `activation_sharding`); inside, each
        # group's own rows are left to XLA, not put on those axes again.
        mapped = jax.vmap(grad_fn, in_axes=(None, 0),
                          spmd_axis_name=_activations.placed_on("batch") or None)

        def each(params: Any, piece: Any) -> Any:
            with _activations.released("batch"):
                return mapped(params, piece)

    def wide(tree: Any) -> Any:
        """Kept-apart sums in float32, their groups where the batch's rule puts
        the batch (the sums of one group, as `grad_groups=1` carries them)."""
        if groups == 1:
            return tree
        return jax.tree_util.tree_map(lambda x: _activations.activation(
            x.astype(jnp.float32), ("batch", *[P.UNCONSTRAINED] * (x.ndim - 1))), tree)

    def one(carry: tuple, piece: Any) -> tuple[tuple, None]:
        total, loss_sum, extra_sum = carry
        (loss, extra), grads = each(params, piece)
        add = functools.partial(jax.tree_util.tree_map, lambda t, g: t + g.astype(jnp.float32))
        return (wide(add(total, grads)), loss_sum + loss.astype(jnp.float32),
                add(extra_sum, extra)), None

    (_, extra_shape), _ = jax.eval_shape(
        each, params, jax.tree_util.tree_map(lambda x: x[0], slices))
    lead = () if groups == 1 else (groups,)
    # The kept-apart sums start placed like the sums they carry (unplaced,
    # the GPU compiler folded a 7B model's [groups, *param] zeros into one
    # host literal and failed).
    start = (wide(jax.tree_util.tree_map(lambda p: jnp.zeros((*lead, *p.shape), jnp.float32),
                                         params)),
             jnp.zeros(lead, jnp.float32),
             wide(jax.tree_util.tree_map(lambda e: jnp.zeros(e.shape, jnp.float32),
                                         extra_shape)))
    (total, loss_sum, extra_sum), _ = jax.lax.scan(one, start, slices)
    n = k * groups

    def mean(total: jax.Array, like: Any) -> jax.Array:
        """A sum over the slices (and the groups) as the mean, in `like`'s dtype."""
        return ((total.sum(0) if groups > 1 else total) / n).astype(like.dtype)

    def reduced(total: jax.Array, like: Any) -> jax.Array:
        """The gradient's sum over the groups (the one reduction), in `reduce_dtype`."""
        if groups == 1 or reduce_dtype is None:
            return mean(total, like)
        return (total.astype(reduce_dtype).sum(0, dtype=reduce_dtype).astype(jnp.float32)
                / n).astype(like.dtype)

    grads = jax.tree_util.tree_map(reduced, total, params)
    extra = jax.tree_util.tree_map(mean, extra_sum, extra_shape)
    return (mean(loss_sum, loss_sum), extra), grads
