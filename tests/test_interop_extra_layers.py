"""interop.convert on the resampling, padding, 3-D pooling and instance-norm layers: a torch
Sequential of them becomes a funcnet model with the same forward and the same state after a
train-mode step (InstanceNorm's running statistics), from torch's weights and buffers."""

import jax
import jax.numpy as jnp
import numpy as np
import torch

from funcnet import interop, nn

T = torch.nn


def test_convert_runs_like_torch():
    torch.manual_seed(0)
    m = T.Sequential(
        T.Conv3d(2, 4, 3, padding=1), T.BatchNorm3d(4), T.InstanceNorm3d(4, affine=True, track_running_stats=True),
        T.MaxPool3d(2, ceil_mode=True), T.AvgPool3d(1), T.AdaptiveMaxPool3d((2, 3, 2)), T.AdaptiveAvgPool3d(2),
        T.Flatten(1, 2), T.Upsample(scale_factor=1.5, mode="bilinear"), T.ReflectionPad2d((1, 0, 2, 1)),
        T.ReplicationPad2d(1), T.ZeroPad2d(1), T.ConstantPad2d((1, 1, 0, 0), 0.5), T.CircularPad2d(1),
        T.PixelUnshuffle(2), T.LocalResponseNorm(3), T.PixelShuffle(2), T.UpsamplingNearest2d(scale_factor=0.7),
        T.InstanceNorm2d(8), T.UpsamplingBilinear2d(size=(5, 4)),
    )
    x = torch.randn(2, 2, 5, 6, 4)
    for train in (True, False):
        m.train(train)
        model, params, state = interop.convert(m)
        run = jax.jit(lambda p, s, v: nn.call(model, p, s, v, train=train))  # one compile, not one per primitive
        y, new_state = run(params, state, jnp.asarray(x.numpy()))
        want = m(x).detach().numpy()
        # float32 through twenty layers, three normalizations among them
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(new_state["2"]["running_mean"]), m[2].running_mean.numpy(),
                                   rtol=1e-5, atol=1e-6)
