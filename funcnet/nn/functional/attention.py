"""scaled_dot_product_attention, as torch.nn.functional's: the attention core that
``funcnet.nn.MultiheadAttention`` also runs.

The PRNG key of attention dropout is the keyword ``key=``; torch's ``key`` *tensor* is the
second positional input (query, key, value are positional-only here, as almost every torch
call passes them).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

__all__ = ["scaled_dot_product_attention"]


def softmax_zero_if_all_masked(scores):
    """Softmax over the last axis that gives 0 (not NaN) for a row whose scores are all -inf,
    as torch's scaled_dot_product_attention; the max is held out of the gradient, as the
    softmax's value does not depend on it."""
    m = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(scores - m)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total == 0, 1.0, total)


def attention(q, k, v, bias, *, causal: bool, scale, dropout_p: float, key, need_weights: bool, where: str):
    """``(softmax(q k^T * scale + bias) v, weights)`` over ``(..., L, E)``, ``(..., S, E)``,
    ``(..., S, Ev)``: ``bias`` (float, broadcast to ``(..., L, S)``) or None; ``causal``: query i
    sees keys j <= i (top-left aligned); the softmax in float32 for 16-bit inputs (torch
    autocast's rule); a fully masked row gives NaN weights with ``need_weights`` (torch's
    explicit softmax in MultiheadAttention) and zeros otherwise (torch's SDPA); dropout on the
    weights with ``key``."""
    scores = (q * scale) @ jnp.swapaxes(k, -1, -2)
    if bias is not None:
        scores = scores + bias
    if causal:
        L, S = scores.shape[-2:]
        scores = jnp.where(jnp.tril(jnp.ones((L, S), bool)), scores, -jnp.inf)
    wide = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
    weights = jax.nn.softmax(wide, axis=-1) if need_weights else softmax_zero_if_all_masked(wide)
    weights = weights.astype(scores.dtype)
    if dropout_p > 0.0:
        if key is None:
            raise ValueError(f"{where}: dropout_p={dropout_p} drops attention weights and needs a PRNG key: pass "
                             f"key=jax.random.key(seed) (the keyword key= is the PRNG key; the key tensor is the "
                             f"second positional input), or dropout_p=0.0 in eval mode")
        keep = jax.random.bernoulli(key, 1.0 - dropout_p, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_p), 0.0).astype(weights.dtype)
    return weights @ v, weights


def scaled_dot_product_attention(query, k, value, /, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False, *, key=None):
    """``softmax(query key^T * scale + mask) value``, torch.nn.functional.scaled_dot_product_attention.

    query ``(N, ..., L, E)``, key ``(N, ..., S, E)``, value ``(N, ..., S, Ev)`` -> ``(N, ..., L, Ev)``.
    ``attn_mask`` broadcasts to ``(N, ..., L, S)``: bool with **True = take part** (the opposite
    of MultiheadAttention's masks, as in torch) or float, added to the scores. ``is_causal``:
    the lower-triangular mask (top-left aligned); not together with ``attn_mask``, as torch.
    ``scale``: default ``1 / sqrt(E)``. ``dropout_p``: applied whenever it is > 0 (as torch's:
    pass ``dropout_p if train else 0.0``), with ``key=``. ``enable_gqa``: key/value may have
    fewer heads (axis -3) than query, a divisor of them; each is repeated for its group.
    A query row with every key masked gives zeros, as torch.
    """
    where = "scaled_dot_product_attention"
    if hasattr(key, "ndim") and jnp.issubdtype(jnp.result_type(key), jnp.floating):
        raise TypeError(f"{where}: key= is the PRNG key of attention dropout, got a float array of shape "
                        f"{tuple(jnp.shape(key))}; pass query, key and value positionally")
    q, kk, v = jnp.asarray(query), jnp.asarray(k), jnp.asarray(value)
    for what, x in (("query", q), ("key", kk), ("value", v)):
        if x.ndim < 2 or not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{where}: {what} must be a floating array (..., seq, features), got shape "
                             f"{tuple(x.shape)} and dtype {x.dtype}")
    if q.shape[-1] != kk.shape[-1] or kk.shape[-2] != v.shape[-2]:
        raise ValueError(f"{where}: query {tuple(q.shape)}, key {tuple(kk.shape)} and value {tuple(v.shape)} must "
                         f"share the feature size E (query and key) and the length S (key and value)")
    if enable_gqa and q.ndim >= 3 and kk.shape[-3] != q.shape[-3]:
        hq, hk = q.shape[-3], kk.shape[-3]
        if hk != v.shape[-3] or hq % hk:
            raise ValueError(f"{where}: enable_gqa needs key and value heads ({hk}, {v.shape[-3]}) equal and a "
                             f"divisor of the query heads ({hq})")
        kk = jnp.repeat(kk, hq // hk, axis=-3)
        v = jnp.repeat(v, hq // hk, axis=-3)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{where}: dropout_p must be in [0, 1], got {dropout_p!r}")
    L, S = q.shape[-2], kk.shape[-2]
    bias = None
    if attn_mask is not None:
        if is_causal:
            raise ValueError(f"{where}: pass either attn_mask or is_causal=True, not both (torch refuses both)")
        mask = jnp.asarray(attn_mask)
        try:
            jnp.broadcast_shapes(mask.shape, q.shape[:-2] + (L, S))
        except ValueError:
            raise ValueError(f"{where}: attn_mask of shape {tuple(mask.shape)} does not broadcast to "
                             f"{q.shape[:-2] + (L, S)} (..., L, S)") from None
        if mask.dtype == jnp.bool_:
            bias = jnp.where(mask, 0.0, -jnp.inf).astype(q.dtype)
        elif jnp.issubdtype(mask.dtype, jnp.floating):
            bias = mask.astype(q.dtype)
        else:
            raise TypeError(f"{where}: attn_mask must be bool (True = take part) or floating (added), got dtype "
                            f"{mask.dtype}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, _ = attention(q, kk, v, bias, causal=bool(is_causal), scale=scale, dropout_p=float(dropout_p), key=key,
                       need_weights=False, where=where)
    return out
