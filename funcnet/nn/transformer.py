"""Transformer encoder blocks, as torch.nn.TransformerEncoderLayer / TransformerEncoder,
written as composites whose ``forward`` reads like torch's (children named as torch's
attributes, so state_dict keys are torch's).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
    >>> layer.apply(layer.init(jax.random.key(0)), jnp.ones((2, 5, 8))).shape
    (2, 5, 8)
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from funcnet.nn.attention import MultiheadAttention
from funcnet.nn.containers import Composite, ModuleList
from funcnet.nn.dropout import Dropout
from funcnet.nn.functional.activation import gelu
from funcnet.nn.linear import Linear
from funcnet.nn.module import Module, describe
from funcnet.nn.norm import LayerNorm

__all__ = ["TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer", "TransformerDecoder",
           "Transformer", "generate_square_subsequent_mask"]


def generate_square_subsequent_mask(sz: int, dtype=jnp.float32) -> jax.Array:
    """The (sz, sz) causal float mask: 0 on and below the diagonal, -inf above
    (torch.nn.Transformer.generate_square_subsequent_mask)."""
    if not isinstance(sz, int) or isinstance(sz, bool) or sz <= 0:
        raise ValueError(f"generate_square_subsequent_mask: sz must be a positive int (the sequence length), "
                         f"got {sz!r}")
    return jnp.triu(jnp.full((sz, sz), -jnp.inf, dtype), k=1)


def _activation(activation, where: str):
    """torch accepts the strings "relu" and "gelu" (exact) or any unary callable: a function of an
    array (``jax.nn.silu``, ``functools.partial(jax.nn.gelu, approximate=True)``) or a Module
    (``nn.GELU(approximate="tanh")``), which becomes the ``activation`` child as in torch."""
    if isinstance(activation, str):  # torch keeps F.relu / F.gelu, a function, not a child module
        if activation == "relu":
            return jax.nn.relu
        if activation == "gelu":
            return _exact_gelu
        raise ValueError(f"{where}: activation should be 'relu' or 'gelu' (or a callable), got {activation!r}; "
                         f"torch takes only these two strings: pass a function (jax.nn.silu, "
                         f"functools.partial(jax.nn.gelu, approximate=True)) or a module (nn.SiLU()) for others")
    if isinstance(activation, Module) or callable(activation):
        return activation
    raise TypeError(f"{where}: activation must be 'relu', 'gelu', a funcnet.nn.Module or a function of an array, "
                    f"got {describe(activation)}")


def TransformerEncoderLayer(
    d_model: int,
    nhead: int,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    activation: str | Callable | Module = "relu",
    layer_norm_eps: float = 1e-5,
    batch_first: bool = False,
    norm_first: bool = False,
    bias: bool = True,
    *,
    dtype=None,
) -> Module:
    """Self-attention then a feed-forward block, each with a residual and a LayerNorm
    (torch.nn.TransformerEncoderLayer; post-norm by default, pre-norm with ``norm_first``).

    Children (torch's names, so params and state_dict keys are torch's): ``self_attn``
    (MultiheadAttention(d_model, nhead, dropout, bias, batch_first)), ``linear1`` (d_model ->
    dim_feedforward), ``dropout``, ``linear2``, ``norm1``, ``norm2``, ``dropout1``, ``dropout2``
    (and ``activation`` when it is a Module; "relu"/"gelu" are the functions relu and exact erf
    GELU, as torch keeps F.relu / F.gelu, which are no children).

    ``apply(params, src, *, src_mask=None, src_key_padding_mask=None, is_causal=False,
    key=None, train=False)``: src (S, N, d_model) ((N, S, d_model) with ``batch_first``; (S,
    d_model) unbatched), same shape out; ``src_mask`` (S, S) or (N*nhead, S, S),
    ``src_key_padding_mask`` (N, S), bool (True = masked) or float (added), as
    MultiheadAttention's. ``train=True`` with ``dropout > 0`` needs ``key``.
    """
    where = "TransformerEncoderLayer"
    for arg, value in (("d_model", d_model), ("nhead", nhead), ("dim_feedforward", dim_feedforward)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{where}: {arg} must be a positive int, got {value!r}")
    act = _activation(activation, where)
    act_name = _activation_name(activation, act)
    children = dict(
        self_attn=MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, dtype=dtype),
        linear1=Linear(d_model, dim_feedforward, bias, dtype=dtype),
        dropout=Dropout(dropout),
        linear2=Linear(dim_feedforward, d_model, bias, dtype=dtype),
        norm1=LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype),
        norm2=LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype),
        dropout1=Dropout(dropout),
        dropout2=Dropout(dropout),
    )
    if isinstance(act, Module):
        children["activation"] = act

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        activation_fn = self.activation if isinstance(act, Module) else act

        def sa_block(x):
            x = self.self_attn(x, x, x, attn_mask=src_mask, key_padding_mask=src_key_padding_mask,
                               need_weights=False, is_causal=is_causal)[0]
            return self.dropout1(x)

        def ff_block(x):
            x = self.linear2(self.dropout(activation_fn(self.linear1(x))))
            return self.dropout2(x)

        # see Fig. 1 of https://arxiv.org/pdf/2002.04745v1.pdf (torch's comment)
        x = src
        if norm_first:
            x = x + sa_block(self.norm1(x))
            x = x + ff_block(self.norm2(x))
        else:
            x = self.norm1(x + sa_block(x))
            x = self.norm2(x + ff_block(x))
        return x

    name = (f"{where}(d_model={d_model}, nhead={nhead}, dim_feedforward={dim_feedforward}, dropout={dropout}, "
            f"activation={act_name}, layer_norm_eps={layer_norm_eps}, batch_first={batch_first}, "
            f"norm_first={norm_first}, bias={bias})")
    return Composite(_keyword_only(forward), name=name, batch_axis=0 if batch_first else 1, **children)


def _exact_gelu(x):
    return gelu(x)


def _activation_name(activation, act) -> str:
    if isinstance(activation, str):
        return activation
    return getattr(act, "name", getattr(act, "__name__", type(act).__name__))


def _keyword_only(forward):
    # torch's masks may be passed positionally; ours are keywords (apply's positional inputs are
    # the arrays a jitted step feeds), so a forward taking src alone positionally is exposed.
    def wrapped(self, src, *, src_mask=None, src_key_padding_mask=None, is_causal=False):
        return forward(self, src, src_mask, src_key_padding_mask, is_causal)

    wrapped.__qualname__ = forward.__qualname__
    return wrapped


def TransformerEncoder(encoder_layer: Module, num_layers: int, norm: Module | None = None,
                       enable_nested_tensor: bool = True, mask_check: bool = True) -> Module:
    """``num_layers`` copies of ``encoder_layer`` applied in turn, then ``norm`` if given
    (torch.nn.TransformerEncoder).

    Children ``layers`` (ModuleList "0".."num_layers-1") and ``norm``: state_dict keys
    ``layers.0.self_attn.in_proj_weight``, ..., ``norm.weight``, as torch. As torch (which
    deep-copies ``encoder_layer``), every layer starts from the same initial weights.
    ``apply(params, src, *, mask=None, src_key_padding_mask=None, is_causal=None, key=None,
    train=False)``. ``enable_nested_tensor`` and ``mask_check`` only steer torch's inference
    fast path and are accepted for compatibility (that path returns zeros at padded positions,
    which torch's regular path, and this one, do not). ``is_causal=None`` is False here: torch
    would detect a causal ``mask`` and use the causal mask instead, which gives the same result.
    """
    where = "TransformerEncoder"
    if not isinstance(encoder_layer, Module):
        raise TypeError(f"{where}: encoder_layer must be a funcnet.nn.Module (e.g. nn.TransformerEncoderLayer(...)), "
                        f"got {describe(encoder_layer)}")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers <= 0:
        raise ValueError(f"{where}: num_layers must be a positive int, got {num_layers!r}")
    if norm is not None and not isinstance(norm, Module):
        raise TypeError(f"{where}: norm must be None or a funcnet.nn.Module (e.g. nn.LayerNorm(d_model)), "
                        f"got {describe(norm)}")
    del enable_nested_tensor, mask_check

    def forward(self, src, *, mask=None, src_key_padding_mask=None, is_causal=None):
        output = src
        for mod in self.layers:
            output = mod(output, src_mask=mask, is_causal=bool(is_causal), src_key_padding_mask=src_key_padding_mask)
        if self.norm is not None:
            output = self.norm(output)
        return output

    model = Composite(forward, name=f"{where}(layers={num_layers} x {encoder_layer.name}, norm={norm})",
                      batch_axis=encoder_layer.batch_axis, layers=ModuleList([encoder_layer] * num_layers), norm=norm)
    return _clones(model, encoder_layer, num_layers)


def _clones(model: Module, layer: Module, num_layers: int) -> Module:
    # torch's _get_clones deep-copies one initialized layer: every layer starts equal
    def init(key):
        params = model.init(key)
        first = params["layers"]["0"]
        params["layers"] = {str(i): first if i == 0 else jax.tree.map(jnp.copy, first) for i in range(num_layers)}
        return params

    return model._replace(init=init)


def TransformerDecoderLayer(
    d_model: int,
    nhead: int,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    activation: str | Callable | Module = "relu",
    layer_norm_eps: float = 1e-5,
    batch_first: bool = False,
    norm_first: bool = False,
    bias: bool = True,
    *,
    dtype=None,
) -> Module:
    """Self-attention, attention over the encoder's ``memory``, then a feed-forward block, each with
    a residual and a LayerNorm (torch.nn.TransformerDecoderLayer; post-norm by default, pre-norm
    with ``norm_first``).

    Children (torch's names): ``self_attn``, ``multihead_attn``, ``linear1``, ``dropout``,
    ``linear2``, ``norm1``, ``norm2``, ``norm3``, ``dropout1``, ``dropout2``, ``dropout3`` (and
    ``activation`` when it is a Module). ``activation``: "relu", "gelu" or any unary callable, as
    :func:`TransformerEncoderLayer`.

    ``apply(params, tgt, memory, *, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False, key=None,
    train=False)``: tgt (T, N, d_model), memory (S, N, d_model) (batch first with ``batch_first``;
    unbatched (T, d_model), (S, d_model)); tgt_mask (T, T) or (N*nhead, T, T), memory_mask (T, S)
    or (N*nhead, T, S), key padding masks (N, T) / (N, S); bool (True = masked) or float (added).
    """
    where = "TransformerDecoderLayer"
    for arg, value in (("d_model", d_model), ("nhead", nhead), ("dim_feedforward", dim_feedforward)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{where}: {arg} must be a positive int, got {value!r}")
    act = _activation(activation, where)
    children = dict(
        self_attn=MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, dtype=dtype),
        multihead_attn=MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                          dtype=dtype),
        linear1=Linear(d_model, dim_feedforward, bias, dtype=dtype),
        dropout=Dropout(dropout),
        linear2=Linear(dim_feedforward, d_model, bias, dtype=dtype),
        norm1=LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype),
        norm2=LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype),
        norm3=LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype),
        dropout1=Dropout(dropout),
        dropout2=Dropout(dropout),
        dropout3=Dropout(dropout),
    )
    if isinstance(act, Module):
        children["activation"] = act

    def forward(self, tgt, memory, *, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        activation_fn = self.activation if isinstance(act, Module) else act

        def sa_block(x):
            x = self.self_attn(x, x, x, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask,
                               is_causal=tgt_is_causal, need_weights=False)[0]
            return self.dropout1(x)

        def mha_block(x, mem):
            x = self.multihead_attn(x, mem, mem, attn_mask=memory_mask, key_padding_mask=memory_key_padding_mask,
                                    is_causal=memory_is_causal, need_weights=False)[0]
            return self.dropout2(x)

        def ff_block(x):
            return self.dropout3(self.linear2(self.dropout(activation_fn(self.linear1(x)))))

        x = tgt
        if norm_first:
            x = x + sa_block(self.norm1(x))
            x = x + mha_block(self.norm2(x), memory)
            x = x + ff_block(self.norm3(x))
        else:
            x = self.norm1(x + sa_block(x))
            x = self.norm2(x + mha_block(x, memory))
            x = self.norm3(x + ff_block(x))
        return x

    name = (f"{where}(d_model={d_model}, nhead={nhead}, dim_feedforward={dim_feedforward}, dropout={dropout}, "
            f"activation={_activation_name(activation, act)}, layer_norm_eps={layer_norm_eps}, "
            f"batch_first={batch_first}, norm_first={norm_first}, bias={bias})")
    return Composite(forward, name=name, batch_axis=0 if batch_first else 1, **children)


def TransformerDecoder(decoder_layer: Module, num_layers: int, norm: Module | None = None) -> Module:
    """``num_layers`` copies of ``decoder_layer`` applied in turn to ``tgt`` with the same
    ``memory``, then ``norm`` if given (torch.nn.TransformerDecoder). Children ``layers``
    (ModuleList) and ``norm``; every layer starts from the same weights, as torch's deep copies.

    ``apply(params, tgt, memory, *, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False, key=None,
    train=False)``. ``tgt_is_causal=None`` is False here: torch would detect a causal
    ``tgt_mask`` and use the causal mask instead, which gives the same result.
    """
    where = "TransformerDecoder"
    if not isinstance(decoder_layer, Module):
        raise TypeError(f"{where}: decoder_layer must be a funcnet.nn.Module (e.g. nn.TransformerDecoderLayer(...)), "
                        f"got {describe(decoder_layer)}")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers <= 0:
        raise ValueError(f"{where}: num_layers must be a positive int, got {num_layers!r}")
    if norm is not None and not isinstance(norm, Module):
        raise TypeError(f"{where}: norm must be None or a funcnet.nn.Module (e.g. nn.LayerNorm(d_model)), "
                        f"got {describe(norm)}")

    def forward(self, tgt, memory, *, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        output = tgt
        for mod in self.layers:
            output = mod(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                         tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                         tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        if self.norm is not None:
            output = self.norm(output)
        return output

    model = Composite(forward, name=f"{where}(layers={num_layers} x {decoder_layer.name}, norm={norm})",
                      batch_axis=decoder_layer.batch_axis, layers=ModuleList([decoder_layer] * num_layers), norm=norm)
    return _clones(model, decoder_layer, num_layers)


def Transformer(
    d_model: int = 512,
    nhead: int = 8,
    num_encoder_layers: int = 6,
    num_decoder_layers: int = 6,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    activation: str | Callable | Module = "relu",
    custom_encoder: Module | None = None,
    custom_decoder: Module | None = None,
    layer_norm_eps: float = 1e-5,
    batch_first: bool = False,
    norm_first: bool = False,
    bias: bool = True,
    *,
    dtype=None,
) -> Module:
    """An encoder-decoder Transformer, as torch.nn.Transformer: ``encoder`` (TransformerEncoder of
    ``num_encoder_layers`` layers and a final LayerNorm) and ``decoder`` (TransformerDecoder, same),
    or ``custom_encoder`` / ``custom_decoder``. As torch's ``_reset_parameters``, every parameter
    with more than one dimension starts xavier-uniform (each layer its own draw).

    ``apply(params, src, tgt, *, src_mask=None, tgt_mask=None, memory_mask=None,
    src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    src_is_causal=None, tgt_is_causal=None, memory_is_causal=False, key=None, train=False)``:
    src (S, N, E), tgt (T, N, E) (batch first with ``batch_first``) -> (T, N, E).
    """
    from funcnet import init as _init

    where = "Transformer"
    if custom_encoder is None:
        layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                        batch_first, norm_first, bias, dtype=dtype)
        encoder = TransformerEncoder(layer, num_encoder_layers, LayerNorm(d_model, eps=layer_norm_eps, bias=bias,
                                                                          dtype=dtype))
    else:
        encoder = custom_encoder
    if custom_decoder is None:
        layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                        batch_first, norm_first, bias, dtype=dtype)
        decoder = TransformerDecoder(layer, num_decoder_layers, LayerNorm(d_model, eps=layer_norm_eps, bias=bias,
                                                                          dtype=dtype))
    else:
        decoder = custom_decoder
    for arg, value in (("custom_encoder", encoder), ("custom_decoder", decoder)):
        if not isinstance(value, Module):
            raise TypeError(f"{where}: {arg} must be a funcnet.nn.Module or None, got {describe(value)}")

    def forward(self, src, tgt, *, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        src, tgt = jnp.asarray(src), jnp.asarray(tgt)
        batch = 0 if batch_first else 1
        if src.ndim == 3 and (tgt.ndim != 3 or src.shape[batch] != tgt.shape[batch]):
            raise ValueError(f"{where}: the batch number of src and tgt must be equal: src {tuple(src.shape)}, tgt "
                             f"{tuple(tgt.shape)} (batch_first={batch_first}: the batch axis is {batch})")
        if src.shape[-1] != d_model or tgt.shape[-1] != d_model:
            raise ValueError(f"{where}: the feature number of src and tgt must be equal to d_model={d_model}: src "
                             f"{tuple(src.shape)}, tgt {tuple(tgt.shape)}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    model = Composite(forward, name=f"{where}(d_model={d_model}, nhead={nhead})", batch_axis=decoder.batch_axis,
                      encoder=encoder, decoder=decoder)

    def init(key):
        # torch's _reset_parameters: xavier_uniform_ on every parameter with dim > 1
        key, sub = jax.random.split(key)
        params = model.init(key)
        leaves, treedef = jax.tree_util.tree_flatten(params)
        keys = jax.random.split(sub, max(len(leaves), 1))
        leaves = [_init.xavier_uniform(k, p.shape, p.dtype) if p.ndim > 1 else p for p, k in zip(leaves, keys)]
        return jax.tree_util.tree_unflatten(treedef, leaves)

    return model._replace(init=init)
