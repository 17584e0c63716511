"""The op table of ``interop.convert``: each torch function, Tensor method and attribute read
that a model's forward calls, as a JAX function with torch's signature and semantics, and
the Python source that writes the call the way a person writes JAX.

- ``OPS[name] -> Op(fn, source, random, mutates)`` by canonical name: ``"F.relu"``
  (torch.nn.functional), ``"torch.cat"``, ``"Tensor.view"``, ``"Tensor.shape"`` (an attribute);
- ``canonical(func)``: the canonical name of what ``TorchFunctionMode.__torch_function__``
  receives as ``func``;
- ``lookup(name)``: ``OPS[name]``, an in-place method (``Tensor.add_``, ``Tensor.__iadd__``)
  falling back to its functional form;
- ``mutated_places(op, args, kwargs)``: where the arguments of ``op.mutates`` are in a call
  (a position, or a keyword name);
- ``REFUSED``: the data-dependent ops (nonzero, boolean masks, ``item``) that JAX cannot
  trace, each with the reason and the jittable alternative.

Every function here is also ``ops.<name>``, the name the generated source calls where no
one-liner of jnp or F is faithful.
"""

from __future__ import annotations

from funcnet.interop.ops import arith as _arith, factory as _factory, functional as _functional
from funcnet.interop.ops import indexing as _indexing, random as _random, reduce as _reduce, shape as _shape
from funcnet.interop.ops import vision as _vision
from funcnet.interop.ops._core import DEFAULT_FLOAT, OPS, Op, mutated_places, result_type
from funcnet.interop.ops.arith import *  # noqa: F401,F403
from funcnet.interop.ops.factory import *  # noqa: F401,F403
from funcnet.interop.ops.functional import *  # noqa: F401,F403
from funcnet.interop.ops.indexing import *  # noqa: F401,F403
from funcnet.interop.ops.names import REFUSED, canonical, lookup
from funcnet.interop.ops.random import *  # noqa: F401,F403
from funcnet.interop.ops.reduce import *  # noqa: F401,F403
from funcnet.interop.ops.shape import *  # noqa: F401,F403
from funcnet.interop.ops.vision import *  # noqa: F401,F403

__all__ = (["Op", "OPS", "REFUSED", "canonical", "lookup", "mutated_places", "result_type", "DEFAULT_FLOAT"]
           + [n for family in (_arith, _factory, _functional, _indexing, _random, _reduce, _shape, _vision) for n in family.__all__])
