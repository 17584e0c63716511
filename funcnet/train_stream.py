"""``fit``'s batches from a streaming ``loader.Loader``: the batches come from disk, the position is ``state.step``.

torch counterpart: Lightning's ``Trainer.fit(model, train_dataloader)`` with a ``DataLoader``
over files; resuming mid-epoch there needs a stateful sampler, here batch ``s`` of the run is
a pure function of ``(files, seed, batch_size, s)`` (``funcnet.loader``), so the state's step
count is the whole position.

``funcnet.train.fit(model, tx, loader, ...)`` runs the same loop as over arrays (epochs,
stretches between ``on_steps`` callbacks, ``max_steps``, records, ``check_finite``, progress
bar); ``stream`` only supplies its steps: one ``strategy`` step (``make_step``'s on one device)
per batch the loader yields. What differs from arrays in memory:

- the order is the loader's (its seed), not ``fit``'s key-drawn permutation, so a resume
  ``Position`` carries no ``perm_key``: ``Position(epoch, metrics=...)`` with ``epoch ==
  state.step // loader.steps_per_epoch`` and ``metrics`` the epoch's per-step metrics so far
  (what ``on_steps`` was given), or no ``start`` at an epoch boundary; ``state.key`` is not
  split at each epoch's start (only the steps draw from it);
- the streamed inputs are not scanned for NaN/Inf beforehand (they may not fit in memory):
  a NaN among them shows as a non-finite loss, which ``check_finite`` stops at the epoch's end;
- the batch size is the loader's, and an epoch is never one compiled ``lax.scan`` (the
  batches come from the host one at a time);
- with a ``strategy`` over several devices each batch is first on the default device (the
  loader puts it there) and then split over the devices.
"""

from __future__ import annotations

import jax
import numpy as np

from funcnet import guards as _guards
from funcnet.epoch import stretches
from funcnet.parallel import strategy as _strategy
from funcnet.step import Position, _check_label_range, create_train_state

__all__ = ["stream"]


def _start(start: Position | None, done: int, per_epoch: int) -> Position:
    """``start`` checked against ``state.step`` (``done``): the position inside the loader's epochs."""
    in_epoch = done % per_epoch
    if start is None:
        if in_epoch:
            raise ValueError(f"fit: state.step {done} is step {in_epoch} of epoch {done // per_epoch + 1} of the "
                             f"loader ({per_epoch} steps an epoch), so the epoch's metrics so far are needed: pass "
                             f"start=Position({done // per_epoch}, metrics=...), the position on_steps gave with "
                             f"this state")
        return Position(done // per_epoch)
    if not isinstance(start, Position):
        raise TypeError(f"fit: start must be a funcnet.train.Position, got {type(start).__name__}")
    if start.perm_key is not None:
        raise ValueError("fit: start.perm_key is for in-memory data (fit's shuffle); a Loader's order follows from "
                         "its seed and state.step: pass Position(epoch, metrics=...) without perm_key")
    if start.epoch != done // per_epoch:
        raise ValueError(f"fit: start.epoch is {start.epoch} but state.step {done} is in epoch {done // per_epoch + 1} "
                         f"of the loader ({per_epoch} steps an epoch, so {done // per_epoch} complete); pass the "
                         f"position saved with this state")
    held = len(start.metrics["loss"]) if start.metrics is not None and in_epoch else 0
    if held != in_epoch:
        raise ValueError(f"fit: state.step {done} is step {in_epoch} of its epoch, so start.metrics must hold that "
                         f"many steps, got {held}; pass the position on_steps gave with this state")
    return Position(start.epoch, None, start.metrics if in_epoch else None)


class _Stream:
    """The ``parallel.strategy.Runner`` of a loader's batches ``done .. stop-1``, open while in ``with``."""

    def __init__(self, run: _strategy.BatchRunner, loader, done: int, stop: int):
        self.run, self.loader, self.done, self.stop, self.batches = run, loader, done, stop, None

    def __enter__(self) -> _strategy.Runner:
        self.batches = self.loader.batches(self.done, self.stop)
        run, per_epoch = self.run, self.loader.steps_per_epoch

        def run_steps(state, lo, hi):
            rows = []
            for _ in range(lo, hi):
                state, metrics = run.step(state, next(self.batches))
                if rows and run.n_devices > 1:  # at most two steps in flight, as parallel.steps_between
                    jax.block_until_ready(rows[-1])
                rows.append(metrics)
            return state, jax.tree.map(lambda *r: np.stack([np.asarray(v) for v in r]), *rows)

        def epoch(state, start, batch_size, every_steps, on_steps, until=None):
            parts = [] if start.metrics is None else [start.metrics]
            return stretches(run_steps, state, per_epoch, lambda metrics: Position(start.epoch, None, metrics), parts,
                             every_steps, on_steps, run.get, until)

        return _strategy.Runner(run.strategy, run.n_devices, epoch, run.put, run.get)

    def __exit__(self, *exc):
        self.batches.close()


def stream(model, tx, loader, test_data, *, epochs: int, batch_size, key, loss_fn, metrics, accum_steps: int,
           policy, loss_scale, strategy, devices, state, start, max_steps, check_finite: bool):
    """``fit``'s run over ``loader`` (arguments as ``fit``'s, ``precision`` resolved): ``(state
    placed, start, steps an epoch, batch size, test_data checked, source)``, where ``with source as runner:``
    gives the ``parallel.strategy.Runner`` whose ``epoch`` takes the loader's next batches."""
    if batch_size is not None and batch_size != loader.batch_size:
        raise ValueError(f"fit: batch_size={batch_size!r} but the Loader gives batches of {loader.batch_size}; leave "
                         f"batch_size out (the Loader's is used) or build the Loader with batch_size={batch_size!r}")
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
    strategy = _strategy.resolve(strategy, devices)

    def fresh_state():
        return create_train_state(model, tx, key, loss_scale=loss_scale, policy=policy)

    run = _strategy.batch_runner(model, tx, loss_fn, strategy, devices, loader.batch_size,
                                 state_shapes=fresh_state if state is None else (lambda: state),
                                 accum_steps=accum_steps, policy=policy, metrics=metrics)
    if state is None:
        state = fresh_state()
    if test_data is not None:  # the test labels against the model's outputs
        _check_label_range(model, state.params, state.model_state, {"test": (x_te, y_te)})
    per_epoch, done = loader.steps_per_epoch, int(state.step)
    if done > epochs * per_epoch:
        raise ValueError(f"fit: state.step is {done}, past the {epochs} epochs x {per_epoch} steps of the loader "
                         f"asked for; pass epochs={-(-done // per_epoch)} or more")
    start = _start(start, done, per_epoch)
    stop = epochs * per_epoch if max_steps is None else min(epochs * per_epoch, max(max_steps, done))
    return run.put(state), start, per_epoch, loader.batch_size, test_data, _Stream(run, loader, done, stop)
