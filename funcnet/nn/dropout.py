"""Dropout layers, as torch.nn's: identity in eval mode, a PRNG key in train mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from funcnet.nn.activation import _no_params
from funcnet.nn.module import Module

__all__ = ["Dropout"]


def Dropout(p: float = 0.5) -> Module:
    """Inverted dropout: in training, zero each element with probability ``p`` and
    scale the rest by ``1 / (1 - p)``; identity when ``train=False``.

    ``p`` is the drop probability, as in torch.nn.Dropout (stax's Dropout takes the
    keep probability). ``train=True`` needs ``key``.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"Dropout: p is the drop probability and must be in [0, 1], got {p!r}")

    def apply(params, x, *, key=None, train=False):
        del params
        if not train or p == 0.0:
            return x
        if key is None:
            raise ValueError(
                "Dropout(p=%g) in train mode needs a PRNG key: call apply(params, x, key=k, train=True) "
                "with k = jax.random.key(seed) (split a fresh one each step), or pass train=False" % p
            )
        if p == 1.0:
            return jnp.zeros_like(x)
        keep = jax.random.bernoulli(key, 1.0 - p, jnp.shape(x))
        return jnp.where(keep, x / (1.0 - p), jnp.zeros_like(x))

    return Module(_no_params, apply, name=f"Dropout(p={p})")
