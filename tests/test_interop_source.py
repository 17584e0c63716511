"""interop.to_source and `funcnet port`: the written source of every zoo model executes, loads
torch's state_dict strictly, matches torch's eval forward, passes ruff, and is no longer than
the torch model's source give or take 20%."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(__file__))

from convert_check import to_jax, tree_rel  # noqa: E402
from convert_zoo import ZOO, channel_shuffle  # noqa: E402

import funcnet  # noqa: E402
from funcnet import interop, nn  # noqa: E402
from funcnet.cli import main  # noqa: E402

# module-level functions a zoo model's forward calls: part of the torch model's source
HELPERS = {"shuffle_unit": [channel_shuffle]}
# a forward whose eval output is random (the VAE draws its noise in eval too): loaded, not compared
RANDOM_EVAL = {"vae"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def _torch_lines(module, name: str) -> int:
    classes = {type(m) for m in module.modules() if not type(m).__module__.startswith("torch.")}
    return sum(_lines(inspect.getsource(c)) for c in classes) + sum(_lines(inspect.getsource(f))
                                                                   for f in HELPERS.get(name, []))


_WRITTEN: dict = {}


def _written(name: str):
    if name not in _WRITTEN:
        module, args, kwargs = ZOO[name]()
        _WRITTEN[name] = (module, args, kwargs, interop.to_source(module, *args, **kwargs))
    return _WRITTEN[name]


def _load(source: str, module):
    """The model the source builds, with torch's weights loaded strictly."""
    scope: dict = {}
    exec(compile(source, f"<port of {type(module).__name__}>", "exec"), scope)
    model = scope[type(module).__name__]()
    params = jax.eval_shape(model.init, jax.random.key(0))  # the template: structure, shapes, dtypes
    if model.has_state:
        state = jax.eval_shape(lambda: nn.initial_state(model))
        return model, *funcnet.load_state_dict(params, module.state_dict(), state=state)
    return model, funcnet.load_state_dict(params, module.state_dict()), None


def _call(model, params, state, *args, train=False, key=None, **kwargs):
    """``nn.call`` compiled as one program (op by op, each first call compiles on its own)."""
    return jax.jit(lambda p, s, a, k, key: nn.call(model, p, s, *a, train=train, key=key, **k))(
        params, state, args, kwargs, key)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_source_loads_strictly_and_matches_torch(name):
    module, args, kwargs, source = _written(name)
    model, params, state = _load(source, module)
    assert list(funcnet.state_dict(params, state, model=model)) == list(module.state_dict())  # torch's keys, in order
    ours, theirs = _lines(source), _torch_lines(module, name)
    print(f"{name}: {ours} lines written, {theirs} in torch")
    assert ours <= 1.2 * theirs, f"{name}: {ours} lines written for {theirs} of torch\n{source}"
    if name in RANDOM_EVAL:
        return
    module.eval()
    with torch.no_grad():
        want = module(*args, **kwargs)
    got, _ = _call(model, params, state, *to_jax(args), **to_jax(kwargs))
    assert tree_rel(got, want) < 1e-5


def test_sources_pass_ruff(tmp_path):
    for name in sorted(ZOO):
        (tmp_path / f"{name}.py").write_text(_written(name)[3])
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(tmp_path)], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_reads_like_the_torch_code():
    source = _written("resnet")[3]
    # one function per class; the blocks' differences are arguments, the optional child a branch
    assert source.count("def BasicBlock(") == 1 and "def ResNet():" in source
    assert "if self.downsample is not None:" in source and "downsample=None" in source
    assert "stride=2" in source and "BasicBlock(4, 8, stride=2" in source
    gpt = _written("gpt")[3]
    assert "for block in self.transformer.h:\n            x = block(x)" in gpt
    assert "B, T, C = x.shape" in gpt and "tied={'lm_head.weight': 'transformer.wte.weight'}" in gpt
    assert "_v" not in gpt and "node" not in gpt
    running = _written("running_center")[3]
    assert "if self.training:" in running and "self.calls = self.calls + 1" in running


ZOO_FILE = os.path.join(ROOT, "tests", "convert_zoo.py")


def test_port_command_writes_source_and_weights(tmp_path):
    out, weights = tmp_path / "resnet_port.py", tmp_path / "resnet.safetensors"
    done = subprocess.run([sys.executable, "-m", "funcnet.cli", "port", f"{ZOO_FILE}:ResNet", "--kwargs",
                           '{"classes": 3}', "--input-shape", "2,3,8,8", "--out", str(out), "--weights",
                           str(weights)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    from safetensors.torch import load_file

    from convert_zoo import ResNet

    module = ResNet(classes=3)
    module.load_state_dict(load_file(weights))  # strict: every key, torch's names and shapes
    model, params, state = _load(out.read_text(), module)
    x = torch.randn(2, 3, 8, 8)
    module.eval()
    with torch.no_grad():
        want = module(x).numpy()
    got, _ = _call(model, params, state, jax.numpy.asarray(x.numpy()))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["nowhere.py:Net", "--input-shape", "1,3"], "nowhere.py: no such file"),
    ([f"{ZOO_FILE}:Nope", "--input-shape", "1,3"], "has no class 'Nope'; the torch.nn.Module classes it defines"),
    ([ZOO_FILE, "--input-shape", "1,3"], "expected FILE.py:Class"),
    ([f"{ZOO_FILE}:ResNet", "--args", "[1,", "--input-shape", "1,3"], "--args '[1,' is not valid JSON"),
    ([f"{ZOO_FILE}:ResNet", "--kwargs", "[1]", "--input-shape", "1,3"], "expected a JSON object"),
    ([f"{ZOO_FILE}:ResNet", "--input-shape", "1,x"], "--input-shape '1,x': expected positive integers"),
    ([f"{ZOO_FILE}:ResNet"], "no --input-shape"),
    ([f"{ZOO_FILE}:ResNet", "--kwargs", '{"depth": 2}', "--input-shape", "2,3,8,8"], "pass --args/--kwargs"),
    ([f"{ZOO_FILE}:ResNet", "--input-shape", "2,3"], "the example inputs were --input-shape 2,3: pass the shapes"),
])
def test_port_bad_input(argv, message, tmp_path, capsys):
    out = tmp_path / "port.py"
    out.write_text("# kept\n")
    assert main(["port", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert out.read_text() == "# kept\n"  # a failed run leaves the old file as it was


class _Norm(torch.nn.Module):
    """nanoGPT's LayerNorm: a bias that is a Parameter or None."""

    def __init__(self, d, bias):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(d))
        self.bias = torch.nn.Parameter(torch.randn(d)) if bias else None

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class _Mixed(torch.nn.Module):
    """An indexed ModuleList, a named Sequential called twice, a descendant's weight, an in-place
    write into a copy, a class used with and without a child, a functional batch norm on own buffers."""

    def __init__(self):
        super().__init__()
        import collections

        self.emb = torch.nn.Embedding(10, 4)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])
        self.head = torch.nn.Sequential(collections.OrderedDict(fc=torch.nn.Linear(4, 4), act=torch.nn.Tanh()))
        self.norms = torch.nn.ModuleList([_Norm(4, True), _Norm(4, False)])
        self.register_buffer("rm", torch.zeros(4))
        self.register_buffer("rv", torch.ones(4))

    def forward(self, idx):
        x = self.emb(idx)
        x = self.layers[0](x) + self.layers[2](x)
        h = self.head(self.head(x))
        h = self.norms[0](h) + self.norms[1](h)
        h = torch.nn.functional.batch_norm(h.flatten(0, 1), self.rm, self.rv, None, None, self.training, 0.1)
        logits = h @ self.emb.weight.t()
        out = logits.clone()
        out[:, 0] = 1.0
        return out


def test_general_forms_execute_and_match():
    torch.manual_seed(0)
    module, idx = _Mixed(), torch.randint(0, 10, (2, 3))
    source = interop.to_source(module, idx)
    for text in ("def _Norm(bias):", "if self.bias is not None:", "self.layers[2](x)",
                 "NamedSequential(fc=nn.Linear(4, 4), act=nn.Tanh())", "self.emb.params['weight']",
                 "out = logits.at[:, 0].set(1.0)", "self.rm = rm"):
        assert text in source, (text, source)
    model, params, state = _load(source, module)
    converted = interop.convert(module, idx)
    x = jax.numpy.asarray(idx.numpy())
    for train in (False, True):
        module.train(train)
        with torch.no_grad():
            want = module(idx)
        got, new_state = _call(model, params, state, x, train=train)
        # train: batch statistics of 6 rows after a layer norm amplify float32 rounding (convert's model too)
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-4 if train else 1e-6)
        # the written model is convert's model
        np.testing.assert_array_equal(np.asarray(got), np.asarray(_call(*converted, x, train=train)[0]))
    np.testing.assert_allclose(np.asarray(new_state["rm"]), module.rm.numpy(), rtol=1e-5, atol=1e-6)


class _Attn(torch.nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.qkv, self.n_head = torch.nn.Linear(d, 3 * d), n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        return ((q @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)


def test_instances_differing_in_constants_share_one_function():
    torch.manual_seed(0)
    module = torch.nn.Sequential(_Attn(8, 2), _Attn(8, 4), _Attn(8, 2))
    x = torch.randn(2, 3, 8)
    source = interop.to_source(module, x)
    assert "def _Attn(n_head):" in source and "C // n_head" in source and "_Attn(4)" in source, source
    model, params, state = _load(source, module)
    module.eval()
    with torch.no_grad():
        want = module(x).numpy()
    got, _ = _call(model, params, state, jax.numpy.asarray(x.numpy()))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["mnist_net"])
def test_train_mode_draws_as_convert_does(name):
    """With dropout on, the written model and convert's draw the same masks from the same key:
    the statements keep the recorded order of random calls."""
    module, args, kwargs = ZOO[name](0.2)
    model, params, state = _load(interop.to_source(module, *args, **kwargs), module)
    converted = interop.convert(module, *args, **kwargs)
    ours = _call(model, params, state, *to_jax(args), train=True, key=jax.random.key(1), **to_jax(kwargs))[0]
    theirs = _call(*converted, *to_jax(args), train=True, key=jax.random.key(1), **to_jax(kwargs))[0]
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


class _Act(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.lin, self.kinds = torch.nn.Linear(4, 4), [kind]  # a list: no attribute tells the forms apart

    def forward(self, x):
        return torch.relu(self.lin(x)) if self.kinds[0] == "relu" else torch.tanh(self.lin(x)) * 2


def test_forms_nothing_tells_apart_are_separate_functions():
    torch.manual_seed(0)
    root = torch.nn.Sequential(_Act("relu"), _Act("tanh"), _Act("relu"))
    source = interop.to_source(root, torch.randn(2, 4))
    assert "# _Act's instances trace to different forwards" in source and "def _Act_2():" in source, source
    model, params, state = _load(source, root)
    x = torch.randn(2, 4)
    with torch.no_grad():
        want = root(x).numpy()
    np.testing.assert_allclose(np.asarray(_call(model, params, state, jax.numpy.asarray(x.numpy()))[0]), want,
                               rtol=1e-5, atol=1e-6)


def test_an_untraced_optional_argument_path_raises_clearly_in_the_written_source():
    import jax.numpy as jnp

    import funcnet

    module, args, kwargs = ZOO["gpt"]()  # traced with targets given
    namespace: dict = {}
    exec(interop.to_source(module, *args, **kwargs), namespace)
    model = namespace["GPT"]()
    params, state = funcnet.load_state_dict(model.init(jax.random.key(0)), module.state_dict(),
                                            state=model.init_state())
    with pytest.raises(ValueError, match="this path was not traced .traced with targets given"):
        model.apply(params, jnp.asarray(args[0].numpy()), state=state)
