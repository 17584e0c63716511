"""Dropout layers, as torch.nn's: identity in eval mode, a PRNG key in train mode.

``inplace=`` is accepted and only changes the name (JAX arrays are immutable).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from funcnet.nn.activation import _no_params
from funcnet.nn.module import Module

__all__ = ["Dropout", "Dropout2d"]


def _check_p(p, kind: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{kind}: p is the drop probability and must be in [0, 1], got {p!r}")
    return p


def _need_key(key, kind: str, p: float) -> None:
    if key is None:
        raise ValueError(
            "%s(p=%g) in train mode needs a PRNG key: call apply(params, x, key=k, train=True) "
            "with k = jax.random.key(seed) (split a fresh one each step), or pass train=False" % (kind, p))


def _drop(x, key, p: float, mask_shape):
    # a mask of mask_shape, broadcast over x: 1 / (1 - p) where kept, 0 where dropped
    if p == 1.0:
        return jnp.zeros_like(x)
    keep = jax.random.bernoulli(key, 1.0 - p, mask_shape)
    return jnp.where(keep, x / (1.0 - p), jnp.zeros_like(x))


def Dropout(p: float = 0.5, inplace: bool = False) -> Module:
    """Inverted dropout: in training, zero each element with probability ``p`` and
    scale the rest by ``1 / (1 - p)``; identity when ``train=False``.

    ``p`` is the drop probability, as in torch.nn.Dropout (stax's Dropout takes the
    keep probability). ``train=True`` needs ``key``.
    """
    _check_p(p, "Dropout")

    def apply(params, x, *, key=None, train=False):
        del params
        if not train or p == 0.0:
            return x
        _need_key(key, "Dropout", p)
        return _drop(x, key, p, jnp.shape(x))

    return Module(_no_params, apply, name=f"Dropout(p={p}, inplace={inplace})")


def Dropout2d(p: float = 0.5, inplace: bool = False) -> Module:
    """Channel dropout (torch.nn.Dropout2d): in training, each channel of ``(N, C, H, W)``
    (or of an unbatched ``(C, H, W)``) is zeroed as a whole with probability ``p``, the
    others scaled by ``1 / (1 - p)``; identity when ``train=False``. ``train=True`` needs ``key``.

    A 3-d input is read as ``(C, H, W)``, as torch documents and announces; torch 2.x
    still treats it as ``(N, C, L)`` (with a warning), so there one mask entry per
    ``(n, c)`` where here there is one per ``c``. Inputs of other ranks are refused (torch
    deprecates them): use ``Dropout`` (elementwise) or reshape.
    """
    _check_p(p, "Dropout2d")

    def apply(params, x, *, key=None, train=False):
        del params
        shape = tuple(jnp.shape(x))
        if len(shape) not in (3, 4):
            raise ValueError(
                f"Dropout2d(p={p}): input of shape {shape} has {len(shape)} dimensions, expected 4 (N, C, H, W) "
                f"or 3 (C, H, W); for elementwise dropout use nn.Dropout")
        if not train or p == 0.0:
            return x
        _need_key(key, "Dropout2d", p)
        return _drop(x, key, p, shape[:-2] + (1, 1))

    return Module(_no_params, apply, name=f"Dropout2d(p={p}, inplace={inplace})")
