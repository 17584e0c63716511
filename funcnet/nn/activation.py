"""Elementwise activations, as torch.nn's; no params, no state."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from funcnet.nn.module import Module

__all__ = ["ReLU", "Tanh", "Sigmoid", "Identity"]


def _no_params(key) -> dict:
    del key
    return {}


def elementwise(fn: Callable[[jax.Array], jax.Array], name: str) -> Module:
    """A module without params or state that applies ``fn`` to its input."""

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return fn(x)

    return Module(_no_params, apply, name=name)


def ReLU() -> Module:
    """max(x, 0), elementwise (torch.nn.ReLU; the articles' ``torch.clamp(x, min=0)``)."""
    return elementwise(jax.nn.relu, "ReLU()")


def Tanh() -> Module:
    return elementwise(jnp.tanh, "Tanh()")


def Sigmoid() -> Module:
    return elementwise(jax.nn.sigmoid, "Sigmoid()")


def Identity() -> Module:
    return elementwise(lambda x: x, "Identity()")
