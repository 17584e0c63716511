"""Pooling, as torch.nn's: MaxPool1d/2d, AvgPool1d/2d, AdaptiveAvgPool1d/2d. No params, no state.

Inputs are channels-first, batched ``(N, C, *spatial)`` or unbatched ``(C, *spatial)``; the
window slides over the trailing spatial axes only. Output sizes follow torch's
``pooling_output_shape``: ``(L + 2*padding - dilation*(k-1) - 1) / stride + 1`` rounded down,
or up with ``ceil_mode=True``, where a last window that would start in the right padding is
dropped. Sum windows are one ``jax.lax.reduce_window``; max windows are torch's search loop
run over every window at once, one tap at a time (elementwise, with a gradient that is a
select rather than XLA's select-and-scatter); the divisors of AvgPool and the bins of
AdaptiveAvgPool depend only on shapes and are computed with numpy at trace time.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.nn.activation import _no_params
from funcnet.nn.conv import _ntuple
from funcnet.nn.module import Module

__all__ = ["MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d"]

_SHAPES = {1: ("(C, L)", "(N, C, L)"), 2: ("(C, H, W)", "(N, C, H, W)")}


def _check_input(x, n: int, name: str):
    x = jnp.asarray(x)
    if x.ndim not in (n + 1, n + 2) or x.size == 0:
        unbatched, batched = _SHAPES[n]
        raise ValueError(f"{name}: expected a non-empty {n + 1}D (unbatched) input {unbatched} or {n + 2}D "
                         f"(batched) input {batched}, got shape {tuple(x.shape)}; reshape the input to {batched}")
    return x


def _output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape for one axis."""
    span = d * (k - 1) + 1
    out = (size + 2 * p - span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window would start in the right padding: torch drops it
    return out


def _check_padding(kernel, padding, dilation, name):
    for k, p, d in zip(kernel, padding, dilation):
        if p > (d * (k - 1) + 1) // 2:
            raise ValueError(f"{name}: padding={p} is more than half the (dilated) kernel size {d * (k - 1) + 1} "
                             f"(torch refuses it: a window could hold only padding); lower the padding")


def _geometry(sizes, kernel, stride, padding, dilation, ceil_mode, name):
    """torch's output size per axis, and the (left, right) padding that covers every window."""
    out = tuple(_output_size(L, k, s, p, d, ceil_mode)
                for L, k, s, p, d in zip(sizes, kernel, stride, padding, dilation))
    if min(out) < 1:
        raise ValueError(f"{name}: input of spatial size {tuple(sizes)} gives output size {out}, too small; use a "
                         f"larger input or a smaller kernel_size")
    # pad right far enough for the last (ceil_mode) window; the windows past torch's count are cut off
    pads = [(p, max((o - 1) * s + d * (k - 1) + 1 - L - p, p))
            for L, k, s, p, d, o in zip(sizes, kernel, stride, padding, dilation, out)]
    return out, pads


def _windows(x, n, kernel, stride, padding, dilation, ceil_mode, name, init, op):
    """reduce_window of ``op`` over the last ``n`` axes, padded with ``init``, torch's output size."""
    out, pads = _geometry(x.shape[-n:], kernel, stride, padding, dilation, ceil_mode, name)
    lead = x.ndim - n
    y = jax.lax.reduce_window(x, init, op, (1,) * lead + tuple(kernel), (1,) * lead + tuple(stride),
                              [(0, 0)] * lead + pads, window_dilation=(1,) * lead + tuple(dilation))
    return y[(...,) + tuple(slice(0, o) for o in out)], out


def _tap_ranks(sizes, kernel, stride, padding, dilation, out) -> np.ndarray:
    """``(*out, K)``: each window's taps numbered row-major, ``k`` for a tap inside the input and
    ``K + k`` for one in the padding."""
    inside = np.ones((), bool)
    for L, k, s, p, d, o in zip(sizes, kernel, stride, padding, dilation, out):
        pos = (np.arange(o) * s - p)[:, None] + np.arange(k)[None, :] * d  # (o, k)
        ok = (pos >= 0) & (pos < L)
        inside = np.logical_and.outer(inside, ok)
    # axes (o1, k1, o2, k2, ...) -> (o1, o2, ..., k1, k2, ...)
    inside = inside.transpose(tuple(range(0, 2 * len(out), 2)) + tuple(range(1, 2 * len(out), 2)))
    inside = inside.reshape(tuple(out) + (-1,))
    K = inside.shape[-1]
    return np.where(inside, np.arange(K), K + np.arange(K))


def _taps(x, n, kernel, stride, dilation, out):
    """The window's taps of ``x`` (already padded), row-major over the kernel: each a strided
    slice of shape ``(..., *out)``."""
    return [x[(...,) + tuple(slice(i * d, i * d + (o - 1) * s + 1, s)
                             for i, d, o, s in zip(offset, dilation, out, stride))]
            for offset in itertools.product(*(range(k) for k in kernel))]


def _lowest(dtype) -> np.ndarray:
    return np.array(-np.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


def _pool_geometry(x, n, kernel, stride, padding, dilation, ceil_mode, name):
    out, pads = _geometry(x.shape[-n:], kernel, stride, padding, dilation, ceil_mode, name)
    pads = [(0, 0)] * (x.ndim - n) + pads
    blocked = tuple(stride) == tuple(kernel) and all(d == 1 for d in dilation)
    return out, pads, blocked


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3, 4, 5, 6, 7))
def _max_windows(x, n, kernel, stride, padding, dilation, ceil_mode, name):
    """Each window's maximum, as torch's max-pool loop (a NaN wins its window), one tap at a
    time over every window at once: elementwise, faster than reduce_window on XLA:CPU. The
    gradient (the jvp below) needs the winners, which the variadic reduce finds."""
    out, pads, _ = _pool_geometry(x, n, kernel, stride, padding, dilation, ceil_mode, name)
    lowest = _lowest(x.dtype)
    best = None
    for tap in _taps(jnp.pad(x, pads, constant_values=lowest), n, kernel, stride, dilation, out):
        if best is None:
            best = tap
        elif jnp.issubdtype(x.dtype, jnp.floating):
            best = jnp.where((tap > best) | jnp.isnan(tap), tap, best)
        else:
            best = jnp.maximum(tap, best)
    return best


def _max_and_argmax(x, n, kernel, stride, padding, dilation, ceil_mode, name):
    """Each window's maximum and the row-major index in the window of the tap that holds it,
    as torch's max-pool loop finds them: the first maximum, or the last NaN if there is one
    (the loop replaces its running max by a greater value or a NaN). One variadic reduce over
    the stacked taps: a reduction stays an array of its own in XLA, so the gradient reads
    the index instead of recomputing the search (and what produced x) inside its own loop."""
    out, pads, _ = _pool_geometry(x, n, kernel, stride, padding, dilation, ceil_mode, name)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    lowest = _lowest(x.dtype)
    taps = _taps(jnp.pad(x, pads, constant_values=lowest), n, kernel, stride, dilation, out)
    K = len(taps)
    index_dtype = jnp.int8 if 2 * K <= 127 else jnp.int32
    # a tap in the padding ranks after every tap of the input on a tie (K + k): torch's search
    # starts at the window's first element inside the input
    rank = _tap_ranks(x.shape[-n:], kernel, stride, padding, dilation, out)
    values = jnp.stack(taps, axis=-1)
    ranks = jnp.broadcast_to(jnp.asarray(rank, index_dtype), values.shape)

    def better(a, b):
        (va, ia), (vb, ib) = a, b
        if floating:
            a_nan, b_nan = va != va, vb != vb
            take_b = jnp.where(a_nan | b_nan, b_nan & (~a_nan | (ib > ia)), (vb > va) | ((vb == va) & (ib < ia)))
        else:
            take_b = (vb > va) | ((vb == va) & (ib < ia))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    best, index = jax.lax.reduce((values, ranks), (lowest, np.array(2 * K, index_dtype)), better, (values.ndim - 1,))
    return best, index


@_max_windows.defjvp
def _max_windows_jvp(n, kernel, stride, padding, dilation, ceil_mode, name, primals, tangents):
    # The tangent of each window is the tangent of the tap that won. Written so that its
    # transpose (the gradient) is cheap: for non-overlapping windows a reshape into
    # (..., out, kernel) blocks and a select, no scatter (XLA:CPU's select-and-scatter, the
    # gradient of reduce_window, is several times slower on small images).
    (x,), (t,) = primals, tangents
    y, index = _max_and_argmax(x, n, kernel, stride, padding, dilation, ceil_mode, name)
    out, pads, blocked = _pool_geometry(x, n, kernel, stride, padding, dilation, ceil_mode, name)
    t = jnp.pad(t, pads)
    lead = x.ndim - n
    if blocked:
        t = t[(...,) + tuple(slice(0, o * k) for o, k in zip(out, kernel))]
        t = t.reshape(t.shape[:lead] + tuple(v for o, k in zip(out, kernel) for v in (o, k)))
        code = np.arange(int(np.prod(kernel))).reshape(tuple(v for k in kernel for v in (1, k)))
        chosen = jnp.expand_dims(index, tuple(lead + 2 * i + 1 for i in range(n))) == code.astype(index.dtype)
        dt = jnp.sum(jnp.where(chosen, t, 0), axis=tuple(lead + 2 * i + 1 for i in range(n)))
    else:
        dt = None
        for k, tap in enumerate(_taps(t, n, kernel, stride, dilation, out)):
            term = jnp.where(index == k, tap, 0)
            dt = term if dt is None else dt + term
    return y, dt


def _max_pool(n, cls, kernel_size, stride, padding, dilation, return_indices, ceil_mode) -> Module:
    shown_stride = kernel_size if stride is None else stride
    name = (f"{cls}(kernel_size={kernel_size}, stride={shown_stride}, padding={padding}, dilation={dilation}, "
            f"ceil_mode={ceil_mode})")
    kernel = _ntuple(kernel_size, n, "kernel_size", cls, 1)
    stride = _ntuple(shown_stride, n, "stride", cls, 1)
    padding = _ntuple(padding, n, "padding", cls, 0)
    dilation = _ntuple(dilation, n, "dilation", cls, 1)
    _check_padding(kernel, padding, dilation, name)

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = _check_input(x, n, name)
        y = _max_windows(x, n, kernel, stride, padding, dilation, ceil_mode, name)
        if not return_indices:
            return y
        # (y, indices) for MaxUnpool: the winner's rank in its window, as a flat input position
        from funcnet.nn.functional.pool_indices import flat_indices
        _, tap = _max_and_argmax(jax.lax.stop_gradient(x), n, kernel, stride, padding, dilation, ceil_mode, name)
        return y, flat_indices(tap, x.shape[-n:], kernel, stride, padding, dilation)

    return Module(_no_params, apply, name=name)


def MaxPool1d(kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
              ceil_mode: bool = False) -> Module:
    """Max over windows of the last axis, as torch.nn.MaxPool1d: ``(N, C, L)`` or ``(C, L)``.
    See ``MaxPool2d``."""
    return _max_pool(1, "MaxPool1d", kernel_size, stride, padding, dilation, return_indices, ceil_mode)


def MaxPool2d(kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
              ceil_mode: bool = False) -> Module:
    """Max over ``kernel_size`` windows of the last two axes, as torch.nn.MaxPool2d.

    x: ``(N, C, H, W)`` or ``(C, H, W)`` -> ``(N, C, H_out, W_out)``, ``H_out =
    floor_or_ceil((H + 2*padding - dilation*(kH-1) - 1) / stride) + 1``. ``stride`` defaults to
    ``kernel_size``; padding (at most half the dilated kernel) is -inf, so it never wins.
    The gradient goes to the first maximum of each window on ties, as torch's (a NaN wins
    its window, the last one if there are several, as in torch's loop).
    ``return_indices=True``: ``(y, indices)``, each winner's flat position ``h * W + w``, for
    ``MaxUnpool2d``.
    """
    return _max_pool(2, "MaxPool2d", kernel_size, stride, padding, dilation, return_indices, ceil_mode)


def _divisors(size, k, s, p, out, count_include_pad) -> np.ndarray:
    """torch's avg_pool divisor along one axis: the window clipped to the padded input
    (count_include_pad) or to the input."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_pool(n, cls, name, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel = _ntuple(kernel_size, n, "kernel_size", cls, 1)
    stride = _ntuple(kernel_size if stride is None else stride, n, "stride", cls, 1)
    padding = _ntuple(padding, n, "padding", cls, 0)
    if divisor_override is not None and (not isinstance(divisor_override, int) or isinstance(divisor_override, bool)
                                         or divisor_override == 0):
        raise ValueError(f"{cls}: divisor_override must be None or a non-zero int, got {divisor_override!r}")
    _check_padding(kernel, padding, (1,) * n, name)

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = _check_input(x, n, name)
        total, out = _windows(x, n, kernel, stride, padding, (1,) * n, ceil_mode, name,
                              np.array(0, x.dtype), jax.lax.add)
        if divisor_override is not None:
            return total / jnp.asarray(divisor_override, x.dtype)
        divisor = np.ones((), np.int64)
        for L, k, s, p, o in zip(x.shape[-n:], kernel, stride, padding, out):
            divisor = np.multiply.outer(divisor, _divisors(L, k, s, p, o, count_include_pad))
        return total / jnp.asarray(divisor, x.dtype)

    return Module(_no_params, apply, name=name)


def AvgPool1d(kernel_size, stride=None, padding=0, ceil_mode: bool = False,
              count_include_pad: bool = True) -> Module:
    """Mean over windows of the last axis, as torch.nn.AvgPool1d: ``(N, C, L)`` or ``(C, L)``.
    See ``AvgPool2d``."""
    shown = [_ntuple(v, 1, what, "AvgPool1d", 0) for v, what in
             ((kernel_size, "kernel_size"), (kernel_size if stride is None else stride, "stride"),
              (padding, "padding"))]
    name = f"AvgPool1d(kernel_size={shown[0]}, stride={shown[1]}, padding={shown[2]})"
    return _avg_pool(1, "AvgPool1d", name, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def AvgPool2d(kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: int | None = None) -> Module:
    """Mean over ``kernel_size`` windows of the last two axes, as torch.nn.AvgPool2d.

    x: ``(N, C, H, W)`` or ``(C, H, W)``; output size as ``MaxPool2d`` with dilation 1.
    Each window sum is divided by, as torch: ``divisor_override`` if given; else the window's
    size clipped to the zero-padded input (``count_include_pad=True``, so a ``ceil_mode`` window
    hanging past the padding counts only what it covers); else the number of real input
    elements it covers (``count_include_pad=False``).
    """
    name = f"AvgPool2d(kernel_size={kernel_size}, stride={kernel_size if stride is None else stride}, " \
           f"padding={padding})"
    return _avg_pool(2, "AvgPool2d", name, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def _bins(size: int, out: int) -> np.ndarray:
    """``(out, size)`` 0/1 matrix of torch's adaptive bins: [floor(i*size/out), ceil((i+1)*size/out))."""
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    j = np.arange(size)
    return ((j >= start[:, None]) & (j < end[:, None])).astype(np.int64)


def _adaptive_avg_pool(n, cls, output_size) -> Module:
    name = f"{cls}(output_size={output_size})"
    sizes = (output_size,) * n if output_size is None or isinstance(output_size, int) else output_size
    try:
        sizes = tuple(sizes)
    except TypeError:
        sizes = None
    if (sizes is None or len(sizes) != n
            or not all(s is None or (isinstance(s, int) and not isinstance(s, bool) and s > 0) for s in sizes)):
        raise ValueError(f"{cls}: output_size must be a positive int, None (keep the input size) or a tuple of "
                         f"{n} of those, got {output_size!r}")

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = _check_input(x, n, name)
        out = tuple(L if o is None else o for L, o in zip(x.shape[-n:], sizes))
        # Bins overlap and differ in size when out does not divide L, so a reshape-mean would
        # be wrong there: sum each axis through its 0/1 bin matrix, then divide by the bin sizes.
        y, counts = x, np.ones((), np.int64)
        for L, o in zip(x.shape[-n:], out):
            m = _bins(L, o)
            # contracting the first spatial axis appends the pooled one last: after n steps
            # the axes are back in order
            y = jnp.tensordot(y, jnp.asarray(m.T, x.dtype), axes=([y.ndim - n], [0]),
                              precision=jax.lax.Precision.HIGHEST)
            counts = np.multiply.outer(counts, m.sum(axis=1))
        return y / jnp.asarray(counts, x.dtype)

    return Module(_no_params, apply, name=name)


def AdaptiveAvgPool1d(output_size) -> Module:
    """Mean over torch's adaptive bins of the last axis, as torch.nn.AdaptiveAvgPool1d:
    ``(N, C, L)`` or ``(C, L)`` -> ``(..., output_size)``. See ``AdaptiveAvgPool2d``."""
    return _adaptive_avg_pool(1, "AdaptiveAvgPool1d", output_size)


def AdaptiveAvgPool2d(output_size) -> Module:
    """Mean over bins that split H and W into ``output_size``, as torch.nn.AdaptiveAvgPool2d.

    x: ``(N, C, H, W)`` or ``(C, H, W)`` -> ``(..., oH, oW)``. ``output_size``: an int, a tuple,
    ``None`` entries keep that input size. Output ``i`` averages inputs
    ``floor(i*H/oH) .. ceil((i+1)*H/oH) - 1``, torch's bins, so sizes that do not divide match
    torch too (bins then overlap). Each axis is one product with a 0/1 bin matrix, O(H*W*(oH + oW))
    per channel: fine for the usual small outputs (``AdaptiveAvgPool2d(1)``, 7x7 heads).
    """
    return _adaptive_avg_pool(2, "AdaptiveAvgPool2d", output_size)

