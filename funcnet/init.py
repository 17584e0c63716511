"""Initializers as pure functions of a PRNG key, with torch's formulas.

Every initializer has the signature ``init(key, shape, dtype=jnp.float32) -> array``
(extra hyperparameters are keyword-only, bind them with ``functools.partial``).
Fans follow ``torch.nn.init._calculate_fan_in_and_fan_out``: for a weight of
shape ``(out, in, *kernel)``, ``fan_in = in * prod(kernel)`` and
``fan_out = out * prod(kernel)``.

torch counterpart: ``torch.nn.init.xavier_uniform_(w)`` fills ``w`` in place from
the global generator; here ``w = xavier_uniform(key, w_shape)`` is a new array
and the key says exactly where the randomness comes from.

Examples:
    >>> import jax
    >>> from funcnet import init
    >>> w = init.kaiming_uniform(jax.random.key(0), (64, 32))
    >>> w.shape, bool(abs(w).max() <= (6 / 32) ** 0.5)  # bound gain * sqrt(3 / fan_in), gain sqrt(2)
    ((64, 32), True)
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

__all__ = [
    "calculate_gain",
    "fans",
    "uniform",
    "normal",
    "zeros",
    "ones",
    "xavier_uniform",
    "xavier_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "linear_weight",
    "linear_bias",
]

_NONLINEARITIES = ("linear", "identity", "sigmoid", "tanh", "relu", "leaky_relu", "selu")


def calculate_gain(nonlinearity: str = "leaky_relu", param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (torch.nn.init.calculate_gain)."""
    if nonlinearity in ("linear", "identity", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1.0 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4.0
    raise ValueError(
        f"calculate_gain: unknown nonlinearity {nonlinearity!r}; expected one of {_NONLINEARITIES}"
    )


def fans(shape: Sequence[int]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out as torch lays it out: (out, in, *kernel)."""
    shape = tuple(shape)
    if len(shape) < 2:
        raise ValueError(
            f"fan in and fan out need a weight of at least 2 dimensions (out, in, ...), got shape {shape}"
        )
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _fan(shape: Sequence[int], mode: str) -> int:
    fan_in, fan_out = fans(shape)
    if mode == "fan_in":
        return fan_in
    if mode == "fan_out":
        return fan_out
    raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")


def uniform(key, shape, dtype=jnp.float32, *, low: float = 0.0, high: float = 1.0):
    """U(low, high), as torch.nn.init.uniform_."""
    return jax.random.uniform(key, tuple(shape), dtype, minval=low, maxval=high)


def normal(key, shape, dtype=jnp.float32, *, mean: float = 0.0, std: float = 1.0):
    """N(mean, std**2), as torch.nn.init.normal_."""
    return mean + std * jax.random.normal(key, tuple(shape), dtype)


def zeros(key, shape, dtype=jnp.float32):
    """All zeros of ``shape`` and ``dtype`` (torch.nn.init.zeros_); ``key`` is unused."""
    del key
    return jnp.zeros(tuple(shape), dtype)


def ones(key, shape, dtype=jnp.float32):
    """All ones of ``shape`` and ``dtype`` (torch.nn.init.ones_); ``key`` is unused."""
    del key
    return jnp.ones(tuple(shape), dtype)


def xavier_uniform(key, shape, dtype=jnp.float32, *, gain: float = 1.0):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    fan_in, fan_out = fans(shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform(key, shape, dtype, low=-bound, high=bound)


def xavier_normal(key, shape, dtype=jnp.float32, *, gain: float = 1.0):
    """N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = fans(shape)
    return normal(key, shape, dtype, std=gain * math.sqrt(2.0 / (fan_in + fan_out)))


def kaiming_uniform(
    key, shape, dtype=jnp.float32, *, a: float = 0.0, mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
):
    """U(-b, b) with b = gain * sqrt(3 / fan) (He et al., 2015), as torch.nn.init.kaiming_uniform_."""
    gain = calculate_gain(nonlinearity, a)
    bound = gain * math.sqrt(3.0 / _fan(shape, mode))
    return uniform(key, shape, dtype, low=-bound, high=bound)


def kaiming_normal(
    key, shape, dtype=jnp.float32, *, a: float = 0.0, mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
):
    """N(0, std**2) with std = gain / sqrt(fan), as torch.nn.init.kaiming_normal_."""
    gain = calculate_gain(nonlinearity, a)
    return normal(key, shape, dtype, std=gain / math.sqrt(_fan(shape, mode)))


def linear_weight(key, shape, dtype=jnp.float32):
    """torch.nn.Linear's default weight init: kaiming_uniform with a=sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))."""
    return kaiming_uniform(key, shape, dtype, a=math.sqrt(5.0))


def linear_bias(key, shape, dtype=jnp.float32, *, fan_in: int):
    """torch.nn.Linear's default bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return uniform(key, shape, dtype, low=-bound, high=bound)
