"""Parallel training, a module per strategy, each opening with its torch counterpart.

- ``data``: data parallelism (torch ``DistributedDataParallel``): pmap, shard_map and
  sharding forms of the same all-reduced step, several processes. Its public names are
  re-exported here (``funcnet.parallel.data_parallel``, ``funcnet.parallel.replicate``, ...).
- ``zero``: ZeRO-1/2 (torch ``ZeroRedundancyOptimizer``, FSDP2 without resharding).
- ``fsdp``: ZeRO-3 (torch ``FullyShardedDataParallel`` / FSDP2 ``fully_shard``).
- ``tensor``: tensor parallelism by a plan for any model, Megatron's for the GPT (torch
  ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel``).
- ``pipeline``: GPipe and 1F1B over a ``pipe`` axis (torch ``torch.distributed.pipelining``).
- ``stages``: any model cut into pipeline stages at named modules (torch ``pipeline(module,
  split_spec=...)``), run by ``pipeline``'s schedules.
- ``mesh``: one ``(data, fsdp, model, pipe)`` mesh combining them, and the pipelined GPT step on
  it (torch ``init_device_mesh`` with a dimension per strategy, as torchtitan composes them).
- ``strategy``: ``fit(strategy=...)``: one ``Runner`` per strategy (Lightning's
  ``Trainer(strategy=..., devices=...)``).
"""

from funcnet.parallel import data, fsdp, mesh, pipeline, stages, strategy, tensor, zero
from funcnet.parallel.data import *  # noqa: F403
from funcnet.parallel.data import __all__ as _data_all

__all__ = [*_data_all, "data", "fsdp", "zero", "tensor", "pipeline", "stages", "mesh", "strategy"]  # noqa: PLE0604
