"""Normalization, as torch.nn.functional's: layer_norm, group_norm, batch_norm, the one
implementation the layers of ``funcnet.nn.norm`` call.

Mixed precision: a bfloat16/float16 input is normalized in float32 (mean, variance and the
affine transform) and the result is cast back to the input's dtype: torch's autocast runs
layer_norm and group_norm in float32, and its batch_norm kernels accumulate half inputs in
float32.

``batch_norm`` and torch's differ in one way, because JAX cannot mutate: in training mode
with running statistics torch updates ``running_mean`` and ``running_var`` in place and
returns ``y``; here they are inputs only, and the call returns ``(y, new_running_mean,
new_running_var)``. Everywhere else (eval mode, or no running statistics) it returns ``y``
as torch does.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp

__all__ = ["layer_norm", "group_norm", "batch_norm"]


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


def _affine(xhat, weight, bias, shape, cdt):
    # weight/bias (or None) broadcast as `shape` (trailing-aligned for LayerNorm, (C, 1, ...) for the others)
    if weight is not None:
        xhat = xhat * jnp.asarray(weight).astype(cdt).reshape(shape)
    if bias is not None:
        xhat = xhat + jnp.asarray(bias).astype(cdt).reshape(shape)
    return xhat


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4, 5))
def _normalize(h, weight, bias, axes, shape, eps):
    """``((h - mean) / sqrt(var + eps) * weight + bias, mean, var)``: the mean and biased variance
    over ``axes`` (two passes, as torch), ``weight``/``bias`` (or None) broadcast as ``shape``.

    Differentiated by the closed form torch's norm kernels use rather than through the two
    reductions: the tangent is ``t + xhat * (dweight - mean(xhat * t)) + dbias - mean(t)``
    with ``t = weight * rstd * dh``. That is torch's ``weight * rstd * (dh - mean(dh) - xhat *
    mean(dh * xhat))`` (+ ``dweight * xhat + dbias``; ``weight * rstd`` is constant over the
    reduced axes), written so that its transpose, the gradient, is torch's hand-written backward:
    one pass for ``sum(g)`` and ``sum(g * xhat)``, which are also the bias and weight gradients,
    and one elementwise pass ``weight * rstd * (g - mean(g) - xhat * mean(g * xhat))``. Autodiff
    of the statistics gives more of both (XLA:CPU: the ConvNet's train step 1.04-1.05x faster);
    the tangent in torch's form transposed to four reductions (``sum(weight * rstd * g)`` apart
    from ``sum(g)``, the product with ``xhat`` twice): BatchNorm2d and ReLU's gradient at
    64x64x32x32 took 33 ms against 15 this way (torch 31; ``benchmarks/batchnorm.py``).
    A ``custom_jvp`` rather than a ``custom_vjp`` keeps forward mode (``jax.jvp``, Hessians).
    The GPT's LayerNorm measured no faster this way, so LayerNorm keeps plain autodiff."""
    mean = jnp.mean(h, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=axes, keepdims=True)
    y = (h - mean) * jax.lax.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y, jnp.squeeze(mean, axes), jnp.squeeze(var, axes)


@_normalize.defjvp
def _normalize_jvp(axes, shape, eps, primals, tangents):
    (h, weight, bias), (dh, dweight, dbias) = primals, tangents
    y, mean, var = _normalize(h, weight, bias, axes, shape, eps)
    rstd = jax.lax.rsqrt(jnp.expand_dims(var, axes) + eps)
    xhat = (h - jnp.expand_dims(mean, axes)) * rstd
    t = dh * (rstd if weight is None else rstd * weight.reshape(shape))
    # one per-channel factor of xhat and one shift: their transposes are the two reductions
    # sum(g * xhat) and sum(g), shared by the input, weight and bias gradients
    c = -jnp.mean(xhat * t, axis=axes, keepdims=True)
    a = -jnp.mean(t, axis=axes, keepdims=True)
    if weight is not None:
        c = c + dweight.reshape(shape)
    if bias is not None:
        a = a + dbias.reshape(shape)
    dy = t + xhat * c + a
    # d mean = mean(dh); d var = 2 mean((h - mean) dh) = 2 mean(xhat dh) / rstd
    dmean = jnp.mean(dh, axis=axes)
    dvar = jnp.squeeze(2 * jnp.mean(dh * xhat, axis=axes, keepdims=True) / rstd, axes)
    return (y, mean, var), (dy, dmean, dvar)


def layer_norm_(x, shape, weight, bias, eps, where):
    """LayerNorm over the trailing ``shape`` axes (checked arguments)."""
    x = _check_floating(x, where)
    if x.ndim < len(shape) or x.shape[x.ndim - len(shape):] != shape:
        raise ValueError(f"{where}: input of shape {tuple(x.shape)} does not end in normalized_shape "
                         f"{shape}; pass (..., {', '.join(map(str, shape))}) or build the layer with "
                         f"normalized_shape={tuple(x.shape[-len(shape):])}")
    axes = tuple(range(-len(shape), 0))
    cdt = _compute_dtype(x.dtype)
    h = x.astype(cdt)
    mean = jnp.mean(h, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=axes, keepdims=True)
    y = (h - mean) * jax.lax.rsqrt(var + eps)
    return _affine(y, weight, bias, shape, cdt).astype(x.dtype)


def group_norm_(x, num_groups, weight, bias, eps, where, channels=None):
    """GroupNorm of ``(N, C, *)`` (checked arguments; ``channels``: the C the layer was built for)."""
    x = _check_floating(x, where)
    C = channels if channels is not None else None if weight is None else jnp.shape(weight)[0]
    if x.ndim < 2 or (C is not None and x.shape[1] != C) or x.shape[1] % num_groups:
        want = f"(N, {C}, *)" if C is not None else f"(N, C, *) with C divisible by num_groups={num_groups}"
        raise ValueError(f"{where}: input of shape {tuple(x.shape)} must be {want} with the "
                         f"channels in axis 1 (torch's layout); transpose channels-last inputs to NC...")
    cdt = _compute_dtype(x.dtype)
    h = x.astype(cdt).reshape((x.shape[0], num_groups, -1))
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=-1, keepdims=True)
    y = ((h - mean) * jax.lax.rsqrt(var + eps)).reshape(x.shape)
    return _affine(y, weight, bias, (x.shape[1],) + (1,) * (x.ndim - 2), cdt).astype(x.dtype)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalize over the trailing ``normalized_shape`` axes: ``(x - mean) / sqrt(var + eps) *
    weight + bias`` with the biased variance, torch.nn.functional.layer_norm."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ValueError(f"layer_norm: normalized_shape must be a positive int or a non-empty tuple of positive "
                         f"ints (the trailing axes to normalize), got {normalized_shape!r}")
    for what, value in (("weight", weight), ("bias", bias)):
        if value is not None and tuple(jnp.shape(value)) != shape:
            raise ValueError(f"layer_norm: {what} of shape {tuple(jnp.shape(value))} must have normalized_shape "
                             f"{shape}")
    return layer_norm_(input, shape, weight, bias, _check_eps(eps, "layer_norm"), "layer_norm")


def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
    """Normalize each example over groups of consecutive channels of ``(N, C, *)``, then scale
    and shift per channel (``weight``, ``bias``: ``(C,)``), torch.nn.functional.group_norm."""
    _check_positive_int(num_groups, "num_groups", "group_norm")
    return group_norm_(input, num_groups, weight, bias, _check_eps(eps, "group_norm"), "group_norm")


def batch_norm_train(h, weight, bias, axes, bshape, eps):
    """``(y, mean, var)``: normalized with the batch statistics over ``axes`` (biased variance),
    through the closed-form gradient of ``_normalize``."""
    return _normalize(h, weight, bias, axes, bshape, eps)


def running_update(running_mean, running_var, mean, var, n, factor, cdt):
    """torch's update: ``(1 - factor) * running + factor * batch``, with the unbiased batch
    variance for ``running_var``; no gradient flows into the statistics."""
    mean, var = jax.lax.stop_gradient((mean, var))
    unbiased = var * (n / (n - 1))
    new_mean = ((1 - factor) * running_mean.astype(cdt) + factor * mean).astype(running_mean.dtype)
    new_var = ((1 - factor) * running_var.astype(cdt) + factor * unbiased).astype(running_var.dtype)
    return new_mean, new_var


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5):
    """Batch normalization of ``(N, C, *)`` per channel, torch.nn.functional.batch_norm.

    ``training=True``: the batch mean and biased variance (over every axis but 1); with
    running statistics given, returns ``(y, new_running_mean, new_running_var)``, the
    statistics advanced as ``(1 - momentum) * running + momentum * batch`` with the unbiased
    batch variance (torch mutates them in place and returns ``y``; see the module docstring).
    ``training=False``: normalizes with ``running_mean``/``running_var`` (required, as torch)
    and returns ``y``.
    """
    where = "batch_norm"
    x = _check_floating(input, where)
    eps = _check_eps(eps, where)
    if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real):
        raise TypeError(f"{where}: momentum must be a float (torch's functional form takes no None; the layer's "
                        f"momentum=None is a cumulative average it computes), got {momentum!r}")
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{where}: pass both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ValueError(f"{where}: running_mean must be defined in evaluation mode (training=False), as in torch; "
                         f"pass the running statistics or training=True")
    if x.ndim < 2:
        raise ValueError(f"{where}: input of shape {tuple(x.shape)} must be (N, C, *) with the channels in axis 1")
    C = x.shape[1]
    for what, value in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                        ("bias", bias)):
        if value is not None and tuple(jnp.shape(value)) != (C,):
            raise ValueError(f"{where}: {what} of shape {tuple(jnp.shape(value))} must have one entry per channel: "
                             f"({C},) for an input of shape {tuple(x.shape)}")
    cdt = _compute_dtype(x.dtype)
    h = x.astype(cdt)
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (C,) + (1,) * (x.ndim - 2)
    w = None if weight is None else jnp.asarray(weight).astype(cdt)
    b = None if bias is None else jnp.asarray(bias).astype(cdt)
    if not training:
        mean, var = jnp.asarray(running_mean).astype(cdt), jnp.asarray(running_var).astype(cdt)
        y = (h - mean.reshape(bshape)) * jax.lax.rsqrt(var.reshape(bshape) + eps)
        return _affine(y, w, b, bshape, cdt).astype(x.dtype)
    n = math.prod(x.shape[a] for a in axes)
    if n <= 1:
        raise ValueError(f"{where}: expected more than 1 value per channel when training, got input of shape "
                         f"{tuple(x.shape)}; use a batch of at least 2 (or training=False)")
    y, mean, var = batch_norm_train(h, w, b, axes, bshape, eps)
    y = y.astype(x.dtype)
    if running_mean is None:
        return y
    rm, rv = running_update(jnp.asarray(running_mean), jnp.asarray(running_var), mean, var, n,
                            jnp.asarray(momentum, cdt), cdt)
    return y, rm, rv
