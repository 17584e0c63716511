"""The training loop as pure functions: ``(state, batch) -> (state, metrics)``.

torch's five lines::

    optimizer.zero_grad(); out = model(x); loss = F.cross_entropy(out, y)
    loss.backward(); optimizer.step()

become one compiled function. Gradients are return values, never accumulated in
``.grad``, so there is nothing to zero; the optimizer is an optax transformation
whose state travels in ``TrainState`` next to the params.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import data as _data
from funcnet import guards as _guards
from funcnet import losses as _losses
from funcnet import precision as _precision
from funcnet.nn.module import Module, call, initial_state

__all__ = ["TrainState", "Position", "create_train_state", "make_step", "run_epoch", "evaluate", "fit"]


class TrainState(NamedTuple):
    """Everything a training run carries from step to step (a pytree).

    params: the model's params; opt_state: the optax state; step: int32 scalar;
    key: the PRNG key that dropout and shuffling draw from (split every use);
    loss_scale: a precision loss-scale state, or None in full precision;
    model_state: the model's state (torch's buffers, e.g. BatchNorm's running statistics),
    ``{}`` for a model without state. Only ``params`` are differentiated and updated by
    the optimizer; ``model_state`` is what the forward passes return.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    key: jax.Array
    loss_scale: Any = None
    model_state: Any = None


def create_train_state(model: Module, tx: optax.GradientTransformation, key: jax.Array, *,
                       params: Any = None, loss_scale: Any = None, policy: Any = None,
                       model_state: Any = None) -> TrainState:
    """Initialise params (unless given), the model's state (unless given) and the optimizer
    state from ``key``.

    ``loss_scale``: a ``funcnet.precision`` loss-scale state (e.g. ``DynamicLossScale()``);
    ``policy``: the params are stored in its ``param_dtype`` (the master copy); the model's
    state keeps its own dtypes (running statistics stay float32, as in torch autocast).
    """
    _check_key(key, "create_train_state")
    init_key, key = jax.random.split(key)
    if params is None:
        params = model.init(init_key)
    if policy is not None:
        params = _precision.get_policy(policy).cast_to_param(params)
    if model_state is None:
        model_state = initial_state(model)
    return TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), key, loss_scale, model_state)


class Position(NamedTuple):
    """Where a run stands, for ``fit(start=...)``: ``epoch`` epochs are complete. Inside the
    next one, ``perm_key`` is the key its shuffle was drawn from and ``metrics`` the per-step
    ``{"loss", "accuracy"}`` arrays of the steps already taken (both None at an epoch boundary)."""

    epoch: int = 0
    perm_key: Any = None
    metrics: Any = None


def _check_key(key, where: str) -> None:
    typed = hasattr(key, "dtype") and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    raw = hasattr(key, "dtype") and key.dtype == jnp.uint32 and jnp.ndim(key) == 1  # jax.random.PRNGKey
    if not (typed and jnp.shape(key) == ()) and not raw:
        raise TypeError(f"{where}: key must be one PRNG key such as jax.random.key(0), got {key!r:.80}; "
                        f"pass key=jax.random.key(seed)")


def _check_batch(x, y, accum_steps: int) -> None:
    if jnp.ndim(x) < 1 or jnp.ndim(y) < 1 or jnp.shape(x)[0] != jnp.shape(y)[0]:
        raise ValueError(
            f"batch inputs of shape {jnp.shape(x)} and labels of shape {jnp.shape(y)} must share the "
            f"leading batch axis; pass batch=(x, y) with x: (batch, features), y: (batch,)"
        )
    if jnp.shape(x)[0] % accum_steps:
        raise ValueError(
            f"a batch of {jnp.shape(x)[0]} examples does not split into accum_steps={accum_steps} "
            f"equal micro-batches; use a batch size divisible by {accum_steps}"
        )


def default_metrics(outputs: jax.Array, targets: jax.Array) -> dict:
    """``{"accuracy"}`` when ``targets`` are integer class indices of shape ``outputs.shape[:-1]``
    (classification, language modelling), else ``{}`` (regression): decided from static shapes
    and dtypes, so it costs nothing at run time."""
    if is_classification(outputs, targets):
        return {"accuracy": _losses.accuracy(outputs, targets)}
    return {}


def is_classification(outputs, targets) -> bool:
    return (jnp.issubdtype(jnp.result_type(targets), jnp.integer)
            and jnp.ndim(outputs) == jnp.ndim(targets) + 1
            and jnp.shape(outputs)[:-1] == jnp.shape(targets))


def make_step(
    model: Module,
    tx: optax.GradientTransformation,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = _losses.cross_entropy,
    *,
    accum_steps: int = 1,
    axis_name: str | None = None,
    donate: bool = True,
    policy: Any = None,
    metrics: Callable[[jax.Array, jax.Array], dict] = default_metrics,
    buffers: str = "broadcast",
):
    """A compiled, pure training step ``step(state, (x, y)) -> (state, metrics)``.

    - ``metrics``: ``"loss"`` plus ``metrics(outputs, y)`` (default: ``"accuracy"`` when ``y``
      holds class indices, nothing more for regression targets).
    - The model's state (``state.model_state``, torch's buffers) goes through the forward
      pass in train mode and comes back updated, never differentiated.
    - The old state is donated: its buffers are reused for the new one (the
      functional counterpart of torch's in-place ``optimizer.step()``); do not use
      it after the call.
    - ``accum_steps=k`` splits the batch into k micro-batches, sums their gradients in
      a ``lax.scan`` and applies one update with the mean: torch's "call backward k
      times, then step" without a mutable ``.grad``. The model's state advances once per
      micro-batch, as k torch forward passes would advance it.
    - ``axis_name``: gradients and metrics are averaged with ``lax.pmean`` over that
      named axis (DDP's all-reduce); the returned step is ``jax.pmap``-ed over it. The
      model's state: ``buffers="broadcast"`` keeps device 0's (torch DDP's default
      ``broadcast_buffers=True``), ``"local"`` keeps each device's own (DDP with
      ``broadcast_buffers=False``). For statistics over the global batch use
      ``nn.SyncBatchNorm`` layers with this ``axis_name``.
    - ``policy`` (a ``funcnet.precision.Policy`` or a string such as ``"bf16"``): the
      forward and backward pass run on a ``compute_dtype`` copy of params and inputs
      (torch: ``autocast``); outputs are cast to ``output_dtype`` before the loss.
    - ``state.loss_scale`` (torch: ``GradScaler``): when not None the loss is scaled,
      the gradients unscaled in float32, and a step whose scaled gradients are not all
      finite keeps params and optimizer state (optax's count too) exactly, as
      ``scaler.step`` skips ``optimizer.step()``; the scale is then adjusted. The model's
      state still advances, as torch's forward has already updated the buffers. All on
      device; metrics gain ``"loss_scale"`` (the scale this step used) and ``"grads_finite"``.

    ``step.raw`` is the uncompiled function, for use inside other transformations
    (``run_epoch`` scans it).
    """
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
        raise ValueError(f"accum_steps must be a positive int, got {accum_steps!r}")
    if buffers not in ("broadcast", "local"):
        raise ValueError(f"buffers must be 'broadcast' (torch DDP's default) or 'local', got {buffers!r}")
    if not isinstance(model, Module):
        raise TypeError(f"make_step: model must be a funcnet.nn.Module, got {type(model).__name__}; "
                        f"build it with funcnet.nn (e.g. nn.MLP([64, 128, 10]))")
    _guards.check_tx(tx, "make_step")
    policy = None if policy is None else _precision.get_policy(policy)

    def loss_and_outputs(params, model_state, x, y, key, loss_scale):
        if policy is not None:
            params, x = policy.cast_to_compute((params, x))
        outputs, model_state = call(model, params, model_state, x, key=key, train=True)
        if policy is not None:
            outputs = policy.cast_to_output(outputs)
        loss = loss_fn(outputs, y)
        return (loss if loss_scale is None else loss_scale.scale(loss)), (loss, outputs, model_state)

    grad_fn = jax.value_and_grad(loss_and_outputs, has_aux=True)

    def step(state: TrainState, batch):
        _check_step_args(state, batch)
        x, y = batch
        _check_batch(x, y, accum_steps)
        key, dropout_key = jax.random.split(state.key)
        grad_params = state.params
        model_state = state.model_state
        if axis_name is not None:
            dropout_key = jax.random.fold_in(dropout_key, jax.lax.axis_index(axis_name))
            # Differentiate a per-device copy. Under shard_map's type checking the gradient of a
            # replicated input would otherwise come back already summed over devices (the
            # transpose of the implicit broadcast is a psum); the pmean below is the all-reduce.
            grad_params = jax.lax.pcast(state.params, axis_name, to="varying")
            model_state = jax.lax.pcast(model_state, axis_name, to="varying")
        if accum_steps == 1:
            (_, (loss, outputs, model_state)), grads = grad_fn(grad_params, model_state, x, y, dropout_key,
                                                               state.loss_scale)
            values = {"loss": loss, **metrics(outputs, y)}
        else:
            micro_x = x.reshape((accum_steps, -1) + x.shape[1:])
            micro_y = y.reshape((accum_steps, -1) + y.shape[1:])
            keys = jax.random.split(dropout_key, accum_steps)

            def micro(carry, inputs):
                total, ms = carry
                xb, yb, k = inputs
                (_, (loss_b, out_b, ms)), grads_b = grad_fn(grad_params, ms, xb, yb, k, state.loss_scale)
                total = jax.tree.map(jnp.add, total, (grads_b, {"loss": loss_b, **metrics(out_b, yb)}))
                return (total, ms), None

            one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), (micro_x, micro_y, keys))
            out_shape = jax.eval_shape(grad_fn, grad_params, model_state, *one, state.loss_scale)[0][1][1]
            shapes = jax.eval_shape(lambda o, t: {"loss": loss_fn(o, t), **metrics(o, t)}, out_shape, micro_y[0])
            zero = (jax.tree.map(jnp.zeros_like, state.params),
                    jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
            if axis_name is not None:
                zero = jax.lax.pcast(zero, axis_name, to="varying")  # the carry holds per-device sums
            ((grads, values), model_state), _ = jax.lax.scan(micro, (zero, model_state), (micro_x, micro_y, keys))
            grads, values = jax.tree.map(lambda t: t / accum_steps, (grads, values))
        if axis_name is not None:
            grads, values = jax.lax.pmean((grads, values), axis_name)
            model_state = _sync_buffers(model_state, axis_name, buffers)
        loss_scale = state.loss_scale
        if loss_scale is not None:
            finite = _precision.all_finite(grads)  # of the scaled gradients, as GradScaler checks them
            grads = loss_scale.unscale(grads)

        def update(grads):
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            return optax.apply_updates(state.params, updates), opt_state

        if loss_scale is None:
            params, opt_state = update(grads)
        else:
            # GradScaler skips optimizer.step() on overflow. A cond rather than a select of both
            # results: only one branch runs, and the new state can reuse the donated buffers.
            params, opt_state = jax.lax.cond(finite, update, lambda _: (state.params, state.opt_state), grads)
            values.update(loss_scale=loss_scale.loss_scale, grads_finite=finite)
            loss_scale = loss_scale.adjust(finite)
        new_state = TrainState(params, opt_state, state.step + 1, key, loss_scale, model_state)
        return new_state, values

    donate_argnums = (0,) if donate else ()
    if axis_name is not None:
        compiled = jax.pmap(step, axis_name=axis_name, donate_argnums=donate_argnums)
    else:
        compiled = jax.jit(step, donate_argnums=donate_argnums)
    compiled.raw = step
    return compiled


def _sync_buffers(model_state, axis_name: str, buffers: str):
    if buffers == "local" or not jax.tree.leaves(model_state):
        return model_state
    # DDP's broadcast_buffers: every replica continues from rank 0's buffers.
    first = jax.lax.axis_index(axis_name) == 0
    return jax.tree.map(lambda b: jax.lax.psum(jnp.where(first, b, jnp.zeros_like(b)), axis_name), model_state)


def _check_step_args(state, batch) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(f"step: the first argument must be the TrainState from create_train_state, got "
                        f"{_describe(state)}; call step(state, (x, y))")
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(f"step: the batch must be a pair (x, y), got {_describe(batch)}; call step(state, (x, y))")


def _describe(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"an array of shape {tuple(value.shape)}"
    return type(value).__name__


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
                        get=lambda t: t, put=lambda t: t):
    # The same batches and keys as run_epoch, run in stretches that end on multiples of
    # every_steps, so on_steps can checkpoint mid-epoch and a resumed run can finish the epoch.
    # run_steps(state, indices, lo, hi) -> (state, per-step metrics of steps lo..hi-1); get/put
    # move a placed (data-parallel) state's leaves to and from one local copy.
    if start.perm_key is None:
        key, perm_key = jax.random.split(get(state.key))
        state, parts = state._replace(key=put(key)), []
    else:
        perm_key, parts = start.perm_key, [start.metrics]
    indices = _data.epoch_indices(perm_key, n_examples, batch_size)
    done = sum(len(p["loss"]) for p in parts)
    if done > len(indices):
        raise ValueError(f"fit: start.metrics holds {done} steps but an epoch has {len(indices)}; "
                         f"pass the Position saved by the same run")
    while done < len(indices):
        stop = len(indices)
        if every_steps:
            stop = min(stop, done + every_steps - int(get(state.step)) % every_steps)
        state, rows = run_steps(state, indices, done, stop)
        parts.append(rows)
        done = stop
        if on_steps is not None and done < len(indices) and int(get(state.step)) % every_steps == 0:
            on_steps(get(state), Position(start.epoch, perm_key, _concat(parts)))
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
    """
    _guards.check_step_fn(step)
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}; they must be equal")
    batch_size = _data.check_batch_size(batch_size, len(x))
    x, y = jnp.asarray(x), jnp.asarray(y)
    if scan and not _slow_in_loops(step.raw, state, *_batch_spec(x, y, batch_size)):
        return _scan_epoch(step.raw, state, x, y, batch_size)
    key, perm_key = jax.random.split(state.key)
    state = state._replace(key=key)
    history = []
    for xb, yb in _data.batches(perm_key, x, y, batch_size):
        state, metrics = step(state, (xb, yb))
        history.append(metrics)
    return state, jax.tree.map(lambda *m: jnp.stack(m), *history)


@functools.partial(jax.jit, static_argnames=("model", "loss_fn", "metrics"))
def _eval_batch(model, loss_fn, metrics, params, model_state, x, y):
    outputs, _ = call(model, params, model_state, x, train=False)
    sums = {"loss": loss_fn(outputs, y, reduction="sum")}
    if metrics is default_metrics and is_classification(outputs, y):
        sums["accuracy"] = jnp.sum(jnp.argmax(outputs, -1) == y)
    return sums


def evaluate(model: Module, params, x, y, *, state: Any = None, batch_size: int | None = None,
             loss_fn=_losses.cross_entropy, metrics=default_metrics) -> dict[str, float]:
    """Mean loss (and accuracy, for class-index targets) in eval mode (``train=False``), as
    Python floats. ``state``: the model's state (running statistics are used, never updated).

    The loss is ``loss_fn(..., reduction="sum")`` over all batches divided by the number of
    target elements (funcnet's losses take ``reduction``).
    """
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}; they must be equal")
    if model.has_state and state is None:
        raise ValueError(f"evaluate: {model.name.split('(')[0]} keeps state (e.g. BatchNorm's running "
                         f"statistics), which eval mode uses: pass state=train_state.model_state")
    n = len(x)
    batch_size = n if batch_size is None else _data.check_batch_size(batch_size, n)
    totals: dict = {}
    elements = 0
    for start in range(0, n, batch_size):
        yb = jnp.asarray(y[start:start + batch_size])
        sums = _eval_batch(model, loss_fn, metrics, params, state, jnp.asarray(x[start:start + batch_size]), yb)
        totals = {k: totals.get(k, 0.0) + v for k, v in sums.items()}
        elements += int(np.prod(yb.shape))
    return {k: float(v) / elements for k, v in totals.items()}


def output_shape(model: Module, params, model_state, x):
    """The model's output for the whole of ``x``, traced on shapes only (no compute).

    Run before any step compiles, so a layer's input error names the user's full input shape
    (``(1437, 64)``, not a slice of it) and is raised here, outside JAX's tracing, without its
    internal frames or a chained JAX traceback."""
    spec = jax.ShapeDtypeStruct(tuple(np.shape(x)), jnp.asarray(x[:1]).dtype)
    try:
        return jax.eval_shape(lambda p, s, v: call(model, p, s, v)[0], params, model_state, spec)
    except (ValueError, TypeError) as error:
        if type(error) not in (ValueError, TypeError):
            raise
        raise type(error)(str(error)) from None


def _check_label_range(model, params, model_state, *datasets) -> None:
    # Inside jit an out-of-range label is not an error: optax's cross entropy would silently
    # read a clipped logit. Check once, on the host, against the model's output size.
    out = output_shape(model, params, model_state, datasets[0][0])
    labels = datasets[0][1]
    if not is_classification(out, jax.ShapeDtypeStruct(tuple(np.shape(labels)), np.asarray(labels[:1]).dtype)):
        return
    n_classes = out.shape[-1]
    for name, ds in zip(("train", "test"), datasets):
        if ds is None or not len(ds[1]):
            continue
        low, high = int(np.min(ds[1])), int(np.max(ds[1]))
        if low < 0 or high >= n_classes:
            raise ValueError(f"{name} labels range over [{low}, {high}] but the model has {n_classes} outputs; "
                             f"labels must be class indices in [0, {n_classes - 1}] (or widen the last layer)")


def _epoch_record(epoch: int, state: TrainState, epoch_metrics: dict, model: Module, test_data=None, *,
                 loss_fn=_losses.cross_entropy, metrics: Callable = default_metrics, check_finite: bool = True) -> dict:
    """The history record of epoch ``epoch`` (1-based) that ``fit`` and ``loader.fit_stream`` return:
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
        scores = evaluate(model, state.params, *test_data, state=state.model_state, loss_fn=loss_fn, metrics=metrics)
        record.update({f"test_{k}": v for k, v in scores.items()})
    if check_finite:
        _guards.check_finite_record(record, state.params)
    return record


class _EpochProgress:
    """``fit``'s progress bar, one tick per epoch, described by the last record's loss and test
    accuracy: ``with _EpochProgress(show, epochs, done) as bar: ... bar.advance(record)``."""

    def __init__(self, show: bool, epochs: int, done: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("epoch"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.description}"),
                             TimeElapsedColumn(), disable=not show, transient=False)
        self._task = self._bar.add_task("", total=epochs, completed=done)

    def __enter__(self):
        self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self._bar.__exit__(*exc)

    def advance(self, record: dict) -> None:
        desc = f"loss {record['train_loss']:.4f}"
        if "test_accuracy" in record:
            desc += f"  test acc {record['test_accuracy']:.4f}"
        self._bar.update(self._task, advance=1, description=desc)


def fit(model: Module, tx: optax.GradientTransformation, train_data, test_data=None, *,
        epochs: int, batch_size: int, key: jax.Array, loss_fn=_losses.cross_entropy,
        accum_steps: int = 1, state: TrainState | None = None, progress: bool = True,
        on_epoch: Callable[[TrainState, dict], None] | None = None, start: Position | None = None,
        every_steps: int | None = None, on_steps: Callable[[TrainState, Position], None] | None = None,
        policy: Any = None, loss_scale: Any = None, metrics: Callable = default_metrics,
        devices: int | None = None, parallel: str | None = None, buffers: str = "broadcast",
        check_finite: bool = True):
    """Train up to epoch ``epochs``; ``(state, history)`` with one dict of metrics per epoch run.

    Each epoch is one ``run_epoch`` (one compiled scan); per-epoch metrics are fetched
    once. ``on_epoch(state, record)`` is called after each epoch; with ``every_steps=n``,
    ``on_steps(state, position)`` is also called whenever ``state.step`` reaches a multiple
    of n inside an epoch (same result, the epoch is scanned in stretches). To resume, pass
    the saved ``state`` and ``start=Position(...)`` saved with it: epochs ``start.epoch + 1
    .. epochs`` then run exactly as in an uninterrupted run. ``policy`` and ``loss_scale``
    (the initial loss-scale state of a new run) are ``make_step``'s and ``create_train_state``'s;
    with a loss scale each record also gives ``skipped_steps`` and the last ``loss_scale``.

    ``devices=N`` and/or ``parallel="pmap" | "shard_map" | "sharding"`` train data-parallel
    (``funcnet.parallel.data_parallel``; ``buffers`` says what happens to the model's state,
    see ``make_step``) with everything above unchanged: the same batches and keys, so the
    same result as one device up to float summation order; callbacks and the returned state
    see one local copy.

    ``check_finite``: inputs with NaN/Inf are refused before anything compiles, and a
    non-finite epoch loss or parameter raises ``guards.NonFiniteLossError`` naming the epoch,
    before ``on_epoch`` sees the record (so a checkpoint callback keeps the last good state).
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative int, got {epochs!r}")
    if every_steps is not None and (isinstance(every_steps, bool) or not isinstance(every_steps, int)
                                    or every_steps < 1):
        raise ValueError(f"every_steps must be a positive int or None, got {every_steps!r}")
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
    x_dev, y_dev = jnp.asarray(x_tr), jnp.asarray(y_tr)
    get = put = (lambda t: t)
    dp = None
    if devices is None and parallel is None:
        step = make_step(model, tx, loss_fn, accum_steps=accum_steps, policy=policy, metrics=metrics)
        run_steps = _local_steps(step.raw, x_dev, y_dev)
    else:
        from funcnet import parallel as _parallel

        dp = _parallel.data_parallel(model, tx, loss_fn, kind=parallel or "shard_map", devices=devices,
                                     accum_steps=accum_steps, policy=policy, metrics=metrics, buffers=buffers)
        _parallel.check_batch_size(batch_size, dp)
        get, put = dp.get, dp.put_state
        run_steps = functools.partial(_parallel.steps_between, dp, x=np.asarray(x_tr), y=np.asarray(y_tr))
    if state is None:
        state = create_train_state(model, tx, key, loss_scale=loss_scale, policy=policy)
    _check_label_range(model, state.params, state.model_state, train_data, test_data)
    state = put(state)
    history = []
    with _EpochProgress(progress, epochs, start.epoch) as bar:
        for epoch in range(start.epoch, epochs):
            if every_steps is None and start.perm_key is None and dp is None:
                state, epoch_metrics = run_epoch(step, state, x_dev, y_dev, batch_size=batch_size)
            else:
                state, epoch_metrics = _run_epoch_in_parts(run_steps, state, len(x_tr), batch_size, start,
                                                           every_steps, on_steps, get, put)
            start = Position(epoch + 1)
            local = get(state)
            record = _epoch_record(epoch + 1, local, epoch_metrics, model, test_data, loss_fn=loss_fn,
                                  metrics=metrics, check_finite=check_finite)
            history.append(record)
            if on_epoch is not None:
                on_epoch(local, record)
            bar.advance(record)
    return get(state), history
