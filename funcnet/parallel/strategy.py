"""How ``fit`` runs its steps: on one device, or data-, zero-, fsdp-, tensor- or pipeline-parallel on several.

torch counterpart: Lightning's ``Trainer(strategy=..., devices=...)``. ``fit(strategy=...)``
takes a name or a ``Strategy``; ``runner`` turns it into one ``Runner`` whose ``epoch``
runs the same shuffled batches and keys whatever the strategy, so a run on N devices equals
the run on one up to float summation order.

- ``"single"`` (default): ``make_step`` on one device; a whole epoch is one compiled
  ``lax.scan`` unless it is cut into stretches for checkpoints (``funcnet.epoch``).
- ``"pmap"``, ``"shard_map"`` (alias ``"ddp"``), ``"sharding"``: ``parallel.data_parallel``,
  DDP's all-reduce of the gradients; ``Strategy(kind, buffers="local")`` keeps each
  device's BatchNorm statistics (pmap only).
- ``"fsdp"``: ``fsdp.make_fsdp_step``, params and optimizer state sharded (ZeRO-3;
  ``Strategy("fsdp", zero=1)`` shards the optimizer state only). An axis that the device
  count does not divide is kept padded (``fsdp.pad``): ``put`` pads, ``get`` slices back. A
  model whose every array is under ``fsdp.MIN_SIZE`` (nothing to split) is refused, here and
  under ``"zero1"``/``"zero2"``.
- ``"zero1"``, ``"zero2"``: ``zero.make_zero_step``, params replicated and the optimizer
  state (for 2 also the gradients the optimizer receives) sharded over the devices.
- ``"tp"``: ``parallel.tensor.make_tp_step`` on a ``(data, 1, model)`` mesh;
  ``Strategy("tp", tensor_parallel=t, plan={...})`` puts ``t`` devices on the model axis and
  the rest on data (default: all on model) and lays the params out by the plan
  (``{"blocks.*.fc": ColwiseParallel(), ...}``, torch's ``parallelize_module`` plan). Without
  a plan only ``funcnet.gpt.GPT`` is taken (Megatron's rules, ``parallel.tensor.gpt_plan``;
  its embedding split by vocabulary when ``t`` divides it, else whole; built with
  ``GPTConfig(qkv_groups=t)``, parallel.tensor.check_config says why); any other model is
  refused before anything compiles.
- ``"pipe"``: ``parallel.mesh.pipe_parallel``, the model passed in ``pipeline`` stages (GPipe
  or 1F1B over ``microbatches``): any model cut at ``split_points`` (``parallel.stages``), or
  funcnet's GPT by its stacked blocks on one ``(data, fsdp, model, pipe)`` mesh:
  ``Strategy("pipe", pipeline=2, tensor_parallel=2)`` on 8 devices is data 2 x model 2 x
  pipe 2; ``fsdp=f`` splits the params over an ``fsdp`` axis too.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet.epoch import _local_steps, _run_epoch_in_parts, run_epoch
from funcnet.parallel import data as _parallel
from funcnet.parallel import fsdp as _fsdp
from funcnet.parallel import mesh as _mesh
from funcnet.parallel import tensor as _tp
from funcnet.parallel import zero as _zero
from funcnet.step import TrainState, make_step

__all__ = ["Strategy", "STRATEGIES", "Runner", "BatchRunner", "resolve", "runner", "batch_runner"]

STRATEGIES = ("single", "pmap", "shard_map", "sharding", "fsdp", "zero1", "zero2", "tp", "pipe")
AXES = ("data", "fsdp", "model", "pipe")  # the one mesh every sharded strategy is a slice of
_ALIASES = {"ddp": "shard_map"}  # Lightning's name for torch DDP


class Strategy(NamedTuple):
    """A strategy with its options: ``kind`` (one of ``STRATEGIES``), ``buffers`` (what
    data parallelism does with the model's state: ``"broadcast"``, DDP's default, or
    ``"local"``), ``zero`` (fsdp's level: 3 or 1), ``tensor_parallel`` (tp's model axis; 0:
    every device), and for ``"pipe"``: ``pipeline`` (stages on the ``pipe`` axis), ``fsdp``
    (devices on the ``fsdp`` axis), ``microbatches`` (0: one per stage), ``schedule``
    (``"1f1b"`` or ``"gpipe"``), ``split_points`` (dotted module paths where stages 1.. begin;
    None: the longest layer list cut evenly) and ``config`` (optional: checked against the model
    when it is funcnet's GPT, whose stacked-block fast path then runs);
    for ``"tp"``: ``plan`` (``{module-path pattern: style}``, see ``parallel.tensor``)."""

    kind: str = "single"
    buffers: str = "broadcast"
    zero: int = 3
    tensor_parallel: int = 0
    pipeline: int = 0
    fsdp: int = 1
    microbatches: int = 0
    schedule: str = "1f1b"
    config: Any = None
    split_points: Any = None
    plan: Any = None


class Runner(NamedTuple):
    """A strategy made concrete for one model and data set.

    ``epoch(state, start, batch_size, every_steps, on_steps)`` runs one shuffled epoch and
    returns ``(state, per-step metrics)``; ``put`` places a local ``TrainState`` (or a key)
    where the step expects it and ``get`` returns one local copy (what callbacks see)."""

    strategy: Strategy
    n_devices: int
    epoch: Callable
    put: Callable
    get: Callable


def resolve(strategy: Any, devices: int | None) -> Strategy:
    """A ``Strategy`` from ``fit``'s ``strategy=`` and ``devices=``: a name, a ``Strategy``,
    or None (one device, or ``"shard_map"`` when ``devices`` > 1 is asked for)."""
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
        raise ValueError(f"devices must be a positive int or None, got {devices!r}")
    if strategy is None:
        strategy = "single" if devices in (None, 1) else "shard_map"
    if isinstance(strategy, str):
        strategy = Strategy(_ALIASES.get(strategy, strategy))
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be one of {', '.join(STRATEGIES)} or a funcnet.parallel.strategy.Strategy, got "
                        f"{type(strategy).__name__} {strategy!r:.60}")
    kind = _ALIASES.get(strategy.kind, strategy.kind)
    if kind not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy.kind!r}; expected one of {', '.join(STRATEGIES)} "
                         f"(or 'ddp', an alias of 'shard_map')")
    extra = {k: v for k, v in (("pipeline", strategy.pipeline), ("fsdp", strategy.fsdp), ("microbatches",
             strategy.microbatches), ("config", strategy.config), ("split_points", strategy.split_points))
             if v != Strategy._field_defaults[k]}
    if kind != "tp" and strategy.plan is not None:
        raise ValueError(f"strategy {kind!r} takes no plan: a tensor-parallel plan is Strategy('tp', plan=...)'s")
    if kind != "pipe" and extra:
        raise ValueError(f"strategy {kind!r} takes no {', '.join(extra)}: those are Strategy('pipe', ...)'s (the "
                         f"pipeline's stages, its fsdp axis, microbatches, GPTConfig and split points)")
    if kind == "single" and devices not in (None, 1):
        raise ValueError(f"strategy='single' runs on one device, but devices={devices}; pass strategy='shard_map' "
                         f"(or 'pmap', 'sharding', 'fsdp') to train on {devices} devices")
    return strategy._replace(kind=kind)


def runner(model, tx, loss_fn, strategy: Strategy, devices: int | None, x, y, batch_size: int, *,
           state_shapes: Callable[[], TrainState], **step_options) -> Runner:
    """The ``Runner`` of ``strategy`` over the training data ``(x, y)``. ``state_shapes()``
    gives the ``TrainState``'s shapes (fsdp reads its shardings from them);
    ``step_options`` go to ``make_step`` (``accum_steps``, ``policy``, ``metrics``)."""
    if strategy.kind == "single":
        step = make_step(model, tx, loss_fn, **step_options)
        x_dev, y_dev = jnp.asarray(x), jnp.asarray(y)
        run_steps = _local_steps(step.raw, x_dev, y_dev)

        def epoch(state, start, batch, every_steps, on_steps, until=None):
            if every_steps is None and start.perm_key is None and until is None:
                return run_epoch(step, state, x_dev, y_dev, batch_size=batch)
            return _run_epoch_in_parts(run_steps, state, len(x_dev), batch, start, every_steps, on_steps,
                                       until=until)

        same = lambda t: t  # noqa: E731
        return Runner(strategy, 1, epoch, same, same)
    example = tuple(jax.ShapeDtypeStruct((batch_size, *np.shape(a)[1:]), jnp.asarray(a[:1]).dtype) for a in (x, y))
    dp = _placed(model, tx, loss_fn, strategy, devices, batch_size, state_shapes, step_options, example)
    x_host, y_host = np.asarray(x), np.asarray(y)

    def run_steps(state, indices, lo, hi):
        return _parallel.steps_between(dp, state, indices, lo, hi, x=x_host, y=y_host)

    def epoch(state, start, batch, every_steps, on_steps, until=None):
        return _run_epoch_in_parts(run_steps, state, len(x_host), batch, start, every_steps, on_steps,
                                   dp.get, dp.put_state, until)

    return Runner(strategy, dp.n_devices, epoch, dp.put_state, dp.get)


class BatchRunner(NamedTuple):
    """A strategy's step for batches that arrive one at a time (a ``loader.Loader``'s):
    ``step(state, batch) -> (state, metrics)`` with ``state`` placed by ``put`` and the metrics
    one local copy; ``get`` gives one local copy of a placed tree."""

    strategy: Strategy
    n_devices: int
    step: Callable
    put: Callable
    get: Callable


def batch_runner(model, tx, loss_fn, strategy: Strategy, devices: int | None, batch_size: int, *,
                 state_shapes: Callable[[], TrainState], **step_options) -> BatchRunner:
    """The ``BatchRunner`` of ``strategy`` for batches of ``batch_size`` (arguments as ``runner``'s):
    the same step as ``runner``'s epochs take, fed one batch at a time. On one device it is
    ``make_step``'s step, which checks each batch's labels."""
    if strategy.kind == "single":
        same = lambda t: t  # noqa: E731
        return BatchRunner(strategy, 1, make_step(model, tx, loss_fn, **step_options), same, same)
    dp = _placed(model, tx, loss_fn, strategy, devices, batch_size, state_shapes, step_options)

    def step(state, batch):
        state, metrics = dp.step(state, dp.put_batch(batch))
        return state, dp.get(metrics)

    return BatchRunner(strategy, dp.n_devices, step, dp.put_state, dp.get)


def _placed(model, tx, loss_fn, strategy: Strategy, devices, batch_size: int, state_shapes, step_options,
            example=None):
    """The ``parallel.DataParallel`` of a strategy other than ``"single"``, its batch size checked;
    ``example``: one batch's ``(x, y)`` shapes (the pipeline traces the model on them)."""
    if strategy.kind == "pipe":
        dp = _mesh.pipe_parallel(model, tx, loss_fn, strategy, devices, state_shapes, step_options, example)
    elif strategy.kind in ("fsdp", "zero1", "zero2", "tp"):
        dp = _sharded_parallel(model, tx, loss_fn, strategy, devices, state_shapes, step_options)
    else:
        dp = _parallel.data_parallel(model, tx, loss_fn, kind=strategy.kind, devices=devices,
                                     buffers=strategy.buffers, **step_options)
    _parallel.check_batch_size(batch_size, dp)
    return dp


def _sharded_parallel(model, tx, loss_fn, strategy: Strategy, devices, state_shapes, step_options):
    """fsdp's, zero's or tp's step as a ``parallel.DataParallel``: the state placed with the step's
    shardings, the batch split over the mesh's data axes, one local copy on the first device."""
    kind = strategy.kind
    if jax.process_count() > 1:
        raise ValueError(f"strategy={kind!r} in fit runs in one process; over several processes use "
                         f"fsdp.make_fsdp_step / parallel.tensor.make_tp_step with jax.make_array_from_process_local_data")
    if strategy.buffers != "broadcast":
        raise ValueError(f"buffers={strategy.buffers!r} is for data-parallel replicas; {kind} keeps one state "
                         f"sharded over the mesh: leave buffers out")
    shapes = jax.eval_shape(state_shapes)
    if kind == "fsdp":
        mesh = _fsdp.mesh(devices)
        step = _fsdp.make_fsdp_step(model, tx, loss_fn, mesh, zero=strategy.zero, state=shapes, **step_options)
    elif kind in ("zero1", "zero2"):
        step = _zero.make_zero_step(model, tx, loss_fn, _fsdp.mesh(devices), stage=int(kind[-1]), state=shapes,
                                    **step_options)
        mesh = step.mesh
    else:
        n = devices or len(jax.devices())
        t = strategy.tensor_parallel or n
        if n % t:
            raise ValueError(f"strategy='tp': tensor_parallel={t} must divide the {n} devices (the rest is the data "
                             f"axis)")
        mesh = _tp.mesh(data=n // t, model=t)
        vocab = "split"
        config = _tp.gpt_config_of(model) if strategy.plan is None else None
        if config is not None and config.vocab_size % t:
            vocab = "replicate"  # the embedding whole on each model device, as strategy='pipe' does
        step = _tp.make_tp_step(model, tx, loss_fn, mesh, state=shapes, plan=strategy.plan, vocab=vocab,
                                **step_options)
    replicated = NamedSharding(mesh, P())
    n = mesh.devices.size
    if kind != "tp" and n > 1:
        _check_something_split(kind, shapes, step.shardings, n)
    pad = getattr(step, "pad", lambda t: t)  # fsdp's and zero's keep an uneven axis padded (fsdp.pad)
    unpad = getattr(step, "unpad", lambda t: t)

    def put_state(tree):
        if isinstance(tree, TrainState):
            return jax.device_put(pad(tree), step.shardings)
        return jax.device_put(tree, replicated)

    def put_batch(batch):
        _parallel.check_batch_size(int(np.shape(batch[0])[0]), dp)
        return jax.device_put(batch, step.batch_sharding)

    def get(tree):
        tree = jax.device_put(tree, jax.devices()[0])
        return unpad(tree) if isinstance(tree, TrainState) else tree

    # n_devices is the whole mesh: the batch check asks a multiple of it, stricter than tp's data axis needs
    dp = _parallel.DataParallel(kind, n, step, put_state, put_batch, get)
    return dp


def _check_something_split(kind: str, shapes, shardings, n: int) -> None:
    """Refuse a sharded strategy under which every array stays whole (each smaller than
    ``fsdp.MIN_SIZE``): it would run as data parallelism that says otherwise."""
    split = [sh for sh in jax.tree.leaves(shardings.opt_state) + jax.tree.leaves(shardings.params)
             if isinstance(sh, NamedSharding) and any(e is not None for e in sh.spec)]
    if split:
        return
    leaves = jax.tree_util.tree_flatten_with_path(shapes.params)[0]
    path, largest = max(leaves, key=lambda kv: int(np.prod(kv[1].shape))) if leaves else ((), None)
    name = ".".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
    raise ValueError(f"strategy={kind!r}: every array of this model is smaller than {_fsdp.MIN_SIZE} entries (the "
                     f"largest, {name}, has shape {None if largest is None else tuple(largest.shape)}), which stay "
                     f"whole, so each of the {n} devices would keep the whole state: use strategy='shard_map' (data "
                     f"parallel), or fsdp.make_fsdp_step(min_size=0) / zero.make_zero_step(min_size=0) to split them")
