"""More pooling layers, as torch.nn's: MaxPool3d, AvgPool3d, AdaptiveAvgPool3d,
AdaptiveMaxPool1d/2d/3d, MaxUnpool1d/2d/3d, and the ``return_indices=True`` form of
MaxPool3d. No params, no state; the math is ``funcnet.nn.functional.pooling_extra``.

Examples:
    >>> import jax.numpy as jnp
    >>> from funcnet import nn
    >>> nn.AdaptiveMaxPool1d(2).apply({}, jnp.array([[[1.0, 5.0, 2.0, 0.0, 3.0, 4.0]]])).tolist()
    [[[5.0, 4.0]]]
"""

from __future__ import annotations

from funcnet.nn.activation import _no_params
from funcnet.nn.functional import pooling_extra as _F
from funcnet.nn.module import Module

__all__ = ["MaxPool3d", "AvgPool3d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
           "AdaptiveMaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d"]


def _max_pool_setup(n: int, cls: str, kernel_size, stride, padding, dilation, ceil_mode):
    shown_stride = kernel_size if stride is None else stride
    name = (f"{cls}(kernel_size={kernel_size}, stride={shown_stride}, padding={padding}, dilation={dilation}, "
            f"ceil_mode={ceil_mode})")
    kernel, stride, padding, dilation = _F.pool_arguments(n, cls, kernel_size, stride, padding, dilation)
    _F._P._check_padding(kernel, padding, dilation, name)
    return name, kernel, stride, padding, dilation


def max_pool_with_indices(n: int, cls: str, kernel_size, stride, padding, dilation, ceil_mode) -> Module:
    """``MaxPool{n}d(..., return_indices=True)``: apply returns ``(y, indices)``, torch's."""
    name, kernel, stride, padding, dilation = _max_pool_setup(n, cls, kernel_size, stride, padding, dilation,
                                                              ceil_mode)

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F._P.max_pool_with_indices(x, n, kernel, stride, padding, dilation, ceil_mode, name)

    return Module(_no_params, apply, name=name)


def MaxPool3d(kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
              ceil_mode: bool = False) -> Module:
    """Max over ``kernel_size`` windows of the last three axes, as torch.nn.MaxPool3d:
    ``(N, C, D, H, W)`` or ``(C, D, H, W)``. Output sizes, winner (first maximum, a NaN wins)
    and gradient as ``MaxPool2d``; ``return_indices=True``: ``(y, indices)`` for ``MaxUnpool3d``."""
    if return_indices:
        return max_pool_with_indices(3, "MaxPool3d", kernel_size, stride, padding, dilation, ceil_mode)
    name, kernel, stride, padding, dilation = _max_pool_setup(3, "MaxPool3d", kernel_size, stride, padding,
                                                              dilation, ceil_mode)

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        x = _F.check_input(x, 3, name)
        return _F._P._max_windows(x, 3, kernel, stride, padding, dilation, ceil_mode, name)

    return Module(_no_params, apply, name=name)


def AvgPool3d(kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: int | None = None) -> Module:
    """Mean over ``kernel_size`` windows of the last three axes, as torch.nn.AvgPool3d, with
    torch's divisors (``count_include_pad``, ``divisor_override``; see ``AvgPool2d``)."""
    name = f"AvgPool3d(kernel_size={kernel_size}, stride={kernel_size if stride is None else stride}, " \
           f"padding={padding})"
    kernel, stride_, padding_, _ = _F.pool_arguments(3, "AvgPool3d", kernel_size, stride, padding)
    _F._P._check_padding(kernel, padding_, (1, 1, 1), name)
    if divisor_override is not None and (not isinstance(divisor_override, int) or isinstance(divisor_override, bool)
                                         or divisor_override == 0):
        raise ValueError(f"AvgPool3d: divisor_override must be None or a non-zero int, got {divisor_override!r}")

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F.avg_pool(x, 3, kernel, stride_, padding_, ceil_mode, count_include_pad, divisor_override, name)

    return Module(_no_params, apply, name=name)


def AdaptiveAvgPool3d(output_size) -> Module:
    """Mean over torch's adaptive bins of the last three axes, as torch.nn.AdaptiveAvgPool3d
    (see ``AdaptiveAvgPool2d``)."""
    _F._P.adaptive_sizes(3, "AdaptiveAvgPool3d", output_size)

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F.adaptive_avg_pool3d(x, output_size)

    return Module(_no_params, apply, name=f"AdaptiveAvgPool3d(output_size={output_size})")


def _adaptive_max(n: int, output_size, return_indices: bool) -> Module:
    cls = f"AdaptiveMaxPool{n}d"
    sizes = _F._P.adaptive_sizes(n, cls, output_size)
    name = f"{cls}(output_size={output_size})"

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        y, indices = _F.adaptive_max(x, n, sizes, name)
        return (y, indices) if return_indices else y

    return Module(_no_params, apply, name=name)


def AdaptiveMaxPool1d(output_size, return_indices: bool = False) -> Module:
    """Max over torch's adaptive bins of the last axis, as torch.nn.AdaptiveMaxPool1d. See
    ``AdaptiveMaxPool2d``."""
    return _adaptive_max(1, output_size, return_indices)


def AdaptiveMaxPool2d(output_size, return_indices: bool = False) -> Module:
    """Max over bins that split H and W into ``output_size``, as torch.nn.AdaptiveMaxPool2d:
    torch's bins (``floor(i*H/oH) .. ceil((i+1)*H/oH) - 1``, overlapping when the sizes do not
    divide), its winner (the first maximum in row-major order; a NaN wins) and its gradient.
    ``return_indices=True``: ``(y, indices)``, each winner's flat position ``h * W + w``."""
    return _adaptive_max(2, output_size, return_indices)


def AdaptiveMaxPool3d(output_size, return_indices: bool = False) -> Module:
    """Max over torch's adaptive bins of the last three axes, as torch.nn.AdaptiveMaxPool3d.
    See ``AdaptiveMaxPool2d``."""
    return _adaptive_max(3, output_size, return_indices)


def _max_unpool(n: int, kernel_size, stride, padding) -> Module:
    cls = f"MaxUnpool{n}d"
    kernel, stride, padding, _ = _F.pool_arguments(n, cls, kernel_size, stride, padding)
    name = f"{cls}(kernel_size={kernel}, stride={stride}, padding={padding})"

    def apply(params, x, indices, output_size=None, *, key=None, train=False):
        del params, key, train
        return _F.max_unpool(x, indices, n, kernel, stride, padding, output_size, name)

    return Module(_no_params, apply, name=name)


def MaxUnpool1d(kernel_size, stride=None, padding=0) -> Module:
    """The partial inverse of ``MaxPool1d``, as torch.nn.MaxUnpool1d. See ``MaxUnpool2d``."""
    return _max_unpool(1, kernel_size, stride, padding)


def MaxUnpool2d(kernel_size, stride=None, padding=0) -> Module:
    """The partial inverse of ``MaxPool2d``, as torch.nn.MaxUnpool2d: ``apply(params, x, indices,
    output_size=None)`` puts each value of ``x`` at the position ``indices`` (from
    ``MaxPool2d(..., return_indices=True)``) gives it, zeros elsewhere; output ``H_out = (H - 1) *
    stride - 2 * padding + kernel_size`` unless ``output_size`` (the pool's input size) says
    otherwise. Indices that collide (overlapping windows) keep one of the values, as torch."""
    return _max_unpool(2, kernel_size, stride, padding)


def MaxUnpool3d(kernel_size, stride=None, padding=0) -> Module:
    """The partial inverse of ``MaxPool3d``, as torch.nn.MaxUnpool3d. See ``MaxUnpool2d``."""
    return _max_unpool(3, kernel_size, stride, padding)
