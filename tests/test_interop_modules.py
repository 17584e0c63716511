"""interop.convert: a torch module becomes a funcnet model whose forward and state equal torch's.

The oracle is the torch module itself: its forward in train and eval mode, its buffers after a
training forward (torch updates them in place; funcnet returns them) and its state_dict order.
A row whose funcnet layer is missing fails, naming it (every layer the rows use exists).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn as tnn

import funcnet
from funcnet import interop, nn

TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-10, atol=1e-12)}


def require(names) -> None:
    """Fail, naming them, when funcnet.nn lacks layers a row converts to."""
    missing = [n for n in names if not hasattr(nn, n)]
    assert not missing, f"funcnet.nn has no {', '.join(missing)}, which the row converts to"


# name -> (torch model factory, input shape, funcnet layers it needs)
ROWS = {
    "mlp": (lambda: tnn.Sequential(tnn.Linear(5, 7), tnn.ReLU(), tnn.Linear(7, 3, bias=False), tnn.Tanh(),
                                   tnn.Identity(), tnn.Dropout(0.0), tnn.Sigmoid()), (4, 5), ()),
    "flatten": (lambda: tnn.Sequential(tnn.Flatten(1, 2), tnn.Linear(1, 2)), (3, 2, 3, 1), ()),
    "unflatten": (lambda: tnn.Sequential(tnn.Linear(6, 6), tnn.Unflatten(1, (2, 3)), tnn.Linear(3, 2)), (4, 6),
                  ("Unflatten",)),
    "conv_bn_pool": (lambda: tnn.Sequential(tnn.Conv2d(3, 4, 3, stride=1, padding=1, bias=False),
                                            tnn.BatchNorm2d(4, eps=1e-3, momentum=0.2), tnn.ReLU(),
                                            tnn.MaxPool2d(2), tnn.AdaptiveAvgPool2d(1), tnn.Flatten(),
                                            tnn.Linear(4, 2)),
                     (2, 3, 6, 6), ("Conv2d", "BatchNorm2d", "MaxPool2d", "AdaptiveAvgPool2d")),
    "conv1d_gn": (lambda: tnn.Sequential(tnn.Conv1d(4, 6, 3, stride=2, dilation=1), tnn.GroupNorm(3, 6, eps=1e-4),
                                         tnn.AvgPool1d(2), tnn.LeakyReLU(0.2), tnn.Flatten(), tnn.Softmax(-1)),
                  (2, 4, 11), ("Conv1d", "GroupNorm", "AvgPool1d", "LeakyReLU", "Softmax")),
    "bn1d_ln": (lambda: tnn.Sequential(tnn.Linear(5, 6), tnn.BatchNorm1d(6, momentum=None), tnn.GELU("tanh"),
                                       tnn.LayerNorm(6, eps=1e-3), tnn.SiLU(), tnn.Linear(6, 2)),
                (8, 5), ("BatchNorm1d", "GELU", "LayerNorm", "SiLU")),
    "bn_no_stats": (lambda: tnn.Sequential(tnn.Linear(3, 4), tnn.BatchNorm1d(4, track_running_stats=False)),
                    (5, 3), ("BatchNorm1d",)),
    "elu": (lambda: tnn.Sequential(tnn.Linear(4, 4), tnn.ELU(0.5)), (2, 4), ("ELU",)),
}


def run_torch(net, x, train):
    net.train(train)
    with torch.no_grad():
        out = net(torch.from_numpy(x))
    return out.numpy(), {k: v.clone() for k, v in net.state_dict().items()}


def assert_state_equal(ours, torch_sd, tol, what):
    flat = funcnet.state_dict({}, ours)
    buffers = {k: v for k, v in torch_sd.items() if k in flat or "running" in k or "num_batches" in k}
    assert sorted(flat) == sorted(buffers), (what, sorted(flat), sorted(buffers))
    for k, v in buffers.items():
        if v.is_floating_point():
            np.testing.assert_allclose(np.asarray(flat[k]), v.numpy(), err_msg=f"{what} {k}", **tol)
        else:
            np.testing.assert_array_equal(np.asarray(flat[k]), v.numpy(), err_msg=f"{what} {k}")


def check_convert(net, shape, dtype="float32"):
    tol = TOL[dtype]
    net = net.to(getattr(torch, dtype))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    model, params, state = interop.convert(net)
    # keys in torch's order, values bit for bit, dtypes kept (int64 -> int32 only with x64 off)
    sd = funcnet.state_dict(params, state, model=model)
    assert list(sd) == list(before)
    for k, v in before.items():
        np.testing.assert_array_equal(np.asarray(sd[k]), v.numpy(), err_msg=k)
        expected = v.numpy().dtype if (jax.config.jax_enable_x64 or v.numpy().dtype.itemsize < 8) else np.int32
        assert np.asarray(sd[k]).dtype == expected, (k, sd[k].dtype)
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    step = jax.jit(lambda p, s, x, train: nn.call(model, p, s, x, train=train), static_argnums=3)
    # train: outputs and the buffers torch updated in place
    out_t, sd_t = run_torch(net, x, True)
    out, new_state = step(params, state, jnp.asarray(x), True)
    np.testing.assert_allclose(np.asarray(out), out_t, err_msg="train forward", **tol)
    assert_state_equal(new_state, sd_t, tol, "state after train forward")
    # eval, from the updated state: reads running statistics, changes nothing
    out_t, sd_t = run_torch(net, x, False)
    out, eval_state = step(params, new_state, jnp.asarray(x), False)
    np.testing.assert_allclose(np.asarray(out), out_t, err_msg="eval forward", **tol)
    assert_state_equal(eval_state, sd_t, tol, "state after eval forward")
    return model, params, state


@pytest.mark.parametrize("row", list(ROWS))
def test_converted_model_forward_and_state_equal_torch_float32(row):
    factory, shape, layers = ROWS[row]
    require(layers)
    torch.manual_seed(0)
    check_convert(factory(), shape)


@pytest.mark.parametrize("row", ["mlp", "conv_bn_pool", "bn1d_ln"])
def test_converted_model_forward_and_state_equal_torch_float64(row):
    factory, shape, layers = ROWS[row]
    require(layers)
    torch.manual_seed(1)
    with jax.enable_x64(True):
        model, params, state = check_convert(factory(), shape, "float64")
        for leaf in jax.tree.leaves(state):  # num_batches_tracked stays int64 under x64
            assert leaf.dtype in (jnp.float64, jnp.int64), leaf.dtype


def test_constructor_arguments_are_read_off_the_torch_module():
    # a layer's name is torch's repr, so equal reprs mean equal constructor arguments
    net = tnn.Sequential(tnn.Linear(3, 2, bias=False), tnn.Dropout(0.25), tnn.Flatten(0, -1), tnn.Tanh())
    model, _, _ = interop.convert(net)
    assert [child.name for _, child in model.children] == [repr(m) for m in net]


def test_converted_dropout_drops_with_torchs_probability_and_scale():
    model, params, _ = interop.convert(tnn.Sequential(tnn.Dropout(0.25)))
    x = jnp.ones((4000,))
    y = np.asarray(model.apply(params, x, key=jax.random.key(0), train=True))
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)  # inverted dropout, as torch
    assert abs(1 - kept.mean() - 0.25) < 0.03  # 4000 draws: 4 standard deviations is 0.027
    np.testing.assert_array_equal(model.apply(params, x), x)


class Block(tnn.Module):
    def __init__(self):
        super().__init__()
        self.fc = tnn.Linear(3, 3)

    def forward(self, x):
        return torch.relu(self.fc(x)) + x


class ScaledLinear(tnn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def test_custom_forward_and_unsupported_layers_are_all_named_with_paths():
    net = tnn.Sequential(tnn.Linear(3, 3), Block(), tnn.ModuleList([tnn.Bilinear(3, 3, 3), ScaledLinear(3, 3)]))
    with pytest.raises(interop.ConversionError) as info:
        interop.convert(net)
    message = str(info.value)
    for needle in ["1 (Block)", "forward is Python code", "example inputs", "nn.Composite", "docs/design.md",
                   "2.0 (Bilinear)", "no counterpart", "2.1 (ScaledLinear)", "its own forward"]:
        assert needle in message, (needle, message)
    assert "0 (Linear)" not in message


def test_user_module_as_root_is_refused_with_the_composite_hint():
    with pytest.raises(interop.ConversionError,
                       match=r"<root> \(Block\): a module whose forward is Python code; pass example inputs.*nn\.Composite"):
        interop.convert(Block())
    with pytest.raises(TypeError, match="expected a torch.nn.Module, got dict"):
        interop.convert({"w": torch.zeros(1)})


def test_subclass_with_torchs_forward_converts():
    # torch's MultiheadAttention.out_proj is NonDynamicallyQuantizableLinear, a Linear subclass
    from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

    torch.manual_seed(2)
    net = tnn.Sequential(NonDynamicallyQuantizableLinear(4, 3), tnn.ReLU())
    check_convert(net, (2, 4))


def test_non_default_argument_funcnet_lacks_is_refused():
    # an argument the funcnet layer does not take is refused unless it has torch's default value
    from funcnet.interop.trace.modules import _Row, _layer

    problems = []
    row = _Row("Linear", "Identity")  # deliberately wrong pairing: Identity() takes none of Linear's arguments
    assert _layer(tnn.Linear(3, 2), "head", tnn.Linear, row, problems) is None
    assert "head (Linear): funcnet.nn.Identity has no argument for in_features=3, out_features=2" in problems[0]


def test_named_sequential_keeps_torchs_names_and_order():
    from collections import OrderedDict

    torch.manual_seed(3)
    net = tnn.Sequential(OrderedDict(fc=tnn.Linear(4, 5), act=tnn.Tanh(), head=tnn.Linear(5, 2)))
    check_convert(net, (3, 4))


def test_module_dict_and_list_roots_have_no_forward_but_convert():
    torch.manual_seed(4)
    holder = tnn.ModuleDict({"enc": tnn.Linear(3, 4), "heads": tnn.ModuleList([tnn.Linear(4, 2), tnn.Linear(4, 1)])})
    model, params, state = interop.convert(holder)
    assert model.apply is None and state == {}
    assert list(funcnet.state_dict(params, model=model)) == list(holder.state_dict())
    enc = dict(model.children)["enc"]
    x = torch.randn(2, 3)
    np.testing.assert_allclose(enc.apply(params["enc"], jnp.asarray(x.numpy())), holder["enc"](x).detach().numpy(),
                               **TOL["float32"])


def test_tied_weights_stay_tied_in_a_converted_model():
    torch.manual_seed(5)
    net = tnn.Sequential(tnn.Linear(4, 4, bias=False), tnn.Tanh(), tnn.Linear(4, 4))
    net[2].weight = net[0].weight
    model, params, _ = interop.convert(net)
    assert params["2"]["weight"] == nn.Tied("0.weight", 2)
    assert len(jax.tree.leaves(params)) == 2  # one weight, one bias
    x = torch.randn(3, 4)
    out = net(x)
    np.testing.assert_allclose(model.apply(params, jnp.asarray(x.numpy())), out.detach().numpy(), **TOL["float32"])
    # the gradient of the one array is the sum over both uses, as torch accumulates it
    out.sum().backward()
    grads = jax.grad(lambda p: model.apply(p, jnp.asarray(x.numpy())).sum())(params)
    np.testing.assert_allclose(grads["0"]["weight"], net[0].weight.grad.numpy(), **TOL["float32"])
    assert model.init(jax.random.key(0))["2"]["weight"] == nn.Tied("0.weight", 2)
    sd = interop.to_torch(params)
    assert list(sd) == list(net.state_dict())
    tnn.Sequential(tnn.Linear(4, 4, bias=False), tnn.Tanh(), tnn.Linear(4, 4)).load_state_dict(sd, strict=True)


def test_multihead_attention_converts_with_its_arguments():
    require(["MultiheadAttention"])
    torch.manual_seed(6)
    net = tnn.MultiheadAttention(8, 2, bias=False, batch_first=True, kdim=6, vdim=5)
    model, params, state = interop.convert(net)
    assert state == {}
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 4, 6), torch.randn(2, 4, 5)
    out_t, w_t = net.eval()(q, k, v)
    out, w = model.apply(params, *(jnp.asarray(t.numpy()) for t in (q, k, v)))
    np.testing.assert_allclose(out, out_t.detach().numpy(), **TOL["float32"])
    np.testing.assert_allclose(w, w_t.detach().numpy(), **TOL["float32"])


def test_transformer_encoder_layer_converts_with_its_arguments():
    require(["TransformerEncoderLayer"])
    torch.manual_seed(7)
    net = tnn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, activation="gelu",
                                      layer_norm_eps=1e-4, batch_first=True, norm_first=True)
    model, params, state = interop.convert(net)
    x = torch.randn(2, 3, 8)
    y, _ = nn.call(model, params, state, jnp.asarray(x.numpy()))
    # attention, softmax, two LayerNorms and a feed-forward block in float32: a few 1e-6 add up
    np.testing.assert_allclose(y, net.eval()(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_transformer_encoder_converts_with_its_layers_and_norm():
    require(["TransformerEncoder", "TransformerEncoderLayer"])
    torch.manual_seed(9)
    layer = tnn.TransformerEncoderLayer(8, 2, dim_feedforward=12, dropout=0.0, batch_first=True)
    net = tnn.TransformerEncoder(layer, 2, norm=tnn.LayerNorm(8), enable_nested_tensor=False)
    with torch.no_grad():  # torch deep-copies the layer: make the two differ so the params must be per layer
        net.layers[1].linear1.weight.mul_(-1)
    model, params, state = interop.convert(net)
    assert list(funcnet.state_dict(params, model=model)) == list(net.state_dict())
    x = torch.randn(2, 3, 8)
    y, _ = nn.call(model, params, state, jnp.asarray(x.numpy()))
    # attention, softmax, two LayerNorms and a feed-forward block in float32: a few 1e-6 add up
    np.testing.assert_allclose(y, net.eval()(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_embedding_converts_with_padding_idx():
    require(["Embedding"])
    torch.manual_seed(8)
    net = tnn.Embedding(10, 4, padding_idx=-1)
    model, params, _ = interop.convert(net)
    idx = torch.tensor([[0, 9, 3]])
    np.testing.assert_array_equal(model.apply(params, jnp.asarray(idx.numpy())), net(idx).detach().numpy())
