"""Losses with torch's default reductions, on top of optax.

``cross_entropy(logits, labels)`` equals ``torch.nn.functional.cross_entropy`` (mean
over the batch of ``-log_softmax(logits)[label]``); ``mse_loss(pred, target)``
equals ``torch.nn.functional.mse_loss`` (mean of squared errors over all elements).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

__all__ = ["cross_entropy", "mse_loss", "accuracy", "check_labels"]

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(values, reduction: str):
    if reduction == "mean":
        return jnp.mean(values)
    if reduction == "sum":
        return jnp.sum(values)
    if reduction == "none":
        return values
    raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def check_labels(logits, labels) -> None:
    """Raise a clear error unless ``labels`` are integer class indices of shape ``logits.shape[:-1]``."""
    logits_shape = tuple(jnp.shape(logits))
    labels_shape = tuple(jnp.shape(labels))
    if len(logits_shape) < 1:
        raise ValueError(f"logits must have a class axis, got shape {logits_shape}")
    if labels_shape != logits_shape[:-1]:
        hint = " (labels look one-hot: pass labels.argmax(-1))" if labels_shape == logits_shape else ""
        raise ValueError(
            f"labels of shape {labels_shape} do not match logits of shape {logits_shape}: expected "
            f"integer class indices of shape {logits_shape[:-1]}{hint}"
        )
    if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
        raise TypeError(
            f"labels have dtype {jnp.result_type(labels)}, expected integer class indices "
            f"(e.g. labels.astype(jnp.int32)); for soft targets use optax.softmax_cross_entropy"
        )


def cross_entropy(logits: jax.Array, labels: jax.Array, *, reduction: str = "mean") -> jax.Array:
    """Softmax cross entropy from integer labels; logits ``(N, C)``, labels ``(N,)`` int.

    torch counterpart: ``F.cross_entropy(logits, labels)`` (reduction="mean").
    """
    check_labels(logits, labels)
    per_example = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return _reduce(per_example, reduction)


def mse_loss(pred: jax.Array, target: jax.Array, *, reduction: str = "mean") -> jax.Array:
    """Squared error, reduced over all elements; torch counterpart ``F.mse_loss``."""
    if jnp.shape(pred) != jnp.shape(target):
        raise ValueError(
            f"mse_loss: pred of shape {jnp.shape(pred)} and target of shape {jnp.shape(target)} differ; "
            f"expected equal shapes (torch would broadcast with a warning)"
        )
    return _reduce(optax.squared_error(pred, target), reduction)


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Fraction of rows whose argmax equals the label."""
    check_labels(logits, labels)
    return jnp.mean(jnp.argmax(logits, axis=-1) == labels)
