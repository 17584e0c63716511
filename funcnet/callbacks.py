"""What ``fit`` calls back into: after each epoch, and every n steps inside one.

torch counterpart: Lightning's ``Trainer(callbacks=[ModelCheckpoint(...)])``. A callback is
data (``Callback``), three optional fields:

- ``on_epoch(state, record)``: after each epoch, with the epoch's history record;
- ``on_steps(state, position)`` every ``every_steps`` steps inside an epoch, where
  ``position`` (``funcnet.Position``) says how far the epoch got, so a run resumed from
  it (``fit(state=..., start=position)``) finishes the epoch exactly as an uninterrupted one.

``ModelCheckpoint(directory, every_steps=None)`` is the ready one: it saves the whole
``TrainState`` with ``funcnet.checkpoint.save``, its ``Position`` in the metadata, and
``resume(directory, template)`` reads back ``(state, start)``.

``save_position`` and ``restore_position`` are the one implementation of that format (the
position's encoding, the finite checks on both sides), which ``funcnet train --checkpoint-dir``
uses too: a state whose loss or params are not finite is never saved (``NonFiniteLossError``,
the last finite checkpoint kept), and a checkpoint with non-finite params is never resumed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from funcnet import checkpoint as _checkpoint
from funcnet import guards as _guards
from funcnet.step import Position

__all__ = ["Callback", "ModelCheckpoint", "resume", "encode_position", "decode_position", "save_position",
           "restore_position"]


class Callback(NamedTuple):
    """``fit(callbacks=[Callback(on_epoch=..., on_steps=..., every_steps=n)])``; any field may be None."""

    on_epoch: Callable[[Any, dict], None] | None = None
    on_steps: Callable[[Any, Position], None] | None = None
    every_steps: int | None = None


def check(callbacks) -> tuple[Callback, ...]:
    """The callbacks as a tuple, each checked: a clear error naming the bad one."""
    if isinstance(callbacks, Callback):
        callbacks = (callbacks,)
    try:
        callbacks = tuple(callbacks)
    except TypeError:
        raise TypeError(f"callbacks must be a list of funcnet.callbacks.Callback, got {type(callbacks).__name__}") \
            from None
    for i, cb in enumerate(callbacks):
        if not isinstance(cb, Callback):
            raise TypeError(f"callbacks[{i}] is {type(cb).__name__}, expected a funcnet.callbacks.Callback "
                            f"(e.g. Callback(on_epoch=fn) or ModelCheckpoint(directory))")
        n = cb.every_steps
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"callbacks[{i}].every_steps must be a positive int or None, got {n!r}")
        if cb.on_steps is not None and n is None:
            raise ValueError(f"callbacks[{i}] has on_steps but no every_steps; say how often it runs, e.g. "
                             f"Callback(on_steps=fn, every_steps=100)")
    return callbacks


def combine(callbacks: tuple[Callback, ...]) -> tuple[Callable | None, int | None, Callable | None]:
    """``(on_epoch, every_steps, on_steps)`` calling every callback in order: the epoch is cut
    into stretches of the greatest common divisor of their ``every_steps``, and each
    ``on_steps`` runs when ``state.step`` is a multiple of its own."""
    epochs = [cb.on_epoch for cb in callbacks if cb.on_epoch is not None]
    stepped = [cb for cb in callbacks if cb.on_steps is not None]
    cuts = [cb.every_steps for cb in callbacks if cb.every_steps is not None]

    def on_epoch(state, record):
        for fn in epochs:
            fn(state, record)

    def on_steps(state, position):
        step = int(state.step)
        for cb in stepped:
            if step % cb.every_steps == 0:
                cb.on_steps(state, position)

    every = math.gcd(*cuts) if cuts else None
    return (on_epoch if epochs else None), every, (on_steps if stepped else None)


def encode_position(position: Position) -> dict:
    """``Position`` as JSON data: the epoch, and inside an epoch its shuffle key and the per-step
    metrics so far, exactly (dtype and values)."""
    out: dict = {"epoch": int(position.epoch)}
    if position.perm_key is not None:
        out.update(perm_key=jax.random.key_data(position.perm_key).tolist(),
                   key_impl=str(jax.random.key_impl(position.perm_key)))
    if position.metrics is not None:
        out["metrics"] = {k: [np.asarray(v).dtype.name, np.asarray(v).tolist()] for k, v in position.metrics.items()}
    return out


def decode_position(data: dict) -> Position:
    """The ``Position`` that ``encode_position`` wrote."""
    metrics = perm_key = None
    if "metrics" in data:
        metrics = {k: np.asarray(values, dtype) for k, (dtype, values) in data["metrics"].items()}
    if "perm_key" in data:
        perm_key = jax.random.wrap_key_data(np.asarray(data["perm_key"], np.uint32), impl=data["key_impl"])
    return Position(int(data["epoch"]), perm_key, metrics)


def save_position(directory: str | Path, state: Any, position: Position, *, keep: int | None = 3,
                  metadata: dict | None = None, record: dict | None = None) -> Path:
    """Save ``state`` as checkpoint ``state.step`` in ``directory`` with ``position`` (and
    ``metadata``) in its metadata, as ``resume`` and ``restore_position`` read it back.

    Nothing non-finite is saved: a NaN/Inf among the position's per-step losses (counted from the
    epoch's first step), in ``record``'s losses (an epoch's history record) or in the params
    raises ``guards.NonFiniteLossError`` naming the step, before anything is written, so the
    newest checkpoint stays the last finite one (``keep`` never prunes it for a diverged one)."""
    step = int(state.step)
    if position.metrics is not None and "loss" in position.metrics:
        losses = np.asarray(position.metrics["loss"])
        _guards.check_finite_losses(losses, step - len(losses) + 1, position.epoch + 1)
    if record is not None:
        _guards.check_finite_record(record)
    bad = _non_finite_leaf(state.params)
    if bad is not None:
        epoch = position.epoch + (position.metrics is not None)
        raise _guards.NonFiniteLossError(f"the parameters are not finite at step {step} (epoch {epoch}): {bad} holds "
                                         f"NaN/Inf, so it is not saved; {_guards._FIX}")
    return _checkpoint.save(directory, state, step=step, keep=keep,
                            metadata={**(metadata or {}), "position": encode_position(position)})


def restore_position(directory: str | Path, template: Any, step: int | None = None,
                     metadata: dict | None = None) -> tuple[Any, Position]:
    """``(state, position)`` of checkpoint ``step`` (default: the newest) that ``save_position``
    wrote; ``metadata``: its metadata when the caller has read it already. A state whose
    params are not finite (saved by something else after a run diverged) is refused with a
    ``CheckpointError`` naming the leaf and the steps to go back to."""
    if step is None:
        step = _checkpoint.latest_step(directory)
    state = _checkpoint.restore(directory, template, step)
    meta = _checkpoint.read_metadata(directory, step) if metadata is None else metadata
    if not isinstance(meta, dict) or not isinstance(meta.get("position"), dict):
        raise _checkpoint.CheckpointError(f"{directory}: the checkpoint's metadata has no position, so it was not "
                                          f"saved by ModelCheckpoint; restore it with funcnet.checkpoint.restore")
    bad = _non_finite_leaf(getattr(state, "params", state))
    if bad is not None:
        earlier = [s for s in _checkpoint.all_steps(directory) if s < step]
        go_back = (f"resume from an earlier step ({', '.join(map(str, earlier))}: callbacks.resume(directory, "
                   f"template, step={earlier[-1]}))" if earlier else "no earlier checkpoint is left here")
        raise _checkpoint.CheckpointError(
            f"{_checkpoint.checkpoint_path(directory, step)}: its params are not finite ({bad} holds NaN/Inf), it "
            f"was saved after the run diverged; {go_back}, or start over with a lower learning rate")
    return state, decode_position(meta["position"])


def _non_finite_leaf(params) -> str | None:
    """The path of the first floating-point leaf of ``params`` holding NaN/Inf, or None."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.asarray(leaf)
        if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
            return "/".join(str(getattr(e, "key", getattr(e, "idx", e))) for e in path)
    return None


def ModelCheckpoint(directory: str | Path, *, every_steps: int | None = None, keep: int | None = 3,
                    metadata: dict | None = None) -> Callback:
    """Save the ``TrainState`` into ``directory`` after every epoch and, with ``every_steps``,
    every that many steps inside an epoch (Lightning's ``ModelCheckpoint(dirpath,
    every_n_train_steps=n)``). Each file's metadata holds ``metadata`` and the run's
    ``position``; ``resume(directory, template)`` continues from the newest.

    A state whose loss or params are not finite is never saved: the callback raises
    ``guards.NonFiniteLossError`` naming the step instead (even under ``fit(check_finite=False)``),
    so the newest checkpoint is the last finite one."""
    directory = Path(directory)
    extra = dict(metadata or {})

    def on_steps(state, position: Position):
        save_position(directory, state, position, keep=keep, metadata=extra)

    def on_epoch(state, record):
        save_position(directory, state, Position(record["epoch"]), keep=keep, metadata=extra, record=record)

    return Callback(on_epoch, None if every_steps is None else on_steps, every_steps)


def resume(directory: str | Path, template: Any, step: int | None = None) -> tuple[Any, Position]:
    """``(state, start)`` from the newest checkpoint (or ``step``) a ``ModelCheckpoint`` saved in
    ``directory``: pass both to ``fit(state=state, start=start)``. A checkpoint whose params are
    not finite is refused (``CheckpointError``)."""
    return restore_position(directory, template, step)
