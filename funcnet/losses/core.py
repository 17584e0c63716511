"""The losses the training loop uses most: cross_entropy, nll_loss, mse_loss, l1_loss,
binary_cross_entropy_with_logits, with torch.nn.functional's semantics, on top of optax.

Every loss takes ``reduction="mean" | "sum" | "none"`` (keyword-only here; torch's
deprecated ``size_average``/``reduce`` are not taken).

The class axis. funcnet's classification losses take the classes on the **last** axis
by default (``class_axis=-1``): logits ``(N, C)`` or ``(..., C)`` with labels ``(...)``,
so a GPT passes logits ``(B, T, V)`` and labels ``(B, T)``. torch puts the classes on
axis 1 (``(N, C, d1, ...)`` with labels ``(N, d1, ...)``); pass ``class_axis=1`` for that
layout. For 2-d logits ``(N, C)`` the two agree. The default is not guessed from the
shapes, because ``(N, C, d)`` with labels ``(N, d)`` and ``(N, d, C)`` with labels
``(N, d)`` cannot be told apart when ``C == d``.

Labels outside ``[0, C)`` that are not ``ignore_index``: torch raises. Here, when the
labels are concrete (an eager call) a ValueError names them; under ``jit``/``vmap``
nothing can raise, so the loss of each such element is NaN and the reduced loss is NaN
(a gather would otherwise clamp the label to a real class and return a plausible
number). The gradient flows from the valid elements only.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy_with_logits", "accuracy",
           "check_labels"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _reduce(values, reduction: str):
    _check_reduction(reduction)
    if reduction == "mean":
        return jnp.mean(values)
    if reduction == "sum":
        return jnp.sum(values)
    return values


def _class_axis(shape, class_axis, where: str) -> int:
    if isinstance(class_axis, bool) or not isinstance(class_axis, int):
        raise TypeError(f"{where}: class_axis must be an int, got {class_axis!r}")
    if len(shape) < 1:
        raise ValueError(f"{where}: logits must have a class axis, got shape {tuple(shape)}")
    if not -len(shape) <= class_axis < len(shape):
        raise ValueError(f"{where}: class_axis={class_axis} is not an axis of logits of shape {tuple(shape)}; "
                         f"expected class_axis in [{-len(shape)}, {len(shape) - 1}]")
    return class_axis % len(shape)


def check_labels(logits, labels, *, class_axis: int = -1) -> None:
    """Raise a clear error unless ``labels`` are integer class indices of the shape of
    ``logits`` without its class axis (``logits.shape[:-1]`` by default)."""
    logits_shape = tuple(jnp.shape(logits))
    labels_shape = tuple(jnp.shape(labels))
    if len(logits_shape) < 1:
        raise ValueError(f"logits must have a class axis, got shape {logits_shape}")
    axis = _class_axis(logits_shape, class_axis, "check_labels")
    expected = logits_shape[:axis] + logits_shape[axis + 1:]
    if labels_shape != expected:
        hint = " (labels look one-hot: pass labels.argmax(-1))" if labels_shape == logits_shape else ""
        if not hint and axis == len(logits_shape) - 1 and len(logits_shape) > 2 and \
                labels_shape == logits_shape[:1] + logits_shape[2:]:
            hint = " (for torch's layout with the classes on axis 1, (N, C, d1, ...), pass class_axis=1)"
        raise ValueError(
            f"labels of shape {labels_shape} do not match logits of shape {logits_shape}: expected "
            f"integer class indices of shape {expected}{hint}"
        )
    if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
        raise TypeError(
            f"labels have dtype {jnp.result_type(labels)}, expected integer class indices "
            f"(e.g. labels.astype(jnp.int32)); for soft targets pass class probabilities of the logits' shape"
        )


def _check_label_range(labels, num_classes: int, ignore_index: int, where: str) -> None:
    """Raise on out-of-range labels when they are concrete; under a trace, the caller NaNs them."""
    if isinstance(labels, jax.core.Tracer):
        return
    host = np.asarray(labels)
    bad = host[((host < 0) | (host >= num_classes)) & (host != ignore_index)]
    if bad.size:
        raise ValueError(
            f"{where}: labels {np.unique(bad)[:8].tolist()} are outside the {num_classes} classes "
            f"[0, {num_classes - 1}] and are not ignore_index={ignore_index}; check the labels or the model's "
            f"number of outputs (inside jit such labels make the loss NaN)")


def _check_weight(weight, num_classes: int, where: str):
    if weight is None:
        return None
    weight = jnp.asarray(weight)
    if weight.shape != (num_classes,):
        raise ValueError(f"{where}: weight of shape {tuple(weight.shape)} must have one entry per class, "
                         f"expected shape ({num_classes},)")
    return weight


def _weighted_nll(log_probs, labels, weight, ignore_index: int, reduction: str, where: str, smoothing=0.0):
    """torch's nll_loss (and cross_entropy's label smoothing) with the classes on the last axis."""
    num_classes = log_probs.shape[-1]
    weight = _check_weight(weight, num_classes, where)
    _check_label_range(labels, num_classes, ignore_index, where)
    labels = jnp.asarray(labels)
    ignored = labels == ignore_index
    valid = (labels >= 0) & (labels < num_classes)
    safe = jnp.where(valid & ~ignored, labels, 0)
    picked = jnp.take_along_axis(log_probs, safe[..., None], axis=-1)[..., 0]
    w = jnp.ones_like(picked) if weight is None else weight.astype(log_probs.dtype)[safe]
    w = jnp.where(ignored, jnp.zeros_like(w), w)
    loss = -w * picked
    if smoothing:
        # torch: (1 - eps) * nll + eps / C * (-sum_c weight_c * log_p_c), the second term
        # zero where ignored and, for "mean", divided by the same sum of target weights
        per_class = log_probs if weight is None else log_probs * weight.astype(log_probs.dtype)
        smooth = jnp.where(ignored, 0.0, -jnp.sum(per_class, axis=-1)).astype(loss.dtype)
        loss = (1.0 - smoothing) * loss + (smoothing / num_classes) * smooth
    loss = jnp.where(valid | ignored, loss, jnp.asarray(jnp.nan, loss.dtype))
    _check_reduction(reduction)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    # the weighted mean divides by the summed weights of the non-ignored targets (0/0 = NaN
    # when all are ignored, as torch)
    return jnp.sum(loss) / jnp.sum(w)


def _check_smoothing(label_smoothing, where: str) -> float:
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real) or \
            not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{where}: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    return float(label_smoothing)


def nll_loss(log_probs: jax.Array, target: jax.Array, weight: jax.Array | None = None, *, ignore_index: int = -100,
             reduction: str = "mean", class_axis: int = -1) -> jax.Array:
    """Negative log likelihood of integer targets, ``F.nll_loss``: ``-weight[y] * log_probs[y]``.

    log_probs: ``(..., C)`` (``(N, C, d1, ...)`` with ``class_axis=1``); target: integer
    ``(...)``; weight: ``(C,)``. Targets equal to ``ignore_index`` contribute 0 and are left
    out of the mean, which is ``sum(loss) / sum(weight[y])`` over the non-ignored targets.
    """
    where = "nll_loss"
    log_probs = jnp.asarray(log_probs)
    axis = _class_axis(log_probs.shape, class_axis, where)
    check_labels(log_probs, target, class_axis=axis)
    return _weighted_nll(jnp.moveaxis(log_probs, axis, -1), target, weight, ignore_index, reduction, where)


def cross_entropy(logits: jax.Array, labels: jax.Array, weight: jax.Array | None = None, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, class_axis: int = -1) -> jax.Array:
    """Softmax cross entropy, ``F.cross_entropy(logits, labels)`` with torch's semantics.

    logits: ``(..., C)`` (or ``(N, C, d1, ...)`` with ``class_axis=1``, torch's layout);
    labels: integer class indices of the shape of logits without the class axis, or
    class probabilities of the logits' shape (float). weight: ``(C,)``.

    Integer labels: ``-weight[y] * log_softmax(logits)[y]``, 0 for ``ignore_index``; the mean
    divides by the summed weights of the non-ignored labels. ``label_smoothing=eps`` adds
    ``eps / C * (-sum_c weight_c * log_p_c)`` to ``(1 - eps)`` times that, as torch.
    Probability targets: ``-sum_c weight_c * p_c * log_p_c`` with ``p`` smoothed to
    ``(1 - eps) p + eps / C``; the mean divides by the number of positions
    (``ignore_index`` does not apply).
    """
    where = "cross_entropy"
    logits = jnp.asarray(logits)
    axis = _class_axis(logits.shape, class_axis, where)
    eps = _check_smoothing(label_smoothing, where)
    _check_reduction(reduction)
    num_classes = logits.shape[axis]
    if tuple(jnp.shape(labels)) == tuple(logits.shape) and jnp.issubdtype(jnp.result_type(labels), jnp.floating):
        weight = _check_weight(weight, num_classes, where)
        target = jnp.moveaxis(jnp.asarray(labels), axis, -1)
        logits = jnp.moveaxis(logits, axis, -1)
        if eps:
            target = optax.smooth_labels(target, eps)
        if weight is None:
            per_position = optax.softmax_cross_entropy(logits, target)
        else:
            per_position = -jnp.sum(jax.nn.log_softmax(logits) * target * weight.astype(logits.dtype), axis=-1)
        return _reduce(per_position, reduction)
    check_labels(logits, labels, class_axis=axis)
    logits = jnp.moveaxis(logits, axis, -1)
    if weight is None and not eps:
        # the common case through optax's form: with a take_along_axis of log_softmax instead,
        # XLA kept 4.2 MB more temporaries in a 784-1024-10 train step at batch 1024 (+49%)
        _check_label_range(labels, num_classes, ignore_index, where)
        labels = jnp.asarray(labels)
        ignored = labels == ignore_index
        valid = (labels >= 0) & (labels < num_classes)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(valid, labels, 0))
        loss = jnp.where(ignored, jnp.zeros_like(loss), loss)
        loss = jnp.where(valid | ignored, loss, jnp.asarray(jnp.nan, loss.dtype))
        if reduction == "none":
            return loss
        if reduction == "sum":
            return jnp.sum(loss)
        return jnp.sum(loss) / jnp.sum(~ignored).astype(loss.dtype)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return _weighted_nll(log_probs, labels, weight, ignore_index, reduction, where, smoothing=eps)


def _same_shapes(a, b, names: str, where: str) -> None:
    if jnp.shape(a) != jnp.shape(b):
        first, second = names.split(",")
        raise ValueError(
            f"{where}: {first} of shape {jnp.shape(a)} and {second} of shape {jnp.shape(b)} differ; "
            f"expected equal shapes (torch would broadcast with a warning)"
        )


def mse_loss(pred: jax.Array, target: jax.Array, *, reduction: str = "mean") -> jax.Array:
    """Squared error ``(pred - target)**2``, reduced over all elements; ``F.mse_loss``."""
    _same_shapes(pred, target, "pred,target", "mse_loss")
    return _reduce(optax.squared_error(pred, target), reduction)


def l1_loss(pred: jax.Array, target: jax.Array, *, reduction: str = "mean") -> jax.Array:
    """Absolute error ``|pred - target|``, reduced over all elements; ``F.l1_loss``."""
    _same_shapes(pred, target, "pred,target", "l1_loss")
    d = jnp.asarray(pred) - jnp.asarray(target)
    # torch's gradient is sign(d), 0 where pred == target (jnp.abs has gradient 1 there)
    return _reduce(d * jax.lax.stop_gradient(jnp.sign(d)), reduction)


def binary_cross_entropy_with_logits(input: jax.Array, target: jax.Array, weight: jax.Array | None = None, *,
                                     reduction: str = "mean", pos_weight: jax.Array | None = None) -> jax.Array:
    """Sigmoid cross entropy, ``F.binary_cross_entropy_with_logits``:
    ``-weight * (pos_weight * t * log sigmoid(x) + (1 - t) * log(1 - sigmoid(x)))``.

    input and target: the same shape (target: probabilities in [0, 1]); ``weight``
    broadcasts to it, ``pos_weight`` broadcasts along the last axis (one per class).
    """
    where = "binary_cross_entropy_with_logits"
    _same_shapes(input, target, "input,target", where)
    _check_reduction(reduction)
    x, t = jnp.asarray(input), jnp.asarray(target)
    for name, value in (("weight", weight), ("pos_weight", pos_weight)):
        if value is not None:
            try:
                jnp.broadcast_shapes(jnp.shape(value), x.shape)
            except ValueError:
                raise ValueError(f"{where}: {name} of shape {jnp.shape(value)} does not broadcast to the input's "
                                 f"shape {tuple(x.shape)}") from None
    if pos_weight is None:
        loss = optax.sigmoid_binary_cross_entropy(x, t)
    else:
        # -log sigmoid(x) = softplus(-x), -log(1 - sigmoid(x)) = softplus(x)
        loss = pos_weight * t * jax.nn.softplus(-x) + (1 - t) * jax.nn.softplus(x)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Fraction of rows whose argmax (over the last axis) equals the label."""
    check_labels(logits, labels)
    return jnp.mean(jnp.argmax(logits, axis=-1) == labels)
