"""linear, as torch.nn.functional's: the one implementation ``funcnet.nn.Linear`` calls."""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["linear"]


def _linear(x, weight, bias, where: str, hint: str = ""):
    x, weight = jnp.asarray(x), jnp.asarray(weight)
    if weight.ndim not in (1, 2):
        raise ValueError(f"{where}: weight must be (out_features, in_features) or (in_features,), got shape "
                         f"{tuple(weight.shape)}")
    in_features = weight.shape[-1]
    if x.ndim == 0 or x.shape[-1] != in_features:
        raise ValueError(
            f"{where}: input of shape {tuple(x.shape)} has {x.shape[-1] if x.ndim else 'no'} features in its last "
            f"axis, expected {in_features}; reshape the input to (..., {in_features}){hint}")
    y = x @ weight.T
    if bias is not None:
        y = y + bias
    return y


def linear(input, weight, bias=None):
    """``input @ weight.T + bias``, torch.nn.functional.linear: input ``(..., in)``, weight
    ``(out, in)`` (or ``(in,)``, which drops the last axis), bias ``(out,)`` or None."""
    return _linear(input, weight, bias, "linear")
