"""The training loop as pure functions: ``(state, batch) -> (state, metrics)``.

torch's five lines:

```python
optimizer.zero_grad(); out = model(x); loss = F.cross_entropy(out, y)
loss.backward(); optimizer.step()
```

become one compiled function. Gradients are return values, never accumulated in
``.grad``, so there is nothing to zero; the optimizer is an optax transformation
whose state travels in ``TrainState`` next to the params.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from funcnet import guards as _guards
from funcnet import losses as _losses
from funcnet import precision as _precision
from funcnet.nn.module import Module, call, initial_state

__all__ = ["TrainState", "Position", "create_train_state", "make_step", "default_metrics", "is_classification"]


class TrainState(NamedTuple):
    """Everything a training run carries from step to step (a pytree).

    params: the model's params; opt_state: the optax state; step: int32 scalar;
    key: the PRNG key that dropout and shuffling draw from: ``run_epoch`` splits it for each
    epoch's order, and a step draws dropout from a key of its own, ``fold_in(fold_in(key, 1), step)``;
    loss_scale: a precision loss-scale state, or None in full precision;
    model_state: the model's state (torch's buffers, e.g. BatchNorm's running statistics),
    ``{}`` for a model without state. Only ``params`` are differentiated and updated by
    the optimizer; ``model_state`` is what the forward passes return.

    Examples:
        >>> import jax, optax
        >>> from funcnet import TrainState, create_train_state, nn
        >>> state = create_train_state(nn.Linear(3, 2), optax.sgd(0.1), jax.random.key(0))
        >>> isinstance(state, TrainState), TrainState._fields[:4]
        (True, ('params', 'opt_state', 'step', 'key'))
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

    Examples:
        >>> import jax, optax
        >>> from funcnet import create_train_state, nn
        >>> state = create_train_state(nn.Linear(3, 2), optax.adam(1e-3), jax.random.key(0))
        >>> int(state.step), sorted(state.params)
        (0, ['bias', 'weight'])
    """
    if not isinstance(model, Module):
        hint = (" (a list of layers: wrap it, nn.Sequential(*layers))" if isinstance(model, (list, tuple)) else
                " (build it with funcnet.nn, e.g. nn.MLP([64, 128, 10]))")
        raise TypeError(f"create_train_state: model must be a funcnet.nn.Module, got {type(model).__name__}{hint}")
    _check_key(key, "create_train_state")
    init_key, key = jax.random.split(key)
    if params is None:
        params = model.init(init_key)
    else:  # the step donates the state's buffers: the caller's arrays must survive it
        params = _own_copy(params)
    if policy is not None:
        params = _precision.get_policy(policy).cast_to_param(params)
    model_state = initial_state(model) if model_state is None else _own_copy(model_state)
    # an optax state may hold one array twice (two moments from one zeros tree): each gets its own
    return TrainState(params, _unshared(tx.init(params)), jnp.zeros((), jnp.int32), key, loss_scale,
                      _unshared(model_state))


def _own_copy(tree):
    """A copy of every array of ``tree`` (numpy arrays become device arrays), so that donating
    the train state never deletes an array the caller still holds."""
    return jax.tree.map(lambda a: jnp.array(a, copy=True) if hasattr(a, "shape") else a, tree)


def _unshared(tree):
    """``tree`` with every array that appears twice (an LSTM's hidden ``(z, z)``) copied, since
    one buffer cannot be donated twice."""
    seen: set = set()

    def once(a):
        if isinstance(a, jax.Array) and id(a) in seen:
            return jnp.array(a, copy=True)
        seen.add(id(a))
        return a

    return jax.tree.map(once, tree)


def _check_unshared(state) -> None:
    """Name the leaves that are one array twice: XLA's "donate the same buffer twice" names none."""
    arrays = [leaf for leaf in jax.tree.leaves(state) if isinstance(leaf, jax.Array)]
    if len({id(a) for a in arrays}) == len(arrays):  # the common case, checked per step: no paths built
        return
    where: dict = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
            where.setdefault(id(leaf), []).append("state" + jax.tree_util.keystr(path))
    twice = [paths for paths in where.values() if len(paths) > 1]
    if twice:
        raise ValueError(f"step: the train state holds one array twice, at {' and '.join(twice[0])}; the step donates "
                         f"(reuses) every buffer of the state, and one buffer cannot be donated twice: give each "
                         f"its own array (jnp.copy), or build the state with create_train_state, which does")


class Position(NamedTuple):
    """Where a run stands, for ``fit(start=...)``: ``epoch`` epochs are complete. Inside the
    next one, ``perm_key`` is the key its shuffle was drawn from and ``metrics`` the per-step
    ``{"loss", "accuracy"}`` arrays of the steps already taken (both None at an epoch boundary).

    Examples:
        >>> from funcnet import Position
        >>> Position(epoch=2)  # two epochs done: fit(start=Position(2)) begins the third
        Position(epoch=2, perm_key=None, metrics=None)
    """

    epoch: int = 0
    perm_key: Any = None
    metrics: Any = None


def _check_key(key, where: str) -> None:
    typed = hasattr(key, "dtype") and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    raw = hasattr(key, "dtype") and key.dtype == jnp.uint32 and jnp.ndim(key) == 1  # jax.random.PRNGKey
    if not (typed and jnp.shape(key) == ()) and not raw:
        raise TypeError(f"{where}: key must be one PRNG key such as jax.random.key(0), got {key!r:.80}; "
                        f"pass key=jax.random.key(seed)")


def _check_label_range(model, params, model_state, named: dict, where: str = "fit") -> None:
    """Refuse class-index labels outside the model's outputs, on the host: inside jit an
    out-of-range label is no error (the loss reads a clipped logit or NaN, accuracy 0)."""
    named = {k: v for k, v in named.items() if v is not None and len(v[1])}
    if not named:
        return
    x0 = next(iter(named.values()))[0]
    # the whole of x0 traced on shapes only (no compute): a layer's input error names the user's
    # full input shape ((1437, 64), not a slice of it), raised here without JAX's internal frames
    spec = jax.ShapeDtypeStruct(tuple(np.shape(x0)), jnp.asarray(x0[:1]).dtype)
    try:
        out = jax.eval_shape(lambda p, s, x: call(model, p, s, x, key=jax.random.key(0))[0], params, model_state,
                             spec)
    except (ValueError, TypeError) as error:
        if type(error) not in (ValueError, TypeError):
            raise
        raise type(error)(str(error)) from None
    for name, (x, y) in named.items():
        probe = y if x is x0 else jax.ShapeDtypeStruct(np.shape(x0)[:1] + np.shape(y)[1:], np.asarray(y[:1]).dtype)
        _check_labels(out, y, f"{where}: {name} labels", probe)


def _check_labels(out, y, what: str, probe=None) -> None:
    """``probe``: labels shaped as ``out``'s batch (default ``y``)."""
    if isinstance(y, jax.core.Tracer) or not is_classification(out, y if probe is None else probe):
        return
    n_classes = out.shape[-1]
    low, high = int(np.min(y)), int(np.max(y))
    if low < 0 or high >= n_classes:
        raise ValueError(f"{what} range over [{low}, {high}] but the model has {n_classes} outputs; labels must be "
                         f"class indices in [0, {n_classes - 1}] (or widen the last layer)")


def _label_axis(y, axis: int) -> int:
    """The labels' batch axis: the inputs' one, or 0 for labels of fewer axes ((N,) for (S, N, E))."""
    return axis if jnp.ndim(y) > axis else 0


def _check_batch(x, y, accum_steps: int, axis: int) -> None:
    yax = _label_axis(y, axis)
    if jnp.ndim(x) <= axis or jnp.ndim(y) < 1 or jnp.shape(x)[axis] != jnp.shape(y)[yax]:
        layout = "x: (batch, features), y: (batch,)" if axis == 0 else f"x with the batch on axis {axis}"
        raise ValueError(
            f"batch inputs of shape {jnp.shape(x)} and labels of shape {jnp.shape(y)} must share the "
            f"{'leading batch axis' if axis == 0 else f'batch axis (axis {axis} of x, {yax} of y)'}; pass "
            f"batch=(x, y) with {layout}"
        )
    if jnp.shape(x)[axis] % accum_steps:
        raise ValueError(
            f"a batch of {jnp.shape(x)[axis]} examples (axis {axis}) does not split into accum_steps={accum_steps} "
            f"equal micro-batches; use a batch size divisible by {accum_steps}"
        )


def _split(a, k: int, axis: int):
    """``a`` cut into ``k`` contiguous micro-batches along ``axis``, stacked on a new axis 0."""
    shape = a.shape
    return jnp.moveaxis(a.reshape(shape[:axis] + (k, shape[axis] // k) + shape[axis + 1:]), axis, 0)


def default_metrics(outputs: jax.Array, targets: jax.Array) -> dict:
    """``{"accuracy"}`` when ``targets`` are integer class indices of shape ``outputs.shape[:-1]``
    (classification, language modelling), else ``{}`` (regression): decided from static shapes
    and dtypes, so it costs nothing at run time."""
    if is_classification(outputs, targets):
        return {"accuracy": _losses.accuracy(outputs, targets)}
    return {}


def is_classification(outputs, targets) -> bool:
    """Whether (outputs, targets) look like class logits and integer labels: targets integer, outputs one axis more,
    same leading shape."""
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
    batch_axis: int | None = None,
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
      micro-batch, as k torch forward passes would advance it. The batch is cut along
      ``batch_axis`` (default: ``model.batch_axis``, 1 for torch's sequence-first layers such as
      ``nn.TransformerEncoder`` without ``batch_first``); a model whose batch axis is not
      known (None) is refused, never cut along the wrong axis.
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

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> from funcnet import create_train_state, make_step, nn
        >>> model, tx = nn.Linear(3, 2), optax.sgd(0.1)
        >>> step = make_step(model, tx)
        >>> batch = (jnp.ones((4, 3)), jnp.zeros(4, jnp.int32))
        >>> state, metrics = step(create_train_state(model, tx, jax.random.key(0)), batch)
        >>> int(state.step), sorted(metrics)
        (1, ['accuracy', 'loss'])
    """
    if isinstance(accum_steps, bool) or not isinstance(accum_steps, int) or accum_steps < 1:
        raise ValueError(f"accum_steps must be a positive int, got {accum_steps!r}")
    if buffers not in ("broadcast", "local"):
        raise ValueError(f"buffers must be 'broadcast' (torch DDP's default) or 'local', got {buffers!r}")
    if not isinstance(model, Module):
        raise TypeError(f"make_step: model must be a funcnet.nn.Module, got {type(model).__name__}; "
                        f"build it with funcnet.nn (e.g. nn.MLP([64, 128, 10]))")
    _guards.check_tx(tx, "make_step")
    if batch_axis is None:
        batch_axis = model.batch_axis
        if batch_axis is None and accum_steps > 1:
            raise ValueError(
                f"make_step: accum_steps={accum_steps} cuts the batch into micro-batches, but the batch axis of "
                f"{model.name[:120]} is not known (it holds sequence-first layers, whose batch is axis 1, under a "
                f"forward that may transpose); pass make_step(..., batch_axis=0 or 1) for the axis of your "
                f"inputs, or build the layers with batch_first=True")
    elif isinstance(batch_axis, bool) or not isinstance(batch_axis, int) or batch_axis < 0:
        raise ValueError(f"make_step: batch_axis must be a non-negative int (the inputs' batch axis), got "
                         f"{batch_axis!r}")
    axis = batch_axis or 0
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
        _check_batch(x, y, accum_steps, axis)
        # this step's own key, derived without changing the carried one: a model that draws no random
        # numbers leaves it unused and XLA drops it, where a split of the carried key (XLA:CPU's threefry
        # loop) ran every step. Folded under 1 first: train.fit's eval key is fold_in(key, 0x7E57).
        dropout_key = jax.random.fold_in(jax.random.fold_in(state.key, 1), state.step)
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
            micro_x = _split(x, accum_steps, axis)
            micro_y = _split(y, accum_steps, _label_axis(y, axis))
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
        new_state = TrainState(params, opt_state, state.step + 1, state.key, loss_scale, model_state)
        return new_state, values

    donate_argnums = (0,) if donate else ()
    if axis_name is not None:
        jitted = jax.pmap(step, axis_name=axis_name, donate_argnums=donate_argnums)
    else:
        jitted = jax.jit(step, donate_argnums=donate_argnums)
    if not donate:
        jitted.raw = step
        return jitted

    outputs_of: dict = {}  # (x's shape and dtype) -> the model's output shape, for the label check

    @functools.wraps(step)
    def compiled(state, batch):
        _check_unshared(state)
        # (pmap-ed: x and the state carry a device axis; the per-device step is checked by its caller)
        if axis_name is None and isinstance(state, TrainState) and isinstance(batch, (tuple, list)) \
                and len(batch) == 2:
            x, y = batch
            if hasattr(x, "shape") and hasattr(y, "dtype") and jnp.issubdtype(y.dtype, jnp.integer):
                _check_batch(x, y, accum_steps, axis)  # before the micro-batch split below
                spec = (tuple(x.shape), str(x.dtype))
                if spec not in outputs_of:
                    outputs_of[spec] = jax.eval_shape(
                        lambda p, s, xb: call(model, p, s, _split(xb, accum_steps, axis)[0] if accum_steps > 1
                                              else xb, key=jax.random.key(0))[0], state.params, state.model_state, x)
                out = outputs_of[spec]
                if accum_steps > 1:  # the check wants the whole batch's output shape
                    out = jax.ShapeDtypeStruct(jnp.shape(y) + out.shape[jnp.ndim(y):], out.dtype)
                _check_labels(out, y, "step: the labels")
        return jitted(state, batch)

    def check_labels(state, x, y, where="run_epoch"):
        """All of a data set's labels checked once, on the host, before a loop of ``jitted``
        steps: the per-call check above reads each batch's labels back, one sync per step."""
        if axis_name is None:
            _check_label_range(model, state.params, state.model_state, {"train": (x, y)}, where)

    compiled.raw, compiled.lower, compiled.jitted, compiled.check_labels = step, jitted.lower, jitted, check_labels
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
