"""``fit`` over a streaming ``loader.Loader``: the batches come from disk, the position is ``state.step``.

torch counterpart: Lightning's ``Trainer.fit(model, train_dataloader)`` with a ``DataLoader``
over files; resuming mid-epoch there needs a stateful sampler, here batch ``s`` of the run is
a pure function of ``(files, seed, batch_size, s)`` (``funcnet.loader``), so the state's step
count is the whole position.

``funcnet.train.fit(model, tx, loader, ...)`` calls ``fit_loader``; each batch goes through one
``make_step(model, tx, loss_fn, accum_steps=, policy=, metrics=)`` call. It keeps ``fit``'s
contract (history records, callbacks, ``max_steps``, ``check_finite``, progress bar) on one
device, with these differences:

- the order is the loader's (its seed), not ``fit``'s key-drawn permutation, so a resume
  ``Position`` carries no ``perm_key``: ``Position(epoch, metrics=...)`` with ``epoch ==
  state.step // loader.steps_per_epoch`` and ``metrics`` the epoch's per-step metrics so far
  (what ``on_steps`` was given), or no ``start`` at an epoch boundary;
- the streamed inputs are not scanned for NaN/Inf beforehand (they may not fit in memory):
  a NaN among them shows as a non-finite loss, which ``check_finite`` stops at the epoch's end;
- one device: ``devices`` > 1 or a ``strategy`` are refused (data parallelism over streamed
  batches is not built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from funcnet import callbacks as _callbacks
from funcnet import guards as _guards
from funcnet.step import Position, _check_label_range, create_train_state, make_step

__all__ = ["fit_loader"]


def _stack(steps: list) -> dict:
    return jax.tree.map(lambda *m: np.stack([np.asarray(v) for v in m]), *steps)


def _joined(parts: list) -> dict:
    return jax.tree.map(lambda *p: np.concatenate(p), *parts)


def _start(start: Position | None, done: int, per_epoch: int) -> list:
    """The per-step metrics of the current epoch that ``start`` carries (checked against ``state.step``)."""
    in_epoch = done % per_epoch
    if start is None:
        if in_epoch:
            raise ValueError(f"fit: state.step {done} is step {in_epoch} of epoch {done // per_epoch + 1} of the "
                             f"loader ({per_epoch} steps an epoch), so the epoch's metrics so far are needed: pass "
                             f"start=Position({done // per_epoch}, metrics=...), the position on_steps gave with "
                             f"this state")
        return []
    if not isinstance(start, Position):
        raise TypeError(f"fit: start must be a funcnet.train.Position, got {type(start).__name__}")
    if start.perm_key is not None:
        raise ValueError("fit: start.perm_key is for in-memory data (fit's shuffle); a Loader's order follows from "
                         "its seed and state.step: pass Position(epoch, metrics=...) without perm_key")
    if start.epoch != done // per_epoch:
        raise ValueError(f"fit: start.epoch is {start.epoch} but state.step {done} is in epoch {done // per_epoch + 1} "
                         f"of the loader ({per_epoch} steps an epoch, so {done // per_epoch} complete); pass the "
                         f"position saved with this state")
    parts = [start.metrics] if start.metrics is not None and in_epoch else []
    held = sum(len(p["loss"]) for p in parts)
    if held != in_epoch:
        raise ValueError(f"fit: state.step {done} is step {in_epoch} of its epoch, so start.metrics must hold that "
                         f"many steps, got {held}; pass the position on_steps gave with this state")
    return parts


def fit_loader(model, tx, loader, test_data=None, *, epochs: int, key, loss_fn, metrics: Callable,
               accum_steps: int, policy: Any, loss_scale: Any, callbacks: tuple, state=None,
               start: Position | None = None, max_steps: int | None = None, progress: bool = True,
               check_finite: bool = True, progress_bar: Callable, epoch_record: Callable):
    """``fit``'s loop over ``loader``'s batches (module docstring); ``(state, history)``.
    ``progress_bar``, ``epoch_record``: ``fit``'s ``_EpochProgress`` and ``_epoch_record`` (passed in:
    ``funcnet.train`` imports this module). Arguments ``fit`` checked already are not rechecked."""
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1 \
            or loader.batch_size % accum_steps:
        raise ValueError(f"fit: accum_steps must be a positive int dividing the loader's batch_size "
                         f"{loader.batch_size} into equal micro-batches, got {accum_steps!r}")
    _guards.check_tx(tx, "fit")
    if test_data is not None:
        x_te, y_te = test_data = _guards.check_pair(test_data, "test_data", "fit")
        if check_finite:
            _guards.check_finite(x_te, "test_data x", "fit")
            _guards.check_finite(y_te, "test_data y", "fit")
    step_fn = make_step(model, tx, loss_fn, accum_steps=accum_steps, policy=policy, metrics=metrics)
    if state is None:
        state = create_train_state(model, tx, key, loss_scale=loss_scale, policy=policy)
    if test_data is not None:  # the test labels against the model's outputs
        _check_label_range(model, state.params, state.model_state, {"test": (x_te, y_te)})
    per_epoch, done = loader.steps_per_epoch, int(state.step)
    if done > epochs * per_epoch:
        raise ValueError(f"fit: state.step is {done}, past the {epochs} epochs x {per_epoch} steps of the loader "
                         f"asked for; pass epochs={-(-done // per_epoch)} or more")
    parts = _start(start, done, per_epoch)
    stop = epochs * per_epoch if max_steps is None else min(epochs * per_epoch, max(max_steps, done))
    on_epoch, every_steps, on_steps = _callbacks.combine(callbacks)
    history, pending = [], []

    def record_of(s):
        if pending:
            parts.append(_stack(pending))
            pending.clear()
        epoch_metrics = _joined(parts)
        parts.clear()
        return epoch_record(-(-s // per_epoch), state, epoch_metrics, model, test_data, loss_fn=loss_fn,
                             metrics=metrics, check_finite=check_finite), len(epoch_metrics["loss"])

    with progress_bar(progress, epochs, done // per_epoch) as bar, loader.batches(done, stop) as batches:
        for s, batch in enumerate(batches, start=done + 1):
            state, step_metrics = step_fn(state, batch)
            pending.append(step_metrics)
            if s % per_epoch == 0:
                record, _ = record_of(s)
                history.append(record)
                if on_epoch is not None:
                    on_epoch(state, record)
                bar.advance(record)
            elif s == stop:  # max_steps inside an epoch: its record, then every callback's on_steps
                position = Position(s // per_epoch, metrics=_joined(parts + [_stack(pending)]))
                record, ran = record_of(s)
                history.append(record)
                for cb in callbacks:
                    if cb.on_steps is not None:
                        cb.on_steps(state, position)
                bar.advance(record, ran)
            elif every_steps is not None and on_steps is not None and s % every_steps == 0:
                parts.append(_stack(pending))
                pending.clear()
                on_steps(state, Position(s // per_epoch, metrics=_joined(parts)))
    return state, history
