"""nanoGPT's optimizer recipe as optax: AdamW with weight decay on matrices only, torch's
``clip_grad_norm_``, and the warmup + cosine learning-rate schedule (``funcnet.gpt`` re-exports
them: ``gpt.configure_optimizers``, ``gpt.lr_schedule``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

__all__ = ["decay_mask", "clip_grad_norm", "lr_schedule", "configure_optimizers"]


def decay_mask(params):
    """True for the parameters nanoGPT decays: every tensor with ``ndim >= 2`` (Linear and
    Embedding weights, the tied one once); biases and LayerNorm weights are not decayed."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def clip_grad_norm(max_norm: float, eps: float = 1e-6) -> optax.GradientTransformation:
    """torch's ``clip_grad_norm_(params, max_norm)`` as an optax transformation: every
    gradient times ``min(max_norm / (total_norm + 1e-6), 1)``. ``optax.clip_by_global_norm``
    divides by the norm without the 1e-6, a 1e-6 relative difference whenever it clips,
    which AdamW then carries into every later step."""
    if not max_norm > 0:
        raise ValueError(f"clip_grad_norm: max_norm must be > 0, got {max_norm!r}")

    def update(updates, state, params=None):
        del params
        norm = optax.tree.norm(updates)
        coef = jnp.minimum(max_norm / (norm + eps), 1.0)
        return jax.tree.map(lambda g: g * coef.astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def lr_schedule(learning_rate: float, warmup_steps: int, decay_steps: int, min_lr: float = 0.0):
    """Linear warmup from 0 to ``learning_rate`` over ``warmup_steps``, then cosine decay to
    ``min_lr`` at step ``decay_steps`` (warmup included), ``min_lr`` after:
    ``optax.warmup_cosine_decay_schedule``, evaluated in the default float dtype. The torch
    twin is a ``LambdaLR`` of the same formula (``comparisons/gpt.py``)."""
    if not 0 <= warmup_steps < decay_steps:
        raise ValueError(f"lr_schedule: need 0 <= warmup_steps < decay_steps (decay_steps counts the warmup and "
                         f"the cosine), got warmup_steps={warmup_steps}, decay_steps={decay_steps}; set "
                         f"decay_steps to the run's total number of steps")
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, decay_steps, min_lr)

    def lr(count):
        # optax's step count is int32, and int32 / int is float32 even with 64-bit JAX: evaluate
        # the formula in the default float dtype (float64 under x64), as torch does in Python floats
        return schedule(jnp.asarray(count, jnp.result_type(float)))

    return lr


def configure_optimizers(*, learning_rate: float = 6e-4, weight_decay: float = 0.1, betas=(0.9, 0.95),
                         eps: float = 1e-8, warmup_steps: int = 100, decay_steps: int = 5000,
                         min_lr: float | None = None, grad_clip: float | None = 1.0) -> optax.GradientTransformation:
    """nanoGPT's optimizer as one optax chain: ``clip_grad_norm(grad_clip)`` (skipped when
    None or 0), then AdamW (``betas``, ``eps``) with ``weight_decay`` on ``decay_mask``
    only and the learning rate of ``lr_schedule`` (``min_lr`` defaults to learning_rate / 10,
    nanoGPT's choice).

    torch: ``AdamW([{"params": decay, "weight_decay": wd}, {"params": nodecay,
    "weight_decay": 0.0}], lr, betas)`` + ``clip_grad_norm_`` + ``LambdaLR``.
    """
    min_lr = learning_rate / 10 if min_lr is None else min_lr
    schedule = lr_schedule(learning_rate, warmup_steps, decay_steps, min_lr)
    adamw = optax.adamw(schedule, b1=betas[0], b2=betas[1], eps=eps, weight_decay=weight_decay, mask=decay_mask)
    return optax.chain(clip_grad_norm(grad_clip), adamw) if grad_clip else optax.chain(adamw)
