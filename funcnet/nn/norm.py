"""Normalization layers, as torch.nn's: LayerNorm, GroupNorm, BatchNorm1d/2d, SyncBatchNorm.

LayerNorm and GroupNorm have no state. BatchNorm keeps torch's buffers as state
(``running_mean``, ``running_var``, ``num_batches_tracked``): ``apply(params, x, state=,
train=)`` returns ``(y, new_state)``; train mode normalizes with the batch statistics and
advances the running ones, eval mode reads them and returns the state unchanged.

Mixed precision: a bfloat16/float16 input is normalized in float32 (mean, variance and the
affine transform) and the result is cast back to the input's dtype, as torch's autocast
runs these ops in float32; running statistics keep their own dtype (float32 by default).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

from funcnet.nn.module import Module, check_params, describe, require_state

__all__ = ["LayerNorm"]


def _compute_dtype(dtype) -> jnp.dtype:
    # float16/bfloat16 statistics in float32 (torch autocast's float32 list); float64 stays float64.
    return jnp.promote_types(dtype, jnp.float32)


def _check_floating(x, where: str):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{where}: input has dtype {x.dtype}, expected a floating dtype; cast it "
                        f"(x.astype(jnp.float32))")
    return x


def _check_eps(eps, where: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0 or math.isinf(eps):
        raise ValueError(f"{where}: eps must be a finite float >= 0, got {eps!r}")
    return float(eps)


def _check_positive_int(value, name: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {name} must be a positive int, got {value!r}")
    return value


def _affine(xhat, params, shape, cdt):
    # weight/bias broadcast as `shape` (trailing-aligned for LayerNorm, (C, 1, ...) for the others)
    if "weight" in params:
        xhat = xhat * params["weight"].astype(cdt).reshape(shape)
    if "bias" in params:
        xhat = xhat + params["bias"].astype(cdt).reshape(shape)
    return xhat


def LayerNorm(normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
              bias: bool = True, *, dtype=jnp.float32) -> Module:
    """Normalize over the trailing ``normalized_shape`` axes, as torch.nn.LayerNorm.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and the biased variance
    over the last ``len(normalized_shape)`` axes of each example. params: ``{"weight": ones,
    "bias": zeros}`` of shape ``normalized_shape`` (no ``bias`` when ``bias=False``, none at
    all when ``elementwise_affine=False``, as torch). x: ``(..., *normalized_shape)``, same
    shape out.
    """
    where = "LayerNorm"
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ValueError(f"{where}: normalized_shape must be a positive int or a non-empty tuple of positive "
                         f"ints (the trailing axes to normalize), got {normalized_shape!r}")
    eps = _check_eps(eps, where)
    has_bias = bool(elementwise_affine and bias)
    name = f"LayerNorm({shape}, eps={eps}, elementwise_affine={elementwise_affine}, bias={has_bias})"
    axes = tuple(range(-len(shape), 0))

    def init(key):
        del key
        params = {}
        if elementwise_affine:
            params["weight"] = jnp.ones(shape, dtype)
            if has_bias:
                params["bias"] = jnp.zeros(shape, dtype)
        return params

    expected = (["weight"] if elementwise_affine else []) + (["bias"] if has_bias else [])

    def apply(params, x, *, key=None, train=False):
        del key, train
        check_params(params, expected, name)
        x = _check_floating(x, name)
        if x.shape[x.ndim - len(shape):] != shape or x.ndim < len(shape):
            raise ValueError(f"{name}: input of shape {tuple(x.shape)} does not end in normalized_shape "
                             f"{shape}; pass (..., {', '.join(map(str, shape))}) or build the layer with "
                             f"normalized_shape={tuple(x.shape[-len(shape):])}")
        cdt = _compute_dtype(x.dtype)
        h = x.astype(cdt)
        mean = jnp.mean(h, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(h - mean), axis=axes, keepdims=True)
        y = (h - mean) * jax.lax.rsqrt(var + eps)
        return _affine(y, params, shape, cdt).astype(x.dtype)

    return Module(init, apply, name=name)
