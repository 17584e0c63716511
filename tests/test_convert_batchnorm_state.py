"""interop.convert keeps BatchNorm's running statistics as torch does, measured on the right scale.

torchvision's ShuffleNetV2 unit (its InvertedResidual, stride 2 then 1, written out here as in
torchvision) after one train step on a fresh input: the converted model's running means and
variances against torch's. A running mean is compared against the spread of the data it
averages (the square root of the running variance), not against itself: the last BatchNorm of
each branch follows a bias-free 1x1 conv of the previous BatchNorm's output, whose batch mean is
its bias, zero at initialisation. Its running mean is zero in exact arithmetic, and both
frameworks hold float32 rounding noise (1e-9) whose ratio to itself is O(1).
"""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn

import funcnet  # noqa: E402 (after the importorskip above)
from funcnet import interop, nn  # noqa: E402


def _shuffle(x, groups: int):
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    return torch.transpose(x, 1, 2).contiguous().view(b, -1, h, w)


class InvertedResidual(tnn.Module):
    """torchvision.models.shufflenetv2.InvertedResidual."""

    def __init__(self, inp: int, oup: int, stride: int):
        super().__init__()
        self.stride = stride
        half = oup // 2
        if stride > 1:
            self.branch1 = tnn.Sequential(
                tnn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False), tnn.BatchNorm2d(inp),
                tnn.Conv2d(inp, half, 1, bias=False), tnn.BatchNorm2d(half), tnn.ReLU(inplace=True))
        else:
            self.branch1 = tnn.Sequential()
        self.branch2 = tnn.Sequential(
            tnn.Conv2d(inp if stride > 1 else half, half, 1, bias=False), tnn.BatchNorm2d(half), tnn.ReLU(inplace=True),
            tnn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), tnn.BatchNorm2d(half),
            tnn.Conv2d(half, half, 1, bias=False), tnn.BatchNorm2d(half), tnn.ReLU(inplace=True))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return _shuffle(out, 2)


def test_shufflenet_running_statistics_match_torch_against_the_datas_spread():
    torch.manual_seed(0)
    module = tnn.Sequential(InvertedResidual(4, 8, 2), InvertedResidual(8, 8, 1))
    model, params, state = interop.convert(module, torch.randn(2, 4, 8, 8))
    fresh = torch.randn(3, 4, 6, 6, generator=torch.Generator().manual_seed(1))  # other values, batch and size
    module.train()
    with torch.no_grad():
        module(fresh)
    _, new_state = jax.jit(lambda p, s, x: nn.call(model, p, s, x, train=True))(params, state, fresh.numpy())
    ours = funcnet.state_dict(params, new_state)
    theirs = {k: v.double().numpy() for k, v in module.state_dict().items()}
    means = [k for k in theirs if k.endswith("running_mean")]
    assert len(means) == 8
    for k in means:
        var = k.replace("running_mean", "running_var")
        std = np.sqrt(theirs[var]).max()
        # float32 sums over 3*4*4 or 3*3*3 values per channel: a few ulps of the spread
        assert np.abs(np.asarray(ours[k]) - theirs[k]).max() <= 1e-6 * std, k
        assert np.abs(np.asarray(ours[var]) - theirs[var]).max() <= 1e-6 * theirs[var].max(), var
        assert int(ours[k.replace("running_mean", "num_batches_tracked")]) == 1
    # the cause of a naive per-buffer comparison's O(1) "difference": these means are zero but for rounding
    zero = ["0.branch1.3", "0.branch2.6", "1.branch2.6"]
    for prefix in zero:
        spread = np.sqrt(theirs[f"{prefix}.running_var"]).max()
        assert np.abs(theirs[f"{prefix}.running_mean"]).max() <= 1e-6 * spread
    others = [k for k in means if k.rsplit(".", 1)[0] not in zero]
    assert all(np.abs(theirs[k]).max() >= 1e-3 * np.sqrt(theirs[k.replace("mean", "var")]).max() for k in others)


class BasicConv2d(tnn.Module):
    """torchvision's GoogLeNet/Inception block: the ReLU is F.relu(..., inplace=True) on the BatchNorm's output."""

    def __init__(self):
        super().__init__()
        self.conv = tnn.Conv2d(3, 4, 3, bias=False)
        self.bn = tnn.BatchNorm2d(4, eps=0.001)

    def forward(self, x):
        return torch.nn.functional.relu(self.bn(self.conv(x)), inplace=True)


def test_functional_relu_in_place_is_kept():
    torch.manual_seed(0)
    module = BasicConv2d()
    model, params, state = interop.convert(module, torch.randn(2, 3, 6, 6))
    fresh = torch.randn(3, 3, 7, 7, generator=torch.Generator().manual_seed(1))
    for train in (False, True):
        module.train(train)
        with torch.no_grad():
            want = module(fresh).numpy()
        got, _ = nn.call(model, params, state, fresh.numpy(), train=train)
        assert want.min() == 0.0 and (want < 0).sum() == 0  # the ReLU ran in torch
        # float32 on both sides, differing in summation order: an eps per term of the longest sum, the
        # conv's 27 products, or in train mode BatchNorm's statistics over 3 x 5 x 5 = 75 values
        tol = np.finfo(np.float32).eps * (75 if train else 27)
        np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol * np.abs(want).max())
