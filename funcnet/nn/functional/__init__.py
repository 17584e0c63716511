"""torch.nn.functional's names and signatures, as pure JAX functions:
``from funcnet.nn import functional as F``.

One implementation each: the layers of ``funcnet.nn`` call these, so a port of an upstream
``forward`` that uses ``F.*`` reads the same. Differences from torch, where JAX cannot do
what torch does:

- randomness takes a PRNG key: ``F.dropout(x, p, training=True, key=k)``; and in
  ``scaled_dot_product_attention`` the keyword ``key=`` is that PRNG key, the key *tensor*
  the second positional input;
- ``batch_norm`` and ``instance_norm`` in training mode with running statistics return the
  new running statistics beside the output instead of mutating them;
- ``cross_entropy``/``nll_loss`` take the classes on axis 1 as torch (``funcnet.losses``
  defaults to the last axis);
- options that mutate or that JAX cannot express are refused by name: ``inplace`` is
  accepted and ignored, ``out=``, ``size_average``/``reduce``, embedding's ``max_norm``,
  ``scale_grad_by_freq`` and ``sparse``.
"""

from funcnet.nn.functional import activation as _activation, attention as _attention, conv as _conv
from funcnet.nn.functional import instance_norm as _instance_norm, padding as _padding
from funcnet.nn.functional import linear as _linear, loss as _loss, misc as _misc, norm as _norm
from funcnet.nn.functional import pooling as _pooling, pooling_extra as _pooling_extra, resample as _resample
from funcnet.nn.functional.activation import *  # noqa: F401,F403
from funcnet.nn.functional.attention import *  # noqa: F401,F403
from funcnet.nn.functional.conv import *  # noqa: F401,F403
from funcnet.nn.functional.instance_norm import *  # noqa: F401,F403
from funcnet.nn.functional.linear import *  # noqa: F401,F403
from funcnet.nn.functional.loss import *  # noqa: F401,F403
from funcnet.nn.functional.misc import *  # noqa: F401,F403
from funcnet.nn.functional.norm import *  # noqa: F401,F403
from funcnet.nn.functional.padding import *  # noqa: F401,F403
from funcnet.nn.functional.pooling import *  # noqa: F401,F403
from funcnet.nn.functional.pooling_extra import *  # noqa: F401,F403
from funcnet.nn.functional.resample import *  # noqa: F401,F403

# (functions such as ``linear`` shadow the modules of that name, hence the aliases)
__all__ = [name for family in (_activation, _linear, _conv, _pooling, _pooling_extra, _norm, _instance_norm,
                               _attention, _misc, _padding, _resample, _loss)
           for name in family.__all__]
