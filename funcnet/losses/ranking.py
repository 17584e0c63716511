"""Margin and embedding losses with torch.nn.functional's semantics: cosine_embedding_loss,
margin_ranking_loss, triplet_margin_loss. ``max(0, v)`` is torch's ``clamp_min``: its
gradient at exactly 0 is 1 (torch's ``self >= min`` rule), where ``jnp.maximum`` gives 0.5.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from funcnet.losses.core import _reduce

__all__ = ["cosine_embedding_loss", "margin_ranking_loss", "triplet_margin_loss"]


def _clamp_min0(v):
    return jnp.where(v >= 0, v, jnp.zeros_like(v))


def cosine_embedding_loss(input1, input2, target, *, margin: float = 0.0, reduction: str = "mean"):
    """``1 - cos(x1, x2)`` where target is 1, ``max(0, cos - margin)`` where it is -1
    (``F.cosine_embedding_loss``; 0 for other target values, as torch): inputs ``(N, D)`` or
    ``(D,)``, target ``(N,)`` or scalar. The cosine is torch's ``sum(x1 x2) / sqrt((|x1|^2 +
    1e-12)(|x2|^2 + 1e-12))``."""
    x1, x2, y = jnp.asarray(input1), jnp.asarray(input2), jnp.asarray(target)
    if x1.shape != x2.shape or x1.ndim not in (1, 2) or y.shape != x1.shape[:-1]:
        raise ValueError(f"cosine_embedding_loss: expected input1 and input2 of one shape (N, D) or (D,) and "
                         f"target (N,) or (), got {tuple(x1.shape)}, {tuple(x2.shape)} and {tuple(y.shape)}")
    eps = 1e-12
    prod = jnp.sum(x1 * x2, axis=-1)
    denom = jnp.sqrt((jnp.sum(x1 * x1, axis=-1) + eps) * (jnp.sum(x2 * x2, axis=-1) + eps))
    cos = prod / denom
    loss = jnp.where(y == 1, 1 - cos, 0) + jnp.where(y == -1, _clamp_min0(cos - margin), 0)
    return _reduce(loss, reduction)


def margin_ranking_loss(input1, input2, target, *, margin: float = 0.0, reduction: str = "mean"):
    """``max(0, -y (x1 - x2) + margin)`` (``F.margin_ranking_loss``); y is 1 or -1."""
    x1, x2, y = jnp.asarray(input1), jnp.asarray(input2), jnp.asarray(target)
    if not (x1.shape == x2.shape == y.shape):
        raise ValueError(f"margin_ranking_loss: input1 {tuple(x1.shape)}, input2 {tuple(x2.shape)} and target "
                         f"{tuple(y.shape)} must have the same shape")
    return _reduce(_clamp_min0(-y * (x1 - x2) + margin), reduction)


def _distance(a, b, p, eps):
    d = a - b + eps
    s = jnp.sum((d * jax.lax.stop_gradient(jnp.sign(d))) ** p, axis=-1)
    positive = s > 0
    return jnp.where(positive, jnp.where(positive, s, 1) ** (1.0 / p), 0)


def triplet_margin_loss(anchor, positive, negative, *, margin: float = 1.0, p: float = 2, eps: float = 1e-6,
                        swap: bool = False, reduction: str = "mean"):
    """``max(0, margin + d(a, p) - d(a, n))`` with ``d`` torch's ``pairwise_distance(., ., p, eps)``
    (``F.triplet_margin_loss``); ``swap`` uses ``min(d(a, n), d(p, n))`` (Balntas et al.)."""
    a, pos, neg = jnp.asarray(anchor), jnp.asarray(positive), jnp.asarray(negative)
    if not (a.ndim == pos.ndim == neg.ndim) or a.ndim not in (1, 2):
        raise ValueError(f"triplet_margin_loss: anchor {tuple(a.shape)}, positive {tuple(pos.shape)} and negative "
                         f"{tuple(neg.shape)} must all be (N, D) or all (D,)")
    d_pos = _distance(a, pos, p, eps)
    d_neg = _distance(a, neg, p, eps)
    if swap:
        d_neg = jnp.minimum(d_neg, _distance(pos, neg, p, eps))
    return _reduce(_clamp_min0(margin + d_pos - d_neg), reduction)
