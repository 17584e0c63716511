"""InstanceNorm1d/2d/3d and LocalResponseNorm, as torch.nn's; the math is
``funcnet.nn.functional.instance_norm`` / ``local_response_norm``.

InstanceNorm's defaults are torch's: ``affine=False``, ``track_running_stats=False`` (no
params, no state, instance statistics in both modes). With ``track_running_stats=True`` the
state is torch's buffers (``running_mean``, ``running_var``, ``num_batches_tracked``): train
mode normalizes with the instance statistics and advances the running ones (the batch mean of
the per-instance statistics, see the functional form); eval mode normalizes with the running
ones. torch never advances InstanceNorm's ``num_batches_tracked``, and ``momentum=None`` is
momentum 0 there (the running statistics stay put): both kept.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> norm = nn.InstanceNorm2d(3)
    >>> y = norm.apply(norm.init(None), jax.random.normal(jax.random.key(0), (2, 3, 8, 8)))
    >>> y.shape, bool(jnp.abs(y.mean(axis=(2, 3))).max() < 1e-5)  # each sample's channel: mean 0
    ((2, 3, 8, 8), True)
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp

from funcnet.nn.activation import _no_params
from funcnet.nn.functional.instance_norm import instance_norm, local_response_norm
from funcnet.nn.module import Module, check_params, require_state
from funcnet.nn.functional.norm import _check_eps, _check_positive_int
from funcnet.nn.functional._common import float_dtype
from funcnet.nn.norm import _counter_dtype

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm"]

_LAYOUT = {1: ("(C, L)", "(N, C, L)"), 2: ("(C, H, W)", "(N, C, H, W)"), 3: ("(C, D, H, W)", "(N, C, D, H, W)")}


def _instance_norm(n: int, num_features, eps, momentum, affine, track_running_stats, bias, dtype) -> Module:
    cls = f"InstanceNorm{n}d"
    C = _check_positive_int(num_features, "num_features", cls)
    eps = _check_eps(eps, cls)
    if momentum is not None and (isinstance(momentum, bool) or not isinstance(momentum, (int, float))
                                 or not 0.0 <= momentum <= 1.0):
        raise ValueError(f"{cls}: momentum must be a float in [0, 1] or None, got {momentum!r}")
    has_bias = bool(affine and bias)
    name = (f"{cls}({C}, eps={eps}, momentum={momentum}, affine={affine}, bias={has_bias}, "
            f"track_running_stats={track_running_stats})")
    expected = (["weight"] if affine else []) + (["bias"] if has_bias else [])
    factor = 0.0 if momentum is None else momentum  # torch passes momentum 0 for None

    def init(key):
        del key
        params = {}
        if affine:
            params["weight"] = jnp.ones((C,), float_dtype(dtype))
            if has_bias:
                params["bias"] = jnp.zeros((C,), float_dtype(dtype))
        return params

    def init_state():
        return {"running_mean": jnp.zeros((C,), float_dtype(dtype)), "running_var": jnp.ones((C,), float_dtype(dtype)),
                "num_batches_tracked": jnp.zeros((), _counter_dtype())}

    def apply(params, x, *, state=None, key=None, train=False):
        del key
        check_params(params, expected, name)
        if track_running_stats:
            state = require_state(state, init_state, name)
        x = jnp.asarray(x)
        if x.ndim not in (n + 1, n + 2):
            unbatched, batched = _LAYOUT[n]
            raise ValueError(f"{name}: expected {n + 1}D (unbatched) input {unbatched} or {n + 2}D (batched) input "
                             f"{batched}, got shape {tuple(x.shape)}")
        unbatched = x.ndim == n + 1
        h = x[None] if unbatched else x
        if h.shape[1] != C:
            if affine or track_running_stats:
                raise ValueError(f"{name}: expected input's size at dim={0 if unbatched else 1} to match "
                                 f"num_features ({C}), but got shape {tuple(x.shape)}")
            warnings.warn(f"{name}: input of shape {tuple(x.shape)} has {h.shape[1]} channels but num_features is "
                          f"{C}; without affine or running statistics num_features is not used (as torch)")
        w, b = params.get("weight"), params.get("bias")
        use_input_stats = train or not track_running_stats
        if track_running_stats:
            out = instance_norm(h, state["running_mean"], state["running_var"], w, b, use_input_stats, factor, eps)
            if use_input_stats:
                y, rm, rv = out
                state = {**state, "running_mean": rm, "running_var": rv}
            else:
                y = out
        else:
            y = instance_norm(h, None, None, w, b, True, factor, eps)
        y = y[0] if unbatched else y
        return (y, state) if track_running_stats else y

    return Module(init, apply, init_state if track_running_stats else None, name=name)


_DOC = """Instance normalization of {layout}, as torch.nn.{cls}: each channel of each example
    normalized over its {what} with its own mean and biased variance, then (``affine=True``)
    scaled and shifted per channel. params: ``{{"weight": ones (C,), "bias": zeros (C,)}}`` with
    ``affine=True``, else none; state (``track_running_stats=True``): torch's buffers. See the
    module docstring."""


def InstanceNorm1d(num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                   track_running_stats: bool = False, *, bias: bool = True, dtype=None) -> Module:
    """torch.nn.InstanceNorm1d: each sample's channel normalised over its length; ``(N, C, L)`` or ``(C, L)``."""
    return _instance_norm(1, num_features, eps, momentum, affine, track_running_stats, bias, dtype)


def InstanceNorm2d(num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                   track_running_stats: bool = False, *, bias: bool = True, dtype=None) -> Module:
    """torch.nn.InstanceNorm2d: each sample's channel normalised over H x W; ``(N, C, H, W)`` or ``(C, H, W)``."""
    return _instance_norm(2, num_features, eps, momentum, affine, track_running_stats, bias, dtype)


def InstanceNorm3d(num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                   track_running_stats: bool = False, *, bias: bool = True, dtype=None) -> Module:
    """torch.nn.InstanceNorm3d: each sample's channel normalised over D x H x W; ``(N, C, D, H, W)`` or ``(C, D, H,
    W)``."""
    return _instance_norm(3, num_features, eps, momentum, affine, track_running_stats, bias, dtype)


InstanceNorm1d.__doc__ = _DOC.format(layout="(N, C, L) or (C, L)", cls="InstanceNorm1d", what="length")
InstanceNorm2d.__doc__ = _DOC.format(layout="(N, C, H, W) or (C, H, W)", cls="InstanceNorm2d", what="H x W plane")
InstanceNorm3d.__doc__ = _DOC.format(layout="(N, C, D, H, W) or (C, D, H, W)", cls="InstanceNorm3d",
                                     what="D x H x W volume")


def LocalResponseNorm(size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Module:
    """Local response normalization across channels, as torch.nn.LocalResponseNorm (AlexNet):
    ``y = x / (k + alpha/size * sum of x**2 over size neighbouring channels) ** beta``; x:
    ``(N, C, *)``. See ``funcnet.nn.functional.local_response_norm``."""
    size = _check_positive_int(size, "size", "LocalResponseNorm")
    name = f"LocalResponseNorm({size}, alpha={alpha}, beta={beta}, k={k})"

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return local_response_norm(x, size, alpha, beta, k)

    return Module(_no_params, apply, name=name)
