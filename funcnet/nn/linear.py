"""Linear and the reshaping layers (Flatten), as torch.nn's."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from funcnet import init as _init
from funcnet.nn.activation import _no_params
from funcnet.nn.module import Module

__all__ = ["Linear", "Flatten"]


def Linear(
    in_features: int,
    out_features: int,
    bias: bool = True,
    *,
    weight_init: Callable = _init.linear_weight,
    bias_init: Callable | None = None,
    dtype=jnp.float32,
) -> Module:
    """y = x @ weight.T + bias, as torch.nn.Linear.

    params: ``{"weight": (out, in), "bias": (out,)}``; x: ``(..., in)`` -> ``(..., out)``.
    Default init is torch's (``init.linear_weight`` / ``init.linear_bias``).
    """
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"Linear: {name} must be a positive int, got {value!r}")

    def init_fn(key):
        wkey, bkey = jax.random.split(key)
        params = {"weight": weight_init(wkey, (out_features, in_features), dtype)}
        if bias:
            if bias_init is None:
                params["bias"] = _init.linear_bias(bkey, (out_features,), dtype, fan_in=in_features)
            else:
                params["bias"] = bias_init(bkey, (out_features,), dtype)
        return params

    def apply(params, x, *, key=None, train=False):
        del key, train
        x = jnp.asarray(x)
        if x.ndim == 0 or x.shape[-1] != in_features:
            raise ValueError(
                f"Linear({in_features}, {out_features}): input of shape {tuple(x.shape)} has "
                f"{x.shape[-1] if x.ndim else 'no'} features in its last axis, expected {in_features}; "
                f"reshape the input to (..., {in_features}) (nn.Flatten() flattens images)"
            )
        y = x @ params["weight"].T
        if "bias" in params:
            y = y + params["bias"]
        return y

    return Module(init_fn, apply, name=f"Linear(in_features={in_features}, out_features={out_features}, "
                                       f"bias={bias})")


def Flatten(start_dim: int = 1, end_dim: int = -1) -> Module:
    """Flatten axes ``start_dim..end_dim`` into one, as torch.nn.Flatten."""

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = jnp.asarray(x)
        start = start_dim % x.ndim
        end = end_dim % x.ndim
        if start > end:
            raise ValueError(
                f"Flatten(start_dim={start_dim}, end_dim={end_dim}) is empty for input of shape {x.shape}"
            )
        return x.reshape(x.shape[:start] + (-1,) + x.shape[end + 1:])

    return Module(_no_params, apply, name=f"Flatten(start_dim={start_dim}, end_dim={end_dim})")
