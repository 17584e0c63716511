"""Data parallelism: a copy of the model per device, the global batch split across the
devices, gradients averaged by an all-reduce before every update.

torch counterpart: ``DistributedDataParallel(model)`` all-reduces ``.grad`` during
``backward()``. Three JAX forms of the same step, all equal to single-device training
on the full batch:

- ``"pmap"``: ``make_step(..., axis_name="data")`` is ``jax.pmap``-ed; the state carries a
  leading device axis (``replicate``/``unreplicate``), the batch is reshaped to
  ``(devices, batch // devices, ...)`` (``shard``). In maintenance mode since JAX 0.8.
- ``"shard_map"``: ``make_shard_map_step``: the same per-device code under ``jax.shard_map``
  with an explicit ``lax.pmean``; the state is one array replicated over a ``Mesh``.
- ``"sharding"``: ``make_sharded_step``: single-device code under ``jax.jit`` with
  ``NamedSharding``s; the compiler inserts the all-reduce.

``data_parallel`` bundles any form with the placement it expects; ``run_epoch`` and
``fit`` drive it. Several processes: ``initialize`` (``jax.distributed``), then each
process feeds its ``process_slice`` of the global batch to the same steps.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from funcnet import data as _data
from funcnet import losses as _losses
from funcnet import step as _step
from funcnet.epoch import _run_epoch_in_parts

__all__ = ["KINDS", "simulate_cpu_devices", "data_mesh", "replicate", "unreplicate", "shard",
           "make_shard_map_step", "make_sharded_step", "DataParallel", "data_parallel", "check_batch_size",
           "steps_between", "run_epoch", "Cluster", "initialize", "process_slice"]

KINDS = ("pmap", "shard_map", "sharding")
_HOST_COUNT_FLAG = "--xla_force_host_platform_device_count"


def _count(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{what} must be a positive int, got {n!r}")
    return int(n)


def simulate_cpu_devices(n: int) -> None:
    """Make the CPU backend expose at least ``n`` devices (a no-op if it already will).

    Must run before JAX's backend starts (before the first array is created);
    importing jax is fine. Sets ``jax_num_cpu_devices``, which overrides XLA_FLAGS'
    ``--xla_force_host_platform_device_count``. GPUs and TPUs are unaffected.
    """
    n = _count(n, "simulate_cpu_devices(n)")
    flag = re.search(_HOST_COUNT_FLAG + r"=(\d+)", os.environ.get("XLA_FLAGS", ""))
    configured = max(jax.config.jax_num_cpu_devices, int(flag.group(1)) if flag else 1)
    try:
        jax.config.update("jax_num_cpu_devices", max(n, configured))
    except RuntimeError:  # the backend has started: its device count is fixed for this process
        try:
            have = len(jax.devices("cpu"))
        except RuntimeError:  # no CPU backend (JAX_PLATFORMS excludes it): nothing to simulate
            return
        if have < n:
            raise RuntimeError(
                f"cannot simulate {n} CPU devices: JAX's backend already started with {have}; call "
                f"funcnet.parallel.simulate_cpu_devices({n}) right after `import jax`, before any array "
                f"is created, or set XLA_FLAGS={_HOST_COUNT_FLAG}={n} before starting Python") from None


def _too_many(n: int, available: list) -> str:
    platform = available[0].platform if available else jax.default_backend()
    msg = f"asked for {n} devices but only {len(available)} {platform} device(s) exist"
    if platform == "cpu":
        return (msg + f"; simulate more CPU devices before JAX starts: `funcnet train --devices {n}`, "
                f"XLA_FLAGS={_HOST_COUNT_FLAG}={n}, or funcnet.parallel.simulate_cpu_devices({n}) "
                f"(jax.config.update('jax_num_cpu_devices', {n})) right after `import jax`")
    return msg + f"; use at most {len(available)} devices"


def data_mesh(n: int | None = None, *, axis_name: str = "data") -> Mesh:
    """A 1-D ``Mesh`` of the first ``n`` devices (all processes' devices; default: all).

    Devices are ordered by process, so each process's devices hold one contiguous block of
    the global batch (the block ``process_slice`` gives it).
    """
    available = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    n = len(available) if n is None else _count(n, "the number of devices")
    if n > len(available):
        raise ValueError(_too_many(n, available))
    return jax.make_mesh((n,), (axis_name,), axis_types=(AxisType.Auto,), devices=available[:n])


def _local_devices(n: int | None) -> list:
    local = jax.local_devices()
    n = len(local) if n is None else _count(n, "the number of devices")
    if n > len(local):
        raise ValueError(_too_many(n, local))
    return local[:n]


def replicate(tree: Any, devices=None, *, axis_name: str = "data") -> Any:
    """One copy of every leaf per local device, stacked on a new leading axis (for ``pmap``).

    ``devices``: a list of devices, or None for all local devices. Leaf ``(...)`` becomes
    ``(len(devices), ...)``, copy ``i`` on device ``i``; each device receives the value once.
    ``axis_name`` should be the pmap's: pmap lays its outputs out over a mesh axis of that
    name, and an input laid out under another name makes the second step compile again.
    """
    devices = list(jax.local_devices() if devices is None else devices)
    mesh = Mesh(np.array(devices), (axis_name,))
    copies, stacked = NamedSharding(mesh, P()), NamedSharding(mesh, P(axis_name))

    def one(x):
        x = jax.device_put(x, copies)
        return jax.make_array_from_single_device_arrays(
            (len(devices),) + x.shape, stacked, [s.data[None] for s in x.addressable_shards])

    return jax.tree.map(one, tree)


def unreplicate(tree: Any) -> Any:
    """The first local copy of a ``replicate``-d (or pmap-ed) tree: leaf ``(n, ...)`` -> ``(...)``."""
    return jax.tree.map(lambda x: x.addressable_shards[0].data[0] if isinstance(x, jax.Array) else x[0], tree)


def _batch_size(batch) -> int:
    sizes = {int(np.shape(x)[0]) if np.ndim(x) else None for x in jax.tree.leaves(batch)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"every array of a batch needs the same leading batch axis, got leading sizes "
                         f"{sorted(sizes, key=str)}; pass batch=(x, y) with x: (batch, ...), y: (batch,)")
    return sizes.pop()


def _check_divides(b: int, n: int, what: str) -> None:
    if b % n:
        lo, hi = b // n * n, (b // n + 1) * n
        example = f"{lo} or {hi}" if lo else f"{hi}"
        raise ValueError(f"a global batch of {b} examples does not split evenly over {n} {what} "
                         f"({b} % {n} = {b % n}); use a batch size that is a multiple of {n} (e.g. {example})")


def shard(batch: Any, n: int | None = None, *, axis_name: str = "data") -> Any:
    """Split the leading batch axis over the first ``n`` local devices (default: all), for ``pmap``.

    Leaf ``(b, ...)`` becomes ``(n, b // n, ...)``, row block ``i`` on device ``i``.
    """
    devices = _local_devices(n)
    b = _batch_size(batch)
    _check_divides(b, len(devices), "devices")
    split = NamedSharding(Mesh(np.array(devices), (axis_name,)), P(axis_name))
    return jax.tree.map(lambda x: jax.device_put(jnp.reshape(x, (len(devices), -1) + np.shape(x)[1:]), split),
                        batch)


def _axis(mesh: Mesh) -> str:
    if len(mesh.axis_names) != 1:
        raise ValueError(f"data parallelism needs a 1-D mesh, got axes {mesh.axis_names}; use data_mesh(n)")
    return mesh.axis_names[0]


def make_shard_map_step(model, tx, loss_fn, mesh: Mesh, *, accum_steps: int = 1, donate: bool = True,
                        **step_options):
    """``step(state, (x, y)) -> (state, metrics)``: per-device code under ``jax.shard_map``.

    The state is replicated over ``mesh`` (``P()``), the batch split over its axis; each
    device differentiates its block and ``lax.pmean`` averages the gradients (DDP's
    all-reduce). The model's state stays replicated: device 0's buffers are kept after each
    step (torch DDP's ``broadcast_buffers=True``), or statistics are global with
    ``nn.SyncBatchNorm``. The state is donated. ``step.raw`` is the unjitted function.
    """
    axis = _axis(mesh)
    if step_options.get("buffers") == "local":
        raise ValueError("buffers='local' keeps one model state per device, which a replicated state under "
                         "shard_map cannot hold; use kind='pmap' (its state has a device axis) or "
                         "buffers='broadcast'")
    per_device = _step.make_step(model, tx, loss_fn, accum_steps=accum_steps, axis_name=axis,
                                  donate=False, **step_options).raw
    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(axis)), out_specs=(P(), P()))
    step = jax.jit(mapped, donate_argnums=(0,) if donate else ())
    step.raw = mapped
    return step


def make_sharded_step(model, tx, loss_fn, mesh: Mesh, *, accum_steps: int = 1, donate: bool = True,
                      **step_options):
    """``step(state, (x, y)) -> (state, metrics)``: the single-device step, jit-ed over ``mesh``.

    No collective is written: the batch is constrained to be split over the mesh axis and
    the state to be replicated, and XLA's partitioner inserts the all-reduce of the
    gradients. The code sees the global batch, so BatchNorm statistics are those of the
    global batch (torch's ``SyncBatchNorm``) and ``buffers`` does not apply. The state is
    donated. ``step.raw`` can be scanned (``run_epoch``).
    """
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P(_axis(mesh)))
    step_options.pop("buffers", None)
    global_step = _step.make_step(model, tx, loss_fn, accum_steps=accum_steps, donate=False,
                                   **step_options).raw

    def raw(state, batch):
        state = jax.lax.with_sharding_constraint(state, replicated)
        new_state, metrics = global_step(state, jax.lax.with_sharding_constraint(batch, split))
        return jax.lax.with_sharding_constraint((new_state, metrics), replicated)

    step = jax.jit(raw, out_shardings=replicated, donate_argnums=(0,) if donate else ())
    step.raw = raw
    return step


class DataParallel(NamedTuple):
    """A data-parallel step and the placement it expects.

    ``step(put_state(state), put_batch(batch))`` runs one update on ``n_devices`` devices
    (all processes together); ``get`` turns a placed, replicated tree (the state, the
    metrics) back into one local copy. ``put_state`` may reuse its input's buffers and the
    step donates the state: keep no other reference to what you pass in.
    """

    kind: str
    n_devices: int
    step: Callable
    put_state: Callable
    put_batch: Callable
    get: Callable


def data_parallel(model, tx, loss_fn=_losses.cross_entropy, *, kind: str = "shard_map",
                  devices: int | None = None, accum_steps: int = 1, donate: bool = True,
                  **step_options) -> DataParallel:
    """A ``DataParallel`` of ``kind`` (``"pmap"``, ``"shard_map"`` or ``"sharding"``).

    ``devices``: how many devices (default: all). ``"pmap"`` counts the devices of this
    process; the mesh forms count all processes' devices. ``step_options`` go to
    ``train.make_step`` (``policy``, ``metrics``, ``buffers``).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown data-parallel kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "pmap":
        local = _local_devices(devices)
        n = len(local) * jax.process_count()
        if jax.process_count() > 1 and len(local) != jax.local_device_count():
            raise ValueError(f"pmap over several processes uses every local device ({jax.local_device_count()}),"
                             f" got devices={devices}; leave devices out or use kind='shard_map'")
        step = _step.make_step(model, tx, loss_fn, accum_steps=accum_steps, axis_name="data", donate=donate,
                                **step_options)

        def put_batch(batch):
            _check_divides(_batch_size(batch), n, "devices")
            return shard(process_slice(batch), len(local))

        return DataParallel(kind, n, step, lambda t: replicate(t, local), put_batch, unreplicate)

    mesh = data_mesh(devices)
    n = mesh.devices.size
    make = make_shard_map_step if kind == "shard_map" else make_sharded_step
    step = make(model, tx, loss_fn, mesh, accum_steps=accum_steps, donate=donate, **step_options)
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P(_axis(mesh)))

    def put_batch(batch):
        b = _batch_size(batch)
        _check_divides(b, n, "devices")
        if split.is_fully_addressable:
            return jax.device_put(batch, split)
        return jax.tree.map(lambda local, x: jax.make_array_from_process_local_data(
            split, np.asarray(local), np.shape(x)), process_slice(batch), batch)

    def get(tree):
        return jax.tree.map(lambda a: a.addressable_data(0) if isinstance(a, jax.Array) else a, tree)

    return DataParallel(kind, n, step, lambda t: _put_replicated(t, replicated), put_batch, get)


def _put_replicated(tree, sharding: NamedSharding):
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)

    # Over several processes each one contributes its (identical) copy of the value.
    def one(x):
        if jnp.issubdtype(jnp.result_type(x), jax.dtypes.prng_key):
            return jax.random.wrap_key_data(one(jax.random.key_data(x)), impl=jax.random.key_impl(x))
        return jax.make_array_from_process_local_data(sharding, np.asarray(x), np.shape(x))

    return jax.tree.map(one, tree)


def check_batch_size(batch_size: int, dp: DataParallel) -> None:
    """Raise a clear error unless ``batch_size`` splits evenly over ``dp``'s devices."""
    _check_divides(batch_size, dp.n_devices, "devices")


def steps_between(dp: DataParallel, state, indices, lo: int, hi: int, *, x, y):
    """Steps ``lo..hi-1`` of an epoch whose batches are ``x[indices[i]]``; ``(state, metrics)``
    with per-step metrics as host arrays. ``state`` is placed (``dp.put_state``)."""
    history = []
    for i in range(lo, hi):
        state, metrics = dp.step(state, dp.put_batch((x[indices[i]], y[indices[i]])))
        if history:
            # At most two steps in flight: the host stays a step ahead, and XLA's CPU runtime
            # can deadlock in the all-reduce with a few dozen collective steps queued on
            # simulated devices.
            jax.block_until_ready(history[-1])
        history.append(dp.get(metrics))
    return state, jax.tree.map(lambda *m: np.asarray(jnp.stack(m)), *history)


def run_epoch(dp: DataParallel, state, x, y, *, batch_size: int):
    """One shuffled epoch of ``dp.step``; ``(state, metrics)``, metrics of shape ``(steps,)``.

    ``state`` is placed (``dp.put_state``). The shuffle and the keys follow
    ``train.run_epoch`` exactly (the same epoch code as ``fit``'s), so a run equals the
    single-device run of the same seed.
    """
    batch_size = _data.check_batch_size(batch_size, len(x))
    check_batch_size(batch_size, dp)
    x, y = np.asarray(x), np.asarray(y)

    def run_steps(state, indices, lo, hi):
        return steps_between(dp, state, indices, lo, hi, x=x, y=y)

    return _run_epoch_in_parts(run_steps, state, len(x), batch_size, _step.Position(), None, None, dp.get,
                               dp.put_state)


class Cluster(NamedTuple):
    """Where this process sits among the ``jax.distributed`` processes (torch's ``get_rank()``,
    ``get_world_size()``), and how many devices it and all of them hold."""

    process_id: int
    num_processes: int
    local_devices: int
    devices: int


def _setting(value, env: str, flag: str, cast=str):
    if value is None:
        value = os.environ.get(env)
        if value is None:
            raise ValueError(f"initialize: {flag} is not set; pass {flag}=... or set {env}")
        try:
            value = cast(value)
        except ValueError:
            raise ValueError(f"initialize: {env}={os.environ[env]!r} is not a valid {flag}") from None
    return value


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, initialization_timeout: int = 120,
               heartbeat_timeout: int = 30, shutdown_timeout: int = 30) -> Cluster:
    """Join a run of several processes (``jax.distributed.initialize``); call before any JAX work.

    Arguments left out are read from FUNCNET_COORDINATOR ("host:port" of process 0),
    FUNCNET_NUM_PROCESSES and FUNCNET_PROCESS_ID. If the others do not all join within
    ``initialization_timeout`` seconds, the process ends with exit status 2 and one line on
    stderr naming the coordinator, the count and the fix (JAX's runtime would abort it a
    little later with a stack trace; a failed join cannot be undone in a live process). A
    peer that stops answering for ``heartbeat_timeout`` seconds mid-run makes JAX's runtime
    stop this process with an error naming the cause.
    CPU collectives go through gloo. torch counterpart: ``dist.init_process_group``.
    """
    address = _setting(coordinator_address, "FUNCNET_COORDINATOR", "coordinator_address")
    count = _setting(num_processes, "FUNCNET_NUM_PROCESSES", "num_processes", int)
    rank = _setting(process_id, "FUNCNET_PROCESS_ID", "process_id", int)
    count = _count(count, "num_processes")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < count:
        raise ValueError(f"process_id must be in 0..{count - 1} for num_processes={count}, got {rank!r}")
    if not re.fullmatch(r"\[?[\w.:-]+\]?:\d+", str(address)):
        raise ValueError(f"coordinator_address must be 'host:port' of process 0, got {address!r}")
    for name, seconds in (("initialization_timeout", initialization_timeout),
                          ("heartbeat_timeout", heartbeat_timeout), ("shutdown_timeout", shutdown_timeout)):
        _count(seconds, name)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import sys
    import threading

    joined = threading.Event()

    def never_joined():  # before JAX's own deadline, which aborts the process with a C++ stack trace
        if not joined.is_set():
            sys.stderr.write(f"initialize: process {rank} waited {initialization_timeout} s for all {count} processes "
                             f"at the coordinator {address} and they did not all join; start every process "
                             f"(process_id 0..{count - 1}) with the same coordinator_address and num_processes, "
                             f"process 0 first, or raise initialization_timeout\n")
            sys.stderr.flush()
            os._exit(2)

    watchdog = threading.Timer(initialization_timeout, never_joined)
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(address, count, int(rank), initialization_timeout=initialization_timeout + 30,
                                   heartbeat_timeout_seconds=heartbeat_timeout,
                                   shutdown_timeout_seconds=shutdown_timeout)
    finally:
        joined.set()
        watchdog.cancel()
    if jax.process_count() != count:
        raise RuntimeError(f"process {rank} was started with num_processes={count} but the coordinator at "
                           f"{address} runs {jax.process_count()} processes; start every process with the "
                           f"same num_processes")
    return Cluster(jax.process_index(), count, jax.local_device_count(), jax.device_count())


def process_slice(batch: Any, *, process_id: int | None = None, num_processes: int | None = None) -> Any:
    """This process's contiguous block of a global batch: rows ``[i*b/p, (i+1)*b/p)``.

    Single process: the batch itself. torch counterpart: ``DistributedSampler``'s share.
    """
    rank = jax.process_index() if process_id is None else process_id
    count = jax.process_count() if num_processes is None else num_processes
    if count == 1:
        return batch
    b = _batch_size(batch)
    _check_divides(b, count, "processes")
    per = b // count
    return jax.tree.map(lambda x: x[rank * per:(rank + 1) * per], batch)
