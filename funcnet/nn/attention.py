"""Multi-head attention, as torch.nn.MultiheadAttention (its ``forward`` and
``F.multi_head_attention_forward``), with torch's parameter names and layout.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> mha = nn.MultiheadAttention(8, 2, batch_first=True)
    >>> x = jnp.ones((1, 5, 8))
    >>> out, weights = mha.apply(mha.init(jax.random.key(0)), x, x, x)
    >>> out.shape, weights.shape  # weights averaged over the heads, as torch's
    ((1, 5, 8), (1, 5, 5))
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from funcnet import init as _init
from funcnet.nn.functional._common import float_dtype
from funcnet.nn.functional.attention import attention
from funcnet.nn.module import Module, check_params, describe

__all__ = ["MultiheadAttention"]


def MultiheadAttention(
    embed_dim: int,
    num_heads: int,
    dropout: float = 0.0,
    bias: bool = True,
    add_bias_kv: bool = False,
    add_zero_attn: bool = False,
    kdim: int | None = None,
    vdim: int | None = None,
    batch_first: bool = False,
    *,
    dtype=None,
) -> Module:
    """softmax(q k^T / sqrt(head_dim) + mask) v over ``num_heads`` heads, then ``out_proj``
    (torch.nn.MultiheadAttention); the attention core is ``funcnet.nn.functional``'s, and the
    params' dtype defaults to JAX's default float (float64 under x64).

    params, in torch's order and layout (E = embed_dim):

    - ``in_proj_weight`` (3E, E), rows [W_q; W_k; W_v], when kdim == vdim == E; otherwise
      ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim), ``v_proj_weight`` (E, vdim);
    - ``in_proj_bias`` (3E,) when ``bias``; ``bias_k``, ``bias_v`` (1, 1, E) when ``add_bias_kv``;
    - ``out_proj``: ``{"weight": (E, E), "bias": (E,)}`` (state_dict ``out_proj.weight``/``.bias``).

    Init is torch's ``_reset_parameters``: xavier_uniform for the input projections, zeros for
    ``in_proj_bias`` and ``out_proj.bias``, Linear's default for ``out_proj.weight``,
    xavier_normal for ``bias_k``/``bias_v``.

    ``apply(params, query, key, value, *, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False, key=None, train=False)
    -> (attn_output, attn_weights or None)``. The three inputs are positional (the keyword
    ``key=`` is the PRNG key of attention dropout, needed when ``train`` and ``dropout > 0``):

    - query (L, N, E), key (S, N, kdim), value (S, N, vdim); (N, L, E) etc. with
      ``batch_first``; unbatched (L, E), (S, kdim), (S, vdim).
    - ``key_padding_mask`` (N, S) ((S,) unbatched); ``attn_mask`` (L, S) or (N*num_heads, L, S)
      ((num_heads, L, S) unbatched). Bool masks: True = not allowed; float masks are added to
      the scores.
    - output (L, N, E) (batch_first: (N, L, E)); weights (N, L, S) averaged over heads, or
      (N, num_heads, L, S) with ``average_attn_weights=False``; with ``add_bias_kv`` /
      ``add_zero_attn`` S counts the extra key(s), as in torch.

    As torch: ``is_causal=True`` needs ``attn_mask`` (it is a hint that the mask is causal);
    without weights and without ``key_padding_mask`` the causal mask replaces ``attn_mask``,
    otherwise ``attn_mask`` is used. A query row with every key masked gives NaN when
    ``need_weights`` (torch's explicit softmax) and a zero attention output without weights
    (torch's scaled_dot_product_attention).
    """
    for arg, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"MultiheadAttention: {arg} must be a positive int, got {value!r}")
    if embed_dim % num_heads:
        raise ValueError(f"MultiheadAttention: embed_dim={embed_dim} must be divisible by num_heads={num_heads} "
                         f"(each head gets embed_dim // num_heads features); pick num_heads among the divisors "
                         f"of {embed_dim}")
    if not 0.0 <= dropout <= 1.0:
        raise ValueError(f"MultiheadAttention: dropout is the drop probability of attention weights and must be "
                         f"in [0, 1], got {dropout!r}")
    for arg, value in (("kdim", kdim), ("vdim", vdim)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"MultiheadAttention: {arg} must be None (= embed_dim) or a positive int, got {value!r}")
    kdim = embed_dim if kdim is None else kdim
    vdim = embed_dim if vdim is None else vdim
    packed = kdim == embed_dim and vdim == embed_dim
    head_dim = embed_dim // num_heads
    E, H = embed_dim, num_heads

    def init(key):
        dtype_ = float_dtype(dtype)
        k_q, k_k, k_v, k_out, k_bk, k_bv = jax.random.split(key, 6)
        params = {}
        if packed:
            params["in_proj_weight"] = _init.xavier_uniform(k_q, (3 * E, E), dtype_)
        else:
            params["q_proj_weight"] = _init.xavier_uniform(k_q, (E, E), dtype_)
            params["k_proj_weight"] = _init.xavier_uniform(k_k, (E, kdim), dtype_)
            params["v_proj_weight"] = _init.xavier_uniform(k_v, (E, vdim), dtype_)
        if bias:
            params["in_proj_bias"] = jnp.zeros((3 * E,), dtype_)
        if add_bias_kv:
            params["bias_k"] = _init.xavier_normal(k_bk, (1, 1, E), dtype_)
            params["bias_v"] = _init.xavier_normal(k_bv, (1, 1, E), dtype_)
        params["out_proj"] = {"weight": _init.linear_weight(k_out, (E, E), dtype_)}
        if bias:
            params["out_proj"]["bias"] = jnp.zeros((E,), dtype_)
        return params

    expected = ({"in_proj_weight"} if packed else {"q_proj_weight", "k_proj_weight", "v_proj_weight"}) | \
        ({"in_proj_bias"} if bias else set()) | ({"bias_k", "bias_v"} if add_bias_kv else set()) | {"out_proj"}
    options = [f"embed_dim={E}", f"num_heads={H}"] + [
        f"{n}={v!r}" for n, v, d in (("dropout", dropout, 0.0), ("bias", bias, True),
                                     ("add_bias_kv", add_bias_kv, False), ("add_zero_attn", add_zero_attn, False),
                                     ("kdim", kdim, E), ("vdim", vdim, E), ("batch_first", batch_first, False))
        if v != d]
    name = f"MultiheadAttention({', '.join(options)})"

    def apply(params, query, key_input, value, /, *, key_padding_mask=None, need_weights=True, attn_mask=None,
              average_attn_weights=True, is_causal=False, key=None, train=False):
        check_params(params, expected, name)
        query, key_input, value = jnp.asarray(query), jnp.asarray(key_input), jnp.asarray(value)
        batched = _check_inputs(name, query, key_input, value, E, kdim, vdim)
        if not batched:
            query, key_input, value = query[:, None], key_input[:, None], value[:, None]
        elif batch_first:
            query, key_input, value = (x.swapaxes(0, 1) for x in (query, key_input, value))
        # from here on torch's layout: (L, N, E), (S, N, kdim), (S, N, vdim)
        L, N, _ = query.shape
        S = key_input.shape[0]
        if key_input.shape[1] != N:
            raise ValueError(f"{name}: query and key have different batch sizes, {N} and {key_input.shape[1]} "
                             f"(batch_first={batch_first}: the batch axis is {0 if batch_first else 1})")
        if key_padding_mask is not None:
            key_padding_mask = _as_bias(name, "key_padding_mask", key_padding_mask, (N, S) if batched else (S,),
                                        query.dtype, "N, S" if batched else "S")
            key_padding_mask = key_padding_mask.reshape(N, S)
        if is_causal and attn_mask is None:
            raise ValueError(
                f"{name}: is_causal=True needs attn_mask (as in torch, is_causal is a hint that attn_mask is the "
                f"causal mask); pass attn_mask=funcnet.nn.generate_square_subsequent_mask({L}), or drop is_causal")
        causal = bool(is_causal) and key_padding_mask is None and not need_weights
        if attn_mask is not None:
            shapes = ((L, S), ((N * H, L, S) if batched else (H, L, S)))
            attn_mask = _as_bias(name, "attn_mask", attn_mask, shapes, query.dtype,
                                 "L, S) or (N*num_heads, L, S" if batched else "L, S) or (num_heads, L, S")
            # (L, S) broadcasts over batch and heads; (N*H, L, S) is batch-major, head-minor, as torch
            attn_mask = attn_mask[None, None] if attn_mask.ndim == 2 else attn_mask.reshape(N, H, L, S)
            if causal:
                attn_mask = None  # torch hands is_causal to scaled_dot_product_attention instead of the mask

        if packed:
            w_q, w_k, w_v = jnp.split(params["in_proj_weight"], 3)
        else:
            w_q, w_k, w_v = params["q_proj_weight"], params["k_proj_weight"], params["v_proj_weight"]
        b_q, b_k, b_v = jnp.split(params["in_proj_bias"], 3) if bias else (0.0, 0.0, 0.0)
        q = query @ w_q.T + b_q
        k = key_input @ w_k.T + b_k
        v = value @ w_v.T + b_v
        if add_bias_kv:
            k = jnp.concatenate([k, jnp.broadcast_to(params["bias_k"], (1, N, E)).astype(k.dtype)])
            v = jnp.concatenate([v, jnp.broadcast_to(params["bias_v"], (1, N, E)).astype(v.dtype)])

        # (L, N, E) -> (N, H, L, head_dim)
        q = q.reshape(L, N, H, head_dim).transpose(1, 2, 0, 3)
        k = k.reshape(-1, N, H, head_dim).transpose(1, 2, 0, 3)
        v = v.reshape(-1, N, H, head_dim).transpose(1, 2, 0, 3)
        if add_zero_attn:
            k = jnp.concatenate([k, jnp.zeros((N, H, 1, head_dim), k.dtype)], axis=2)
            v = jnp.concatenate([v, jnp.zeros((N, H, 1, head_dim), v.dtype)], axis=2)
        src_len = k.shape[2]
        pad = src_len - S  # the added key columns (bias_k, zero attention): masked nowhere, as torch pads

        bias_mask = None
        if attn_mask is not None:
            bias_mask = jnp.pad(attn_mask, [(0, 0)] * 3 + [(0, pad)])
        if key_padding_mask is not None:
            padding = jnp.pad(key_padding_mask, [(0, 0), (0, pad)])[:, None, None, :]
            bias_mask = padding if bias_mask is None else bias_mask + padding
        if train and dropout > 0.0 and key is None:
            raise ValueError(f"{name} in train mode drops attention weights and needs a PRNG key: call "
                             f"apply(params, q, k, v, key=jax.random.key(seed), train=True) (the keyword key= "
                             f"is the PRNG key; the key sequence is the second positional input), or pass "
                             f"train=False")
        out, weights = attention(q, k, v, bias_mask, causal=causal, scale=math.sqrt(1.0 / head_dim),
                                 dropout_p=dropout if train else 0.0, key=key, need_weights=need_weights,
                                 where=name)  # (N, H, L, head_dim)
        out = out.transpose(2, 0, 1, 3).reshape(L, N, E)
        out = out @ params["out_proj"]["weight"].T
        if bias:
            out = out + params["out_proj"]["bias"]

        if not batched:
            out = out[:, 0]
        elif batch_first:
            out = out.swapaxes(0, 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(axis=1)
        if not batched:
            weights = weights[0]
        return out, weights

    # torch's repr is the tree of its one child, out_proj (messages above use the one-line name)
    tree = (f"MultiheadAttention(\n  (out_proj): NonDynamicallyQuantizableLinear(in_features={E}, out_features={E}, "
            f"bias={bias})\n)")
    return Module(init, apply, name=tree, batch_axis=0 if batch_first else 1)


def _check_inputs(name, query, key, value, embed_dim, kdim, vdim) -> bool:
    if query.ndim not in (2, 3):
        raise ValueError(f"{name}: query must be batched 3-D (L, N, E) ((N, L, E) with batch_first) or unbatched "
                         f"2-D (L, E), got {describe(query)}")
    if key.ndim != query.ndim or value.ndim != query.ndim:
        raise ValueError(f"{name}: for a {query.ndim}-D query, key and value must be {query.ndim}-D too, got key "
                         f"{describe(key)} and value {describe(value)}")
    for what, x, dim, hint in (("query", query, embed_dim, "embed_dim"), ("key", key, kdim, "kdim"),
                               ("value", value, vdim, "vdim")):
        if x.shape[-1] != dim:
            raise ValueError(f"{name}: {what} of shape {tuple(x.shape)} has {x.shape[-1]} features in its last axis, "
                             f"expected {hint}={dim}")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(f"{name}: key {tuple(key.shape)} and value {tuple(value.shape)} must agree on every axis "
                         f"but the last (the sequence and batch axes)")
    for x in (query, key, value):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name}: inputs must be floating point, got {describe(x)}")
    return query.ndim == 3


def _as_bias(name, what, mask, shapes, dtype, expected_text):
    """A bool (True = masked) or float (added) mask as a float bias of ``dtype``; checks its shape."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_ and not jnp.issubdtype(mask.dtype, jnp.floating):
        raise TypeError(f"{name}: {what} must be bool (True = not allowed to attend) or floating (added to the "
                        f"scores), got {describe(mask)}; convert it with mask.astype(bool)")
    shapes = shapes if isinstance(shapes[0], tuple) else (shapes,)
    if tuple(mask.shape) not in shapes:
        raise ValueError(f"{name}: {what} has shape {tuple(mask.shape)}, expected ({expected_text}) = "
                         f"{' or '.join(map(str, shapes))} for these inputs")
    if mask.dtype == jnp.bool_:
        return jnp.where(mask, -jnp.inf, 0.0).astype(dtype)
    return mask.astype(dtype)
