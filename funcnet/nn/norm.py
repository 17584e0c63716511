"""Normalization layers, as torch.nn's: LayerNorm, GroupNorm, BatchNorm1d/2d, SyncBatchNorm.

LayerNorm and GroupNorm have no state. BatchNorm keeps torch's buffers as state
(``running_mean``, ``running_var``, ``num_batches_tracked``): ``apply(params, x, state=,
train=)`` returns ``(y, new_state)``; train mode normalizes with the batch statistics and
advances the running ones, eval mode reads them and returns the state unchanged.

Mixed precision: a bfloat16/float16 input is normalized in float32 (mean, variance and the
affine transform) and the result is cast back to the input's dtype: torch's autocast runs
layer_norm and group_norm in float32, and its batch_norm kernels accumulate half inputs in
float32. Running statistics keep their own dtype. Params and running statistics are built in
``dtype``, by default JAX's default float (float64 under x64). The math is
``funcnet.nn.functional``'s layer_norm / group_norm / batch_norm.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> bn = nn.BatchNorm1d(4)
    >>> params, state = bn.init(jax.random.key(0)), bn.init_state()
    >>> y, state = bn.apply(params, jnp.arange(8.0).reshape(2, 4), state=state, train=True)
    >>> [round(v, 3) for v in state["running_mean"].tolist()]  # 0.1 x the batch mean, torch's momentum
    [0.2, 0.3, 0.4, 0.5]
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

from funcnet.nn.functional import norm as _F
from funcnet.nn.functional._common import float_dtype
from funcnet.nn.functional.norm import _check_eps, _check_floating, _check_positive_int, _compute_dtype
from funcnet.nn.module import Module, check_params, describe, require_state

__all__ = ["LayerNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"]


def LayerNorm(normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
              bias: bool = True, *, dtype=None) -> Module:
    """Normalize over the trailing ``normalized_shape`` axes, as torch.nn.LayerNorm.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and the biased variance
    over the last ``len(normalized_shape)`` axes of each example. params: ``{"weight": ones,
    "bias": zeros}`` of shape ``normalized_shape`` (no ``bias`` when ``bias=False``, none at
    all when ``elementwise_affine=False``, as torch). x: ``(..., *normalized_shape)``, same
    shape out.
    """
    where = "LayerNorm"
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ValueError(f"{where}: normalized_shape must be a positive int or a non-empty tuple of positive "
                         f"ints (the trailing axes to normalize), got {normalized_shape!r}")
    eps = _check_eps(eps, where)
    has_bias = bool(elementwise_affine and bias)
    name = f"LayerNorm({shape}, eps={eps}, elementwise_affine={elementwise_affine}, bias={has_bias})"

    def init(key):
        del key
        params = {}
        if elementwise_affine:
            params["weight"] = jnp.ones(shape, float_dtype(dtype))
            if has_bias:
                params["bias"] = jnp.zeros(shape, float_dtype(dtype))
        return params

    expected = (["weight"] if elementwise_affine else []) + (["bias"] if has_bias else [])

    def apply(params, x, *, key=None, train=False):
        del key, train
        check_params(params, expected, name)
        return _F.layer_norm_(x, shape, params.get("weight"), params.get("bias"), eps, name)

    return Module(init, apply, name=name)


def GroupNorm(num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, *, bias: bool = True,
              dtype=None) -> Module:
    """Normalize each example over groups of channels, as torch.nn.GroupNorm.

    The ``num_channels`` channels split into ``num_groups`` groups of consecutive channels;
    each group of each example is normalized with its own mean and biased variance (over
    its channels and all spatial positions), then scaled and shifted per channel.
    params: ``{"weight": ones (C,), "bias": zeros (C,)}`` (none when ``affine=False``).
    x: ``(N, C, *)``, same shape out. ``GroupNorm(1, C)`` normalizes over ``(C, *)``,
    ``GroupNorm(C, C)`` is instance normalization.
    """
    where = "GroupNorm"
    _check_positive_int(num_groups, "num_groups", where)
    _check_positive_int(num_channels, "num_channels", where)
    if num_channels % num_groups:
        raise ValueError(f"{where}: num_channels ({num_channels}) must be divisible by num_groups ({num_groups}); "
                         f"pick num_groups among the divisors of {num_channels}")
    eps = _check_eps(eps, where)
    has_bias = bool(affine and bias)
    name = f"GroupNorm({num_groups}, {num_channels}, eps={eps}, affine={affine}, bias={has_bias})"

    def init(key):
        del key
        params = {}
        if affine:
            params["weight"] = jnp.ones((num_channels,), float_dtype(dtype))
            if has_bias:
                params["bias"] = jnp.zeros((num_channels,), float_dtype(dtype))
        return params

    expected = (["weight"] if affine else []) + (["bias"] if has_bias else [])

    def apply(params, x, *, key=None, train=False):
        del key, train
        check_params(params, expected, name)
        return _F.group_norm_(x, num_groups, params.get("weight"), params.get("bias"), eps, name, num_channels)

    return Module(init, apply, name=name)


def _counter_dtype():
    # torch's num_batches_tracked is int64; JAX has int64 only with x64 enabled.
    return jax.dtypes.canonicalize_dtype(jnp.int64)


def _axis_size(axis_name):
    """The size of the named axis, or None outside a pmap/shard_map that binds it."""
    if axis_name is None:
        return None
    try:
        return jax.lax.axis_size(axis_name)
    except NameError:
        return None


def _batch_norm(kind: str, ranks: tuple[int, ...] | None, num_features, eps, momentum, affine, track_running_stats,
                bias, axis_name, dtype, sync_fallback: bool) -> Module:
    where = kind
    _check_positive_int(num_features, "num_features", where)
    eps = _check_eps(eps, where)
    if momentum is not None and (isinstance(momentum, bool) or not isinstance(momentum, (int, float))
                                 or not 0.0 <= momentum <= 1.0):
        raise ValueError(f"{where}: momentum must be a float in [0, 1] (the weight of the new batch in the running "
                         f"statistics) or None (a cumulative moving average), got {momentum!r}")
    if axis_name is not None and not isinstance(axis_name, str):
        raise TypeError(f"{where}: axis_name must be the str name of a pmap/shard_map axis, got {describe(axis_name)}")
    has_bias = bool(affine and bias)
    name = (f"{kind}({num_features}, eps={eps}, momentum={momentum}, affine={affine}, bias={has_bias}, "
            f"track_running_stats={track_running_stats})")
    expected = (["weight"] if affine else []) + (["bias"] if has_bias else [])
    C = num_features

    def init(key):
        del key
        params = {}
        if affine:
            params["weight"] = jnp.ones((C,), float_dtype(dtype))
            if has_bias:
                params["bias"] = jnp.zeros((C,), float_dtype(dtype))
        return params

    def init_state():
        dt = float_dtype(dtype)
        return {"running_mean": jnp.zeros((C,), dt), "running_var": jnp.ones((C,), dt),
                "num_batches_tracked": jnp.zeros((), _counter_dtype())}

    def check_input(x):
        x = _check_floating(x, name)
        if ranks is not None and x.ndim not in ranks:
            want = " or ".join(f"{r}D" for r in ranks)
            layout = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)", 5: "(N, C, D, H, W)"}
            raise ValueError(f"{name}: expected {want} input {' or '.join(layout[r] for r in ranks)}, got "
                             f"{x.ndim}D input of shape {tuple(x.shape)}; use the BatchNorm of that rank "
                             f"(BatchNorm1d for (N, C[, L]), BatchNorm2d for (N, C, H, W), BatchNorm3d for "
                             f"(N, C, D, H, W))")
        if x.ndim < 2 or x.shape[1] != C:
            got = x.shape[1] if x.ndim >= 2 else "no"
            raise ValueError(f"{name}: input of shape {tuple(x.shape)} has {got} channels in axis 1, expected "
                             f"{C} (num_features); channels go in axis 1 (torch's layout) or build the layer "
                             f"with num_features={got}")
        return x

    def global_batch(train):
        """The size of the axis_name axis when train-mode statistics span it (SyncBatchNorm), else None."""
        size = _axis_size(axis_name) if train else None
        if axis_name is not None and train and size is None and not sync_fallback:
            raise NameError(f"{name}: axis_name={axis_name!r} is not bound here; call the model inside "
                            f"jax.pmap/shard_map over that axis (make_step(axis_name=...)) or build the layer "
                            f"with axis_name=None")
        return size

    def global_statistics(h, axes):
        # SyncBatchNorm: the global batch's statistics. Equal shards, so the global mean is the
        # mean of the shard means; the variance is taken about that global mean (two passes, no
        # E[x^2] - E[x]^2 cancellation).
        mean = jax.lax.pmean(jnp.mean(h, axis=axes), axis_name)
        var = jax.lax.pmean(jnp.mean(jnp.square(h - jnp.expand_dims(mean, axes)), axis=axes), axis_name)
        return mean, var

    def apply(params, x, *, state=None, key=None, train=False):
        del key
        check_params(params, expected, name)
        if track_running_stats:
            state = require_state(state, init_state, name)
        x = check_input(x)
        cdt = _compute_dtype(x.dtype)
        h = x.astype(cdt)
        axes = (0,) + tuple(range(2, x.ndim))
        bshape = (C,) + (1,) * (x.ndim - 2)
        y = None
        if train or not track_running_stats:
            n = math.prod(x.shape[a] for a in axes)
            if train and n <= 1:
                raise ValueError(f"{name}: expected more than 1 value per channel when training, got input of "
                                 f"shape {tuple(x.shape)}; use a batch of at least 2 (or eval mode, train=False)")
            size = global_batch(train)
            if size is None:  # biased batch mean and variance per channel, n elements behind them
                y, mean, var = _F.batch_norm_train(h, *(params[k].astype(cdt) if k in params else None
                                                        for k in ("weight", "bias")), axes, bshape, eps)
            else:
                (mean, var), n = global_statistics(h, axes), n * size
        else:
            mean, var = state["running_mean"].astype(cdt), state["running_var"].astype(cdt)
        if y is None:
            y = (h - mean.reshape(bshape)) * jax.lax.rsqrt(var.reshape(bshape) + eps)
            y = _F._affine(y, params.get("weight"), params.get("bias"), bshape, cdt)
        y = y.astype(x.dtype)
        if not track_running_stats:
            return y
        if not train:
            return y, state
        count = state["num_batches_tracked"] + 1
        factor = 1.0 / count.astype(cdt) if momentum is None else jnp.asarray(momentum, cdt)
        rm, rv = _F.running_update(state["running_mean"], state["running_var"], mean, var, n, factor, cdt)
        new_state = {"running_mean": rm, "running_var": rv,
                     "num_batches_tracked": count.astype(state["num_batches_tracked"].dtype)}
        return y, new_state

    return Module(init, apply, init_state if track_running_stats else None, name=name)


_BATCH_NORM_DOC = """Batch normalization over {layout}, as torch.nn.{kind}.

    Train mode: ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the batch mean and
    biased variance per channel (over every axis but axis 1); the running statistics advance as
    ``running = (1 - momentum) * running + momentum * batch`` with the *unbiased* batch variance
    for ``running_var`` (``momentum=None``: a cumulative average, factor ``1 /
    num_batches_tracked``), as torch. Eval mode: the running statistics; the state comes back
    unchanged. ``track_running_stats=False``: no state, batch statistics in both modes.

    params: ``{{"weight": ones (C,), "bias": zeros (C,)}}`` (none when ``affine=False``);
    state (``init_state()``): ``{{"running_mean": zeros (C,), "running_var": ones (C,),
    "num_batches_tracked": 0}}`` (int64 with x64 enabled, else int32).
    ``apply(params, x, state=, train=) -> (y, new_state)``. ``axis_name``: statistics over the
    global batch across that pmap/shard_map axis in train mode (as ``SyncBatchNorm``).
    """


def BatchNorm1d(num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                track_running_stats: bool = True, *, bias: bool = True, axis_name: str | None = None,
                dtype=None) -> Module:
    """torch.nn.BatchNorm1d over ``(N, C)`` or ``(N, C, L)``: batch statistics in training, running ones in
    evaluation."""
    return _batch_norm("BatchNorm1d", (2, 3), num_features, eps, momentum, affine, track_running_stats, bias,
                       axis_name, dtype, sync_fallback=False)


def BatchNorm2d(num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                track_running_stats: bool = True, *, bias: bool = True, axis_name: str | None = None,
                dtype=None) -> Module:
    """torch.nn.BatchNorm2d over ``(N, C, H, W)``: batch statistics in training, running ones in evaluation."""
    return _batch_norm("BatchNorm2d", (4,), num_features, eps, momentum, affine, track_running_stats, bias,
                       axis_name, dtype, sync_fallback=False)


def BatchNorm3d(num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                track_running_stats: bool = True, *, bias: bool = True, axis_name: str | None = None,
                dtype=None) -> Module:
    """torch.nn.BatchNorm3d over ``(N, C, D, H, W)``: batch statistics in training, running ones in evaluation."""
    return _batch_norm("BatchNorm3d", (5,), num_features, eps, momentum, affine, track_running_stats, bias,
                       axis_name, dtype, sync_fallback=False)


BatchNorm3d.__doc__ = _BATCH_NORM_DOC.format(layout="x of shape (N, C, D, H, W)", kind="BatchNorm3d")
BatchNorm1d.__doc__ = _BATCH_NORM_DOC.format(layout="x of shape (N, C) or (N, C, L)", kind="BatchNorm1d")
BatchNorm2d.__doc__ = _BATCH_NORM_DOC.format(layout="x of shape (N, C, H, W)", kind="BatchNorm2d")


def SyncBatchNorm(num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                  track_running_stats: bool = True, *, axis_name: str = "data", bias: bool = True,
                  dtype=None) -> Module:
    """BatchNorm whose train-mode statistics are those of the global batch, as torch.nn.SyncBatchNorm.

    Inside ``jax.pmap`` / ``shard_map`` over ``axis_name`` (``make_step(axis_name="data")``),
    the per-device batch mean and variance are averaged with ``lax.pmean`` (equal shards) and
    the unbiased correction counts the global batch, so every device normalizes with, and
    stores, the same statistics. Outside such a map it is BatchNorm of the local batch, as torch's
    SyncBatchNorm without a process group. x: ``(N, C, *)``. Params and state as BatchNorm2d;
    ``axis_name`` replaces torch's ``process_group``.
    """
    return _batch_norm("SyncBatchNorm", None, num_features, eps, momentum, affine, track_running_stats, bias,
                       axis_name, dtype, sync_fallback=True)
