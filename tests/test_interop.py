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
from funcnet import interop
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


class WithBag(tnn.Module):
    def __init__(self):
        super().__init__()
        self.bag = tnn.EmbeddingBag(10, 4)
        self.head = tnn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.bag(x))


class OwnParameter(tnn.Module):
    def __init__(self):
        super().__init__()
        self.scale = tnn.Parameter(torch.ones(3))
        self.fc = tnn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x) * self.scale


@pytest.mark.parametrize("module, named", [
    (tnn.Sequential(tnn.Bilinear(2, 3, 4), tnn.Flatten(), tnn.Linear(4, 10)), ["0 (Bilinear, torch.nn's own layer)"]),
    (WithBag(), ["bag (EmbeddingBag, torch.nn's own layer)"]),
    (tnn.Sequential(tnn.Linear(3, 3), OwnParameter(), tnn.ModuleList([tnn.Bilinear(3, 3, 3), tnn.Linear(3, 3)])),
     ["2.0 (Bilinear, torch.nn's own layer)"]),
])
def test_unsupported_layer_is_named_in_a_type_error(module, named):
    with pytest.raises(TypeError) as info:
        from_torch(module)
    message = str(info.value)
    for needle in named:  # every unsupported layer, by dotted path and class
        assert needle in message, (needle, message)
    assert "(Linear)" not in message  # and nothing else
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


# --- buffers (state), integer and bf16 dtypes, tied parameters, subclasses -------------------

def bn_net():
    torch.manual_seed(7)
    net = tnn.Sequential(tnn.Linear(3, 4), tnn.BatchNorm1d(4))
    net.train()(torch.randn(6, 3))  # running statistics and the counter move off their initial values
    net[1].register_buffer("scratch", torch.ones(2), persistent=False)
    return net


@pytest.mark.parametrize("source", ["module", "state_dict"])
def test_buffers_become_state_and_parameters_params(source):
    net = bn_net()
    params, state = interop.from_torch_with_state(net if source == "module" else net.state_dict())
    # split as torch's named_parameters / named_buffers; the non-persistent buffer stays out
    assert sorted(funcnet.state_dict(params)) == sorted(k for k, _ in net.named_parameters())
    assert sorted(funcnet.state_dict({}, state)) == ["1.num_batches_tracked", "1.running_mean", "1.running_var"]
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(np.asarray(funcnet.state_dict(params, state)[k]), v.numpy(), err_msg=k)
    assert state["1"]["num_batches_tracked"].dtype == jnp.int32  # x64 off: int64 -> int32, lossless here
    back = to_torch(params, state)
    assert list(back) == list(net.state_dict())
    fresh = tnn.Sequential(tnn.Linear(3, 4), tnn.BatchNorm1d(4))
    fresh.load_state_dict(back, strict=True)
    assert int(fresh[1].num_batches_tracked) == 1


def test_from_torch_refuses_buffers_and_points_to_from_torch_with_state():
    net = bn_net()
    with pytest.raises(ValueError, match=r"buffers \(1.running_mean, 1.running_var, 1.num_batches_tracked\).*"
                                         r"from_torch_with_state"):
        from_torch(net)
    with pytest.raises(ValueError, match=r"or buffers=\(\) if these keys are parameters"):
        from_torch(net.state_dict())
    # a state_dict cannot tell params from buffers: buffers= says which keys are state
    sd = {"w": torch.ones(2), "stats": torch.zeros(2), "running_mean": torch.zeros(1)}
    params, state = interop.from_torch_with_state(sd, buffers=["stats"])
    assert set(params) == {"w", "running_mean"} and set(state) == {"stats"}
    assert set(from_torch({"running_mean": torch.zeros(1)}, buffers=())) == {"running_mean"}
    with pytest.raises(KeyError, match="buffers= names keys that are not in the state_dict: nope"):
        interop.from_torch_with_state(sd, buffers=["nope"])
    with pytest.raises(TypeError, match="buffers= is for a state_dict mapping"):
        interop.from_torch_with_state(net, buffers=["1.running_mean"])


def test_state_is_empty_dict_without_buffers():
    params, state = interop.from_torch_with_state(torch_mlp())
    assert state == {} and set(params) == {"0", "2"}


def test_int64_counter_past_int32_is_refused_without_x64_and_kept_with_it():
    sd = {"bn.num_batches_tracked": torch.tensor(2**31, dtype=torch.int64)}
    with pytest.raises(ValueError, match=r"'bn.num_batches_tracked' is torch.int64 and holds 2147483648, outside "
                                         r"int32 .*JAX_ENABLE_X64=1"):
        interop.from_torch_with_state(sd)
    sd_ok = {"bn.num_batches_tracked": torch.tensor(2**31 - 1, dtype=torch.int64)}
    assert int(interop.from_torch_with_state(sd_ok)[1]["bn"]["num_batches_tracked"]) == 2**31 - 1
    with jax.enable_x64(True):
        _, state = interop.from_torch_with_state(sd)
        leaf = state["bn"]["num_batches_tracked"]
        assert leaf.dtype == jnp.int64 and int(leaf) == 2**31
        back = to_torch({}, state)["bn.num_batches_tracked"]
        assert back.dtype == torch.int64 and int(back) == 2**31


def test_bf16_parameters_and_buffers_stay_bf16():
    net = bn_net().to(torch.bfloat16)
    params, state = interop.from_torch_with_state(net)
    assert params["0"]["weight"].dtype == jnp.bfloat16 and state["1"]["running_var"].dtype == jnp.bfloat16
    back = to_torch(params, state)
    for k, v in net.state_dict().items():
        # the int64 counter comes back as int32 (x64 off); torch's load_state_dict copies it into int64
        assert back[k].dtype == (torch.int32 if k.endswith("num_batches_tracked") else v.dtype), k
        assert torch.equal(back[k].to(v.dtype), v), k


class TinyGPT(tnn.Module):
    """nanoGPT's weight tying: lm_head.weight is transformer.wte.weight."""

    def __init__(self):
        super().__init__()
        self.transformer = tnn.ModuleDict({"wte": tnn.Embedding(7, 4), "ln_f": tnn.LayerNorm(4)})
        self.lm_head = tnn.Linear(4, 7, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # nanoGPT writes it this way round

    def forward(self, idx):
        return self.lm_head(self.transformer.ln_f(self.transformer.wte(idx)))


@pytest.mark.parametrize("source", ["module", "state_dict"])
def test_tied_weights_are_one_array_and_a_tied_marker(source):
    torch.manual_seed(8)
    net = TinyGPT()
    params = from_torch(net if source == "module" else net.state_dict())
    # torch lists transformer.wte.weight first: it holds the array, lm_head.weight points to it from the root
    assert params["lm_head"]["weight"] == nn.Tied("transformer.wte.weight", 2)
    assert len(jax.tree.leaves(params)) == 3  # wte, ln_f.weight, ln_f.bias
    sd = to_torch(params)
    assert list(sd) == list(net.state_dict())
    assert torch.equal(sd["lm_head.weight"], net.lm_head.weight.detach())
    fresh = TinyGPT()
    fresh.load_state_dict(sd, strict=True)
    assert fresh.lm_head.weight is fresh.transformer.wte.weight
    assert torch.equal(fresh.lm_head.weight, net.lm_head.weight)


def test_tied_params_drive_a_composite_with_torchs_gradient():
    torch.manual_seed(9)
    net = TinyGPT()
    params = from_torch(net)

    def forward(self, idx):
        return self.lm_head(self.transformer.ln_f(self.transformer.wte(idx)))

    model = nn.Composite(forward, transformer=nn.ModuleDict({"wte": nn.Embedding(7, 4), "ln_f": nn.LayerNorm(4)}),
                         lm_head=nn.Linear(4, 7, bias=False), tied={"lm_head.weight": "transformer.wte.weight"})
    idx = torch.tensor([[1, 5, 6]])
    out = net(idx)
    out.square().sum().backward()
    j_idx = jnp.asarray(idx.numpy())
    np.testing.assert_allclose(model.apply(params, j_idx), out.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads = jax.grad(lambda p: jnp.sum(model.apply(p, j_idx) ** 2))(params)
    np.testing.assert_allclose(grads["transformer"]["wte"]["weight"], net.lm_head.weight.grad.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_linear_subclass_is_supported():
    # MultiheadAttention.out_proj is NonDynamicallyQuantizableLinear, which a name check refused
    from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

    net = tnn.Sequential(NonDynamicallyQuantizableLinear(3, 2))
    params = from_torch(net)
    np.testing.assert_array_equal(params["0"]["weight"], net[0].weight.detach().numpy())


class NanoLayerNorm(tnn.Module):  # nanoGPT's own LayerNorm: not torch.nn.LayerNorm, a class of its own
    def __init__(self, n):
        super().__init__()
        self.weight, self.bias = tnn.Parameter(torch.ones(n)), tnn.Parameter(torch.zeros(n))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


def test_modules_of_the_users_own_classes_convert_their_tensors():
    # nanoGPT's LayerNorm and a ViT's cls_token (an nn.Parameter of the model's own class) are
    # params like any other; funcnet holds them (nn.Composite with nn.Parameter children)
    net = tnn.Sequential(tnn.Linear(3, 3), OwnParameter(), NanoLayerNorm(3))
    params = from_torch(net)
    assert sorted(funcnet.state_dict(params)) == sorted(net.state_dict())
    np.testing.assert_array_equal(params["1"]["scale"], np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"no counterpart for 0 \(Bilinear, torch.nn's own layer\)"):
        from_torch(tnn.Sequential(tnn.Bilinear(3, 3, 3), NanoLayerNorm(3)))


def test_keys_meta_sparse_and_prng_keys_are_named():
    t = torch.ones(2, 2)
    cases = [
        (lambda: from_torch({"0..weight": t}), ValueError, r"key '0..weight' has an empty name between dots"),
        (lambda: from_torch({"w": torch.empty(2, device="meta")}), ValueError, r"'w' is a meta tensor"),
        (lambda: from_torch({"w": t.to_sparse()}), ValueError, r"'w' is a sparse tensor .* pass tensor.to_dense\(\)"),
        (lambda: interop.convert(tnn.Linear(2, 2, device="meta")), ValueError, r"'weight' is a meta tensor"),
        (lambda: to_torch({"k": jax.random.key(0)}), TypeError, r"'k' is a JAX PRNG key .* jax.random.key_data"),
    ]
    for thunk, error, message in cases:
        with pytest.raises(error, match=message):
            thunk()
