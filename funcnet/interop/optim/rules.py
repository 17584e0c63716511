"""torch.optim's update rules as optax transforms, one builder per optimizer class.

Each builder takes one param group's hyperparameters (torch's names read off the group,
``learning_rate`` a float or an optax schedule) and returns the group's
``optax.GradientTransformation``. optax's own transforms are used wherever they compute
torch's formula (SGD's momentum without dampening, RMSprop, Adadelta, the weight decays);
the small transforms below exist because optax's nearest one differs:

- SGD with ``dampening``: torch's momentum buffer starts as the first gradient and later
  adds ``(1 - dampening) * g``; ``optax.trace`` has no dampening (it is torch's rule when
  dampening is 0, and is used then).
- Adam/AdamW: ``optax.scale_by_adam`` is torch's formula (eps outside the root), but it
  computes the bias correction ``1 - b2**t`` in the params' dtype: in float32, from 0.999
  rounded to float32, that is 1.3e-5 off torch's (Python floats) at step 1, and a run ends
  7e-6 from torch's after 30 steps, far past float32's rounding. Here it is
  ``-expm1(t * log(b2))``, ``log`` taken in float64. With ``amsgrad``, torch keeps the
  maximum of the raw second moment and divides by the current step's correction;
  ``optax.scale_by_amsgrad`` keeps the maximum of the bias-corrected moments, which differs
  while the correction changes. Adamax is optax.scale_by_adamax's formula with the same
  float32-safe correction.
- Adagrad: torch divides by ``sqrt(sum) + eps`` (eps 1e-10, accumulator from
  ``initial_accumulator_value``, default 0) and decays the lr by ``1 + (step - 1) * lr_decay``;
  ``optax.scale_by_rss`` puts eps inside the square root and has no lr_decay.
- NAdam: torch's momentum schedule ``mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))``
  and its running product; ``optax.nadam`` is Dozat's form without that schedule.

RMSprop is optax's ``scale_by_rms``/``scale_by_stddev`` with ``eps_in_sqrt=False`` (torch's
``sqrt(v) + eps``), then ``optax.trace``, then the lr: torch multiplies the whole momentum
buffer by the current lr, while ``optax.rmsprop`` scales by the lr before the momentum,
which differs as soon as the lr is scheduled.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


def _float(x):
    return jnp.asarray(x, jnp.result_type(float))


def _maximize(maximize: bool):
    # torch negates the gradient first, before weight decay and the moments
    return optax.scale(-1.0) if maximize else optax.identity()


def _l2(weight_decay: float):
    # torch's coupled weight decay: grad + weight_decay * param, before the moments
    return optax.add_decayed_weights(weight_decay) if weight_decay else optax.identity()


class _CountState(NamedTuple):
    count: jax.Array
    trace: optax.Updates


def _dampened_momentum(momentum, dampening: float, nesterov: bool) -> optax.GradientTransformation:
    """torch's SGD momentum buffer with dampening: ``buf = g`` at the first step, then
    ``buf = momentum * buf + (1 - dampening) * g``; the step is ``buf`` (or
    ``g + momentum * buf`` with nesterov). optax.trace has no dampening."""

    def init(params):
        return _CountState(jnp.zeros([], jnp.int32), optax.tree.zeros_like(params))

    def update(updates, state, params=None):
        del params
        first = state.count == 0
        buf = jax.tree.map(lambda g, b: jnp.where(first, g, momentum * b + (1 - dampening) * g),
                           updates, state.trace)
        out = jax.tree.map(lambda g, b: g + momentum * b, updates, buf) if nesterov else buf
        return out, _CountState(optax.safe_increment(state.count), buf)

    return optax.GradientTransformation(init, update)


def sgd(learning_rate, momentum, *, use_momentum: bool, dampening: float, nesterov: bool,
        weight_decay: float, maximize: bool) -> optax.GradientTransformation:
    if not use_momentum:
        step = optax.identity()
    elif dampening == 0:
        step = optax.trace(decay=momentum, nesterov=nesterov)  # buffer starts at g, as torch's
    else:
        step = _dampened_momentum(momentum, dampening, nesterov)
    return optax.chain(_maximize(maximize), _l2(weight_decay), step, optax.scale_by_learning_rate(learning_rate))


def _correction(b, t):
    """``1 - b**t``, torch's bias correction, which torch computes in Python floats. As
    ``-expm1(t * log(b))`` with ``log(b)`` taken in float64 here, it keeps float32's precision:
    ``1 - b**t`` in float32 (as optax.scale_by_adam computes it) starts from b rounded to
    float32 and loses the leading digits (0.999 -> 1.3e-5 relative error at step 1)."""
    if isinstance(b, (int, float)):
        return -jnp.expm1(t * math.log(b))
    return 1 - b ** t  # a scheduled beta (OneCycleLR's cycle) is an array already


class _AdamState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates
    nu_max: optax.Updates  # AMSGrad's running maximum (empty without it)


def _torch_adam(b1, b2, eps: float, amsgrad: bool) -> optax.GradientTransformation:
    """torch's Adam direction ``(m / (1 - b1**t)) / (sqrt(v) / sqrt(1 - b2**t) + eps)``, with
    AMSGrad's ``max_v = max(max_v, v)`` taken on the raw second moment."""

    def init(params):
        # each moment its own arrays: a train state's buffers are donated, one by one
        zeros = lambda: optax.tree.zeros_like(params)  # noqa: E731
        return _AdamState(jnp.zeros([], jnp.int32), zeros(), zeros(), zeros() if amsgrad else ())

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        nu_max = jax.tree.map(jnp.maximum, state.nu_max, nu) if amsgrad else ()
        count = optax.safe_increment(state.count)
        t = _float(count)
        bc1, bc2_sqrt = _correction(b1, t), jnp.sqrt(_correction(b2, t))

        def direction(m, v):
            return ((m / bc1.astype(m.dtype)) / (jnp.sqrt(v) / bc2_sqrt.astype(m.dtype) + eps)).astype(m.dtype)

        out = jax.tree.map(direction, mu, nu_max if amsgrad else nu)
        return out, _AdamState(count, mu, nu, nu_max)

    return optax.GradientTransformation(init, update)


def adam(learning_rate, b1, *, b2: float, eps: float, weight_decay: float, decoupled: bool, amsgrad: bool,
         maximize: bool) -> optax.GradientTransformation:
    moments = _torch_adam(b1, b2, eps, amsgrad)
    if decoupled:  # AdamW: param * (1 - lr * wd) - lr * adam = param - lr * (adam + wd * param)
        decay = optax.add_decayed_weights(weight_decay) if weight_decay else optax.identity()
        return optax.chain(_maximize(maximize), moments, decay, optax.scale_by_learning_rate(learning_rate))
    return optax.chain(_maximize(maximize), _l2(weight_decay), moments, optax.scale_by_learning_rate(learning_rate))


class _AdamaxState(NamedTuple):
    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def _torch_adamax(b1, b2: float, eps: float) -> optax.GradientTransformation:
    """torch's Adamax direction ``m / (1 - b1**t) / u``, ``u = max(b2 * u, |g| + eps)``: the
    formula of optax.scale_by_adamax, with the bias correction kept precise in float32 as
    Adam's (``_correction``; optax's is 8e-7 off torch's after 30 float32 steps at b1=0.99)."""

    def init(params):
        zeros = lambda: optax.tree.zeros_like(params)  # noqa: E731 (one array per moment, as Adam's)
        return _AdamaxState(jnp.zeros([], jnp.int32), zeros(), zeros())

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_infinity_moment(updates, state.nu, b2, eps)
        count = optax.safe_increment(state.count)
        bc1 = _correction(b1, _float(count))
        out = jax.tree.map(lambda m, u: (m / bc1.astype(m.dtype) / u).astype(m.dtype), mu, nu)
        return out, _AdamaxState(count, mu, nu)

    return optax.GradientTransformation(init, update)


def adamax(learning_rate, b1, *, b2: float, eps: float, weight_decay: float,
           maximize: bool) -> optax.GradientTransformation:
    return optax.chain(_maximize(maximize), _l2(weight_decay), _torch_adamax(b1, b2, eps),
                       optax.scale_by_learning_rate(learning_rate))


class _NadamState(NamedTuple):
    count: jax.Array
    mu_product: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def _torch_nadam(b1, b2: float, eps: float, momentum_decay: float) -> optax.GradientTransformation:
    """torch's NAdam direction (the lr applied after): with ``mu_t = b1 * (1 - 0.5 *
    0.96 ** (t * momentum_decay))`` and ``P_t = mu_1 ... mu_t``,
    ``(1 - mu_t) / (1 - P_t) * g / d + mu_{t+1} / (1 - P_t * mu_{t+1}) * m / d``,
    ``d = sqrt(v / (1 - b2**t)) + eps``. torch keeps ``P_t`` in float32 unless its default
    dtype is float64; here it has the params' dtype."""

    def init(params):
        zeros = lambda: optax.tree.zeros_like(params)  # noqa: E731 (one array per moment, as Adam's)
        return _NadamState(jnp.zeros([], jnp.int32), jnp.ones([], optax.tree.dtype(params, "highest")), zeros(),
                           zeros())

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        t = _float(count)
        mu_t = b1 * (1.0 - 0.5 * 0.96 ** (t * momentum_decay))
        mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
        product = state.mu_product * mu_t.astype(state.mu_product.dtype)
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        bc2 = _correction(b2, t)
        c_grad = (1.0 - mu_t) / (1.0 - product)
        c_avg = mu_next / (1.0 - product * mu_next)

        def direction(g, m, v):
            denom = jnp.sqrt(v / bc2) + eps
            return (c_grad * g / denom + c_avg * m / denom).astype(g.dtype)

        out = jax.tree.map(direction, updates, mu, nu)
        return out, _NadamState(count, product, mu, nu)

    return optax.GradientTransformation(init, update)


def nadam(learning_rate, b1, *, b2: float, eps: float, weight_decay: float, momentum_decay: float,
          decoupled: bool, maximize: bool) -> optax.GradientTransformation:
    moments = _torch_nadam(b1, b2, eps, momentum_decay)
    if decoupled:
        decay = optax.add_decayed_weights(weight_decay) if weight_decay else optax.identity()
        return optax.chain(_maximize(maximize), moments, decay, optax.scale_by_learning_rate(learning_rate))
    return optax.chain(_maximize(maximize), _l2(weight_decay), moments, optax.scale_by_learning_rate(learning_rate))


def rmsprop(learning_rate, momentum, *, use_momentum: bool, alpha: float, eps: float, centered: bool,
            weight_decay: float, maximize: bool) -> optax.GradientTransformation:
    if centered:  # v - mean(g)^2 under the root, eps outside it, as torch's
        scale = optax.scale_by_stddev(decay=alpha, eps=eps, eps_in_sqrt=False)
    else:
        scale = optax.scale_by_rms(decay=alpha, eps=eps, eps_in_sqrt=False)
    step = optax.trace(decay=momentum) if use_momentum else optax.identity()
    return optax.chain(_maximize(maximize), _l2(weight_decay), scale, step, optax.scale_by_learning_rate(learning_rate))


class _AdagradState(NamedTuple):
    count: jax.Array
    sum: optax.Updates


def _torch_adagrad(eps: float, initial_accumulator_value: float, lr_decay: float) -> optax.GradientTransformation:
    """torch's Adagrad direction: ``sum += g * g``, ``g / (sqrt(sum) + eps) / (1 + (t - 1) * lr_decay)``."""

    def init(params):
        return _AdagradState(jnp.zeros([], jnp.int32), optax.tree.full_like(params, initial_accumulator_value))

    def update(updates, state, params=None):
        del params
        total = jax.tree.map(lambda s, g: s + g * g, state.sum, updates)
        decay = 1.0 + _float(state.count) * lr_decay
        out = jax.tree.map(lambda g, s: (g / (jnp.sqrt(s) + eps) / decay).astype(g.dtype), updates, total)
        return out, _AdagradState(optax.safe_increment(state.count), total)

    return optax.GradientTransformation(init, update)


def adagrad(learning_rate, *, lr_decay: float, eps: float, initial_accumulator_value: float, weight_decay: float,
            maximize: bool) -> optax.GradientTransformation:
    return optax.chain(_maximize(maximize), _l2(weight_decay),
                       _torch_adagrad(eps, initial_accumulator_value, lr_decay),
                       optax.scale_by_learning_rate(learning_rate))


def adadelta(learning_rate, *, rho: float, eps: float, weight_decay: float, maximize: bool) -> optax.GradientTransformation:
    # optax.scale_by_adadelta: sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g, as torch's
    return optax.chain(_maximize(maximize), _l2(weight_decay), optax.scale_by_adadelta(rho=rho, eps=eps),
                       optax.scale_by_learning_rate(learning_rate))
