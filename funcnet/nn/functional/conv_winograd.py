"""A 3x3 convolution (stride 1, no dilation, one group) by Winograd's minimal filtering,
F(2x2, 3x3): each 2x2 block of outputs from a 4x4 tile of the input in 16 multiplies per
channel pair instead of 36.

With ``B``, ``G``, ``A`` below, a tile ``d`` (4x4) and the kernel ``g`` (3x3) give the 2x2
outputs ``A^T [(G g G^T) * (B^T d B)] A``; summed over input channels, the elementwise product
becomes 16 matrix multiplies, one per position of the 4x4 transformed tile, of the transformed
input ``(tiles, C)`` by the transformed weight ``(C, O)``. The transforms add and subtract
(the weight's halves), so rounding stays that of a direct convolution's (tests/test_nn_conv.py
bounds it). Everything is linear in ``x`` and in ``w``: reverse mode transposes the same
matrix multiplies and transforms, forward mode differentiates them, no custom rule.

The tiles are taken channels-last (``(N, H, W, C)``): the transforms then read whole channel
vectors, where strided reads of a channels-first plane do not vectorize (the forward at
8x64x56x56, one core: 17.8 ms channels-last, 34-58 ms channels-first). docs/design.md, "Winograd",
has the measurements and the rule that picks it (``conv_strategy.choose``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["winograd_conv"]

TILE = 2  # outputs per tile side; the input tile is TILE + 2
_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
_G = ((1, 0, 0), (.5, .5, .5), (.5, -.5, .5), (0, 0, 1))
_AT = ((1, 1, 1, 0), (0, 1, -1, -1))


def _combine(matrix, terms):
    """``matrix @ terms`` for a small constant matrix over a list of arrays, written as adds and
    subtractions (zeros skipped, no multiply by +-1)."""
    out = []
    for row in matrix:
        acc = None
        for c, t in zip(row, terms):
            if c == 0:
                continue
            t = t if c == 1 else -t if c == -1 else t * np.asarray(c, t.dtype)
            acc = t if acc is None else acc + t
        out.append(acc)
    return out


def winograd_conv(x, w, pads):
    """``conv2d(x, w)`` with torch's layouts (``x`` ``(N, C, H, W)``, ``w`` ``(O, C, 3, 3)``),
    stride 1, padding ``pads`` ``((top, bottom), (left, right))``, by F(2x2, 3x3)."""
    batch, channels, height, width = x.shape
    (top, bottom), (left, right) = pads
    out_h, out_w = height + top + bottom - 2, width + left + right - 2
    th, tw = -(-out_h // TILE), -(-out_w // TILE)
    xh = jnp.transpose(x, (0, 2, 3, 1))
    # pad so that th x tw tiles fit (extra rows and columns past the output are cropped below)
    xh = jax.lax.pad(xh, jnp.zeros((), x.dtype), [(0, 0, 0), (top, TILE * th + 2 - height - top, 0),
                                                  (left, TILE * tw + 2 - width - left, 0), (0, 0, 0)])
    rows = _combine(_BT, [jax.lax.slice_in_dim(xh, i, i + TILE * (th - 1) + 1, TILE, axis=1) for i in range(4)])
    v = [t for r in rows
         for t in _combine(_BT, [jax.lax.slice_in_dim(r, j, j + TILE * (tw - 1) + 1, TILE, axis=2) for j in range(4)])]
    v = jnp.stack(v).reshape(16, batch * th * tw, channels)
    wt = jnp.transpose(w, (2, 3, 1, 0))  # (3, 3, C, O)
    u = jnp.stack([t for r in _combine(_G, [wt[i] for i in range(3)]) for t in _combine(_G, [r[j] for j in range(3)])])
    m = jax.lax.dot_general(v, u, (((2,), (1,)), ((0,), (0,))), precision=jax.lax.Precision.HIGHEST)
    m = m.reshape(4, 4, batch, th, tw, -1)
    cols = _combine(_AT, [m[i] for i in range(4)])  # 2 x (4, N, th, tw, O)
    y = jnp.stack([jnp.stack(_combine(_AT, [c[j] for j in range(4)]), axis=3) for c in cols], axis=2)
    y = y.reshape(batch, TILE * th, TILE * tw, -1)[:, :out_h, :out_w]
    return jnp.transpose(y, (0, 3, 1, 2))
