"""Activations, as torch.nn's; no params, no state.

Each layer takes torch's constructor arguments with torch's defaults and applies the one
implementation in ``funcnet.nn.functional`` (gradients at kinks are torch's, see there).
``inplace=`` is accepted and only changes the name (JAX arrays are immutable; torch's in-place and
out-of-place forms compute the same values and gradients).

Examples:
    >>> import jax.numpy as jnp
    >>> from funcnet import nn
    >>> act = nn.ReLU()
    >>> act.apply(act.init(None), jnp.array([-1.0, 2.0])).tolist()
    [0.0, 2.0]
"""

from __future__ import annotations

import numbers
from typing import Callable

import jax
import jax.numpy as jnp

from funcnet.nn import functional as F
from funcnet.nn.functional._common import float_dtype
from funcnet.nn.functional.activation import _check_dim, _softmax_family
from funcnet.nn.module import Module, check_params

__all__ = ["ReLU", "Tanh", "Sigmoid", "Identity", "GELU", "SiLU", "LeakyReLU", "ELU", "Softmax", "LogSoftmax",
           "ReLU6", "Hardswish", "Hardsigmoid", "Hardtanh", "Mish", "Softplus", "PReLU", "SELU", "CELU",
           "LogSigmoid", "Softsign", "Tanhshrink", "Threshold", "GLU", "Softmin", "Softmax2d"]


def _no_params(key) -> dict:
    del key
    return {}


def elementwise(fn: Callable[[jax.Array], jax.Array], name: str) -> Module:
    """A module without params or state that applies ``fn`` to its input."""

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return fn(jnp.asarray(x))

    return Module(_no_params, apply, name=name)


def _inplace(inplace, where: str) -> str:
    if not isinstance(inplace, bool):
        raise TypeError(f"{where}: inplace must be a bool, got {inplace!r}")
    return "inplace=True" if inplace else ""


def _real(value, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {what} must be a real number, got {value!r}")
    return value


def _flag(inplace, where: str, prefix: str = "") -> str:
    flag = _inplace(inplace, where)
    return (prefix + flag) if flag else ""


def ReLU(inplace: bool = False) -> Module:
    """max(x, 0), elementwise (torch.nn.ReLU; the articles' ``torch.clamp(x, min=0)``).
    The gradient at 0 is 0, as torch's."""
    return elementwise(F.relu, f"ReLU({_inplace(inplace, 'ReLU')})")


def Tanh() -> Module:
    """tanh(x), elementwise (torch.nn.Tanh)."""
    return elementwise(F.tanh, "Tanh()")


def Sigmoid() -> Module:
    """1 / (1 + exp(-x)), elementwise (torch.nn.Sigmoid)."""
    return elementwise(F.sigmoid, "Sigmoid()")


def Identity(*args, **kwargs) -> Module:
    """x unchanged (torch.nn.Identity); any arguments are accepted and ignored, as torch's
    are, so ``Identity(dim)`` can stand in for a layer that takes arguments."""
    del args, kwargs
    return elementwise(lambda x: x, "Identity()")


def GELU(approximate: str = "none") -> Module:
    """x * Phi(x), elementwise (torch.nn.GELU).

    ``approximate="none"`` (torch's default) is the exact form with erf;
    ``approximate="tanh"`` is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's.
    Note: ``jax.nn.gelu`` defaults to the tanh form; this layer defaults to torch's.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"GELU: approximate must be 'none' (exact, erf) or 'tanh', got {approximate!r}")
    return elementwise(lambda x: F.gelu(x, approximate), f"GELU(approximate={approximate!r})")


def SiLU(inplace: bool = False) -> Module:
    """x * sigmoid(x), elementwise (torch.nn.SiLU, also called swish)."""
    return elementwise(F.silu, f"SiLU({_inplace(inplace, 'SiLU')})")


def LeakyReLU(negative_slope: float = 1e-2, inplace: bool = False) -> Module:
    """x if x > 0 else negative_slope * x (torch.nn.LeakyReLU). The gradient at 0 is
    ``negative_slope``, as torch's (``jax.nn.leaky_relu`` gives 1 there)."""
    slope = _real(negative_slope, "negative_slope", "LeakyReLU")
    return elementwise(lambda x: F.leaky_relu(x, slope),
                       f"LeakyReLU(negative_slope={slope}{_flag(inplace, 'LeakyReLU', ', ')})")


def ELU(alpha: float = 1.0, inplace: bool = False) -> Module:
    """x if x > 0 else alpha * (exp(x) - 1) (torch.nn.ELU)."""
    alpha = _real(alpha, "alpha", "ELU")
    return elementwise(lambda x: F.elu(x, alpha), f"ELU(alpha={alpha}{_flag(inplace, 'ELU', ', ')})")


def ReLU6(inplace: bool = False) -> Module:
    """min(max(x, 0), 6) (torch.nn.ReLU6); gradient 0 at 0 and at 6, as torch's
    (``jnp.clip`` gives 0.5 there)."""
    return elementwise(F.relu6, f"ReLU6({_inplace(inplace, 'ReLU6')})")


def Hardtanh(min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Module:
    """x clipped to [min_val, max_val] (torch.nn.Hardtanh); gradient 0 at both ends."""
    lo, hi = _real(min_val, "min_val", "Hardtanh"), _real(max_val, "max_val", "Hardtanh")
    if lo > hi:
        raise ValueError(f"Hardtanh: min_val={lo} is greater than max_val={hi}; pass min_val <= max_val")
    return elementwise(lambda x: F.hardtanh(x, lo, hi),
                       f"Hardtanh(min_val={lo}, max_val={hi}{_flag(inplace, 'Hardtanh', ', ')})")


def Hardswish(inplace: bool = False) -> Module:
    """x * relu6(x + 3) / 6 (torch.nn.Hardswish, MobileNetV3's); torch's gradient at -3 and 3."""
    _inplace(inplace, "Hardswish")
    return elementwise(F.hardswish, "Hardswish()")  # torch's repr leaves inplace out


def Hardsigmoid(inplace: bool = False) -> Module:
    """relu6(x + 3) / 6 (torch.nn.Hardsigmoid); gradient 0 at -3 and 3."""
    _inplace(inplace, "Hardsigmoid")
    return elementwise(F.hardsigmoid, "Hardsigmoid()")


def Mish(inplace: bool = False) -> Module:
    """x * tanh(softplus(x)) (torch.nn.Mish)."""
    return elementwise(F.mish, f"Mish({_inplace(inplace, 'Mish')})")


def Softplus(beta: float = 1.0, threshold: float = 20.0) -> Module:
    """log(1 + exp(beta x)) / beta, linear where beta x > threshold (torch.nn.Softplus)."""
    beta, threshold = _real(beta, "beta", "Softplus"), _real(threshold, "threshold", "Softplus")
    return elementwise(lambda x: F.softplus(x, beta, threshold), f"Softplus(beta={beta}, threshold={threshold})")


def PReLU(num_parameters: int = 1, init: float = 0.25, *, dtype=None) -> Module:
    """x if x > 0 else a x with a learned ``a`` (torch.nn.PReLU): params ``{"weight":
    (num_parameters,)}`` filled with ``init``; ``num_parameters`` is 1 (one ``a`` for every
    channel) or the number of channels (axis 1 of ``(N, C, *)``). Note: torch applies no
    weight decay exemption by itself; neither does funcnet."""
    if isinstance(num_parameters, bool) or not isinstance(num_parameters, int) or num_parameters <= 0:
        raise ValueError(f"PReLU: num_parameters must be a positive int (1, or the number of channels), got "
                         f"{num_parameters!r}")
    value = _real(init, "init", "PReLU")
    name = f"PReLU(num_parameters={num_parameters})"

    def init_fn(key):
        del key
        return {"weight": jnp.full((num_parameters,), value, float_dtype(dtype))}

    def apply(params, x, *, key=None, train=False):
        del key, train
        check_params(params, {"weight"}, name)
        return F.prelu(x, params["weight"])

    return Module(init_fn, apply, name=name)


def SELU(inplace: bool = False) -> Module:
    """scale * elu(x, alpha) with torch's constants (torch.nn.SELU)."""
    return elementwise(F.selu, f"SELU({_inplace(inplace, 'SELU')})")


def CELU(alpha: float = 1.0, inplace: bool = False) -> Module:
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1)) (torch.nn.CELU)."""
    alpha = _real(alpha, "alpha", "CELU")
    if alpha == 0:
        raise ValueError("CELU: alpha=0 divides by zero (torch refuses it too); pass a non-zero alpha")
    return elementwise(lambda x: F.celu(x, alpha), f"CELU(alpha={alpha}{_flag(inplace, 'CELU', ', ')})")


def LogSigmoid() -> Module:
    """log(sigmoid(x)) (torch.nn.LogSigmoid), computed stably."""
    return elementwise(F.logsigmoid, "LogSigmoid()")


def Softsign() -> Module:
    """x / (1 + |x|) (torch.nn.Softsign)."""
    return elementwise(F.softsign, "Softsign()")


def Tanhshrink() -> Module:
    """x - tanh(x) (torch.nn.Tanhshrink)."""
    return elementwise(F.tanhshrink, "Tanhshrink()")


def Threshold(threshold: float, value: float, inplace: bool = False) -> Module:
    """x where x > threshold, else value (torch.nn.Threshold)."""
    t, v = _real(threshold, "threshold", "Threshold"), _real(value, "value", "Threshold")
    return elementwise(lambda x: F.threshold(x, t, v),
                       f"Threshold(threshold={t}, value={v}{_flag(inplace, 'Threshold', ', ')})")


def GLU(dim: int = -1) -> Module:
    """a * sigmoid(b) with a, b the halves of the input along ``dim`` (torch.nn.GLU)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"GLU: dim must be an int, got {dim!r}")
    return elementwise(lambda x: F.glu(x, dim), f"GLU(dim={dim})")


def _softmax_layer(kind: str, dim, fn) -> Module:
    dim = _check_dim(dim, kind)
    name = f"{kind}(dim={dim})"

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _softmax_family(x, dim, None, fn, kind, where=name)

    return Module(_no_params, apply, name=name)


def Softmax(dim: int | None = None) -> Module:
    """exp(x) / sum(exp(x)) along ``dim`` (torch.nn.Softmax). ``dim=None`` (torch's deprecated
    implicit choice) is refused: pass the axis."""
    return _softmax_layer("Softmax", dim, jax.nn.softmax)


def LogSoftmax(dim: int | None = None) -> Module:
    """x - logsumexp(x) along ``dim`` (torch.nn.LogSoftmax). ``dim=None`` is refused as in
    ``Softmax``."""
    return _softmax_layer("LogSoftmax", dim, jax.nn.log_softmax)


def Softmin(dim: int | None = None) -> Module:
    """softmax(-x) along ``dim`` (torch.nn.Softmin). ``dim=None`` is refused as in ``Softmax``."""
    return _softmax_layer("Softmin", dim, lambda v, axis: jax.nn.softmax(-v, axis=axis))


def Softmax2d() -> Module:
    """Softmax over the channels of ``(N, C, H, W)`` or ``(C, H, W)`` (torch.nn.Softmax2d: dim -3)."""
    name = "Softmax2d()"

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = jnp.asarray(x)
        if x.ndim not in (3, 4):
            raise ValueError(f"Softmax2d: expected a 3D (C, H, W) or 4D (N, C, H, W) input, got shape "
                             f"{tuple(x.shape)}; for other ranks use Softmax(dim=...)")
        return _softmax_family(x, -3, None, jax.nn.softmax, "Softmax2d", where=name)

    return Module(_no_params, apply, name=name)
