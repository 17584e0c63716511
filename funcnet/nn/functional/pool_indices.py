"""torch's max-pool indices: for each output, the flat position ``h * W + w`` (row-major over
the spatial axes) of its window's winner in the input plane, from the winner's rank in its
window (``0 .. prod(kernel) - 1``, row-major over the kernel). Shapes only, no funcnet imports:
the pools of ``funcnet.nn.pooling`` and ``funcnet.nn.functional.pooling_extra`` both use it."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["window_positions", "flat_indices"]


def window_positions(sizes, kernel, stride, padding, dilation, out) -> np.ndarray:
    """``(*out, K)``: the flat input position of each window's taps, row-major over the kernel
    (-1 for a tap in the padding)."""
    flat = np.zeros((), np.int64)
    inside = np.ones((), bool)
    for L, k, s, p, d, o in zip(sizes, kernel, stride, padding, dilation, out):
        pos = (np.arange(o) * s - p)[:, None] + np.arange(k)[None, :] * d  # (o, k)
        flat = np.add.outer(flat * L, pos)
        inside = np.logical_and.outer(inside, (pos >= 0) & (pos < L))
    m = len(out)
    order = tuple(range(0, 2 * m, 2)) + tuple(range(1, 2 * m, 2))  # (o1, k1, o2, k2..) -> (o.., k..)
    flat = flat.transpose(order).reshape(tuple(out) + (-1,))
    inside = inside.transpose(order).reshape(tuple(out) + (-1,))
    return np.where(inside, flat, -1)


def flat_indices(tap, sizes, kernel, stride, padding, dilation):
    """The flat input positions of the winners whose ranks in their windows are ``tap``
    (``(..., *out)``), as torch's int64 indices (int32 with 64-bit types off)."""
    out = tap.shape[-len(kernel):]
    table = window_positions(sizes, kernel, stride, padding, dilation, out).reshape(-1, math.prod(kernel))
    where = np.arange(math.prod(out)).reshape(out)
    return jnp.asarray(table, jax.dtypes.canonicalize_dtype(jnp.int64))[where, tap.astype(jnp.int32)]
