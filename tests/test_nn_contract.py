"""The module contract: composites, containers, tied parameters and state, against torch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import funcnet
from funcnet import nn, train


def counter():
    """A toy layer with state: counts its calls in train mode (like num_batches_tracked)."""
    def apply(params, x, *, state, key=None, train=False):
        return x, ({"n": state["n"] + 1} if train else state)

    return nn.Module(lambda key: {}, apply, lambda: {"n": jnp.zeros((), jnp.int32)}, name="Counter()")


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(5))
        self.fc1 = torch.nn.Linear(3, 5)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(5, 5) for _ in range(2)])
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(5, 2), "b": torch.nn.Linear(5, 2, bias=False)})

    def forward(self, x):
        h = torch.relu(self.fc1(x)) * self.scale
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.heads["a"](h) - self.heads.b(h)


def Net():
    def forward(self, x):
        h = jax.nn.relu(self.fc1(x)) * self.scale
        for block in self.blocks:
            h = h + jnp.tanh(block(h))
        return self.heads["a"](h) - self.heads.b(h)

    return nn.Composite(forward, scale=nn.Parameter(jnp.zeros(5)), fc1=nn.Linear(3, 5),
                        blocks=nn.ModuleList([nn.Linear(5, 5) for _ in range(2)]),
                        heads=nn.ModuleDict({"a": nn.Linear(5, 2), "b": nn.Linear(5, 2, bias=False)}))


def test_composite_keys_forward_and_gradients_equal_torch():
    torch.manual_seed(0)
    theirs, ours = TorchNet(), Net()
    params = ours.init(jax.random.key(0))
    assert list(funcnet.state_dict(params, model=ours)) == list(theirs.state_dict())
    params = funcnet.load_state_dict(params, theirs.state_dict())
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    out_t = theirs(torch.from_numpy(x))
    out_t.sum().backward()
    np.testing.assert_allclose(ours.apply(params, jnp.asarray(x)), out_t.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads = funcnet.state_dict(jax.grad(lambda p: ours.apply(p, jnp.asarray(x)).sum())(params))
    for k, p in theirs.named_parameters():
        np.testing.assert_allclose(grads[k], p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


def test_tied_parameter_is_one_array_listed_under_both_keys():
    torch.manual_seed(0)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.lm_head = torch.nn.Linear(3, 5, bias=False), torch.nn.Linear(3, 5, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, x):
            return self.lm_head(torch.tanh(self.wte(x) @ self.wte.weight))

    def forward(self, x):
        return self.lm_head(jnp.tanh(self.wte(x) @ self.wte.params["weight"]))

    theirs = Tied()
    ours = nn.Composite(forward, wte=nn.Linear(3, 5, bias=False), lm_head=nn.Linear(3, 5, bias=False),
                        tied={"lm_head.weight": "wte.weight"})
    params = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict())
    assert list(funcnet.state_dict(params, model=ours)) == list(theirs.state_dict()) == ["wte.weight", "lm_head.weight"]
    assert len(jax.tree.leaves(params)) == 1  # one array: an optimizer updates it once
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    theirs(torch.from_numpy(x)).sum().backward()
    grads = jax.grad(lambda p: ours.apply(p, jnp.asarray(x)).sum())(params)
    np.testing.assert_allclose(grads["wte"]["weight"], theirs.wte.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    # a state dict whose two tied keys disagree is refused
    bad = dict(theirs.state_dict())
    bad["lm_head.weight"] = bad["lm_head.weight"] + 1
    with pytest.raises(funcnet.StateDictError, match="tied to wte.weight"):
        funcnet.load_state_dict(params, bad)


def test_state_is_threaded_returned_and_never_trained():
    def forward(self, x):
        return self.c2(self.fc(self.c1(x)))

    model = nn.Composite(forward, c1=counter(), fc=nn.Linear(2, 2), c2=counter())
    assert model.has_state
    params, state = model.init(jax.random.key(0)), model.init_state()
    x = jnp.ones((3, 2))
    y, new = model.apply(params, x, state=state, train=True)
    assert int(new["c1"]["n"]) == 1 and int(new["c2"]["n"]) == 1 and int(state["c1"]["n"]) == 0
    _, same = model.apply(params, x, state=new, train=False)
    assert int(same["c1"]["n"]) == 1
    assert list(funcnet.state_dict(params, state, model=model)) == ["c1.n", "fc.weight", "fc.bias", "c2.n"]
    # through the training loop: the optimizer sees params only; the state advances per step
    tx = optax.adamw(0.1, weight_decay=0.5)
    step = train.make_step(model, tx, funcnet.losses.mse_loss)
    ts = train.create_train_state(model, tx, jax.random.key(1))
    for _ in range(3):
        ts, metrics = step(ts, (x, jnp.zeros((3, 2))))
    assert int(ts.model_state["c1"]["n"]) == 3 and set(metrics) == {"loss"}


def test_stateful_sequential_and_clear_errors():
    model = nn.Sequential(nn.Linear(2, 2), counter(), nn.ReLU())
    params = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match="keeps state"):
        model.apply(params, jnp.ones((1, 2)))
    with pytest.raises(ValueError, match="state does not match"):
        model.apply(params, jnp.ones((1, 2)), state={})
    with pytest.raises(ValueError, match="flat state_dict"):
        model.apply(funcnet.state_dict(params), jnp.ones((1, 2)), state=model.init_state())
    with pytest.raises(TypeError, match="swapped"):
        nn.Linear(2, 2).apply  # leaf layers read params directly
        nn.Sequential(nn.Linear(2, 2)).apply(jnp.ones((1, 2)), params)
    y, state = model.apply(params, jnp.ones((1, 2)), state=model.init_state(), train=True)
    assert int(state["1"]["n"]) == 1


def test_building_a_model_does_not_start_the_backend():
    import subprocess
    import sys
    code = ("import jax, funcnet; from funcnet import nn; "
            "m = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)); "
            "jax.config.update('jax_num_cpu_devices', 3); print(len(jax.devices()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    assert out.stdout.strip() == "3"
