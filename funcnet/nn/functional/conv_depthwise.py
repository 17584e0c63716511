"""Depthwise convolutions (one input channel per group) as sums over kernel taps, and the
tap machinery the other strategies share (which taps meet data, the input under each tap).

XLA:CPU's grouped convolution runs a loop per group, tens of times torch's time; a sum over
taps of shifted input times that tap's weight is elementwise work XLA fuses into one loop.
How that loop is written decides its speed, as XLA:CPU keeps float adds in the order given and
emits each fused op as written: the taps add as a balanced tree (``_tree_sum``); up to
``FUSED_PAD_TAPS`` taps each tap's slice is padded inside the loop (``_cropped``), past that
the input is padded once, along rows only, and output rows that meet the same kernel rows are
summed as one band (``_row_bands``), or, on planes at most ``FLAT_WIDTH`` wide, the plane is
flattened so one vector spans several rows (``_flat``); strided, on narrow outputs, the input
is split into its phases so each tap is a stride-1 slice (``phase_slices``). ``depthwise_conv`` has its own gradients.
docs/design.md, "Convolution strategy", has the measurements.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.nn.functional._common import apart

__all__ = ["BATCH_CHUNK", "FLAT_WIDTH", "FUSED_PAD_TAPS", "PHASE_WIDTH", "SUMMED_POSITIONS", "SUMMED_SLICES", "SUMMED_SLICES_STRIDED", "BAND_WIDTH", "depthwise_conv", "live_taps", "live_weight",
           "phase_slices", "shifted", "taps_product", "taps_sum", "tree_sum"]


def live_taps(size: int, lo: int, lhs_dilation: int, out: int, stride: int, dilation: int, kernel: int):
    """The kernel taps along one axis that meet input data (not padding) at some output position."""
    data = {lo + i * lhs_dilation for i in range(size)}
    return tuple(k for k in range(kernel) if any(o * stride + dilation * k in data for o in range(out)))


def shifted(x, stride, pads, lhs_dilation, rhs_dilation, out, taps):
    """The padded input's strided slice under each kernel tap that meets data (the others only
    ever multiply zeros: ``live_weight`` drops them from the weight)."""
    zero = jnp.zeros((), x.dtype)
    x = jax.lax.pad(x, zero, [(0, 0, 0), (0, 0, 0)] + [(lo, hi, ld - 1) for (lo, hi), ld in zip(pads, lhs_dilation)])
    cols = []
    for tap in taps_product(taps):
        start = (0, 0, *(d * k for d, k in zip(rhs_dilation, tap)))
        limit = (*x.shape[:2], *(d * k + st * (o - 1) + 1 for d, k, st, o in zip(rhs_dilation, tap, stride, out)))
        cols.append(jax.lax.slice(x, start, limit, (1, 1, *stride)))
    return cols


# a tap sum of at most this many taps pads each tap's slice inside the fused loop; past that
# the fused pads cost more than one padded copy (docs/design.md)
FUSED_PAD_TAPS = 9
# strided tap sums past FUSED_PAD_TAPS taps split the input into phases when the output is at
# most this wide; on wider outputs the strided slices vectorize well enough (docs/design.md)
PHASE_WIDTH = 32
# planes at most this wide are flattened (a row fills at most half of an 8-float vector)
FLAT_WIDTH = 4


def _cropped(x, stride, pads, rhs_dilation, out, taps):
    """As ``shifted`` (no input dilation), each tap's slice taken from the unpadded input and
    zero-padded to the output's size: XLA fuses those pads into the loop that sums the taps,
    where one padded copy of the input is a pass over memory of its own."""
    zero = jnp.zeros((), x.dtype)
    cols = []
    for tap in taps_product(taps):
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


def live_weight(w, taps):
    """``w`` without the taps that only ever meet padding."""
    for axis, (t, k) in enumerate(zip(taps, w.shape[2:])):
        if len(t) < k:
            w = jnp.take(w, jnp.asarray(t), axis=axis + 2)
    return w


def taps_sum(x, w, stride, pads, lhs_dilation, rhs_dilation, out, taps):
    """A depthwise convolution (one input channel per group, ``w`` ``(C*m, 1, *kernel)``) as a
    sum over taps of shifted input times that tap's weight, one fused loop: the padding inside
    it up to ``FUSED_PAD_TAPS`` taps (``_cropped``); past that, at stride 1 in 2D, row bands
    (``_row_bands``) or a flattened plane (``_flat``), at larger strides in 2D on outputs at
    most ``PHASE_WIDTH`` wide the input's phases (``phase_slices``); otherwise one padded copy
    (``shifted``)."""
    n = x.ndim - 2
    channels, multiplier = x.shape[1], w.shape[0] // x.shape[1]
    plain = all(d == 1 for d in lhs_dilation)
    if multiplier == 1 and plain and math.prod(len(t) for t in taps) > FUSED_PAD_TAPS and n == 2 \
            and stride == (1, 1) and rhs_dilation == (1, 1):
        if tuple(out) == x.shape[2:] and x.shape[3] <= FLAT_WIDTH and min(min(p) for p in pads) >= 0:
            return _flat(x, w, pads, taps)
        return _row_bands(x, w, pads, out, taps)
    if multiplier == 1 and plain and math.prod(len(t) for t in taps) > FUSED_PAD_TAPS and n == 2 \
            and rhs_dilation == (1, 1) and out[1] <= PHASE_WIDTH:
        cols = phase_slices(x, w, stride, pads, out, taps)
        return tree_sum([col * w[:, 0, i, j].reshape(-1, 1, 1)
                         for col, (i, j) in zip(cols, taps_product(taps))])
    if multiplier == 1 and plain and math.prod(len(t) for t in taps) <= FUSED_PAD_TAPS:
        cols = _cropped(x, stride, pads, rhs_dilation, out, taps)
    else:
        cols = shifted(x, stride, pads, lhs_dilation, rhs_dilation, out, taps)
    w = live_weight(w, taps).reshape(channels, multiplier, len(cols))
    if multiplier == 1:  # no extra axis: a reshape between a fused pad and its use costs index arithmetic
        return tree_sum([col * w[:, 0, t].reshape(channels, *(1,) * n) for t, col in enumerate(cols)])
    terms = [col[:, :, None] * w[None, :, :, t].reshape(1, channels, -1, *(1,) * n) for t, col in enumerate(cols)]
    return tree_sum(terms).reshape(x.shape[0], -1, *out)


def phase_slices(x, w, stride, pads, out, taps):
    """``shifted``'s strided slice under each tap (2D, no dilation) as a stride-1 slice of the
    input's phases: phase
    ``(a, b)`` holds padded rows ``a, a + sh, ...`` and columns ``b, b + sw, ...`` (a
    space-to-depth), tap ``(i, j)`` is phase ``(i % sh, j % sw)`` shifted by
    ``(i // sh, j // sw)``. XLA fuses any slice into the loop that sums the taps, where strided
    reads do not vectorize (8x72x28x28 5x5 /2: 0.44 ms against 0.13 from split phases), so the
    phases are made behind a conditional on the data, whose two branches are the same split:
    XLA cannot decide it at compile time and writes the phases out, one pass over the input."""
    (sh, sw), (oh, ow) = stride, out
    used = sorted({(i % sh, j % sw) for i in taps[0] for j in taps[1]})
    reach = (oh + max(taps[0]) // sh, ow + max(taps[1]) // sw)  # phase rows and columns the taps read

    def split(x):
        zero = jnp.zeros((), x.dtype)
        phases = []
        for offsets in used:
            start, limit, margins = [0, 0], list(x.shape[:2]), [(0, 0, 0), (0, 0, 0)]
            for size, (lo, _), st, a, m in zip(x.shape[2:], pads, stride, offsets, reach):
                # phase index p reads input row a + st * p - lo
                first = max(0, -(-(lo - a) // st))
                last = min(m - 1, (size - 1 + lo - a) // st)
                if first > last:  # only padding: an empty slice padded to m
                    first, last = 0, -1
                start.append(max(0, a + st * first - lo))
                limit.append(max(0, a + st * last - lo + 1))
                margins.append((first, m - 1 - last, 0))
            col = jax.lax.slice(x, start, limit, (1, 1, *stride))
            phases.append(jax.lax.pad(col, zero, margins))
        return phases

    phases = dict(zip(used, jax.lax.cond(w[0, 0, 0, 0] == w[0, 0, 0, 0], split, split, x)))
    return [jax.lax.slice(phases[i % sh, j % sw], (0, 0, i // sh, j // sw), (*x.shape[:2], i // sh + oh, j // sw + ow))
            for i in taps[0] for j in taps[1]]


def _row_bands(x, w, pads, out, taps):
    """A stride-1 2D depthwise convolution with the input padded along its rows only: output
    rows that meet the same kernel rows (the border rows each, the interior as one band) are
    one tap sum over those kernel rows, and the bands are concatenated. No padded rows are
    written or multiplied (a 7x7 kernel on a 7x7 plane: 37 of its 49 row products)."""
    (lo, _), (left, right) = pads
    height, (out_h, out_w) = x.shape[2], out
    xw = jax.lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, 0, 0), (0, 0, 0), (left, right, 0)])
    meets = [tuple(i for i in taps[0] if 0 <= q + i - lo < height) for q in range(out_h)]
    bands, start = [], 0
    for q in range(1, out_h + 1):
        if q == out_h or meets[q] != meets[start]:
            rows = q - start
            terms = [jax.lax.slice(xw, (0, 0, start + i - lo, j), (*x.shape[:2], start + i - lo + rows, j + out_w))
                     * w[:, 0, i, j].reshape(-1, 1, 1) for i in meets[start] for j in taps[1]]
            bands.append(tree_sum(terms) if terms else jnp.zeros((*x.shape[:2], rows, out_w), x.dtype))
            start = q
    return bands[0] if len(bands) == 1 else jnp.concatenate(bands, axis=2)


def _flat(x, w, pads, taps):
    """A stride-1 2D depthwise convolution with an output the input's size, on a narrow plane:
    the plane flattened, padded by whole rows (and the column padding) at either end, tap
    (i, j) the slice starting at ``i * width + j``, with the columns where the tap falls off a
    row (it reads the next row there) set to zero. A 4-wide plane fills whole vectors, where row
    by row it fills half of each."""
    (top, bottom), (left, right) = pads
    batch, channels, height, width = x.shape
    flat = jax.lax.pad(x.reshape(batch, channels, height * width), jnp.zeros((), x.dtype),
                       [(0, 0, 0), (0, 0, 0), (top * width + left, bottom * width + right, 0)])
    column = np.arange(height * width) % width
    terms = []
    for i in taps[0]:
        for j in taps[1]:
            col = jax.lax.slice_in_dim(flat, i * width + j, i * width + j + height * width, axis=2)
            inside = (column + j - left >= 0) & (column + j - left < width)
            if not inside.all():
                col = jnp.where(inside, col, jnp.zeros((), x.dtype))
            terms.append(col * w[:, 0, i, j].reshape(-1, 1))
    return tree_sum(terms).reshape(x.shape)


def tree_sum(terms):
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
    taps = tuple(live_taps(s, lo, 1, o, st, d, k)
                 for s, (lo, _), o, st, d, k in zip(x_shape[2:], pads, out, stride, rhs_dilation, kernel))
    return out, taps


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def depthwise_conv(x, w, stride, pads, rhs_dilation):
    """A depthwise convolution (``w`` ``(C, 1, *kernel)``) as a tap sum, whose input gradient is
    a tap sum too: the transposed convolution written as a forward one (the output gradient
    dilated by the stride, padded, against the flipped kernel), one fused loop where autodiff
    of the forward gives one pad per tap. The weight gradient is banded (``_weight_grad_banded``)
    where that pays, else summed over the batch before one reduction (``_weight_grad_taps``).
    A ``custom_vjp`` whose backward is plain jnp, so a
    gradient of a gradient (torch's ``create_graph=True``: gradient penalties, meta-learning)
    differentiates through it; forward mode (``jax.jvp``, ``jax.hessian``) is refused by JAX for a
    ``custom_vjp`` and runs under ``strategy("xla")`` (docs/design.md)."""
    out, taps = _depthwise_plan(x.shape, w.shape[2:], stride, pads, rhs_dilation)
    body = functools.partial(taps_sum, stride=stride, pads=pads, lhs_dilation=(1,) * len(stride),
                             rhs_dilation=rhs_dilation, out=out, taps=taps)
    return apart(body, x, w)


def _depthwise_fwd(x, w, stride, pads, rhs_dilation):
    return depthwise_conv(x, w, stride, pads, rhs_dilation), (x, w)


def _depthwise_bwd(stride, pads, rhs_dilation, residuals, g):
    x, w = residuals
    return _input_grad(g, w, x.shape, stride, pads, rhs_dilation), _weight_grad(x, g, w, stride, pads, rhs_dilation)


depthwise_conv.defvjp(_depthwise_fwd, _depthwise_bwd)


def _weight_grad(x, g, w, stride, pads, rhs_dilation):
    if _banded(x.shape, w.shape, stride, pads, rhs_dilation):
        return _weight_grad_banded(x, g, w.shape[2:], pads)
    return _weight_grad_taps(x, g, w, stride, pads, rhs_dilation)


# the products of each tap are summed elementwise over the examples of a chunk of the batch,
# then over halves of the first spatial axis while fewer than this many slices and each half
# keeps at least SUMMED_POSITIONS positions, before one reduction (docs/design.md)
SUMMED_SLICES = 32
SUMMED_POSITIONS = 196
# strided, the split halves cost more than they save (8x72x56x56 3x3 /2: 2.2 against 1.4 ms)
SUMMED_SLICES_STRIDED = 8
# the weight gradient runs over the batch in chunks of this many examples, a loop whose
# partial gradients add up: each tap's pass then reads a chunk that stays in cache
BATCH_CHUNK = 8


def _weight_grad_taps(x, g, w, stride, pads, rhs_dilation):
    """The weight gradient of a depthwise convolution: tap t's is ``sum(shifted_t(x) * g)`` over
    examples and positions (strided 2D: ``shifted_t`` from the input's phases, ``phase_slices``). XLA:CPU keeps a reduction's adds in order, one dependent add per
    element (autodiff of the tap sum: 4 ms for 8x32x56x56 3x3, torch 0.6 ms); here the products
    are first summed as a tree over the examples (and halves of the first spatial axis while
    fewer than ``SUMMED_SLICES`` and each half keeps ``SUMMED_POSITIONS`` positions),
    elementwise in one vectorized loop, and the reduction runs over what is left. Each tap's
    loop reads the whole input and output gradient, so a batch of more than ``BATCH_CHUNK``
    examples is taken ``BATCH_CHUNK`` at a time (a ``fori_loop`` adding the chunks' gradients),
    each chunk read 49 times (7x7) from cache rather than memory. It runs apart from what
    produced ``x`` and ``g`` (``apart``; the loop's boundary does that for a chunked batch):
    fused, each tap's loop computed the producer again (a GroupNorm's backward before a
    ConvNeXt block's depthwise convolution: 49 times per step)."""
    kernel = w.shape[2:]
    out, taps = _depthwise_plan(x.shape, kernel, stride, pads, rhs_dilation)
    n, channels = len(kernel), x.shape[1]
    if not all(taps):
        return jnp.zeros((channels, 1, *kernel), x.dtype)

    slices = SUMMED_SLICES if all(st == 1 for st in stride) else SUMMED_SLICES_STRIDED

    def chunk_grad(x, g):
        sums = []
        if n == 2 and stride != (1, 1) and rhs_dilation == (1, 1) and out[1] <= PHASE_WIDTH:  # as the forward
            cols = phase_slices(x, w, stride, pads, out, taps)
        else:
            cols = shifted(x, stride, pads, (1,) * n, rhs_dilation, out, taps)
        for col in cols:
            parts = [col[b] * g[b] for b in range(x.shape[0])]
            while len(parts) < slices and parts[0].shape[1] % 2 == 0 \
                    and math.prod(parts[0].shape[1:]) >= 2 * SUMMED_POSITIONS:
                half = parts[0].shape[1] // 2
                parts = [q for p in parts for q in (p[:, :half], p[:, half:])]
            sums.append(tree_sum(parts))
        return jnp.sum(jnp.stack(sums, axis=1), axis=tuple(range(2, n + 2)))  # (C, live taps)

    batch = x.shape[0]
    chunks, rest = divmod(batch, BATCH_CHUNK)
    if chunks <= 1:  # apart: XLA fuses g's producer (a norm's backward) into every tap's loop
        grad = apart(chunk_grad, x, g)
    else:
        def body(i, acc):
            start = i * BATCH_CHUNK
            return acc + chunk_grad(jax.lax.dynamic_slice_in_dim(x, start, BATCH_CHUNK),
                                    jax.lax.dynamic_slice_in_dim(g, start, BATCH_CHUNK))
        grad = jax.lax.fori_loop(0, chunks, body, jnp.zeros((channels, math.prod(len(t) for t in taps)), x.dtype))
        if rest:
            grad = grad + chunk_grad(x[batch - rest:], g[batch - rest:])
    if grad.shape[1] < math.prod(kernel):  # taps that only meet padding get zero
        flat = [sum(t * math.prod(kernel[a + 1:]) for a, t in enumerate(tap)) for tap in taps_product(taps)]
        grad = jnp.zeros((channels, math.prod(kernel)), x.dtype).at[:, jnp.asarray(flat)].set(grad)
    return grad.reshape(channels, 1, *kernel)


def _input_grad(g, w, x_shape, stride, pads, rhs_dilation):
    # x[i] meets g[o] through tap k where o * stride + d * k = i + lo: a stride-1 correlation of
    # g dilated by the stride, padded by d(k-1) - lo before and (size + lo - (out-1) stride - 1) after
    kernel, sizes, outs = w.shape[2:], x_shape[2:], g.shape[2:]
    back_pads = tuple((d * (k - 1) - lo, s + lo - (o - 1) * st - 1)
                      for d, k, (lo, _), s, o, st in zip(rhs_dilation, kernel, pads, sizes, outs, stride))
    taps = tuple(live_taps(o, lo, st, s, 1, d, k)
                 for o, (lo, _), st, s, d, k in zip(outs, back_pads, stride, sizes, rhs_dilation, kernel))
    if any(not t for t in taps):
        return jnp.zeros(x_shape, g.dtype)
    flipped = jnp.flip(w, axis=tuple(range(2, w.ndim)))
    body = functools.partial(taps_sum, stride=(1,) * len(stride), pads=back_pads, lhs_dilation=stride,
                             rhs_dilation=rhs_dilation, out=sizes, taps=taps)
    return apart(body, g, flipped)

# the banded weight gradient multiplies (padded width / kernel width) times the products it
# needs, and every tap's, live or not: it pays while the padded width is at most this many
# kernel widths and every tap meets data (docs/design.md)
BAND_WIDTH = 2


def _banded(x_shape, w_shape, stride, pads, rhs_dilation) -> bool:
    if not (len(x_shape) == 4 and stride == (1, 1) and rhs_dilation == (1, 1)
            and x_shape[3] + sum(pads[1]) <= BAND_WIDTH * w_shape[3]):
        return False
    _, taps = _depthwise_plan(x_shape, w_shape[2:], stride, pads, rhs_dilation)
    return all(len(t) == k for t, k in zip(taps, w_shape[2:]))


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


def taps_product(axes):
    """Every combination of one live tap per axis, row-major."""
    result = [()]
    for taps in axes:
        result = [r + (t,) for r in result for t in taps]
    return result
