"""torch.nn.functional's embedding, one_hot, normalize, cosine_similarity, pairwise_distance,
pad and dropout (plus torchvision's stochastic_depth): the one implementation the layers of
``funcnet.nn.embedding`` and ``funcnet.nn.dropout`` call.

Randomness takes a PRNG key: ``dropout(x, p, training=True, key=k)``. torch's functional
dropout defaults to ``training=True``, so, as in torch, ``F.dropout(x, 0.5)`` drops: here it
then needs ``key=``.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["embedding", "one_hot", "normalize", "cosine_similarity", "pairwise_distance", "dropout",
           "dropout2d", "stochastic_depth"]


def _describe(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__


def embedding_(indices, weight, padding_idx, where: str):
    """``weight[indices]`` with torch's padding_idx rule (its row gets no gradient) and NaN rows
    for out-of-range indices under a trace (an error when the indices are concrete)."""
    num_embeddings = weight.shape[0]
    dt = jnp.result_type(indices)
    if not jnp.issubdtype(dt, jnp.integer):
        raise TypeError(f"{where}: indices must be integers, got {_describe(indices)}; pass "
                        f"indices.astype(jnp.int32)")
    if not isinstance(indices, jax.core.Tracer):
        host = np.asarray(indices)
        bad = host[(host < 0) | (host >= num_embeddings)]
        if bad.size:
            raise ValueError(f"{where}: indices {np.unique(bad)[:8].tolist()} are out of range, expected "
                             f"indices in [0, {num_embeddings - 1}]; check the tokenizer/vocabulary size")
    indices = jnp.asarray(indices)
    if padding_idx is not None:
        # the padding row's value passes through, its gradient does not (torch's embedding_backward)
        weight = weight.at[padding_idx].set(jax.lax.stop_gradient(weight[padding_idx]))
    valid = (indices >= 0) & (indices < num_embeddings)
    rows = jnp.take(weight, jnp.where(valid, indices, 0), axis=0)
    return jnp.where(valid[..., None], rows, jnp.asarray(jnp.nan, weight.dtype))


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False):
    """``weight[input]``, torch.nn.functional.embedding: input integer ``(*)``, weight ``(V, D)``
    -> ``(*, D)``. ``padding_idx`` (negative counts from the end): that row gets no gradient.
    Refused: ``max_norm`` (torch renormalizes rows of ``weight`` in place), ``scale_grad_by_freq``
    and ``sparse``."""
    weight = jnp.asarray(weight)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-d (num_embeddings, embedding_dim), got shape "
                         f"{tuple(weight.shape)}")
    if max_norm is not None:
        raise ValueError(f"embedding: max_norm={max_norm!r} is not supported: torch renormalizes the looked-up rows "
                         f"of the weight in place, a parameter update a pure function cannot make; pass None")
    if scale_grad_by_freq is not False or sparse is not False:
        raise ValueError("embedding: scale_grad_by_freq=True and sparse=True are not supported (JAX gradients are "
                         "dense); pass False")
    if padding_idx is not None:
        V = weight.shape[0]
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) or not -V <= padding_idx < V:
            raise ValueError(f"embedding: padding_idx={padding_idx!r} must be an int within [{-V}, {V - 1}]")
        padding_idx %= V
    return embedding_(input, weight, padding_idx, "embedding")


def one_hot(tensor, num_classes: int = -1):
    """``(*)`` integer class indices -> ``(*, num_classes)`` of 0/1, integer (int64 under x64,
    else int32), torch.nn.functional.one_hot. ``num_classes=-1`` takes ``max + 1`` of the
    indices, which needs concrete values (outside jit); inside jit pass it. An index
    outside ``[0, num_classes)`` raises when the indices are concrete, as torch."""
    t = tensor
    if not jnp.issubdtype(jnp.result_type(t), jnp.integer):
        raise TypeError(f"one_hot: tensor must hold integer class indices, got {_describe(t)}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or (num_classes < 0 and num_classes != -1):
        raise ValueError(f"one_hot: num_classes must be a non-negative int or -1 (infer), got {num_classes!r}")
    traced = isinstance(t, jax.core.Tracer)
    if num_classes == -1:
        if traced:
            raise ValueError("one_hot: num_classes=-1 infers the count from the values, which are not known inside "
                             "jit/vmap; pass num_classes explicitly")
        host = np.asarray(t)
        num_classes = int(host.max()) + 1 if host.size else 0
    if not traced:
        host = np.asarray(t)
        bad = host[(host < 0) | (host >= num_classes)]
        if bad.size:
            raise ValueError(f"one_hot: class values {np.unique(bad)[:8].tolist()} are outside [0, {num_classes - 1}]"
                             f"; pass a larger num_classes or fix the labels")
    t = jnp.asarray(t)
    return (t[..., None] == jnp.arange(num_classes)).astype(jax.dtypes.canonicalize_dtype(jnp.int64))


def _pnorm(x, p, axis, keepdims):
    """The p-norm along ``axis`` with a zero (not NaN) gradient at a zero vector, as torch's."""
    if p == float("inf"):
        return jnp.max(jnp.abs(x), axis=axis, keepdims=keepdims)
    s = jnp.sum((x * jax.lax.stop_gradient(jnp.sign(x))) ** p, axis=axis, keepdims=keepdims)
    positive = s > 0
    return jnp.where(positive, jnp.where(positive, s, 1) ** (1.0 / p), 0)


def normalize(input, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None):
    """``x / max(||x||_p, eps)`` along ``dim``, torch.nn.functional.normalize."""
    if out is not None:
        raise ValueError("normalize: out= is not supported (JAX arrays are immutable); use the returned array")
    x = jnp.asarray(input)
    if x.ndim == 0 or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"normalize: input of shape {tuple(x.shape)} has no dimension {dim}")
    return x / jnp.maximum(_pnorm(x, p, dim, True), eps)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8):
    """``sum(x1 * x2) / (max(||x1||, eps) * max(||x2||, eps))`` along ``dim`` after broadcasting,
    torch.nn.functional.cosine_similarity (each vector divided by its clamped norm first, as torch)."""
    x1, x2 = jnp.asarray(x1), jnp.asarray(x2)
    try:
        shape = jnp.broadcast_shapes(x1.shape, x2.shape)
    except ValueError:
        raise ValueError(f"cosine_similarity: x1 of shape {tuple(x1.shape)} and x2 of shape {tuple(x2.shape)} do not "
                         f"broadcast") from None
    if not -len(shape) <= dim < max(len(shape), 1):
        raise ValueError(f"cosine_similarity: dim={dim} is not a dimension of the broadcast shape {shape}")
    x1, x2 = jnp.broadcast_to(x1, shape), jnp.broadcast_to(x2, shape)
    n1 = jnp.maximum(_pnorm(x1, 2, dim, True), eps)
    n2 = jnp.maximum(_pnorm(x2, 2, dim, True), eps)
    return jnp.sum((x1 / n1) * (x2 / n2), axis=dim)


def pairwise_distance(x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
    """``||x1 - x2 + eps||_p`` over the last axis, torch.nn.functional.pairwise_distance."""
    x1, x2 = jnp.asarray(x1), jnp.asarray(x2)
    d = x1 - x2 + eps
    if d.ndim == 0:
        raise ValueError("pairwise_distance: inputs must have at least one dimension")
    return _pnorm(d, p, -1, keepdim)


def _check_p(p, where: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{where}: p is the drop probability and must be in [0, 1], got {p!r}")
    return p


def need_key(key, where: str) -> None:
    if key is None:
        raise ValueError(
            f"{where} in train mode needs a PRNG key: call apply(params, x, key=k, train=True) "
            f"with k = jax.random.key(seed) (split a fresh one each step), or pass train=False")


def drop(x, key, p: float, mask_shape):
    """x masked by a Bernoulli(1 - p) mask of ``mask_shape`` broadcast over it, kept entries
    scaled by ``1 / (1 - p)``."""
    x = jnp.asarray(x)
    if p == 1.0:
        return jnp.zeros_like(x)
    keep = jax.random.bernoulli(key, 1.0 - p, mask_shape)
    return jnp.where(keep, x / (1.0 - p), jnp.zeros_like(x))


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False, *, key=None):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)`` when
    ``training`` (torch's default, True: pass ``key=``); identity otherwise."""
    del inplace
    _check_p(p, "dropout")
    if not training or p == 0.0:
        return input
    if key is None:
        raise ValueError(f"dropout(p={p}, training=True) needs a PRNG key: pass key=jax.random.key(seed) (a fresh "
                         f"one each step), or training=False (torch's functional dropout defaults to training=True)")
    return drop(input, key, p, jnp.shape(input))


def dropout2d(input, p: float = 0.5, training: bool = True, inplace: bool = False, *, key=None):
    """Zero whole channels of ``(N, C, H, W)`` (or ``(C, H, W)``) with probability ``p`` when
    ``training``; see ``funcnet.nn.Dropout2d``."""
    del inplace
    _check_p(p, "dropout2d")
    shape = tuple(jnp.shape(input))
    if len(shape) not in (3, 4):
        raise ValueError(f"dropout2d: input of shape {shape} has {len(shape)} dimensions, expected 4 (N, C, H, W) "
                         f"or 3 (C, H, W)")
    if not training or p == 0.0:
        return input
    if key is None:
        raise ValueError(f"dropout2d(p={p}, training=True) needs a PRNG key: pass key=jax.random.key(seed)")
    return drop(input, key, p, shape[:-2] + (1, 1))


def check_stochastic_depth(p, mode, where: str) -> None:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{where}: drop probability has to be between 0 and 1, but got {p!r}")
    if mode not in ("batch", "row"):
        raise ValueError(f"{where}: mode has to be either 'batch' or 'row', but got {mode!r}")


def stochastic_depth(input, p: float, mode: str, training: bool = True, *, key=None):
    """torchvision.ops.stochastic_depth: when ``training``, drop the whole input (``mode="batch"``)
    or each example along axis 0 (``mode="row"``) with probability ``p``, scaling what is kept
    by ``1 / (1 - p)``; identity otherwise. Needs ``key`` when it drops."""
    check_stochastic_depth(p, mode, "stochastic_depth")
    x = jnp.asarray(input)
    if not training or p == 0.0:
        return x
    if key is None:
        raise ValueError(f"stochastic_depth(p={p}, mode={mode!r}) in train mode needs a PRNG key: pass "
                         f"key=jax.random.key(seed), or training=False")
    shape = (x.shape[0],) + (1,) * (x.ndim - 1) if mode == "row" else (1,) * x.ndim
    survival = 1.0 - p
    keep = jax.random.bernoulli(key, survival, shape)
    noise = keep.astype(x.dtype)
    if survival > 0.0:
        noise = noise / survival
    return x * noise
