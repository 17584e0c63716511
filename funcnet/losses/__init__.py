"""Losses with torch.nn.functional's names, defaults and reductions, on top of optax.

Every loss takes ``reduction="mean" | "sum" | "none"`` (keyword-only here; torch's
deprecated ``size_average``/``reduce`` are not taken; ``funcnet.nn.functional`` has the
same losses with torch's exact signatures, where they are refused by name). The class
axis of the classification losses is the **last** by default here (``class_axis=-1``,
a GPT's ``(B, T, V)``); ``funcnet.nn.functional.cross_entropy`` uses torch's axis 1.
See ``funcnet.losses.core`` for the details of the class axis and of out-of-range labels.

Examples:
    >>> import jax.numpy as jnp
    >>> from funcnet import losses
    >>> logits = jnp.array([[2.0, 0.0], [0.0, 2.0]])
    >>> round(float(losses.cross_entropy(logits, jnp.array([0, 1]))), 4)  # log(1 + e^-2)
    0.1269
"""

from funcnet.losses import core, pointwise, ranking, sequence
from funcnet.losses.core import *  # noqa: F401,F403
from funcnet.losses.core import _check_reduction, _reduce  # noqa: F401
from funcnet.losses.pointwise import *  # noqa: F401,F403
from funcnet.losses.ranking import *  # noqa: F401,F403
from funcnet.losses.sequence import *  # noqa: F401,F403

__all__ = [name for family in (core, pointwise, ranking, sequence) for name in family.__all__]
