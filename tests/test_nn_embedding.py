"""Embedding against torch.nn.Embedding, through tests/torch_oracle.check_layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from torch_oracle import check_layer

IDX = np.array([[0, 3, 9, 3], [2, 2, 5, 0]])  # repeated indices: their gradients add up

CASES = [
    ("plain", dict()),
    ("padding_idx=3", dict(padding_idx=3)),
    ("padding_idx=-1", dict(padding_idx=-1)),  # -> 9, as torch
    ("padding_idx=0", dict(padding_idx=0)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_embedding_equals_torch(case, train, dtype):
    _, kw = case
    torch.manual_seed(0)
    theirs = torch.nn.Embedding(10, 4, **kw)
    with torch.no_grad():  # a non-zero padding row: its value passes through, its gradient does not
        theirs.weight.add_(1.0)
    ours = nn.Embedding(10, 4, **kw, dtype=dtype)
    assert ours.name == repr(theirs)
    with jax.enable_x64(dtype == "float64"):
        check_layer(ours, theirs, [IDX], train=train, dtype=dtype)


def test_padding_row_gradient_is_zero_and_init_row_is_zero():
    model = nn.Embedding(6, 3, padding_idx=-2)
    assert model.name == "Embedding(6, 3, padding_idx=4)"
    params = model.init(jax.random.key(0))
    np.testing.assert_array_equal(params["weight"][4], 0.0)
    params = {"weight": params["weight"].at[4].set(7.0)}
    idx = jnp.array([4, 1, 4])
    g = jax.grad(lambda p: model.apply(p, idx).sum())(params)["weight"]
    np.testing.assert_array_equal(g[4], 0.0)  # padding row: no gradient
    np.testing.assert_array_equal(g[1], 1.0)  # closed form: d sum / d row = number of uses
    np.testing.assert_array_equal(model.apply(params, idx)[0], 7.0)


def test_init_is_standard_normal():
    w = np.asarray(nn.Embedding(400, 50).init(jax.random.key(1))["weight"])
    assert w.shape == (400, 50) and w.dtype == np.float32
    # 20000 N(0, 1) draws: mean within 5 standard errors (5/sqrt(20000) = 0.035), std within 3%
    assert abs(w.mean()) < 0.035 and abs(w.std() - 1.0) < 0.03


def test_out_of_range_raises_eagerly_and_gives_nan_under_jit():
    model = nn.Embedding(5, 2)
    params = model.init(jax.random.key(0))
    for bad in ([1, 5], [-1, 2]):  # torch raises IndexError for both (no wrap-around of -1)
        with pytest.raises(ValueError, match=r"indices \[-?\d\] are out of range, expected indices in \[0, 4\]"):
            model.apply(params, jnp.array(bad))
        with pytest.raises(IndexError):
            torch.nn.Embedding(5, 2)(torch.tensor(bad))
    out = jax.jit(model.apply)(params, jnp.array([[1, 5], [-1, 2]]))
    assert np.isnan(out[0, 1]).all() and np.isnan(out[1, 0]).all()
    np.testing.assert_array_equal(out[0, 0], params["weight"][1])
    np.testing.assert_array_equal(out[1, 1], params["weight"][2])


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_norm=1.0 is not supported: torch renormalizes"):
        nn.Embedding(5, 2, max_norm=1.0)
    with pytest.raises(ValueError, match=r"padding_idx=5 must be within \[-5, 4\]"):
        nn.Embedding(5, 2, padding_idx=5)
    with pytest.raises(ValueError, match="embedding_dim must be a positive int, got 0"):
        nn.Embedding(5, 0)
    with pytest.raises(ValueError, match="sparse=True is not supported"):
        nn.Embedding(5, 2, sparse=True)
    with pytest.raises(ValueError, match="scale_grad_by_freq=True is not supported"):
        nn.Embedding(5, 2, scale_grad_by_freq=True)
    with pytest.raises(TypeError, match="dtype must be a floating type"):
        nn.Embedding(5, 2, dtype=jnp.int32)
    model = nn.Embedding(5, 2)
    with pytest.raises(TypeError, match="indices must be integers, got \\w*Array\\w* of shape \\(2,\\) and dtype float32"):
        model.apply(model.init(jax.random.key(0)), jnp.array([1.0, 2.0]))
    assert nn.Embedding(5, 2, norm_type=1.0).name == repr(torch.nn.Embedding(5, 2, norm_type=1.0))
