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
  axis that ``n`` divides; replicated when no axis divides or the array is small (fewer
  than ``min_size`` elements: biases and LayerNorm weights, where a collective costs
  more than the memory it saves, as FSDP's own ``min_num_params`` wrapping policy).
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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet import losses as _losses
from funcnet import step as _step

__all__ = ["mesh", "param_spec", "tree_shardings", "state_shardings", "shard_state", "make_fsdp_step",
           "collectives", "per_device_bytes", "ZERO_LEVELS"]

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
    """Split the largest axis of ``shape`` that ``n`` divides (the first such if tied);
    ``P()`` (replicated) when none does, when ``n == 1`` or when the array has fewer than
    ``min_size`` elements."""
    if n == 1 or math.prod(shape) < min_size:
        return P()
    candidates = [i for i, d in enumerate(shape) if d % n == 0]
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


def shard_state(state: _step.TrainState, shardings) -> _step.TrainState:
    """Place ``state`` on the devices with ``shardings`` (each device gets its slice)."""
    return jax.device_put(state, shardings)


def make_fsdp_step(model, tx, loss_fn: Callable = _losses.cross_entropy, mesh: Mesh | None = None, *,
                   zero: int = 3, state: Any = None, donate: bool = True, min_size: int = MIN_SIZE,
                   **step_options):
    """``step(state, (x, y)) -> (state, metrics)``: ``funcnet.make_step``'s step, jit-ed over ``mesh``
    with the state sharded per ``zero`` and the batch split along its first axis.

    ``state``: a ``TrainState`` (or its ``jax.eval_shape``) to read the shapes from; the
    returned step has ``.shardings`` (the state's, for ``shard_state``), ``.batch_sharding``
    and ``.raw``. The state is donated. The gradients are never materialized whole on a
    device under ZeRO-3: XLA reduce-scatters them into the params' sharding.
    """
    if mesh is None:
        mesh = globals()["mesh"]()
    if state is None:
        raise ValueError("make_fsdp_step needs state= (a TrainState or jax.eval_shape of one) to shard")
    (axis_name,) = mesh.axis_names
    shardings = state_shardings(state, mesh, zero=zero, min_size=min_size)
    split = NamedSharding(mesh, P(axis_name))
    raw = _step.make_step(model, tx, loss_fn, donate=False, **step_options).raw

    def sharded(state, batch):
        new_state, metrics = raw(state, batch)
        # the gradients' sharding follows the params' (the update is elementwise), so under
        # ZeRO-3 XLA reduce-scatters them instead of all-reducing whole gradients
        return jax.lax.with_sharding_constraint(new_state, shardings), metrics

    replicated = NamedSharding(mesh, P())
    step = jax.jit(sharded, in_shardings=(shardings, split), out_shardings=(shardings, replicated),
                   donate_argnums=(0,) if donate else ())
    step.raw, step.shardings, step.batch_sharding, step.mesh = sharded, shardings, split, mesh
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
