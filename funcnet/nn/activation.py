"""Activations, as torch.nn's; no params, no state.

Each layer takes torch's constructor arguments with torch's defaults. ``inplace=`` is
accepted and only changes the name (JAX arrays are immutable; torch's in-place and
out-of-place forms compute the same values and gradients).
"""

from __future__ import annotations

import numbers
from typing import Callable

import jax
import jax.numpy as jnp

from funcnet.nn.module import Module

__all__ = ["ReLU", "Tanh", "Sigmoid", "Identity", "GELU", "SiLU", "LeakyReLU", "ELU", "Softmax", "LogSoftmax"]


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


def ReLU(inplace: bool = False) -> Module:
    """max(x, 0), elementwise (torch.nn.ReLU; the articles' ``torch.clamp(x, min=0)``).
    The gradient at 0 is 0, as torch's."""
    return elementwise(jax.nn.relu, f"ReLU({_inplace(inplace, 'ReLU')})")


def Tanh() -> Module:
    """tanh(x), elementwise (torch.nn.Tanh)."""
    return elementwise(jnp.tanh, "Tanh()")


def Sigmoid() -> Module:
    """1 / (1 + exp(-x)), elementwise (torch.nn.Sigmoid)."""
    return elementwise(jax.nn.sigmoid, "Sigmoid()")


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
    exact = approximate == "none"
    return elementwise(lambda x: jax.nn.gelu(x, approximate=not exact), f"GELU(approximate={approximate!r})")


def SiLU(inplace: bool = False) -> Module:
    """x * sigmoid(x), elementwise (torch.nn.SiLU, also called swish)."""
    return elementwise(jax.nn.silu, f"SiLU({_inplace(inplace, 'SiLU')})")


def LeakyReLU(negative_slope: float = 1e-2, inplace: bool = False) -> Module:
    """x if x > 0 else negative_slope * x (torch.nn.LeakyReLU). The gradient at 0 is
    ``negative_slope``, as torch's (``jax.nn.leaky_relu`` gives 1 there)."""
    slope = _real(negative_slope, "negative_slope", "LeakyReLU")
    flag = _inplace(inplace, "LeakyReLU")
    return elementwise(lambda x: jnp.where(x > 0, x, slope * x),
                       f"LeakyReLU(negative_slope={slope}{', ' + flag if flag else ''})")


def ELU(alpha: float = 1.0, inplace: bool = False) -> Module:
    """x if x > 0 else alpha * (exp(x) - 1) (torch.nn.ELU)."""
    alpha = _real(alpha, "alpha", "ELU")
    flag = _inplace(inplace, "ELU")
    return elementwise(lambda x: jax.nn.elu(x, alpha), f"ELU(alpha={alpha}{', ' + flag if flag else ''})")


def _softmax_layer(kind: str, dim, fn) -> Module:
    if dim is None:
        # torch keeps a legacy rule (dim 0 for inputs of rank 0, 1 or 3, else 1) behind a
        # deprecation warning: the same layer then normalizes over a different axis when the
        # input's rank changes, which is a silent bug waiting to happen. Refuse at build time.
        raise ValueError(
            f"{kind}(dim=None): the implicit dimension choice is deprecated in torch (it depends on the "
            f"input's rank); pass dim explicitly, e.g. {kind}(dim=-1) over the last axis (torch's legacy rule "
            f"would use dim=0 for inputs of rank 0, 1 or 3 and dim=1 otherwise)")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{kind}: dim must be an int, got {dim!r}")

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = jnp.asarray(x)
        rank = max(x.ndim, 1)  # torch treats a 0-d input as having one axis (dim 0 or -1)
        if not -rank <= dim < rank:
            raise ValueError(f"{kind}(dim={dim}): input of shape {tuple(x.shape)} has {x.ndim} dimensions, "
                             f"expected dim in [{-rank}, {rank - 1}]; pass a dim the input has")
        # in float32 for 16-bit inputs (torch autocast runs softmax/log_softmax in float32); the
        # result comes back in the input's dtype
        wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        if x.ndim == 0:
            return fn(wide[None], axis=0)[0].astype(x.dtype)
        return fn(wide, axis=dim).astype(x.dtype)

    return Module(_no_params, apply, name=f"{kind}(dim={dim})")


def Softmax(dim: int | None = None) -> Module:
    """exp(x) / sum(exp(x)) along ``dim`` (torch.nn.Softmax). ``dim=None`` (torch's deprecated
    implicit choice) is refused: pass the axis."""
    return _softmax_layer("Softmax", dim, jax.nn.softmax)


def LogSoftmax(dim: int | None = None) -> Module:
    """x - logsumexp(x) along ``dim`` (torch.nn.LogSoftmax). ``dim=None`` is refused as in
    ``Softmax``."""
    return _softmax_layer("LogSoftmax", dim, jax.nn.log_softmax)
