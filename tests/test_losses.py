"""Losses against torch.nn.functional."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from funcnet import losses


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_equals_torch(reduction):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (64, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 64)
    ours = losses.cross_entropy(jnp.asarray(logits), jnp.asarray(labels, jnp.int32), reduction=reduction)
    theirs = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels), reduction=reduction)
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_equals_torch(reduction):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 16, 3)).astype(np.float32)
    ours = losses.mse_loss(jnp.asarray(a), jnp.asarray(b), reduction=reduction)
    theirs = F.mse_loss(torch.from_numpy(a), torch.from_numpy(b), reduction=reduction)
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=1.3e-6, atol=1e-6)


def test_accuracy_closed_form():
    logits = jnp.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, 1.0]])
    assert float(losses.accuracy(logits, jnp.array([0, 1, 1, 1]))) == 0.75


def test_label_errors_name_shape_and_dtype():
    logits = jnp.zeros((8, 10))
    with pytest.raises(ValueError, match=r"labels of shape \(8, 1\).*expected integer class indices of shape \(8,\)"):
        losses.cross_entropy(logits, jnp.zeros((8, 1), jnp.int32))
    with pytest.raises(ValueError, match="one-hot"):
        losses.cross_entropy(logits, jnp.zeros((8, 10), jnp.int32))
    with pytest.raises(TypeError, match="labels have dtype float32, expected integer"):
        losses.cross_entropy(logits, jnp.zeros((8,), jnp.float32))
    with pytest.raises(ValueError, match="reduction must be one of"):
        losses.cross_entropy(logits, jnp.zeros((8,), jnp.int32), reduction="avg")
    with pytest.raises(ValueError, match=r"pred of shape \(3,\) and target of shape \(4,\)"):
        losses.mse_loss(jnp.zeros(3), jnp.zeros(4))


# ---------------------------------------------------------------------------------------------
# The table: every loss x reduction x options against torch.nn.functional, values and gradients
# (jax.vjp with a fixed cotangent vs torch's backward of the same), float32 and float64.

import jax  # noqa: E402

N, C = 6, 5
_rng = np.random.default_rng(7)
LOGITS = _rng.normal(0, 2, (N, C))
LABELS = np.array([0, 4, 2, 2, 1, 3])
LABELS_IGN = np.array([0, -100, 2, 2, -100, 3])  # torch's default ignore_index
LABELS_IGN2 = np.array([0, 4, 2, 2, 1, 2])  # ignore_index=2 inside [0, C)
WEIGHT = np.array([0.5, 2.0, 1.0, 0.1, 3.0])
PROBS = _rng.dirichlet(np.ones(C), N)
LOGITS_4D = _rng.normal(0, 2, (2, C, 3, 2))  # torch's (N, C, d1, d2)
LABELS_4D = np.array([[[0, 1], [4, -100], [2, 2]], [[3, 3], [1, 0], [-100, 4]]])
PROBS_4D = np.moveaxis(_rng.dirichlet(np.ones(C), (2, 3, 2)), -1, 1)
LOGITS_BTV = _rng.normal(0, 2, (2, 3, C))  # a GPT's (B, T, V), classes last
LABELS_BT = np.array([[0, 1, 4], [2, -100, 3]])
X = _rng.normal(0, 1.5, (4, 3))
Y = _rng.normal(0, 1.5, (4, 3))
T01 = _rng.uniform(0, 1, (4, 3))  # soft binary targets
BIN = (_rng.uniform(0, 1, (4, 3)) > 0.5).astype(float)
W_BCE = _rng.uniform(0.2, 2, (4, 1))  # broadcasts over classes
POS_W = np.array([0.5, 3.0, 1.0])  # one per class, broadcast along the last axis
PROB_IN = _rng.uniform(0.02, 0.98, (4, 3))
PROB_EDGE = PROB_IN.copy()
PROB_EDGE[0, :2] = (0.0, 1.0)
PROB_EDGE[1, :2] = (1e-50, 1.0)  # log clamped at -100 (float64; 0 in float32)
LOGP = np.log(_rng.dirichlet(np.ones(3), 4))
PROBS_0 = _rng.dirichlet(np.ones(3), 4)
PROBS_0[0, 1] = 0.0  # t = 0 contributes 0, as torch's xlogy
Y_KINK = X.copy()
Y_KINK[0] = X[0]  # a zero difference: the gradient there is 0
Y_KINK[1, 0] = X[1, 0] - 1.0  # |d| = beta = delta exactly
Y_KINK[2:] = Y[2:]
PM1 = np.array([1, -1, 1, -1])
PM1F = np.array([1.0, -1.0, -1.0, 1.0])
COUNTS = _rng.poisson(2.0, (4, 3)).astype(float)
VAR = _rng.uniform(0.1, 2.0, (4, 3))
VAR[0, 0] = 1e-8  # clamped to eps, the gradient passing as if not
PROBS_POS = _rng.dirichlet(np.ones(3), 4)

FT = F.cross_entropy
CASES = [
    # id, ours(*args, reduction), torch(*args, reduction), args, the differentiated args (torch has no
    # gradient for weight and pos_weight)
    ("ce", lambda x, y, r: losses.cross_entropy(x, y, reduction=r),
     lambda x, y, r: FT(x, y, reduction=r), (LOGITS, LABELS), (0,)),
    ("ce-weight", lambda x, y, w, r: losses.cross_entropy(x, y, w, reduction=r),
     lambda x, y, w, r: FT(x, y, w, reduction=r), (LOGITS, LABELS, WEIGHT), (0,)),
    ("ce-ignore", lambda x, y, r: losses.cross_entropy(x, y, reduction=r),
     lambda x, y, r: FT(x, y, reduction=r), (LOGITS, LABELS_IGN), (0,)),
    ("ce-ignore2-weight", lambda x, y, w, r: losses.cross_entropy(x, y, w, ignore_index=2, reduction=r),
     lambda x, y, w, r: FT(x, y, w, ignore_index=2, reduction=r), (LOGITS, LABELS_IGN2, WEIGHT), (0,)),
    ("ce-smooth", lambda x, y, r: losses.cross_entropy(x, y, reduction=r, label_smoothing=0.1),
     lambda x, y, r: FT(x, y, reduction=r, label_smoothing=0.1), (LOGITS, LABELS), (0,)),
    ("ce-smooth-weight-ignore", lambda x, y, w, r: losses.cross_entropy(x, y, w, reduction=r, label_smoothing=0.3),
     lambda x, y, w, r: FT(x, y, w, reduction=r, label_smoothing=0.3), (LOGITS, LABELS_IGN, WEIGHT), (0,)),
    ("ce-probs", lambda x, p, r: losses.cross_entropy(x, p, reduction=r),
     lambda x, p, r: FT(x, p, reduction=r), (LOGITS, PROBS), (0, 1)),
    ("ce-probs-weight-smooth", lambda x, p, w, r: losses.cross_entropy(x, p, w, reduction=r, label_smoothing=0.2),
     lambda x, p, w, r: FT(x, p, w, reduction=r, label_smoothing=0.2), (LOGITS, PROBS, WEIGHT), (0, 1)),
    ("ce-NCd-axis1-weight-ignore-smooth",
     lambda x, y, w, r: losses.cross_entropy(x, y, w, reduction=r, label_smoothing=0.1, class_axis=1),
     lambda x, y, w, r: FT(x, y, w, reduction=r, label_smoothing=0.1), (LOGITS_4D, LABELS_4D, WEIGHT), (0,)),
    ("ce-NCd-axis1-probs", lambda x, p, r: losses.cross_entropy(x, p, reduction=r, class_axis=1),
     lambda x, p, r: FT(x, p, reduction=r), (LOGITS_4D, PROBS_4D), (0, 1)),
    ("ce-BTV-classes-last", lambda x, y, w, r: losses.cross_entropy(x, y, w, reduction=r),
     lambda x, y, w, r: FT(x.permute(0, 2, 1), y, w, reduction=r), (LOGITS_BTV, LABELS_BT, WEIGHT), (0,)),
    ("ce-unbatched", lambda x, y, r: losses.cross_entropy(x, y, reduction=r, label_smoothing=0.1),
     lambda x, y, r: FT(x, y, reduction=r, label_smoothing=0.1), (LOGITS[0], np.array(3)), (0,)),
    ("nll", lambda x, y, r: losses.nll_loss(x, y, reduction=r),
     lambda x, y, r: F.nll_loss(x, y, reduction=r), (LOGITS, LABELS), (0,)),
    ("nll-weight-ignore", lambda x, y, w, r: losses.nll_loss(x, y, w, reduction=r),
     lambda x, y, w, r: F.nll_loss(x, y, w, reduction=r), (LOGITS, LABELS_IGN, WEIGHT), (0,)),
    ("nll-NCd-axis1-ignore2", lambda x, y, w, r: losses.nll_loss(x, y, w, ignore_index=2, reduction=r, class_axis=1),
     lambda x, y, w, r: F.nll_loss(x, y, w, ignore_index=2, reduction=r), (LOGITS_4D, np.abs(LABELS_4D) % C, WEIGHT), (0,)),
    ("mse", lambda a, b, r: losses.mse_loss(a, b, reduction=r),
     lambda a, b, r: F.mse_loss(a, b, reduction=r), (X, Y), (0, 1)),
    ("l1", lambda a, b, r: losses.l1_loss(a, b, reduction=r),
     lambda a, b, r: F.l1_loss(a, b, reduction=r), (X, Y), (0, 1)),
    ("bce", lambda x, t, r: losses.binary_cross_entropy_with_logits(x, t, reduction=r),
     lambda x, t, r: F.binary_cross_entropy_with_logits(x, t, reduction=r), (X, T01), (0, 1)),
    ("bce-weight", lambda x, t, w, r: losses.binary_cross_entropy_with_logits(x, t, w, reduction=r),
     lambda x, t, w, r: F.binary_cross_entropy_with_logits(x, t, w, reduction=r), (X, BIN, W_BCE), (0,)),
    ("bce-pos_weight", lambda x, t, pw, r: losses.binary_cross_entropy_with_logits(x, t, reduction=r, pos_weight=pw),
     lambda x, t, pw, r: F.binary_cross_entropy_with_logits(x, t, reduction=r, pos_weight=pw),
     (X, T01, POS_W), (0, 1)),
    ("bce-weight-pos_weight",
     lambda x, t, w, pw, r: losses.binary_cross_entropy_with_logits(x, t, w, reduction=r, pos_weight=pw),
     lambda x, t, w, pw, r: F.binary_cross_entropy_with_logits(x, t, w, reduction=r, pos_weight=pw),
     (X, BIN, W_BCE, POS_W), (0,)),
    # probabilities in, torch's clamp of each log at -100: exact 0 and 1 among the inputs (their
    # gradient is torch's finite formula)
    ("bce-probs", lambda x, t, r: losses.binary_cross_entropy(x, t, reduction=r),
     lambda x, t, r: F.binary_cross_entropy(x, t, reduction=r), (PROB_IN, T01), (0, 1)),
    ("bce-probs-weight-01", lambda x, t, w, r: losses.binary_cross_entropy(x, t, w, reduction=r),
     lambda x, t, w, r: F.binary_cross_entropy(x, t, w, reduction=r), (PROB_EDGE, BIN, W_BCE), (0,)),
    # a zero target contributes 0 (torch's xlogy); torch's gradient with respect to it is NaN, so
    # the target is differentiated on positive targets only
    ("kl_div-zero-target", lambda x, t, r: losses.kl_div(x, t, reduction=r),
     lambda x, t, r: F.kl_div(x, t, reduction=r), (LOGP, PROBS_0), (0,)),
    ("kl_div", lambda x, t, r: losses.kl_div(x, t, reduction=r),
     lambda x, t, r: F.kl_div(x, t, reduction=r), (LOGP, PROBS_POS), (0, 1)),
    ("kl_div-log_target", lambda x, t, r: losses.kl_div(x, t, reduction=r, log_target=True),
     lambda x, t, r: F.kl_div(x, t, reduction=r, log_target=True), (LOGP, LOGP[::-1].copy()), (0, 1)),
    ("smooth_l1", lambda a, b, r: losses.smooth_l1_loss(a, b, reduction=r),
     lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r), (X, Y_KINK), (0, 1)),
    ("smooth_l1-beta0.5", lambda a, b, r: losses.smooth_l1_loss(a, b, reduction=r, beta=0.5),
     lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=0.5), (X, Y), (0, 1)),
    ("smooth_l1-beta0", lambda a, b, r: losses.smooth_l1_loss(a, b, reduction=r, beta=0.0),
     lambda a, b, r: F.smooth_l1_loss(a, b, reduction=r, beta=0.0), (X, Y_KINK), (0, 1)),
    ("huber", lambda a, b, r: losses.huber_loss(a, b, reduction=r),
     lambda a, b, r: F.huber_loss(a, b, reduction=r), (X, Y_KINK), (0, 1)),
    ("huber-delta2", lambda a, b, r: losses.huber_loss(a, b, reduction=r, delta=2.0),
     lambda a, b, r: F.huber_loss(a, b, reduction=r, delta=2.0), (X, Y), (0, 1)),
    ("cosine_embedding", lambda a, b, y, r: losses.cosine_embedding_loss(a, b, y, reduction=r, margin=0.1),
     lambda a, b, y, r: F.cosine_embedding_loss(a, b, y, reduction=r, margin=0.1), (X, Y, PM1), (0, 1)),
    ("margin_ranking", lambda a, b, y, r: losses.margin_ranking_loss(a, b, y, reduction=r, margin=0.5),
     lambda a, b, y, r: F.margin_ranking_loss(a, b, y, reduction=r, margin=0.5), (X[:, 0], Y[:, 0], PM1F), (0, 1)),
    ("triplet_margin", lambda a, p, n, r: losses.triplet_margin_loss(a, p, n, reduction=r),
     lambda a, p, n, r: F.triplet_margin_loss(a, p, n, reduction=r), (X, Y, T01), (0, 1, 2)),
    ("triplet_margin-p1-swap", lambda a, p, n, r: losses.triplet_margin_loss(a, p, n, reduction=r, p=1, swap=True,
                                                                             margin=2.0),
     lambda a, p, n, r: F.triplet_margin_loss(a, p, n, reduction=r, p=1, swap=True, margin=2.0), (X, Y, T01),
     (0, 1, 2)),
    ("poisson_nll", lambda x, t, r: losses.poisson_nll_loss(x, t, reduction=r),
     lambda x, t, r: F.poisson_nll_loss(x, t, reduction=r), (X, COUNTS), (0, 1)),
    ("poisson_nll-rate-full", lambda x, t, r: losses.poisson_nll_loss(x, t, reduction=r, log_input=False, full=True),
     lambda x, t, r: F.poisson_nll_loss(x, t, reduction=r, log_input=False, full=True), (T01 + 0.5, COUNTS + 1), (0, 1)),
    ("gaussian_nll", lambda x, t, v, r: losses.gaussian_nll_loss(x, t, v, reduction=r),
     lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r), (X, Y, VAR), (0, 1, 2)),
    ("gaussian_nll-per-example-var-full", lambda x, t, v, r: losses.gaussian_nll_loss(x, t, v, reduction=r, full=True),
     lambda x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r, full=True), (X, Y, VAR[:, 0]), (0, 1, 2)),
]
TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-10, atol=1e-12)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_loss_table_equals_torch(case, reduction, dtype):
    _, ours, theirs, args, diff = case
    args = [a.astype(dtype) if a.dtype.kind == "f" else a for a in args]
    t_args = [torch.from_numpy(a.copy()).requires_grad_(i in diff) for i, a in enumerate(args)]
    t_out = theirs(*t_args, reduction)
    cot = np.random.default_rng(1).standard_normal(tuple(t_out.shape)).astype(dtype)
    (t_out * torch.from_numpy(cot)).sum().backward()
    with jax.enable_x64(dtype == "float64"):
        j_args = [jnp.asarray(a) for a in args]

        def f(*d):
            full = list(j_args)
            for i, v in zip(diff, d):
                full[i] = v
            return ours(*full, reduction)

        def value_and_vjp(*d):  # jitted: one compile per case (eager op-by-op compiles cost more), as a step runs
            out, vjp = jax.vjp(f, *d)
            return out, vjp(jnp.asarray(cot))

        out, grads = jax.jit(value_and_vjp)(*[j_args[i] for i in diff])
        assert out.dtype == np.dtype(dtype) and out.shape == tuple(t_out.shape)
        np.testing.assert_allclose(np.asarray(out), t_out.detach().numpy(), err_msg="loss", **TOL[dtype])
        for i, g in zip(diff, grads):
            np.testing.assert_allclose(np.asarray(g), t_args[i].grad.numpy(), err_msg=f"gradient of arg {i}",
                                       **TOL[dtype])


def test_weighted_mean_closed_form():
    # the weighted mean divides by the summed weights of the non-ignored targets, not by N
    logits = jnp.zeros((3, 2))  # log p = log(1/2) everywhere
    w = jnp.array([1.0, 3.0])
    got = losses.cross_entropy(logits, jnp.array([0, 1, -100]), w)
    np.testing.assert_allclose(float(got), np.log(2.0), rtol=1e-6)  # (1 + 3) log 2 / (1 + 3)
    got = losses.cross_entropy(logits, jnp.array([0, 1, -100]), w, reduction="sum")
    np.testing.assert_allclose(float(got), 4 * np.log(2.0), rtol=1e-6)


def test_all_ignored_mean_is_nan_as_torch():
    labels = np.full(3, -100)
    assert torch.isnan(F.cross_entropy(torch.zeros(3, 4), torch.from_numpy(labels)))
    assert np.isnan(float(losses.cross_entropy(jnp.zeros((3, 4)), jnp.asarray(labels))))


@pytest.mark.parametrize("fn", [losses.cross_entropy, losses.nll_loss], ids=["cross_entropy", "nll_loss"])
def test_out_of_range_label_raises_eagerly_and_is_nan_under_jit(fn):
    logits = jnp.asarray(LOGITS, jnp.float32)
    for bad in (5, -1, 100):
        labels = jnp.asarray(LABELS).at[1].set(bad)
        with pytest.raises(ValueError, match=rf"labels \[{bad}\] are outside the 5 classes \[0, 4\] and are not "
                                             r"ignore_index=-100"):
            fn(logits, labels)
        for reduction in ("mean", "sum"):
            assert np.isnan(float(jax.jit(lambda x, y: fn(x, y, reduction=reduction))(logits, labels)))
        per = np.asarray(jax.jit(lambda x, y: fn(x, y, reduction="none"))(logits, labels))
        assert np.isnan(per[1]) and np.isfinite(np.delete(per, 1)).all()
    # an out-of-range value that *is* the ignore_index is ignored, not an error
    assert np.isfinite(float(fn(logits, jnp.asarray(LABELS).at[1].set(-7), ignore_index=-7)))


def test_torch_layout_hint_and_argument_errors():
    with pytest.raises(ValueError, match=r"expected integer class indices of shape \(2, 5\).*pass class_axis=1"):
        losses.cross_entropy(jnp.zeros((2, 5, 3)), jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(ValueError, match=r"weight of shape \(4,\) must have one entry per class, expected shape \(5,\)"):
        losses.cross_entropy(jnp.zeros((2, 5)), jnp.zeros(2, jnp.int32), jnp.ones(4))
    with pytest.raises(ValueError, match=r"label_smoothing must be a number in \[0, 1\], got 1.5"):
        losses.cross_entropy(jnp.zeros((2, 5)), jnp.zeros(2, jnp.int32), label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"class_axis=2 is not an axis of logits of shape \(2, 5\)"):
        losses.cross_entropy(jnp.zeros((2, 5)), jnp.zeros(2, jnp.int32), class_axis=2)
    with pytest.raises(ValueError, match="reduction must be one of"):
        losses.cross_entropy(jnp.zeros((2, 5)), jnp.zeros((2, 5)), reduction="avg")
    with pytest.raises(ValueError, match=r"input of shape \(4, 3\) and target of shape \(4,\) differ"):
        losses.binary_cross_entropy_with_logits(jnp.zeros((4, 3)), jnp.zeros(4))
    with pytest.raises(ValueError, match=r"pos_weight of shape \(2,\) does not broadcast to the input's shape \(4, 3\)"):
        losses.binary_cross_entropy_with_logits(jnp.zeros((4, 3)), jnp.zeros((4, 3)), pos_weight=jnp.ones(2))
    with pytest.raises(ValueError, match=r"l1_loss: pred of shape \(3,\) and target of shape \(4,\) differ"):
        losses.l1_loss(jnp.zeros(3), jnp.zeros(4))


def test_kl_div_batchmean_and_bce_clamp_closed_form():
    lp, t = LOGP.astype(np.float32), PROBS_0.astype(np.float32)
    got = losses.kl_div(jnp.asarray(lp), jnp.asarray(t), reduction="batchmean")
    want = F.kl_div(torch.from_numpy(lp), torch.from_numpy(t), reduction="batchmean")
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    # a probability of exactly 0 for a target of 1: torch's clamp gives 100, not inf
    assert float(losses.binary_cross_entropy(jnp.zeros(1), jnp.ones(1))) == 100.0
    with pytest.raises(ValueError, match=r"all elements of input should be between 0 and 1.*\[-0.5, 0.5\].*with_logits"):
        losses.binary_cross_entropy(jnp.array([-0.5, 0.5]), jnp.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="var has negative entry"):
        losses.gaussian_nll_loss(jnp.zeros(2), jnp.zeros(2), jnp.array([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"var is of incorrect size: got shape \(3,\) for an input of shape \(4, 3\)"):
        losses.gaussian_nll_loss(jnp.zeros((4, 3)), jnp.zeros((4, 3)), jnp.ones(3))


CTC_T, CTC_N, CTC_C = 12, 3, 5
_logits = _rng.normal(size=(CTC_T, CTC_N, CTC_C))
CTC_LP = _logits - np.log(np.exp(_logits).sum(-1, keepdims=True))  # log_softmax in float64
CTC_TARGETS = np.array([[1, 2, 2, 4], [3, 3, 0, 0], [4, 1, 2, 3]])  # (N, S) padded; row 1 has a repeat
CTC_IN_LEN = np.array([12, 9, 4])  # row 2: 4 frames for 4 labels is possible, no repeats
CTC_TGT_LEN = np.array([4, 2, 4])
REDUCTIONS = ("none", "mean", "sum")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ctc_loss_equals_torch(dtype):
    """Every reduction's value and gradient from one compiled function (optax's scan compiles
    slowly): the vjp is pulled back once per reduction's cotangent."""
    lp = CTC_LP.astype(dtype)
    args = (torch.from_numpy(CTC_TARGETS), torch.from_numpy(CTC_IN_LEN), torch.from_numpy(CTC_TGT_LEN))
    cots, t_outs, t_grads = [], [], []
    for i, reduction in enumerate(REDUCTIONS):
        t_lp = torch.from_numpy(lp.copy()).requires_grad_()
        t_out = F.ctc_loss(t_lp, *args, reduction=reduction)
        cot = np.random.default_rng(2 + i).standard_normal(tuple(t_out.shape)).astype(dtype)
        (t_out * torch.from_numpy(cot)).sum().backward()
        cots.append(cot)
        t_outs.append(t_out.detach().numpy())
        t_grads.append(t_lp.grad.numpy())
    with jax.enable_x64(dtype == "float64"):
        def all_reductions(v, cots):
            outs, vjp = jax.vjp(lambda u: tuple(losses.ctc_loss(u, CTC_TARGETS, CTC_IN_LEN, CTC_TGT_LEN, reduction=r)
                                                for r in REDUCTIONS), v)
            zeros = [jnp.zeros_like(o) for o in outs]
            grads = [vjp(tuple(c if j == i else zeros[j] for j, c in enumerate(cots)))[0] for i in range(3)]
            return outs, grads

        outs, grads = jax.jit(all_reductions)(jnp.asarray(lp), tuple(jnp.asarray(c) for c in cots))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-10)
    for reduction, out, g, t_out, t_grad in zip(REDUCTIONS, outs, grads, t_outs, t_grads):
        np.testing.assert_allclose(np.asarray(out), t_out, err_msg=f"{reduction} value", **tol)
        np.testing.assert_allclose(np.asarray(g), t_grad, err_msg=f"{reduction} gradient", **tol)


def test_ctc_loss_impossible_alignment_concatenated_targets_and_zero_infinity():
    lp = jnp.asarray(CTC_LP, jnp.float32)
    in_len = np.array([12, 2, 4])  # row 1: 2 frames for "3 3" needs 3 (a blank between the repeats): inf
    flat = np.concatenate([CTC_TARGETS[i, :n] for i, n in enumerate(CTC_TGT_LEN)])

    def ours(v):  # one compile: torch's concatenated targets are concrete here (closed over)
        none = losses.ctc_loss(v, flat, in_len, CTC_TGT_LEN, reduction="none")
        zeroed = losses.ctc_loss(v, CTC_TARGETS, in_len, CTC_TGT_LEN, reduction="none", zero_infinity=True)
        g = jax.grad(lambda u: losses.ctc_loss(u, CTC_TARGETS, in_len, CTC_TGT_LEN, zero_infinity=True))(v)
        return none, zeroed, g

    got = jax.jit(ours)(lp)
    for zero_infinity, value in ((False, got[0]), (True, got[1])):
        want = F.ctc_loss(torch.from_numpy(CTC_LP.astype(np.float32)), torch.from_numpy(flat),
                          torch.from_numpy(in_len), torch.from_numpy(CTC_TGT_LEN), reduction="none",
                          zero_infinity=zero_infinity).numpy()
        assert np.isinf(want[1]) != zero_infinity
        np.testing.assert_allclose(np.asarray(value), want, rtol=1e-5)
    g = np.asarray(got[2])
    assert np.isfinite(g).all() and not g[:, 1].any()  # zero_infinity: no gradient from the impossible row
