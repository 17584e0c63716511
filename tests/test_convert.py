"""interop.convert on models with their own forward: the zoo against torch, randomness, refusals."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn
TF = torch.nn.functional

sys.path.insert(0, os.path.dirname(__file__))
from convert_zoo import ZOO  # noqa: E402

from funcnet import interop, nn  # noqa: E402
from funcnet.interop import ConversionError  # noqa: E402

HERE = os.path.dirname(__file__)


def _zoo(dtype: str) -> dict:
    """Every zoo model through the oracle in one fresh process (tests/convert_check.py): XLA's
    backend at optimization level 0 compiles the 16 training steps in about half the time (it
    skips LLVM's optimizations, not IEEE semantics)."""
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0",
               JAX_ENABLE_X64="1" if dtype == "float64" else "0")
    run = subprocess.run([sys.executable, os.path.join(HERE, "convert_check.py"), dtype], env=env,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    errors = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(errors) == set(ZOO)
    return errors


def test_zoo_matches_torch_in_float32():
    # the forward in eval (on the tracing input and on a fresh one) and train, the loss, the gradients,
    # 3 SGD steps, the buffers after them
    bad = {}
    for name, err in _zoo("float32").items():
        limits = {"eval": 1e-5, "fresh": 1e-5, "train": 1e-5, "loss": 1e-5, "grads": 5e-5, "params_after": 5e-5,
                  "keys": 0.0, "state_after": 0.0}
        over = {k: v for k, v in err.items() if v > limits[k]}
        if over:
            bad[name] = over
    assert not bad, bad


def test_zoo_matches_torch_in_float64():
    bad = {name: err for name, err in _zoo("float64").items() if max(err.values()) >= 1e-10}
    assert not bad, bad


def test_converted_model_is_not_tied_to_the_example_batch():
    module, args, _ = ZOO["gpt_flash"]()
    model, params, state = interop.convert(module, *args)
    idx = torch.randint(0, 24, (3, 5))  # another batch size and length: sizes are read off the input
    module.eval()
    with torch.no_grad():
        want = module(idx)[0]
    got = model.apply(params, jnp.asarray(idx.numpy()))[0]
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)


def test_random_ops_draw_from_the_key():
    module, args, kwargs = ZOO["vae"]()
    model, params, state = interop.convert(module, *args)
    x = jnp.asarray(args[0].numpy())
    a = model.apply(params, x, key=jax.random.key(1))[0]
    b = model.apply(params, x, key=jax.random.key(1))[0]
    c = model.apply(params, x, key=jax.random.key(2))[0]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    with pytest.raises(ValueError, match="key"):
        model.apply(params, x)  # randn_like needs a key, in eval too (torch's VAE samples in eval)


def test_dropout_follows_train_flag():
    module, args, _ = ZOO["mnist_net"](p=0.5)
    model, params, _ = interop.convert(module, *args)
    x = jnp.asarray(args[0].numpy())
    module.eval()
    with torch.no_grad():
        want = module(*args).numpy()
    np.testing.assert_allclose(model.apply(params, x), want, rtol=1e-5, atol=1e-6)
    t1 = model.apply(params, x, train=True, key=jax.random.key(0))
    t2 = model.apply(params, x, train=True, key=jax.random.key(1))
    assert not np.allclose(t1, want) and not np.allclose(t1, t2)


def test_forward_that_sets_its_buffers_returns_them_as_state():
    module, args, _ = ZOO["running_center"]()
    model, params, state = interop.convert(module, *args)
    x = jnp.asarray(args[0].numpy())
    _, new = nn.call(model, params, state, x, train=True)
    module.train()
    module(*args)
    np.testing.assert_allclose(new["running_mean"], module.running_mean.numpy(), rtol=1e-6)
    assert int(new["calls"]) == 1
    _, same = nn.call(model, params, state, x, train=False)  # the eval branch leaves them alone
    np.testing.assert_array_equal(same["running_mean"], state["running_mean"])


# ---- refusals: every problem at once, each with its module path, the op and the user's line

class _DataBranch(tnn.Module):
    def __init__(self):
        super().__init__()
        self.lin = tnn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:  # a branch on data
            y = -y
        return y


class _Unsupported(tnn.Module):
    def forward(self, x):
        return torch.nonzero(x)  # a data-dependent shape


class _Aliasing(tnn.Module):
    def forward(self, x):
        x = x * 2
        flat = x.view(-1)
        flat.add_(1)  # changes x through its view
        return x


class _Outer(tnn.Module):
    def __init__(self):
        super().__init__()
        self.branch = _DataBranch()
        self.other = _Unsupported()
        self.alias = _Aliasing()

    def forward(self, x):
        return self.branch(x), self.other(x), self.alias(x)


def _line(cls, text):
    import inspect

    lines, start = inspect.getsourcelines(cls.forward)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_refusals_list_every_problem_with_path_op_and_line():
    with pytest.raises(ConversionError) as info:
        interop.convert(_Outer(), torch.randn(2, 3))
    message = str(info.value)
    lines = message.splitlines()[1:]
    assert len(lines) == 3, message
    me = os.path.abspath(__file__)
    branch = next(line for line in lines if line.strip().startswith("branch:"))
    assert "Tensor.__bool__" in branch and f"{me}:{_line(_DataBranch, 'y.sum() > 0')}" in branch
    assert "torch.where" in branch  # the fix
    other = next(line for line in lines if line.strip().startswith("other:"))
    assert "nonzero" in other and f"{me}:{_line(_Unsupported, 'nonzero')}" in other
    alias = next(line for line in lines if line.strip().startswith("alias:"))
    assert "in-place" in alias and f"{me}:{_line(_Aliasing, 'flat.add_(1)')}" in alias


def test_refuses_an_op_with_no_jax_form():
    class Odd(tnn.Module):
        def forward(self, x):
            return torch.linalg.svdvals(x)  # not in the op table

    with pytest.raises(ConversionError, match=r"<root>: torch\.linalg\.svdvals|<root>: .*svdvals"):
        interop.convert(Odd(), torch.randn(3, 3))


def test_without_example_inputs_a_forward_of_python_code_asks_for_them():
    with pytest.raises(ConversionError, match=r"pass example inputs, convert\(module, x\), to convert it by tracing"):
        interop.convert(ZOO["resnet"]()[0])
