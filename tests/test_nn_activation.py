"""Activations against torch.nn, through tests/torch_oracle.check_layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from funcnet import nn
from torch_oracle import check_layer

# (id, ours, theirs, input shape)
TABLE = [
    ("ReLU", lambda: nn.ReLU(), lambda: torch.nn.ReLU(), (3, 5)),
    ("Tanh", lambda: nn.Tanh(), lambda: torch.nn.Tanh(), (3, 5)),
    ("Sigmoid", lambda: nn.Sigmoid(), lambda: torch.nn.Sigmoid(), (3, 5)),
    ("Identity", lambda: nn.Identity(7, k=2), lambda: torch.nn.Identity(7, k=2), (3, 5)),
    ("GELU-none", lambda: nn.GELU(), lambda: torch.nn.GELU(), (3, 5)),
    ("GELU-tanh", lambda: nn.GELU(approximate="tanh"), lambda: torch.nn.GELU(approximate="tanh"), (3, 5)),
    ("SiLU", lambda: nn.SiLU(), lambda: torch.nn.SiLU(), (3, 5)),
    ("LeakyReLU", lambda: nn.LeakyReLU(), lambda: torch.nn.LeakyReLU(), (3, 5)),
    ("LeakyReLU-0.2", lambda: nn.LeakyReLU(0.2), lambda: torch.nn.LeakyReLU(0.2), (3, 5)),
    ("LeakyReLU-neg", lambda: nn.LeakyReLU(-1.5), lambda: torch.nn.LeakyReLU(-1.5), (3, 5)),
    ("ELU", lambda: nn.ELU(), lambda: torch.nn.ELU(), (3, 5)),
    ("ELU-0.5", lambda: nn.ELU(alpha=0.5), lambda: torch.nn.ELU(alpha=0.5), (3, 5)),
    ("Softmax-1", lambda: nn.Softmax(dim=1), lambda: torch.nn.Softmax(dim=1), (3, 5)),
    ("Softmax-0", lambda: nn.Softmax(0), lambda: torch.nn.Softmax(0), (3, 5)),
    ("Softmax--1-3d", lambda: nn.Softmax(-1), lambda: torch.nn.Softmax(-1), (2, 3, 4)),
    ("Softmax-1-3d", lambda: nn.Softmax(1), lambda: torch.nn.Softmax(1), (2, 3, 4)),
    ("LogSoftmax-1", lambda: nn.LogSoftmax(dim=1), lambda: torch.nn.LogSoftmax(dim=1), (3, 5)),
    ("LogSoftmax--2-3d", lambda: nn.LogSoftmax(-2), lambda: torch.nn.LogSoftmax(-2), (2, 3, 4)),
    ("LogSoftmax-0-1d", lambda: nn.LogSoftmax(0), lambda: torch.nn.LogSoftmax(0), (6,)),
]


def _input(shape, seed=0):
    x = np.random.default_rng(seed).normal(0, 2, shape)
    x.flat[0] = 0.0  # the kink of ReLU/LeakyReLU/ELU: torch's gradient at exactly 0
    return x


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("case", TABLE, ids=[c[0] for c in TABLE])
def test_activation_equals_torch(case, train, dtype):
    _, ours, theirs, shape = case
    with jax.enable_x64(dtype == "float64"):
        check_layer(ours(), theirs(), [_input(shape)], train=train, dtype=dtype)


@pytest.mark.parametrize("case", TABLE, ids=[c[0] for c in TABLE])
def test_name_is_torch_repr(case):
    _, ours, theirs, _ = case
    assert ours().name == repr(theirs())


@pytest.mark.parametrize("ours, theirs", [
    (lambda: nn.ReLU(inplace=True), lambda: torch.nn.ReLU(inplace=True)),
    (lambda: nn.LeakyReLU(0.1, inplace=True), lambda: torch.nn.LeakyReLU(0.1, inplace=True)),
    (lambda: nn.ELU(2.0, True), lambda: torch.nn.ELU(2.0, True)),
    (lambda: nn.SiLU(inplace=True), lambda: torch.nn.SiLU(inplace=True)),
    (lambda: nn.Softmax(dim=-1), lambda: torch.nn.Softmax(dim=-1)),
])
def test_inplace_and_repr(ours, theirs):
    assert ours().name == repr(theirs())
    check_layer(ours(), _OnACopy(theirs()), [_input((2, 3))])


class _OnACopy(torch.nn.Module):
    """torch refuses in-place ops on a leaf that requires grad; run the module on a copy."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x.clone())


def test_gelu_default_is_exact_erf_not_jax_tanh():
    # a closed form: x * Phi(x) at x = 1 is 0.8413447460685429 (Phi from the normal CDF table)
    y = nn.GELU().apply({}, np.float32(1.0))
    np.testing.assert_allclose(float(y), 0.8413447460685429, rtol=1e-6)
    y_tanh = nn.GELU("tanh").apply({}, np.float32(1.0))
    assert abs(float(y_tanh) - 0.8413447460685429) > 1e-4


def test_bad_arguments_fail_at_build_time():
    with pytest.raises(ValueError, match=r"approximate must be 'none' \(exact, erf\) or 'tanh', got 'erf'"):
        nn.GELU("erf")
    with pytest.raises(ValueError, match=r"Softmax\(dim=None\).*pass dim explicitly.*dim=0 for inputs of rank 0, 1 or 3"):
        nn.Softmax()
    with pytest.raises(ValueError, match=r"LogSoftmax\(dim=None\)"):
        nn.LogSoftmax()
    with pytest.raises(TypeError, match="dim must be an int, got 1.0"):
        nn.Softmax(1.0)
    with pytest.raises(TypeError, match="negative_slope must be a real number, got '0.1'"):
        nn.LeakyReLU("0.1")
    with pytest.raises(TypeError, match="alpha must be a real number, got None"):
        nn.ELU(None)
    with pytest.raises(TypeError, match="inplace must be a bool"):
        nn.ReLU(1)


def test_softmax_dim_out_of_range_fails_at_apply():
    with pytest.raises(ValueError, match=r"Softmax\(dim=2\): input of shape \(3, 4\) has 2 dimensions, "
                                         r"expected dim in \[-2, 1\]"):
        nn.Softmax(2).apply({}, np.zeros((3, 4), np.float32))


def test_softmax_statistics_are_float32_for_bf16_inputs():
    """torch autocast runs softmax in float32; a bf16 sum of exponentials over many classes
    loses the small terms. Oracle: the float32 softmax of the same bf16 values, rounded once."""
    x = (jnp.arange(2048, dtype=jnp.float32) / 97.0).astype(jnp.bfloat16)
    for layer, fn in ((nn.Softmax(dim=-1), jax.nn.softmax), (nn.LogSoftmax(dim=-1), jax.nn.log_softmax)):
        got = layer.apply({}, x)
        assert got.dtype == jnp.bfloat16
        want = fn(x.astype(jnp.float32)).astype(jnp.bfloat16)
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
