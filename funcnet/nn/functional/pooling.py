"""Pooling, as torch.nn.functional's: max_pool1d/2d, avg_pool1d/2d, adaptive_avg_pool1d/2d, the
one implementation the layers of ``funcnet.nn.pooling`` call.

Inputs are channels-first, batched ``(N, C, *spatial)`` or unbatched ``(C, *spatial)``; the
window slides over the trailing spatial axes only. Output sizes follow torch's
``pooling_output_shape``: ``(L + 2*padding - dilation*(k-1) - 1) / stride + 1`` rounded down,
or up with ``ceil_mode=True``, where a last window that would start in the right padding is
dropped. Sum windows are one ``jax.lax.reduce_window``; max windows are torch's search loop
run over every window at once, one tap at a time (elementwise, with a gradient that is a
select rather than XLA's select-and-scatter: a ``jax.custom_jvp``, see docs/design.md); the
divisors of avg_pool and the bins of adaptive_avg_pool depend only on shapes and are
computed with numpy at trace time.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.nn.functional._common import apart
from funcnet.nn.functional._common import ntuple as _ntuple
from funcnet.nn.functional.pool_indices import flat_indices

__all__ = ["max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d"]

_SHAPES = {1: ("(C, L)", "(N, C, L)"), 2: ("(C, H, W)", "(N, C, H, W)"), 3: ("(C, D, H, W)", "(N, C, D, H, W)")}


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


def _first_inside(sizes, kernel, stride, padding, dilation, out) -> np.ndarray:
    """``(*out, K)``: True at each window's first tap (row-major) inside the input, where torch's
    search starts."""
    inside = np.ones((), bool)
    for L, k, s, p, d, o in zip(sizes, kernel, stride, padding, dilation, out):
        pos = (np.arange(o) * s - p)[:, None] + np.arange(k)[None, :] * d  # (o, k)
        ok = (pos >= 0) & (pos < L)
        inside = np.logical_and.outer(inside, ok)
    # axes (o1, k1, o2, k2, ...) -> (o1, o2, ..., k1, k2, ...)
    inside = inside.transpose(tuple(range(0, 2 * len(out), 2)) + tuple(range(1, 2 * len(out), 2)))
    inside = inside.reshape(tuple(out) + (-1,))
    return inside & (np.cumsum(inside, axis=-1) == 1)


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


def _search(x, n, kernel, stride, dilation, out, pads, first=None):
    """torch's max-pool loop run over every window at once, one tap at a time (elementwise:
    faster than reduce_window, and than a variadic reduce, which XLA:CPU runs as a scalar loop):
    the running maximum is replaced by a greater value or a NaN. With ``first`` (a static
    ``(*out, K)`` mask of each window's first tap inside the input, where torch's loop starts)
    it also keeps the row-major index of the winning tap, as float32 beside a float32 value (one
    element type in the loop vectorizes); ``(maxima, index or None)``."""
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    best = index = None
    for k, tap in enumerate(_taps(jnp.pad(x, pads, constant_values=_lowest(x.dtype)), n, kernel, stride, dilation,
                                  out)):
        if best is None:
            best, index = tap, None if first is None else jnp.zeros(tap.shape, jnp.float32)
            continue
        take = (tap > best) | (tap != tap) if floating else tap > best
        if first is not None and first[..., k].any():
            # the first tap inside the input always replaces a padding tap's lowest value (it is
            # greater, equal or NaN); for the maxima alone that changes nothing
            take = take | first[..., k]
        best = jnp.where(take, tap, best)
        if index is not None:
            index = jnp.where(take, np.float32(k), index)
    return best, index


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3, 4, 5, 6, 7))
def _max_windows(x, n, kernel, stride, padding, dilation, ceil_mode, name):
    """Each window's maximum, as torch's max-pool loop (a NaN wins its window), by ``_search``.
    The gradient (the jvp below) needs the winners, which ``_max_and_argmax`` finds."""
    out, pads, _ = _pool_geometry(x, n, kernel, stride, padding, dilation, ceil_mode, name)
    return _search(x, n, kernel, stride, dilation, out, pads)[0]


def _max_and_argmax(x, n, kernel, stride, padding, dilation, ceil_mode, name):
    """Each window's maximum and the row-major index in the window of the tap that holds it,
    as torch's max-pool loop finds them: the first maximum, or the last NaN if there is one
    (the loop replaces its running max by a greater value or a NaN, and starts at the window's
    first element inside the input). ``_search`` keeping the index (64x64x32x32 3x3/2: 13 ms,
    where a variadic reduce over the stacked taps took 70), computed ``apart``, so the gradient
    reads the index from memory instead of running the search (and what produced x) again
    inside its own loop for every tap."""
    out, pads, _ = _pool_geometry(x, n, kernel, stride, padding, dilation, ceil_mode, name)
    first = _first_inside(x.shape[-n:], kernel, stride, padding, dilation, out)  # static, as the padding is
    index_dtype = jnp.int8 if first.shape[-1] <= 127 else jnp.int32  # indices 0..K-1

    def search(x):
        best, index = _search(x, n, kernel, stride, dilation, out, pads, first)
        return best, index.astype(index_dtype)

    return apart(search, x)


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


def _divisors(size, k, s, p, out, count_include_pad) -> np.ndarray:
    """torch's avg_pool divisor along one axis: the window clipped to the padded input
    (count_include_pad) or to the input."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _bins(size: int, out: int) -> np.ndarray:
    """``(out, size)`` 0/1 matrix of torch's adaptive bins: [floor(i*size/out), ceil((i+1)*size/out))."""
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    j = np.arange(size)
    return ((j >= start[:, None]) & (j < end[:, None])).astype(np.int64)


def max_pool_args(n, where, kernel_size, stride, padding, dilation, return_indices):
    """torch's max-pool arguments as n-tuples (stride defaults to kernel_size); checks them."""
    kernel = _ntuple(kernel_size, n, "kernel_size", where, 1)
    stride = _ntuple(kernel_size if stride is None else stride, n, "stride", where, 1)
    padding = _ntuple(padding, n, "padding", where, 0)
    dilation = _ntuple(dilation, n, "dilation", where, 1)
    del return_indices  # the layers and max_pool*d give (y, indices) through pooling_extra
    return kernel, stride, padding, dilation


def max_pool(x, n, kernel, stride, padding, dilation, ceil_mode, where):
    """Each window's maximum, torch's winner and gradient (checked arguments as n-tuples)."""
    _check_padding(kernel, padding, dilation, where)
    x = _check_input(x, n, where)
    return _max_windows(x, n, tuple(kernel), tuple(stride), tuple(padding), tuple(dilation), bool(ceil_mode), where)


def avg_pool_args(n, where, kernel_size, stride, padding, divisor_override):
    kernel = _ntuple(kernel_size, n, "kernel_size", where, 1)
    stride = _ntuple(kernel_size if stride is None else stride, n, "stride", where, 1)
    padding = _ntuple(padding, n, "padding", where, 0)
    if divisor_override is not None and (not isinstance(divisor_override, int) or isinstance(divisor_override, bool)
                                         or divisor_override == 0):
        raise ValueError(f"{where}: divisor_override must be None or a non-zero int, got {divisor_override!r}")
    _check_padding(kernel, padding, (1,) * n, where)
    return kernel, stride, padding


def avg_pool(x, n, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, where):
    """Each window's sum divided by torch's divisor (checked arguments as n-tuples)."""
    x = _check_input(x, n, where)
    total, out = _windows(x, n, kernel, stride, padding, (1,) * n, ceil_mode, where,
                          np.array(0, x.dtype), jax.lax.add)
    if divisor_override is not None:
        return total / jnp.asarray(divisor_override, x.dtype)
    divisor = np.ones((), np.int64)
    for L, k, s, p, o in zip(x.shape[-n:], kernel, stride, padding, out):
        divisor = np.multiply.outer(divisor, _divisors(L, k, s, p, o, count_include_pad))
    return total / jnp.asarray(divisor, x.dtype)


def adaptive_sizes(n, where, output_size):
    sizes = (output_size,) * n if output_size is None or isinstance(output_size, int) else output_size
    try:
        sizes = tuple(sizes)
    except TypeError:
        sizes = None
    if (sizes is None or len(sizes) != n
            or not all(s is None or (isinstance(s, int) and not isinstance(s, bool) and s > 0) for s in sizes)):
        raise ValueError(f"{where}: output_size must be a positive int, None (keep the input size) or a tuple of "
                         f"{n} of those, got {output_size!r}")
    return sizes


def adaptive_avg_pool(x, n, sizes, where):
    """Means over torch's adaptive bins; ``sizes``: n entries, None keeps that input size.

    Bins overlap and differ in size when out does not divide L, so a reshape-mean would be
    wrong there: sum each axis through its 0/1 bin matrix, then divide by the bin sizes."""
    x = _check_input(x, n, where)
    out = tuple(L if o is None else o for L, o in zip(x.shape[-n:], sizes))
    y, counts = x, np.ones((), np.int64)
    for L, o in zip(x.shape[-n:], out):
        m = _bins(L, o)
        # contracting the first spatial axis appends the pooled one last: after n steps the axes
        # are back in order
        y = jnp.tensordot(y, jnp.asarray(m.T, x.dtype), axes=([y.ndim - n], [0]),
                          precision=jax.lax.Precision.HIGHEST)
        counts = np.multiply.outer(counts, m.sum(axis=1))
    return y / jnp.asarray(counts, x.dtype)


def max_pool_with_indices(x, n, kernel, stride, padding, dilation, ceil_mode, name):
    """``(y, indices)``: torch's max pool (its winner and its gradient) and the winner's flat
    position in the input plane."""
    x = _check_input(x, n, name)
    _check_padding(kernel, padding, dilation, name)
    y = _max_windows(x, n, kernel, stride, padding, dilation, ceil_mode, name)
    _, tap = _max_and_argmax(jax.lax.stop_gradient(x), n, kernel, stride, padding, dilation, ceil_mode, name)
    return y, flat_indices(tap, x.shape[-n:], kernel, stride, padding, dilation)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of the last axis of ``(N, C, L)`` or ``(C, L)``. See ``max_pool2d``."""
    args = max_pool_args(1, "max_pool1d", kernel_size, stride, padding, dilation, return_indices)
    if return_indices:
        return max_pool_with_indices(input, 1, *args, ceil_mode, "max_pool1d")
    return max_pool(input, 1, *args, ceil_mode, "max_pool1d")


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of the last two axes, torch.nn.functional.max_pool2d: ``stride``
    defaults to ``kernel_size``; the gradient goes to the first maximum of each window (a NaN
    wins its window). ``return_indices=True`` gives ``(y, indices)``, torch's flat positions
    in each input plane, for ``max_unpool2d``."""
    args = max_pool_args(2, "max_pool2d", kernel_size, stride, padding, dilation, return_indices)
    if return_indices:
        return max_pool_with_indices(input, 2, *args, ceil_mode, "max_pool2d")
    return max_pool(input, 2, *args, ceil_mode, "max_pool2d")


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Mean over windows of the last axis. See ``avg_pool2d``."""
    args = avg_pool_args(1, "avg_pool1d", kernel_size, stride, padding, None)
    return avg_pool(input, 1, *args, ceil_mode, count_include_pad, None, "avg_pool1d")


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Mean over windows of the last two axes, torch.nn.functional.avg_pool2d, with torch's
    divisors (``divisor_override``; else the window clipped to the padded input with
    ``count_include_pad``, or to the input without)."""
    args = avg_pool_args(2, "avg_pool2d", kernel_size, stride, padding, divisor_override)
    return avg_pool(input, 2, *args, ceil_mode, count_include_pad, divisor_override, "avg_pool2d")


def adaptive_avg_pool1d(input, output_size):
    """Mean over torch's adaptive bins of the last axis. See ``adaptive_avg_pool2d``."""
    return adaptive_avg_pool(input, 1, adaptive_sizes(1, "adaptive_avg_pool1d", output_size), "adaptive_avg_pool1d")


def adaptive_avg_pool2d(input, output_size):
    """Mean over bins ``floor(i*H/oH) .. ceil((i+1)*H/oH) - 1`` of H and W (torch's bins; they
    overlap when the sizes do not divide). ``output_size``: an int, a tuple, None entries keep
    that input size."""
    return adaptive_avg_pool(input, 2, adaptive_sizes(2, "adaptive_avg_pool2d", output_size), "adaptive_avg_pool2d")
