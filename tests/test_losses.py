"""Losses against torch.nn.functional."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from funcnet import losses


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_equals_torch(reduction):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (64, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 64)
    ours = losses.cross_entropy(jnp.asarray(logits), jnp.asarray(labels, jnp.int32), reduction=reduction)
    theirs = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels), reduction=reduction)
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_equals_torch(reduction):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 16, 3)).astype(np.float32)
    ours = losses.mse_loss(jnp.asarray(a), jnp.asarray(b), reduction=reduction)
    theirs = F.mse_loss(torch.from_numpy(a), torch.from_numpy(b), reduction=reduction)
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=1.3e-6, atol=1e-6)


def test_accuracy_closed_form():
    logits = jnp.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, 1.0]])
    assert float(losses.accuracy(logits, jnp.array([0, 1, 1, 1]))) == 0.75


def test_label_errors_name_shape_and_dtype():
    logits = jnp.zeros((8, 10))
    with pytest.raises(ValueError, match=r"labels of shape \(8, 1\).*expected integer class indices of shape \(8,\)"):
        losses.cross_entropy(logits, jnp.zeros((8, 1), jnp.int32))
    with pytest.raises(ValueError, match="one-hot"):
        losses.cross_entropy(logits, jnp.zeros((8, 10), jnp.int32))
    with pytest.raises(TypeError, match="labels have dtype float32, expected integer"):
        losses.cross_entropy(logits, jnp.zeros((8,), jnp.float32))
    with pytest.raises(ValueError, match="reduction must be one of"):
        losses.cross_entropy(logits, jnp.zeros((8,), jnp.int32), reduction="avg")
    with pytest.raises(ValueError, match=r"pred of shape \(3,\) and target of shape \(4,\)"):
        losses.mse_loss(jnp.zeros(3), jnp.zeros(4))
