"""Convolutions, as torch.nn.functional's: conv1d/2d/3d and conv_transpose1d/2d/3d, the one
implementation the layers of ``funcnet.nn.conv`` call.

Layouts are torch's: activations channels-first ``(N, C, *spatial)`` (or unbatched
``(C, *spatial)``), weights ``(out, in/groups, *kernel)`` for a convolution and
``(in, out/groups, *kernel)`` for a transposed one. The math is
``conv_strategy.convolve``: one ``jax.lax.conv_general_dilated``, patches + one ``einsum`` or
a sum over kernel taps, chosen per shape, at ``Precision.HIGHEST`` (the default precision may
run float32 through bfloat16 passes on accelerators, and torch's CPU kernels do not).
"""

from __future__ import annotations

import jax.numpy as jnp

from funcnet.nn.functional._common import ntuple
from funcnet.nn.functional.conv_strategy import convolve

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]

SHAPES = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}


def as_batched(x, n: int, in_channels: int, where: str):
    """x as ``(N, C, *spatial)`` and whether it came unbatched; checks rank and channels,
    naming the input's full shape."""
    x = jnp.asarray(x)
    if x.ndim not in (n + 1, n + 2):
        flat = (f" (flat images? x.reshape({x.shape[0]}, C, H, W) with C*H*W = {x.shape[1]})"
                if n == 2 and x.ndim == 2 else "")
        raise ValueError(
            f"{where}: expected a {n + 1}D (unbatched) input {SHAPES[n].replace('N, ', '')} or a {n + 2}D "
            f"(batched) input {SHAPES[n]}, got shape {tuple(x.shape)}; reshape the input to {SHAPES[n]}{flat}")
    unbatched = x.ndim == n + 1
    if unbatched:
        x = x[None]
    if x.shape[1] != in_channels:
        axis = 0 if unbatched else 1
        raise ValueError(
            f"{where}: input of shape {tuple(x.shape[1:] if unbatched else x.shape)} has {x.shape[1]} channels "
            f"in axis {axis}, expected in_channels={in_channels}; the layout is channels-first {SHAPES[n]} as "
            f"torch's (a channels-last batch needs jnp.moveaxis(x, -1, 1))")
    return x, unbatched


def padding_pairs(padding, n: int, kernel, stride, dilation, where: str, transposed: bool):
    """torch's ``padding`` argument as ``(shown, ((lo, hi), ...))``: an int, a tuple, or
    ``"valid"``/``"same"`` (not for transposed convolutions; ``"same"`` puts an odd total on the
    right/bottom, as torch)."""
    if isinstance(padding, str):
        if transposed or padding not in ("same", "valid"):
            allowed = "an int or a tuple of ints" if transposed else "'same', 'valid', an int or a tuple of ints"
            raise ValueError(f"{where}: padding must be {allowed}, got {padding!r}")
        if padding == "same" and tuple(stride) != (1,) * n:
            raise ValueError(f"{where}: padding='same' needs stride=1 (as in torch), got stride={stride}; pad "
                             f"explicitly, e.g. padding={tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel))}")
        pads = tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) if padding == "same" else (0, 0)
                     for d, k in zip(dilation, kernel))
        return padding, pads
    shown = ntuple(padding, n, "padding", where, 0)
    return shown, tuple((p, p) for p in shown)


def conv(x, weight, bias, n: int, stride, pads, dilation, groups: int, where: str):
    """The convolution of ``x`` (``(N, C, *)`` or unbatched) with ``weight`` (``(out, C/groups,
    *kernel)``); ``pads``: ``((lo, hi), ...)`` zeros per spatial axis. Checks before any work."""
    w = jnp.asarray(weight)
    if w.ndim != n + 2:
        raise ValueError(f"{where}: weight must be {n + 2}-d (out_channels, in_channels/groups, *kernel), got "
                         f"shape {tuple(w.shape)}")
    x, unbatched = as_batched(x, n, w.shape[1] * groups, where)
    kernel = w.shape[2:]
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads))
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilation, kernel))
    if any(p < k for p, k in zip(padded, span)):
        raise ValueError(
            f"{where}: input of shape {tuple(x.shape[1:] if unbatched else x.shape)} has padded size per channel "
            f"{padded}; padded input size per channel {padded} is smaller than the (dilated) kernel size "
            f"{span}; the kernel can't be greater than the input: use a larger input, more padding "
            f"or padding='same'")
    if w.shape[0] % groups:
        raise ValueError(f"{where}: weight of shape {tuple(w.shape)} has {w.shape[0]} output channels, not "
                         f"divisible by groups={groups}")
    dt = jnp.result_type(x, w)
    x, w = x.astype(dt), w.astype(dt)
    y = convolve(x, w, tuple(stride), tuple(pads), (1,) * n, tuple(dilation), groups)
    if bias is not None:
        y = y + jnp.asarray(bias).astype(dt).reshape((-1,) + (1,) * n)
    return y[0] if unbatched else y


def conv_transpose(x, weight, bias, n: int, stride, padding, output_padding, groups: int, dilation, where: str):
    """The transposed convolution of ``x`` with ``weight`` (``(C, out/groups, *kernel)``): the
    gradient of a strided convolution with respect to its input."""
    w = jnp.asarray(weight)
    if w.ndim != n + 2:
        raise ValueError(f"{where}: weight must be {n + 2}-d (in_channels, out_channels/groups, *kernel), got "
                         f"shape {tuple(w.shape)}")
    in_channels, out_channels, kernel = w.shape[0], w.shape[1] * groups, w.shape[2:]
    if in_channels % groups:
        raise ValueError(f"{where}: weight of shape {tuple(w.shape)} has {in_channels} input channels, not "
                         f"divisible by groups={groups}")
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= s and op >= d:
            raise ValueError(f"{where}: output_padding={tuple(output_padding)} must be smaller than either "
                             f"stride={tuple(stride)} or dilation={tuple(dilation)} in each dimension (as in torch)")
    x, unbatched = as_batched(x, n, in_channels, where)
    sizes = x.shape[2:]
    out = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1
                for i, s, p, d, k, op in zip(sizes, stride, padding, dilation, kernel, output_padding))
    if min(out) < 1:
        raise ValueError(f"{where}: input of shape {tuple(x.shape[1:] if unbatched else x.shape)} (spatial size "
                         f"{tuple(sizes)}) gives output size {out}; padding={tuple(padding)} crops more than the "
                         f"output has, lower it")
    dt = jnp.result_type(x, w)
    x, w = x.astype(dt), w.astype(dt)
    # dilate the input by stride, pad each side by d*(k-1) - padding (+ output_padding after), and
    # convolve with the kernel flipped and its in/out axes swapped within each group
    w = w.reshape(groups, in_channels // groups, out_channels // groups, *kernel)
    w = jnp.swapaxes(w, 1, 2).reshape(out_channels, in_channels // groups, *kernel)
    w = jnp.flip(w, axis=tuple(range(2, n + 2)))
    conv_pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
                 for d, k, p, op in zip(dilation, kernel, padding, output_padding)]
    y = convolve(x, w, (1,) * n, tuple(conv_pads), tuple(stride), tuple(dilation), groups)
    if bias is not None:
        y = y + jnp.asarray(bias).astype(dt).reshape((-1,) + (1,) * n)
    return y[0] if unbatched else y


def _groups(groups, where: str) -> int:
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError(f"{where}: groups must be a positive int, got {groups!r}")
    return groups


def _conv_nd(n, input, weight, bias, stride, padding, dilation, groups):
    where = f"conv{n}d"
    stride = ntuple(stride, n, "stride", where, 1)
    dilation = ntuple(dilation, n, "dilation", where, 1)
    kernel = tuple(jnp.shape(weight)[2:]) if jnp.ndim(weight) == n + 2 else (1,) * n
    _, pads = padding_pairs(padding, n, kernel, stride, dilation, where, transposed=False)
    return conv(input, weight, bias, n, stride, pads, dilation, _groups(groups, where), where)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1D convolution (cross-correlation): input ``(N, C_in, L)`` or ``(C_in, L)``, weight
    ``(C_out, C_in/groups, k)``, bias ``(C_out,)``. See ``conv2d``."""
    return _conv_nd(1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2D convolution (cross-correlation), torch.nn.functional.conv2d: input ``(N, C_in, H, W)``
    or ``(C_in, H, W)``, weight ``(C_out, C_in/groups, kH, kW)``, bias ``(C_out,)``. ``padding``:
    an int, a tuple, ``"valid"`` or ``"same"`` (zeros; the layer ``Conv2d`` has the other
    padding modes)."""
    return _conv_nd(2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3D convolution: input ``(N, C_in, D, H, W)`` or unbatched. See ``conv2d``."""
    return _conv_nd(3, input, weight, bias, stride, padding, dilation, groups)


def _conv_transpose_nd(n, input, weight, bias, stride, padding, output_padding, groups, dilation):
    where = f"conv_transpose{n}d"
    stride = ntuple(stride, n, "stride", where, 1)
    dilation = ntuple(dilation, n, "dilation", where, 1)
    padding = ntuple(padding, n, "padding", where, 0)
    output_padding = ntuple(output_padding, n, "output_padding", where, 0)
    return conv_transpose(input, weight, bias, n, stride, padding, output_padding, _groups(groups, where),
                          dilation, where)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """1D transposed convolution: weight ``(C_in, C_out/groups, k)``. See ``conv_transpose2d``."""
    return _conv_transpose_nd(1, input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """2D transposed convolution, torch.nn.functional.conv_transpose2d: input ``(N, C_in, H, W)``,
    weight ``(C_in, C_out/groups, kH, kW)`` (in first, torch's layout), output size
    ``(H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1``."""
    return _conv_transpose_nd(2, input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """3D transposed convolution. See ``conv_transpose2d``."""
    return _conv_transpose_nd(3, input, weight, bias, stride, padding, output_padding, groups, dilation)
