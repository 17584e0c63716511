"""Resampling, as torch.nn.functional's: interpolate (upsample), pixel_shuffle, pixel_unshuffle.

``interpolate`` is separable: each spatial axis is resampled in turn as a weighted sum of
gathered input rows, ``y[..., i, ...] = sum_k w[i, k] * x[..., idx[i, k], ...]``. The
indices and weights depend only on shapes, so they are computed with numpy at trace time,
with torch's own index math (ATen's ``UpSample.h`` and the CPU kernels) in torch's
precision: the nearest indices in float32 whatever the input, the linear and cubic
weights in the input's precision (float32, or float64 for float64 inputs). Two pitfalls this
avoids, against ``jax.image.resize``:

- torch's ``"nearest"`` is ``floor(dst * in/out)`` (OpenCV's rule, kept by torch);
  ``jax.image.resize``'s ``"nearest"`` is torch's ``"nearest-exact"``,
  ``floor((dst + 0.5) * in/out)``. They differ on non-integer ratios.
- ``jax.image.resize``'s ``"linear"``/``"cubic"`` antialias when downscaling; torch's
  bilinear and bicubic do not, unless ``antialias=True`` (then torch's filter: a triangle or
  Keys' cubic with a=-0.5, stretched by the scale, normalized per output).

The gradient is autodiff's: the transpose of a gather is the scatter-add that torch's
backward kernels run. bfloat16/float16 inputs are weighed in float32 and rounded once, as
torch's kernels (its bicubic with weights stored in the input's dtype): equal to torch, or a
16-bit rounding step away where its 1-D/3-D kernels round differently.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

__all__ = ["interpolate", "upsample", "upsample_nearest", "upsample_bilinear", "pixel_shuffle", "pixel_unshuffle"]

MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")
_INTERPOLATING = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5}


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def check_options(size, scale_factor, mode, align_corners, recompute_scale_factor, antialias, where: str):
    """The checks that depend on the arguments only (build time for ``Upsample``)."""
    if mode not in MODES:
        raise ValueError(f"{where}: mode must be one of {MODES}, got {mode!r}")
    if size is not None and scale_factor is not None:
        raise ValueError(f"{where}: only one of size or scale_factor should be defined, got size={size!r} and "
                         f"scale_factor={scale_factor!r}; drop one of them")
    if size is None and scale_factor is None:
        raise ValueError(f"{where}: either size or scale_factor should be defined")
    if size is not None:
        sizes = size if isinstance(size, (tuple, list)) else (size,)
        if not sizes or not all(_is_int(s) and s > 0 for s in sizes):
            raise ValueError(f"{where}: size must be a positive int or a tuple of positive ints (one per spatial "
                             f"axis), got {size!r}")
    if scale_factor is not None:
        scales = scale_factor if isinstance(scale_factor, (tuple, list)) else (scale_factor,)
        if not scales or not all(_is_number(s) and 0 < s < math.inf for s in scales):
            raise ValueError(f"{where}: scale_factor must be a positive number or a tuple of positive numbers (one "
                             f"per spatial axis), got {scale_factor!r}")
    if recompute_scale_factor and size is not None:
        raise ValueError(f"{where}: recompute_scale_factor is not meaningful with an explicit size; pass "
                         f"scale_factor instead of size, or recompute_scale_factor=None")
    if align_corners is not None and mode not in _INTERPOLATING:
        raise ValueError(f"{where}: align_corners option can only be set with the interpolating modes: linear | "
                         f"bilinear | bicubic | trilinear, got mode={mode!r} with align_corners={align_corners!r}; "
                         f"leave align_corners=None")
    if antialias and mode not in ("bilinear", "bicubic"):
        raise ValueError(f"{where}: antialias=True is restricted to the bilinear and bicubic modes (as torch), got "
                         f"mode={mode!r}")


def _per_axis(value, n: int, what: str, where: str) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise ValueError(f"{where}: the input has {n} spatial axes, but {what}={tuple(value)!r} has {len(value)} "
                             f"entries; give one per spatial axis or a single number")
        return tuple(value)
    return (value,) * n


def _sizes_and_scales(in_sizes, size, scale_factor, mode, recompute, where):
    """Output sizes and the scales torch's kernels receive (None: the kernel uses in/out)."""
    n = len(in_sizes)
    if size is not None:
        return _per_axis(size, n, "size", where), (None,) * n
    scales = tuple(float(s) for s in _per_axis(scale_factor, n, "scale_factor", where))
    out = tuple(int(math.floor(float(L) * s)) for L, s in zip(in_sizes, scales))
    if min(out) < 1:
        raise ValueError(f"{where}: input of spatial size {tuple(in_sizes)} with scale_factor={scale_factor!r} "
                         f"gives output size {out}; input and output sizes should be greater than 0")
    if recompute or mode == "area":  # torch: the kernel sees the sizes only
        scales = (None,) * n
    return out, scales


def _scale(in_size, out_size, align_corners, scale, dt):
    """ATen's area_pixel_compute_scale, in precision ``dt``."""
    if align_corners:
        return dt(in_size - 1) / dt(out_size - 1) if out_size > 1 else dt(0)
    return dt(1.0 / scale) if scale is not None and scale > 0 else dt(in_size) / dt(out_size)


def _source_index(scale, out_size, align_corners, cubic, dt):
    """ATen's area_pixel_compute_source_index for every output position."""
    dst = np.arange(out_size).astype(dt)
    if align_corners:
        return scale * dst
    src = scale * (dst + dt(0.5)) - dt(0.5)
    return src if cubic else np.maximum(src, dt(0))


def _nearest(in_size, out_size, scale, exact, two_d):
    if out_size == in_size:
        return np.arange(out_size)[:, None], None
    # torch's nearest_idx shortcut for a doubled size: its 2-D kernel takes it whatever the scale
    # (input 5 at scale_factor=2.1 reads dst >> 1), the 1-D and 3-D ones only when no scale is given
    if out_size == 2 * in_size and (scale is None or two_d) and not exact:
        return (np.arange(out_size) >> 1)[:, None], None
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(in_size) / np.float32(out_size)
    dst = np.arange(out_size)
    if exact:  # (dst + 0.5) * scale in double, floorf in float
        src = np.floor(((dst + 0.5) * np.float64(s)).astype(np.float32)).astype(np.int64)
    else:
        src = np.floor(dst.astype(np.float32) * s).astype(np.int64)
    return np.minimum(src, in_size - 1)[:, None], None


def _linear(in_size, out_size, scale, align_corners, dt):
    s = _scale(in_size, out_size, align_corners, scale, dt)
    real = _source_index(s, out_size, align_corners, False, dt)
    i0 = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    lam1 = np.clip(real - i0.astype(dt), dt(0), dt(1)).astype(dt)
    i1 = i0 + (i0 < in_size - 1)
    return np.stack([i0, i1], 1), np.stack([dt(1) - lam1, lam1], 1)


def _cubic_coefficients(t, dt):
    A = dt(-0.75)

    def conv1(x):  # |x| <= 1
        return ((A + dt(2)) * x - (A + dt(3))) * x * x + dt(1)

    def conv2(x):  # 1 < |x| < 2
        return ((A * x - dt(5) * A) * x + dt(8) * A) * x - dt(4) * A

    x2 = dt(1) - t
    return np.stack([conv2(t + dt(1)), conv1(t), conv1(x2), conv2(x2 + dt(1))], 1).astype(dt)


def _cubic(in_size, out_size, scale, align_corners, dt):
    s = _scale(in_size, out_size, align_corners, scale, dt)
    real = _source_index(s, out_size, align_corners, True, dt)
    i = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    t = np.clip(real - i.astype(dt), dt(0), dt(1)).astype(dt)
    idx = np.clip(i[:, None] + np.arange(-1, 3)[None, :], 0, in_size - 1)
    return idx, _cubic_coefficients(t, dt)


def _aa_filter(x, cubic, dt):
    x = np.abs(x)
    if not cubic:
        return np.where(x < 1, dt(1) - x, dt(0)).astype(dt)
    a = dt(-0.5)  # torch's antialiased bicubic uses Keys' a=-0.5 (as PIL), not -0.75
    near = ((a + dt(2)) * x - (a + dt(3))) * x * x + dt(1)
    far = (((x - dt(5)) * x + dt(8)) * x - dt(4)) * a
    return np.where(x < 1, near, np.where(x < 2, far, dt(0))).astype(dt)


def _antialiased(in_size, out_size, scale, align_corners, cubic, dt):
    """ATen's _compute_weights_aa: the filter stretched by the scale when downscaling, each
    output's weights normalized to sum to one."""
    s = _scale(in_size, out_size, align_corners, scale, dt)
    interp = 4 if cubic else 2
    support = dt(interp * 0.5) * s if s >= 1 else dt(interp * 0.5)
    invscale = dt(1) / s if s >= 1 else dt(1)
    width = int(math.ceil(support)) * 2 + 1
    center = s * (np.arange(out_size).astype(dt) + dt(0.5))
    xmin = np.maximum(np.trunc(center - support + dt(0.5)).astype(np.int64), 0)
    xsize = np.minimum(np.trunc(center + support + dt(0.5)).astype(np.int64), in_size) - xmin
    j = np.arange(width)
    w = _aa_filter((j[None, :] + xmin[:, None] - center[:, None] + dt(0.5)).astype(dt) * invscale, cubic, dt)
    w = np.where(j[None, :] < xsize[:, None], w, dt(0)).astype(dt)
    total = w.sum(1, keepdims=True, dtype=dt)
    w = np.where(total != 0, w / np.where(total != 0, total, dt(1)), w).astype(dt)
    idx = np.minimum(xmin[:, None] + j[None, :], in_size - 1)
    return idx, w


def _area(in_size, out_size, dt):
    """Adaptive average pooling's bins [floor(i*in/out), ceil((i+1)*in/out)) as gathers with 1/len weights."""
    i = np.arange(out_size)
    start = (i * in_size) // out_size
    end = -((-(i + 1) * in_size) // out_size)
    width = int((end - start).max())
    j = np.arange(width)
    inside = j[None, :] < (end - start)[:, None]
    idx = np.minimum(start[:, None] + j[None, :], in_size - 1)
    return idx, np.where(inside, dt(1) / (end - start)[:, None].astype(dt), dt(0)).astype(dt)


def _resample_axis(x, axis: int, idx: np.ndarray, w: np.ndarray | None):
    """``y[..., i, ...] = sum_k w[i, k] * x[..., idx[i, k], ...]`` along ``axis``."""
    if w is None:
        return jnp.take(x, jnp.asarray(idx[:, 0]), axis=axis)
    trailing = (1,) * (x.ndim - 1 - axis)
    y = None
    for k in range(idx.shape[1]):
        if not np.any(w[:, k]):
            continue
        term = jnp.take(x, jnp.asarray(idx[:, k]), axis=axis) * jnp.asarray(w[:, k].reshape((-1,) + trailing),
                                                                             x.dtype)
        y = term if y is None else y + term
    return y


def interpolate(input, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None,
                recompute_scale_factor: bool | None = None, antialias: bool = False):
    """Resize the spatial axes of ``(N, C, *spatial)``, as torch.nn.functional.interpolate.

    ``size`` (an int or one per axis) or ``scale_factor`` (output size ``floor(in * scale)``;
    torch's kernels then map positions with ``1/scale_factor``, unless
    ``recompute_scale_factor=True``, which maps them with ``in/out``). ``mode``:

    - ``"nearest"``: source ``min(floor(dst * scale), in-1)`` (torch's default; not
      ``jax.image.resize``'s nearest); ``"nearest-exact"``: ``floor((dst + 0.5) * scale)``;
    - ``"linear"`` (3D input), ``"bilinear"`` (4D), ``"trilinear"`` (5D): source
      ``scale * (dst + 0.5) - 0.5`` clamped at 0, or ``dst * (in-1)/(out-1)`` with
      ``align_corners=True``; ``"bicubic"`` (4D): Keys' cubic with a=-0.75, clamped borders;
    - ``"area"``: adaptive average pooling to the output size;
    - ``antialias=True`` (bilinear/bicubic, 4D): torch's antialiasing filter when downscaling.
    """
    where = "interpolate"
    check_options(size, scale_factor, mode, align_corners, recompute_scale_factor, antialias, where)
    x = jnp.asarray(input)
    if x.ndim not in (3, 4, 5):
        raise ValueError(f"{where}: expected a 3D (N, C, L), 4D (N, C, H, W) or 5D (N, C, D, H, W) input, got "
                         f"shape {tuple(x.shape)}; add the batch axis with x[None]")
    if mode in _INTERPOLATING and x.ndim != _INTERPOLATING[mode]:
        raise ValueError(f"{where}: got a {x.ndim}D input of shape {tuple(x.shape)}, but mode={mode!r} needs a "
                         f"{_INTERPOLATING[mode]}D input; use "
                         f"mode={ {3: 'linear', 4: 'bilinear', 5: 'trilinear'}[x.ndim]!r} for this rank")
    if antialias and x.ndim != 4:
        raise ValueError(f"{where}: antialias=True needs a 4D input (N, C, H, W), got shape {tuple(x.shape)}")
    if mode not in ("nearest", "nearest-exact") and not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{where}: mode={mode!r} needs a floating input, got dtype {x.dtype}; cast it first")
    dtype = x.dtype
    half = mode not in ("nearest", "nearest-exact") and jnp.finfo(dtype).bits < 32
    if half:
        x = x.astype(jnp.float32)  # torch's kernels weigh 16-bit inputs in float32 (its opmath type)
    for axis, idx, w in plan(x.shape, x.dtype, size, scale_factor, mode, align_corners, recompute_scale_factor,
                             antialias):
        if half and mode == "bicubic" and not antialias:
            w = w.astype(np.dtype(dtype)).astype(np.float32)  # its bicubic stores them in the input's dtype
        x = _resample_axis(x, axis, idx, w)
    return x.astype(dtype)


def plan(shape, dtype, size=None, scale_factor=None, mode="nearest", align_corners=None,
         recompute_scale_factor=None, antialias=False, where="interpolate"):
    """``[(axis, idx, w), ...]``: the gathers and weights ``interpolate`` applies to an input of
    ``shape`` and ``dtype``, one per spatial axis, last axis first (as torch's separable
    kernels). ``w`` is None for the nearest modes (a plain gather)."""
    n = len(shape) - 2
    out, scales = _sizes_and_scales(shape[2:], size, scale_factor, mode, recompute_scale_factor, where)
    align = bool(align_corners)
    dt = np.float64 if dtype == jnp.float64 else np.float32
    steps = []
    for axis in reversed(range(n)):
        L, o, s = shape[2 + axis], out[axis], scales[axis]
        if mode in ("nearest", "nearest-exact"):
            idx, w = _nearest(L, o, s, mode == "nearest-exact", n == 2)
        elif mode == "area":
            idx, w = _area(L, o, dt)
        elif antialias:
            idx, w = _antialiased(L, o, s, align, mode == "bicubic", dt)
        elif mode == "bicubic":
            idx, w = _cubic(L, o, s, align, dt)
        else:
            idx, w = _linear(L, o, s, align, dt)
        steps.append((2 + axis, idx, w))
    return steps


def upsample(input, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None):
    """torch.nn.functional.upsample (deprecated there): ``interpolate``."""
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_nearest: ``interpolate(..., mode="nearest")``."""
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_bilinear: ``interpolate(..., mode="bilinear", align_corners=True)``."""
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


def _check_factor(value, what: str, where: str) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{where}: {what} must be a positive int, got {value!r}")
    return int(value)


def pixel_shuffle(input, upscale_factor: int):
    """``(*, C*r*r, H, W) -> (*, C, H*r, W*r)``, as torch.nn.functional.pixel_shuffle: channel
    ``c*r*r + i*r + j`` goes to pixel ``(h*r + i, w*r + j)`` of channel ``c``."""
    where = "pixel_shuffle"
    r = _check_factor(upscale_factor, "upscale_factor", where)
    x = jnp.asarray(input)
    if x.ndim < 3 or x.shape[-3] % (r * r):
        raise ValueError(f"{where}: expected an input (*, C*r*r, H, W) with r={r} (channels divisible by {r * r}), "
                         f"got shape {tuple(x.shape)}")
    *lead, C, H, W = x.shape
    c = C // (r * r)
    y = x.reshape(*lead, c, r, r, H, W)
    k = len(lead)
    y = y.transpose(*range(k), k, k + 3, k + 1, k + 4, k + 2)
    return y.reshape(*lead, c, H * r, W * r)


def pixel_unshuffle(input, downscale_factor: int):
    """``(*, C, H*r, W*r) -> (*, C*r*r, H, W)``, as torch.nn.functional.pixel_unshuffle (the
    inverse of ``pixel_shuffle``)."""
    where = "pixel_unshuffle"
    r = _check_factor(downscale_factor, "downscale_factor", where)
    x = jnp.asarray(input)
    if x.ndim < 3 or x.shape[-2] % r or x.shape[-1] % r:
        raise ValueError(f"{where}: expected an input (*, C, H, W) with H and W divisible by r={r}, got shape "
                         f"{tuple(x.shape)}")
    *lead, C, H, W = x.shape
    k = len(lead)
    y = x.reshape(*lead, C, H // r, r, W // r, r)
    y = y.transpose(*range(k), k, k + 2, k + 4, k + 1, k + 3)
    return y.reshape(*lead, C * r * r, H // r, W // r)
