"""Embedding, as torch.nn's: a lookup table of rows indexed by integers.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> emb = nn.Embedding(10, 4)
    >>> emb.apply(emb.init(jax.random.key(0)), jnp.array([[1, 2, 3]])).shape
    (1, 3, 4)
"""

from __future__ import annotations

import numbers

import jax.numpy as jnp

from funcnet import init as _init
from funcnet.nn.functional._common import float_dtype
from funcnet.nn.functional.misc import embedding_
from funcnet.nn.module import Module, check_params

__all__ = ["Embedding"]


def Embedding(num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
              max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
              sparse: bool = False, dtype=None) -> Module:
    """``weight[indices]`` (torch.nn.Embedding): indices ``(*)`` int -> ``(*, embedding_dim)``.

    params: ``{"weight": (num_embeddings, embedding_dim)}``, N(0, 1) at init as torch's
    ``reset_parameters``; ``dtype`` defaults to JAX's default float (float64 under x64).
    The lookup is ``funcnet.nn.functional.embedding``.

    ``padding_idx`` (negative counts from the end, as torch): that row is zero at init and
    gets no gradient, so it stays at whatever value it has (torch's behaviour); its
    output is the row's value.

    Out-of-range indices (outside ``[0, num_embeddings)``; torch raises an IndexError,
    and negative indices are not wrapped): when the indices are concrete (eager calls)
    this raises a ValueError naming them. Under ``jit``/``vmap`` nothing can raise, so
    their rows come out as NaN: the NaN reaches the loss and the training loop's
    non-finite check, where clamping (XLA's default for gathers) would return a real
    row and hide the bug.

    Not supported, refused at build time: ``max_norm`` (torch renormalizes rows of the
    weight in place during the forward, a hidden parameter update), ``scale_grad_by_freq``
    and ``sparse`` (JAX gradients are dense; ``sparse=False`` gives the same values).
    """
    where = f"Embedding({num_embeddings}, {embedding_dim})"
    for what, value in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}: {what} must be a positive int, got {value!r}")
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
            raise TypeError(f"{where}: padding_idx must be an int or None, got {padding_idx!r}")
        if not -num_embeddings <= padding_idx < num_embeddings:
            raise ValueError(f"{where}: padding_idx={padding_idx} must be within [{-num_embeddings}, "
                             f"{num_embeddings - 1}] (negative counts from the end)")
        padding_idx = padding_idx % num_embeddings  # torch stores the non-negative index
    if max_norm is not None:
        raise ValueError(
            f"{where}: max_norm={max_norm!r} is not supported: torch renormalizes the looked-up rows of "
            f"the weight in place during the forward, a parameter update a pure function cannot make; "
            f"pass max_norm=None and, if you need it, rescale the rows of params['weight'] in the "
            f"training step yourself")
    if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real):
        raise TypeError(f"{where}: norm_type must be a real number, got {norm_type!r}")
    if scale_grad_by_freq is not False:
        raise ValueError(f"{where}: scale_grad_by_freq={scale_grad_by_freq!r} is not supported; pass "
                         f"scale_grad_by_freq=False")
    if sparse is not False:
        raise ValueError(f"{where}: sparse={sparse!r} is not supported (JAX gradients are dense); pass "
                         f"sparse=False, which gives the same gradient values as a dense tensor")
    if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{where}: dtype must be a floating type, got {dtype!r}")

    def init_fn(key):
        weight = _init.normal(key, (num_embeddings, embedding_dim), float_dtype(dtype))
        if padding_idx is not None:
            weight = weight.at[padding_idx].set(0)
        return {"weight": weight}

    def apply(params, indices, *, key=None, train=False):
        del key, train
        check_params(params, {"weight"}, where)
        weight = params["weight"]
        if tuple(jnp.shape(weight)) != (num_embeddings, embedding_dim):
            raise ValueError(f"{where}: params['weight'] has shape {tuple(jnp.shape(weight))}, expected "
                             f"{(num_embeddings, embedding_dim)}; pass this layer's params")
        return embedding_(indices, weight, padding_idx, where)

    extra = f", padding_idx={padding_idx}" if padding_idx is not None else ""
    extra += f", norm_type={norm_type}" if norm_type != 2 else ""
    return Module(init_fn, apply, name=f"Embedding({num_embeddings}, {embedding_dim}{extra})")
