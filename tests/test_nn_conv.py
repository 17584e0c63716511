"""Convolutions against torch: one table of configurations through tests/torch_oracle.check_layer
(forward, input and weight gradients, state_dict keys/shapes/dtypes, one compile) in train and
eval mode, float32 and float64; torch's repr; the default init distribution (KS tests against
torch's draws, as tests/test_init.py); the errors; a conv net loading a torch twin's state_dict.

Tolerances are check_layer's defaults (float32 1e-5 relative / 1e-6 absolute, float64
1e-10 / 1e-12): a convolution here sums at most ~50 products per output, and weight gradients
sum ~100 products, far from where float32 rounding reaches 1e-5 relative.
"""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from scipy import stats

from funcnet import nn
from funcnet.nn.functional import conv_strategy, conv_winograd
from funcnet.nn.functional.conv_strategy import strategy
from tests.torch_oracle import check_layer

# (id, class name, args, kwargs, input shape): the same arguments build both layers
TABLE = [
    ("2d-basic", "Conv2d", (3, 4, 3), {}, (2, 3, 7, 6)),
    ("2d-stride2-pad1-unbatched", "Conv2d", (3, 4, 3), dict(stride=2, padding=1), (3, 7, 6)),
    ("2d-rect-tuples-dilation", "Conv2d", (3, 4, (2, 3)), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2)),
     (2, 3, 7, 8)),
    ("2d-same-groups2", "Conv2d", (4, 6, 3), dict(padding="same", groups=2), (2, 4, 6, 5)),
    # even kernel with dilation: torch puts the odd extra padding on the right/bottom
    ("2d-same-even-depthwise", "Conv2d", (4, 4, (2, 4)), dict(padding="same", dilation=(2, 1), groups=4),
     (2, 4, 6, 7)),
    ("2d-depthwise-x3-valid-nobias", "Conv2d", (2, 6, 3), dict(groups=2, padding="valid", bias=False),
     (2, 2, 5, 6)),
    ("2d-reflect", "Conv2d", (2, 4, 3), dict(padding=2, padding_mode="reflect"), (2, 2, 5, 6)),
    ("2d-replicate-stride2", "Conv2d", (2, 4, 3), dict(stride=2, padding=(1, 2), padding_mode="replicate"),
     (2, 2, 5, 6)),
    ("2d-same-circular", "Conv2d", (2, 3, (2, 3)), dict(padding="same", padding_mode="circular"), (2, 2, 5, 6)),
    ("1d-stride-dilation-unbatched", "Conv1d", (3, 4, 3), dict(stride=2, padding=1, dilation=2), (3, 9)),
    ("1d-same-even-depthwise", "Conv1d", (4, 4, 4), dict(padding="same", groups=4, bias=False), (2, 4, 7)),
    ("3d", "Conv3d", (2, 3, (2, 3, 2)), dict(stride=(1, 2, 1), padding=1), (2, 2, 3, 5, 3)),
    ("T2d-stride-unbatched", "ConvTranspose2d", (3, 4, 3), dict(stride=2), (3, 4, 3)),
    ("T2d-stride-outpad-groups", "ConvTranspose2d", (4, 6, 3), dict(stride=2, padding=1, output_padding=1, groups=2),
     (2, 4, 5, 4)),
    ("T2d-rect-dilation-nobias", "ConvTranspose2d", (3, 2, (2, 3)),
     dict(stride=(2, 3), padding=(0, 1), output_padding=(1, 0), dilation=(2, 1), bias=False), (2, 3, 4, 5)),
    # output_padding < dilation (not < stride) is allowed too
    ("T2d-outpad-by-dilation", "ConvTranspose2d", (2, 3, 2), dict(output_padding=1, dilation=2), (2, 2, 4, 4)),
    ("T1d", "ConvTranspose1d", (3, 4, 4), dict(stride=3, padding=2, output_padding=2), (2, 3, 5)),
    # kernels over small inputs, where taps that only meet padding are dropped: 3x3 on 1x1 is a
    # matrix multiply; stride 3 on 2x2 with padding 2 skips kernel columns in the middle
    ("2d-kernel-over-1x1", "Conv2d", (4, 5, 3), dict(padding=1), (2, 4, 1, 1)),
    ("2d-kernel-over-2x2-stride3", "Conv2d", (4, 6, (5, 3)), dict(stride=3, padding=2, groups=2), (2, 4, 2, 2)),
    ("2d-depthwise-x2-stride2", "Conv2d", (3, 6, 3), dict(stride=2, padding=1, groups=3), (2, 3, 5, 6)),
    # depthwise with one output per channel: its own input gradient (a tap sum over the dilated
    # output gradient) and weight gradient (DEPTHWISE_FORMS below runs each of its forms)
    ("2d-depthwise-stride2-dilation2", "Conv2d", (3, 3, 3), dict(stride=2, padding=2, dilation=2, groups=3),
     (2, 3, 7, 6)),
    ("2d-depthwise-k5-over-4x3", "Conv2d", (3, 3, 5), dict(padding=(2, 1), groups=3, bias=False), (2, 3, 4, 3)),
    ("3d-1x1x1", "Conv3d", (3, 4, 1), {}, (2, 3, 2, 3, 2)),
    ("T2d-stride1-small", "ConvTranspose2d", (4, 3, 3), dict(padding=1), (2, 4, 2, 2)),
]
IDS = [row[0] for row in TABLE]


def _pair(row, dtype=None):
    _, cls, args, kwargs, _ = row
    torch.manual_seed(0)
    ours = getattr(nn, cls)(*args, **kwargs, **({} if dtype is None else {"dtype": jnp.dtype(dtype)}))
    return ours, getattr(torch.nn, cls)(*args, **kwargs)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_conv_equals_torch(row, train, dtype):
    x = np.random.default_rng(0).standard_normal(row[-1])
    with jax.enable_x64(dtype == "float64"), warnings.catch_warnings():
        # torch warns that its asymmetric 'same' padding copies the input
        warnings.filterwarnings("ignore", "Using padding='same'", UserWarning)
        ours, theirs = _pair(row, dtype)
        check_layer(ours, theirs, [x], train=train, dtype=dtype)


def _depthwise(row):
    _, _, args, kwargs, _ = row
    return kwargs.get("groups", 1) == args[0] > 1 and "Transpose" not in row[1]


def _apply(layer, shape):
    # shapes only: the checks run at trace time, nothing is compiled
    params = jax.eval_shape(layer.init, jax.random.key(0))
    return jax.eval_shape(layer.apply, params, jax.ShapeDtypeStruct(shape, jnp.float32))


def _auto_pick(row):
    """The strategy the rule picks for the row's convolution (traced for shapes only), which
    test_conv_equals_torch runs already: its forced row would run the same program again."""
    from funcnet.nn.functional import conv_strategy

    picks, choose = [], conv_strategy.choose

    def record(*args):
        picks.append(choose(*args))
        return picks[-1]

    conv_strategy.choose = record
    try:
        _apply(_pair(row)[0], row[-1])
    finally:
        conv_strategy.choose = choose
    (pick,) = {"im2col" if p == "taps" and not _depthwise(row) else p for p in picks}
    return pick


def _winograd_row(row):
    _, cls, args, kwargs, _ = row
    return cls == "Conv2d" and args[2] in (3, (3, 3)) and kwargs.get("stride", 1) == 1 \
        and kwargs.get("dilation", 1) == 1 and kwargs.get("groups", 1) == 1


# "taps" is for depthwise convolutions (others fall back to im2col): it runs on those rows only;
# "winograd" on 3x3 stride-1 ones (others fall back to XLA's); each row runs every strategy but
# the one the rule picks for it (test_conv_equals_torch runs that)
STRATEGY_ROWS = [(row, how) for row in TABLE for how in ("xla", "im2col", "taps", "winograd")
                 if (how != "taps" or _depthwise(row)) and (how != "winograd" or _winograd_row(row))
                 and how != _auto_pick(row)]


@pytest.mark.parametrize("row,how", STRATEGY_ROWS, ids=[f"{row[0]}-{how}" for row, how in STRATEGY_ROWS])
def test_every_strategy_equals_torch(row, how):
    """Each way of computing a convolution, forced on every row (forward, input and weight
    gradients), float32: the sums run in another order than torch's, within check_layer's
    float32 tolerance for sums of at most ~100 products."""
    x = np.random.default_rng(1).standard_normal(row[-1])
    with strategy(how), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Using padding='same'", UserWarning)
        ours, theirs = _pair(row)
        check_layer(ours, theirs, [x], train=True)


def _conv_ops(fn, *args):
    text = str(jax.make_jaxpr(fn)(*args))
    return text.count("conv_general_dilated")


@pytest.mark.parametrize("shape,kernel,stride,groups,how", [
    ((8, 64, 2, 2), 3, 1, 1, "im2col"),  # a kernel over (almost) all of a small input: XLA:CPU's slow path
    ((8, 64, 1, 1), 3, 1, 1, "im2col"),  # only the centre tap meets data: a matrix multiply
    ((8, 64, 4, 4), 1, 2, 1, "im2col"),  # one tap
    ((8, 256, 7, 7), 3, 1, 1, "im2col"),  # 49 output positions, 2304 products each, 3.6 MB of patches
    ((8, 128, 7, 7), 3, 1, 1, "xla"),  # 1152 products each: XLA's as fast; 4x4 tiles of 2x2 cover 64 positions
    ((64, 256, 4, 4), 3, 1, 1, "winograd"),  # 2304 products, 9 MB of patches (past PATCH_BYTES), 256 channels
    ((8, 128, 14, 14), 3, 1, 1, "winograd"),  # 128 channels each side, 7x7 tiles of 2x2
    ((8, 128, 7, 7), 3, 2, 1, "xla"),  # stride 2: not Winograd's
    ((8, 96, 14, 14), 3, 1, 1, "xla"),  # 96 channels: XLA's faster (docs/design.md)
    ((64, 128, 32, 32), 3, 1, 1, "xla"),  # 65536 output positions: past WINOGRAD_MAX_POSITIONS
    ((64, 256, 28, 28), 3, 1, 1, "winograd"),  # 50176: at it
    ((64, 64, 8, 8), 3, 1, 1, "xla"),  # 64 positions, 576 products each
    ((2, 16, 32, 32), 3, 1, 1, "xla"),  # 1024 output positions
    ((8, 16, 4, 4), 3, 1, 1, "xla"),  # 16 positions of 144 products (benchmarks/models.py's conv net)
    ((8, 3, 32, 32), 3, 1, 1, "im2col"),  # 27 products per output: a first layer
    ((8, 3, 32, 32), 7, 2, 1, "xla"),  # 147 products: a 7x7 stem keeps XLA's
    ((2, 16, 32, 32), 7, 2, 16, "taps"),  # depthwise
])
def test_auto_picks_the_measured_strategy_in_forward_and_gradients(monkeypatch, shape, kernel, stride, groups, how):
    """The rule of docs/design.md on CPU: the slow path's shapes trace to no XLA convolution at
    all, forward or backward (jax.grad of a conv is convolutions again unless the forward is
    patches + einsum); large ones keep XLA's."""
    from funcnet.nn.functional import conv2d

    x = jnp.zeros(shape)
    w = jnp.zeros((shape[1], shape[1] // groups, kernel, kernel))

    def loss(x, w):
        return conv2d(x, w, None, stride, kernel // 2, 1, groups).sum()

    ops = _conv_ops(jax.grad(loss, argnums=(0, 1)), x, w)
    assert (ops == 0) == (how != "xla"), ops
    calls = []
    monkeypatch.setattr(conv_strategy, "winograd_conv", lambda *a: calls.append(a) or conv_winograd.winograd_conv(*a))
    jax.make_jaxpr(loss)(x, w)
    assert bool(calls) == (how == "winograd")
    with strategy("xla"):
        assert _conv_ops(jax.grad(loss, argnums=(0, 1)), x, w) >= 3  # forward, input grad, weight grad


def test_weight_gradient_over_chunks_of_the_batch_equals_torch(monkeypatch):
    """Past WEIGHT_GRAD_CHUNK_BYTES of input per chunk, XLA's weight gradient is summed over
    chunks of the batch (the largest divisor of the batch that fits): the gradients and the
    weight's forward-mode tangent against torch, on a batch and input that were not traced (the
    chunks are static, so a second input of the same shape runs the same program), and the
    compiled gradient holds one weight-gradient convolution per chunk."""
    from funcnet.nn.functional import conv2d
    from funcnet.nn.functional import conv_strategy as cs

    per_example = 4 * 9 * 9 * 4  # float32 (4, 9, 9)
    monkeypatch.setattr(cs, "WEIGHT_GRAD_CHUNK_BYTES", 2 * per_example + 1)
    assert [cs.weight_grad_chunk(jnp.zeros((n, 4, 9, 9))) for n in (6, 7, 2, 1, 0)] == [2, 1, 2, 1, 0]
    monkeypatch.setattr(cs, "WEIGHT_GRAD_CHUNK_BYTES", 3 * per_example)
    assert cs.weight_grad_chunk(jnp.zeros((6, 4, 9, 9))) == 3 and cs.weight_grad_chunk(jnp.zeros((8, 4, 9, 9))) == 2

    def f(x, w):
        return conv2d(x, w, None, 2, 1)

    grads = jax.jit(lambda x, w, g: jax.vjp(f, x, w)[1](g))
    tangent = jax.jit(lambda x, w, v: jax.jvp(lambda w: f(x, w), (w,), (v,))[1])
    shape_w = (5, 4, 3, 3)
    for seed in (1, 2):  # the second input reuses the program compiled for the first
        rng = np.random.default_rng(seed)
        x, w, v = (rng.standard_normal(s).astype(np.float32) for s in ((6, 4, 9, 9), shape_w, shape_w))
        g = rng.standard_normal((6, 5, 5, 5)).astype(np.float32)
        tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
        torch.nn.functional.conv2d(tx, tw, stride=2, padding=1).backward(torch.tensor(g))
        gx, gw = grads(x, w, g)
        # float32 summation bound, each side: gamma_n * sum |products| (n = 5*3*3 products an input
        # gradient at most, 6*5*5 a weight gradient's, 4*3*3 a tangent's), the |products| summed by
        # the same convolution of the absolute values
        ax, aw = torch.tensor(np.abs(x), requires_grad=True), torch.tensor(np.abs(w), requires_grad=True)
        torch.nn.functional.conv2d(ax, aw, stride=2, padding=1).backward(torch.tensor(np.abs(g)))
        bound = lambda n, size: 2 * n * 2.0 ** -24 * size.numpy()  # noqa: E731
        assert np.all(np.abs(gx - tx.grad.numpy()) <= bound(45, ax.grad))
        assert np.all(np.abs(gw - tw.grad.numpy()) <= bound(150, aw.grad))
        want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(v), stride=2, padding=1).numpy()
        size = torch.nn.functional.conv2d(torch.tensor(np.abs(x)), torch.tensor(np.abs(v)), stride=2, padding=1)
        assert np.all(np.abs(tangent(x, w, v) - want) <= bound(36, size))
    weight_grad = jax.grad(lambda w, x: f(x, w).sum())
    assert _conv_ops(weight_grad, jnp.asarray(w), jnp.asarray(x)) == 1 + 2  # the forward, two chunks of 3
    with strategy("xla"):  # one lax.conv_general_dilated a direction, as the strategy says (a new function:
        weight_grad = jax.grad(lambda w, x: f(x, w).sum())  # JAX reuses the trace of the one above)
        assert _conv_ops(weight_grad, jnp.asarray(w), jnp.asarray(x)) == 1 + 1


# (input shape, output channels, padding): odd and rectangular planes (tiles past the output are
# cropped), no padding, uneven padding
WINOGRAD_CASES = [((2, 5, 9, 7), 6, ((1, 1), (1, 1))), ((1, 3, 6, 8), 4, ((0, 0), (2, 1))),
                  ((3, 4, 4, 5), 3, ((1, 0), (0, 2)))]


@pytest.mark.parametrize("shape,out_channels,pads", WINOGRAD_CASES, ids=["same-odd", "valid-and-uneven", "uneven"])
def test_winograd_convolution_equals_torch_within_its_rounding_bound(monkeypatch, shape, out_channels, pads):
    """F(2x2, 3x3) (``conv_winograd``): the forward, both gradients and the forward-mode tangent
    in float32 against torch in float64, on an input other than the one traced. Each error is
    bounded by float32's running-error bound 2 n 2^-24 times the same computation carried out on
    absolute values (the transforms' matrices, the input, weight and cotangent replaced by
    their absolute values), where n counts the roundings in a chain: 2 adds of the input
    transform, 4 of the weight's, the contraction (channels, or tiles for the weight gradient),
    2 of the output transform's, 3 where overlapping tiles' gradients meet."""
    cw = conv_winograd
    (top, bottom), (left, right) = pads
    out_hw = (shape[2] + top + bottom - 2, shape[3] + left + right - 2)
    tiles = shape[0] * (-(-out_hw[0] // 2)) * (-(-out_hw[1] // 2))
    f = jax.jit(lambda x, w: cw.winograd_conv(x, w, pads))
    grads = jax.jit(lambda x, w, g: jax.vjp(lambda x, w: cw.winograd_conv(x, w, pads), x, w)[1](g))
    tangent = jax.jit(lambda x, w, dx, dw: jax.jvp(lambda x, w: cw.winograd_conv(x, w, pads), (x, w), (dx, dw))[1])
    w_shape, g_shape = (out_channels, shape[1], 3, 3), (shape[0], out_channels, *out_hw)
    rng = np.random.default_rng(0)
    f(*(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in (shape, w_shape)))  # traced on other values

    def torch_conv(x, w):
        return torch.nn.functional.conv2d(torch.nn.functional.pad(x, (left, right, top, bottom)), w)

    rng = np.random.default_rng(1)
    x, w, dx, dw = (rng.standard_normal(s) for s in (shape, w_shape, shape, w_shape))
    g = rng.standard_normal(g_shape)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    want = torch_conv(tx, tw)
    want.backward(torch.tensor(g))
    want_tangent = torch_conv(torch.tensor(dx), torch.tensor(w)) + torch_conv(torch.tensor(x), torch.tensor(dw))
    as32 = [jnp.asarray(a, jnp.float32) for a in (x, w, dx, dw, g)]
    got = [f(*as32[:2]), *grads(as32[0], as32[1], as32[4]), tangent(*as32[:4])]
    # the bounds: the same computation in float64 with absolute values throughout
    for name in ("_BT", "_G", "_AT"):
        monkeypatch.setattr(cw, name, tuple(tuple(abs(c) for c in row) for row in getattr(cw, name)))
    with jax.enable_x64(True):
        a = [jnp.asarray(np.abs(v)) for v in (x, w, dx, dw, g)]
        size = [cw.winograd_conv(a[0], a[1], pads),
                *jax.vjp(lambda x, w: cw.winograd_conv(x, w, pads), a[0], a[1])[1](a[4]),
                jax.jvp(lambda x, w: cw.winograd_conv(x, w, pads), (a[0], a[1]), (a[2], a[3]))[1]]
        size = [np.asarray(s) for s in size]
    chain = 2 + 4 + 2 + 3
    for got_, want_, size_, n in zip(got, [want, tx.grad, tw.grad, want_tangent], size,
                                     [shape[1], out_channels, tiles, 2 * shape[1]]):
        err = np.abs(np.asarray(got_, np.float64) - want_.detach().numpy())
        assert np.all(err <= 2 * (n + chain) * 2.0 ** -24 * size_), (err.max(), np.max(size_))


def test_winograd_second_order_equals_torch_exactly_on_integers():
    """Winograd's rule has no custom derivative: forward over reverse through it gives torch's
    Hessian-vector product (double backward) of a cubic loss. The inputs are small integers in
    float64: the transforms only add and halve, so every intermediate is a multiple of 1/4 far
    below 2^53 (|conv| <= 27 * 9), every sum is exact in any order, and the two must agree to
    the last bit."""
    from funcnet.nn.functional import conv2d

    rng = np.random.default_rng(2)
    x, w, v = (rng.integers(-3, 4, s).astype(np.float64) for s in ((2, 3, 6, 5), (4, 3, 3, 3), (4, 3, 3, 3)))
    tw = torch.tensor(w, requires_grad=True)
    (g,) = torch.autograd.grad((torch.nn.functional.conv2d(torch.tensor(x), tw, padding=1) ** 3).sum(), tw,
                               create_graph=True)
    (want,) = torch.autograd.grad(g, tw, torch.tensor(v))
    with jax.enable_x64(True), strategy("winograd"):
        loss = lambda w: jnp.sum(conv2d(jnp.asarray(x), w, None, 1, 1) ** 3)  # noqa: E731
        got = jax.jvp(jax.grad(loss), (jnp.asarray(w),), (jnp.asarray(v),))[1]
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


# (input shape, kernel, padding, stride): each of the tap sum's formulations
# (conv_depthwise.taps_sum) in the forward and the input gradient, and each weight gradient
DEPTHWISE_FORMS = {
    "row-bands+banded-weight": ((2, 4, 5, 6), (3, 5), (1, 2), 1),
    "flat+banded-weight": ((2, 4, 4, 4), (5, 5), (2, 2), 1),
    "fused-pad+weight-summed-over-batch": ((2, 4, 6, 12), (3, 3), (1, 1), 1),
    # strides 2 and 3 past 9 taps: stride-1 slices of the input's phases
    "phases+weight-summed-over-batch": ((2, 4, 5, 9), (5, 4), (2, 1), (2, 3)),
    # past BATCH_CHUNK (8) examples the weight gradient loops over chunks of 8 and a remainder
    # (19 = 8 + 8 + 3); a 28x14 plane is summed over halves of its rows (SUMMED_POSITIONS)
    "fused-pad+weight-over-batch-chunks": ((19, 4, 28, 14), (3, 3), (1, 1), 1),
    "phases+weight-over-batch-chunks": ((17, 4, 5, 9), (5, 4), (2, 1), (2, 3)),
}


@pytest.mark.parametrize("form", DEPTHWISE_FORMS)
def test_depthwise_gradients_equal_autodiff_of_xla_first_and_second_order(form):
    """The depthwise convolution's own gradients (input: a forward tap sum; weight: banded on
    narrow inputs, else summed over the batch before a reduction) against plain autodiff of
    XLA's convolution, float64: the value and gradient, and the gradient of a gradient (torch's
    create_graph=True) through the custom_vjp's backward. Forward mode is JAX's refusal for a
    custom_vjp, and runs under strategy("xla")."""
    from funcnet.nn.functional import conv2d

    shape, kernel, padding, stride = DEPTHWISE_FORMS[form]
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(shape), rng.standard_normal((4, 1, *kernel))

    def conv(how):
        def f(x, w):
            with strategy(how):
                return conv2d(x, w, None, stride, padding, 1, 4)
        return f

    tx, tw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    g = rng.standard_normal(jax.eval_shape(conv("xla"), x, w).shape)

    def first(f):  # the value and both gradients
        def value_and_vjp(x, w):
            y, vjp = jax.vjp(f, x, w)
            return y, vjp(g)
        return jax.jit(value_and_vjp)(x, w)

    def penalty(f):  # a gradient penalty: the squared norm of the input gradient, differentiated again
        grad_x = lambda x, w: jax.vjp(lambda x: f(x, w), x)[1](g)[0]
        return jax.jit(jax.grad(lambda x, w: jnp.sum(grad_x(x, w) ** 2), argnums=(0, 1)))(x, w)

    with jax.enable_x64(True):
        ours, plain = conv("auto"), conv("xla")
        # float64, two formulations of the same sums: a weight gradient reduces batch x positions
        # products, the penalty composes two such convolutions of kernel-size taps: a few eps per term
        terms = math.prod(kernel) * shape[0] * shape[2] * shape[3]
        for f in (first, penalty):
            for a, b in zip(jax.tree.leaves(f(ours)), jax.tree.leaves(f(plain))):
                tol = np.finfo(np.float64).eps * terms
                np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())
        with pytest.raises(TypeError, match="custom_vjp"):
            jax.jvp(ours, (x, w), (tx, tw))
        jax.jvp(plain, (x, w), (tx, tw))


def test_pointwise_conv_is_one_matrix_multiply_per_example_and_equals_torch():
    """A 1x1 convolution on a plane of at least POINTWISE_POSITIONS positions is a batched
    matrix multiply over the examples (no layout copy of the input to (N*H*W, C)): its jaxpr has
    a dot_general batched over axis 0 of both operands; forward, input and weight gradients, and
    forward mode equal torch's and jax.jvp's of XLA's convolution (float64: sums of 5 products
    forward, 2 x 784 for the weight)."""
    from funcnet.nn.functional import conv2d

    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((2, 5, 28, 28)), rng.standard_normal((6, 5, 1, 1)), rng.standard_normal(6)
    g = rng.standard_normal((2, 6, 28, 28))
    with jax.enable_x64(True):
        def loss(x, w, b):
            return jnp.vdot(conv2d(x, w, b), g)

        jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w, b))
        assert "dimension_numbers=(([2], [1]), ([0], [0]))" in jaxpr and "conv_general_dilated" not in jaxpr
        y, grads = jax.jit(conv2d)(x, w, b), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, b)
        tx, tw, tb = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
        ty = torch.nn.functional.conv2d(tx, tw, tb)
        ty.backward(torch.from_numpy(g))
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
        for ours, theirs in zip(grads, (tx.grad, tw.grad, tb.grad)):
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-11, atol=1e-11)
        tangents = (rng.standard_normal(x.shape), rng.standard_normal(w.shape))
        ours = jax.jvp(lambda x, w: conv2d(x, w), (x, w), tangents)
        with strategy("xla"):
            plain = jax.jvp(lambda x, w: conv2d(x, w), (x, w), tangents)
        for a, c in zip(ours, plain):
            np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-12)


def test_unknown_strategy_is_refused():
    expected = r"conv strategy must be one of \('auto', 'xla', 'im2col', 'taps', 'winograd'\), got 'fft'"
    with pytest.raises(ValueError, match=expected):
        with strategy("fft"):
            pass


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_name_is_torch_repr(row):
    ours, theirs = _pair(row)
    assert ours.name == repr(theirs)


def _ks(a, b):
    # asymptotic p-value: scipy's exact one costs O(n*m) for samples under 10k
    return stats.ks_2samp(np.ravel(a), np.ravel(b), method="asymp").pvalue


INIT = [
    # (class, args, fan_in): torch's fan_in is weight.shape[1] * prod(kernel)
    ("Conv2d", (8, 16, (3, 2), 1, 0, 1, 4), 2 * 6),  # groups=4: fan_in counts in_channels/groups
    ("ConvTranspose2d", (16, 8, 3, 1, 0, 0, 2), 4 * 9),  # weight (in, out/groups, k, k): fan_in counts out/groups
]


@pytest.mark.parametrize("cls,args,fan_in", INIT, ids=[f"{c}{a}" for c, a, _ in INIT])
def test_default_init_matches_torch(cls, args, fan_in):
    # KS against torch's draws, as tests/test_init.py; a closed-form bound as a second oracle
    torch.manual_seed(0)
    layers = [getattr(torch.nn, cls)(*args) for _ in range(64)]
    t_weight = np.concatenate([t.weight.detach().numpy().ravel() for t in layers])
    t_bias = np.concatenate([t.bias.detach().numpy() for t in layers])
    params = jax.jit(jax.vmap(getattr(nn, cls)(*args).init))(jax.random.split(jax.random.key(1), 64))
    assert params["weight"].shape[1:] == tuple(layers[0].weight.shape)
    w, b = np.asarray(params["weight"]).ravel(), np.asarray(params["bias"]).ravel()
    bound = 1 / math.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)): gain sqrt(1/3) * sqrt(3/fan_in)
    for ours, theirs in ((w, t_weight), (b, t_bias)):
        assert np.abs(ours).max() <= bound and np.abs(ours).max() > 0.98 * bound
        assert _ks(ours, theirs) > 1e-3
    assert _ks(w * 1.1, t_weight) < 1e-3  # the same test sees a 10% wrong scale


@pytest.mark.parametrize("train", [True, False])
def test_conv_net_loads_torch_state_dict_and_matches(train):
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                 torch.nn.Flatten(), torch.nn.Linear(4 * 3 * 3, 5))
    ours = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 3 * 3, 5))
    x = np.random.default_rng(0).standard_normal((2, 2, 7, 6))
    # check_layer asserts the keys "0.weight", "0.bias", "4.weight", "4.bias" load with no renaming
    check_layer(ours, theirs, [x], train=train)


ERRORS = [
    (lambda: nn.Conv2d(3, 8, 3, groups=2), "in_channels=3 is not divisible by groups=2"),
    (lambda: nn.Conv2d(4, 9, 3, groups=2), "out_channels=9 is not divisible by groups=2"),
    (lambda: nn.Conv2d(4, 8, 3, stride=2, padding="same"), r"padding='same' needs stride=1.*padding=\(1, 1\)"),
    (lambda: nn.Conv2d(4, 8, 3, padding="full"), "padding must be 'same', 'valid', an int or a tuple of ints, "
                                                 "got 'full'"),
    (lambda: nn.Conv2d(4, 8, 3, padding=-1), "padding must be an int >= 0 or a tuple of 2 such ints, got -1"),
    (lambda: nn.Conv2d(4, 8, 0), "kernel_size must be an int >= 1"),
    (lambda: nn.Conv2d(4, 8, (3, 3, 3)), r"kernel_size must be .* tuple of 2 such ints, got \(3, 3, 3\)"),
    (lambda: nn.Conv2d(4, 8, 3, stride=0), "stride must be an int >= 1"),
    (lambda: nn.Conv2d(0, 8, 3), "in_channels must be a positive int, got 0"),
    (lambda: nn.Conv2d(4, 8, 3, padding_mode="mirror"), "padding_mode must be one of .*got 'mirror'"),
    (lambda: nn.ConvTranspose2d(4, 8, 3, padding_mode="reflect"), "only padding_mode='zeros'"),
    (lambda: nn.ConvTranspose2d(4, 8, 3, padding="same"), "padding must be an int or a tuple of ints, got 'same'"),
    (lambda: nn.ConvTranspose2d(4, 8, 3, stride=2, output_padding=2),
     r"output_padding=\(2, 2\) must be smaller than either stride=\(2, 2\) or dilation=\(1, 1\)"),
]


@pytest.mark.parametrize("build,message", ERRORS, ids=[m[:30] for _, m in ERRORS])
def test_bad_constructor_arguments_fail_at_build_time(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_bad_inputs_fail_with_the_expected_shape():
    conv = nn.Conv2d(3, 8, 3)
    with pytest.raises(ValueError, match=r"expected a 3D \(unbatched\) input \(C, H, W\) or a 4D \(batched\) input "
                                         r"\(N, C, H, W\), got shape \(5, 5\)"):
        _apply(conv, (5, 5))
    with pytest.raises(ValueError, match=r"shape \(2, 4, 5, 5\) has 4 channels in axis 1, expected in_channels=3"):
        _apply(conv, (2, 4, 5, 5))
    with pytest.raises(ValueError, match=r"shape \(5, 5, 3\) has 5 channels in axis 0, expected in_channels=3.*"
                                         r"channels-first"):
        _apply(conv, (5, 5, 3))
    with pytest.raises(ValueError, match=r"padded input size per channel \(2, 2\) is smaller than the \(dilated\) "
                                         r"kernel size \(3, 3\)"):
        _apply(conv, (1, 3, 2, 2))
    assert _apply(conv, (1, 3, 3, 3)).shape == (1, 8, 1, 1)  # the boundary case is allowed
    with pytest.raises(ValueError, match=r"\(6,\) is smaller than the \(dilated\) kernel size \(7,\)"):
        _apply(nn.Conv1d(3, 2, 3, padding=1, dilation=3), (3, 4))
    with pytest.raises(ValueError, match=r"padding \(2, 2\) is too large for padding_mode='reflect'.*at most 1"):
        _apply(nn.Conv2d(3, 2, 3, padding=2, padding_mode="reflect"), (3, 2, 6))
    with pytest.raises(ValueError, match=r"gives output size \(-1, 0\)"):
        _apply(nn.ConvTranspose2d(3, 2, 1, padding=1), (3, 1, 2))


def test_building_conv_and_pooling_layers_does_not_start_the_backend():
    # as tests/test_nn_contract.py: jax_num_cpu_devices can only change before the backend starts
    import subprocess
    import sys
    code = ("import jax; from funcnet import nn; "
            "m = nn.Sequential(nn.Conv2d(3, 4, 3, padding='same', padding_mode='reflect'), nn.MaxPool2d(2), "
            "nn.ConvTranspose2d(4, 2, 3, 2, 1, 1), nn.AvgPool2d(3, 1, 1, divisor_override=2), "
            "nn.AdaptiveAvgPool2d((3, None)), nn.Conv1d(2, 2, 2), nn.MaxPool1d(2), nn.AvgPool1d(2)); "
            "jax.config.update('jax_num_cpu_devices', 3); print(len(jax.devices()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    assert out.stdout.strip() == "3"


def test_fit_shape_error_names_the_full_input_shape_without_jax_frames():
    """A conv net fed flat images: the error names the user's (1437, 64), not a slice of it,
    and is raised before any tracing, so its traceback holds no JAX frames and no chained
    JAX exception."""
    import traceback

    import optax

    from funcnet import train

    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    x, y = np.zeros((1437, 64), np.float32), np.zeros(1437, np.int64)
    with pytest.raises(ValueError, match=r"Conv2d\(1, 4, .*got shape \(1437, 64\); reshape the input to "
                                         r"\(N, C, H, W\) \(flat images\? x.reshape\(1437, C, H, W\)") as info:
        train.fit(model, optax.sgd(0.1), (x, y), epochs=1, batch_size=32, key=jax.random.key(0), progress=False)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    frames = traceback.extract_tb(info.value.__traceback__)
    assert not [f.filename for f in frames if "/jax/" in f.filename or "/jax/_src/" in f.filename]


@pytest.mark.parametrize("shape", [(2, 3, 17, 13, 4, 3, 2, 1), (1, 2, 8, 11, 2, 3, (2, 3), 1),
                                   (2, 2, 10, 10, 5, 4, 2, 2), (2, 3, 7, 9, 2, 2, 3, 0)])
def test_strided_short_sum_stem_equals_torch_in_float64(shape):
    # a first layer of 1-3 channels with stride > 1: the written-out sum reads the input's phases
    from funcnet.nn import functional as F
    from funcnet.nn.functional import conv_strategy

    n, c, h, w_, o, k, s, p = shape
    assert c * k * k <= conv_strategy.SHORT_CONTRACTION  # the rule's short sum, not the patches
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((n, c, h, w_)), rng.standard_normal((o, c, k, k))
    with jax.enable_x64(True):
        def f(x, w):
            return F.conv2d(x, w, stride=s, padding=p)
        y = f(jnp.asarray(x), jnp.asarray(w))
        gx, gw = jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w))), argnums=(0, 1))(jnp.asarray(x), jnp.asarray(w))
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    yt = torch.nn.functional.conv2d(xt, wt, stride=s, padding=p)
    torch.sin(yt).sum().backward()
    # each output sums at most 32 products and each gradient a few hundred: float64 eps times that
    for ours, theirs in ((y, yt), (gx, xt.grad), (gw, wt.grad)):
        theirs = theirs.detach().numpy()
        np.testing.assert_allclose(np.asarray(ours), theirs, rtol=0, atol=1e3 * np.finfo(np.float64).eps * np.abs(theirs).max())
