"""funcnet.nn.functional against torch.nn.functional, through one table: values and
gradients (jax.vjp with a fixed cotangent against torch's backward of the same), float32 and
float64, within tests/torch_oracle.py's bound of torch's float64 result. Each row is one compile
(jax.jit of the value and the vjp); inputs hit the kinks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from funcnet.nn import functional as F
from tests.torch_oracle import assert_function_close

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
P = 1 / (1 + np.exp(-X))  # probabilities for binary_cross_entropy
T01 = rng.uniform(size=X.shape)
SIGN = np.where(rng.uniform(size=3) > 0.5, 1.0, -1.0)
X3P = X3[:, :, :6]  # an even length for 2-windows
X5B = _x(1, 2, 4, 6, 4)
CTC_LENGTHS, CTC_TARGET_LENGTHS = np.array([6, 5]), np.array([3, 2])
CTC_TARGETS = np.array([[1, 2, 2], [3, 1, 0]])


ROWS += [
    ("sigmoid", F.sigmoid, torch.sigmoid, [X], (0,)),
    ("tanh", F.tanh, torch.tanh, [X], (0,)),
    ("max_pool1d_with_indices", lambda x: F.max_pool1d_with_indices(x, 3, 2, 1),
     lambda x: TF.max_pool1d_with_indices(x, 3, 2, 1), [X3], (0,)),
    ("max_pool2d_with_indices", lambda x: F.max_pool2d_with_indices(x, 2, ceil_mode=True),
     lambda x: TF.max_pool2d_with_indices(x, 2, ceil_mode=True), [X4], (0,)),
    ("max_pool3d_with_indices", lambda x: F.max_pool3d_with_indices(x, 2, 1),
     lambda x: TF.max_pool3d_with_indices(x, 2, 1), [X5], (0,)),
    ("max_pool3d", lambda x: F.max_pool3d(x, (2, 3, 2), padding=1), lambda x: TF.max_pool3d(x, (2, 3, 2), padding=1),
     [X5], (0,)),
    ("avg_pool3d", lambda x: F.avg_pool3d(x, 3, 2, 1, count_include_pad=False),
     lambda x: TF.avg_pool3d(x, 3, 2, 1, count_include_pad=False), [X5], (0,)),
    ("adaptive_avg_pool3d", lambda x: F.adaptive_avg_pool3d(x, (3, 2, 3)),
     lambda x: TF.adaptive_avg_pool3d(x, (3, 2, 3)), [X5], (0,)),
    ("adaptive_max_pool1d", lambda x: F.adaptive_max_pool1d(x, 3, True), lambda x: TF.adaptive_max_pool1d(x, 3, True),
     [X3], (0,)),
    ("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (2, 3)), lambda x: TF.adaptive_max_pool2d(x, (2, 3)),
     [X4], (0,)),
    ("adaptive_max_pool3d", lambda x: F.adaptive_max_pool3d(x, 2, return_indices=True),
     lambda x: TF.adaptive_max_pool3d(x, 2, return_indices=True), [X5], (0,)),
    ("max_unpool1d", lambda x: F.max_unpool1d(*F.max_pool1d(x, 2, return_indices=True), 2),
     lambda x: TF.max_unpool1d(*TF.max_pool1d(x, 2, return_indices=True), 2), [X3P], (0,)),
    ("max_unpool2d", lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2, output_size=(5, 5)),
     lambda x: TF.max_unpool2d(*TF.max_pool2d(x, 2, return_indices=True), 2, output_size=(5, 5)), [X4], (0,)),
    ("max_unpool3d", lambda x: F.max_unpool3d(*F.max_pool3d(x, 2, return_indices=True), 2),
     lambda x: TF.max_unpool3d(*TF.max_pool3d(x, 2, return_indices=True), 2), [X5B], (0,)),
    ("instance_norm", lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
     lambda x, w, b: TF.instance_norm(x, weight=w, bias=b), [X4, C4, C4 + 1], (0, 1, 2)),
    ("instance_norm-running-eval", lambda x: F.instance_norm(x, RM, RV, use_input_stats=False),
     lambda x: TF.instance_norm(x, torch.from_numpy(RM).to(x.dtype), torch.from_numpy(RV).to(x.dtype),
                                use_input_stats=False), [X3], (0,)),
    ("local_response_norm", lambda x: F.local_response_norm(x, 3, 1e-2, 0.75, 2.0),
     lambda x: TF.local_response_norm(x, 3, 1e-2, 0.75, 2.0), [X4], (0,)),
    ("one_hot", lambda y: F.one_hot(y, 8), lambda y: TF.one_hot(y, 8), [IDX], ()),
    # randomness: torch draws other masks, so the rows are the deterministic cases (eval, p=0); the
    # random masks' rate and scale are tested in tests/test_nn_dropout_reshape.py and below
    ("dropout-eval", lambda x: F.dropout(x, 0.5, training=False), lambda x: TF.dropout(x, 0.5, training=False),
     [X], (0,)),
    ("dropout-p0", lambda x: F.dropout(x, 0.0, key=jax.random.key(0)), lambda x: TF.dropout(x, 0.0), [X], (0,)),
    ("dropout2d-eval", lambda x: F.dropout2d(x, 0.5, training=False), lambda x: TF.dropout2d(x, 0.5, training=False),
     [X4], (0,)),
    ("dropout2d-p0", lambda x: F.dropout2d(x, 0.0, key=jax.random.key(0)), lambda x: TF.dropout2d(x, 0.0), [X4], (0,)),
    # torchvision.ops.stochastic_depth (not installed): eval is the identity, p=1 drops every row
    ("stochastic_depth-eval", lambda x: F.stochastic_depth(x, 0.5, "row", training=False), lambda x: x * 1, [X4],
     (0,)),
    ("stochastic_depth-p1", lambda x: F.stochastic_depth(x, 1.0, "row", key=jax.random.key(0)), lambda x: x * 0,
     [X4], (0,)),
    ("interpolate-bilinear-antialias", lambda x: F.interpolate(x, (3, 2), mode="bilinear", antialias=True),
     lambda x: TF.interpolate(x, (3, 2), mode="bilinear", antialias=True), [X4], (0,)),
    ("upsample", lambda x: F.upsample(x, scale_factor=2, mode="linear"),
     lambda x: TF.upsample(x, scale_factor=2, mode="linear"), [X3], (0,)),
    ("upsample_nearest", lambda x: F.upsample_nearest(x, (7, 9)), lambda x: TF.upsample_nearest(x, (7, 9)), [X4],
     (0,)),
    ("upsample_bilinear", lambda x: F.upsample_bilinear(x, scale_factor=1.5),
     lambda x: TF.upsample_bilinear(x, scale_factor=1.5), [X4], (0,)),
    ("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), lambda x: TF.pixel_shuffle(x, 2), [X4], (0,)),
    ("pixel_unshuffle", lambda x: F.pixel_unshuffle(x, 2), lambda x: TF.pixel_unshuffle(x, 2), [X4[..., :4, :4]],
     (0,)),
    ("mse_loss", F.mse_loss, TF.mse_loss, [X, X[::-1]], (0, 1)),
    ("l1_loss-sum", lambda a, b: F.l1_loss(a, b, reduction="sum"), lambda a, b: TF.l1_loss(a, b, reduction="sum"),
     [X, X[::-1]], (0, 1)),
    ("binary_cross_entropy", lambda p, t: F.binary_cross_entropy(p, t), lambda p, t: TF.binary_cross_entropy(p, t),
     [P, T01], (0, 1)),
    ("binary_cross_entropy_with_logits", lambda x, t, w: F.binary_cross_entropy_with_logits(x, t, pos_weight=w),
     lambda x, t, w: TF.binary_cross_entropy_with_logits(x, t, pos_weight=w), [X, T01, T01[0] + 0.5], (0, 1)),
    ("kl_div", lambda a, b: F.kl_div(a, b, reduction="batchmean"), lambda a, b: TF.kl_div(a, b, reduction="batchmean"),
     [np.log(P), T01], (0, 1)),
    ("kl_div-log_target", lambda a, b: F.kl_div(a, b, log_target=True), lambda a, b: TF.kl_div(a, b, log_target=True),
     [np.log(P), np.log(T01)], (0, 1)),
    ("smooth_l1_loss", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5), lambda a, b: TF.smooth_l1_loss(a, b, beta=0.5),
     [X, X[::-1]], (0, 1)),
    ("huber_loss", lambda a, b: F.huber_loss(a, b, reduction="none", delta=2.0),
     lambda a, b: TF.huber_loss(a, b, reduction="none", delta=2.0), [X, X[::-1]], (0, 1)),
    ("cosine_embedding_loss", lambda a, b, y: F.cosine_embedding_loss(a, b, y, 0.1),
     lambda a, b, y: TF.cosine_embedding_loss(a, b, y, 0.1), [X, X[::-1] + 1, SIGN], (0, 1)),
    ("margin_ranking_loss", lambda a, b, y: F.margin_ranking_loss(a, b, y, 0.5),
     lambda a, b, y: TF.margin_ranking_loss(a, b, y, 0.5), [X[:, 0], X[:, 1], SIGN], (0, 1)),
    ("triplet_margin_loss", lambda a, p, n: F.triplet_margin_loss(a, p, n, swap=True),
     lambda a, p, n: TF.triplet_margin_loss(a, p, n, swap=True), [X, X[::-1], X + 1], (0, 1, 2)),
    ("poisson_nll_loss", lambda a, b: F.poisson_nll_loss(a, b, full=True),
     lambda a, b: TF.poisson_nll_loss(a, b, full=True), [X, 3 * T01], (0,)),
    ("gaussian_nll_loss", lambda a, b, v: F.gaussian_nll_loss(a, b, v, full=True),
     lambda a, b, v: TF.gaussian_nll_loss(a, b, v, full=True), [X, X[::-1], T01 + 0.1], (0, 1, 2)),
    # torch's CTC gradient is the logits' (it assumes log_softmax before it): both run on log_softmax
    ("ctc_loss", lambda x: F.ctc_loss(F.log_softmax(x, 2), CTC_TARGETS, CTC_LENGTHS, CTC_TARGET_LENGTHS),
     lambda x: TF.ctc_loss(TF.log_softmax(x, 2), torch.from_numpy(CTC_TARGETS), torch.from_numpy(CTC_LENGTHS),
                           torch.from_numpy(CTC_TARGET_LENGTHS)), [_x(6, 2, 4)], (0,)),
]


def _pair(args, dtype, diff):
    args = [a.astype(dtype) if a.dtype.kind == "f" else a for a in args]
    t_args = [torch.from_numpy(np.ascontiguousarray(a)).requires_grad_(i in diff) for i, a in enumerate(args)]
    return args, t_args


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_functional_equals_torch(row, dtype):
    """A row's output is one array, or (values, indices) as torch's ``return_indices``: the
    values are differentiated, the indices compared exactly."""
    _, ours, theirs, args, diff = row
    args, t_args = _pair(args, dtype, diff)
    t_all = theirs(*t_args)
    t_out, t_rest = (t_all[0], t_all[1:]) if isinstance(t_all, tuple) else (t_all, ())
    with jax.enable_x64(dtype == "float64"):
        j_args = [jnp.asarray(a) for a in args]
        if not t_out.is_floating_point():  # one_hot: integers, nothing to differentiate
            np.testing.assert_array_equal(np.asarray(jax.jit(ours)(*j_args)), t_out.numpy())
            return
        cot = np.random.default_rng(1).standard_normal(tuple(t_out.shape)).astype(dtype)
        (t_out * torch.from_numpy(cot)).sum().backward()

        def value_and_vjp(*d):
            def f(*d):
                full = list(j_args)
                for i, v in zip(diff, d):
                    full[i] = v
                out = ours(*full)
                return (out[0], tuple(out[1:])) if isinstance(out, tuple) else (out, ())

            out, vjp, rest = jax.vjp(f, *d, has_aux=True)
            return out, rest, vjp(jnp.asarray(cot))

        out, rest, grads = jax.jit(value_and_vjp)(*[j_args[i] for i in diff])
        assert out.dtype == np.dtype(dtype) and out.shape == tuple(t_out.shape)
        assert len(rest) == len(t_rest)
        for got, want in zip(rest, t_rest):
            np.testing.assert_array_equal(np.asarray(got), want.numpy(), err_msg="indices")
        t_grads = [torch.zeros(args[i].shape, dtype=t_out.dtype) if t_args[i].grad is None else t_args[i].grad
                   for i in diff]
        # within check_layer's bound of torch's float64 value and gradients (tests/torch_oracle.py)
        assert_function_close(row[0], (np.asarray(out), [np.asarray(g) for g in grads]), (t_out, t_grads), theirs,
                              args, diff, cot, dtype)


def _called(fn) -> set:
    """The ``F`` names a row's function calls: its own name, or those its lambda looks up on ``F``."""
    return set(fn.__code__.co_names) & set(F.__all__) if fn.__name__ == "<lambda>" else {fn.__name__}


def test_the_table_calls_every_exported_function():
    # every name of funcnet.nn.functional is a function of tensors with a torch counterpart (or, for
    # torchvision's stochastic_depth, a closed form), so no name is exempt
    missing = sorted(set(F.__all__) - set().union(*(_called(row[1]) for row in ROWS)))
    assert not missing, f"funcnet.nn.functional exports {missing}, which no row of ROWS compares with torch"


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
