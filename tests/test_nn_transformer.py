"""TransformerEncoderLayer / TransformerEncoder against torch, through tests/torch_oracle.check_layer.

check_layer compares the output, the gradients of the output with respect to src and every
parameter, and the state_dict keys in torch's order. Dropout is 0.0 in train-mode rows (a
random mask cannot be compared); dropout 0.1 (torch's default) in eval mode is exact. torch
runs with requires_grad inputs, so it takes its regular path, not the fused inference path
(that one is compared apart, with its own tolerance).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_oracle import check_layer

import funcnet
from funcnet import nn

D, NHEAD, FF, N, S = 8, 2, 16, 3, 5


def _src(rng, batch_first=False, unbatched=False):
    return rng.standard_normal((S, D) if unbatched else (N, S, D) if batch_first else (S, N, D))


def _bool_mask(rng, shape):
    m = rng.random(shape) < 0.4
    m[..., 0] = False  # no fully masked row
    return m


def _causal_float(dtype):
    return np.triu(np.full((S, S), -np.inf), 1).astype(dtype)


# name: (constructor kwargs, input kwargs, forward kwargs as a function of (rng, dtype))
CASES = {
    "post_norm_relu": ({}, {}, lambda r, d: {}),
    "pre_norm_gelu": (dict(norm_first=True, activation="gelu"), {}, lambda r, d: {}),
    "masks_batch_first": (dict(batch_first=True), dict(batch_first=True),
                          lambda r, d: dict(src_mask=_bool_mask(r, (S, S)),
                                            src_key_padding_mask=_bool_mask(r, (N, S)))),
    "pre_norm_3d_float_mask": (dict(norm_first=True), {},
                               lambda r, d: dict(src_mask=r.standard_normal((N * NHEAD, S, S)).astype(d))),
    "causal": (dict(norm_first=True, activation="gelu"), {},
               lambda r, d: dict(src_mask=_causal_float(d), is_causal=True)),
    "unbatched_no_bias_eps": (dict(bias=False, layer_norm_eps=1e-3), dict(unbatched=True),
                              lambda r, d: dict(src_key_padding_mask=_bool_mask(r, (S,)))),
}


def _pair(ctor, dtype, dropout):
    torch.manual_seed(0)
    ctor = dict(ctor, dim_feedforward=FF, dropout=dropout)
    theirs = torch.nn.TransformerEncoderLayer(D, NHEAD, **ctor)
    return nn.TransformerEncoderLayer(D, NHEAD, **ctor, dtype=jnp.dtype(dtype)), theirs


# Every row in float32 eval mode with torch's dropout 0.1; train mode (dropout 0.0) in float64
# on the rows that cover both norm placements, both activations, every mask kind and unbatched.
RUNS = [(c, False, "float32", 0.1) for c in CASES] + \
       [(c, True, "float64", 0.0) for c in ("pre_norm_gelu", "masks_batch_first", "causal", "unbatched_no_bias_eps")] + \
       [("masks_batch_first", True, "float32", 0.0), ("pre_norm_gelu", False, "float64", 0.1)]


@pytest.mark.parametrize("case, train, dtype, dropout", RUNS)
def test_encoder_layer_equals_torch(case, train, dtype, dropout):
    ctor, shapes, forward_kwargs = CASES[case]
    rng = np.random.default_rng(len(case))
    with jax.enable_x64(dtype == "float64"):
        ours, theirs = _pair(ctor, dtype, dropout)
        kwargs = forward_kwargs(rng, dtype)
        check_layer(ours, theirs, [_src(rng, **shapes)], train=train, dtype=dtype, kwargs=kwargs)


def test_encoder_layer_callable_activation_and_module_activation():
    rng = np.random.default_rng(0)
    for ours_act, torch_act in ((jnp.tanh, torch.tanh), (nn.GELU(approximate="tanh"), torch.nn.GELU("tanh"))):
        torch.manual_seed(0)
        theirs = torch.nn.TransformerEncoderLayer(D, NHEAD, FF, 0.0, activation=torch_act)
        ours = nn.TransformerEncoderLayer(D, NHEAD, FF, 0.0, activation=ours_act)
        check_layer(ours, theirs, [_src(rng)], train=True)


def test_encoder_stack_with_final_norm_equals_torch():
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D, NHEAD, FF, 0.0, batch_first=True)
    theirs = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(D), enable_nested_tensor=False)
    with torch.no_grad():  # torch's copies start equal; make them differ so the order of layers matters
        for p in theirs.layers[1].parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, NHEAD, FF, 0.0, batch_first=True), 2,
                                 norm=nn.LayerNorm(D))
    kwargs = dict(mask=_bool_mask(rng, (S, S)), src_key_padding_mask=_bool_mask(rng, (N, S)))
    check_layer(ours, theirs, [_src(rng, batch_first=True)], train=True, kwargs=kwargs)


def test_encoder_layers_start_equal_as_torchs_deep_copies():
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, NHEAD, FF), 3)
    params = model.init(jax.random.key(0))
    sd = funcnet.state_dict(params, model=model)
    torch_sd = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(D, NHEAD, FF), 3,
                                           enable_nested_tensor=False).state_dict()
    assert list(sd) == list(torch_sd)
    for k in torch_sd:
        if k.startswith("layers.1.") or k.startswith("layers.2."):
            np.testing.assert_array_equal(sd[k], sd["layers.0." + k.split(".", 2)[2]])
    # distinct buffers, so a training step that donates params never sees one buffer twice
    leaves = jax.tree.leaves(params)
    assert len({id(x) for x in leaves}) == len(leaves)


def test_fast_path_within_its_rounding():
    # torch's eval-mode inference path (_transformer_encoder_layer_fwd: batch_first, no grad)
    # fuses attention, residuals and norms; its rounding differs by a few float32 ulps.
    rng = np.random.default_rng(0)
    ours, theirs = _pair(dict(batch_first=True, norm_first=True), "float32", 0.1)
    theirs.eval()
    params = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict())
    x = _src(rng, batch_first=True).astype(np.float32)
    mask = _bool_mask(rng, (S, S))
    with torch.no_grad():
        expected = theirs(torch.from_numpy(x), src_mask=torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(ours.apply(params, x, src_mask=mask), expected, rtol=1e-4, atol=1e-5)


def test_dropout_in_train_mode_needs_a_key_and_is_random():
    ours = nn.TransformerEncoderLayer(D, NHEAD, FF)  # dropout=0.1, torch's default
    params = ours.init(jax.random.key(0))
    x = jnp.asarray(_src(np.random.default_rng(0)), jnp.float32)
    with pytest.raises(ValueError, match="PRNG key"):
        ours.apply(params, x, train=True)
    apply = jax.jit(ours.apply, static_argnames="train")
    k1, k2 = jax.random.split(jax.random.key(1))
    y1, y2 = apply(params, x, key=k1, train=True), apply(params, x, key=k2, train=True)
    assert y1.shape == x.shape and not np.allclose(y1, y2)
    # torch's default dropout=0.1 zeros about 10% of the feed-forward hidden units: the output moves
    assert not np.allclose(y1, apply(params, x, train=False), atol=1e-3)


def test_generate_square_subsequent_mask_is_torchs():
    np.testing.assert_array_equal(nn.generate_square_subsequent_mask(4),
                                  torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())


def test_bad_arguments():
    with pytest.raises(ValueError, match="activation should be 'relu' or 'gelu'"):
        nn.TransformerEncoderLayer(D, NHEAD, activation="swish")
    with pytest.raises(ValueError, match="divisible by num_heads=3"):
        nn.TransformerEncoderLayer(D, 3)
    with pytest.raises(ValueError, match="num_layers must be a positive int"):
        nn.TransformerEncoder(nn.TransformerEncoderLayer(D, NHEAD), 0)
    model = nn.TransformerEncoderLayer(D, NHEAD, FF)
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match=r"src_mask|attn_mask has shape \(4, 4\), expected"):
        model.apply(params, jnp.zeros((S, N, D)), src_mask=np.zeros((4, 4), bool))
    with pytest.raises(ValueError, match="is_causal=True needs attn_mask"):
        model.apply(params, jnp.zeros((S, N, D)), is_causal=True)


# ---- decoder: TransformerDecoderLayer, TransformerDecoder, Transformer ----

TT = 4  # target length (S = 5 is the memory's), so a swapped mask shape fails


def _tgt_mem(rng, batch_first=False, unbatched=False):
    shape = (lambda L: (L, D)) if unbatched else (lambda L: (N, L, D)) if batch_first else (lambda L: (L, N, D))
    return [rng.standard_normal(shape(TT)), rng.standard_normal(shape(S))]


# name: (constructor kwargs (ours, torch), input kwargs, forward kwargs as a function of (rng, dtype))
DEC_CASES = {
    "post_norm_relu": ({}, {}, {}, lambda r, d: {}),
    "pre_norm_gelu": (dict(norm_first=True, activation="gelu"), None, {}, lambda r, d: {}),
    "all_bool_masks_batch_first": (
        dict(batch_first=True), None, dict(batch_first=True),
        lambda r, d: dict(tgt_mask=_bool_mask(r, (TT, TT)), memory_mask=_bool_mask(r, (TT, S)),
                          tgt_key_padding_mask=_bool_mask(r, (N, TT)), memory_key_padding_mask=_bool_mask(r, (N, S)))),
    "causal_and_3d_float_memory_mask": (
        dict(norm_first=True), None, {},
        lambda r, d: dict(tgt_mask=np.triu(np.full((TT, TT), -np.inf), 1).astype(d), tgt_is_causal=True,
                          memory_mask=r.standard_normal((N * NHEAD, TT, S)).astype(d))),
    "unbatched_no_bias_eps": (dict(bias=False, layer_norm_eps=1e-3), None, dict(unbatched=True),
                              lambda r, d: dict(memory_key_padding_mask=_bool_mask(r, (S,)))),
    "silu_function": (dict(activation=jax.nn.silu), dict(activation=torch.nn.functional.silu), {},
                      lambda r, d: {}),
    "gelu_tanh_function": (dict(activation=lambda x: jax.nn.gelu(x, approximate=True), norm_first=True),
                           dict(activation=lambda x: torch.nn.functional.gelu(x, approximate="tanh"), norm_first=True),
                           {}, lambda r, d: {}),
    "silu_module": (dict(activation=nn.SiLU()), dict(activation=torch.nn.SiLU()), {}, lambda r, d: {}),
}

DEC_RUNS = [(c, True, "float32", 0.0) for c in DEC_CASES] + \
    [(c, True, "float64", 0.0) for c in ("all_bool_masks_batch_first", "causal_and_3d_float_memory_mask")] + \
    [("post_norm_relu", False, "float32", 0.1), ("unbatched_no_bias_eps", False, "float64", 0.1)]


@pytest.mark.parametrize("case, train, dtype, dropout", DEC_RUNS)
def test_decoder_layer_equals_torch(case, train, dtype, dropout):
    ours_ctor, torch_ctor, shapes, forward_kwargs = DEC_CASES[case]
    torch_ctor = ours_ctor if torch_ctor is None else torch_ctor
    rng = np.random.default_rng(len(case))
    with jax.enable_x64(dtype == "float64"):
        torch.manual_seed(0)
        theirs = torch.nn.TransformerDecoderLayer(D, NHEAD, **dict(torch_ctor, dim_feedforward=FF, dropout=dropout))
        ours = nn.TransformerDecoderLayer(D, NHEAD, **dict(ours_ctor, dim_feedforward=FF, dropout=dropout),
                                          dtype=jnp.dtype(dtype))
        check_layer(ours, theirs, _tgt_mem(rng, **shapes), train=train, dtype=dtype, kwargs=forward_kwargs(rng, dtype))


def test_decoder_stack_with_final_norm_equals_torch():
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    theirs = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(D, NHEAD, FF, 0.0, norm_first=True), 2,
                                         norm=torch.nn.LayerNorm(D))
    with torch.no_grad():  # torch's copies start equal; make them differ so the order of layers matters
        for p in theirs.layers[1].parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, NHEAD, FF, 0.0, norm_first=True), 2,
                                 norm=nn.LayerNorm(D))
    kwargs = dict(tgt_mask=_causal_float("float32")[:TT, :TT], memory_key_padding_mask=_bool_mask(rng, (N, S)))
    check_layer(ours, theirs, _tgt_mem(rng), train=True, kwargs=kwargs)
    sd = funcnet.state_dict(ours.init(jax.random.key(0)), model=ours)
    np.testing.assert_array_equal(sd["layers.1.linear1.weight"], sd["layers.0.linear1.weight"])


def test_transformer_equals_torch_with_every_mask():
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    ctor = dict(d_model=D, nhead=NHEAD, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=FF, dropout=0.0,
                batch_first=True, activation="gelu")
    theirs, ours = torch.nn.Transformer(**ctor), nn.Transformer(**ctor)
    kwargs = dict(src_mask=_bool_mask(rng, (S, S)), tgt_mask=_causal_float("float32")[:TT, :TT],
                  memory_mask=_bool_mask(rng, (TT, S)), src_key_padding_mask=_bool_mask(rng, (N, S)),
                  tgt_key_padding_mask=_bool_mask(rng, (N, TT)), memory_key_padding_mask=_bool_mask(rng, (N, S)))
    src, tgt = rng.standard_normal((N, S, D)), rng.standard_normal((N, TT, D))
    check_layer(ours, theirs, [src, tgt], train=True, kwargs=kwargs)


def test_transformer_init_is_xavier_per_layer_as_torchs_reset_parameters():
    model = nn.Transformer(d_model=32, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64)
    sd = funcnet.state_dict(model.init(jax.random.key(0)), model=model)
    torch_sd = torch.nn.Transformer(d_model=32, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                    dim_feedforward=64).state_dict()
    assert list(sd) == list(torch_sd)
    w = np.asarray(sd["decoder.layers.1.linear1.weight"])  # (64, 32): xavier bound sqrt(6 / 96)
    bound = np.sqrt(6 / 96)
    assert np.abs(w).max() <= bound and abs(w.std() - bound / np.sqrt(3)) < 0.1 * bound
    assert not np.allclose(w, sd["decoder.layers.0.linear1.weight"])  # each layer its own draw
    np.testing.assert_array_equal(sd["encoder.norm.weight"], 1.0)


def test_decoder_bad_arguments():
    with pytest.raises(ValueError, match="activation should be 'relu' or 'gelu'.*jax.nn.silu"):
        nn.TransformerDecoderLayer(D, NHEAD, activation="silu")
    model = nn.Transformer(D, NHEAD, 1, 1, FF)
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match="batch number of src and tgt must be equal"):
        model.apply(params, jnp.zeros((S, N, D)), jnp.zeros((TT, N + 1, D)))
    with pytest.raises(ValueError, match="feature number of src and tgt must be equal to d_model=8"):
        model.apply(params, jnp.zeros((S, N, D)), jnp.zeros((TT, N, D + 1)))
