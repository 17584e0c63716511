"""Layers as pairs of pure functions.

A ``Module`` is a NamedTuple ``(init, apply)``:

- ``init(key) -> params``: a pytree (nested dicts of arrays) whose names, shapes
  and layouts are those of the matching torch module, so a torch ``state_dict``
  loads without renaming (``nn.Linear`` weight is ``(out, in)``).
- ``apply(params, x, *, key=None, train=False) -> y``: pure. ``train`` plays the
  part of ``module.train()`` / ``module.eval()``; stochastic layers (Dropout) need
  ``key`` when ``train=True``. Treat ``train`` as static under ``jax.jit``
  (``static_argnames="train"``): one compile per value.

torch counterpart: ``nn.Module`` holds its parameters and flips ``self.training``;
here the parameters are an argument and the mode is a keyword.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from funcnet import init as _init

__all__ = [
    "Module",
    "Linear",
    "ReLU",
    "Tanh",
    "Sigmoid",
    "Identity",
    "Dropout",
    "Flatten",
    "Sequential",
    "MLP",
]

Params = Any


class Module(NamedTuple):
    """``init(key) -> params`` and ``apply(params, x, *, key=None, train=False) -> y``."""

    init: Callable[..., Params]
    apply: Callable[..., jax.Array]


def _no_params(key) -> dict:
    del key
    return {}


def _elementwise(fn: Callable[[jax.Array], jax.Array]) -> Module:
    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return fn(x)

    return Module(_no_params, apply)


def ReLU() -> Module:
    """max(x, 0), elementwise (torch.nn.ReLU; the articles' ``torch.clamp(x, min=0)``)."""
    return _elementwise(jax.nn.relu)


def Tanh() -> Module:
    return _elementwise(jnp.tanh)


def Sigmoid() -> Module:
    return _elementwise(jax.nn.sigmoid)


def Identity() -> Module:
    return _elementwise(lambda x: x)


def Linear(
    in_features: int,
    out_features: int,
    bias: bool = True,
    *,
    weight_init: Callable = _init.linear_weight,
    bias_init: Callable | None = None,
    dtype=jnp.float32,
) -> Module:
    """y = x @ weight.T + bias, as torch.nn.Linear.

    params: ``{"weight": (out, in), "bias": (out,)}``; x: ``(..., in)`` -> ``(..., out)``.
    Default init is torch's (``init.linear_weight`` / ``init.linear_bias``).
    """
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"Linear: {name} must be a positive int, got {value!r}")

    def init_fn(key):
        wkey, bkey = jax.random.split(key)
        params = {"weight": weight_init(wkey, (out_features, in_features), dtype)}
        if bias:
            if bias_init is None:
                params["bias"] = _init.linear_bias(bkey, (out_features,), dtype, fan_in=in_features)
            else:
                params["bias"] = bias_init(bkey, (out_features,), dtype)
        return params

    def apply(params, x, *, key=None, train=False):
        del key, train
        x = jnp.asarray(x)
        if x.ndim == 0 or x.shape[-1] != in_features:
            raise ValueError(
                f"Linear({in_features}, {out_features}): input of shape {tuple(x.shape)} has "
                f"{x.shape[-1] if x.ndim else 'no'} features in its last axis, expected {in_features}; "
                f"reshape the input to (..., {in_features}) (nn.Flatten() flattens images)"
            )
        y = x @ params["weight"].T
        if "bias" in params:
            y = y + params["bias"]
        return y

    return Module(init_fn, apply)


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

    return Module(_no_params, apply)


def Flatten(start_dim: int = 1, end_dim: int = -1) -> Module:
    """Flatten axes ``start_dim..end_dim`` into one, as torch.nn.Flatten."""

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = jnp.asarray(x)
        start = start_dim % x.ndim
        end = end_dim % x.ndim
        if start > end:
            raise ValueError(
                f"Flatten(start_dim={start_dim}, end_dim={end_dim}) is empty for input of shape {x.shape}"
            )
        return x.reshape(x.shape[:start] + (-1,) + x.shape[end + 1:])

    return Module(_no_params, apply)


def Sequential(*layers: Module) -> Module:
    """Apply ``layers`` in order, as torch.nn.Sequential.

    Children are named "0", "1", ... by position; children without parameters
    (ReLU, Dropout, Flatten) have no entry, so ``Sequential(Linear, ReLU, Linear)``
    has params ``{"0": ..., "2": ...}`` and torch's state_dict keys. The PRNG key
    given to ``init`` / ``apply`` is split once per child.
    """
    if len(layers) == 1 and isinstance(layers[0], (list, tuple)) and not isinstance(layers[0], Module):
        layers = tuple(layers[0])
    for i, layer in enumerate(layers):
        if not isinstance(layer, Module):
            raise TypeError(
                f"Sequential: child {i} is {type(layer).__name__}, expected a funcnet.nn.Module; "
                f"call the factory (nn.ReLU(), not nn.ReLU)"
            )

    def init_fn(key):
        params = {}
        for i, (layer, k) in enumerate(zip(layers, jax.random.split(key, max(len(layers), 1)))):
            p = layer.init(k)
            if jax.tree_util.tree_leaves(p):
                params[str(i)] = p
        return params

    def apply(params, x, *, key=None, train=False):
        keys = [None] * len(layers) if key is None else list(jax.random.split(key, max(len(layers), 1)))
        for i, layer in enumerate(layers):
            x = layer.apply(params.get(str(i), {}), x, key=keys[i], train=train)
        return x

    return Module(init_fn, apply)


def MLP(
    sizes: Sequence[int],
    activation: Callable[[], Module] = ReLU,
    *,
    dropout: float = 0.0,
    bias: bool = True,
) -> Module:
    """Linear layers of ``sizes`` with ``activation()`` between them (none after the last).

    ``MLP([784, 128, 10])`` is ``Sequential(Linear(784, 128), ReLU(), Linear(128, 10))``,
    params ``{"0": ..., "2": ...}``. With ``dropout > 0`` a Dropout follows each activation.
    """
    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError(f"MLP: sizes needs at least an input and an output size, got {sizes}")
    layers: list[Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(Linear(n_in, n_out, bias))
        if i < len(sizes) - 2:
            layers.append(activation())
            if dropout > 0.0:
                layers.append(Dropout(dropout))
    return Sequential(*layers)
