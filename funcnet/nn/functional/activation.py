"""Activations, as torch.nn.functional's: the one implementation that the layers of
``funcnet.nn.activation`` call.

Each takes torch's arguments with torch's defaults. ``inplace=`` is accepted and ignored
(JAX arrays are immutable; torch's in-place and out-of-place forms compute the same values
and gradients). Where an activation has a kink, the gradient there is torch's, which is
not always what ``jnp.clip`` or ``jax.nn`` give: ``relu6``/``hardtanh`` have gradient 0 at
both ends (``jnp.clip`` gives 0.5), ``hardsigmoid`` 0 at -3 and 3, ``hardswish`` 0 at -3 and 1
at 3 (torch's backward formula), ``leaky_relu`` ``negative_slope`` at 0.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["relu", "relu6", "hardtanh", "hardswish", "hardsigmoid", "gelu", "silu", "mish", "softplus", "elu",
           "selu", "celu", "leaky_relu", "prelu", "logsigmoid", "softsign", "tanhshrink", "threshold", "glu",
           "sigmoid", "tanh", "softmax", "softmin", "log_softmax"]

# torch's SELU constants (Klambauer et al.), as in ATen
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _real(value, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {what} must be a real number, got {value!r}")
    return value


def _float_input(x, where: str):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise TypeError(f"{where}: input has dtype {x.dtype}, expected a floating dtype; cast it "
                        f"(x.astype(jnp.float32))")
    return x


def relu(input, inplace: bool = False):
    """max(x, 0); gradient 0 at 0, as torch's."""
    del inplace
    return jax.nn.relu(jnp.asarray(input))


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
    """x clipped to [min_val, max_val]; gradient 1 strictly inside, 0 at and beyond both ends
    (torch's hardtanh_backward; ``jnp.clip`` gives 0.5 at the ends)."""
    del inplace
    lo, hi = _real(min_val, "min_val", "hardtanh"), _real(max_val, "max_val", "hardtanh")
    if lo > hi:
        raise ValueError(f"hardtanh: min_val={lo} is greater than max_val={hi}; pass min_val <= max_val")
    x = jnp.asarray(input)
    return jnp.where(x <= lo, jnp.asarray(lo, x.dtype), jnp.where(x >= hi, jnp.asarray(hi, x.dtype), x))


def relu6(input, inplace: bool = False):
    """min(max(x, 0), 6) = hardtanh(x, 0, 6); gradient 0 at 0 and at 6, as torch's."""
    return hardtanh(input, 0.0, 6.0, inplace)


@jax.custom_jvp
def _hardsigmoid(x):
    return jnp.where(x <= -3, jnp.zeros_like(x), jnp.where(x >= 3, jnp.ones_like(x), (x + 3) / 6))


@_hardsigmoid.defjvp
def _hardsigmoid_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    # torch's hardsigmoid_backward multiplies by 1/6 rounded to float32 (``1.0f / 6.0f``), in
    # float64 too
    inside = (x > -3) & (x < 3)
    return _hardsigmoid(x), jnp.where(inside, t * float(np.float32(1.0) / np.float32(6.0)), jnp.zeros_like(t))


def hardsigmoid(input, inplace: bool = False):
    """relu6(x + 3) / 6; gradient 1/6 strictly inside (-3, 3) (torch's float32 1/6, in float64
    too), 0 at and beyond -3 and 3."""
    del inplace
    return _hardsigmoid(jnp.asarray(input))


def hardswish(input, inplace: bool = False):
    """x * relu6(x + 3) / 6; the gradient is torch's formula: 0 up to -3, x/3 + 1/2 inside
    (-3, 3), 1 from 3 on (so 0 at -3 and 1 at 3, where the derivative of the middle piece
    would give -0.5 and 1.5)."""
    del inplace
    x = jnp.asarray(input)
    return jnp.where(x <= -3, jnp.zeros_like(x), jnp.where(x < 3, x * (x + 3) / 6, x))


def gelu(input, approximate: str = "none"):
    """x * Phi(x), exact (erf) by default, ``approximate="tanh"`` for GPT-2's form.

    (``jax.nn.gelu`` defaults to the tanh form; this defaults to torch's.) The exact form in
    float32 is torch's formula, ``x / 2 * (1 + erf(x / sqrt(2)))``, with ``erf`` evaluated by
    ``_erf32`` and torch's derivative ``Phi(x) + x * phi(x)`` (``_gelu32``), bfloat16 and float16
    computed in float32 and rounded once; float64 goes through ``jax.nn.gelu``."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' (exact, erf) or 'tanh', got {approximate!r}")
    x = jnp.asarray(input)
    if approximate == "none" and x.dtype == jnp.float32:
        return _gelu32(x)
    if approximate == "none" and x.dtype in (jnp.bfloat16, jnp.float16):  # in float32, as torch's CPU kernel
        return _gelu32(x.astype(jnp.float32)).astype(x.dtype)
    return jax.nn.gelu(x, approximate=approximate == "tanh")


# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] (+-1 in float32 beyond): the float32 rational
# approximation that Eigen's and XLA's own erf evaluate, highest power first
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


def _erf32(x):
    """float32 erf as plain multiply-adds and one division: XLA:CPU's own ``erf`` (the same
    approximation, within 3.0e-7 of float64; this one 3.3e-7) took 2.6x the time on one core
    (8x160x56x56: 3.2 against 1.24 ms), and the exact GELU through ``jax.nn.gelu``'s ``erfc``
    4.6 against 1.7 ms (torch 2.0-2.6)."""
    x = jnp.clip(x, -4.0, 4.0)
    x2 = x * x
    p = jnp.full_like(x2, _ERF_P[0])
    for c in _ERF_P[1:]:
        p = p * x2 + np.float32(c)
    q = jnp.full_like(x2, _ERF_Q[0])
    for c in _ERF_Q[1:]:
        q = q * x2 + np.float32(c)
    return x * p / q


@jax.custom_jvp
def _gelu32(x):
    return x * _gelu_cdf(x)


def _gelu_cdf(x):
    return np.float32(0.5) * (np.float32(1.0) + _erf32(x * np.float32(0.7071067811865476)))


@_gelu32.defjvp
def _gelu32_jvp(primals, tangents):
    # torch's gelu_backward: Phi(x) + x * phi(x); autodiff of the rational erf's derivative
    # would be 7e-6 off float64's where this is 2.2e-7 (torch 2.6e-7)
    (x,), (dx,) = primals, tangents
    cdf = _gelu_cdf(x)
    pdf = jnp.exp(np.float32(-0.5) * x * x) * np.float32(0.3989422804014327)
    return x * cdf, (cdf + x * pdf) * dx


def silu(input, inplace: bool = False):
    """x * sigmoid(x) (swish)."""
    del inplace
    return jax.nn.silu(jnp.asarray(input))


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (torch's switch,
    with the gradient 1 there)."""
    beta = _real(beta, "beta", "softplus")
    threshold = _real(threshold, "threshold", "softplus")
    x = jnp.asarray(input)
    bx = x * beta
    linear = bx > threshold
    # the unused branch sees 0, so exp cannot overflow into a NaN gradient
    return jnp.where(linear, x, jnp.log1p(jnp.exp(jnp.where(linear, 0, bx))) / beta)


def mish(input, inplace: bool = False):
    """x * tanh(softplus(x))."""
    del inplace
    x = jnp.asarray(input)
    return x * jnp.tanh(softplus(x))


def elu(input, alpha: float = 1.0, inplace: bool = False):
    """x if x > 0 else alpha (exp(x) - 1); gradient alpha at 0, as torch's."""
    del inplace
    return jax.nn.elu(jnp.asarray(input), _real(alpha, "alpha", "elu"))


def selu(input, inplace: bool = False):
    """scale * elu(x, alpha) with torch's constants (alpha 1.6733, scale 1.0507)."""
    del inplace
    x = jnp.asarray(input)
    return _SELU_SCALE * jax.nn.elu(x, _SELU_ALPHA).astype(x.dtype)


def celu(input, alpha: float = 1.0, inplace: bool = False):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1)); gradient 1 at 0."""
    del inplace
    alpha = _real(alpha, "alpha", "celu")
    if alpha == 0:
        raise ValueError("celu: alpha=0 divides by zero (torch refuses it too); pass a non-zero alpha")
    x = jnp.asarray(input)
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.where(x > 0, 0, x) / alpha))


def leaky_relu(input, negative_slope: float = 0.01, inplace: bool = False):
    """x if x > 0 else negative_slope x; gradient ``negative_slope`` at 0, as torch's
    (``jax.nn.leaky_relu`` gives 1 there)."""
    del inplace
    slope = _real(negative_slope, "negative_slope", "leaky_relu")
    x = jnp.asarray(input)
    return jnp.where(x > 0, x, slope * x)


def prelu(input, weight):
    """x if x > 0 else weight x, with one weight for all channels (shape ``(1,)``) or one per
    channel (shape ``(C,)``, the channel axis 1 of ``(N, C, *)``, axis 0 of a 1-d input)."""
    x, w = jnp.asarray(input), jnp.asarray(weight)
    if w.ndim != 1:
        raise ValueError(f"prelu: weight must be 1-d, (1,) or (C,), got shape {tuple(w.shape)}")
    if w.shape[0] != 1:
        axis = 1 if x.ndim >= 2 else 0
        if x.ndim == 0 or x.shape[axis] != w.shape[0]:
            raise ValueError(f"prelu: weight of shape {tuple(w.shape)} has one entry per channel but the input of "
                             f"shape {tuple(x.shape)} has {x.shape[axis] if x.ndim else 'no'} channels in axis "
                             f"{axis}; use PReLU(num_parameters={x.shape[axis] if x.ndim else 1}) or num_parameters=1")
        w = w.reshape((-1,) + (1,) * (x.ndim - axis - 1))
    else:
        w = w.reshape(())
    return jnp.where(x > 0, x, w.astype(x.dtype) * x)


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x), computed stably."""
    return jax.nn.log_sigmoid(jnp.asarray(input))


def softsign(input):
    """x / (1 + |x|)."""
    x = jnp.asarray(input)
    return x / (1 + jnp.abs(x))


def tanhshrink(input):
    """x - tanh(x)."""
    x = jnp.asarray(input)
    return x - jnp.tanh(x)


def threshold(input, threshold: float, value: float, inplace: bool = False):
    """x where x > threshold, else ``value``; gradient 1 where x > threshold, else 0."""
    del inplace
    t, v = _real(threshold, "threshold", "threshold"), _real(value, "value", "threshold")
    x = jnp.asarray(input)
    return jnp.where(x > t, x, jnp.asarray(v, x.dtype))


def glu(input, dim: int = -1):
    """a * sigmoid(b), with a and b the two halves of ``input`` along ``dim`` (its size must be even)."""
    x = jnp.asarray(input)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"glu: dim must be an int, got {dim!r}")
    if x.ndim == 0 or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"glu: input of shape {tuple(x.shape)} has no dimension {dim}; glu halves a dimension "
                         f"the input has")
    if x.shape[dim] % 2:
        raise ValueError(f"glu: dimension {dim} of the input of shape {tuple(x.shape)} has odd size {x.shape[dim]}; "
                         f"glu splits it into two halves, so it must be even")
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


def sigmoid(input):
    """1 / (1 + exp(-x))."""
    return jax.nn.sigmoid(jnp.asarray(input))


def tanh(input):
    """The hyperbolic tangent, elementwise, as torch.tanh."""
    return jnp.tanh(jnp.asarray(input))


def _check_dim(dim, kind: str):
    if dim is None:
        # torch keeps a legacy rule (dim 0 for inputs of rank 0, 1 or 3, else 1) behind a
        # deprecation warning: the same code then normalizes over a different axis when the
        # input's rank changes, a silent bug waiting to happen. Refuse it.
        raise ValueError(
            f"{kind}(dim=None): the implicit dimension choice is deprecated in torch (it depends on the "
            f"input's rank); pass dim explicitly, e.g. {kind}(dim=-1) over the last axis (torch's legacy rule "
            f"would use dim=0 for inputs of rank 0, 1 or 3 and dim=1 otherwise)")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{kind}: dim must be an int, got {dim!r}")
    return dim


def _softmax_family(x, dim, dtype, fn, kind: str, where: str | None = None):
    where = where or kind
    x = _float_input(x, where) if dtype is None else jnp.asarray(x).astype(dtype)
    rank = max(x.ndim, 1)  # torch treats a 0-d input as having one axis (dim 0 or -1)
    if not -rank <= dim < rank:
        raise ValueError(f"{where}: input of shape {tuple(x.shape)} has {x.ndim} dimensions, expected dim in "
                         f"[{-rank}, {rank - 1}]; pass a dim the input has")
    # in float32 for 16-bit inputs (torch autocast runs softmax/log_softmax in float32); the
    # result comes back in the input's dtype
    wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if x.ndim == 0:
        return fn(wide[None], axis=0)[0].astype(x.dtype)
    return fn(wide, axis=dim).astype(x.dtype)


def softmax(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):
    """exp(x) / sum(exp(x)) along ``dim``; ``dtype`` casts the input first. ``dim=None``
    (torch's deprecated implicit choice) is refused: pass the axis."""
    return _softmax_family(input, _check_dim(dim, "softmax"), dtype, jax.nn.softmax, "softmax")


def softmin(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):
    """softmax(-x) along ``dim``."""
    return _softmax_family(input, _check_dim(dim, "softmin"), dtype, lambda v, axis: jax.nn.softmax(-v, axis=axis),
                           "softmin")


def log_softmax(input, dim: int | None = None, _stacklevel: int = 3, dtype=None):
    """x - logsumexp(x) along ``dim``."""
    return _softmax_family(input, _check_dim(dim, "log_softmax"), dtype, jax.nn.log_softmax, "log_softmax")
