"""ctc_loss with torch.nn.functional's semantics, through ``optax.ctc_loss``.

optax's forward algorithm takes logits and normalizes them with ``log_softmax``; torch's takes
log-probabilities as they are. For log-probabilities (what torch's docs ask for, the output of
``log_softmax``) the two agree in value, and optax's gradient (through its ``log_softmax``) is
torch's (torch's CTC backward returns ``exp(log_probs) - posterior``, the gradient with respect
to the logits before a log_softmax). What optax does not give, this adds: an alignment that is
impossible (the input shorter than the target plus its repeated neighbours) is ``inf`` in
torch, ``zero_infinity=True`` makes it 0; torch's concatenated 1-d targets; and its reductions
(``"mean"`` divides each loss by its target length, then averages over the batch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet.losses.core import _check_reduction

__all__ = ["ctc_loss"]


def _as_int(value, what: str):
    v = jnp.asarray(value)
    if not jnp.issubdtype(v.dtype, jnp.integer):
        raise TypeError(f"ctc_loss: {what} must be integers, got dtype {v.dtype}")
    return v


def ctc_loss(log_probs, targets, input_lengths, target_lengths, *, blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False):
    """The connectionist temporal classification loss, ``F.ctc_loss``.

    log_probs ``(T, N, C)`` (or ``(T, C)`` unbatched), log-probabilities over C classes with
    ``blank`` among them; targets ``(N, S)`` padded, or 1-d, the N targets concatenated (their
    lengths must then be concrete); input_lengths and target_lengths ``(N,)``.
    """
    where = "ctc_loss"
    _check_reduction(reduction)
    lp = jnp.asarray(log_probs)
    unbatched = lp.ndim == 2
    if unbatched:
        lp = lp[:, None]
        targets = jnp.asarray(targets)[None]
        input_lengths = jnp.reshape(input_lengths, (1,))
        target_lengths = jnp.reshape(target_lengths, (1,))
    if lp.ndim != 3:
        raise ValueError(f"{where}: log_probs must be (T, N, C) or (T, C), got shape {tuple(lp.shape)}")
    T, N, C = lp.shape
    if not 0 <= blank < C:
        raise ValueError(f"{where}: blank={blank} is not one of the {C} classes")
    concrete = not any(isinstance(v, jax.core.Tracer) for v in (targets, target_lengths))
    host_targets = np.asarray(targets) if concrete else None
    host_lengths = np.asarray(target_lengths) if concrete else None
    input_lengths = _as_int(input_lengths, "input_lengths")
    target_lengths = _as_int(target_lengths, "target_lengths")
    targets = _as_int(targets, "targets")
    if input_lengths.shape != (N,) or target_lengths.shape != (N,):
        raise ValueError(f"{where}: input_lengths {tuple(input_lengths.shape)} and target_lengths "
                         f"{tuple(target_lengths.shape)} must have one entry per example, ({N},)")
    if targets.ndim == 1:
        if not concrete:
            raise ValueError(f"{where}: concatenated 1-d targets need concrete target_lengths to split them; inside "
                             f"jit pass padded (N, S) targets")
        lengths = host_lengths.reshape(-1)
        if lengths.sum() != targets.shape[0]:
            raise ValueError(f"{where}: 1-d targets hold {targets.shape[0]} labels but target_lengths sum to "
                             f"{int(lengths.sum())}")
        width = max(int(lengths.max()), 1)
        host = host_targets.reshape(-1)
        padded = np.zeros((N, width), host.dtype)
        for i, start in enumerate(np.concatenate([[0], np.cumsum(lengths)[:-1]])):
            padded[i, :lengths[i]] = host[start:start + lengths[i]]
        targets = jnp.asarray(padded)
    if targets.ndim != 2 or targets.shape[0] != N:
        raise ValueError(f"{where}: targets must be (N, S) padded or 1-d concatenated, got shape "
                         f"{tuple(targets.shape)} for N={N}")
    S = targets.shape[1]
    logit_paddings = (jnp.arange(T)[None, :] >= input_lengths[:, None]).astype(lp.dtype)
    label_pad = jnp.arange(S)[None, :] >= target_lengths[:, None]
    labels = jnp.where(label_pad, 0, targets)
    per_seq = optax.ctc_loss(jnp.swapaxes(lp, 0, 1), logit_paddings, labels, label_pad.astype(lp.dtype),
                             blank_id=blank)
    # an alignment exists only if the input has room for every label and a blank between repeats
    repeats = jnp.sum((labels[:, 1:] == labels[:, :-1]) & ~label_pad[:, 1:], axis=1) if S > 1 else 0
    impossible = input_lengths < target_lengths + repeats
    loss = jnp.where(impossible, jnp.asarray(0.0 if zero_infinity else jnp.inf, per_seq.dtype), per_seq)
    if unbatched:
        loss = loss[0]
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    return jnp.mean(loss / jnp.maximum(target_lengths, 1).astype(loss.dtype).reshape(loss.shape))
