"""check_layer's bound (tests/torch_oracle.py) is tight enough to catch a real bug: a weight
off by 1e-4 relative or a normalization's epsilon off by 10x fails it, on a linear layer, a
3-d convolution whose weight gradient sums 2 x 6^3 positions and a LayerNorm, while the same
layers without the bug pass."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch_oracle import check_layer

from funcnet import nn


class _ScaledLinear(torch.nn.Linear):
    """torch's Linear with its weight scaled by ``1 + off`` in the forward: a wrong weight."""

    def __init__(self, *args, off=0.0):
        super().__init__(*args)
        self.off = off

    def forward(self, x):
        return TF.linear(x, self.weight * (1 + self.off), self.bias)


class _ScaledConv3d(torch.nn.Conv3d):
    def __init__(self, *args, off=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.off = off

    def forward(self, x):
        return self._conv_forward(x, self.weight * (1 + self.off), self.bias)


def _x(*shape):
    return np.random.default_rng(0).standard_normal(shape)


@pytest.mark.parametrize("off", [0.0, 1e-4])
def test_a_wrong_linear_weight_fails(off):
    torch.manual_seed(0)
    run = lambda: check_layer(nn.Linear(16, 8), _ScaledLinear(16, 8, off=off), [_x(32, 16)])
    if off:
        with pytest.raises(AssertionError, match="funcnet .* from the float64 reference"):
            run()
    else:
        run()


@pytest.mark.parametrize("off", [0.0, 1e-4])
def test_a_wrong_conv3d_weight_fails_despite_the_long_weight_gradient_sum(off):
    torch.manual_seed(0)
    run = lambda: check_layer(nn.Conv3d(3, 4, 3, padding=1), _ScaledConv3d(3, 4, 3, padding=1, off=off),
                              [_x(2, 3, 6, 6, 6)])
    if off:
        with pytest.raises(AssertionError, match="funcnet .* from the float64 reference"):
            run()
    else:
        run()


@pytest.mark.parametrize("eps", [1e-5, 1e-4])
def test_a_wrong_layer_norm_epsilon_fails(eps):
    torch.manual_seed(0)
    run = lambda: check_layer(nn.LayerNorm(16, eps=eps), torch.nn.LayerNorm(16, eps=1e-5), [_x(8, 16)])
    if eps != 1e-5:
        with pytest.raises(AssertionError, match="funcnet .* from the float64 reference"):
            run()
    else:
        run()
