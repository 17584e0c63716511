"""MultiheadAttention against torch.nn.MultiheadAttention, through tests/torch_oracle.check_layer.

check_layer compares the attention output, the attention weights (the second element of the
tuple), the gradients of the output with respect to q, k, v and every parameter, and the
state_dict keys/order/shapes. Tolerances are check_layer's defaults: torch runs with
``requires_grad`` inputs, so it never takes its fused inference "fast path" there (that path
is compared separately below, with its own tolerance). Rows with ``need_weights=False`` go
through torch's scaled_dot_product_attention kernel, which differs from the explicit
softmax by rounding only, within the same defaults.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_oracle import check_layer

import funcnet
from funcnet import nn

E, H, N, L, S = 8, 2, 3, 4, 5


def _inputs(rng, *, self_attn=False, kdim=E, vdim=E, batch_first=False, unbatched=False):
    def shape(seq, dim):
        if unbatched:
            return (seq, dim)
        return (N, seq, dim) if batch_first else (seq, N, dim)

    q = rng.standard_normal(shape(L, E))
    if self_attn:
        return [q, q, q]
    return [q, rng.standard_normal(shape(S, kdim)), rng.standard_normal(shape(S, vdim))]


def _bool_mask(rng, shape):
    # every query keeps key 0, so no row is fully masked (that row is NaN in torch: tested apart)
    m = rng.random(shape) < 0.4
    m[..., 0] = False
    return m


def _float_mask(rng, shape, dtype):
    m = rng.standard_normal(shape)
    m[rng.random(shape) < 0.2] = -np.inf
    m[..., 0] = 0.0
    return m.astype(dtype)


def _causal(n, dtype=None):
    m = np.triu(np.ones((n, n), bool), 1)
    return m if dtype is None else np.where(m, -np.inf, 0.0).astype(dtype)


# name: (constructor kwargs, input kwargs, forward kwargs as a function of (rng, dtype))
CASES = {
    "self": ({}, dict(self_attn=True), lambda r, d: {}),
    "cross": ({}, {}, lambda r, d: {}),
    "kdim_vdim": (dict(kdim=3, vdim=5), dict(kdim=3, vdim=5), lambda r, d: {}),
    "batch_first": (dict(batch_first=True), dict(batch_first=True), lambda r, d: {}),
    "unbatched": ({}, dict(unbatched=True), lambda r, d: dict(attn_mask=_bool_mask(r, (L, S)))),
    "unbatched_batch_first_3d_mask": (dict(batch_first=True), dict(unbatched=True),
                                      lambda r, d: dict(attn_mask=_float_mask(r, (H, L, S), d),
                                                        key_padding_mask=_float_mask(r, (S,), d))),
    "bool_mask_2d": ({}, {}, lambda r, d: dict(attn_mask=_bool_mask(r, (L, S)))),
    "float_mask_2d": ({}, {}, lambda r, d: dict(attn_mask=_float_mask(r, (L, S), d))),
    "bool_mask_3d": ({}, {}, lambda r, d: dict(attn_mask=_bool_mask(r, (N * H, L, S)))),
    "float_mask_3d_batch_first": (dict(batch_first=True), dict(batch_first=True),
                                  lambda r, d: dict(attn_mask=_float_mask(r, (N * H, L, S), d))),
    "key_padding_bool": ({}, {}, lambda r, d: dict(key_padding_mask=_bool_mask(r, (N, S)))),
    "key_padding_float": ({}, {}, lambda r, d: dict(key_padding_mask=_float_mask(r, (N, S), d))),
    "both_masks_no_weights": ({}, {}, lambda r, d: dict(attn_mask=_bool_mask(r, (L, S)),
                                                       key_padding_mask=_bool_mask(r, (N, S)), need_weights=False)),
    "no_weights": ({}, dict(self_attn=True), lambda r, d: dict(need_weights=False)),
    "per_head_weights": ({}, {}, lambda r, d: dict(average_attn_weights=False, attn_mask=_bool_mask(r, (L, S)))),
    # is_causal: without weights and padding torch drops attn_mask for SDPA's own causal mask ...
    "causal_sdpa": ({}, dict(self_attn=True), lambda r, d: dict(attn_mask=_causal(L), is_causal=True,
                                                                need_weights=False)),
    # ... with weights or padding it uses attn_mask
    "causal_weights": ({}, dict(self_attn=True), lambda r, d: dict(attn_mask=_causal(L, d), is_causal=True)),
    "causal_padding": ({}, dict(self_attn=True), lambda r, d: dict(attn_mask=_causal(L), is_causal=True,
                                                                   key_padding_mask=_bool_mask(r, (N, L)),
                                                                   need_weights=False)),
    # is_causal is a hint that attn_mask is causal; given with another mask, torch (and we) use
    # the causal mask on the path without weights or padding: pinned here, not recommended
    "causal_hint_overrides_mask": ({}, dict(self_attn=True), lambda r, d: dict(attn_mask=_bool_mask(r, (L, L)),
                                                                               is_causal=True, need_weights=False)),
    "no_bias": (dict(bias=False), {}, lambda r, d: dict(attn_mask=_bool_mask(r, (L, S)))),
    "bias_kv_zero_attn": (dict(add_bias_kv=True, add_zero_attn=True), {},
                          lambda r, d: dict(attn_mask=_bool_mask(r, (L, S)), key_padding_mask=_bool_mask(r, (N, S)))),
    "bias_kv_causal_sdpa": (dict(add_bias_kv=True), dict(self_attn=True),
                            lambda r, d: dict(attn_mask=_causal(L), is_causal=True, need_weights=False)),
    "one_head_dropout_eval": (dict(num_heads=1, dropout=0.3), {}, lambda r, d: {}),
}


# Every row in float32 eval mode; train mode (no dropout: the same math, torch's training
# branch) and float64 on the rows that exercise the most code, to keep the suite fast.
FULL = ["cross", "kdim_vdim", "unbatched_batch_first_3d_mask", "both_masks_no_weights", "causal_sdpa",
        "bias_kv_zero_attn"]
RUNS = [(c, False, "float32") for c in CASES] + [(c, True, "float64") for c in FULL] + \
       [(c, True, "float32") for c in ("float_mask_3d_batch_first", "per_head_weights")] + \
       [(c, False, "float64") for c in ("causal_weights", "key_padding_float")]


@pytest.mark.parametrize("case, train, dtype", RUNS)
def test_multihead_attention_equals_torch(case, train, dtype):
    ctor, shapes, forward_kwargs = CASES[case]
    ctor = dict(ctor)
    heads = ctor.pop("num_heads", H)
    if train and ctor.get("dropout", 0.0) > 0:
        pytest.skip("dropout in train mode is random; see test_attention_dropout_in_train_mode")
    rng = np.random.default_rng(len(case))
    torch.manual_seed(0)
    with jax.enable_x64(dtype == "float64"):
        ours = nn.MultiheadAttention(E, heads, **ctor, dtype=jnp.dtype(dtype))
        check_layer(ours, torch.nn.MultiheadAttention(E, heads, **ctor), _inputs(rng, **shapes), train=train,
                    dtype=dtype, kwargs=forward_kwargs(rng, dtype))


@pytest.mark.parametrize("need_weights", [True, False])
def test_fast_path_within_its_rounding(need_weights):
    # torch's eval-mode inference fast path (_native_multi_head_attention: self-attention,
    # batch_first, no grad) fuses the projections and the softmax; its rounding differs from
    # the composed ops by a few float32 ulps of the O(1) outputs, hence atol 1e-5, not 1e-6.
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    ours = nn.MultiheadAttention(E, H, batch_first=True)
    params = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict())
    x = np.random.default_rng(0).standard_normal((N, L, E)).astype(np.float32)
    kpm = _bool_mask(np.random.default_rng(1), (N, L))
    with torch.no_grad():
        t = torch.from_numpy(x)
        t_out, t_w = theirs(t, t, t, key_padding_mask=torch.from_numpy(kpm), need_weights=need_weights)
    out, w = ours.apply(params, x, x, x, key_padding_mask=kpm, need_weights=need_weights)
    np.testing.assert_allclose(out, t_out.numpy(), rtol=1e-4, atol=1e-5)
    if need_weights:
        np.testing.assert_allclose(w, t_w.numpy(), rtol=1e-4, atol=1e-5)
    else:
        assert w is None and t_w is None


def test_fully_masked_row_is_nan_with_weights_and_zero_without_as_torch():
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(E, H)
    ours = nn.MultiheadAttention(E, H)
    params = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict())
    x = np.random.default_rng(0).standard_normal((L, N, E)).astype(np.float32)
    kpm = np.zeros((N, L), bool)
    kpm[1] = True  # every key of batch element 1 is padding
    for need_weights in (True, False):
        t_out = theirs(*[torch.from_numpy(x)] * 3, key_padding_mask=torch.from_numpy(kpm), need_weights=need_weights)
        out, _ = ours.apply(params, x, x, x, key_padding_mask=kpm, need_weights=need_weights)
        np.testing.assert_allclose(out, t_out[0].detach().numpy(), rtol=1e-5, atol=1e-6)
        assert np.isnan(out[:, 1]).all() == need_weights
    # without weights the gradient stays finite (torch's SDPA backward is finite too)
    grad = jax.grad(lambda p: ours.apply(p, x, x, x, key_padding_mask=kpm, need_weights=False)[0].sum())(params)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grad))


def test_attention_dropout_in_train_mode():
    p = 0.5
    ours = nn.MultiheadAttention(E, 1, dropout=p)
    params = ours.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    q = rng.standard_normal((L, 64, E)).astype(np.float32)
    kv = rng.standard_normal((64, 64, E)).astype(np.float32)
    k1, k2 = jax.random.split(jax.random.key(1))
    out, w = ours.apply(params, q, kv, kv, key=k1, train=True)
    assert out.shape == (L, 64, E) and w.shape == (64, L, 64)
    # torch returns the dropped, rescaled weights: a fraction p of zeros, rows summing to 1 on average
    w = np.asarray(w)
    assert abs((w == 0).mean() - p) < 0.02
    assert abs(w.sum(-1).mean() - 1.0) < 0.02
    out2, _ = ours.apply(params, q, kv, kv, key=k2, train=True)
    assert not np.allclose(out, out2)
    # eval mode and p=0 ignore the key: the plain softmax
    _, eval_w = ours.apply(params, q, kv, kv)
    np.testing.assert_allclose(eval_w.sum(-1), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        ours.apply(params, q, kv, kv, train=True)


def test_init_is_torchs():
    big = 64
    for model, packed in ((nn.MultiheadAttention(big, 4), True), (nn.MultiheadAttention(big, 4, kdim=32), False)):
        params = model.init(jax.random.key(0))
        sd = funcnet.state_dict(params, model=model)
        assert list(sd) == list(torch.nn.MultiheadAttention(big, 4, kdim=None if packed else 32).state_dict())
        np.testing.assert_array_equal(sd["in_proj_bias"], 0.0)
        np.testing.assert_array_equal(sd["out_proj.bias"], 0.0)
        w = sd["in_proj_weight"] if packed else sd["q_proj_weight"]
        bound = math.sqrt(6.0 / (big + (3 * big if packed else big)))  # xavier_uniform on (3E, E) or (E, E)
        assert np.abs(w).max() <= bound and abs(np.std(w) - bound / math.sqrt(3)) < 0.05 * bound
        ow = sd["out_proj.weight"]  # Linear's default: U(-1/sqrt(E), 1/sqrt(E))
        assert np.abs(ow).max() <= 1 / math.sqrt(big) and np.abs(ow).max() > 0.9 / math.sqrt(big)
    sd = funcnet.state_dict(nn.MultiheadAttention(big, 4, add_bias_kv=True).init(jax.random.key(1)))
    # xavier_normal on (1, 1, E): std = sqrt(2 / (E + E))
    assert abs(np.std(np.concatenate([sd["bias_k"].ravel(), sd["bias_v"].ravel()])) - 1 / math.sqrt(big)) < 0.02


def test_name_is_torchs_repr_and_messages_list_the_non_default_arguments():
    # name is torch's repr (the tree of out_proj); error messages name the arguments
    model = nn.MultiheadAttention(8, 2, batch_first=True)
    assert model.name == repr(torch.nn.MultiheadAttention(8, 2, batch_first=True))
    with pytest.raises(ValueError, match=r"MultiheadAttention\(embed_dim=8, num_heads=2, batch_first=True\)"):
        model.apply(model.init(jax.random.key(0)), jnp.zeros((2, 3, 5)), jnp.zeros((2, 3, 5)), jnp.zeros((2, 3, 5)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(embed_dim=6, num_heads=4), "divisible by num_heads=4"),
    (dict(embed_dim=0, num_heads=1), "positive int"),
    (dict(embed_dim=8, num_heads=2, dropout=1.5), "in \\[0, 1\\]"),
    (dict(embed_dim=8, num_heads=2, kdim=0), "kdim"),
])
def test_bad_constructor_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        nn.MultiheadAttention(**kwargs)


def test_bad_inputs_name_the_expected_shape():
    m = nn.MultiheadAttention(E, H)
    params = m.init(jax.random.key(0))
    x = jnp.zeros((L, N, E))
    kv = jnp.zeros((S, N, E))
    with pytest.raises(ValueError, match=r"attn_mask has shape \(5, 4\), expected .*\(4, 5\) or \(6, 4, 5\)"):
        m.apply(params, x, kv, kv, attn_mask=np.zeros((S, L), bool))
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(5, 3\), expected \(N, S\) = \(3, 5\)"):
        m.apply(params, x, kv, kv, key_padding_mask=np.zeros((S, N), bool))
    with pytest.raises(TypeError, match="must be bool"):
        m.apply(params, x, kv, kv, attn_mask=np.zeros((L, S), np.int32))
    with pytest.raises(ValueError, match="is_causal=True needs attn_mask"):
        m.apply(params, x, x, x, is_causal=True)
    with pytest.raises(ValueError, match="expected kdim=8"):
        m.apply(params, x, jnp.zeros((S, N, 3)), kv)
    with pytest.raises(ValueError, match="different batch sizes"):
        m.apply(params, x, jnp.zeros((S, 2, E)), jnp.zeros((S, 2, E)))
    with pytest.raises(ValueError, match="3-D"):
        m.apply(params, jnp.zeros((1, L, N, E)), kv, kv)


def test_attention_softmax_is_float32_for_bf16_inputs():
    """Oracle: the same attention computed in float32 from the bf16 params and inputs; the bf16
    result stays within bf16 rounding of it (a bf16 softmax over 64 keys would drift further)."""
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    params = mha.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (2, 64, 16))
    p16, x16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), (params, x))
    out16, w16 = mha.apply(p16, x16, x16, x16)
    p32, x32 = jax.tree.map(lambda a: a.astype(jnp.float32), (p16, x16))
    out32, w32 = mha.apply(p32, x32, x32, x32)
    assert out16.dtype == jnp.bfloat16 and w16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(w16, np.float32), np.asarray(w32), rtol=2 ** -7, atol=2 ** -12)
