"""funcnet.nn.functional against torch.nn.functional, through one table: values and
gradients (jax.vjp with a fixed cotangent against torch's backward of the same), float32 and
float64. Each row is one compile (jax.jit of the value and the vjp); inputs hit the kinks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from funcnet.nn import functional as F

rng = np.random.default_rng(3)


def _x(*shape, scale=2.0, kinks=(0.0,)):
    x = rng.normal(0, scale, shape)
    x.flat[:len(kinks)] = kinks
    return x


X = _x(3, 8, kinks=(0.0, 6.0, -3.0, 3.0, -1.0, 1.0, 0.1, 5.0, -2.0))
X4 = _x(2, 4, 5, 5)
X3 = _x(2, 4, 7)
X5 = _x(1, 2, 4, 4, 4)
W1 = rng.normal(0, 0.5, (6, 2, 3))           # conv1d, groups=2
W2 = rng.normal(0, 0.5, (6, 2, 3, 3))        # conv2d, groups=2
W3 = rng.normal(0, 0.5, (3, 2, 2, 2, 2))     # conv3d
WT2 = rng.normal(0, 0.5, (4, 3, 3, 3))       # conv_transpose2d, groups=1: (in, out, k, k)
WT1 = rng.normal(0, 0.5, (4, 3, 3))
WT3 = rng.normal(0, 0.5, (2, 2, 2, 2, 2))
B6, B3 = rng.normal(size=6), rng.normal(size=3)
C4 = rng.normal(size=4)
RM, RV = rng.normal(size=4), rng.uniform(0.5, 2, 4)
EMB = rng.normal(size=(7, 3))
IDX = np.array([[0, 3, 6], [2, 2, 5]])
Q, K, V = rng.normal(size=(2, 2, 4, 8)), rng.normal(size=(2, 2, 5, 8)), rng.normal(size=(2, 2, 5, 3))
BOOL_MASK = rng.uniform(size=(4, 5)) > 0.3
BOOL_MASK[1] = False  # a fully masked row: zeros, as torch
FLOAT_MASK = rng.normal(size=(2, 1, 4, 5))
KV1 = rng.normal(size=(2, 1, 5, 8)), rng.normal(size=(2, 1, 5, 3))

# id, ours(*args), torch(*args), args, indices of the differentiated args
ROWS = [
    ("relu", F.relu, TF.relu, [X], (0,)),
    ("relu6", F.relu6, TF.relu6, [X], (0,)),
    ("hardtanh", lambda x: F.hardtanh(x, -2.0, 3.0), lambda x: TF.hardtanh(x, -2.0, 3.0), [X], (0,)),
    ("hardswish", F.hardswish, TF.hardswish, [X], (0,)),
    ("hardsigmoid", F.hardsigmoid, TF.hardsigmoid, [X], (0,)),
    ("gelu", F.gelu, TF.gelu, [X], (0,)),
    ("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"), lambda x: TF.gelu(x, approximate="tanh"), [X], (0,)),
    ("silu", F.silu, TF.silu, [X], (0,)),
    ("mish", F.mish, TF.mish, [X], (0,)),
    ("softplus", lambda x: F.softplus(x, 2, 10), lambda x: TF.softplus(x, 2, 10), [X], (0,)),
    ("elu", lambda x: F.elu(x, 0.5), lambda x: TF.elu(x, 0.5), [X], (0,)),
    ("selu", F.selu, TF.selu, [X], (0,)),
    ("celu", lambda x: F.celu(x, 0.5), lambda x: TF.celu(x, 0.5), [X], (0,)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), lambda x: TF.leaky_relu(x, 0.2), [X], (0,)),
    ("prelu", F.prelu, TF.prelu, [X4, np.array([0.1, -0.2, 0.3, 0.25])], (0, 1)),
    ("logsigmoid", F.logsigmoid, TF.logsigmoid, [X], (0,)),
    ("softsign", F.softsign, TF.softsign, [X], (0,)),
    ("tanhshrink", F.tanhshrink, TF.tanhshrink, [X], (0,)),
    ("threshold", lambda x: F.threshold(x, 0.1, 20.0), lambda x: TF.threshold(x, 0.1, 20.0), [X], (0,)),
    ("glu", lambda x: F.glu(x, 1), lambda x: TF.glu(x, 1), [X], (0,)),
    ("softmax", lambda x: F.softmax(x, 1), lambda x: TF.softmax(x, 1), [X], (0,)),
    ("softmin", lambda x: F.softmin(x, 0), lambda x: TF.softmin(x, 0), [X], (0,)),
    ("log_softmax", lambda x: F.log_softmax(x, -1), lambda x: TF.log_softmax(x, -1), [X], (0,)),
    ("linear", F.linear, TF.linear, [X, rng.normal(size=(5, 8)), rng.normal(size=5)], (0, 1, 2)),
    ("linear-nobias", F.linear, TF.linear, [X, rng.normal(size=(5, 8))], (0, 1)),
    ("conv1d", lambda x, w, b: F.conv1d(x, w, b, 2, 1, 2, 2), lambda x, w, b: TF.conv1d(x, w, b, 2, 1, 2, 2),
     [X3, W1, B6], (0, 1, 2)),
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
     lambda x, w, b: TF.conv2d(x, w, b, stride=2, padding=1, groups=2), [X4, W2, B6], (0, 1, 2)),
    ("conv2d-same-dilated", lambda x, w: F.conv2d(x, w, None, 1, "same", 2, 2),
     lambda x, w: TF.conv2d(x, w, None, 1, "same", 2, 2), [X4, W2], (0, 1)),
    ("conv2d-unbatched", lambda x, w: F.conv2d(x, w, groups=2), lambda x, w: TF.conv2d(x, w, groups=2),
     [X4[0], W2], (0, 1)),
    ("conv3d", lambda x, w, b: F.conv3d(x, w, b, padding=(1, 0, 1)),
     lambda x, w, b: TF.conv3d(x, w, b, padding=(1, 0, 1)), [X5, W3, B3], (0, 1, 2)),
    ("conv_transpose1d", lambda x, w, b: F.conv_transpose1d(x, w, b, 2, 1, 1),
     lambda x, w, b: TF.conv_transpose1d(x, w, b, 2, 1, 1), [X3, WT1, B3], (0, 1, 2)),
    ("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1,
                                                             dilation=1),
     lambda x, w, b: TF.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1), [X4, WT2, B3], (0, 1, 2)),
    ("conv_transpose2d-groups-dilation", lambda x, w: F.conv_transpose2d(x, w, groups=2, dilation=2),
     lambda x, w: TF.conv_transpose2d(x, w, groups=2, dilation=2), [X4, WT2[:, :2]], (0, 1)),
    ("conv_transpose3d", lambda x, w: F.conv_transpose3d(x, w, stride=2), lambda x, w: TF.conv_transpose3d(x, w, stride=2),
     [X5, WT3], (0, 1)),
    ("max_pool1d", lambda x: F.max_pool1d(x, 3, 2, 1), lambda x: TF.max_pool1d(x, 3, 2, 1), [X3], (0,)),
    ("max_pool2d", lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2), [X4], (0,)),
    ("max_pool2d-ceil-dilation", lambda x: F.max_pool2d(x, 2, 2, 1, 2, ceil_mode=True),
     lambda x: TF.max_pool2d(x, 2, 2, 1, 2, ceil_mode=True), [X4], (0,)),
    ("avg_pool1d", lambda x: F.avg_pool1d(x, 3, 2, 1, True, False), lambda x: TF.avg_pool1d(x, 3, 2, 1, True, False),
     [X3], (0,)),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
     lambda x: TF.avg_pool2d(x, 3, 2, 1, ceil_mode=True), [X4], (0,)),
    ("avg_pool2d-divisor", lambda x: F.avg_pool2d(x, 2, divisor_override=3),
     lambda x: TF.avg_pool2d(x, 2, divisor_override=3), [X4], (0,)),
    ("adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, 3), lambda x: TF.adaptive_avg_pool1d(x, 3), [X3], (0,)),
    ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (2, 3)), lambda x: TF.adaptive_avg_pool2d(x, (2, 3)),
     [X4], (0,)),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (5, 5), w, b), lambda x, w, b: TF.layer_norm(x, (5, 5), w, b),
     [X4, rng.normal(size=(5, 5)), rng.normal(size=(5, 5))], (0, 1, 2)),
    ("layer_norm-plain", lambda x: F.layer_norm(x, 8), lambda x: TF.layer_norm(x, (8,)), [X], (0,)),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), lambda x, w, b: TF.group_norm(x, 2, w, b),
     [X4, C4, C4 + 1], (0, 1, 2)),
    ("batch_norm-eval", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b),
     lambda x, m, v, w, b: TF.batch_norm(x, m, v, w, b), [X4, RM, RV, C4, C4 + 1], (0, 3, 4)),
    ("batch_norm-train-no-stats", lambda x, w: F.batch_norm(x, None, None, w, training=True),
     lambda x, w: TF.batch_norm(x, None, None, w, training=True), [X3, C4], (0, 1)),
    ("embedding", lambda i, w: F.embedding(i, w, padding_idx=2), lambda i, w: TF.embedding(i, w, padding_idx=2),
     [IDX, EMB], (1,)),
    ("normalize", lambda x: F.normalize(x, dim=1), lambda x: TF.normalize(x, dim=1), [X], (0,)),
    ("normalize-p1-zero-row", lambda x: F.normalize(x, 1.0, -1), lambda x: TF.normalize(x, 1.0, -1),
     [np.concatenate([np.zeros((1, 8)), X[1:]])], (0,)),
    ("cosine_similarity", lambda a, b: F.cosine_similarity(a, b, dim=-1),
     lambda a, b: TF.cosine_similarity(a, b, dim=-1), [X, X[::-1] + 1], (0, 1)),
    ("cosine_similarity-broadcast", lambda a, b: F.cosine_similarity(a, b),
     lambda a, b: TF.cosine_similarity(a, b), [X4, X4[:1]], (0, 1)),
    ("pairwise_distance", F.pairwise_distance, TF.pairwise_distance, [X, X[::-1]], (0, 1)),
    ("pairwise_distance-p3-keepdim", lambda a, b: F.pairwise_distance(a, b, 3, keepdim=True),
     lambda a, b: TF.pairwise_distance(a, b, 3, keepdim=True), [X, X[::-1]], (0, 1)),
    ("pad-constant", lambda x: F.pad(x, (1, 2, -1, 1), value=0.5), lambda x: TF.pad(x, (1, 2, -1, 1), value=0.5),
     [X4], (0,)),
    ("pad-reflect", lambda x: F.pad(x, (2, 1, 1, 3), "reflect"), lambda x: TF.pad(x, (2, 1, 1, 3), "reflect"),
     [X4], (0,)),
    ("pad-replicate", lambda x: F.pad(x, (2, 1), "replicate"), lambda x: TF.pad(x, (2, 1), "replicate"), [X3], (0,)),
    ("pad-circular", lambda x: F.pad(x, (2, 1, 1, 3), "circular"), lambda x: TF.pad(x, (2, 1, 1, 3), "circular"),
     [X4], (0,)),
    ("sdpa", F.scaled_dot_product_attention, TF.scaled_dot_product_attention, [Q, K, V], (0, 1, 2)),
    ("sdpa-causal-scale", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
     lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3), [Q, K, V], (0, 1, 2)),
    ("sdpa-bool-mask", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, BOOL_MASK),
     lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, torch.from_numpy(BOOL_MASK)), [Q, K, V], (0, 1, 2)),
    ("sdpa-float-mask", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
     TF.scaled_dot_product_attention, [Q, K, V, FLOAT_MASK], (0, 1, 2, 3)),
    ("sdpa-gqa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
     lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, enable_gqa=True), [Q, *KV1], (0, 1, 2)),
    ("cross_entropy-NCd", lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1),
     lambda x, y: TF.cross_entropy(x, y, label_smoothing=0.1), [X4, rng.integers(0, 4, (2, 5, 5))], (0,)),
    ("nll_loss-NCd", lambda x, y: F.nll_loss(x, y, reduction="sum"), lambda x, y: TF.nll_loss(x, y, reduction="sum"),
     [X4, rng.integers(0, 4, (2, 5, 5))], (0,)),
]
TOL = {"float32": dict(rtol=2e-5, atol=2e-6), "float64": dict(rtol=1e-10, atol=1e-12)}


def _pair(args, dtype, diff):
    args = [a.astype(dtype) if a.dtype.kind == "f" else a for a in args]
    t_args = [torch.from_numpy(np.ascontiguousarray(a)).requires_grad_(i in diff) for i, a in enumerate(args)]
    return args, t_args


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_functional_equals_torch(row, dtype):
    _, ours, theirs, args, diff = row
    args, t_args = _pair(args, dtype, diff)
    t_out = theirs(*t_args)
    cot = np.random.default_rng(1).standard_normal(tuple(t_out.shape)).astype(dtype)
    (t_out * torch.from_numpy(cot)).sum().backward()
    with jax.enable_x64(dtype == "float64"):
        j_args = [jnp.asarray(a) for a in args]

        def value_and_vjp(*d):
            def f(*d):
                full = list(j_args)
                for i, v in zip(diff, d):
                    full[i] = v
                return ours(*full)

            out, vjp = jax.vjp(f, *d)
            return out, vjp(jnp.asarray(cot))

        out, grads = jax.jit(value_and_vjp)(*[j_args[i] for i in diff])
        assert out.dtype == np.dtype(dtype) and out.shape == tuple(t_out.shape)
        np.testing.assert_allclose(np.asarray(out), t_out.detach().numpy(), err_msg="value", **TOL[dtype])
        for i, g in zip(diff, grads):
            want = t_args[i].grad
            want = np.zeros(args[i].shape, dtype) if want is None else want.numpy()
            np.testing.assert_allclose(np.asarray(g), want, err_msg=f"gradient of arg {i}", **TOL[dtype])


@pytest.mark.parametrize("momentum", [0.1, 0.5])
def test_batch_norm_train_returns_torchs_new_running_stats(momentum):
    """torch mutates running_mean/running_var in place; F.batch_norm returns them."""
    x = X4.astype(np.float32)
    t_rm, t_rv = torch.tensor(RM, dtype=torch.float32), torch.tensor(RV, dtype=torch.float32)
    t_x = torch.from_numpy(x).requires_grad_()
    t_y = TF.batch_norm(t_x, t_rm, t_rv, torch.from_numpy(C4.astype(np.float32)), None, True, momentum)
    t_y.sum().backward()
    y, rm, rv = F.batch_norm(jnp.asarray(x), jnp.asarray(RM, jnp.float32), jnp.asarray(RV, jnp.float32),
                             jnp.asarray(C4, jnp.float32), None, training=True, momentum=momentum)
    np.testing.assert_allclose(np.asarray(y), t_y.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(rm), t_rm.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(rv), t_rv.numpy(), rtol=1e-5, atol=1e-7)
    g = jax.grad(lambda v: F.batch_norm(v, None, None, jnp.asarray(C4, jnp.float32), training=True).sum())(
        jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(g), t_x.grad.numpy(), atol=1e-5)


def test_one_hot_equals_torch():
    labels = np.array([[0, 3], [2, 1]])
    want = TF.one_hot(torch.from_numpy(labels)).numpy()
    np.testing.assert_array_equal(np.asarray(F.one_hot(labels)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda y: F.one_hot(y, 6))(labels)),
                                  TF.one_hot(torch.from_numpy(labels), 6).numpy())
    with pytest.raises(ValueError, match=r"one_hot: num_classes=-1 infers the count.*pass num_classes"):
        jax.jit(F.one_hot)(labels)
    with pytest.raises(ValueError, match=r"class values \[3\] are outside \[0, 2\]"):
        F.one_hot(labels, 3)


def test_dropout_and_sdpa_dropout_need_a_key_and_scale_what_they_keep():
    x = jnp.ones((2000,))
    with pytest.raises(ValueError, match=r"dropout\(p=0.5, training=True\) needs a PRNG key.*training=False"):
        F.dropout(x)
    np.testing.assert_array_equal(np.asarray(F.dropout(x, training=False)), np.asarray(x))
    y = np.asarray(F.dropout(x, 0.25, key=jax.random.key(0)))
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)} and abs((y == 0).mean() - 0.25) < 0.04
    q = jnp.asarray(Q, jnp.float32)
    with pytest.raises(ValueError, match=r"dropout_p=0.5 drops attention weights and needs a PRNG key"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    with pytest.raises(TypeError, match="key= is the PRNG key of attention dropout"):
        F.scaled_dot_product_attention(q, q, q, key=q)
    with pytest.raises(ValueError, match="pass either attn_mask or is_causal=True, not both"):
        F.scaled_dot_product_attention(q, q, q, BOOL_MASK[:4, :4], is_causal=True)
    # with dropout the output is softmax-weights dropped and rescaled, times v: the expectation is the plain output
    outs = jax.jit(jax.vmap(lambda k: F.scaled_dot_product_attention(q, q, q, dropout_p=0.3, key=k)))(
        jax.random.split(jax.random.key(1), 400))
    np.testing.assert_allclose(np.asarray(outs.mean(0)), np.asarray(F.scaled_dot_product_attention(q, q, q)),
                               atol=0.25)


def test_refused_options_are_named():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="size_average=True and reduce=None are deprecated"):
        F.mse_loss(x, x, True)
    with pytest.raises(ValueError, match="max_norm=1.0 is not supported"):
        F.embedding(jnp.zeros(2, jnp.int32), x, max_norm=1.0)
    v = np.array([[[1.0, 3.0, 2.0, 0.0, 5.0, 5.0]]], np.float32)  # no longer refused: torch's indices
    assert np.asarray(F.max_pool1d(jnp.asarray(v), 2, return_indices=True)[1]).tolist() == \
        TF.max_pool1d(torch.tensor(v), 2, return_indices=True)[1].tolist()
    with pytest.raises(ValueError, match=r"running_mean must be defined in evaluation mode"):
        F.batch_norm(x, None, None)
    with pytest.raises(ValueError, match=r"softmax\(dim=None\).*pass dim explicitly"):
        F.softmax(x)
    with pytest.raises(ValueError, match="out= is not supported"):
        F.normalize(x, out=x)
    with pytest.raises(ValueError, match=r"conv2d: expected a 3D \(unbatched\).*got shape \(1437, 64\).*"
                                         r"flat images\? x.reshape\(1437, C, H, W\)"):
        F.conv2d(jnp.zeros((1437, 64)), jnp.zeros((4, 1, 3, 3)))
    with pytest.raises(ValueError, match=r"glu: dimension 1 of the input of shape \(2, 3\) has odd size 3"):
        F.glu(x, 1)
