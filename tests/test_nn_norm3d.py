"""InstanceNorm1d/2d/3d, BatchNorm3d and LocalResponseNorm against torch, through
tests/torch_oracle.check_layer: forward, input and parameter gradients and the updated state
(running statistics) in train and eval mode, float32 and float64; torch's repr; the errors.
Rows without state and without a train/eval difference run in train mode only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from funcnet.nn import functional as F
from tests.torch_oracle import check_layer

T = torch.nn


def case(name, ours, theirs, shape, modes=(True, False)):
    return [pytest.param(ours, theirs, shape, train, id=f"{name}-{'train' if train else 'eval'}") for train in modes]


TABLE = [
    *case("in1d", lambda dt: nn.InstanceNorm1d(3, dtype=dt), lambda: T.InstanceNorm1d(3), (2, 3, 5), (True,)),
    *case("in2d-affine", lambda dt: nn.InstanceNorm2d(3, affine=True, dtype=dt),
          lambda: T.InstanceNorm2d(3, affine=True), (2, 3, 4, 3), (True,)),
    *case("in2d-affine-no-bias-unbatched", lambda dt: nn.InstanceNorm2d(2, affine=True, bias=False, dtype=dt),
          lambda: T.InstanceNorm2d(2, affine=True, bias=False), (2, 4, 3), (True,)),
    *case("in3d-running", lambda dt: nn.InstanceNorm3d(2, momentum=0.3, track_running_stats=True, dtype=dt),
          lambda: T.InstanceNorm3d(2, momentum=0.3, track_running_stats=True), (3, 2, 2, 3, 2)),
    *case("in1d-running-affine-unbatched", lambda dt: nn.InstanceNorm1d(3, affine=True, track_running_stats=True,
                                                                          dtype=dt),
          lambda: T.InstanceNorm1d(3, affine=True, track_running_stats=True), (3, 6)),
    # torch passes momentum 0 for None: the running statistics stay put
    *case("in2d-running-momentum-none", lambda dt: nn.InstanceNorm2d(2, momentum=None, track_running_stats=True,
                                                                       dtype=dt),
          lambda: T.InstanceNorm2d(2, momentum=None, track_running_stats=True), (2, 2, 3, 3), (True,)),
    *case("bn3d", lambda dt: nn.BatchNorm3d(2, dtype=dt), lambda: T.BatchNorm3d(2), (3, 2, 2, 3, 2)),
    *case("bn3d-cumulative-no-affine", lambda dt: nn.BatchNorm3d(2, momentum=None, affine=False, dtype=dt),
          lambda: T.BatchNorm3d(2, momentum=None, affine=False), (2, 2, 2, 2, 3)),
    *case("lrn-3d-input", lambda dt: nn.LocalResponseNorm(3), lambda: T.LocalResponseNorm(3), (2, 5, 4), (True,)),
    *case("lrn-4d-even-size", lambda dt: nn.LocalResponseNorm(4, alpha=0.1, beta=0.6, k=2.0),
          lambda: T.LocalResponseNorm(4, alpha=0.1, beta=0.6, k=2.0), (2, 6, 3, 2), (True,)),
    *case("lrn-5d", lambda dt: nn.LocalResponseNorm(2, alpha=0.5), lambda: T.LocalResponseNorm(2, alpha=0.5),
          (1, 4, 2, 2, 3), (True,)),
]


def _randomize(theirs, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in theirs.state_dict().items():
            if name.endswith(("weight", "bias", "running_mean")):
                t.copy_(torch.randn(t.shape, generator=g))
            elif name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith("num_batches_tracked"):
                t.fill_(3)
    return theirs


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ours,theirs,shape,train", TABLE)
def test_layer_equals_torch(ours, theirs, shape, train, dtype):
    with jax.enable_x64(dtype == "float64"):
        ours = ours(jnp.float64 if dtype == "float64" else jnp.float32)
        theirs = _randomize(theirs(), 0)
        assert ours.name == repr(theirs)
        x = np.random.default_rng(0).standard_normal(shape) * 2.0 + 0.5
        check_layer(ours, theirs, [x], train=train, dtype=dtype)


def test_instance_norm_running_statistics_are_the_batch_mean_of_the_instances():
    # an oracle apart from torch: mean over the batch of each instance's mean and unbiased variance
    x = np.random.default_rng(1).standard_normal((4, 2, 5))
    with jax.enable_x64(True):
        y, rm, rv = F.instance_norm(jnp.asarray(x), jnp.zeros(2), jnp.ones(2), momentum=0.5)
    np.testing.assert_allclose(rm, 0.5 * x.mean(axis=2).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(rv, 0.5 + 0.5 * x.var(axis=2, ddof=1).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(y, (x - x.mean(2, keepdims=True)) / np.sqrt(x.var(2, keepdims=True) + 1e-5),
                               rtol=1e-10)


def test_errors_are_named():
    with pytest.raises(ValueError, match=r"InstanceNorm2d\(3, .*\): expected 3D \(unbatched\) input \(C, H, W\) or "
                                         r"4D \(batched\) input \(N, C, H, W\), got shape \(2, 3\)"):
        nn.InstanceNorm2d(3).apply({}, jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"expected input's size at dim=1 to match num_features \(3\)"):
        layer = nn.InstanceNorm1d(3, affine=True)
        layer.apply(layer.init(jax.random.key(0)), jnp.zeros((2, 4, 5)))
    with pytest.warns(UserWarning, match="num_features is not used"):
        nn.InstanceNorm1d(3).apply({}, jnp.zeros((2, 4, 5)))
    with pytest.raises(ValueError, match="keeps state"):
        nn.InstanceNorm1d(3, track_running_stats=True).apply({}, jnp.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="expected more than 1 spatial element when training"):
        nn.InstanceNorm1d(3).apply({}, jnp.zeros((2, 3, 1)), train=True)
    with pytest.raises(ValueError, match="momentum must be a float in"):
        nn.InstanceNorm1d(3, momentum=2.0)
    with pytest.raises(ValueError, match=r"BatchNorm3d\(2, .*\): expected 5D input \(N, C, D, H, W\)"):
        bn = nn.BatchNorm3d(2)
        bn.apply(bn.init(jax.random.key(0)), jnp.zeros((2, 2, 3, 3)), state=bn.init_state())
    with pytest.raises(ValueError, match=r"expected 3D or higher dimensionality input \(N, C, \*\), got shape \(2, 3\)"):
        nn.LocalResponseNorm(2).apply({}, jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="size must be a positive int, got 0"):
        nn.LocalResponseNorm(0)
