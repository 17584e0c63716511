"""Resampling against torch: Upsample (every mode), UpsamplingNearest2d/Bilinear2d,
PixelShuffle/Unshuffle and F.interpolate's antialias, through tests/torch_oracle.check_layer
(forward, input gradient, one compile); a forward sweep of F.interpolate over modes, ranks,
ratios and align_corners against torch.nn.functional.interpolate; torch's repr; the errors.

These layers have no params, no state and no train/eval difference, so each row runs twice:
train mode in float32 and eval mode in float64 (both modes, both dtypes, half the compiles).
Tolerances are check_layer's: bicubic's 4-tap sums with weights above 1 and below 0 cancel,
which its magnitude of the terms accounts for.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from funcnet.nn import functional as F
from funcnet.nn.activation import _no_params
from tests.torch_oracle import check_layer

MODES = [(True, "float32"), (False, "float64")]

# (id, class name, args, kwargs, input shape)
TABLE = [
    ("nearest-x2-2d", "Upsample", (), dict(scale_factor=2), (2, 3, 4, 5)),
    ("nearest-1.7-1d", "Upsample", (), dict(scale_factor=1.7), (2, 3, 6)),
    # a doubled size from a non-2 scale: torch's 2-D kernel reads dst >> 1, not floor(dst / 2.1)
    ("nearest-2.1-2d", "Upsample", (), dict(scale_factor=2.1), (1, 2, 5, 3)),
    ("nearest-down-3d", "Upsample", (), dict(size=(2, 5, 3)), (1, 2, 5, 7, 4)),
    ("nearest-exact-0.6-2d", "Upsample", (), dict(scale_factor=0.6, mode="nearest-exact"), (2, 2, 7, 9)),
    ("linear-1.7", "Upsample", (), dict(scale_factor=1.7, mode="linear"), (2, 3, 6)),
    ("linear-align-size", "Upsample", (), dict(size=11, mode="linear", align_corners=True), (2, 3, 6)),
    ("bilinear-x2", "Upsample", (), dict(scale_factor=2, mode="bilinear"), (2, 2, 4, 5)),
    ("bilinear-0.6-align", "Upsample", (), dict(scale_factor=0.6, mode="bilinear", align_corners=True), (2, 2, 7, 9)),
    ("bilinear-1.7-recompute", "Upsample", (), dict(scale_factor=(1.7, 1.3), mode="bilinear",
                                                      recompute_scale_factor=True), (1, 2, 5, 6)),
    ("bicubic-1.5", "Upsample", (), dict(scale_factor=1.5, mode="bicubic"), (2, 2, 5, 4)),
    ("bicubic-0.6-align", "Upsample", (), dict(scale_factor=0.6, mode="bicubic", align_corners=True), (1, 2, 7, 9)),
    ("trilinear-1.5", "Upsample", (), dict(scale_factor=(1.5, 0.7, 2), mode="trilinear"), (1, 2, 4, 6, 3)),
    ("area-down", "Upsample", (), dict(size=(3, 4), mode="area"), (2, 2, 7, 9)),
    ("upsampling-nearest2d", "UpsamplingNearest2d", (), dict(scale_factor=3), (2, 2, 3, 4)),
    ("upsampling-bilinear2d", "UpsamplingBilinear2d", (), dict(size=(7, 5)), (2, 2, 3, 4)),
    ("pixel-shuffle", "PixelShuffle", (2,), {}, (2, 8, 3, 4)),
    ("pixel-shuffle-5d", "PixelShuffle", (3,), {}, (2, 1, 9, 2, 3)),
    ("pixel-unshuffle", "PixelUnshuffle", (2,), {}, (2, 2, 4, 6)),
]
IDS = [row[0] for row in TABLE]


def _pair(row):
    _, cls, args, kwargs, _ = row
    return getattr(nn, cls)(*args, **kwargs), getattr(torch.nn, cls)(*args, **kwargs)


@pytest.mark.parametrize("train,dtype", MODES)
@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_resampling_equals_torch(row, train, dtype):
    x = np.random.default_rng(0).standard_normal(row[-1])
    with jax.enable_x64(dtype == "float64"):
        ours, theirs = _pair(row)
        check_layer(ours, theirs, [x], train=train, dtype=dtype)


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_name_is_torch_repr(row):
    ours, theirs = _pair(row)
    assert ours.name == repr(theirs)


class _TorchFunction(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


# torch's antialias exists in F.interpolate only: down- and upscaling, both filters
ANTIALIAS = [
    ("bilinear-aa-0.45", dict(scale_factor=0.45, mode="bilinear")),
    ("bilinear-aa-size-align", dict(size=(3, 8), mode="bilinear", align_corners=True)),
    ("bicubic-aa-0.6", dict(scale_factor=(0.6, 0.35), mode="bicubic")),
    ("bicubic-aa-up", dict(scale_factor=1.6, mode="bicubic")),
]


@pytest.mark.parametrize("train,dtype", MODES)
@pytest.mark.parametrize("kwargs", [k for _, k in ANTIALIAS], ids=[i for i, _ in ANTIALIAS])
def test_interpolate_antialias_equals_torch(kwargs, train, dtype):
    x = np.random.default_rng(1).standard_normal((2, 2, 9, 7))
    ours = nn.Module(_no_params, lambda params, v, key=None, train=False: F.interpolate(v, antialias=True, **kwargs))
    theirs = _TorchFunction(lambda v: torch.nn.functional.interpolate(v, antialias=True, **kwargs))
    with jax.enable_x64(dtype == "float64"):
        check_layer(ours, theirs, [x], train=train, dtype=dtype)


def _apply_plan(x, steps):
    # interpolate's gathers and weights applied with numpy: the jnp assembly is checked by the
    # rows above, this sweep checks torch's index math over many shapes without compiling
    for axis, idx, w in steps:
        taps = np.take(x, idx, axis=axis)  # (..., out, K, ...)
        if w is None:
            x = taps[(slice(None),) * (axis + 1) + (0,)]
        else:
            x = np.sum(taps * w.reshape(w.shape + (1,) * (x.ndim - 1 - axis)), axis=axis + 1)
    return x


def test_interpolate_forward_sweep_equals_torch():
    # every mode at every rank it takes, up and down, integer and non-integer ratios,
    # explicit sizes, align_corners both ways, recompute_scale_factor, antialias
    rng = np.random.default_rng(2)
    ratios = [dict(scale_factor=2), dict(scale_factor=3), dict(scale_factor=1.7), dict(scale_factor=0.6),
              dict(scale_factor=0.37), dict(scale_factor=2.1), dict(scale_factor=1.7, recompute_scale_factor=True),
              dict(scale_factor=(1.3, 0.55, 2.5)), dict(size=(3, 11, 4))]
    ranks = {"linear": [3], "bilinear": [4], "bicubic": [4], "trilinear": [5]}
    checked = 0
    for dtype, tol in (("float64", dict(rtol=1e-12, atol=1e-13)), ("float32", dict(rtol=1e-5, atol=1e-5))):
        for mode in F.resample.MODES:
            for ndim in ranks.get(mode, [3, 4, 5]):
                x = rng.standard_normal((1, 2, 5, 7, 6)[:ndim]).astype(dtype)
                for kw in ratios:
                    kw = {k: v[:ndim - 2] if isinstance(v, tuple) else v for k, v in kw.items()}
                    for align in ([None, True] if mode in ranks else [None]):
                        for aa in ([False, True] if mode in ("bilinear", "bicubic") else [False]):
                            options = dict(mode=mode, align_corners=align, antialias=aa, **kw)
                            want = torch.nn.functional.interpolate(torch.tensor(x), **options).numpy()
                            got = _apply_plan(x, F.resample.plan(x.shape, x.dtype, **options))
                            assert got.shape == want.shape, options
                            np.testing.assert_allclose(got, want, err_msg=f"{ndim}D {dtype} {options}", **tol)
                            checked += 1
    assert checked > 300


def test_16_bit_inputs_are_weighed_in_float32_as_torch():
    # torch's kernels weigh bfloat16/float16 in float32 (its bicubic with weights stored in the
    # input's dtype) and round once: within a 16-bit rounding step of torch, in the input's dtype
    x = np.random.default_rng(3).standard_normal((1, 2, 5, 7)).astype(np.float32)
    for ours, theirs, ulp in ((jnp.bfloat16, torch.bfloat16, 2.0 ** -7), (jnp.float16, torch.float16, 2.0 ** -10)):
        for kwargs in (dict(scale_factor=1.7, mode="bicubic"), dict(scale_factor=0.6, mode="bilinear"),
                       dict(size=(3, 11), mode="bilinear", align_corners=True)):
            got = jax.jit(lambda v: F.interpolate(v, **kwargs))(jnp.asarray(x, ours))
            want = torch.nn.functional.interpolate(torch.tensor(x).to(theirs), **kwargs).float().numpy()
            assert got.dtype == ours
            np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=ulp, atol=ulp, err_msg=str(kwargs))


def test_nearest_is_torchs_not_jax_image_resize():
    # the pitfall named in the module docstring: jax.image.resize's "nearest" is torch's "nearest-exact"
    x = jnp.arange(7.0)[None, None]
    ours = F.interpolate(x, size=3)
    np.testing.assert_array_equal(ours[0, 0], [0.0, 2.0, 4.0])  # floor(dst * 7/3)
    np.testing.assert_array_equal(F.interpolate(x, size=3, mode="nearest-exact")[0, 0],
                                  jax.image.resize(x, (1, 1, 3), "nearest")[0, 0])  # floor((dst + .5) * 7/3)
    assert not np.array_equal(ours, jax.image.resize(x, (1, 1, 3), "nearest"))


def test_errors_are_named():
    with pytest.raises(ValueError, match="mode must be one of"):
        nn.Upsample(scale_factor=2, mode="cubic")
    with pytest.raises(ValueError, match="only one of size or scale_factor"):
        nn.Upsample(size=3, scale_factor=2)
    with pytest.raises(ValueError, match="either size or scale_factor"):
        nn.Upsample()
    with pytest.raises(ValueError, match="align_corners option can only be set with the interpolating modes"):
        nn.Upsample(scale_factor=2, align_corners=True)
    with pytest.raises(ValueError, match="recompute_scale_factor is not meaningful with an explicit size"):
        nn.Upsample(size=4, recompute_scale_factor=True)
    with pytest.raises(ValueError, match="scale_factor must be a positive number"):
        nn.Upsample(scale_factor=0)
    with pytest.raises(ValueError, match="antialias=True is restricted to the bilinear and bicubic modes"):
        F.interpolate(jnp.zeros((1, 1, 4, 4)), scale_factor=0.5, antialias=True)
    with pytest.raises(ValueError, match=r"got a 3D input of shape \(1, 1, 4\), but mode='bilinear' needs a 4D input; "
                                         r"use mode='linear'"):
        nn.Upsample(scale_factor=2, mode="bilinear").apply({}, jnp.zeros((1, 1, 4)))
    with pytest.raises(ValueError, match=r"expected a 3D \(N, C, L\), 4D .* got shape \(4, 4\)"):
        F.interpolate(jnp.zeros((4, 4)), scale_factor=2)
    with pytest.raises(ValueError, match=r"scale_factor=\(2, 2\) has 2 entries"):
        F.interpolate(jnp.zeros((1, 1, 4)), scale_factor=(2, 2))
    with pytest.raises(ValueError, match=r"gives output size \(0,\)"):
        F.interpolate(jnp.zeros((1, 1, 4)), scale_factor=0.2)
    with pytest.raises(ValueError, match=r"channels divisible by 4\), got shape \(1, 6, 2, 2\)"):
        nn.PixelShuffle(2).apply({}, jnp.zeros((1, 6, 2, 2)))
    with pytest.raises(ValueError, match="upscale_factor must be a positive int, got 0"):
        nn.PixelShuffle(0)
    with pytest.raises(ValueError, match=r"H and W divisible by r=2, got shape \(1, 1, 3, 4\)"):
        nn.PixelUnshuffle(2).apply({}, jnp.zeros((1, 1, 3, 4)))
