"""interop.convert on what libraries write around the math: static checks and device properties
evaluated while tracing, ops that return their input unchanged (not an in-place change), eval-only
conversion, and every failure as a ConversionError (the model's own, or funcnet's said as such)."""

import inspect
import os

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn

from funcnet import interop, nn  # noqa: E402
from funcnet.interop import ConversionError  # noqa: E402

ME = os.path.abspath(__file__)


def _line(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _fresh_match(module, model, params, x):
    module.eval()
    with torch.no_grad():
        want = module(x).numpy()
    got = np.asarray(model.apply(params, jnp.asarray(x.numpy())))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # a Linear of 4 terms in float32


class Checked(tnn.Module):
    """timm's PatchEmbed and DCGAN's device test: checks on sizes and devices, then the math."""

    def __init__(self, width=4):
        super().__init__()
        self.width, self.lin = width, tnn.Linear(4, 4)

    def forward(self, x):
        torch._assert(x.shape[-1] == self.width, f"input width ({x.shape[-1]}) doesn't match {self.width}")
        torch._check(x.shape[-1] == self.width)
        if x.is_cuda or x.is_xpu or x.is_mps:
            x = x * 2
        return self.lin(x)


class Cast(tnn.Module):
    """T5's RMSNorm: ``.to`` of a float32 tensor's own dtype returns that very tensor."""

    def forward(self, x):
        h = x.to(torch.float32).contiguous().float()
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


class UsesInputAfter(tnn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.lin = Cast(), tnn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.norm(x)) + x  # x read again after the child's no-op casts of it


def test_static_checks_and_device_properties_are_evaluated_while_tracing():
    torch.manual_seed(0)
    module = Checked()
    model, params, _ = interop.convert(module, torch.randn(2, 4))
    _fresh_match(module, model, params, torch.randn(5, 4))


def test_a_failing_static_check_is_the_models_own_error_with_its_line():
    module = Checked(width=3)
    with pytest.raises(ConversionError) as info:
        interop.convert(module, torch.randn(2, 4))
    message = str(info.value)
    assert "input width (4) doesn't match 3" in message, message
    assert f"{ME}:{_line(Checked.forward, 'torch._assert')}" in message, message
    assert f"{ME}:{_line(Checked.forward, 'torch._check')}" in message, message  # the next check, which raises


def test_an_op_returning_its_input_is_not_an_in_place_change():
    torch.manual_seed(0)
    module = UsesInputAfter()
    model, params, _ = interop.convert(module, torch.randn(2, 4))
    _fresh_match(module, model, params, torch.randn(3, 4))


class LayerDrop(tnn.Module):
    """Wav2Vec2's LayerDrop: in train mode a layer is skipped on a random draw, a branch on data."""

    def __init__(self):
        super().__init__()
        self.layers = tnn.ModuleList([tnn.Linear(4, 4), tnn.Linear(4, 4)])

    def forward(self, x):
        for layer in self.layers:
            if self.training and torch.rand([]) < 0.1:
                continue
            x = torch.tanh(layer(x))
        return x


def test_eval_only_conversion_never_runs_the_train_path():
    torch.manual_seed(0)
    module = LayerDrop()
    with pytest.raises(ConversionError, match="Tensor.__bool__"):
        interop.convert(module, torch.randn(2, 4))  # both modes: the train branch is on data
    model, params, state = interop.convert(module, torch.randn(2, 4), train=False)
    _fresh_match(module, model, params, torch.randn(3, 4))
    with pytest.raises(ValueError, match="not called in train mode"):
        nn.call(model, params, state, jnp.ones((2, 4)), train=True)


class TrainOnly(tnn.Module):
    def __init__(self):
        super().__init__()
        self.lin = tnn.Linear(4, 4)

    def forward(self, x):
        if self.training:
            raise RuntimeError("targets are required in training")
        return self.lin(x)


class Holder(tnn.Module):
    def __init__(self):
        super().__init__()
        self.inner = TrainOnly()

    def forward(self, x):
        return self.inner(x)


def test_an_exception_of_the_model_names_module_mode_line_and_the_way_out():
    with pytest.raises(ConversionError) as info:
        interop.convert(Holder(), torch.randn(2, 4))
    message = str(info.value)
    assert "RuntimeError: targets are required in training" in message and "inner in train mode" in message, message
    assert f"{ME}:{_line(TrainOnly.forward, 'raise RuntimeError')}" in message, message
    assert "train=False" in message and "funcnet bug" not in message
    model, params, _ = interop.convert(Holder(), torch.randn(2, 4), train=False)  # the way out it names
    assert np.asarray(model.apply(params, jnp.ones((1, 4)))).shape == (1, 4)


def test_to_source_says_an_exception_of_the_model_as_convert_does():
    with pytest.raises(ConversionError) as info:
        interop.to_source(Holder(), torch.randn(2, 4))
    message = str(info.value)
    assert message.startswith("to_source: the torch forward raised RuntimeError: targets are required"), message
    assert "inner in train mode" in message and f"{ME}:{_line(TrainOnly.forward, 'raise RuntimeError')}" in message
    assert "funcnet bug" not in message


def test_an_internal_error_says_it_is_a_funcnet_bug(monkeypatch):
    from funcnet.interop.trace import modules, record as trace

    # a recorder helper called wrongly inside funcnet (a function of two arguments given one): a bug of ours
    monkeypatch.setattr(trace, "structure", modules._get)
    with pytest.raises(ConversionError, match=r"internal error .*TypeError.*funcnet bug: please report it"):
        interop.convert(UsesInputAfter(), torch.randn(2, 4))


def test_a_torch_error_inside_a_layer_is_the_models_not_a_funcnet_bug():
    # Linear(4, 4) fed 3 features: torch raises inside the call the recorder passes on
    with pytest.raises(ConversionError) as info:
        interop.convert(Holder(), torch.randn(2, 3), train=False)
    message = str(info.value)
    assert "torch forward raised RuntimeError" in message and "funcnet bug" not in message, message
    assert "inner.lin in eval mode" in message, message  # the layer that raised, by its path


class WeightNormed(tnn.Module):
    """torch.nn.utils.parametrizations.weight_norm (Wav2Vec2's positional conv), and x[mask] = 0 on a bool mask."""

    def __init__(self):
        super().__init__()
        self.conv = tnn.utils.parametrizations.weight_norm(tnn.Conv1d(3, 4, 3, padding=1), dim=2)

    def forward(self, x):
        y = self.conv(x)
        y[y < -0.5] = 0.0  # the mask's shape, not its count, decides: a where
        return y


def test_a_weight_normed_layer_keeps_torchs_keys_and_matches_on_a_fresh_input():
    import jax

    import funcnet

    torch.manual_seed(0)
    module = WeightNormed()
    model, params, _ = interop.convert(module, torch.randn(2, 3, 5))
    assert set(funcnet.state_dict(params)) == set(module.state_dict()) == {
        "conv.bias", "conv.parametrizations.weight.original0", "conv.parametrizations.weight.original1"}
    x = torch.randn(3, 3, 7, generator=torch.Generator().manual_seed(1))  # another batch and length
    twin = WeightNormed().double()
    twin.load_state_dict(module.state_dict())
    want = twin(x.double())
    want.pow(2).sum().backward()
    got = model.apply(params, jnp.asarray(x.numpy()))
    eps = float(np.finfo(np.float32).eps)
    # a 9-term conv of a weight normalized over 12 values: 32 eps per term of the output's scale
    assert np.max(np.abs(np.asarray(got, np.float64) - want.detach().numpy())) <= 32 * eps * 21 * float(
        want.abs().max())
    grads = funcnet.state_dict(jax.grad(lambda p: jnp.sum(model.apply(p, jnp.asarray(x.numpy())) ** 2))(params))
    theirs = {k: p.grad.numpy() for k, p in twin.named_parameters()}
    scale = max(float(np.abs(g).max()) for g in theirs.values())
    for k, g in theirs.items():  # each sums 3 x 7 outputs' contributions of those 21 terms
        assert np.max(np.abs(np.asarray(grads[k], np.float64) - g)) <= 32 * eps * 21 * 21 * scale, k
    source = interop.to_source(module, torch.randn(2, 3, 5))
    assert "ops.weight_norm(" in source and "ops.masked_set(" in source, source
