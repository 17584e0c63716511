"""Linear and the reshaping layers (Flatten, Unflatten), as torch.nn's.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> layer = nn.Linear(4, 2)
    >>> params = layer.init(jax.random.key(0))
    >>> {k: v.shape for k, v in params.items()}, layer.apply(params, jnp.ones((3, 4))).shape
    ({'weight': (2, 4), 'bias': (2,)}, (3, 2))
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from funcnet import init as _init
from funcnet.nn.activation import _no_params
from funcnet.nn.functional._common import float_dtype
from funcnet.nn.functional.linear import _linear
from funcnet.nn.module import Module

__all__ = ["Linear", "Flatten", "Unflatten"]


def Linear(
    in_features: int,
    out_features: int,
    bias: bool = True,
    *,
    weight_init: Callable = _init.linear_weight,
    bias_init: Callable | None = None,
    dtype=None,
) -> Module:
    """y = x @ weight.T + bias, as torch.nn.Linear.

    params: ``{"weight": (out, in), "bias": (out,)}``; x: ``(..., in)`` -> ``(..., out)``.
    Default init is torch's (``init.linear_weight`` / ``init.linear_bias``); ``dtype`` of the
    params defaults to JAX's default float (float64 under x64).
    """
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"Linear: {name} must be a positive int, got {value!r}")

    def init_fn(key):
        dt = float_dtype(dtype)
        wkey, bkey = jax.random.split(key)
        params = {"weight": weight_init(wkey, (out_features, in_features), dt)}
        if bias:
            if bias_init is None:
                params["bias"] = _init.linear_bias(bkey, (out_features,), dt, fan_in=in_features)
            else:
                params["bias"] = bias_init(bkey, (out_features,), dt)
        return params

    name = f"Linear(in_features={in_features}, out_features={out_features}, bias={bias})"

    def apply(params, x, *, key=None, train=False):
        del key, train
        return _linear(x, params["weight"], params.get("bias"), f"Linear({in_features}, {out_features})",
                       " (nn.Flatten() flattens images)")

    return Module(init_fn, apply, name=name)


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


def Unflatten(dim: int, unflattened_size) -> Module:
    """Split axis ``dim`` into ``unflattened_size``, as torch.nn.Unflatten (``x.unflatten``):
    ``(*, S, *)`` -> ``(*, U_1, ..., U_n, *)`` with ``prod(U) == S``; one entry may be -1
    (inferred), as torch allows.
    """
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"Unflatten: dim must be an int, got {dim!r}")
    if not isinstance(unflattened_size, (tuple, list)):
        raise TypeError(f"Unflatten: unflattened_size must be a tuple or list of ints, got "
                        f"{type(unflattened_size).__name__} {unflattened_size!r}")
    for i, u in enumerate(unflattened_size):
        if isinstance(u, bool) or not isinstance(u, int) or (u < 0 and u != -1):
            raise TypeError(f"Unflatten: unflattened_size must hold non-negative ints (one may be -1), got "
                            f"{u!r} at position {i} of {unflattened_size!r}")
    if list(unflattened_size).count(-1) > 1:
        raise ValueError(f"Unflatten: at most one entry of unflattened_size may be -1, got {unflattened_size!r}")
    sizes = tuple(unflattened_size)
    where = f"Unflatten(dim={dim}, unflattened_size={unflattened_size})"

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = jnp.asarray(x)
        if not -x.ndim <= dim < x.ndim:
            raise ValueError(f"{where}: input of shape {tuple(x.shape)} has no dimension {dim}, expected dim in "
                             f"[{-x.ndim}, {x.ndim - 1}]")
        axis = dim % x.ndim
        size = x.shape[axis]
        known = math.prod(u for u in sizes if u != -1)
        new = sizes
        if -1 in sizes:
            if known == 0 or size % known:
                raise ValueError(f"{where}: dimension {dim} of input shape {tuple(x.shape)} has size {size}, "
                                 f"which is not a multiple of {known}")
            new = tuple(size // known if u == -1 else u for u in sizes)
        elif known != size:
            raise ValueError(f"{where}: dimension {dim} of input shape {tuple(x.shape)} has size {size}, but "
                             f"the sizes {sizes} multiply to {known}; they must multiply to {size}")
        return x.reshape(x.shape[:axis] + new + x.shape[axis + 1:])

    return Module(_no_params, apply, name=where)
