"""How a convolution is computed: XLA's ``lax.conv_general_dilated``, patches + one ``einsum``
(im2col) or a sum over kernel taps, chosen at trace time from static shapes.

XLA:CPU runs some convolutions on a slow path: a kernel that covers (almost) all of a small
input, as the last stage of a ResNet at 2x2 or 1x1 spatial, is lowered with batch-last
dimension labels and a reversed kernel and runs 10-50x slower than torch. The same
convolution as zero padding, one strided slice per kernel tap and one ``dot_general`` over
(channels, taps) takes a matrix multiply's time. Taps that only ever meet padding are dropped
first (a 3x3 kernel with padding 1 on a 1x1 input is a 1x1 kernel: a plain matrix multiply).
Where each output sums at most ``SHORT_CONTRACTION`` products, the forward writes that sum out
(``_short_sum``), the einsum its derivative. Depthwise convolutions are sums over taps
(``conv_depthwise``), with their own gradients when each channel has one output. An XLA
convolution on the CPU whose batch's input passes ``WEIGHT_GRAD_CHUNK_BYTES`` takes its weight
gradient over chunks of the batch (``_chunked_weight_grad``). A 3x3 stride-1 convolution with
at least ``WINOGRAD_MIN_CHANNELS`` channels each side is Winograd's F(2x2, 3x3) on the CPU
(``conv_winograd``, ``winograd_pays``).
The rule (``choose``) and the measurements behind it are in docs/design.md, "Convolution
strategy".

``strategy("xla" | "im2col" | "taps" | "winograd" | "auto")`` forces one (a context manager,
read when a function is traced: a jitted function keeps the strategy it was traced with).
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp

from jax.custom_derivatives import SymbolicZero

from funcnet.nn.functional.conv_depthwise import (depthwise_conv, live_taps, live_weight, phase_slices, shifted,
                                                   taps_sum, tree_sum)
from funcnet.nn.functional.conv_winograd import winograd_conv

__all__ = ["LONG_CONTRACTION", "PATCH_BYTES", "POINTWISE_POSITIONS", "SHORT_CONTRACTION", "SMALL_OUTPUT", "STRATEGIES",
           "WEIGHT_GRAD_CHUNK_BYTES", "WINOGRAD_MAX_POSITIONS", "WINOGRAD_MAX_WASTE", "WINOGRAD_MIN_CHANNELS", "choose",
           "convolve", "strategy", "weight_grad_chunk", "winograd_pays", "winograd_shape"]

STRATEGIES = ("auto", "xla", "im2col", "taps", "winograd")
_current = ["auto"]
_SPATIAL = {1: "L", 2: "HW", 3: "DHW"}
# im2col when the output has at most this many positions per image, each output sums at
# least this many products and the patches take at most PATCH_BYTES (see docs/design.md)
SMALL_OUTPUT = 64
LONG_CONTRACTION = 2048
PATCH_BYTES = 4 * 2**20
# im2col too when each output sums at most this many products (1-3 input channels, a 3x3
# kernel: a network's first layer), where XLA:CPU's convolution is 3-9x torch's forward time
SHORT_CONTRACTION = 32
# XLA:CPU's weight gradient costs up to 5x more per example once an operand outgrows the
# cache: it is computed over chunks of the batch whose input takes at most this many bytes
# (``weight_grad_chunk``, docs/design.md)
WEIGHT_GRAD_CHUNK_BYTES = 2 * 2**20
# a 1x1 convolution with at least this many output positions per image is one matrix multiply
# per example in the channels-first layout (``_pointwise``); on smaller planes the patches'
# single matrix multiply over all examples' positions is faster (docs/design.md)
POINTWISE_POSITIONS = 784
# a 3x3 stride-1 convolution by Winograd's F(2x2, 3x3) (``winograd_conv``) where its train step
# measured faster than XLA's: both channel counts at least this, the 2x2 tiles covering at most
# this many times the output's positions, at most this many output positions in the batch (64
# examples of 28x28; past it the forward lost at 128 channels) (docs/design.md)
WINOGRAD_MIN_CHANNELS = 128
WINOGRAD_MAX_WASTE = 1.2
WINOGRAD_MAX_POSITIONS = 64 * 28 * 28


@contextlib.contextmanager
def strategy(name: str):
    """Force how convolutions traced inside the block are computed: ``"xla"`` (one
    ``lax.conv_general_dilated``), ``"im2col"`` (patches + one ``einsum``), ``"taps"`` (a sum
    over kernel taps of shifted input times weight, elementwise: for depthwise convolutions;
    other groupings fall back to im2col), ``"winograd"`` (F(2x2, 3x3) for a 3x3 kernel at stride
    1, one group, no dilation; others fall back to XLA's) or ``"auto"`` (the default: chosen per
    shape by ``choose``)."""
    if name not in STRATEGIES:
        raise ValueError(f"conv strategy must be one of {STRATEGIES}, got {name!r}")
    old = _current[0]
    _current[0] = name
    try:
        yield
    finally:
        _current[0] = old


def choose(in_sizes, out_sizes, kernel, taps, lhs_dilation, depthwise: bool, contraction: int,
           patch_bytes: int) -> str:
    """The strategy for one convolution from its static shapes (docs/design.md has the table):
    im2col where XLA:CPU's convolution is slow (a kernel that spans the whole input, taps that
    only meet padding, a contraction of at most 32 products, or few output positions per image
    with a long contraction and patches that stay in cache) and on a
    single tap (a matrix multiply); a sum over taps for depthwise; XLA elsewhere.
    ``contraction``: input channels per group times taps; ``patch_bytes``: the size of the
    patches im2col would write (batch x input channels x live taps x output positions x item
    size). Accelerators always get XLA's convolution (cuDNN has no such cliff)."""
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
            math.prod(out_sizes) <= SMALL_OUTPUT and contraction >= LONG_CONTRACTION and patch_bytes <= PATCH_BYTES):
        return "im2col"
    return "xla"


def convolve(x, w, stride, pads, lhs_dilation, rhs_dilation, groups: int):
    """``lax.conv_general_dilated(x, w)`` with torch's layouts (``x`` ``(N, C, *spatial)``, ``w``
    ``(O, C/groups, *kernel)``) at HIGHEST precision, by the strategy ``choose`` picks."""
    kernel = w.shape[2:]
    out = tuple((s * ld - ld + 1 + lo + hi - d * (k - 1) - 1) // st + 1
                for s, ld, (lo, hi), d, k, st in zip(x.shape[2:], lhs_dilation, pads, rhs_dilation, kernel, stride))
    taps = tuple(live_taps(s, lo, ld, o, st, d, k)
                 for s, (lo, _), ld, o, st, d, k in zip(x.shape[2:], pads, lhs_dilation, out, stride, rhs_dilation,
                                                        kernel))
    depthwise = w.shape[1] == 1 and groups > 1
    patch_bytes = x.shape[0] * x.shape[1] * math.prod(len(t) for t in taps) * math.prod(out) * x.dtype.itemsize
    how = choose(x.shape[2:], out, kernel, taps, lhs_dilation, depthwise, w.shape[1] * math.prod(kernel), patch_bytes)
    if how == "taps" and not depthwise:
        how = "im2col"
    if how == "winograd" and winograd_shape(w, stride, lhs_dilation, rhs_dilation, groups) or \
            how == "xla" and _current[0] == "auto" and winograd_pays(x, w, stride, lhs_dilation, rhs_dilation, groups, out):
        return winograd_conv(x, w, tuple(map(tuple, pads)))
    if how == "winograd":
        how = "xla"
    if how == "xla" and _current[0] == "auto" and all(d == 1 for d in lhs_dilation) and all(taps) \
            and jax.default_backend() == "cpu":
        chunk = weight_grad_chunk(x)
        if chunk < x.shape[0]:
            return _chunked_weight_grad(x, w, tuple(stride), tuple(map(tuple, pads)), tuple(rhs_dilation), groups,
                                        chunk)
    if how == "xla" or any(not t for t in taps):
        return _xla_conv(x, w, tuple(stride), pads, tuple(rhs_dilation), groups, tuple(lhs_dilation))
    if how == "taps":
        if w.shape[0] == x.shape[1] and all(d == 1 for d in lhs_dilation):
            return depthwise_conv(x, w, tuple(stride), tuple(pads), tuple(rhs_dilation))
        return taps_sum(x, w, stride, pads, lhs_dilation, rhs_dilation, out, taps)
    if groups == 1 and all(k == 1 for k in kernel) and all(st == 1 for st in stride) \
            and all(p == (0, 0) for p in pads) and all(d == 1 for d in lhs_dilation) \
            and math.prod(out) >= POINTWISE_POSITIONS:
        return _pointwise(x, w)
    return _im2col(x, w, stride, pads, lhs_dilation, rhs_dilation, groups, out, taps)


def _pointwise(x, w):
    """A 1x1 convolution (stride 1, no padding) as one matrix multiply per example, ``w (O, C)``
    times ``x[n] (C, positions)``, batched over the examples with the weight broadcast: the
    operands and the output keep their channels-first layout. The patches' einsum contracts the
    channels of all examples' positions at once, for which XLA:CPU copies ``x`` to
    ``(N*H*W, C)`` and the output back (and their gradients likewise): at 8x40x56x56 -> 160 the
    train step took 25 against 5 ms (torch 17)."""
    batch, channels = x.shape[:2]
    wb = jnp.broadcast_to(w.reshape(w.shape[0], channels), (batch, w.shape[0], channels))
    y = jax.lax.dot_general(wb, x.reshape(batch, channels, -1), (((2,), (1,)), ((0,), (0,))),
                            precision=jax.lax.Precision.HIGHEST)
    return y.reshape(batch, w.shape[0], *x.shape[2:])


def _im2col(x, w, stride, pads, lhs_dilation, rhs_dilation, groups, out, taps):
    if groups == 1 and all(d == 1 for d in lhs_dilation) and \
            x.shape[1] * math.prod(len(t) for t in taps) <= SHORT_CONTRACTION:
        return _short_sum(x, w, tuple(stride), tuple(pads), tuple(rhs_dilation), tuple(out), tuple(taps))
    return _patches_einsum(x, w, stride, pads, lhs_dilation, rhs_dilation, groups, out, taps)


def _patches_einsum(x, w, stride, pads, lhs_dilation, rhs_dilation, groups, out, taps):
    n = x.ndim - 2
    cols, w = shifted(x, stride, pads, lhs_dilation, rhs_dilation, out, taps), live_weight(w, taps)
    batch, channels, n_taps = x.shape[0], x.shape[1], len(cols)
    # (N, G, C/G, T, *out) against (G, O/G, C/G, T): one batched matrix multiply per group
    patches = jnp.stack(cols, axis=2).reshape(batch, groups, channels // groups, n_taps, *out)
    w = w.reshape(groups, w.shape[0] // groups, w.shape[1], n_taps)
    letters = "XYZ"[:n]
    y = jnp.einsum(f"ngct{letters},goct->ngo{letters}", patches, w, precision=jax.lax.Precision.HIGHEST)
    return y.reshape(batch, -1, *out)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5, 6))
def _short_sum(x, w, stride, pads, rhs_dilation, out, taps):
    """A convolution whose outputs each sum at most ``SHORT_CONTRACTION`` products (1-3 input
    channels, a 3x3 kernel: a first layer), written out as the sum over input channels and taps
    of the shifted input times that weight, one fused loop (a balanced tree of adds): half the
    time of the patches' matrix multiply, whose contraction is too short to pay for the patches
    and the transposes around it (8x3x32x32 3x3 -> 32: 0.24 against 0.53 ms, torch 0.30). Its
    A strided 2D one (a 3x3 stride-2 stem) reads stride-1 slices of the input's phases, as
    the depthwise tap sum does (8x3x224x224 -> 16: 1.8 against 3.5 ms, torch 1.7). Its
    derivatives are the patches' einsum (``_patches_einsum``), linear in each argument, so
    reverse mode transposes that as before and forward mode works."""
    n = x.ndim - 2
    if n == 2 and stride != (1, 1) and rhs_dilation == (1, 1):  # a strided stem: stride-1 reads of phases
        cols = phase_slices(x, w, stride, pads, out, taps)
    else:
        cols = shifted(x, stride, pads, (1,) * n, rhs_dilation, out, taps)
    w = live_weight(w, taps).reshape(w.shape[0], x.shape[1], len(cols))
    return tree_sum([col[:, c, None] * w[:, c, t].reshape(-1, *(1,) * n)
                     for t, col in enumerate(cols) for c in range(x.shape[1])])


def _short_sum_jvp(stride, pads, rhs_dilation, out, taps, primals, tangents):
    x, w = primals
    dx, dw = tangents
    lhs_dilation = (1,) * len(stride)
    y = _short_sum(x, w, stride, pads, rhs_dilation, out, taps)
    terms = [_patches_einsum(a, b, stride, pads, lhs_dilation, rhs_dilation, 1, out, taps)
             for a, b in ((dx, w), (x, dw)) if not isinstance(a if a is dx else b, SymbolicZero)]
    return y, (tree_sum(terms) if terms else jnp.zeros_like(y))


_short_sum.defjvp(_short_sum_jvp, symbolic_zeros=True)


def winograd_shape(w, stride, lhs_dilation, rhs_dilation, groups) -> bool:
    """Whether ``winograd_conv`` computes this convolution: a 2D 3x3 kernel, stride 1, no
    dilation, one group."""
    return (w.ndim == 4 and w.shape[2:] == (3, 3) and groups == 1 and all(s == 1 for s in stride)
            and all(d == 1 for d in lhs_dilation) and all(d == 1 for d in rhs_dilation))


def winograd_pays(x, w, stride, lhs_dilation, rhs_dilation, groups, out) -> bool:
    """Whether ``"auto"`` computes this convolution by ``winograd_conv``: on the CPU, in float32,
    with at least ``WINOGRAD_MIN_CHANNELS`` input and output channels, an output whose 2x2 tiles
    cover at most ``WINOGRAD_MAX_WASTE`` times its positions (not 7x7: 8x8 of tiles) and at most
    ``WINOGRAD_MAX_POSITIONS`` output positions in the batch (docs/design.md, "Winograd")."""
    if not winograd_shape(w, stride, lhs_dilation, rhs_dilation, groups) or jax.default_backend() != "cpu" \
            or x.dtype != jnp.float32 or min(w.shape[:2]) < WINOGRAD_MIN_CHANNELS or min(out) < 1:
        return False
    tiled = math.prod(-(-o // 2) * 2 for o in out)
    return tiled <= WINOGRAD_MAX_WASTE * math.prod(out) and x.shape[0] * math.prod(out) <= WINOGRAD_MAX_POSITIONS


def weight_grad_chunk(x) -> int:
    """How many examples of ``x`` (``(N, C, *spatial)``) one chunk of XLA's weight gradient
    takes: the largest divisor of the batch whose input is at most ``WEIGHT_GRAD_CHUNK_BYTES``
    (at least one example)."""
    batch = x.shape[0]
    limit = max(1, WEIGHT_GRAD_CHUNK_BYTES // max(1, math.prod(x.shape[1:]) * x.dtype.itemsize))
    return max((d for d in range(1, min(batch, limit) + 1) if batch % d == 0), default=batch)  # an empty batch: 0


def _xla_conv(x, w, stride, pads, rhs_dilation, groups, lhs_dilation=None):
    """One ``lax.conv_general_dilated`` in torch's layouts at HIGHEST precision."""
    spatial = _SPATIAL[x.ndim - 2]
    return jax.lax.conv_general_dilated(
        x, w, window_strides=stride, padding=list(pads), lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=("NC" + spatial, "OI" + spatial, "NC" + spatial), feature_group_count=groups,
        precision=jax.lax.Precision.HIGHEST)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5, 6))
def _chunked_weight_grad(x, w, stride, pads, rhs_dilation, groups, chunk):
    """XLA's convolution whose weight gradient is summed over chunks of ``chunk`` examples.

    On XLA:CPU the weight gradient's time per example grows up to 5x once the batch's input
    outgrows a few MiB (one core, 64x128x28x28 3x3: 760 ms at batch 64 against 8 chunks of 8
    at 22 ms). The tangent in the weight is the convolution of ``x`` with it, one chunk of the
    batch at a time, concatenated (unrolled: as a ``lax.map`` loop the ResNet-style train step
    took 5x longer); reverse mode transposes it into a sum over the chunks of each chunk's
    weight gradient. The input's tangent (and so its gradient) and the forward are XLA's
    convolution of the whole batch."""
    return _xla_conv(x, w, stride, pads, rhs_dilation, groups)


def _chunked_weight_grad_jvp(stride, pads, rhs_dilation, groups, chunk, primals, tangents):
    x, w = primals
    dx, dw = tangents
    y = _xla_conv(x, w, stride, pads, rhs_dilation, groups)
    terms = []
    if not isinstance(dx, SymbolicZero):
        terms.append(_xla_conv(dx, w, stride, pads, rhs_dilation, groups))
    if not isinstance(dw, SymbolicZero):
        terms.append(jnp.concatenate([_xla_conv(x[i:i + chunk], dw, stride, pads, rhs_dilation, groups)
                                      for i in range(0, x.shape[0], chunk)], axis=0))
    return y, (tree_sum(terms) if terms else jnp.zeros_like(y))


_chunked_weight_grad.defjvp(_chunked_weight_grad_jvp, symbolic_zeros=True)
