"""Dropout layers, as torch.nn's (and torchvision's StochasticDepth): identity in eval mode,
a PRNG key in train mode. The math is ``funcnet.nn.functional``'s dropout / stochastic_depth.

``inplace=`` is accepted and only changes the name (JAX arrays are immutable).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> drop = nn.Dropout(0.5)
    >>> x = jnp.ones(1000)
    >>> bool((drop.apply({}, x) == x).all())  # evaluation: the identity
    True
    >>> sorted(set(drop.apply({}, x, key=jax.random.key(0), train=True).tolist()))  # zeroed or scaled by 1/(1-p)
    [0.0, 2.0]
"""

from __future__ import annotations


import jax.numpy as jnp

from funcnet.nn.activation import _no_params
from funcnet.nn.functional import misc as _F
from funcnet.nn.functional.misc import _check_p, drop, need_key
from funcnet.nn.module import Module

__all__ = ["Dropout", "Dropout2d", "StochasticDepth"]


def _need_key(key, kind: str, p: float) -> None:
    need_key(key, f"{kind}(p={p:g})")


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
        return drop(x, key, p, jnp.shape(x))

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
        return drop(x, key, p, shape[:-2] + (1, 1))

    return Module(_no_params, apply, name=f"Dropout2d(p={p}, inplace={inplace})")


def StochasticDepth(p: float, mode: str) -> Module:
    """torchvision.ops.StochasticDepth: in training, drop the whole residual branch's output
    (``mode="batch"``) or each example's (``mode="row"``) with probability ``p``, scaling what is
    kept by ``1 / (1 - p)``; identity when ``train=False``. ``train=True`` needs ``key``."""
    _F.check_stochastic_depth(p, mode, "StochasticDepth")
    name = f"StochasticDepth(p={p}, mode={mode})"

    def apply(params, x, *, key=None, train=False):
        del params
        if train and p > 0.0:
            need_key(key, name)
        return _F.stochastic_depth(x, p, mode, training=train, key=key)

    return Module(_no_params, apply, name=name)
