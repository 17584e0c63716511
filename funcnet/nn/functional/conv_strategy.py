"""How a convolution is computed: XLA's ``lax.conv_general_dilated`` or patches + one ``einsum``
(im2col), chosen at trace time from static shapes.

XLA:CPU runs some convolutions on a slow path: a kernel that covers (almost) all of a small
input, as the last stage of a ResNet at 2x2 or 1x1 spatial, is lowered with batch-last
dimension labels and a reversed kernel and runs 10-50x slower than torch. The same
convolution as zero padding, one strided slice per kernel tap and one ``dot_general`` over
(channels, taps) takes a matrix multiply's time. Taps that only ever meet padding are dropped
first (a 3x3 kernel with padding 1 on a 1x1 input is a 1x1 kernel: a plain matrix multiply).
A depthwise convolution with one output per channel (``_depthwise``) has its own gradients:
the input gradient as a forward tap sum, the weight gradient banded on narrow inputs.
The rule (``choose``) and the measurements behind it are in docs/design.md, "Convolution
strategy".

``strategy("xla" | "im2col" | "auto")`` forces one (a context manager, read when a function
is traced: a jitted function keeps the strategy it was traced with).
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp

STRATEGIES = ("auto", "xla", "im2col", "taps")
_current = ["auto"]
_SPATIAL = {1: "L", 2: "HW", 3: "DHW"}
# im2col when the output has at most this many positions per image and each output sums at
# least this many products (see docs/design.md)
SMALL_OUTPUT = 64
LONG_CONTRACTION = 1024
# im2col too when each output sums at most this many products (1-3 input channels, a 3x3
# kernel: a network's first layer), where XLA:CPU's convolution is 3-9x torch's forward time
SHORT_CONTRACTION = 32


@contextlib.contextmanager
def strategy(name: str):
    """Force how convolutions traced inside the block are computed: ``"xla"`` (one
    ``lax.conv_general_dilated``), ``"im2col"`` (patches + one ``einsum``), ``"taps"`` (a sum
    over kernel taps of shifted input times weight, elementwise: for depthwise convolutions;
    other groupings fall back to im2col) or ``"auto"`` (the default: chosen per shape by
    ``choose``)."""
    if name not in STRATEGIES:
        raise ValueError(f"conv strategy must be one of {STRATEGIES}, got {name!r}")
    old = _current[0]
    _current[0] = name
    try:
        yield
    finally:
        _current[0] = old


def _taps(size: int, lo: int, lhs_dilation: int, out: int, stride: int, dilation: int, kernel: int):
    """The kernel taps along one axis that meet input data (not padding) at some output position."""
    data = {lo + i * lhs_dilation for i in range(size)}
    return tuple(k for k in range(kernel) if any(o * stride + dilation * k in data for o in range(out)))


def choose(in_sizes, out_sizes, kernel, taps, lhs_dilation, depthwise: bool, contraction: int) -> str:
    """The strategy for one convolution from its static shapes (docs/design.md has the table):
    im2col where XLA:CPU's convolution is slow (a kernel that spans the whole input, taps that
    only meet padding, a contraction of at most 32 products, or few output positions per image
    with a long contraction) and on a
    single tap (a matrix multiply); a sum over taps for depthwise; XLA elsewhere.
    ``contraction``: input channels per group times taps. Accelerators always get XLA's
    convolution (cuDNN has no such cliff)."""
    if _current[0] != "auto":
        return _current[0]
    if jax.default_backend() != "cpu":
        return "xla"
    if any(d != 1 for d in lhs_dilation):
        return "xla"
    if depthwise:
        return "taps"
    if math.prod(len(t) for t in taps) == 1:
        return "im2col"
    cropped = any(len(t) < k for t, k in zip(taps, kernel))
    spans = all(k >= s for k, s in zip(kernel, in_sizes))
    if cropped or spans or contraction <= SHORT_CONTRACTION or (
            math.prod(out_sizes) <= SMALL_OUTPUT and contraction >= LONG_CONTRACTION):
        return "im2col"
    return "xla"


def convolve(x, w, stride, pads, lhs_dilation, rhs_dilation, groups: int):
    """``lax.conv_general_dilated(x, w)`` with torch's layouts (``x`` ``(N, C, *spatial)``, ``w``
    ``(O, C/groups, *kernel)``) at HIGHEST precision, by the strategy ``choose`` picks."""
    n = x.ndim - 2
    kernel = w.shape[2:]
    out = tuple((s * ld - ld + 1 + lo + hi - d * (k - 1) - 1) // st + 1
                for s, ld, (lo, hi), d, k, st in zip(x.shape[2:], lhs_dilation, pads, rhs_dilation, kernel, stride))
    taps = tuple(_taps(s, lo, ld, o, st, d, k)
                 for s, (lo, _), ld, o, st, d, k in zip(x.shape[2:], pads, lhs_dilation, out, stride, rhs_dilation,
                                                        kernel))
    depthwise = w.shape[1] == 1 and groups > 1
    how = choose(x.shape[2:], out, kernel, taps, lhs_dilation, depthwise, w.shape[1] * math.prod(kernel))
    if how == "taps" and not depthwise:
        how = "im2col"
    if how == "xla" or any(not t for t in taps):
        spatial = _SPATIAL[n]
        return jax.lax.conv_general_dilated(
            x, w, window_strides=tuple(stride), padding=list(pads), lhs_dilation=tuple(lhs_dilation),
            rhs_dilation=tuple(rhs_dilation), dimension_numbers=("NC" + spatial, "OI" + spatial, "NC" + spatial),
            feature_group_count=groups, precision=jax.lax.Precision.HIGHEST)
    if how == "taps":
        if w.shape[0] == x.shape[1] and all(d == 1 for d in lhs_dilation):
            return _depthwise(x, w, tuple(stride), tuple(pads), tuple(rhs_dilation))
        return _taps_sum(x, w, stride, pads, lhs_dilation, rhs_dilation, out, taps)
    return _im2col(x, w, stride, pads, lhs_dilation, rhs_dilation, groups, out, taps)


def _shifted(x, stride, pads, lhs_dilation, rhs_dilation, out, taps):
    """The padded input's strided slice under each kernel tap that meets data (the others only
    ever multiply zeros: ``_live_weight`` drops them from the weight)."""
    zero = jnp.zeros((), x.dtype)
    x = jax.lax.pad(x, zero, [(0, 0, 0), (0, 0, 0)] + [(lo, hi, ld - 1) for (lo, hi), ld in zip(pads, lhs_dilation)])
    cols = []
    for tap in _product(taps):
        start = (0, 0, *(d * k for d, k in zip(rhs_dilation, tap)))
        limit = (*x.shape[:2], *(d * k + st * (o - 1) + 1 for d, k, st, o in zip(rhs_dilation, tap, stride, out)))
        cols.append(jax.lax.slice(x, start, limit, (1, 1, *stride)))
    return cols


# a tap sum of at most this many taps pads each tap's slice inside the fused loop instead of
# padding the input once (docs/design.md)
FUSED_PAD_TAPS = 9


def _cropped(x, stride, pads, rhs_dilation, out, taps):
    """As ``_shifted`` (no input dilation), each tap's slice taken from the unpadded input and
    zero-padded to the output's size: XLA fuses those pads into the loop that sums the taps,
    where one padded copy of the input is a pass over memory of its own."""
    zero = jnp.zeros((), x.dtype)
    cols = []
    for tap in _product(taps):
        start, limit, margins = [0, 0], list(x.shape[:2]), [(0, 0, 0), (0, 0, 0)]
        for size, (lo, _), st, d, k, o in zip(x.shape[2:], pads, stride, rhs_dilation, tap, out):
            # output q reads input q * st + d * k - lo: the outputs whose input is data
            first = max(0, -(-(lo - d * k) // st))
            last = min(o - 1, (size - 1 + lo - d * k) // st)
            start.append(first * st + d * k - lo)
            limit.append(last * st + d * k - lo + 1)
            margins.append((first, o - 1 - last, 0))
        col = jax.lax.slice(x, start, limit, (1, 1, *stride))
        cols.append(jax.lax.pad(col, zero, margins))
    return cols


def _live_weight(w, taps):
    """``w`` without the taps that only ever meet padding."""
    for axis, (t, k) in enumerate(zip(taps, w.shape[2:])):
        if len(t) < k:
            w = jnp.take(w, jnp.asarray(t), axis=axis + 2)
    return w


def _taps_sum(x, w, stride, pads, lhs_dilation, rhs_dilation, out, taps):
    """A depthwise convolution (one input channel per group, ``w`` ``(C*m, 1, *kernel)``) as a
    sum over taps of shifted input times that tap's weight: elementwise work XLA fuses into one
    loop, where its grouped convolution and a batched matrix multiply of 1-channel groups crawl.
    Up to ``FUSED_PAD_TAPS`` taps the padding is fused into that loop (``_cropped``)."""
    n = x.ndim - 2
    if all(d == 1 for d in lhs_dilation) and math.prod(len(t) for t in taps) <= FUSED_PAD_TAPS:
        cols = _cropped(x, stride, pads, rhs_dilation, out, taps)
    else:
        cols = _shifted(x, stride, pads, lhs_dilation, rhs_dilation, out, taps)
    w = _live_weight(w, taps)
    channels, multiplier = x.shape[1], w.shape[0] // x.shape[1]
    w = w.reshape(channels, multiplier, len(cols))
    if multiplier == 1:  # no extra axis: a reshape between a fused pad and its use costs index arithmetic
        return _tree_sum([col * w[:, 0, t].reshape(channels, *(1,) * n) for t, col in enumerate(cols)])
    terms = [col[:, :, None] * w[None, :, :, t].reshape(1, channels, -1, *(1,) * n) for t, col in enumerate(cols)]
    return _tree_sum(terms).reshape(x.shape[0], -1, *out)


def _tree_sum(terms):
    """The sum of ``terms`` as a balanced tree of pairwise adds. XLA keeps float adds in the
    order written, and one running sum is a chain of dependent adds whose latency bounds the
    fused loop (49 taps: 49 adds in a row per vector of outputs); a tree has a depth of
    log2(taps) and rounds no worse."""
    while len(terms) > 1:
        terms = [a + b for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) - len(terms) % 2:]
    return terms[0]


def _depthwise_plan(x_shape, kernel, stride, pads, rhs_dilation):
    out = tuple((s + lo + hi - d * (k - 1) - 1) // st + 1
                for s, (lo, hi), d, k, st in zip(x_shape[2:], pads, rhs_dilation, kernel, stride))
    taps = tuple(_taps(s, lo, 1, o, st, d, k)
                 for s, (lo, _), o, st, d, k in zip(x_shape[2:], pads, out, stride, rhs_dilation, kernel))
    return out, taps


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _depthwise(x, w, stride, pads, rhs_dilation):
    """A depthwise convolution (``w`` ``(C, 1, *kernel)``) as a tap sum, whose input gradient is
    a tap sum too: the transposed convolution written as a forward one (the output gradient
    dilated by the stride, padded, against the flipped kernel), one fused loop where autodiff
    of the forward gives one pad per tap. The weight gradient is banded (``_weight_grad_banded``)
    where that pays, autodiff's otherwise. A ``custom_vjp`` whose backward is plain jnp, so a
    gradient of a gradient (torch's ``create_graph=True``: gradient penalties, meta-learning)
    differentiates through it; forward mode (``jax.jvp``, ``jax.hessian``) is refused by JAX for a
    ``custom_vjp`` and runs under ``strategy("xla")`` (docs/design.md)."""
    out, taps = _depthwise_plan(x.shape, w.shape[2:], stride, pads, rhs_dilation)
    return _taps_sum(x, w, stride, pads, (1,) * len(stride), rhs_dilation, out, taps)


def _depthwise_fwd(x, w, stride, pads, rhs_dilation):
    return _depthwise(x, w, stride, pads, rhs_dilation), (x, w)


def _depthwise_bwd(stride, pads, rhs_dilation, residuals, g):
    x, w = residuals
    return _input_grad(g, w, x.shape, stride, pads, rhs_dilation), _weight_grad(x, g, w, stride, pads, rhs_dilation)


_depthwise.defvjp(_depthwise_fwd, _depthwise_bwd)


def _weight_grad(x, g, w, stride, pads, rhs_dilation):
    if _banded(x.shape, w.shape, stride, pads, rhs_dilation):
        return _weight_grad_banded(x, g, w.shape[2:], pads)
    return _weight_grad_taps(x, g, w.shape[2:], stride, pads, rhs_dilation)


# the products of each tap are summed elementwise over at least this many slices (examples of
# the batch, then halves of the first spatial axis) before one reduction
SUMMED_SLICES = 8


def _weight_grad_taps(x, g, kernel, stride, pads, rhs_dilation):
    """The weight gradient of a depthwise convolution: tap t's is ``sum(shifted_t(x) * g)`` over
    examples and positions. XLA:CPU keeps a reduction's adds in order, one dependent add per
    element (autodiff of the tap sum: 4 ms for 8x32x56x56 3x3, torch 0.6 ms); here the products
    are first summed as a tree over the examples (and halves of the first spatial axis while
    fewer than ``SUMMED_SLICES``), elementwise in one vectorized loop, and the reduction runs
    over what is left."""
    out, taps = _depthwise_plan(x.shape, kernel, stride, pads, rhs_dilation)
    n, channels = len(kernel), x.shape[1]
    if not all(taps):
        return jnp.zeros((channels, 1, *kernel), x.dtype)
    sums = []
    for col in _shifted(x, stride, pads, (1,) * n, rhs_dilation, out, taps):
        parts = [col[b] * g[b] for b in range(x.shape[0])]
        while len(parts) < SUMMED_SLICES and parts[0].shape[1] % 2 == 0:
            half = parts[0].shape[1] // 2
            parts = [q for p in parts for q in (p[:, :half], p[:, half:])]
        sums.append(_tree_sum(parts))
    grad = jnp.sum(jnp.stack(sums, axis=1), axis=tuple(range(2, n + 2)))  # (C, live taps)
    if grad.shape[1] < math.prod(kernel):  # taps that only meet padding get zero
        flat = [sum(t * math.prod(kernel[a + 1:]) for a, t in enumerate(tap)) for tap in _product(taps)]
        grad = jnp.zeros((channels, math.prod(kernel)), x.dtype).at[:, jnp.asarray(flat)].set(grad)
    return grad.reshape(channels, 1, *kernel)


def _input_grad(g, w, x_shape, stride, pads, rhs_dilation):
    # x[i] meets g[o] through tap k where o * stride + d * k = i + lo: a stride-1 correlation of
    # g dilated by the stride, padded by d(k-1) - lo before and (size + lo - (out-1) stride - 1) after
    kernel, sizes, outs = w.shape[2:], x_shape[2:], g.shape[2:]
    back_pads = tuple((d * (k - 1) - lo, s + lo - (o - 1) * st - 1)
                      for d, k, (lo, _), s, o, st in zip(rhs_dilation, kernel, pads, sizes, outs, stride))
    taps = tuple(_taps(o, lo, st, s, 1, d, k)
                 for o, (lo, _), st, s, d, k in zip(outs, back_pads, stride, sizes, rhs_dilation, kernel))
    if any(not t for t in taps):
        return jnp.zeros(x_shape, g.dtype)
    flipped = jnp.flip(w, axis=tuple(range(2, w.ndim)))
    return _taps_sum(g, flipped, (1,) * len(stride), back_pads, stride, rhs_dilation, sizes, taps)

# the banded weight gradient multiplies (padded width / kernel width) times the products it
# needs: it pays while the padded width is at most this many kernel widths (docs/design.md)
BAND_WIDTH = 4


def _banded(x_shape, w_shape, stride, pads, rhs_dilation) -> bool:
    return (len(x_shape) == 4 and stride == (1, 1) and rhs_dilation == (1, 1)
            and x_shape[3] + sum(pads[1]) <= BAND_WIDTH * w_shape[3])


def _weight_grad_banded(x, g, kernel, pads):
    """The weight gradient of a stride-1 2D depthwise convolution as one batched matrix
    multiply: for each channel and kernel row i, ``m[v, w] = sum_{n,h} xpad[n, h+i, v] g[n, h, w]``
    over all padded columns v, then tap (i, j) is the diagonal ``sum_w m[w+j, w]`` (a strided
    slice of m flattened). One dot and a few slices, where autodiff of the tap sum makes one
    reduction over the whole input per tap."""
    (kh, kw), (_, _, ho, wo) = kernel, g.shape
    xp = jax.lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, 0, 0), (*pads[0], 0), (*pads[1], 0)])
    wp = xp.shape[3]
    rows = jnp.stack([jax.lax.slice_in_dim(xp, i, i + ho, axis=2) for i in range(kh)], axis=2)
    m = jnp.einsum("ncihv,nchw->civw", rows, g, precision=jax.lax.Precision.HIGHEST)
    m = m.reshape(x.shape[1], kh, wp * wo)
    taps = [jnp.sum(jax.lax.slice_in_dim(m, j * wo, j * wo + (wo - 1) * (wo + 1) + 1, wo + 1, axis=2), axis=2)
            for j in range(kw)]
    return jnp.stack(taps, axis=2).reshape(x.shape[1], 1, kh, kw).astype(x.dtype)


def _im2col(x, w, stride, pads, lhs_dilation, rhs_dilation, groups, out, taps):
    n = x.ndim - 2
    cols, w = _shifted(x, stride, pads, lhs_dilation, rhs_dilation, out, taps), _live_weight(w, taps)
    batch, channels, n_taps = x.shape[0], x.shape[1], len(cols)
    # (N, G, C/G, T, *out) against (G, O/G, C/G, T): one batched matrix multiply per group
    patches = jnp.stack(cols, axis=2).reshape(batch, groups, channels // groups, n_taps, *out)
    w = w.reshape(groups, w.shape[0] // groups, w.shape[1], n_taps)
    letters = "XYZ"[:n]
    y = jnp.einsum(f"ngct{letters},goct->ngo{letters}", patches, w, precision=jax.lax.Precision.HIGHEST)
    return y.reshape(batch, -1, *out)


def _product(axes):
    result = [()]
    for taps in axes:
        result = [r + (t,) for r in result for t in taps]
    return result
