"""Initializers against torch.nn.init: same distributions (two-sample KS tests on many draws)."""

import functools
import math

import jax
import numpy as np
import pytest
import torch
from scipy import stats

from funcnet import init, nn

# With ~32k draws per side a KS test has power to see a 2% change of scale; p < 1e-3 would
# fail on a wrong formula but lets a correct one pass 999 times in 1000 (seeds are fixed,
# so the outcome is deterministic).
P_MIN = 1e-3


def _ks(a, b):
    return stats.ks_2samp(np.ravel(a), np.ravel(b)).pvalue


def test_linear_default_init_matches_torch():
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 128)
    params = nn.Linear(256, 128).init(jax.random.key(1))
    assert params["weight"].shape == tuple(layer.weight.shape) == (128, 256)
    assert params["bias"].shape == tuple(layer.bias.shape) == (128,)
    w_torch = layer.weight.detach().numpy()
    w_ours = np.asarray(params["weight"])
    bound = 1 / math.sqrt(256)
    assert np.abs(w_ours).max() <= bound
    assert _ks(w_ours, w_torch) > P_MIN
    # bias: only 128 per layer, so pool several layers' biases for power
    torch_biases = np.concatenate([torch.nn.Linear(256, 128).bias.detach().numpy() for _ in range(40)])
    keys = jax.random.split(jax.random.key(2), 40)
    our_biases = np.concatenate([np.asarray(nn.Linear(256, 128).init(k)["bias"]) for k in keys])
    assert np.abs(our_biases).max() <= bound
    assert _ks(our_biases, torch_biases) > P_MIN
    # and a wrong scale is caught by the same test (the check can fail)
    assert _ks(w_ours * 1.1, w_torch) < P_MIN


TORCH_AND_OURS = [
    ("xavier_uniform", lambda t: torch.nn.init.xavier_uniform_(t, gain=2.0), functools.partial(init.xavier_uniform, gain=2.0)),
    ("xavier_normal", lambda t: torch.nn.init.xavier_normal_(t), init.xavier_normal),
    ("kaiming_uniform", lambda t: torch.nn.init.kaiming_uniform_(t, nonlinearity="relu"),
     functools.partial(init.kaiming_uniform, nonlinearity="relu")),
    ("kaiming_normal_fan_out", lambda t: torch.nn.init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu"),
     functools.partial(init.kaiming_normal, mode="fan_out", nonlinearity="relu")),
    ("kaiming_uniform_a_sqrt5", lambda t: torch.nn.init.kaiming_uniform_(t, a=math.sqrt(5)), init.linear_weight),
]


@pytest.mark.parametrize("name,torch_init,ours", TORCH_AND_OURS, ids=[t[0] for t in TORCH_AND_OURS])
def test_initializers_match_torch(name, torch_init, ours):
    torch.manual_seed(0)
    shape = (192, 160)
    t = torch.empty(shape)
    torch_init(t)
    a = np.asarray(ours(jax.random.key(3), shape))
    assert a.shape == shape and a.dtype == np.float32
    assert _ks(a, t.numpy()) > P_MIN


def test_fans_follow_torch_layout():
    t = torch.empty(8, 3, 5, 5)
    assert init.fans(t.shape) == torch.nn.init._calculate_fan_in_and_fan_out(t)


@pytest.mark.parametrize("nonlinearity,param", [("relu", None), ("tanh", None), ("leaky_relu", 0.2), ("linear", None)])
def test_calculate_gain_matches_torch(nonlinearity, param):
    assert init.calculate_gain(nonlinearity, param) == pytest.approx(torch.nn.init.calculate_gain(nonlinearity, param))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown nonlinearity 'swish'"):
        init.calculate_gain("swish")
    with pytest.raises(ValueError, match=r"at least 2 dimensions.*\(5,\)"):
        init.xavier_uniform(jax.random.key(0), (5,))
    with pytest.raises(ValueError, match="'fan_sideways'"):
        init.kaiming_normal(jax.random.key(0), (3, 4), mode="fan_sideways")
