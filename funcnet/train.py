"""Training a model: ``fit`` over epochs, with the epoch records, the progress bar and the
grouped options (precision, strategy and devices, callbacks), beside the pieces it is made of.

torch's five lines:

```python
optimizer.zero_grad(); out = model(x); loss = F.cross_entropy(out, y)
loss.backward(); optimizer.step()
```

become one compiled function (``make_step``, in ``funcnet.step``); ``run_epoch`` and
``evaluate`` live in ``funcnet.epoch``; all are importable from here.

Examples:
    >>> import funcnet
    >>> from funcnet import train
    >>> train.fit is funcnet.fit, train.TrainState is funcnet.TrainState  # also at the top level
    (True, True)
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import callbacks as _callbacks
from funcnet import data as _data
from funcnet import guards as _guards
from funcnet import losses as _losses
from funcnet import precision as _precision
from funcnet.epoch import evaluate, run_epoch
from funcnet.nn.module import Module
from funcnet.parallel import strategy as _strategy
from funcnet.step import (
    Position,
    TrainState,
    _check_label_range,
    create_train_state,
    default_metrics,
    make_step,
)
from funcnet.train_stream import stream

__all__ = ["TrainState", "Position", "create_train_state", "make_step", "run_epoch", "evaluate", "fit"]


def _epoch_record(epoch: int, state: TrainState, epoch_metrics: dict, model: Module, test_data=None, *,
                 loss_fn=_losses.cross_entropy, metrics: Callable = default_metrics, check_finite: bool = True) -> dict:
    """The history record of epoch ``epoch`` (1-based) that ``fit`` returns (arrays or a ``Loader``):
    ``epoch``, ``step``, ``train_<metric>`` as the mean of the per-step metrics, ``skipped_steps``
    and the last ``loss_scale`` with a loss scale, ``test_<metric>`` from ``evaluate`` on
    ``test_data``. With ``check_finite``, a non-finite loss or parameter raises
    ``guards.NonFiniteLossError`` here, before any ``on_epoch`` callback sees the record."""
    record = {"epoch": epoch, "step": int(state.step)}
    record.update({f"train_{k}": float(np.mean(v)) for k, v in epoch_metrics.items()
                   if k not in ("loss_scale", "grads_finite")})
    if "grads_finite" in epoch_metrics:
        record.update(skipped_steps=int(np.sum(~np.asarray(epoch_metrics["grads_finite"]))),
                      loss_scale=float(state.loss_scale.loss_scale))
    if test_data is not None:
        scores = evaluate(model, state.params, *test_data, state=state.model_state, loss_fn=loss_fn, metrics=metrics,
                          key=_eval_key(state.key))
        record.update({f"test_{k}": v for k, v in scores.items()})
    if check_finite:
        _guards.check_finite_record(record, state.params)
    return record


def _eval_key(key):
    """A key for a model that samples in eval too (a VAE), derived from the run's key without
    consuming it (training draws the same keys with or without a test set); None for a
    per-device stack of keys."""
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if (typed and jnp.ndim(key) != 0) or (not typed and jnp.shape(key) != (2,)):
        return None
    return jax.random.fold_in(jax.random.clone(key) if typed else key, 0x7E57)


_STEP_BAR = 200  # an epoch of at least this many steps gets a step count inside the epoch bar


class _EpochProgress:
    """``fit``'s progress bar, one tick per epoch, described by the last record's loss and test
    accuracy: ``with _EpochProgress(show, epochs, done) as bar: ... bar.advance(record)``.
    With ``steps`` (an epoch's steps, at least ``_STEP_BAR``) it also counts the steps of the
    current epoch: ``callback()`` is a ``Callback`` updating it about 50 times an epoch (the
    epoch then runs in stretches, the same batches and keys, the same bits)."""

    def __init__(self, show: bool, epochs: int, done: int, steps: int = 0):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.steps = steps if show and steps >= _STEP_BAR else 0
        self._bar = Progress(TextColumn("epoch"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.description}"),
                             TimeElapsedColumn(), disable=not show, transient=False)
        self._task = self._bar.add_task(f"step 0/{self.steps}" if self.steps else "", total=epochs, completed=done)
        self._last = ""

    def callback(self):
        def on_steps(state, position):
            done = len(next(iter(position.metrics.values()))) if position.metrics else 0
            self._bar.update(self._task, description=f"step {done}/{self.steps}{self._last}")

        return _callbacks.Callback(on_steps=on_steps, every_steps=max(1, self.steps // 50))

    def __enter__(self):
        self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self._bar.__exit__(*exc)

    def advance(self, record: dict, steps: int | None = None) -> None:
        """One epoch done; ``steps``: how many of its steps ran (default all; fewer when
        ``fit``'s ``max_steps`` stopped it), shown as the step count it ended on."""
        desc = f"loss {record['train_loss']:.4f}"
        if "test_accuracy" in record:
            desc += f"  test acc {record['test_accuracy']:.4f}"
        if self.steps:
            self._last = f"  {desc}"
            desc = f"step {self.steps if steps is None else steps}/{self.steps}{self._last}"
        self._bar.update(self._task, advance=1, description=desc)


_DEPRECATED = {
    "policy": "precision=Precision(policy, loss_scale) (or a string: 'bf16-mixed', '16-mixed', '32')",
    "loss_scale": "precision=Precision(policy, loss_scale)",
    "parallel": "strategy='pmap' | 'shard_map' | 'sharding' | 'fsdp' (with devices=N)",
    "buffers": "strategy=Strategy(kind, buffers=...)",
    "on_epoch": "callbacks=[Callback(on_epoch=...)] (or ModelCheckpoint(directory))",
    "every_steps": "callbacks=[Callback(on_steps=..., every_steps=n)] (or ModelCheckpoint(directory, every_steps=n))",
    "on_steps": "callbacks=[Callback(on_steps=..., every_steps=n)]",
}


def _grouped(old: dict, precision, strategy, callbacks):
    """fit's old keywords (one release more, with a DeprecationWarning naming the new form)
    folded into the groups."""
    unknown = sorted(set(old) - set(_DEPRECATED))
    if unknown:
        raise TypeError(f"fit() got an unexpected keyword argument {unknown[0]!r}")
    for name in old:
        warnings.warn(f"fit({name}=...) is deprecated; use {_DEPRECATED[name]}", DeprecationWarning, stacklevel=3)
    if "policy" in old or "loss_scale" in old:
        if precision is not None:
            raise TypeError("fit: give precision= or the deprecated policy=/loss_scale=, not both")
        precision = _precision.Precision(old.get("policy"), old.get("loss_scale"))
    if "parallel" in old or "buffers" in old:
        if strategy is not None:
            raise TypeError("fit: give strategy= or the deprecated parallel=/buffers=, not both")
        kind = old.get("parallel")
        strategy = _strategy.Strategy(kind or "shard_map", old.get("buffers", "broadcast")) \
            if kind is not None else (None if old.get("buffers", "broadcast") == "broadcast" else
                                      _strategy.Strategy("shard_map", old["buffers"]))
    every = old.get("every_steps")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(f"every_steps must be a positive int or None, got {every!r}")
    if {"on_epoch", "every_steps", "on_steps"} & set(old):
        callbacks = (*_callbacks.check(callbacks), _callbacks.Callback(old.get("on_epoch"), old.get("on_steps"),
                                                                       old.get("every_steps")))
    return precision, strategy, callbacks


def fit(model: Module, tx: optax.GradientTransformation, train_data, test_data=None, *,
        epochs: int, batch_size: int | None = None, key: jax.Array, loss_fn=_losses.cross_entropy,
        metrics: Callable = default_metrics, accum_steps: int = 1,
        precision: Any = None, strategy: Any = None, devices: int | None = None, callbacks=(),
        state: TrainState | None = None, start: Position | None = None, max_steps: int | None = None,
        progress: bool = True, check_finite: bool = True, **deprecated):
    """Train up to epoch ``epochs``; ``(state, history)`` with one dict of metrics per epoch run.

    torch counterpart: Lightning's ``Trainer(max_epochs=..., precision=..., strategy=...,
    devices=..., callbacks=[...]).fit(model, train_loader, val_loader)``.

    ``train_data``: ``(x, y)`` arrays in memory, shuffled each epoch from ``key``, in batches of
    ``batch_size``; or a ``funcnet.loader.Loader`` streaming records from disk (its own batch
    size, order and workers), whose position is ``state.step``: see ``funcnet.train_stream``
    for what differs. Both run the same loop (records, callbacks, ``max_steps``, progress).
    ``test_data``: ``(x, y)`` in memory.

    - ``precision``: ``"32"`` (default), ``"bf16-mixed"``, ``"16-mixed"`` (float16 with a
      dynamic loss scale, torch's GradScaler), a ``precision.Policy``, or
      ``precision.Precision(policy, loss_scale)``; with a loss scale each record also
      gives ``skipped_steps`` and the last ``loss_scale``.
    - ``strategy`` / ``devices``: one device (default), or ``"pmap"``, ``"shard_map"``
      (``"ddp"``), ``"sharding"``, ``"fsdp"``, ``"zero1"``, ``"zero2"``, ``"tp"`` on ``devices`` devices (all when
      None), or a ``parallel.strategy.Strategy`` with its options (``buffers``, ``zero``; for ``"pipe"`` the
      stages, tensor and fsdp degrees of one mesh, the rest data: ``parallel.strategy``). The same batches and
      keys whatever the strategy, so the same result as one device up to float summation
      order; callbacks and the returned state see one local copy.
    - ``callbacks``: ``callbacks.Callback``s (``on_epoch(state, record)`` after each epoch;
      ``on_steps(state, position)`` every ``every_steps`` steps inside one) or
      ``callbacks.ModelCheckpoint(directory, every_steps=n)``.
    - To resume, pass the saved ``state`` and ``start=Position(...)`` saved with it
      (``callbacks.resume``): epochs ``start.epoch + 1 .. epochs`` then run exactly as in an
      uninterrupted run.
    - ``max_steps``: stop once ``state.step`` (optimizer steps since the run began, across
      epochs) reaches it, even inside an epoch (Lightning's ``max_steps``). The stopped epoch
      still gets its record (the mean of the steps it ran, the test metrics); its callbacks'
      ``on_steps`` run there instead of ``on_epoch``, with the ``Position`` a run resumed with a
      larger ``max_steps`` continues from exactly. Resumed there with the same ``max_steps``, no
      step runs and the history is the stopped epoch's record again; a ``max_steps`` below the
      resumed ``state.step`` is refused (``ValueError``).
    - ``check_finite``: inputs with NaN/Inf are refused before anything compiles, and a
      non-finite epoch loss or parameter raises ``guards.NonFiniteLossError`` naming the
      epoch, before any callback sees the record (a checkpoint keeps the last good state).

    Each epoch of arrays on one device is one compiled ``lax.scan`` (``run_epoch``); per-epoch
    metrics are fetched once. The old keywords ``policy``, ``loss_scale``, ``parallel``,
    ``buffers``, ``on_epoch``, ``every_steps`` and ``on_steps`` still work for one release,
    with a ``DeprecationWarning`` naming the new form.

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> from funcnet import fit, nn
        >>> x, y = jnp.ones((64, 3)), jnp.zeros(64, jnp.int32)
        >>> state, history = fit(nn.Linear(3, 2), optax.sgd(0.1), (x, y), epochs=2, batch_size=16,
        ...                      key=jax.random.key(0), progress=False)
        >>> [h["step"] for h in history], history[1]["train_loss"] < history[0]["train_loss"]
        ([4, 8], True)
    """
    precision, strategy, callbacks = _grouped(deprecated, precision, strategy, callbacks)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative int, got {epochs!r}")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be a positive int or None (no limit), got {max_steps!r}")
    callbacks = _callbacks.check(callbacks)
    if test_data is not None:
        _guards.check_loss_fn(loss_fn)
    policy, loss_scale = _precision.resolve_precision(precision)
    options = dict(epochs=epochs, batch_size=batch_size, key=key, loss_fn=loss_fn, metrics=metrics,
                   accum_steps=accum_steps, policy=policy, loss_scale=loss_scale, strategy=strategy, devices=devices,
                   state=state, start=start, max_steps=max_steps, check_finite=check_finite)
    if _is_loader(train_data):
        state, start, per_epoch, batch_size, test_data, source = stream(model, tx, train_data, test_data, **options)
    else:
        state, start, per_epoch, batch_size, test_data, source = _in_memory(model, tx, train_data, test_data, **options)
    # The one loop over epochs, whatever the source: source's runner runs an epoch's steps (whole, or
    # in stretches between on_steps callbacks, or up to max_steps), the loop makes the records.
    history = []
    bar = _EpochProgress(progress, epochs, start.epoch, per_epoch)
    if bar.steps:
        callbacks = (*callbacks, bar.callback())
    on_epoch, every_steps, on_steps = _callbacks.combine(callbacks)
    with source as run, bar:
        steps_done = int(np.asarray(run.get(state.step))) if max_steps is not None else 0
        if max_steps is not None and steps_done > max_steps:
            raise ValueError(f"fit: max_steps={max_steps} is below the resumed state's step {steps_done} (a run "
                             f"cannot go back); pass max_steps >= {steps_done}, or None")
        for epoch in range(start.epoch, epochs):
            in_epoch = 0 if start.metrics is None else len(next(iter(start.metrics.values())))
            if max_steps is not None and steps_done >= max_steps and not in_epoch:  # reached already: nothing runs
                break
            # (resumed where max_steps stopped inside an epoch: no step runs, and the record of the stopped
            # epoch comes back from the position's metrics, as the run that stopped returned it)
            until = None
            if max_steps is not None and in_epoch + max_steps - steps_done < per_epoch:
                until = in_epoch + max_steps - steps_done
            state, epoch_metrics = run.epoch(state, start, batch_size, every_steps,
                                             on_steps if until is None else _at_stop(callbacks, on_steps, max_steps),
                                             until=until)
            start = Position(epoch + 1)
            local = run.get(state)
            record = _epoch_record(epoch + 1, local, epoch_metrics, model, test_data, loss_fn=loss_fn,
                                  metrics=metrics, check_finite=check_finite)
            history.append(record)
            steps_done = record["step"]
            if until is not None:  # stopped inside the epoch: the callbacks saw its position at the stop
                bar.advance(record, len(next(iter(epoch_metrics.values()))))
                break
            if on_epoch is not None:
                on_epoch(local, record)
            bar.advance(record)
    return run.get(state), history


def _in_memory(model, tx, train_data, test_data, *, epochs, batch_size, key, loss_fn, metrics, accum_steps, policy,
               loss_scale, strategy, devices, state, start, max_steps, check_finite):
    """``fit``'s run over ``(x, y)`` arrays (arguments as ``fit``'s, ``precision`` resolved): ``(state
    placed, start, steps an epoch, batch size, test_data, source)``, where ``with source as runner:`` gives the
    ``parallel.strategy.Runner`` whose ``epoch`` shuffles and gathers the batches on the device."""
    if batch_size is None:
        raise TypeError("fit: batch_size is needed for (x, y) arrays, e.g. fit(..., batch_size=128); a "
                        "funcnet.loader.Loader brings its own")
    strategy = _strategy.resolve(strategy, devices)
    if check_finite:
        _guards.check_fit_args(tx, train_data, test_data)
    else:
        _guards.check_tx(tx)
        _guards.check_pair(train_data, "train_data")
        if test_data is not None:
            _guards.check_pair(test_data, "test_data")
    start = Position() if start is None else start
    x_tr, y_tr = train_data
    batch_size = _data.check_batch_size(batch_size, len(x_tr))

    def fresh_state():
        return create_train_state(model, tx, key, loss_scale=loss_scale, policy=policy)

    run = _strategy.runner(model, tx, loss_fn, strategy, devices, x_tr, y_tr, batch_size,
                           state_shapes=fresh_state if state is None else (lambda: state),
                           accum_steps=accum_steps, policy=policy, metrics=metrics)
    if state is None:
        state = fresh_state()
    _check_label_range(model, state.params, state.model_state, {"train": train_data, "test": test_data})
    return run.put(state), start, len(x_tr) // batch_size, batch_size, test_data, contextlib.nullcontext(run)


def _is_loader(data) -> bool:
    from funcnet.loader import Loader  # no grain or torch at import: the loader reads them lazily

    return isinstance(data, Loader)


def _at_stop(callbacks, on_steps, max_steps):
    """The ``on_steps`` of an epoch that ``max_steps`` ends early: at the stop every callback's
    ``on_steps`` runs (a checkpoint of the position to resume from), elsewhere the usual ones."""

    def call(state, position):
        if int(state.step) < max_steps:
            if on_steps is not None:
                on_steps(state, position)
            return
        for cb in callbacks:
            if cb.on_steps is not None:
                cb.on_steps(state, position)

    return call
