"""Layers against torch: parameter names/shapes, forward outputs, modes, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import funcnet
from funcnet import interop, nn


def _torch_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def test_state_dict_keys_equal_torch():
    cases = [
        (nn.MLP([784, 128, 10]), _torch_mlp()),
        (nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10, bias=False)),
         torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                             torch.nn.Linear(32, 10, bias=False))),
        (nn.MLP([8, 16, 16, 4], nn.Tanh, dropout=0.1),
         torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 16),
                             torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 4))),
    ]
    for ours, theirs in cases:
        sd = funcnet.state_dict(ours.init(jax.random.key(0)))
        torch_sd = theirs.state_dict()
        assert list(sd) == list(torch_sd)
        assert {k: tuple(v.shape) for k, v in sd.items()} == {k: tuple(v.shape) for k, v in torch_sd.items()}


@pytest.mark.parametrize("activation,torch_activation", [(nn.ReLU, torch.nn.ReLU), (nn.Tanh, torch.nn.Tanh),
                                                         (nn.Sigmoid, torch.nn.Sigmoid)])
def test_mlp_forward_equals_torch(activation, torch_activation):
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(784, 128), torch_activation(), torch.nn.Linear(128, 10))
    model = nn.MLP([784, 128, 10], activation)
    params = interop.from_torch(theirs)
    x = np.random.default_rng(0).random((32, 784), dtype=np.float32)
    out = model.apply(params, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(out), theirs(torch.from_numpy(x)).detach().numpy(), atol=1e-6, rtol=0)


def test_sequential_with_flatten_equals_torch():
    torch.manual_seed(1)
    theirs = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    params = funcnet.load_state_dict(model.init(jax.random.key(0)), theirs.state_dict())
    x = np.random.default_rng(1).random((5, 8, 8), dtype=np.float32)
    np.testing.assert_allclose(np.asarray(model.apply(params, jnp.asarray(x))),
                               theirs(torch.from_numpy(x)).detach().numpy(), atol=1e-6, rtol=0)


LAYERS = [
    ("Linear", nn.Linear(6, 3), (4, 6), (4, 3)),
    ("ReLU", nn.ReLU(), (4, 6), (4, 6)),
    ("Tanh", nn.Tanh(), (4, 6), (4, 6)),
    ("Dropout", nn.Dropout(0.5), (4, 6), (4, 6)),
    ("Flatten", nn.Flatten(), (4, 2, 3), (4, 6)),
    ("Sequential", nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)), (4, 6), (4, 2)),
    ("MLP", nn.MLP([6, 7, 2]), (3, 6), (3, 2)),
]


@pytest.mark.parametrize("name,layer,in_shape,out_shape", LAYERS, ids=[l[0] for l in LAYERS])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_table_shape_and_dtype(name, layer, in_shape, out_shape, dtype):
    params = jax.tree.map(lambda p: p.astype(dtype), layer.init(jax.random.key(0)))
    x = jnp.ones(in_shape, dtype)
    for train, key in ((False, None), (True, jax.random.key(1))):
        y = layer.apply(params, x, key=key, train=train)
        assert y.shape == out_shape
        assert y.dtype == dtype


def test_train_flag_is_static_one_compile_per_value():
    model = nn.MLP([6, 8, 2], dropout=0.5)
    params = model.init(jax.random.key(0))
    traces = []

    def apply(params, x, *, key=None, train=False):
        traces.append(train)
        return model.apply(params, x, key=key, train=train)

    f = jax.jit(apply, static_argnames="train")
    x = jnp.ones((4, 6))
    keys = jax.random.split(jax.random.key(1), 3)
    for i in range(3):
        f(params, x, train=False)
        f(params, x, key=keys[i], train=True)
    assert traces == [False, True]


def test_dropout_statistics_and_modes():
    p = 0.3
    layer = nn.Dropout(p)
    x = jnp.ones((200, 500))
    y = np.asarray(layer.apply({}, x, key=jax.random.key(0), train=True))
    kept = y != 0
    # 100k Bernoulli(0.7) draws: the kept fraction is within 5 sigma of 0.7
    sigma = np.sqrt(p * (1 - p) / y.size)
    assert abs(kept.mean() - (1 - p)) < 5 * sigma
    np.testing.assert_allclose(y[kept], 1 / (1 - p), rtol=1e-6)  # inverted dropout scales survivors
    np.testing.assert_array_equal(np.asarray(layer.apply({}, x, train=False)), np.asarray(x))
    assert np.all(np.asarray(nn.Dropout(1.0).apply({}, x, key=jax.random.key(1), train=True)) == 0)


def test_dropout_in_train_mode_needs_a_key():
    with pytest.raises(ValueError, match=r"Dropout\(p=0.5\) in train mode needs a PRNG key"):
        nn.Dropout(0.5).apply({}, jnp.ones(3), train=True)
    model = nn.MLP([4, 4, 2], dropout=0.5)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        model.apply(model.init(jax.random.key(0)), jnp.ones((1, 4)), train=True)


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match=r"drop probability and must be in \[0, 1\], got 1.5"):
        nn.Dropout(1.5)
    with pytest.raises(ValueError, match="in_features must be a positive int, got 0"):
        nn.Linear(0, 3)
    with pytest.raises(TypeError, match=r"child 1 is function.*nn.ReLU\(\), not nn.ReLU"):
        nn.Sequential(nn.Linear(2, 2), nn.ReLU)
    with pytest.raises(ValueError, match="at least an input and an output"):
        nn.MLP([10])


def test_wrong_input_feature_size_names_shapes():
    model = nn.MLP([784, 128, 10])
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match=r"Linear\(784, 128\): input of shape \(2, 64\) has 64 features.*expected 784"):
        model.apply(params, jnp.ones((2, 64)))
    with pytest.raises(ValueError, match=r"input of shape \(2, 64\)"):
        jax.jit(model.apply)(params, jnp.ones((2, 64)))


def test_debug_key_reuse_is_on():
    # the suite runs with jax_debug_key_reuse, so a reused key fails loudly
    key = jax.random.key(0)
    jax.random.normal(key, (2,))
    with pytest.raises(Exception, match="(?i)reuse"):
        jax.random.normal(key, (2,))
