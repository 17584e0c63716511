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
    """nanoGPT's ``get_lr(it)`` as an optax schedule, formula for formula: linear warmup
    ``learning_rate * (it + 1) / (warmup_steps + 1)`` for ``it < warmup_steps`` (never 0, as
    nanoGPT's), then cosine from ``learning_rate`` to ``min_lr`` at ``it == decay_steps``
    (nanoGPT's ``lr_decay_iters``, warmup included), ``min_lr`` after. Evaluated in the default
    float dtype (float64 under x64), as nanoGPT does in Python floats. The torch twin is a
    ``LambdaLR`` of the same formula (``comparisons/gpt.py``)."""
    for name, value in (("warmup_steps", warmup_steps), ("decay_steps", decay_steps)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"lr_schedule: {name} must be an int (a step count), got {value!r}")
    if not 0 <= warmup_steps < decay_steps:
        raise ValueError(f"lr_schedule: need 0 <= warmup_steps < decay_steps (decay_steps counts the warmup and "
                         f"the cosine), got warmup_steps={warmup_steps}, decay_steps={decay_steps}; set "
                         f"decay_steps to the run's total number of steps")

    def lr(count):
        # optax's step count is int32, and int32 / int is float32 even with 64-bit JAX: evaluate
        # the formula in the default float dtype (float64 under x64), as nanoGPT does in Python floats
        it = jnp.asarray(count, jnp.result_type(float))
        warm = learning_rate * (it + 1) / (warmup_steps + 1)
        ratio = jnp.clip((it - warmup_steps) / (decay_steps - warmup_steps), 0.0, 1.0)
        coeff = 0.5 * (1.0 + jnp.cos(jnp.pi * ratio))
        cosine = min_lr + coeff * (learning_rate - min_lr)
        return jnp.where(it < warmup_steps, warm, jnp.where(it > decay_steps, min_lr, cosine))

    return lr


def configure_optimizers(*, learning_rate: float = 6e-4, weight_decay: float = 0.1, betas=(0.9, 0.95),
                         eps: float = 1e-8, warmup_steps: int | None = None, decay_steps: int | None = None,
                         min_lr: float | None = None, grad_clip: float | None = 1.0) -> optax.GradientTransformation:
    """nanoGPT's optimizer as one optax chain: ``clip_grad_norm(grad_clip)`` (skipped when
    None or 0), then AdamW (``betas``, ``eps``) with ``weight_decay`` on ``decay_mask`` only.

    The learning rate is ``learning_rate``, constant, as nanoGPT's ``configure_optimizers``
    builds it (no warmup is added). Pass ``decay_steps`` (and ``warmup_steps``, default 0) for
    nanoGPT's training loop with ``decay_lr=True``: ``lr_schedule``'s ``get_lr`` (``min_lr``
    defaults to learning_rate / 10, nanoGPT's choice).

    torch: ``AdamW([{"params": decay, "weight_decay": wd}, {"params": nodecay,
    "weight_decay": 0.0}], lr, betas)`` + ``clip_grad_norm_`` (+ ``get_lr`` each step).
    """
    if decay_steps is None:
        if warmup_steps or min_lr is not None:
            raise ValueError(f"configure_optimizers: warmup_steps={warmup_steps!r} / min_lr={min_lr!r} shape "
                             f"nanoGPT's get_lr schedule, which needs decay_steps (nanoGPT's lr_decay_iters); pass "
                             f"decay_steps=the run's total steps, or leave them out for a constant learning rate")
        schedule = learning_rate
    else:
        min_lr = learning_rate / 10 if min_lr is None else min_lr
        schedule = lr_schedule(learning_rate, warmup_steps or 0, decay_steps, min_lr)
    adamw = optax.adamw(schedule, b1=betas[0], b2=betas[1], eps=eps, weight_decay=weight_decay, mask=decay_mask)
    return optax.chain(clip_grad_norm(grad_clip), adamw) if grad_clip else optax.chain(adamw)
