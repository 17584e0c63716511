"""Normalization layers against torch, through tests/torch_oracle.check_layer: forward, input
and parameter gradients and the updated state (BatchNorm's buffers) in train and eval mode,
float32 and float64, plus the clear errors of the layer author's contract."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from torch_oracle import check_layer

LAYER_NORM = [
    ("ln_1d", lambda dt: (nn.LayerNorm(5, dtype=dt), torch.nn.LayerNorm(5)), (3, 4, 5)),
    ("ln_2d", lambda dt: (nn.LayerNorm((4, 5), eps=1e-3, dtype=dt), torch.nn.LayerNorm((4, 5), eps=1e-3)), (3, 4, 5)),
    ("ln_no_bias", lambda dt: (nn.LayerNorm(5, bias=False, dtype=dt), torch.nn.LayerNorm(5, bias=False)), (2, 5)),
    ("ln_no_affine", lambda dt: (nn.LayerNorm(5, elementwise_affine=False, dtype=dt),
                                 torch.nn.LayerNorm(5, elementwise_affine=False)), (2, 3, 5)),
]


def _randomize(theirs, seed):
    # non-trivial affine parameters and running statistics, so a swapped or ignored one shows
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in theirs.state_dict().items():
            if name.endswith(("weight", "bias")):
                t.copy_(torch.randn(t.shape, generator=g))
            elif name.endswith("running_mean"):
                t.copy_(torch.randn(t.shape, generator=g))
            elif name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith("num_batches_tracked"):
                t.fill_(3)
    return theirs


def _run(build, shape, train, dtype, seed=0):
    jdt = jnp.float64 if dtype == "float64" else jnp.float32
    torch.manual_seed(seed)
    ours, theirs = build(jdt)
    _randomize(theirs, seed)
    x = np.random.default_rng(seed).standard_normal(shape) * 2.0 + 0.5
    check_layer(ours, theirs, [x], train=train, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("case", LAYER_NORM, ids=[c[0] for c in LAYER_NORM])
def test_layer_norm_equals_torch(case, train, dtype):
    _, build, shape = case
    if dtype == "float64":
        with jax.enable_x64(True):
            _run(build, shape, train, dtype)
    else:
        _run(build, shape, train, dtype)
