"""Training memory: what a step keeps resident, estimated and measured.

A training step holds four things: the parameters, their gradients, the
optimizer state, and the activations the backward pass keeps. ``estimate``
counts them in closed form from a parameter count, ``plan`` per device under a
parallel layout (data x FSDP x tensor parallel), ``zero_per_device`` per device under a
ZeRO stage, ``estimate_tree`` from a real params pytree and optax transformation, and
``measure`` reads XLA's buffer
assignment of a compiled function, so the figure is known before anything runs.

torch counterpart: ``torch.cuda.max_memory_allocated()`` after a step (read at run
time); here the compiler reports it ahead of time, on any backend, CPU included.

Sizes are bytes (int). GB in the table is 10**9 bytes, as in "7B params x 4 bytes = 28 GB".

Examples:
    >>> from funcnet import memory
    >>> memory.parse_count("7B"), memory.OPTIMIZER_SLOTS["adam"]  # Adam keeps two values per parameter
    (7000000000, 2)
"""

from funcnet.memory.estimate import (
                                     OPTIMIZER_SLOTS,
                                     PRECISIONS,
                                     Estimate,
                                     dtype_bytes,
                                     estimate,
                                     mlp_activations,
                                     mlp_params,
                                     parse_count,
                                     zero_per_device,
)
from funcnet.memory.layout import Layout, Plan, Shape, plan
from funcnet.memory.measure import (
                                     Measured,
                                     compile_to_read,
                                     estimate_tree,
                                     format_table,
                                     measure,
                                     tree_bytes,
)
from funcnet.memory.transformer import (
                                     RECOMPUTE,
                                     transformer_activations,
                                     transformer_params,
)

__all__ = [
    "Estimate", "Measured", "OPTIMIZER_SLOTS", "PRECISIONS", "parse_count", "dtype_bytes", "tree_bytes",
    "mlp_params", "mlp_activations", "transformer_params", "transformer_activations", "RECOMPUTE",
    "estimate", "estimate_tree", "measure", "compile_to_read", "format_table", "Shape", "Layout", "Plan", "plan",
    "zero_per_device",
]  # fmt: skip
