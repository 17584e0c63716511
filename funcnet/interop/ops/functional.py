"""torch.nn.functional onto funcnet.nn.functional, which has torch's names and signatures.

Two differences are bridged here: the stochastic functions take the PRNG key ``key=``
(``random=True``; with ``training=False`` or ``dropout_p=0`` they need none), and
``batch_norm``/``instance_norm``, which torch lets mutate the running statistics (arguments 1
and 2), return ``(y, (new_running_mean, new_running_var))`` here in every mode
(``mutates=(1, 2)``), the statistics unchanged where torch leaves them alone."""

from __future__ import annotations

import jax.numpy as jnp

from funcnet.interop.ops._core import call, register
from funcnet.nn import functional as F
from funcnet.nn.functional.misc import drop, need_key

__all__ = ["batch_norm", "instance_norm", "dropout1d", "dropout3d", "alpha_dropout", "torch_dropout",
           "torch_embedding", "torch_batch_norm", "torch_layer_norm", "torch_adaptive_max_pool1d", "weight_norm"]

_RANDOM = {"dropout", "dropout2d", "stochastic_depth", "scaled_dot_product_attention"}
_MUTATING = {"batch_norm", "instance_norm"}


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """F.batch_norm as ``(y, (running_mean, running_var))``: advanced in training (as torch
    updates them in place), the same arrays otherwise."""
    out = F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if isinstance(out, tuple):
        return out[0], (out[1], out[2])
    return out, (running_mean, running_var)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    out = F.instance_norm(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
    if isinstance(out, tuple):
        return out[0], (out[1], out[2])
    return out, (running_mean, running_var)


def _channel_dropout(input, p, training, key, where, spatial):
    x = jnp.asarray(input)
    if not training or p == 0:
        return x
    need_key(key, where)
    return drop(x, key, p, x.shape[:-spatial] + (1,) * spatial)  # one draw per channel


def dropout1d(input, p=0.5, training=True, inplace=False, *, key=None):
    """Zeroes whole channels of ``(N, C, L)`` or ``(C, L)`` with probability p."""
    return _channel_dropout(input, p, training, key, "dropout1d", 1)


def dropout3d(input, p=0.5, training=True, inplace=False, *, key=None):
    """Zeroes whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` with probability p."""
    return _channel_dropout(input, p, training, key, "dropout3d", 3)


def alpha_dropout(input, p=0.5, training=False, inplace=False, *, key=None):
    """SELU's dropout: dropped units take ``-alpha * scale``, then an affine map keeps mean
    and variance."""
    x = jnp.asarray(input)
    if not training or p == 0:
        return x
    need_key(key, "alpha_dropout")
    import jax

    alpha_p = -1.7580993408473766
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    a = ((1 - p) * (1 + p * alpha_p ** 2)) ** -0.5
    b = -a * alpha_p * p
    return (a * jnp.where(keep, x, alpha_p) + b).astype(x.dtype)


def torch_dropout(input, p, train, *, key=None):
    """torch.dropout(input, p, train) (positional ``train``)."""
    return F.dropout(input, p, train, key=key)


def torch_embedding(weight, input, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """torch.embedding(weight, indices): the arguments in the other order from F.embedding."""
    return F.embedding(input, weight, None if padding_idx == -1 else padding_idx)


def torch_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True):
    """torch.batch_norm's order (weight and bias before the statistics), with F.batch_norm's result."""
    y, (rm, rv) = batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    return y, (rm, rv)


def torch_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return F.layer_norm(input, normalized_shape, weight, bias, eps)


def torch_adaptive_max_pool1d(input, output_size):
    """``torch.adaptive_max_pool1d(x, n)``: ``(values, indices)``, always."""
    return F.adaptive_max_pool1d(input, output_size, return_indices=True)


def weight_norm(v, g, dim=0):
    """``torch._weight_norm(v, g, dim)``: ``v * g / ||v||``, the norm over every axis but ``dim``
    (over all of ``v`` for ``dim=-1``), as torch.nn.utils.parametrizations.weight_norm computes the
    weight from its ``original1`` (v) and ``original0`` (g)."""
    v = jnp.asarray(v)
    axes = None if dim == -1 else tuple(i for i in range(v.ndim) if i != dim % v.ndim)
    return v * (g / jnp.sqrt(jnp.sum(v * v, axis=axes, keepdims=True)))


def _register_table():
    register(["torch._weight_norm"], weight_norm, lambda a, k: call("ops.weight_norm", a, k))
    for name in F.__all__:
        fn = getattr(F, name)
        if name in _MUTATING:
            continue
        if name in ("sigmoid", "tanh"):  # an integer tensor gives float32, as torch's
            from funcnet.interop.ops.arith import unary

            fn = unary(name, fn)
        register([f"F.{name}"], fn, (lambda n: lambda a, k: call(f"F.{n}", a, k))(name), random=name in _RANDOM)
    register(["F.batch_norm"], batch_norm, None, mutates=(1, 2))
    register(["F.instance_norm"], instance_norm, None, mutates=(1, 2))
    register(["torch.batch_norm"], torch_batch_norm, None, mutates=(3, 4))
    for fn in (dropout1d, dropout3d, alpha_dropout):
        register([f"F.{fn.__name__}"], fn, None, random=True)
    register(["F.feature_alpha_dropout"], alpha_dropout, None, random=True)
    register(["torch.dropout"], torch_dropout, None, random=True)
    register(["torch.embedding"], torch_embedding, None)
    register(["torch.layer_norm"], torch_layer_norm, lambda a, k: call("F.layer_norm", a[:5], {
        n: v for n, v in k.items() if n != "cudnn_enable"}))
    # torch.adaptive_max_pool1d returns (values, indices), where F's returns the values unless asked
    register(["torch.adaptive_max_pool1d"], torch_adaptive_max_pool1d, lambda a, k: call(
        "F.adaptive_max_pool1d", a, {**k, "return_indices": "True"}))
    for name in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                 "pixel_shuffle", "pixel_unshuffle", "group_norm", "cosine_similarity", "pairwise_distance",
                 "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "adaptive_avg_pool1d", "instance_norm"):
        if hasattr(F, name) and name != "instance_norm":
            register([f"torch.{name}"], getattr(F, name), (lambda n: lambda a, k: call(f"F.{n}", a, k))(name))


_register_table()
