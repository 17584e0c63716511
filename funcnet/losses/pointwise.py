"""Elementwise losses with torch.nn.functional's semantics: binary_cross_entropy (on
probabilities), kl_div, smooth_l1_loss, huber_loss, poisson_nll_loss, gaussian_nll_loss.

Gradients at the kinks are torch's (its backward formulas): smooth_l1/huber have gradient 0
at a zero difference; binary_cross_entropy's gradient with respect to the input is torch's
``w (x - t) / max(x (1 - x), 1e-12)``, finite at 0 and 1 where autodiff of the clamped logs
would give inf or 0.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.losses.core import _check_reduction, _reduce, _same_shapes

__all__ = ["binary_cross_entropy", "kl_div", "smooth_l1_loss", "huber_loss", "poisson_nll_loss", "gaussian_nll_loss"]


@jax.custom_jvp
def _bce(x, t):
    # torch clamps each log at -100, so a probability of exactly 0 or 1 gives a finite loss
    return -(t * jnp.maximum(jnp.log(x), -100.0) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100.0))


@_bce.defjvp
def _bce_jvp(primals, tangents):
    (x, t), (dx, dt) = primals, tangents
    # torch's binary_cross_entropy_backward (input; its EPSILON is the float 1e-12f, in float64
    # too) and target_backward (-logit(x))
    grad_x = (x - t) / jnp.maximum((1 - x) * x, float(np.float32(1e-12)))
    grad_t = jnp.log1p(-x) - jnp.log(x)
    return _bce(x, t), grad_x * dx + grad_t * dt


def _broadcasts(value, shape, what: str, where: str):
    if value is None:
        return None
    try:
        jnp.broadcast_shapes(jnp.shape(value), tuple(shape))
    except ValueError:
        raise ValueError(f"{where}: {what} of shape {jnp.shape(value)} does not broadcast to the input's shape "
                         f"{tuple(shape)}") from None
    return jnp.asarray(value)


def binary_cross_entropy(input, target, weight=None, *, reduction: str = "mean"):
    """``-weight * (t log(x) + (1 - t) log(1 - x))`` on probabilities ``x`` (``F.binary_cross_entropy``,
    ``nn.BCELoss``): each log clamped at -100, as torch. ``x`` outside [0, 1] raises when concrete
    (as torch); inside jit it gives NaN. For logits use ``binary_cross_entropy_with_logits``
    (stabler, and what autocast allows)."""
    where = "binary_cross_entropy"
    _same_shapes(input, target, "input,target", where)
    _check_reduction(reduction)
    x, t = jnp.asarray(input), jnp.asarray(target)
    if not isinstance(x, jax.core.Tracer):
        host = np.asarray(x)
        if host.size and not ((host >= 0) & (host <= 1)).all():
            raise ValueError(f"{where}: all elements of input should be between 0 and 1 (probabilities), got "
                             f"values in [{host.min():.4g}, {host.max():.4g}]; apply a sigmoid first, or use "
                             f"binary_cross_entropy_with_logits on the logits")
    loss = _bce(x, t.astype(x.dtype))
    weight = _broadcasts(weight, x.shape, "weight", where)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def kl_div(input, target, *, reduction: str = "mean", log_target: bool = False):
    """KL divergence ``F.kl_div``: ``input`` holds log-probabilities; ``target`` probabilities
    (``t (log t - input)``, 0 where t = 0) or log-probabilities with ``log_target=True``
    (``exp(t) (t - input)``). ``reduction="batchmean"`` divides the sum by ``input.shape[0]``
    (the mathematical KL; torch's ``"mean"`` divides by every element, as here)."""
    where = "kl_div"
    if reduction not in ("mean", "sum", "none", "batchmean"):
        raise ValueError(f"{where}: reduction must be one of ('mean', 'sum', 'none', 'batchmean'), got {reduction!r}")
    x, t = jnp.asarray(input), jnp.asarray(target)
    try:
        shape = jnp.broadcast_shapes(x.shape, t.shape)
    except ValueError:
        raise ValueError(f"{where}: input of shape {tuple(x.shape)} and target of shape {tuple(t.shape)} do not "
                         f"broadcast") from None
    if log_target:
        loss = jnp.exp(t) * (t - x)
    else:
        positive = t > 0
        loss = jnp.where(positive, t * jnp.log(jnp.where(positive, t, 1)), 0) - t * x
    loss = jnp.broadcast_to(loss, shape)
    if reduction == "batchmean":
        return jnp.sum(loss) / (shape[0] if len(shape) else 1)
    return _reduce(loss, reduction)


def _abs(d):
    """|d| with torch's gradient sign(d), 0 at 0 (``jnp.abs`` has gradient 1 there)."""
    return d * jax.lax.stop_gradient(jnp.sign(d))


def _check_nonnegative(value, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{where}: {what} must be a number >= 0, got {value!r}")
    return float(value)


def smooth_l1_loss(input, target, *, reduction: str = "mean", beta: float = 1.0):
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (``F.smooth_l1_loss``,
    d = input - target); ``beta=0`` is the L1 loss, as torch."""
    where = "smooth_l1_loss"
    _same_shapes(input, target, "input,target", where)
    beta = _check_nonnegative(beta, "beta", where)
    d = jnp.asarray(input) - jnp.asarray(target)
    if beta == 0:
        return _reduce(_abs(d), reduction)
    small = jnp.abs(d) < beta
    return _reduce(jnp.where(small, 0.5 * d * d / beta, jnp.abs(d) - 0.5 * beta), reduction)


def huber_loss(input, target, *, reduction: str = "mean", delta: float = 1.0):
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)`` (``F.huber_loss``)."""
    where = "huber_loss"
    _same_shapes(input, target, "input,target", where)
    delta = _check_nonnegative(delta, "delta", where)
    if delta == 0:
        raise ValueError(f"{where}: delta must be > 0 (torch refuses 0), got {delta}")
    d = jnp.asarray(input) - jnp.asarray(target)
    small = jnp.abs(d) < delta
    return _reduce(jnp.where(small, 0.5 * d * d, delta * (jnp.abs(d) - 0.5 * delta)), reduction)


def poisson_nll_loss(input, target, *, log_input: bool = True, full: bool = False, eps: float = 1e-8,
                     reduction: str = "mean"):
    """Poisson negative log likelihood (``F.poisson_nll_loss``): ``exp(x) - t x`` with
    ``log_input`` (x is the log-rate), else ``x - t log(x + eps)``; ``full`` adds Stirling's
    ``t log t - t + 0.5 log(2 pi t)`` where t > 1 (its gradient with respect to a target of
    exactly 0 is 0 here; torch's is NaN, 0 times the infinite derivative of log at 0)."""
    where = "poisson_nll_loss"
    _same_shapes(input, target, "input,target", where)
    x, t = jnp.asarray(input), jnp.asarray(target)
    loss = jnp.exp(x) - t * x if log_input else x - t * jnp.log(x + eps)
    if full:
        big = t > 1
        safe = jnp.where(big, t, 2)
        loss = loss + jnp.where(big, safe * jnp.log(safe) - safe + 0.5 * jnp.log(2 * math.pi * safe), 0)
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, *, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
    """Gaussian negative log likelihood (``F.gaussian_nll_loss``): ``0.5 (log v + (x - t)^2 / v)``
    (+ ``0.5 log(2 pi)`` with ``full``), with ``v = max(var, eps)`` clamped as torch does (under
    no_grad: the gradient passes to ``var`` as if unclamped). ``var``: the input's shape, or that
    shape without (or with 1 as) the last axis (one variance per example). A negative ``var``
    raises when concrete."""
    where = "gaussian_nll_loss"
    _same_shapes(input, target, "input,target", where)
    _check_reduction(reduction)
    x, t, v = jnp.asarray(input), jnp.asarray(target), jnp.asarray(var)
    if v.shape != x.shape:
        if x.shape[:-1] == v.shape:
            v = v[..., None]
        elif not (x.shape[:-1] == v.shape[:-1] and v.shape[-1:] == (1,)):
            raise ValueError(f"{where}: var is of incorrect size: got shape {tuple(v.shape)} for an input of shape "
                             f"{tuple(x.shape)}; expected {tuple(x.shape)}, {tuple(x.shape[:-1])} or "
                             f"{tuple(x.shape[:-1]) + (1,)}")
    if not isinstance(v, jax.core.Tracer) and bool(np.any(np.asarray(v) < 0)):
        raise ValueError(f"{where}: var has negative entry/entries; variances must be >= 0")
    v = v + jax.lax.stop_gradient(jnp.maximum(v, eps) - v)
    loss = 0.5 * (jnp.log(v) + (x - t) ** 2 / v)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction)
