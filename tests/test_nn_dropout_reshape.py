"""Dropout2d (mask statistics, eval identity) and Unflatten (against torch.nn.Unflatten)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from torch_oracle import check_layer


def _positive(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).uniform(0.5, 2.0, shape), jnp.float32)


@pytest.mark.parametrize("shape", [(50, 40, 3, 4), (2000, 2, 3)], ids=["NCHW", "CHW"])
def test_dropout2d_drops_whole_channels_at_rate_p(shape):
    p = 0.3
    x = _positive(shape)  # no zeros in x: a zero in y is a dropped element
    y = np.asarray(nn.Dropout2d(p).apply({}, x, key=jax.random.key(1), train=True))
    ratio = y / np.asarray(x)
    channels = ratio.reshape(-1, shape[-2] * shape[-1])  # one row per (n, c) or per c
    dropped = (channels == 0).all(axis=1)
    kept = np.isclose(channels, 1 / (1 - p), rtol=1e-6).all(axis=1)
    assert (dropped | kept).all(), "a channel is partly dropped"
    n = len(channels)  # 2000 channels: dropped count ~ Binomial(2000, 0.3), sd = sqrt(n p (1-p)) ~ 20.5
    assert abs(dropped.sum() - n * p) < 5 * np.sqrt(n * p * (1 - p))


def test_dropout2d_gradient_is_the_mask():
    p, x = 0.5, _positive((4, 6, 2, 2))
    key = jax.random.key(3)
    y, vjp = jax.vjp(lambda x: nn.Dropout2d(p).apply({}, x, key=key, train=True), x)  # one use of key
    (g,) = vjp(jnp.ones_like(y))
    np.testing.assert_allclose(g, y / x, rtol=1e-6)  # d(m x / (1-p))/dx = m / (1-p)
    assert set(np.unique(np.asarray(g)).tolist()) == {0.0, 2.0}


def test_dropout2d_eval_identity_and_edge_probabilities():
    x = _positive((2, 3, 4, 4))
    assert nn.Dropout2d(0.5).apply({}, x, train=False) is x
    assert nn.Dropout2d(0.0).apply({}, x, train=True) is x
    np.testing.assert_array_equal(nn.Dropout2d(1.0).apply({}, x, key=jax.random.key(0), train=True), 0.0)
    check_layer(nn.Dropout2d(0.5), torch.nn.Dropout2d(0.5), [np.asarray(x)], train=False)


def test_dropout2d_errors_and_name():
    assert nn.Dropout2d(0.2).name == repr(torch.nn.Dropout2d(0.2))
    assert nn.Dropout(0.2).name == repr(torch.nn.Dropout(0.2))
    with pytest.raises(ValueError, match=r"Dropout2d: p is the drop probability and must be in \[0, 1\], got 1.5"):
        nn.Dropout2d(1.5)
    with pytest.raises(ValueError, match=r"Dropout2d\(p=0.5\) in train mode needs a PRNG key"):
        nn.Dropout2d().apply({}, jnp.ones((1, 2, 3, 3)), train=True)
    with pytest.raises(ValueError, match=r"input of shape \(4, 5\) has 2 dimensions, expected 4 \(N, C, H, W\) or 3"):
        nn.Dropout2d().apply({}, jnp.ones((4, 5)), train=False)


UNFLATTEN = [
    (1, (2, 5, 5), (3, 50)),
    (-1, [2, -1], (3, 4, 6)),
    (0, (3, 1), (3, 2)),
    (-2, (-1, 2), (2, 8, 3)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("dim, sizes, shape", UNFLATTEN)
def test_unflatten_equals_torch(dim, sizes, shape, train, dtype):
    ours, theirs = nn.Unflatten(dim, sizes), torch.nn.Unflatten(dim, sizes)
    assert ours.name == repr(theirs)
    x = np.random.default_rng(0).standard_normal(shape)
    with jax.enable_x64(dtype == "float64"):
        check_layer(ours, theirs, [x], train=train, dtype=dtype)


def test_unflatten_errors():
    with pytest.raises(TypeError, match="unflattened_size must be a tuple or list of ints, got int 4"):
        nn.Unflatten(1, 4)
    with pytest.raises(TypeError, match=r"got 2.0 at position 0 of \(2.0, 2\)"):
        nn.Unflatten(1, (2.0, 2))
    with pytest.raises(ValueError, match="at most one entry of unflattened_size may be -1"):
        nn.Unflatten(1, (-1, -1))
    with pytest.raises(ValueError, match=r"dimension 1 of input shape \(2, 6\) has size 6, but the sizes \(4, 2\) "
                                         r"multiply to 8; they must multiply to 6"):
        nn.Unflatten(1, (4, 2)).apply({}, jnp.ones((2, 6)))
    with pytest.raises(ValueError, match="has size 6, which is not a multiple of 4"):
        nn.Unflatten(1, (4, -1)).apply({}, jnp.ones((2, 6)))
    with pytest.raises(ValueError, match=r"has no dimension 2, expected dim in \[-2, 1\]"):
        nn.Unflatten(2, (1, 1)).apply({}, jnp.ones((2, 6)))


def test_identity_ignores_arguments_as_torch():
    x = jnp.arange(3.0)
    assert nn.Identity(54, unused_argument1=0.1).apply({}, x) is not None
    np.testing.assert_array_equal(nn.Identity(54, unused_argument1=0.1).apply({}, x), x)
    assert nn.Identity(1, a=2).name == repr(torch.nn.Identity(1, a=2))


def _torchvision_stochastic_depth(x, p, mode, keep):
    """torchvision.ops.stochastic_depth as documented, in torch, with its Bernoulli draw given
    (torchvision is not installed here): noise of shape (N, 1, ...) for "row", (1, ...) for
    "batch", divided by the survival rate."""
    survival_rate = 1.0 - p
    size = [x.shape[0]] + [1] * (x.ndim - 1) if mode == "row" else [1] * x.ndim
    noise = keep.reshape(size).to(x.dtype)
    if survival_rate > 0.0:
        noise = noise.div(survival_rate)
    return x * noise


@pytest.mark.parametrize("p, mode", [(0.3, "row"), (0.5, "batch"), (1.0, "row")])
def test_stochastic_depth_equals_torchvisions_formula(p, mode):
    layer = nn.StochasticDepth(p, mode)
    assert layer.name == f"StochasticDepth(p={p}, mode={mode})"
    x = np.random.default_rng(0).uniform(0.5, 2.0, (16, 3, 2)).astype(np.float32)  # no zeros: the mask reads off
    cot = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    fn = jax.jit(lambda v, k: jax.vjp(lambda u: layer.apply({}, u, key=k, train=True), v))
    for seed in range(3):
        out, vjp = fn(jnp.asarray(x), jax.random.key(seed))
        kept = np.asarray(out) != 0
        axes = tuple(range(1, x.ndim)) if mode == "row" else None
        assert (kept.all(axis=axes) == kept.any(axis=axes)).all(), "one decision per row (or per batch)"
        keep = torch.from_numpy(kept.reshape(x.shape[0], -1)[:, 0] if mode == "row" else kept.reshape(-1)[:1])
        t_x = torch.from_numpy(x).requires_grad_()
        t_out = _torchvision_stochastic_depth(t_x, p, mode, keep)
        (t_out * torch.from_numpy(cot)).sum().backward()
        np.testing.assert_allclose(np.asarray(out), t_out.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(vjp(jnp.asarray(cot))[0]), t_x.grad.numpy(), rtol=1e-6)
    # eval: identity, no key needed
    np.testing.assert_array_equal(np.asarray(layer.apply({}, x)), x)


def test_stochastic_depth_keeps_rows_at_the_survival_rate_and_refuses_bad_arguments():
    layer = nn.StochasticDepth(0.25, "row")
    out = jax.jit(lambda k: layer.apply({}, jnp.ones((4000, 2)), key=k, train=True))(jax.random.key(0))
    rate = float((np.asarray(out)[:, 0] != 0).mean())
    assert abs(rate - 0.75) < 0.03 and np.allclose(np.asarray(out)[np.asarray(out) != 0], 1 / 0.75)
    with pytest.raises(ValueError, match=r"StochasticDepth\(p=0.25, mode=row\) in train mode needs a PRNG key"):
        layer.apply({}, jnp.ones((2, 2)), train=True)
    with pytest.raises(ValueError, match="drop probability has to be between 0 and 1, but got 1.5"):
        nn.StochasticDepth(1.5, "row")
    with pytest.raises(ValueError, match="mode has to be either 'batch' or 'row', but got 'col'"):
        nn.StochasticDepth(0.1, "col")
