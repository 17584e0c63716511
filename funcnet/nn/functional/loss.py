"""Every loss, with torch.nn.functional's exact signatures, over ``funcnet.losses`` (the one
implementation).

Two differences from ``funcnet.losses``: positional arguments follow torch's order, and
``cross_entropy``/``nll_loss`` take the classes on axis 1 as torch (``(N, C)`` or ``(N, C,
d1, ...)``), where ``funcnet.losses`` takes them last by default. torch's deprecated
``size_average`` and ``reduce`` are refused by name unless None.
"""

from __future__ import annotations

from funcnet import losses as _L

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div", "smooth_l1_loss", "huber_loss", "cosine_embedding_loss",
           "margin_ranking_loss", "triplet_margin_loss", "poisson_nll_loss", "gaussian_nll_loss", "ctc_loss"]


def _legacy(where: str, size_average, reduce) -> None:
    if size_average is not None or reduce is not None:
        raise ValueError(f"{where}: size_average={size_average!r} and reduce={reduce!r} are deprecated in torch and not "
                         f"supported; pass reduction='mean' | 'sum' | 'none'")


def _class_axis(input) -> int:
    # torch: (C,) unbatched, (N, C), (N, C, d1, ...): the classes are axis 1 when there is a batch
    return 0 if getattr(input, "ndim", 2) == 1 else 1


def cross_entropy(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0):
    """torch.nn.functional.cross_entropy: logits ``(N, C, ...)`` with the classes on axis 1; see
    ``funcnet.losses.cross_entropy``."""
    _legacy("cross_entropy", size_average, reduce)
    return _L.cross_entropy(input, target, weight, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, class_axis=_class_axis(input))


def nll_loss(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
             reduction: str = "mean"):
    """torch.nn.functional.nll_loss: log-probabilities ``(N, C, ...)``, classes on axis 1."""
    _legacy("nll_loss", size_average, reduce)
    return _L.nll_loss(input, target, weight, ignore_index=ignore_index, reduction=reduction,
                       class_axis=_class_axis(input))


def mse_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", weight=None):
    """torch.nn.functional.mse_loss."""
    _legacy("mse_loss", size_average, reduce)
    if weight is not None:
        raise ValueError("mse_loss: weight= is not supported; multiply the reduction='none' loss by it")
    return _L.mse_loss(input, target, reduction=reduction)


def l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", weight=None):
    """torch.nn.functional.l1_loss."""
    _legacy("l1_loss", size_average, reduce)
    if weight is not None:
        raise ValueError("l1_loss: weight= is not supported; multiply the reduction='none' loss by it")
    return _L.l1_loss(input, target, reduction=reduction)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction: str = "mean"):
    """torch.nn.functional.binary_cross_entropy, on probabilities (nn.BCELoss)."""
    _legacy("binary_cross_entropy", size_average, reduce)
    return _L.binary_cross_entropy(input, target, weight, reduction=reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction: str = "mean", pos_weight=None):
    """torch.nn.functional.binary_cross_entropy_with_logits (nn.BCEWithLogitsLoss)."""
    _legacy("binary_cross_entropy_with_logits", size_average, reduce)
    return _L.binary_cross_entropy_with_logits(input, target, weight, reduction=reduction, pos_weight=pos_weight)


def kl_div(input, target, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False):
    """torch.nn.functional.kl_div (``input``: log-probabilities)."""
    _legacy("kl_div", size_average, reduce)
    return _L.kl_div(input, target, reduction=reduction, log_target=log_target)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0):
    """torch.nn.functional.smooth_l1_loss."""
    _legacy("smooth_l1_loss", size_average, reduce)
    return _L.smooth_l1_loss(input, target, reduction=reduction, beta=beta)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0, weight=None):
    """torch.nn.functional.huber_loss."""
    if weight is not None:
        raise ValueError("huber_loss: weight= is not supported; multiply the reduction='none' loss by it")
    return _L.huber_loss(input, target, reduction=reduction, delta=delta)


def cosine_embedding_loss(input1, input2, target, margin: float = 0, size_average=None, reduce=None,
                          reduction: str = "mean"):
    """torch.nn.functional.cosine_embedding_loss."""
    _legacy("cosine_embedding_loss", size_average, reduce)
    return _L.cosine_embedding_loss(input1, input2, target, margin=margin, reduction=reduction)


def margin_ranking_loss(input1, input2, target, margin: float = 0, size_average=None, reduce=None,
                        reduction: str = "mean"):
    """torch.nn.functional.margin_ranking_loss."""
    _legacy("margin_ranking_loss", size_average, reduce)
    return _L.margin_ranking_loss(input1, input2, target, margin=margin, reduction=reduction)


def triplet_margin_loss(anchor, positive, negative, margin: float = 1.0, p: float = 2, eps: float = 1e-6,
                        swap: bool = False, size_average=None, reduce=None, reduction: str = "mean"):
    """torch.nn.functional.triplet_margin_loss."""
    _legacy("triplet_margin_loss", size_average, reduce)
    return _L.triplet_margin_loss(anchor, positive, negative, margin=margin, p=p, eps=eps, swap=swap,
                                  reduction=reduction)


def poisson_nll_loss(input, target, log_input: bool = True, full: bool = False, size_average=None,
                     eps: float = 1e-8, reduce=None, reduction: str = "mean"):
    """torch.nn.functional.poisson_nll_loss."""
    _legacy("poisson_nll_loss", size_average, reduce)
    return _L.poisson_nll_loss(input, target, log_input=log_input, full=full, eps=eps, reduction=reduction)


def gaussian_nll_loss(input, target, var, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
    """torch.nn.functional.gaussian_nll_loss."""
    return _L.gaussian_nll_loss(input, target, var, full=full, eps=eps, reduction=reduction)


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False):
    """torch.nn.functional.ctc_loss, through optax (see ``funcnet.losses.sequence``)."""
    return _L.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=blank, reduction=reduction,
                       zero_infinity=zero_infinity)
