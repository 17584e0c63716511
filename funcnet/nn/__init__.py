"""Layers as pure functions with torch's names, signatures, layouts and defaults.

One file per layer family; the contract (``Module``, state, ``call``) is in
``funcnet.nn.module``, composites and containers in ``funcnet.nn.containers``.
See docs/design.md.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> model = nn.MLP([4, 8, 3])
    >>> model.apply(model.init(jax.random.key(0)), jnp.ones((2, 4))).shape
    (2, 3)
"""

from funcnet.nn import activation, attention, containers, conv, dropout, embedding, linear, module, norm, pooling
from funcnet.nn import recurrent, transformer
from funcnet.nn import functional, instancenorm, padding, pooling_extra, resample  # noqa: F401  (functional: torch.nn.functional)
from funcnet.nn.activation import *  # noqa: F401,F403
from funcnet.nn.attention import *  # noqa: F401,F403
from funcnet.nn.containers import *  # noqa: F401,F403
from funcnet.nn.conv import *  # noqa: F401,F403
from funcnet.nn.dropout import *  # noqa: F401,F403
from funcnet.nn.embedding import *  # noqa: F401,F403
from funcnet.nn.linear import *  # noqa: F401,F403
from funcnet.nn.module import *  # noqa: F401,F403
from funcnet.nn.norm import *  # noqa: F401,F403
from funcnet.nn.pooling import *  # noqa: F401,F403
from funcnet.nn.recurrent import *  # noqa: F401,F403
from funcnet.nn.transformer import *  # noqa: F401,F403
from funcnet.nn.instancenorm import *  # noqa: F401,F403
from funcnet.nn.padding import *  # noqa: F401,F403
from funcnet.nn.pooling_extra import *  # noqa: F401,F403
from funcnet.nn.resample import *  # noqa: F401,F403

__all__ = [name for family in (module, containers, linear, activation, dropout, conv, pooling, norm, embedding,
                               attention, recurrent, transformer, resample, padding, instancenorm,
                               pooling_extra) for name in family.__all__]
