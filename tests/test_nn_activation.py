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
    # the kinks of each row sit in the input (KINKS below): torch's gradient there
    ("ReLU6", lambda: nn.ReLU6(), lambda: torch.nn.ReLU6(), (3, 5)),
    ("Hardswish", lambda: nn.Hardswish(), lambda: torch.nn.Hardswish(), (3, 5)),
    ("Hardsigmoid", lambda: nn.Hardsigmoid(), lambda: torch.nn.Hardsigmoid(), (3, 5)),
    ("Hardtanh", lambda: nn.Hardtanh(), lambda: torch.nn.Hardtanh(), (3, 5)),
    ("Hardtanh-2-3", lambda: nn.Hardtanh(-2.0, 3.0), lambda: torch.nn.Hardtanh(-2.0, 3.0), (3, 5)),
    ("Mish", lambda: nn.Mish(), lambda: torch.nn.Mish(), (3, 5)),
    ("Softplus", lambda: nn.Softplus(), lambda: torch.nn.Softplus(), (3, 5)),
    ("Softplus-2-10", lambda: nn.Softplus(2, 10), lambda: torch.nn.Softplus(2, 10), (3, 5)),
    ("PReLU", lambda: nn.PReLU(), lambda: torch.nn.PReLU(), (3, 5)),
    ("PReLU-channels", lambda: nn.PReLU(3, 0.1), lambda: torch.nn.PReLU(3, 0.1), (2, 3, 4)),
    ("SELU", lambda: nn.SELU(), lambda: torch.nn.SELU(), (3, 5)),
    ("CELU-0.5", lambda: nn.CELU(0.5), lambda: torch.nn.CELU(0.5), (3, 5)),
    ("LogSigmoid", lambda: nn.LogSigmoid(), lambda: torch.nn.LogSigmoid(), (3, 5)),
    ("Softsign", lambda: nn.Softsign(), lambda: torch.nn.Softsign(), (3, 5)),
    ("Tanhshrink", lambda: nn.Tanhshrink(), lambda: torch.nn.Tanhshrink(), (3, 5)),
    ("Threshold", lambda: nn.Threshold(0.1, 20), lambda: torch.nn.Threshold(0.1, 20), (3, 5)),
    ("GLU", lambda: nn.GLU(), lambda: torch.nn.GLU(), (3, 4)),
    ("GLU-1", lambda: nn.GLU(1), lambda: torch.nn.GLU(1), (2, 4, 3)),
    ("Softmin-1", lambda: nn.Softmin(1), lambda: torch.nn.Softmin(1), (3, 5)),
    ("Softmax2d", lambda: nn.Softmax2d(), lambda: torch.nn.Softmax2d(), (2, 3, 2, 2)),
    ("Softmax2d-unbatched", lambda: nn.Softmax2d(), lambda: torch.nn.Softmax2d(), (3, 2, 2)),
]
# values placed at the start of the input: every kink torch defines a gradient at
KINKS = {"ReLU6": (0.0, 6.0), "Hardswish": (-3.0, 3.0), "Hardsigmoid": (-3.0, 3.0), "Hardtanh": (-1.0, 1.0),
         "Hardtanh-2-3": (-2.0, 3.0), "Softplus": (20.0, 0.0), "Softplus-2-10": (5.0, 0.0), "Threshold": (0.1, 0.0),
         "SELU": (0.0,), "CELU-0.5": (0.0,), "Softsign": (0.0,)}


def _input(shape, seed=0, kinks=(0.0,)):
    x = np.random.default_rng(seed).normal(0, 2, shape)
    x.flat[:len(kinks)] = kinks  # default: the kink of ReLU/LeakyReLU/ELU, torch's gradient at exactly 0
    return x


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("case", TABLE, ids=[c[0] for c in TABLE])
def test_activation_equals_torch(case, train, dtype):
    name, ours, theirs, shape = case
    with jax.enable_x64(dtype == "float64"):
        check_layer(ours(), theirs(), [_input(shape, kinks=KINKS.get(name, (0.0,)))], train=train, dtype=dtype)


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


@pytest.mark.parametrize("name, fn, kinks, want", [
    # torch's gradients at the kinks, written out (torch's backward formulas); a stand-in with
    # jnp.clip gives 0.5 at the ends of ReLU6
    ("ReLU6", nn.ReLU6, (0.0, 6.0), (0.0, 0.0)),
    ("Hardtanh", nn.Hardtanh, (-1.0, 1.0), (0.0, 0.0)),
    ("Hardsigmoid", nn.Hardsigmoid, (-3.0, 3.0), (0.0, 0.0)),
    ("Hardswish", nn.Hardswish, (-3.0, 3.0), (0.0, 1.0)),
])
def test_gradient_at_kinks_closed_form(name, fn, kinks, want):
    layer = fn()
    grads = jax.vmap(jax.grad(lambda v: layer.apply({}, v)))(jnp.asarray(kinks))
    np.testing.assert_array_equal(np.asarray(grads), np.asarray(want, np.float32), err_msg=name)
    x = torch.tensor(kinks, requires_grad=True)
    getattr(torch.nn, name)()(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.asarray(want, np.float32), err_msg=f"torch {name}")


def test_new_activation_arguments_fail_at_build_time():
    with pytest.raises(ValueError, match=r"Hardtanh: min_val=2.0 is greater than max_val=1.0"):
        nn.Hardtanh(2.0, 1.0)
    with pytest.raises(ValueError, match="PReLU: num_parameters must be a positive int"):
        nn.PReLU(0)
    with pytest.raises(ValueError, match="CELU: alpha=0 divides by zero"):
        nn.CELU(0)
    with pytest.raises(ValueError, match=r"Softmin\(dim=None\)"):
        nn.Softmin()
    with pytest.raises(ValueError, match=r"PReLU\(num_parameters=3\)|prelu: weight of shape \(3,\) has one entry "
                                         r"per channel but the input of shape \(2, 4\) has 4 channels"):
        nn.PReLU(3).apply(nn.PReLU(3).init(None), jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"Softmax2d: expected a 3D \(C, H, W\) or 4D \(N, C, H, W\) input, got "
                                         r"shape \(2, 3\)"):
        nn.Softmax2d().apply({}, jnp.zeros((2, 3)))


def test_float32_exact_gelu_and_its_derivatives_against_float64_and_torch():
    """float32's exact GELU is torch's formula with erf as a rational approximation (XLA:CPU's own
    erf takes 2.6x its time): values and first derivative within float32 rounding of float64's closed
    form (scipy's erf) over the whole range, tails included, as close as torch's float32;
    forward mode equals reverse; the second derivative (autodiff of the derivative) within the
    rational erf's derivative error of float64's."""
    from math import pi, sqrt

    from scipy.special import erf

    from funcnet.nn import functional as F

    x32 = np.concatenate([np.linspace(-12, 12, 24001), [-0.0, 1e-30, -1e-30, 40.0, -40.0]]).astype(np.float32)
    x = x32.astype(np.float64)
    cdf, pdf = 0.5 * (1 + erf(x / sqrt(2))), np.exp(-x * x / 2) / sqrt(2 * pi)
    value, d1, d2 = x * cdf, cdf + x * pdf, (2 - x * x) * pdf
    xj = jnp.asarray(x32)
    ours = np.asarray(jax.jit(F.gelu)(xj), np.float64)
    grad = np.asarray(jax.jit(jax.vmap(jax.grad(F.gelu)))(xj), np.float64)
    tangent = np.asarray(jax.jit(lambda x: jax.jvp(F.gelu, (x,), (jnp.ones_like(x),))[1])(xj), np.float64)
    second = np.asarray(jax.jit(jax.vmap(jax.grad(jax.grad(F.gelu))))(xj), np.float64)
    tx = torch.from_numpy(x32).requires_grad_()
    ty = torch.nn.functional.gelu(tx)
    (tg,) = torch.autograd.grad(ty.sum(), tx)
    for name, got, ref, theirs in (("value", ours, value, ty.detach().double().numpy()),
                                   ("derivative", grad, d1, tg.double().numpy())):
        # float32 rounding of results up to 40 in size, and no more than 2x torch's own float32
        # error on the same inputs (torch: 1.1e-6 on the values, 2.6e-7 on the derivative)
        err, torch_err = np.abs(got - ref), np.abs(theirs - ref)
        assert err.max() <= 2 * torch_err.max(), (name, err.max(), torch_err.max())
    assert ours.dtype == np.float64 and jax.jit(F.gelu)(xj).dtype == jnp.float32
    np.testing.assert_array_equal(tangent, grad)
    # the rational erf's derivative (not erf's own) enters the second derivative: within 1e-4 of
    # float64's, where the second derivative itself reaches 0.8 (a closed form, not float32 rounding)
    assert np.abs(second - d2).max() < 1e-4, np.abs(second - d2).max()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_exact_gelu_is_within_one_rounding_of_float64(dtype):
    """bf16/fp16 exact GELU, computed in float32 and rounded to the input's dtype once: on every
    representable input of [-8, 8] within half a unit in the last place of the dtype (relative
    2**-8 for bfloat16, 2**-11 for float16) of float64's closed form, plus float32's absolute
    error in the negative tail (1e-6, where 1 + erf cancels) and float16's subnormal spacing."""
    from math import sqrt

    from scipy.special import erf

    from funcnet.nn import functional as F

    grid = np.unique(np.asarray(jnp.linspace(-8, 8, 20001).astype(dtype)))
    x = grid.astype(np.float64)
    ref = 0.5 * x * (1 + erf(x / sqrt(2)))
    y = F.gelu(jnp.asarray(grid))
    assert y.dtype == jnp.dtype(dtype)
    half_ulp = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    bound = half_ulp * np.abs(ref) + 1e-6 + (2.0**-24 if dtype == "float16" else 0.0)
    err = np.abs(np.asarray(y, np.float64) - ref)
    assert np.all(err <= bound), (err - bound).max()
