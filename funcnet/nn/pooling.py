"""Pooling, as torch.nn's: MaxPool1d/2d, AvgPool1d/2d, AdaptiveAvgPool1d/2d. No params, no state.

The layers check their arguments at build time and apply ``funcnet.nn.functional``'s
max_pool/avg_pool/adaptive_avg_pool (the math, output sizes, divisors and the max-pool
gradient rule are described there).

Examples:
    >>> import jax.numpy as jnp
    >>> from funcnet import nn
    >>> nn.MaxPool2d(2).apply({}, jnp.arange(16.0).reshape(1, 1, 4, 4)).tolist()
    [[[[5.0, 7.0], [13.0, 15.0]]]]
"""

from __future__ import annotations

from funcnet.nn.activation import _no_params
from funcnet.nn.functional import pooling as _F
from funcnet.nn.functional._common import ntuple as _ntuple
from funcnet.nn.module import Module

__all__ = ["MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d"]


def _max_pool(n, cls, kernel_size, stride, padding, dilation, return_indices, ceil_mode) -> Module:
    shown_stride = kernel_size if stride is None else stride
    name = (f"{cls}(kernel_size={kernel_size}, stride={shown_stride}, padding={padding}, dilation={dilation}, "
            f"ceil_mode={ceil_mode})")
    kernel, stride, padding, dilation = _F.max_pool_args(n, cls, kernel_size, stride, padding, dilation,
                                                         return_indices)
    _F._check_padding(kernel, padding, dilation, name)

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        if return_indices:  # (y, indices) for MaxUnpool: the winner's flat position in its input plane
            return _F.max_pool_with_indices(x, n, kernel, stride, padding, dilation, ceil_mode, name)
        return _F.max_pool(x, n, kernel, stride, padding, dilation, ceil_mode, name)

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


def _avg_pool(n, cls, name, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding = _F.avg_pool_args(n, cls, kernel_size, stride, padding, divisor_override)
    _F._check_padding(kernel, padding, (1,) * n, name)

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F.avg_pool(x, n, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, name)

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


def _adaptive_avg_pool(n, cls, output_size) -> Module:
    name = f"{cls}(output_size={output_size})"
    sizes = _F.adaptive_sizes(n, cls, output_size)

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F.adaptive_avg_pool(x, n, sizes, name)

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

