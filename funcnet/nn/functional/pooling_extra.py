"""More pooling, as torch.nn.functional's: 3-D max/avg/adaptive-avg pools, adaptive max pools,
max pools that return torch's indices, and max unpooling.

The windowed pools reuse the 1-D/2-D machinery (``funcnet.nn.pooling``: torch's output sizes,
its max search and the max's custom gradient), which is written for any number of axes.
Indices are torch's: for each output, the position of the winning element in its input
plane, flattened row-major over the spatial axes (``h * W + w``), per example and channel.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.nn.functional import pooling as _P
from funcnet.nn.functional._common import ntuple as _ntuple

__all__ = ["max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices", "max_pool3d",
           "avg_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
           "max_unpool1d", "max_unpool2d", "max_unpool3d"]



check_input = _P._check_input  # one input check for every pool, 1-D to 3-D

def pool_arguments(n, cls, kernel_size, stride, padding, dilation=1):
    kernel = _ntuple(kernel_size, n, "kernel_size", cls, 1)
    stride = _ntuple(kernel_size if stride is None or stride == [] else stride, n, "stride", cls, 1)
    padding = _ntuple(padding, n, "padding", cls, 0)
    dilation = _ntuple(dilation, n, "dilation", cls, 1)
    return kernel, stride, padding, dilation


def _with_indices(n):
    def fn(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
           return_indices: bool = True):
        name = f"max_pool{n}d_with_indices"
        kernel, stride_, padding_, dilation_ = pool_arguments(n, name, kernel_size, stride, padding, dilation)
        return _P.max_pool_with_indices(input, n, kernel, stride_, padding_, dilation_, ceil_mode, name)

    fn.__name__ = fn.__qualname__ = f"max_pool{n}d_with_indices"
    fn.__doc__ = (f"``(y, indices)``, as torch.nn.functional.max_pool{n}d_with_indices: the max pool and, for "
                  f"each output, the flat position of its winner in the input's spatial plane (what "
                  f"``max_unpool{n}d`` takes).")
    return fn


max_pool1d_with_indices, max_pool2d_with_indices, max_pool3d_with_indices = (_with_indices(n) for n in (1, 2, 3))


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Max over ``kernel_size`` windows of the last three axes, as torch.nn.functional.max_pool3d:
    ``(N, C, D, H, W)`` or ``(C, D, H, W)``; torch's output sizes, winner and gradient (see
    ``funcnet.nn.MaxPool2d``); ``return_indices=True`` also returns the winners' positions."""
    name = "max_pool3d"
    kernel, stride, padding, dilation = pool_arguments(3, name, kernel_size, stride, padding, dilation)
    if return_indices:
        return _P.max_pool_with_indices(input, 3, kernel, stride, padding, dilation, ceil_mode, name)
    x = check_input(input, 3, name)
    _P._check_padding(kernel, padding, dilation, name)
    return _P._max_windows(x, 3, kernel, stride, padding, dilation, ceil_mode, name)


def avg_pool(x, n, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, name):
    x = check_input(x, n, name)
    _P._check_padding(kernel, padding, (1,) * n, name)
    if divisor_override is not None and (not isinstance(divisor_override, int) or isinstance(divisor_override, bool)
                                         or divisor_override == 0):
        raise ValueError(f"{name}: divisor_override must be None or a non-zero int, got {divisor_override!r}")
    total, out = _P._windows(x, n, kernel, stride, padding, (1,) * n, ceil_mode, name, np.array(0, x.dtype),
                             jax.lax.add)
    if divisor_override is not None:
        return total / jnp.asarray(divisor_override, x.dtype)
    divisor = np.ones((), np.int64)
    for L, k, s, p, o in zip(x.shape[-n:], kernel, stride, padding, out):
        divisor = np.multiply.outer(divisor, _P._divisors(L, k, s, p, o, count_include_pad))
    return total / jnp.asarray(divisor, x.dtype)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override=None):
    """Mean over ``kernel_size`` windows of the last three axes, as torch.nn.functional.avg_pool3d,
    with torch's divisors (see ``funcnet.nn.AvgPool2d``)."""
    kernel, stride, padding, _ = pool_arguments(3, "avg_pool3d", kernel_size, stride, padding)
    return avg_pool(input, 3, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, "avg_pool3d")


def _bin_edges(L: int, o: int):
    i = np.arange(o)
    return (i * L) // o, -((-(i + 1) * L) // o)  # torch's [floor(i*L/o), ceil((i+1)*L/o))


def adaptive_avg_pool3d(input, output_size):
    """Mean over torch's adaptive bins of the last three axes, as
    torch.nn.functional.adaptive_avg_pool3d (see ``funcnet.nn.AdaptiveAvgPool2d``)."""
    name = "adaptive_avg_pool3d"
    sizes = _P.adaptive_sizes(3, name, output_size)
    x = check_input(input, 3, name)
    out = tuple(L if o is None else o for L, o in zip(x.shape[-3:], sizes))
    y, counts = x, np.ones((), np.int64)
    for L, o in zip(x.shape[-3:], out):
        m = _P._bins(L, o)
        y = jnp.tensordot(y, jnp.asarray(m.T, x.dtype), axes=([y.ndim - 3], [0]), precision=jax.lax.Precision.HIGHEST)
        counts = np.multiply.outer(counts, m.sum(axis=1))
    return y / jnp.asarray(counts, x.dtype)


def adaptive_max(x, n: int, sizes, name: str):
    """``(y, indices)`` of torch's adaptive max pool: the first maximum of each bin in row-major
    order (the last NaN if any), found one axis at a time from the last (the row-major first
    maximum of a box is the first maximum, along the first axis, of the rows' first maxima), each
    axis a loop over the taps of its widest bin."""
    x = check_input(x, n, name)
    spatial = x.shape[-n:]
    out = tuple(L if o is None else o for L, o in zip(spatial, sizes))
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    index_dtype = jax.dtypes.canonicalize_dtype(jnp.int64)
    flat = jnp.broadcast_to(jnp.arange(math.prod(spatial), dtype=index_dtype).reshape(spatial), x.shape)
    y = x
    for axis in reversed(range(x.ndim - n, x.ndim)):
        L, o = x.shape[axis], out[axis - (x.ndim - n)]
        start, end = _bin_edges(L, o)
        best = best_at = None
        for j in range(int((end - start).max())):
            idx = jnp.asarray(np.minimum(start + j, end - 1))  # past a short bin's end: its last tap again
            tap, tap_at = jnp.take(y, idx, axis=axis), jnp.take(flat, idx, axis=axis)
            if best is None:
                best, best_at = tap, tap_at
                continue
            take = (tap > best) | jnp.isnan(tap) if floating else tap > best
            best, best_at = jnp.where(take, tap, best), jnp.where(take, tap_at, best_at)
        y, flat = best, best_at
    return y, flat


def _adaptive_max_fn(n):
    def fn(input, output_size, return_indices: bool = False):
        name = f"adaptive_max_pool{n}d"
        y, indices = adaptive_max(input, n, _P.adaptive_sizes(n, name, output_size), name)
        return (y, indices) if return_indices else y

    fn.__name__ = fn.__qualname__ = f"adaptive_max_pool{n}d"
    fn.__doc__ = (f"Max over torch's adaptive bins of the last {n} axes, as "
                  f"torch.nn.functional.adaptive_max_pool{n}d: bin ``i`` spans "
                  f"``floor(i*L/o) .. ceil((i+1)*L/o) - 1``; "
                  f"the first maximum wins (a NaN wins its bin) and takes the gradient; ``return_indices=True`` "
                  f"also returns its flat position in the input plane.")
    return fn


adaptive_max_pool1d, adaptive_max_pool2d, adaptive_max_pool3d = (_adaptive_max_fn(n) for n in (1, 2, 3))


def unpool_output_size(in_sizes, kernel, stride, padding, output_size, name):
    """torch's _unpool_output_size: the default size, or ``output_size`` (its last n entries)
    when within one stride of it."""
    n = len(kernel)
    default = tuple((i - 1) * s + k - 2 * p for i, k, s, p in zip(in_sizes, kernel, stride, padding))
    if output_size is None:
        return default
    sizes = tuple(output_size)
    if len(sizes) == n + 2:
        sizes = sizes[2:]
    if len(sizes) != n or not all(isinstance(s, (int, np.integer)) for s in sizes):
        raise ValueError(f"{name}: output_size must have {n} or {n + 2} elements, got {output_size!r}")
    for d, (s, want, st) in enumerate(zip(sizes, default, stride)):
        if not want - st < s < want + st:
            raise ValueError(f"{name}: invalid output_size {tuple(output_size)!r} (dim {d} must be between "
                             f"{want - st} and {want + st}, exclusive)")
    return tuple(int(s) for s in sizes)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _scatter(xs, ids, plane):
    """``(m, plane)`` zeros with row ``r``'s values at ``ids[r]``. Its derivative scatter-adds, so
    the gradient gathers (torch's max_unpool backward): where windows overlap and two values
    share a position, the forward keeps one and both get that position's gradient, as torch."""
    return jnp.zeros((xs.shape[0], plane), xs.dtype).at[np.arange(xs.shape[0])[:, None], ids].set(xs, mode="drop")


@_scatter.defjvp
def _scatter_jvp(plane, primals, tangents):
    (xs, ids), (t, _) = primals, tangents
    rows = np.arange(xs.shape[0])[:, None]
    return _scatter(xs, ids, plane), jnp.zeros((xs.shape[0], plane), t.dtype).at[rows, ids].add(t, mode="drop")


def max_unpool(x, indices, n, kernel, stride, padding, output_size, name):
    """Scatter each value to its flat position in a zero plane of the output size (torch's
    max_unpool); the gradient is the gather back, as torch's."""
    x = check_input(x, n, name)
    indices = jnp.asarray(indices)
    if indices.shape != x.shape or not jnp.issubdtype(indices.dtype, jnp.integer):
        raise ValueError(f"{name}: indices must be an integer array of the input's shape {tuple(x.shape)} (the "
                         f"indices a max pool returned), got {indices.dtype} of shape {tuple(indices.shape)}")
    out = unpool_output_size(x.shape[-n:], kernel, stride, padding, output_size, name)
    lead = x.shape[:-n]
    plane = math.prod(out)
    if not isinstance(indices, jax.core.Tracer):
        bad = np.asarray(indices)
        if bad.size and (bad.min() < 0 or bad.max() >= plane):
            raise ValueError(f"{name}: found an invalid max index {int(bad.max() if bad.max() >= plane else bad.min())}"
                             f" (output plane of {plane} = {out}); pass the indices of the max pool whose output "
                             f"this is, and its input size as output_size")
    m = math.prod(lead)
    y = _scatter(x.reshape(m, -1), indices.reshape(m, -1), plane)
    return y.reshape(lead + out)


def _unpool_fn(n):
    def fn(input, indices, kernel_size, stride=None, padding=0, output_size=None):
        name = f"max_unpool{n}d"
        kernel, stride_, padding_, _ = pool_arguments(n, name, kernel_size, stride, padding)
        return max_unpool(input, indices, n, kernel, stride_, padding_, output_size, name)

    fn.__name__ = fn.__qualname__ = f"max_unpool{n}d"
    fn.__doc__ = (f"The partial inverse of a max pool, as torch.nn.functional.max_unpool{n}d: each value goes "
                  f"to the position ``indices`` gives it (from ``max_pool{n}d_with_indices``) in a zero output of "
                  f"size ``(in - 1) * stride - 2 * padding + kernel_size``, or ``output_size`` (within one stride "
                  f"of it).")
    return fn


max_unpool1d, max_unpool2d, max_unpool3d = (_unpool_fn(n) for n in (1, 2, 3))
