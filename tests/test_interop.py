"""torch <-> funcnet weights: same outputs and gradients, exact round trips, clear errors.

The oracle is torch itself: its forward pass and autograd on the same weights, its own
``load_state_dict`` errors, and the raw bits of its tensors.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F
from torch import nn as tnn

import funcnet
from funcnet import nn
from funcnet.interop import from_torch, to_torch

SIZES = [20, 16, 5]
# float32 on CPU: one forward/backward of a two-layer net reorders a few dozen products
ATOL, RTOL = 1e-6, 1.3e-6


def torch_mlp(sizes=SIZES):
    return tnn.Sequential(tnn.Linear(sizes[0], sizes[1]), tnn.ReLU(), tnn.Linear(sizes[1], sizes[2]))


def inputs(seed=0, batch=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, SIZES[0], generator=g), torch.randint(0, SIZES[-1], (batch,), generator=g)


def torch_loss_and_grads(net, x, y):
    net.zero_grad()
    out = net(x)
    F.cross_entropy(out, y).backward()
    return out.detach().numpy(), {k: p.grad.numpy().copy() for k, p in net.named_parameters()}


def jax_loss_and_grads(params, x, y):
    model = nn.MLP(SIZES)
    x, y = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    return np.asarray(model.apply(params, x)), {k: np.asarray(g) for k, g in
                                                funcnet.state_dict(jax.grad(loss)(params)).items()}


def assert_same(got, expected):
    out_j, grads_j = got
    out_t, grads_t = expected
    np.testing.assert_allclose(out_j, out_t, rtol=RTOL, atol=ATOL)
    assert grads_j.keys() == grads_t.keys()
    for k in grads_t:
        np.testing.assert_allclose(grads_j[k], grads_t[k], rtol=RTOL, atol=ATOL, err_msg=k)


@pytest.mark.parametrize("loader", ["from_torch(module)", "from_torch(state_dict)", "load_state_dict"])
def test_torch_weights_in_funcnet_give_torch_outputs_and_gradients(loader):
    torch.manual_seed(0)
    net = torch_mlp()
    if loader == "from_torch(module)":
        params = from_torch(net)
    elif loader == "from_torch(state_dict)":
        params = from_torch(net.state_dict())
    else:
        params = funcnet.load_state_dict(nn.MLP(SIZES).init(jax.random.key(0)), net.state_dict(), strict=True)
    x, y = inputs()
    assert_same(jax_loss_and_grads(params, x, y), torch_loss_and_grads(net, x, y))


def test_funcnet_params_in_torch_give_funcnet_outputs_and_gradients():
    params = nn.MLP(SIZES).init(jax.random.key(1))
    net = torch_mlp()
    net.load_state_dict(to_torch(params), strict=True)
    x, y = inputs(seed=1)
    assert_same(jax_loss_and_grads(params, x, y), torch_loss_and_grads(net, x, y))


def test_funcnet_init_matches_torch_layout_and_dtype():
    params = nn.MLP(SIZES).init(jax.random.key(2))
    sd = to_torch(params)
    expected = torch_mlp().state_dict()
    assert {k: (tuple(v.shape), v.dtype) for k, v in sd.items()} == \
        {k: (tuple(v.shape), v.dtype) for k, v in expected.items()}


class WithConv(tnn.Module):
    def __init__(self):
        super().__init__()
        self.conv = tnn.Conv2d(1, 4, 3)
        self.head = tnn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.conv(x).mean((-2, -1)))


@pytest.mark.parametrize("module, named", [
    (tnn.Sequential(tnn.Conv2d(1, 4, 3), tnn.Flatten(), tnn.Linear(4 * 26 * 26, 10)), "0 (Conv2d)"),
    (WithConv(), "conv (Conv2d)"),
    (tnn.Sequential(tnn.Linear(4, 4), tnn.BatchNorm1d(4)), "1 (BatchNorm1d)"),
])
def test_unsupported_layer_is_named_in_a_type_error(module, named):
    with pytest.raises(TypeError) as info:
        from_torch(module)
    message = str(info.value)
    assert named in message
    assert "Linear" in message  # lists what is supported
    assert "state_dict()" in message  # and the way around the check
    # the tensors themselves still convert, bypassing the layer check as the message says
    assert set(funcnet.state_dict(from_torch(module.state_dict()))) == set(module.state_dict())


def test_from_torch_rejects_what_is_not_a_module_or_state_dict():
    with pytest.raises(TypeError, match="expected a torch.nn.Module or a state_dict mapping, got list"):
        from_torch([torch.zeros(2)])
    with pytest.raises(TypeError, match="'w' holds ndarray, expected a torch.Tensor"):
        from_torch({"w": np.zeros(2)})


SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-45, 3.4e38, 1 / 3]


@pytest.mark.parametrize("dtype, bits", [(torch.float32, torch.int32), (torch.float16, torch.int16),
                                         (torch.bfloat16, torch.int16)])
def test_round_trip_torch_funcnet_torch_is_bitwise(dtype, bits):
    torch.manual_seed(3)
    net = torch_mlp().to(dtype)
    with torch.no_grad():  # signed zeros, infinities, NaN, subnormals: bits must survive too
        net[0].bias[: len(SPECIAL)] = torch.tensor(SPECIAL).to(dtype)
    back = to_torch(from_torch(net))
    original = net.state_dict()
    assert back.keys() == original.keys()
    for k, t in original.items():
        assert back[k].dtype == t.dtype, k
        assert torch.equal(back[k].view(bits), t.view(bits)), k
    fresh = torch_mlp().to(dtype)
    fresh.load_state_dict(back, strict=True)


def test_round_trip_float64_is_bitwise_with_x64():
    # float64 needs JAX_ENABLE_X64 before JAX starts, hence a separate process
    code = textwrap.dedent("""
        import torch, jax.numpy as jnp
        from funcnet.interop import from_torch, to_torch
        t = torch.randn(5, 3, dtype=torch.float64)
        t[0, :3] = torch.tensor([-0.0, 5e-324, float("nan")], dtype=torch.float64)
        p = from_torch({"w": t})
        assert p["w"].dtype == jnp.float64, p["w"].dtype
        back = to_torch(p)["w"]
        assert back.dtype == torch.float64 and torch.equal(back.view(torch.int64), t.view(torch.int64))
        print("ok")
    """)
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_float64_without_x64_is_not_silently_downcast():
    assert not jax.config.jax_enable_x64
    with pytest.raises(TypeError, match=r"'w' is torch.float64, but JAX runs with 64-bit types off.*JAX_ENABLE_X64=1"):
        from_torch({"w": torch.tensor([1 / 3], dtype=torch.float64)})


def broken_state_dict():
    """MLP([4, 3, 2])'s keys with one missing, two unexpected and two wrong shapes."""
    return {
        "0.weight": torch.zeros(3, 5),  # expected (3, 4)
        # "0.bias" missing
        "2.weight": torch.zeros(2, 3),
        "2.bias": torch.zeros(7),  # expected (2,)
        "1.weight": torch.zeros(3),
        "head.bias": torch.zeros(2),
    }


def test_strict_load_lists_every_missing_unexpected_and_mismatched_key():
    template = nn.MLP([4, 3, 2]).init(jax.random.key(4))
    with pytest.raises(funcnet.StateDictError) as info:
        funcnet.load_state_dict(template, broken_state_dict(), strict=True)
    message = str(info.value)
    for needle in ["missing keys: 0.bias", "unexpected keys: 1.weight, head.bias",
                   "0.weight: expected shape (3, 4), got (3, 5)", "2.bias: expected shape (2,), got (7,)"]:
        assert needle in message, (needle, message)

    # torch reports the same keys for the same mistake
    with pytest.raises(RuntimeError) as torch_info:
        torch_mlp([4, 3, 2]).load_state_dict(broken_state_dict(), strict=True)
    for key in ["0.bias", "1.weight", "head.bias", "0.weight", "2.bias"]:
        assert key in str(torch_info.value) and key in message, key


def test_non_strict_load_skips_missing_and_unexpected_like_torch():
    template = nn.MLP([4, 3, 2]).init(jax.random.key(5))
    sd = broken_state_dict()
    sd["0.weight"], sd["2.bias"] = torch.full((3, 4), 0.5), torch.full((2,), -1.0)
    net = torch_mlp([4, 3, 2])
    net.load_state_dict(to_torch(template))
    result = net.load_state_dict(sd, strict=False)
    loaded = funcnet.load_state_dict(template, sd, strict=False)
    assert sorted(result.missing_keys) == ["0.bias"]
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(np.asarray(funcnet.state_dict(loaded)[k]), v.numpy(), err_msg=k)


def test_non_strict_load_still_refuses_a_shape_mismatch():
    template = nn.MLP([4, 3, 2]).init(jax.random.key(6))
    with pytest.raises(funcnet.StateDictError, match=r"0.weight: expected shape \(3, 4\), got \(3, 5\)"):
        funcnet.load_state_dict(template, broken_state_dict(), strict=False)
    with pytest.raises(RuntimeError, match="size mismatch for 0.weight"):
        torch_mlp([4, 3, 2]).load_state_dict(broken_state_dict(), strict=False)
