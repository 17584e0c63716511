"""3-D pools, adaptive max pools, max pools with indices and max unpooling against torch:
one table through tests/torch_oracle.check_layer (forward, indices, input gradient, one
compile); ties and NaN against torch; torch's repr; the errors. No params, no state, no
train/eval difference: each row runs in train mode in float32 and eval mode in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from funcnet.nn import functional as F
from tests.torch_oracle import check_layer

MODES = [(True, "float32"), (False, "float64")]

# (id, class name, args, kwargs, input shape)
TABLE = [
    ("max3d-2", "MaxPool3d", (2,), {}, (2, 2, 4, 5, 4)),
    ("max3d-rect-dilation-ceil-unbatched", "MaxPool3d", ((1, 2, 3),),
     dict(stride=(1, 2, 1), padding=(0, 1, 1), dilation=(1, 1, 2), ceil_mode=True), (2, 3, 5, 6)),
    ("max3d-indices", "MaxPool3d", (2,), dict(stride=1, return_indices=True), (1, 2, 3, 4, 3)),
    ("max2d-indices-overlapping-padded", "MaxPool2d", (3, 2, 1), dict(return_indices=True), (2, 2, 7, 6)),
    ("max2d-indices-dilated-ceil-unbatched", "MaxPool2d", (2,),
     dict(stride=1, dilation=2, ceil_mode=True, return_indices=True), (2, 5, 6)),
    ("max1d-indices-ceil", "MaxPool1d", (3, 2, 1), dict(ceil_mode=True, return_indices=True), (2, 3, 8)),
    ("avg3d-2", "AvgPool3d", (2,), {}, (2, 2, 4, 5, 4)),
    ("avg3d-ceil-exclude-pad", "AvgPool3d", (3, 2, 1), dict(ceil_mode=True, count_include_pad=False), (1, 2, 4, 6, 5)),
    ("avg3d-divisor-unbatched", "AvgPool3d", ((1, 2, 2),), dict(divisor_override=3), (2, 3, 4, 4)),
    ("adaptive-avg3d", "AdaptiveAvgPool3d", ((2, 3, None),), {}, (2, 2, 5, 7, 3)),
    ("adaptive-avg3d-global", "AdaptiveAvgPool3d", (1,), {}, (2, 3, 3, 4, 2)),
    ("adaptive-max1d-uneven", "AdaptiveMaxPool1d", (4,), {}, (2, 3, 7)),
    ("adaptive-max2d-uneven", "AdaptiveMaxPool2d", ((4, 3),), {}, (2, 2, 7, 5)),
    ("adaptive-max2d-none-indices-unbatched", "AdaptiveMaxPool2d", ((None, 3),), dict(return_indices=True), (2, 4, 7)),
    ("adaptive-max2d-upsample-indices", "AdaptiveMaxPool2d", (5,), dict(return_indices=True), (1, 2, 3, 4)),
    ("adaptive-max3d-indices", "AdaptiveMaxPool3d", ((2, 1, 3),), dict(return_indices=True), (1, 2, 3, 4, 5)),
]
IDS = [row[0] for row in TABLE]


def _pair(row):
    _, cls, args, kwargs, _ = row
    return getattr(nn, cls)(*args, **kwargs), getattr(torch.nn, cls)(*args, **kwargs)


@pytest.mark.parametrize("train,dtype", MODES)
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


class _Unpool(torch.nn.Module):
    """torch's MaxUnpool with a fixed output_size (check_layer passes inputs positionally)."""

    def __init__(self, unpool, output_size):
        super().__init__()
        self.unpool, self.output_size = unpool, output_size

    def forward(self, x, indices):
        return self.unpool(x, indices, output_size=self.output_size)


# (id, n, pool args, unpool args, input shape, output_size)
UNPOOL = [
    ("unpool2d", 2, (2,), (2,), (2, 2, 6, 4), None),
    ("unpool2d-padded-output-size", 2, (3, 2, 1), (3, 2, 1), (2, 2, 7, 6), (7, 6)),
    ("unpool1d-output-size-full", 1, (2, 2), (2, 2), (2, 3, 9), (2, 3, 9)),
    ("unpool3d-unbatched", 3, (2,), (2,), (2, 4, 2, 4), None),
]


@pytest.mark.parametrize("train,dtype", MODES)
@pytest.mark.parametrize("row", UNPOOL, ids=[r[0] for r in UNPOOL])
def test_max_unpool_equals_torch(row, train, dtype):
    _, n, pool_args, unpool_args, shape, output_size = row
    x = torch.tensor(np.random.default_rng(0).standard_normal(shape))
    y, indices = getattr(torch.nn, f"MaxPool{n}d")(*pool_args, return_indices=True)(x)
    theirs = _Unpool(getattr(torch.nn, f"MaxUnpool{n}d")(*unpool_args), output_size)
    ours = getattr(nn, f"MaxUnpool{n}d")(*unpool_args)
    assert ours.name == repr(theirs.unpool)
    with jax.enable_x64(dtype == "float64"):
        check_layer(ours, theirs, [y.numpy(), indices.numpy()], train=train, dtype=dtype,
                    kwargs={"output_size": output_size} if output_size else {}, torch_kwargs={})


def test_pool_then_unpool_round_trip_equals_torch():
    # MaxPool2d(return_indices=True) -> MaxUnpool2d: the maxima back in place, zeros elsewhere
    x = np.random.default_rng(3).standard_normal((2, 3, 6, 5)).astype(np.float32)
    y, idx = jax.jit(lambda v: nn.MaxPool2d(2, return_indices=True).apply({}, v))(jnp.asarray(x))
    back = jax.jit(lambda a, i: nn.MaxUnpool2d(2).apply({}, a, i, output_size=x.shape[-2:]))(y, idx)
    ty, tidx = torch.nn.MaxPool2d(2, return_indices=True)(torch.tensor(x))
    want = torch.nn.MaxUnpool2d(2)(ty, tidx, output_size=x.shape[-2:]).numpy()
    np.testing.assert_array_equal(np.asarray(back), want)
    np.testing.assert_array_equal(np.asarray(idx), tidx.numpy())


@pytest.mark.parametrize("cls,args", [("AdaptiveMaxPool2d", ((3, 2),)), ("MaxPool2d", (3, 2, 1)),
                                      ("AdaptiveMaxPool1d", (3,))], ids=["adaptive2d", "max2d", "adaptive1d"])
def test_ties_nan_and_minus_inf_equal_torch(cls, args):
    # torch's loops: the first maximum wins a tie, the last NaN wins its window; the
    # indices and the gradient follow the winner
    rng = np.random.default_rng(1)
    shape = (2, 2, 7, 6) if "2d" in cls else (2, 2, 8)
    x = np.round(rng.standard_normal(shape))
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, 8, replace=False)] = -np.inf
    flat[rng.choice(flat.size, 5, replace=False)] = np.nan
    ours, theirs = getattr(nn, cls)(*args, return_indices=True), getattr(torch.nn, cls)(*args, return_indices=True)
    xt = torch.tensor(x, requires_grad=True)
    yt, it = theirs(xt)
    cot = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(cot))
    with jax.enable_x64(True):
        (y, i), g = jax.jit(lambda v: (ours.apply({}, v), jax.grad(lambda u: jnp.sum(ours.apply({}, u)[0] * cot))(v)))(
            jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(y), yt.detach().numpy())
    np.testing.assert_array_equal(np.asarray(i), it.numpy())
    np.testing.assert_array_equal(np.asarray(g), xt.grad.numpy())
    assert np.isnan(yt.detach().numpy()).any()


def test_functional_forms_equal_torch():
    x = np.random.default_rng(2).standard_normal((2, 2, 4, 5, 6)).astype(np.float32)
    T = torch.nn.functional
    xt = torch.tensor(x)
    pairs = [
        (lambda v: F.max_pool3d(v, 2, 1, 1), T.max_pool3d(xt, 2, 1, 1)),
        (lambda v: F.max_pool3d(v, 2, return_indices=True)[1], T.max_pool3d(xt, 2, return_indices=True)[1]),
        (lambda v: F.avg_pool3d(v, 3, 2, 1, count_include_pad=False),
         T.avg_pool3d(xt, 3, 2, 1, count_include_pad=False)),
        (lambda v: F.adaptive_avg_pool3d(v, (3, 2, 4)), T.adaptive_avg_pool3d(xt, (3, 2, 4))),
        (lambda v: F.adaptive_max_pool3d(v, (3, 2, 4), return_indices=True)[1],
         T.adaptive_max_pool3d(xt, (3, 2, 4), return_indices=True)[1]),
        (lambda v: F.max_pool2d_with_indices(v[0], 2)[1], T.max_pool2d(xt[0], 2, return_indices=True)[1]),
        (lambda v: F.max_pool1d_with_indices(v[0, 0, 0], 3, 2, 1)[1],
         T.max_pool1d(xt[0, 0, 0], 3, 2, 1, return_indices=True)[1]),
    ]
    for ours, theirs in pairs:  # jit: one compile per form instead of one per primitive
        np.testing.assert_allclose(np.asarray(jax.jit(ours)(x)), theirs.numpy(), rtol=1e-6, atol=1e-6)


def test_errors_are_named():
    with pytest.raises(ValueError, match=r"MaxPool3d\(kernel_size=2.*\): expected a non-empty 4D \(unbatched\) input "
                                         r"\(C, D, H, W\) or 5D \(batched\) input \(N, C, D, H, W\), got shape"):
        nn.MaxPool3d(2).apply({}, jnp.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match=r"padding=2 is more than half"):
        nn.MaxPool3d(2, padding=2)
    with pytest.raises(ValueError, match="divisor_override must be None or a non-zero int, got 0"):
        nn.AvgPool3d(2, divisor_override=0)
    with pytest.raises(ValueError, match=r"output_size must be a positive int, None .* got \(2, 0\)"):
        nn.AdaptiveMaxPool2d((2, 0))
    with pytest.raises(ValueError, match=r"invalid output_size \(10,\) \(dim 0 must be between 6 and 10, exclusive\)"):
        nn.MaxUnpool1d(2).apply({}, jnp.zeros((1, 1, 4)), jnp.zeros((1, 1, 4), jnp.int32), output_size=(10,))
    with pytest.raises(ValueError, match="indices must be an integer array of the input's shape"):
        nn.MaxUnpool1d(2).apply({}, jnp.zeros((1, 1, 4)), jnp.zeros((1, 1, 3), jnp.int32))
    with pytest.raises(ValueError, match="found an invalid max index 8"):
        nn.MaxUnpool1d(2).apply({}, jnp.zeros((1, 1, 4)), jnp.full((1, 1, 4), 8, jnp.int32))
