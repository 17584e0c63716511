"""Resampling layers, as torch.nn's: Upsample, UpsamplingNearest2d, UpsamplingBilinear2d,
PixelShuffle, PixelUnshuffle. No params, no state; the math is ``funcnet.nn.functional``'s
``interpolate``, ``pixel_shuffle`` and ``pixel_unshuffle`` (torch's index math, see there).

Examples:
    >>> import jax.numpy as jnp
    >>> from funcnet import nn
    >>> nn.PixelShuffle(2).apply({}, jnp.ones((1, 8, 3, 3))).shape
    (1, 2, 6, 6)
"""

from __future__ import annotations

from funcnet.nn.activation import _no_params
from funcnet.nn.functional import resample as _F
from funcnet.nn.module import Module

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle", "PixelUnshuffle"]


def _as_float(scale_factor):
    # torch's Upsample stores the scale as float(s), which its repr shows
    if scale_factor is None:
        return None
    if isinstance(scale_factor, (tuple, list)):
        return tuple(float(s) for s in scale_factor)
    return float(scale_factor)


def _upsample(cls: str, size, scale_factor, mode, align_corners, recompute_scale_factor) -> Module:
    _F.check_options(size, scale_factor, mode, align_corners, recompute_scale_factor, False, cls)
    scale_factor = _as_float(scale_factor)
    shown = f"scale_factor={scale_factor!r}" if scale_factor is not None else f"size={size!r}"
    name = f"{cls}({shown}, mode={mode!r})"

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor)

    return Module(_no_params, apply, name=name)


def Upsample(size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None,
             recompute_scale_factor: bool | None = None) -> Module:
    """Resize ``(N, C, *spatial)`` (1 to 3 spatial axes), as torch.nn.Upsample: ``size`` or
    ``scale_factor``, mode ``"nearest"`` (torch's: ``floor(dst * in/out)``),
    ``"nearest-exact"``, ``"linear"``, ``"bilinear"``, ``"bicubic"``, ``"trilinear"``,
    ``"area"``; ``align_corners`` for the interpolating modes. See
    ``funcnet.nn.functional.interpolate``."""
    return _upsample("Upsample", size, scale_factor, mode, align_corners, recompute_scale_factor)


def UpsamplingNearest2d(size=None, scale_factor=None) -> Module:
    """torch.nn.UpsamplingNearest2d: ``Upsample(size, scale_factor, mode="nearest")`` on 4D inputs."""
    return _upsample("UpsamplingNearest2d", size, scale_factor, "nearest", None, None)


def UpsamplingBilinear2d(size=None, scale_factor=None) -> Module:
    """torch.nn.UpsamplingBilinear2d: ``Upsample(size, scale_factor, mode="bilinear",
    align_corners=True)`` on 4D inputs."""
    return _upsample("UpsamplingBilinear2d", size, scale_factor, "bilinear", True, None)


def PixelShuffle(upscale_factor: int) -> Module:
    """``(*, C*r*r, H, W) -> (*, C, H*r, W*r)``, as torch.nn.PixelShuffle (sub-pixel convolution's
    rearrangement)."""
    r = _F._check_factor(upscale_factor, "upscale_factor", "PixelShuffle")

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F.pixel_shuffle(x, r)

    return Module(_no_params, apply, name=f"PixelShuffle(upscale_factor={r})")


def PixelUnshuffle(downscale_factor: int) -> Module:
    """``(*, C, H*r, W*r) -> (*, C*r*r, H, W)``, as torch.nn.PixelUnshuffle."""
    r = _F._check_factor(downscale_factor, "downscale_factor", "PixelUnshuffle")

    def apply(params, x, *, key=None, train=False):
        del params, key, train
        return _F.pixel_unshuffle(x, r)

    return Module(_no_params, apply, name=f"PixelUnshuffle(downscale_factor={r})")
