"""Three-layer MLP classifier workload.

`x -> relu(x @ w1 + b1) -> relu(. @ w2 + b2) -> . @ w3 + b3 -> logits`,
softmax cross-entropy against integer labels, Adam. The batch is
`{"x": float32[batch, d_in], "y": int32[batch]}`.

Parameter paths:

    params/w1 [d_in, d_hidden]      params/b1 [d_hidden]
    params/w2 [d_hidden, d_hidden]  params/b2 [d_hidden]
    params/w3 [d_hidden, n_classes] params/b3 [n_classes]
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import _train, _workload
from ._params import Param


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """Sizes and training settings of an MLP workload.

    Args:
        batch: global batch (examples per step).
        d_in: input features.
        d_hidden: width of both hidden layers.
        n_classes: output classes.
        learning_rate: Adam step size.
    """

    batch: int
    d_in: int
    d_hidden: int
    n_classes: int
    learning_rate: float = 1e-3

    def __post_init__(self):
        _workload.check_positive("MLPConfig", batch=self.batch, d_in=self.d_in,
                                 d_hidden=self.d_hidden, n_classes=self.n_classes)


def param_spec(cfg: MLPConfig) -> dict:
    """The parameter tree as `Param`s (He-style std for the ReLU layers)."""
    i, h, c = cfg.d_in, cfg.d_hidden, cfg.n_classes
    return {
        "w1": Param((i, h), std=math.sqrt(2.0 / i)), "b1": Param((h,), "zeros"),
        "w2": Param((h, h), std=math.sqrt(2.0 / h)), "b2": Param((h,), "zeros"),
        "w3": Param((h, c), std=math.sqrt(1.0 / h)), "b3": Param((c,), "zeros"),
    }


def n_params(cfg: MLPConfig) -> int:
    """`d_in*h + h*h + h*classes` weights plus `2*h + classes` biases."""
    i, h, c = cfg.d_in, cfg.d_hidden, cfg.n_classes
    return i * h + h * h + h * c + 2 * h + c


def flops_per_step(cfg: MLPConfig) -> float:
    """`6 * batch * (d_in*h + h*h + h*classes)`: 2 flops per multiply-add in
    the forward pass, twice that in the backward pass."""
    i, h, c = cfg.d_in, cfg.d_hidden, cfg.n_classes
    return float(6 * cfg.batch * (i * h + h * h + h * c))


def loss_fn(params: dict, batch: dict) -> tuple[jax.Array, dict]:
    """Softmax cross-entropy of the logits against `batch["y"]`."""
    h = jax.nn.relu(batch["x"] @ params["w1"] + params["b1"])
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    return _train.cross_entropy(h @ params["w3"] + params["b3"], batch["y"]), {}


def build(name: str, cfg: MLPConfig) -> _workload.Workload:
    """The `Workload` for one MLP configuration."""
    shapes = {"x": jax.ShapeDtypeStruct((cfg.batch, cfg.d_in), jnp.float32),
              "y": jax.ShapeDtypeStruct((cfg.batch,), jnp.int32)}

    def make_batch(rng: np.random.Generator) -> dict:
        return {"x": rng.standard_normal((cfg.batch, cfg.d_in), dtype=np.float32),
                "y": rng.integers(0, cfg.n_classes, size=(cfg.batch,), dtype=np.int32)}

    return _workload.assemble(
        name=name, param_spec=param_spec(cfg), batch_shapes=shapes, make_batch=make_batch,
        loss_fn=loss_fn, adam=_train.Adam(cfg.learning_rate),
        flops_per_step=flops_per_step(cfg), n_params=n_params(cfg), stacked=False,
        abstract_only=False,
        dims={"batch": cfg.batch, "d_in": cfg.d_in, "d_hidden": cfg.d_hidden,
              "n_classes": cfg.n_classes})
