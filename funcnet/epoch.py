"""Epochs of a step: ``run_epoch`` (one compiled ``lax.scan``, or a Python loop where a scan
is slower), stretches of an epoch between checkpoints, and ``evaluate``."""

from __future__ import annotations

import functools
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import data as _data
from funcnet import guards as _guards
from funcnet import losses as _losses
from funcnet.nn.module import Module, call
from funcnet.step import (
    Position,
    TrainState,
    _check_label_range,
    _check_unshared,
    default_metrics,
    is_classification,
)

__all__ = ["run_epoch", "evaluate"]


@functools.partial(jax.jit, static_argnames=("step_fn", "batch_size"), donate_argnames=("state",))
def _scan_epoch(step_fn, state, x, y, batch_size):
    # Each batch is gathered inside the scan: measured as fast as permuting the whole epoch
    # once and scanning contiguous batches (a full copy of x), without the second copy in memory.
    key, perm_key = jax.random.split(state.key)
    indices = _data.epoch_indices(perm_key, x.shape[0], batch_size)

    def body(st, idx):
        return step_fn(st, (x[idx], y[idx]))

    return jax.lax.scan(body, state._replace(key=key), indices)


_CONV_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _slow_in_loops(step_fn, state, xb, yb) -> bool:
    """True when ``step_fn`` must not run inside a compiled loop on this backend (``xb``, ``yb``:
    anything with the batch's ``shape`` and ``dtype``).

    XLA:CPU rewrites convolutions to its fast channels-last kernels only in a program's entry
    computation, never inside a while loop's body (``lax.scan``, ``fori_loop``), where they
    fall back to a naive kernel: measured 20-40x slower per convolution, which made
    ``run_epoch`` of a conv net 3-4x slower than a Python loop of the same compiled step
    (jax-ml/jax#12868; XLA's ConvCanonicalization visits ``entry_computation()`` only).
    """
    if jax.default_backend() != "cpu":
        return False
    try:
        return _CONV_STEPS[step_fn]
    except (KeyError, TypeError):
        pass
    batch = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (xb, yb))
    found = _has_conv(jax.make_jaxpr(step_fn)(state, batch).jaxpr)
    try:
        _CONV_STEPS[step_fn] = found
    except TypeError:  # not weak-referenceable: decide again next time
        pass
    return found


def _has_conv(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "conv_general_dilated":
            return True
        for value in eqn.params.values():
            for sub in (value if isinstance(value, (tuple, list)) else (value,)):
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                if hasattr(inner, "eqns") and _has_conv(inner):
                    return True
    return False


def _batch_spec(x, y, batch_size):
    return tuple(jax.ShapeDtypeStruct((batch_size,) + a.shape[1:], a.dtype) for a in (x, y))


_JITTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _jitted(step_fn):
    # make_step's compilation of the raw step (same program, same bits), one per step function
    if step_fn not in _JITTED:
        _JITTED[step_fn] = jax.jit(step_fn, donate_argnums=0)
    return _JITTED[step_fn]


@functools.partial(jax.jit, static_argnames=("step_fn",), donate_argnames=("state",))
def _steps_between(step_fn, state, x, y, indices, lo, hi):
    # Steps lo..hi-1 of the epoch; lo and hi are traced, so one compiled loop serves stretches
    # of every length. Metrics land in rows lo..hi-1 of a (steps,) buffer.
    shapes = jax.eval_shape(step_fn, state, (x[indices[0]], y[indices[0]]))[1]
    rows = jax.tree.map(lambda s: jnp.zeros((indices.shape[0],) + s.shape, s.dtype), shapes)

    def body(i, carry):
        st, buf = carry
        st, metrics = step_fn(st, (x[indices[i]], y[indices[i]]))
        return st, jax.tree.map(lambda b, m: b.at[i].set(m), buf, metrics)

    return jax.lax.fori_loop(lo, hi, body, (state, rows))


def _run_epoch_in_parts(run_steps, state, n_examples, batch_size, start: Position, every_steps, on_steps,
                        get=lambda t: t, put=lambda t: t, until=None):
    # The same batches and keys as run_epoch, run in stretches (``stretches``) so on_steps can
    # checkpoint mid-epoch and a resumed run can finish the epoch. run_steps(state, indices, lo,
    # hi) -> (state, per-step metrics of steps lo..hi-1); get/put move a placed (data-parallel)
    # state's leaves to and from one local copy.
    if start.perm_key is None:
        key, perm_key = jax.random.split(get(state.key))
        state, parts = state._replace(key=put(key)), []
    else:
        perm_key, parts = start.perm_key, [start.metrics]
    indices = _data.epoch_indices(perm_key, n_examples, batch_size)
    return stretches(lambda st, lo, hi: run_steps(st, indices, lo, hi), state, len(indices),
                     lambda metrics: Position(start.epoch, perm_key, metrics), parts, every_steps, on_steps, get, until)


def stretches(run_steps, state, per_epoch: int, position, parts: list, every_steps, on_steps, get=lambda t: t,
              until=None):
    """The rest of one epoch of ``per_epoch`` steps, whatever feeds them (``fit``'s arrays or a
    ``Loader``): ``(state, per-step metrics of the whole epoch)``.

    ``parts``: the per-step metrics of the steps already taken (a resumed epoch), ``run_steps(state,
    lo, hi)`` runs steps ``lo..hi-1`` of the epoch, in stretches that end on multiples of
    ``every_steps`` (counted in ``state.step``), after each of which ``on_steps(get(state),
    position(metrics so far))`` runs. ``until``: stop after step ``until`` of the epoch (``fit``'s
    ``max_steps``); ``on_steps`` then also runs there, with the position a resumed run continues
    from. ``get`` gives one local copy of a placed (data-parallel) state."""
    done = sum(len(p["loss"]) for p in parts)
    if done > per_epoch:
        raise ValueError(f"fit: start.metrics holds {done} steps but an epoch has {per_epoch}; "
                         f"pass the Position saved by the same run")
    end = per_epoch if until is None else min(until, per_epoch)
    while done < end:
        stop = end
        if every_steps:
            stop = min(stop, done + every_steps - int(get(state.step)) % every_steps)
        state, rows = run_steps(state, done, stop)
        parts.append(rows)
        done = stop
        if on_steps is not None and done < per_epoch and (done == end or int(get(state.step)) % every_steps == 0):
            on_steps(get(state), position(_concat(parts)))
    # A jax array, like run_epoch's: fit's np.mean then defers to the same jnp.mean reduction.
    return state, jax.tree.map(jnp.asarray, _concat(parts))


def _local_steps(step_fn, x, y):
    def run_steps(state, indices, lo, hi):
        if hi > lo and _slow_in_loops(step_fn, state, *_batch_spec(x, y, indices.shape[1])):
            # as run_epoch does for such steps: one compiled step per batch, the same bits
            step, rows = _jitted(step_fn), []
            for i in range(lo, hi):
                state, metrics = step(state, (x[indices[i]], y[indices[i]]))
                rows.append(metrics)
            return state, jax.tree.map(lambda *r: np.stack([np.asarray(v) for v in r]), *rows)
        state, rows = _steps_between(step_fn, state, x, y, indices, lo, hi)
        return state, jax.tree.map(lambda r: np.asarray(r)[lo:hi], rows)

    return run_steps


def _concat(parts):
    return jax.tree.map(lambda *p: np.concatenate([np.asarray(a) for a in p]), *parts)


def run_epoch(step, state: TrainState, x, y, *, batch_size: int, scan: bool = True):
    """One epoch of shuffled steps: ``(state, metrics)`` with per-step metrics of shape ``(steps,)``.

    The shuffle is drawn from ``state.key`` on device; the last partial batch is
    dropped. With ``scan=True`` (default) the whole epoch is one compiled
    ``lax.scan`` and metrics stay on device until the caller reads them; with
    ``scan=False`` the same batches are dispatched one compiled step at a time
    from Python (the torch-style loop), which gives the same result, bit for bit.

    On CPU a step with convolutions always takes the Python loop: XLA:CPU compiles a
    convolution inside a loop body to a naive kernel, 20-40x slower than the one it uses
    in a single step (jax-ml/jax#12868), so the scan would lose to the loop it replaces.

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> from funcnet import create_train_state, make_step, nn, run_epoch
        >>> model, tx = nn.Linear(3, 2), optax.sgd(0.1)
        >>> state = create_train_state(model, tx, jax.random.key(0))
        >>> state, metrics = run_epoch(make_step(model, tx), state, jnp.ones((40, 3)), jnp.zeros(40, jnp.int32),
        ...                            batch_size=8)
        >>> int(state.step), metrics["loss"].shape  # 40 // 8 steps, one loss each
        (5, (5,))
    """
    _guards.check_step_fn(step)
    _check_unshared(state)
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}; they must be equal")
    batch_size = _data.check_batch_size(batch_size, len(x))
    x, y = jnp.asarray(x), jnp.asarray(y)
    if scan and not _slow_in_loops(step.raw, state, *_batch_spec(x, y, batch_size)):
        return _scan_epoch(step.raw, state, x, y, batch_size)
    # make_step's step checks each batch's labels on the host, which waits for the batch: every
    # label checked here at once instead (before the key is used), the first batch through all
    # the step's checks, the others straight to its compiled program, so dispatch runs ahead
    check = getattr(step, "check_labels", None)
    if check is not None:
        check(state, x, y)
    key, perm_key = jax.random.split(state.key)
    state = state._replace(key=key)
    history = []
    for i, (xb, yb) in enumerate(_data.batches(perm_key, x, y, batch_size)):
        state, metrics = (step.jitted if check is not None and i else step)(state, (xb, yb))
        history.append(metrics)
    return state, jax.tree.map(lambda *m: jnp.stack(m), *history)


@functools.partial(jax.jit, static_argnames=("model", "loss_fn", "metrics"))
def _eval_batch(model, loss_fn, metrics, params, model_state, x, y, key=None):
    outputs, _ = call(model, params, model_state, x, key=key, train=False)
    sums = {"loss": loss_fn(outputs, y, reduction="sum")}
    if metrics is default_metrics and is_classification(outputs, y):
        sums["accuracy"] = jnp.sum(jnp.argmax(outputs, -1) == y)
    return sums


def evaluate(model: Module, params, x, y, *, state: Any = None, batch_size: int | None = None,
             loss_fn=_losses.cross_entropy, metrics=default_metrics, key: Any = None) -> dict[str, float]:
    """Mean loss (and accuracy, for class-index targets) in eval mode (``train=False``), as
    Python floats. ``state``: the model's state (running statistics are used, never updated).
    ``key``: for a model that samples in eval too (a VAE's reparameterisation), split per batch.

    The loss is ``loss_fn(..., reduction="sum")`` over all batches divided by the number of
    target elements (funcnet's losses take ``reduction``).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from funcnet import evaluate, nn
        >>> model = nn.Linear(3, 2)
        >>> params = jax.tree.map(jnp.zeros_like, model.init(jax.random.key(0)))
        >>> result = evaluate(model, params, jnp.ones((4, 3)), jnp.zeros(4, jnp.int32))
        >>> round(result["loss"], 4)  # equal logits: log 2
        0.6931
    """
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}; they must be equal")
    if model.has_state and state is None:
        raise ValueError(f"evaluate: {model.name.split('(')[0]} keeps state (e.g. BatchNorm's running "
                         f"statistics), which eval mode uses: pass state=train_state.model_state")
    n = len(x)
    batch_size = n if batch_size is None else _data.check_batch_size(batch_size, n)
    if metrics is default_metrics:
        _check_label_range(model, params, state, {"test": (x, y)}, "evaluate")
    totals: dict = {}
    elements = 0
    for start in range(0, n, batch_size):
        yb = jnp.asarray(y[start:start + batch_size])
        batch_key = None if key is None else jax.random.fold_in(key, start)
        sums = _eval_batch(model, loss_fn, metrics, params, state, jnp.asarray(x[start:start + batch_size]), yb,
                           batch_key)
        totals = {k: totals.get(k, 0.0) + v for k, v in sums.items()}
        elements += int(np.prod(yb.shape))
    return {k: float(v) / elements for k, v in totals.items()}
