"""ZeRO stages 1 and 2: the optimizer state, then the gradients, sharded over the data axis.

torch counterparts: ``torch.distributed.optim.ZeroRedundancyOptimizer`` (stage 1: DDP
all-reduces whole gradients, each rank keeps and updates 1/N of the optimizer state, then
the updated parameters are broadcast) and FSDP2 ``fully_shard(model,
reshard_after_forward=False)`` (close to stage 2: gradients reduce-scattered, each rank
updates its shard; FSDP2 also keeps the parameters sharded between steps, which stage 2
does not). Both keep every parameter whole on every device for the forward and backward.

Here, as in ``funcnet.parallel.fsdp``, nothing is written by hand: the state is placed with
``NamedSharding``s on a 1-D data mesh (params replicated, each optimizer-state array split
along one axis by ``fsdp.param_spec``), the step is ``jax.jit``-ed with those shardings and
XLA's SPMD partitioner inserts the collectives:

- stage 1 (``fsdp.make_fsdp_step(zero=1)``): the gradients are all-reduced whole, each
  device updates its slice of the state and params, the params are all-gathered back;
- stage 2: the same, plus a sharding constraint on the gradients as the optimizer receives
  them (``shard_gradients``, an optax wrapper), so each device only gets its slice of the
  summed gradient: the partitioner reduce-scatters (or all-reduces and slices, as XLA:CPU
  does) and no whole summed gradient is kept for the update.

- ``make_zero_step(model, tx, loss_fn, mesh, stage=1|2, state=...)``: the step, with
  ``.shardings`` and ``.batch_sharding`` as ``fsdp.make_fsdp_step``'s.
- ``shard_gradients(tx, shardings)``: ``tx`` whose ``update`` first constrains the
  gradients to ``shardings``.

The bytes each stage saves per device are ``funcnet.memory.zero_per_device``'s (the ZeRO
paper's accounting); the compiled step's are ``fsdp.per_device_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import Mesh

from funcnet import losses as _losses
from funcnet.parallel import fsdp as _fsdp

__all__ = ["STAGES", "make_zero_step", "shard_gradients"]

STAGES = (1, 2)


def shard_gradients(tx: optax.GradientTransformation, shardings: Any) -> optax.GradientTransformation:
    """``tx`` whose ``update`` receives the gradients constrained to ``shardings`` (a tree of
    ``NamedSharding`` with the params' structure): inside a jit over a mesh the partitioner then
    reduces them straight into each device's slice (ZeRO-2) instead of a whole copy per device."""

    def update(grads, state, params=None):
        return tx.update(jax.lax.with_sharding_constraint(grads, shardings), state, params)

    return optax.GradientTransformation(tx.init, update)


def make_zero_step(model, tx: optax.GradientTransformation, loss_fn: Callable = _losses.cross_entropy,
                   mesh: Mesh | None = None, *, stage: int = 1, state: Any = None, donate: bool = True,
                   min_size: int = _fsdp.MIN_SIZE, **step_options):
    """``step(state, (x, y)) -> (state, metrics)`` with ZeRO ``stage`` (1 or 2) over the 1-D ``mesh``
    (default: every device): params replicated, optimizer state (and for 2 the gradients) split.

    ``state``: a ``TrainState`` or its ``jax.eval_shape``, to read the shapes from. The state
    ``tx`` builds is the same for both stages, so a state made with ``tx`` runs under either.
    """
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"make_zero_step: stage must be 1 (optimizer state sharded) or 2 (and the gradients), "
                         f"got {stage!r}; ZeRO-3 (params too) is fsdp.make_fsdp_step(zero=3)")
    if state is None:
        raise ValueError("make_zero_step needs state= (a TrainState or jax.eval_shape of one) to shard")
    if mesh is None:
        mesh = _fsdp.mesh()
    if stage == 2:
        grads = _fsdp.tree_shardings(state.params, mesh, min_size=min_size)
        tx = shard_gradients(tx, grads)
    step = _fsdp.make_fsdp_step(model, tx, loss_fn, mesh, zero=1, state=state, donate=donate, min_size=min_size,
                                **step_options)
    step.stage = stage
    return step

