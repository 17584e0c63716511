"""Convolutions, as torch.nn's: Conv1d/2d/3d and ConvTranspose1d/2d/3d.

Layouts are torch's: activations channels-first ``(N, C, *spatial)`` (or unbatched
``(C, *spatial)``), weights ``(out, in/groups, *kernel)`` for a convolution and
``(in, out/groups, *kernel)`` for a transposed one, so a torch ``state_dict`` loads with no
renaming. The math is ``funcnet.nn.functional.conv2d`` etc. (XLA's convolution, patches + one
``einsum`` or a sum over taps, chosen by shape, at ``Precision.HIGHEST``); a padding mode other than zeros
pads first, as torch's ``_conv_forward``. Default init is torch's ``reset_parameters``: weight
``kaiming_uniform(a=sqrt(5))`` = U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias the same bound,
with ``fan_in = weight.shape[1] * prod(kernel)`` (torch computes it from the weight as
laid out, so a transposed convolution's fan_in counts ``out/groups``).

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from funcnet import nn
    >>> conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
    >>> conv.apply(conv.init(jax.random.key(0)), jnp.ones((2, 3, 16, 16))).shape
    (2, 8, 16, 16)
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from funcnet import init as _init
from funcnet.nn.functional import conv as _F
from funcnet.nn.functional._common import float_dtype, ntuple
from funcnet.nn.module import Module

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
_JNP_PAD_MODE = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}
_ntuple = ntuple  # pooling's name for it


def _check_channels(value, what: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {what} must be a positive int, got {value!r}")
    return value


def _repr(cls: str, in_channels, out_channels, kernel, stride, padding, dilation, output_padding, groups, bias,
          padding_mode) -> str:
    # torch's _ConvNd.extra_repr: defaults are left out, tuples shown as tuples
    s = f"{cls}({in_channels}, {out_channels}, kernel_size={kernel}, stride={stride}"
    if padding != (0,) * len(kernel):
        s += f", padding={padding}"
    if dilation != (1,) * len(kernel):
        s += f", dilation={dilation}"
    if output_padding != (0,) * len(kernel):
        s += f", output_padding={output_padding}"
    if groups != 1:
        s += f", groups={groups}"
    if not bias:
        s += ", bias=False"
    if padding_mode != "zeros":
        s += f", padding_mode={padding_mode}"
    return s + ")"


def _build(n: int, transposed: bool, in_channels, out_channels, kernel_size, stride, padding, output_padding,
           groups, bias, dilation, padding_mode, dtype, weight_init, bias_init) -> Module:
    cls = f"Conv{'Transpose' if transposed else ''}{n}d"
    in_channels = _check_channels(in_channels, "in_channels", cls)
    out_channels = _check_channels(out_channels, "out_channels", cls)
    groups = _check_channels(groups, "groups", cls)
    kernel = _ntuple(kernel_size, n, "kernel_size", cls, 1)
    stride = _ntuple(stride, n, "stride", cls, 1)
    dilation = _ntuple(dilation, n, "dilation", cls, 1)
    for what, channels in (("in_channels", in_channels), ("out_channels", out_channels)):
        if channels % groups:
            raise ValueError(f"{cls}: {what}={channels} is not divisible by groups={groups}; each group "
                             f"needs {what}/groups channels, choose groups among the common divisors of "
                             f"in_channels and out_channels")
    if padding_mode not in _PADDING_MODES:
        raise ValueError(f"{cls}: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
    if transposed and padding_mode != "zeros":
        raise ValueError(f"{cls}: only padding_mode='zeros' is supported (as in torch), got {padding_mode!r}")
    shown_padding, pads = _F.padding_pairs(padding, n, kernel, stride, dilation, cls, transposed)
    out_pad = _ntuple(output_padding, n, "output_padding", cls, 0) if transposed else (0,) * n
    for op, s, d in zip(out_pad, stride, dilation):
        if op >= s and op >= d:
            raise ValueError(f"{cls}: output_padding={out_pad} must be smaller than either stride={stride} or "
                             f"dilation={dilation} in each dimension (as in torch)")
    if transposed:
        weight_shape = (in_channels, out_channels // groups, *kernel)
    else:
        weight_shape = (out_channels, in_channels // groups, *kernel)
    fan_in = weight_shape[1] * math.prod(kernel)
    name = _repr(cls, in_channels, out_channels, kernel, stride, shown_padding, dilation, out_pad, groups, bias,
                 padding_mode)

    def init_fn(key):
        dt = float_dtype(dtype)
        wkey, bkey = jax.random.split(key)
        params = {"weight": weight_init(wkey, weight_shape, dt)}
        if bias:
            params["bias"] = (_init.linear_bias(bkey, (out_channels,), dt, fan_in=fan_in) if bias_init is None
                              else bias_init(bkey, (out_channels,), dt))
        return params

    def apply(params, x, output_size=None, *, key=None, train=False):
        del key, train
        if output_size is not None and not transposed:
            raise TypeError(f"{name}: output_size= is an argument of the transposed convolutions only")
        if transposed:
            op_ = out_pad
            if output_size is not None:  # torch's forward(x, output_size): the output padding that gives it
                from funcnet.nn.functional.conv_output_size import output_padding_for

                batched, unbatched = _F.as_batched(x, n, in_channels, name)
                op_ = output_padding_for(batched.shape[2:], output_size, stride, [p for p, _ in pads], dilation,
                                         kernel, unbatched, name)
            return _F.conv_transpose(x, params["weight"], params.get("bias"), n, stride,
                                     tuple(p for p, _ in pads), op_, groups, dilation, name)
        if padding_mode != "zeros" and any(lo or hi for lo, hi in pads):
            x, unbatched = _F.as_batched(x, n, in_channels, name)
            sizes = x.shape[2:]
            if padding_mode != "replicate":
                limit = (lambda size: size) if padding_mode == "circular" else (lambda size: size - 1)
                for size, (lo, hi) in zip(sizes, pads):
                    if max(lo, hi) > limit(size):
                        raise ValueError(
                            f"{name}: padding {(lo, hi)} is too large for padding_mode={padding_mode!r} on an "
                            f"input of shape {tuple(x.shape[1:] if unbatched else x.shape)} (spatial size "
                            f"{tuple(sizes)}): it must be at most {limit(size)} there")
            x = jnp.pad(x, [(0, 0), (0, 0), *pads], mode=_JNP_PAD_MODE[padding_mode])
            y = _F.conv(x, params["weight"], params.get("bias"), n, stride, ((0, 0),) * n, dilation, groups, name)
            return y[0] if unbatched else y
        return _F.conv(x, params["weight"], params.get("bias"), n, stride, pads, dilation, groups, name)

    return Module(init_fn, apply, name=name)


def Conv1d(in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
           bias: bool = True, padding_mode: str = "zeros", *, dtype=None, weight_init: Callable = _init.linear_weight,
           bias_init: Callable | None = None) -> Module:
    """1D convolution (cross-correlation), as torch.nn.Conv1d.

    params: ``{"weight": (out, in/groups, k), "bias": (out,)}``; x: ``(N, C_in, L)`` or
    ``(C_in, L)`` -> ``(N, C_out, L_out)``. See ``Conv2d`` for the arguments.
    """
    return _build(1, False, in_channels, out_channels, kernel_size, stride, padding, 0, groups, bias, dilation,
                  padding_mode, dtype, weight_init, bias_init)


def Conv2d(in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
           bias: bool = True, padding_mode: str = "zeros", *, dtype=None, weight_init: Callable = _init.linear_weight,
           bias_init: Callable | None = None) -> Module:
    """2D convolution (cross-correlation), as torch.nn.Conv2d.

    params: ``{"weight": (out, in/groups, kH, kW), "bias": (out,)}``; x: ``(N, C_in, H, W)`` or
    ``(C_in, H, W)`` -> ``(N, C_out, H_out, W_out)`` with
    ``H_out = (H + 2*padding - dilation*(kH-1) - 1) // stride + 1``.

    ``kernel_size``, ``stride``, ``padding``, ``dilation``: an int or a tuple per spatial axis;
    ``padding`` may also be ``"valid"`` (none) or ``"same"`` (output size = input size, stride 1
    only; an odd total goes to the right/bottom, as torch). ``padding_mode``: ``"zeros"``,
    ``"reflect"``, ``"replicate"`` or ``"circular"``. ``groups``: ``in_channels`` and
    ``out_channels`` split into that many independent convolutions (``groups=in_channels`` is
    depthwise). ``dtype``: of the params (default: JAX's default float, float64 under x64). ``weight_init``/``bias_init``
    replace torch's default init (``init(key, shape, dtype)``).
    """
    return _build(2, False, in_channels, out_channels, kernel_size, stride, padding, 0, groups, bias, dilation,
                  padding_mode, dtype, weight_init, bias_init)


def Conv3d(in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
           bias: bool = True, padding_mode: str = "zeros", *, dtype=None, weight_init: Callable = _init.linear_weight,
           bias_init: Callable | None = None) -> Module:
    """3D convolution (cross-correlation), as torch.nn.Conv3d.

    params: ``{"weight": (out, in/groups, kD, kH, kW), "bias": (out,)}``; x: ``(N, C_in, D, H, W)``
    or ``(C_in, D, H, W)``. See ``Conv2d`` for the arguments.
    """
    return _build(3, False, in_channels, out_channels, kernel_size, stride, padding, 0, groups, bias, dilation,
                  padding_mode, dtype, weight_init, bias_init)


def ConvTranspose1d(in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                    groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", *, dtype=None,
                    weight_init: Callable = _init.linear_weight, bias_init: Callable | None = None) -> Module:
    """1D transposed convolution, as torch.nn.ConvTranspose1d.

    params: ``{"weight": (in, out/groups, k), "bias": (out,)}``; x: ``(N, C_in, L)`` or
    ``(C_in, L)``. See ``ConvTranspose2d`` for the arguments.
    """
    return _build(1, True, in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias,
                  dilation, padding_mode, dtype, weight_init, bias_init)


def ConvTranspose2d(in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                    groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", *, dtype=None,
                    weight_init: Callable = _init.linear_weight, bias_init: Callable | None = None) -> Module:
    """2D transposed convolution (the gradient of Conv2d with respect to its input), as
    torch.nn.ConvTranspose2d.

    params: ``{"weight": (in, out/groups, kH, kW), "bias": (out,)}`` (torch's layout: in first);
    x: ``(N, C_in, H, W)`` or ``(C_in, H, W)`` -> ``(N, C_out, H_out, W_out)`` with
    ``H_out = (H-1)*stride - 2*padding + dilation*(kH-1) + output_padding + 1``.
    ``output_padding`` (smaller than stride or dilation) adds rows/columns at the bottom/right
    to pick one of the input sizes a strided Conv2d maps to the same size. Only
    ``padding_mode="zeros"``, as torch. ``apply(params, x, output_size=(H_out, W_out))`` is
    torch's ``forward(x, output_size=...)``: it picks the output padding that gives that size
    (one of the ``stride`` sizes the formula allows; the built ``output_padding`` is then unused).
    """
    return _build(2, True, in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias,
                  dilation, padding_mode, dtype, weight_init, bias_init)


def ConvTranspose3d(in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                    groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", *, dtype=None,
                    weight_init: Callable = _init.linear_weight, bias_init: Callable | None = None) -> Module:
    """3D transposed convolution, as torch.nn.ConvTranspose3d.

    params: ``{"weight": (in, out/groups, kD, kH, kW), "bias": (out,)}``. See ``ConvTranspose2d``.
    """
    return _build(3, True, in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias,
                  dilation, padding_mode, dtype, weight_init, bias_init)
