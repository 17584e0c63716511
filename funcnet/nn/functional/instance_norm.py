"""Instance and local response normalization, as torch.nn.functional's ``instance_norm`` and
``local_response_norm``.

``instance_norm`` normalizes each channel of each example over its spatial positions. torch
runs it as a batch norm of the input seen as ``(1, N*C, *)``, with the running statistics
repeated N times, then stores their mean over the batch: the running mean advances by the
batch mean of the per-instance means, the running variance by the batch mean of the
per-instance *unbiased* variances. torch mutates the buffers; here the new ones are returned.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from funcnet.nn.functional.norm import _check_eps, _check_floating, _compute_dtype

__all__ = ["instance_norm", "local_response_norm"]


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5):
    """``(N, C, *)`` normalized per example and channel, as torch.nn.functional.instance_norm.

    ``use_input_stats=True``: each instance's mean and biased variance over its spatial
    positions; with ``running_mean``/``running_var`` given, returns ``(y, new_running_mean,
    new_running_var)`` (torch updates them in place and returns ``y``). ``use_input_stats=False``:
    normalizes with the running statistics (required) and returns ``y``.
    """
    where = "instance_norm"
    x = _check_floating(input, where)
    eps = _check_eps(eps, where)
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{where}: pass both running_mean and running_var, or neither")
    if not use_input_stats and running_mean is None:
        raise ValueError(f"{where}: use_input_stats=False normalizes with the running statistics: pass "
                         f"running_mean and running_var")
    if x.ndim < 3:
        raise ValueError(f"{where}: input of shape {tuple(x.shape)} must be (N, C, *) with at least one spatial "
                         f"axis; add the batch axis of an unbatched input with x[None]")
    C = x.shape[1]
    for what, value in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                        ("bias", bias)):
        if value is not None and jnp.shape(value) != (C,):
            raise ValueError(f"{where}: {what} has shape {jnp.shape(value)}, expected ({C},) for an input with {C} "
                             f"channels in axis 1")
    cdt = _compute_dtype(x.dtype)
    h = x.astype(cdt)
    axes = tuple(range(2, x.ndim))
    bshape = (C,) + (1,) * (x.ndim - 2)
    n = math.prod(x.shape[2:])
    if use_input_stats:
        if n <= 1:
            raise ValueError(f"{where}: expected more than 1 spatial element when training, got input of shape "
                             f"{tuple(x.shape)}")
        mean = jnp.mean(h, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(h - mean), axis=axes, keepdims=True)
    else:
        mean = running_mean.astype(cdt).reshape(bshape)
        var = running_var.astype(cdt).reshape(bshape)
    y = (h - mean) * jax.lax.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.astype(cdt).reshape(bshape)
    if bias is not None:
        y = y + bias.astype(cdt).reshape(bshape)
    y = y.astype(x.dtype)
    if running_mean is None or not use_input_stats:
        return y
    batch_mean, batch_var = jax.lax.stop_gradient((jnp.mean(mean, axis=(0,) + axes),
                                                   jnp.mean(var, axis=(0,) + axes) * (n / (n - 1))))
    m = jnp.asarray(momentum, cdt)
    new_mean = ((1 - m) * running_mean.astype(cdt) + m * batch_mean).astype(running_mean.dtype)
    new_var = ((1 - m) * running_var.astype(cdt) + m * batch_var).astype(running_var.dtype)
    return y, new_mean, new_var


def local_response_norm(input, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
    """``x / (k + alpha * mean of x**2 over `size` neighbouring channels) ** beta``, as
    torch.nn.functional.local_response_norm (AlexNet's): the window over axis 1 runs from
    ``c - size//2`` to ``c + (size-1)//2``, zero outside, and always divides by ``size``."""
    where = "local_response_norm"
    x = _check_floating(input, where)
    if x.ndim < 3:
        raise ValueError(f"{where}: expected 3D or higher dimensionality input (N, C, *), got shape "
                         f"{tuple(x.shape)}")
    if x.size == 0:
        return x
    C = x.shape[1]
    sq = jnp.square(x)
    pads = [(0, 0)] * x.ndim
    pads[1] = (size // 2, (size - 1) // 2)
    sq = jnp.pad(sq, pads)
    total = None
    for j in range(size):
        tap = jax.lax.slice_in_dim(sq, j, j + C, axis=1)
        total = tap if total is None else total + tap
    div = (total / size * alpha + k) ** beta
    return x / div
