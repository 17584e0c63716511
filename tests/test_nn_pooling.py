"""Pooling against torch: one table of configurations through tests/torch_oracle.check_layer
(forward, input gradient, one compile) in train and eval mode, float32 and float64; torch's
repr; the errors.

Tolerances are check_layer's defaults: a max is exact, a window mean divides a sum of at most
9 terms, and the adaptive mean sums through a 0/1 matrix (the summation order may differ from
torch's loop by an ulp or two).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from tests.torch_oracle import check_layer

# (id, class name, args, kwargs, input shape): the same arguments build both layers
TABLE = [
    ("max2d-2", "MaxPool2d", (2,), {}, (2, 3, 7, 6)),
    ("max2d-3-s2-p1", "MaxPool2d", (3, 2, 1), {}, (2, 2, 7, 6)),
    # ceil_mode: the last window starts inside the input and hangs past the padding
    ("max2d-rect-dilation-ceil", "MaxPool2d", ((2, 3),), dict(stride=(2, 1), padding=1, dilation=2, ceil_mode=True),
     (2, 2, 7, 6)),
    # ceil_mode where the extra window would start in the right padding: torch drops it
    ("max2d-ceil-drop-unbatched", "MaxPool2d", (2, 2, 1), dict(ceil_mode=True), (3, 6, 5)),
    ("max1d-ceil", "MaxPool1d", (3, 2, 1), dict(ceil_mode=True), (2, 3, 8)),
    ("max1d-dilation-unbatched", "MaxPool1d", (2,), dict(stride=1, dilation=3), (3, 8)),
    ("avg2d-2", "AvgPool2d", (2,), {}, (2, 3, 7, 6)),
    ("avg2d-ceil-include-pad", "AvgPool2d", (3, 2, 1), dict(ceil_mode=True), (2, 2, 8, 6)),
    ("avg2d-ceil-exclude-pad", "AvgPool2d", (3, 2, 1), dict(ceil_mode=True, count_include_pad=False), (2, 2, 8, 6)),
    ("avg2d-divisor-override", "AvgPool2d", (3, 2, 1), dict(ceil_mode=True, divisor_override=5), (2, 2, 8, 6)),
    ("avg2d-rect-exclude-unbatched", "AvgPool2d", ((2, 3),), dict(stride=(1, 2), padding=1, count_include_pad=False),
     (2, 5, 7)),
    ("avg1d-ceil", "AvgPool1d", (4, 3, 2), dict(ceil_mode=True), (2, 3, 9)),
    ("avg1d-exclude-pad", "AvgPool1d", (3, 2, 1), dict(count_include_pad=False), (2, 3, 8)),
    ("adaptive2d-global", "AdaptiveAvgPool2d", (1,), {}, (2, 3, 7, 6)),
    ("adaptive2d-divisible", "AdaptiveAvgPool2d", (3,), {}, (2, 3, 6, 9)),
    # 7 -> 4 and 5 -> 3: unequal, overlapping bins
    ("adaptive2d-uneven-unbatched", "AdaptiveAvgPool2d", ((4, 3),), {}, (3, 7, 5)),
    ("adaptive2d-none-upsample", "AdaptiveAvgPool2d", ((None, 7),), {}, (2, 2, 5, 4)),
    ("adaptive1d-uneven", "AdaptiveAvgPool1d", (4,), {}, (2, 3, 7)),
]
IDS = [row[0] for row in TABLE]


def _pair(row):
    _, cls, args, kwargs, _ = row
    return getattr(nn, cls)(*args, **kwargs), getattr(torch.nn, cls)(*args, **kwargs)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_pooling_equals_torch(row, train, dtype):
    x = np.random.default_rng(0).standard_normal(row[-1])
    with jax.enable_x64(dtype == "float64"):
        ours, theirs = _pair(row)
        check_layer(ours, theirs, [x], train=train, dtype=dtype)


@pytest.mark.parametrize("row", TABLE, ids=IDS)
def test_name_is_torch_repr(row):
    ours, theirs = _pair(row)
    assert ours.name == repr(theirs)


@pytest.mark.parametrize("args,kwargs", [((3, 1, 1), {}), ((2, 1, 1), dict(dilation=2, ceil_mode=True)),
                                         ((3, 2), dict(ceil_mode=True)), ((3, 1, 1), dict(ceil_mode=True))],
                         ids=["overlapping", "dilated", "ceil", "overlapping-ceil"])
def test_max_pool_gradient_on_ties_goes_to_the_first_maximum(args, kwargs):
    # rounded inputs tie often; torch gives each window's gradient to its first maximum
    # (GoogLeNet's pools are the ceil_mode rows: a last window that runs off the edge)
    x = np.round(np.random.default_rng(0).standard_normal((2, 2, 6, 7)))
    check_layer(nn.MaxPool2d(*args, **kwargs), torch.nn.MaxPool2d(*args, **kwargs), [x])


@pytest.mark.parametrize("args,kwargs", [((2,), {}), ((3, 2, 1), {}), ((3, 1, 1), dict(dilation=2, ceil_mode=True))],
                         ids=["2x2", "overlapping-padded", "dilated-ceil"])
def test_max_pool_with_nan_and_minus_inf_equals_torch(args, kwargs):
    # torch's loop: a NaN wins its window (the last NaN when there are several) and takes the
    # gradient; -inf beside padding is still a real maximum (padding never wins)
    rng = np.random.default_rng(1)
    x = np.round(rng.standard_normal((2, 2, 7, 6)))
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, 6, replace=False)] = np.nan
    flat[rng.choice(flat.size, 10, replace=False)] = -np.inf
    x[0, 0, :3, :3] = -np.inf  # a whole corner of -inf, next to the padding
    x[1, 1, 2:4, 2:4] = np.nan  # several NaNs in one window
    ours, theirs = nn.MaxPool2d(*args, **kwargs), torch.nn.MaxPool2d(*args, **kwargs)
    xt = torch.tensor(x, requires_grad=True)
    yt = theirs(xt)
    cot = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(cot))
    with jax.enable_x64(True):
        y, vjp = jax.vjp(lambda v: ours.apply({}, v), jnp.asarray(x))
        (g,) = vjp(jnp.asarray(cot))
    np.testing.assert_array_equal(np.asarray(y), yt.detach().numpy())  # NaN where torch has NaN, -inf too
    np.testing.assert_array_equal(np.asarray(g), xt.grad.numpy())
    out = yt.detach().numpy()  # the cases are exercised: NaN outputs, and an all -inf window beside the padding
    assert np.isnan(out).any() and (np.isneginf(out).any() or "dilation" in kwargs)


def test_adaptive_bins_are_torchs_closed_form():
    # an oracle apart from torch: output i is the mean of x[floor(i*L/o) : ceil((i+1)*L/o)]
    x = np.arange(7.0) ** 2
    want = [x[(i * 7) // 4: -(-((i + 1) * 7) // 4)].mean() for i in range(4)]
    assert [(i * 7) // 4 for i in range(4)] == [0, 1, 3, 5]  # bins [0,2) [1,4) [3,6) [5,7) overlap
    np.testing.assert_allclose(nn.AdaptiveAvgPool1d(4).apply({}, jnp.asarray(x[None], jnp.float32))[0], want,
                               rtol=1e-6)


def _apply(layer, shape):
    # shapes only: the checks run at trace time, nothing is compiled
    return jax.eval_shape(layer.apply, {}, jax.ShapeDtypeStruct(shape, jnp.float32))


def test_bad_inputs_and_arguments_are_named():
    with pytest.raises(ValueError, match=r"MaxPool2d\(kernel_size=2.*\): expected a non-empty 3D \(unbatched\) input "
                                         r"\(C, H, W\) or 4D \(batched\) input \(N, C, H, W\), got shape \(6, 6\)"):
        _apply(nn.MaxPool2d(2), (6, 6))
    with pytest.raises(ValueError, match=r"\(N, C, L\), got shape \(1, 2, 3, 4\)"):
        _apply(nn.AvgPool1d(2), (1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"got shape \(6, 6\)"):
        _apply(nn.AdaptiveAvgPool2d(2), (6, 6))
    with pytest.raises(ValueError, match=r"input of spatial size \(2, 2\) gives output size \(0, 0\), too small"):
        _apply(nn.MaxPool2d(3), (1, 1, 2, 2))
    with pytest.raises(ValueError, match=r"spatial size \(2, 5\) gives output size \(0, 1\)"):
        _apply(nn.AvgPool2d(3), (1, 2, 5))
    assert _apply(nn.MaxPool2d(3), (1, 3, 3)).shape == (1, 1, 1)  # the boundary case is allowed
    with pytest.raises(ValueError, match=r"padding=2 is more than half the \(dilated\) kernel size 2"):
        nn.MaxPool2d(2, padding=2)
    nn.MaxPool2d(2, padding=1, dilation=2)  # half of the dilated size 3 is allowed, as torch
    with pytest.raises(ValueError, match=r"padding=2 is more than half the \(dilated\) kernel size 3"):
        nn.AvgPool2d(3, padding=2)
    with pytest.raises(ValueError, match="divisor_override must be None or a non-zero int, got 0"):
        nn.AvgPool2d(2, divisor_override=0)
    with pytest.raises(ValueError, match=r"kernel_size must be an int >= 1 or a tuple of 2 such ints, got \(2, 2, 2\)"):
        nn.MaxPool2d((2, 2, 2))
    with pytest.raises(ValueError, match="stride must be an int >= 1"):
        nn.AvgPool2d(2, stride=0)
    with pytest.raises(ValueError, match=r"output_size must be a positive int, None .* got \(2, 0\)"):
        nn.AdaptiveAvgPool2d((2, 0))
