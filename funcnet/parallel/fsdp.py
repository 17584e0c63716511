"""Fully sharded data parallel (ZeRO-3) and optimizer-state sharding (ZeRO-1) with jit + NamedSharding.

torch counterpart: ``torch.distributed.fsdp.fully_shard`` (FSDP2): each rank keeps 1/N
of every parameter, of its gradient and of the optimizer state; before a layer runs its
parameters are all-gathered, after the backward its gradients are reduce-scattered.
Here nothing of that is written: the train state is *placed* sharded (``NamedSharding``
over a 1-D mesh, each array split along one axis), the step is ``jax.jit``-ed with those
in/out shardings and the batch split over the same axis, and XLA's SPMD partitioner
inserts the all-gathers and the reduce-scatters (``collectives`` counts them in the
compiled HLO).

- ``param_spec(shape, n)``: the ``PartitionSpec`` of one array: split along its largest
  axis that ``n`` divides; when none does, along its largest axis, padded (below);
  replicated when the array is small (fewer than ``min_size`` elements: biases and
  LayerNorm weights, where a collective costs more than the memory it saves, as FSDP's own
  ``min_num_params`` wrapping policy) or no axis has ``n`` entries.
- Uneven sharding (torch FSDP2 pads each parameter's dim 0 to a multiple of the world size
  and keeps one padded shard per rank): an axis of 37 on 4 devices is kept padded to 40,
  10 rows per device, in the placed state (``pad``, ``shard_state``); the step slices the
  state back to its true shapes, runs the one-device step, pads the new state again, and
  ``unpad`` (or ``step.unpad``) gives the true shapes back. The padding is zeros that no
  computation reads.
- ``state_shardings(state, mesh, zero=3)``: a ``TrainState``'s shardings: ZeRO-3
  shards params and optimizer state (gradients follow the params inside the step);
  ZeRO-1 shards the optimizer state only and keeps params replicated (DDP + a sharded
  optimizer, torch's ``ZeroRedundancyOptimizer``); ``zero=0`` replicates everything (DDP).
- ``make_fsdp_step(model, tx, loss_fn, mesh, zero=3)``: ``funcnet.make_step``'s step,
  jit-ed with those shardings; ``step.shardings`` is what ``shard_state`` places.
- ``per_device_bytes(compiled)``: arguments + temps of one device's program (XLA compiles
  one SPMD program, the same on every device).

Runs unchanged on simulated CPU devices (``--xla_force_host_platform_device_count``),
GPUs and TPUs.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet import losses as _losses
from funcnet import step as _step

__all__ = ["mesh", "param_spec", "tree_shardings", "state_shardings", "shard_state", "make_fsdp_step",
           "collectives", "per_device_bytes", "pad", "unpad", "ZERO_LEVELS"]

ZERO_LEVELS = (0, 1, 3)
MIN_SIZE = 1024


def mesh(n: int | None = None, *, axis_name: str = "fsdp") -> Mesh:
    """A 1-D mesh of the first ``n`` devices (all when None) with one axis, ``axis_name``."""
    devices = jax.devices()
    n = len(devices) if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(devices):
        raise ValueError(f"fsdp.mesh: n must be an int in [1, {len(devices)}] (the devices there are), got {n!r}; "
                         f"on CPU simulate more with XLA_FLAGS=--xla_force_host_platform_device_count=8 before "
                         f"JAX starts (funcnet.parallel.simulate_cpu_devices)")
    return Mesh(devices[:n], (axis_name,))


def param_spec(shape: tuple, n: int, *, axis_name: str = "fsdp", min_size: int = MIN_SIZE) -> P:
    """Split the largest axis of ``shape`` that ``n`` divides (the first such if tied); when none
    divides, the largest axis of at least ``n`` entries, to be padded to a multiple of ``n``
    (``pad``); ``P()`` (replicated) when ``n == 1``, when the array has fewer than ``min_size``
    elements or when no axis has ``n`` entries."""
    if n == 1 or math.prod(shape) < min_size:
        return P()
    candidates = [i for i, d in enumerate(shape) if d % n == 0]
    if not candidates:  # uneven, as FSDP2: padded to a multiple of n, one padded slice per device
        candidates = [i for i, d in enumerate(shape) if d >= n]
    if not candidates:
        return P()
    axis = max(candidates, key=lambda i: (shape[i], -i))
    return P(*([None] * axis + [axis_name]))


def tree_shardings(tree: Any, mesh: Mesh, *, min_size: int = MIN_SIZE) -> Any:
    """A ``NamedSharding`` per leaf of ``tree`` (arrays or ``ShapeDtypeStruct``s), by ``param_spec``."""
    (axis_name,) = mesh.axis_names
    n = mesh.devices.size
    return jax.tree.map(lambda a: NamedSharding(mesh, param_spec(tuple(a.shape), n, axis_name=axis_name,
                                                                 min_size=min_size)), tree)


def state_shardings(state: _step.TrainState, mesh: Mesh, *, zero: int = 3, min_size: int = MIN_SIZE):
    """Shardings of a ``TrainState`` (the same structure): see the module docstring for ``zero``."""
    if zero not in ZERO_LEVELS:
        raise ValueError(f"zero must be one of {ZERO_LEVELS} (0: replicate all, 1: shard the optimizer state, "
                         f"3: shard params and optimizer state), got {zero!r}")
    replicated = NamedSharding(mesh, P())
    rep = lambda tree: jax.tree.map(lambda _: replicated, tree)  # noqa: E731
    params = tree_shardings(state.params, mesh, min_size=min_size) if zero == 3 else rep(state.params)
    opt = tree_shardings(state.opt_state, mesh, min_size=min_size) if zero >= 1 else rep(state.opt_state)
    return state._replace(params=params, opt_state=opt, step=replicated, key=replicated,
                          loss_scale=rep(state.loss_scale), model_state=rep(state.model_state))


def _split_sizes(sharding, ndim: int) -> list[int]:
    """How many ways each of an array's ``ndim`` axes is split by the ``NamedSharding``."""
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    sizes = []
    for entry in spec[:ndim]:
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        sizes.append(math.prod(int(sharding.mesh.shape[a]) for a in names))
    return sizes


def _padded(shape: tuple, sharding) -> tuple:
    return tuple(-(-d // k) * k for d, k in zip(shape, _split_sizes(sharding, len(shape))))


def pad(tree: Any, shardings: Any) -> Any:
    """``tree`` (arrays, NumPy arrays or ``ShapeDtypeStruct``s; inside jit too) with every axis that
    its sharding splits unevenly padded with zeros to a multiple of the split: the layout the
    sharded step keeps. Leaves already even are returned as they are."""

    def one(a, sharding):
        if a is None or not hasattr(a, "shape") or not isinstance(sharding, NamedSharding):
            return a
        shape = tuple(a.shape)
        target = _padded(shape, sharding)
        if target == shape:
            return a
        if isinstance(a, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(target, a.dtype)
        widths = [(0, t - d) for d, t in zip(shape, target)]
        return np.pad(a, widths) if isinstance(a, np.ndarray) else jnp.pad(a, widths)

    return jax.tree.map(one, tree, shardings, is_leaf=lambda x: x is None)


def unpad(tree: Any, like: Any) -> Any:
    """``pad``'s inverse: every leaf of ``tree`` sliced to the shape of its leaf in ``like`` (the true
    shapes: arrays or ``ShapeDtypeStruct``s)."""

    def one(a, ref):
        if a is None or not hasattr(a, "shape") or tuple(a.shape) == tuple(ref.shape):
            return a
        return a[tuple(slice(0, d) for d in ref.shape)]

    return jax.tree.map(one, tree, like, is_leaf=lambda x: x is None)


def shard_state(state: _step.TrainState, shardings) -> _step.TrainState:
    """Place ``state`` on the devices with ``shardings`` (each device gets its slice), padding the
    axes that do not split evenly first (``pad``)."""
    return jax.device_put(pad(state, shardings), shardings)


def _on_padded(tx, shardings):
    """``tx`` whose ``update`` takes and gives the params' true shapes but runs ``tx`` on them padded
    by ``shardings`` (the optimizer state's layout, ``pad``), so its state stays padded and evenly split."""
    import optax

    def update(grads, opt_state, params=None):
        padded = None if params is None else pad(params, shardings)
        updates, opt_state = tx.update(pad(grads, shardings), opt_state, padded)
        return unpad(updates, grads), opt_state

    return optax.GradientTransformation(tx.init, update)


def make_fsdp_step(model, tx, loss_fn: Callable = _losses.cross_entropy, mesh: Mesh | None = None, *,
                   zero: int = 3, state: Any = None, donate: bool = True, min_size: int = MIN_SIZE,
                   **step_options):
    """``step(state, (x, y)) -> (state, metrics)``: ``funcnet.make_step``'s step, jit-ed over ``mesh``
    with the state sharded per ``zero`` and the batch split along its first axis.

    ``state``: a ``TrainState`` (or its ``jax.eval_shape``) to read the shapes from; the
    returned step has ``.shardings`` (the state's, for ``shard_state``), ``.batch_sharding``,
    ``.raw``, ``.pad`` / ``.unpad`` (the placed layout from / to the true shapes) and
    ``.state_shapes`` (the placed layout's shapes, to ``lower`` with). The state is donated. The gradients are never materialized whole on a
    device under ZeRO-3: XLA reduce-scatters them into the params' sharding.
    """
    if mesh is None:
        mesh = globals()["mesh"]()
    if state is None:
        raise ValueError("make_fsdp_step needs state= (a TrainState or jax.eval_shape of one) to shard")
    (axis_name,) = mesh.axis_names
    shardings = state_shardings(state, mesh, zero=zero, min_size=min_size)
    split = NamedSharding(mesh, P(axis_name))
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    # the optimizer runs on the padded layout (its state never leaves it): the update is elementwise
    # on even slices; zero gradients on zero params keep the padding zero for Adam, SGD, weight decay
    opt_layout = tree_shardings(state.params, mesh, min_size=min_size) if zero >= 1 else shardings.params
    raw = _step.make_step(model, _on_padded(tx, opt_layout), loss_fn,
                          donate=False, **step_options).raw

    def sharded(state, batch):
        # the params arrive padded where an axis splits unevenly: the model sees their true shapes
        new_state, metrics = raw(state._replace(params=unpad(state.params, shapes.params)), batch)
        new_state = new_state._replace(params=pad(new_state.params, shardings.params))
        # the gradients' sharding follows the params' (the update is elementwise), so under
        # ZeRO-3 XLA reduce-scatters them instead of all-reducing whole gradients
        return jax.lax.with_sharding_constraint(new_state, shardings), metrics

    replicated = NamedSharding(mesh, P())
    step = jax.jit(sharded, in_shardings=(shardings, split), out_shardings=(shardings, replicated),
                   donate_argnums=(0,) if donate else ())
    step.raw, step.shardings, step.batch_sharding, step.mesh = sharded, shardings, split, mesh
    step.pad = lambda tree: pad(tree, shardings)
    step.unpad = lambda tree: unpad(tree, shapes)
    step.state_shapes = pad(shapes, shardings)
    return step


_OPS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def collectives(compiled_or_text) -> dict[str, int]:
    """How many of each collective the compiled HLO holds (``-start`` forms counted once):
    ``{"all-gather": .., "reduce-scatter": .., "all-reduce": .., ...}``."""
    text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
    text = re.sub(r"/\*index=\d+\*/", "", text)  # a long tuple's type holds these; their '=' ends no result
    counts = {}
    for op in _OPS:
        counts[op] = len(re.findall(rf"= [^=\n]*? {op}(?:-start)?\(", text))
    return counts


def per_device_bytes(compiled) -> int:
    """Arguments + temps of the compiled SPMD program: what one device holds during a step
    (the outputs reuse the donated arguments' buffers)."""
    stats = compiled.memory_analysis()
    return int(stats.argument_size_in_bytes + stats.temp_size_in_bytes)
