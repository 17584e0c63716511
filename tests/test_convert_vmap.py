"""torch.vmap inside a forward, recorded as jax.vmap of its body: in_dims and out_dims as torch's
(None for an unmapped argument, a mapped axis other than 0), a tensor of the forward the body
reads (unbatched), a parameter, a nested vmap; compared with torch in float64 on a fresh input
(another batch size), forward and gradients, and the same through to_source's written module
(which passes ruff)."""

import inspect
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn

import funcnet  # noqa: E402
from funcnet import interop, nn  # noqa: E402
from funcnet.interop import ConversionError  # noqa: E402

try:
    from transformers import masking_utils as masking
except ImportError:
    masking = None

ME = os.path.abspath(__file__)
EPS = float(np.finfo(np.float32).eps)


class Vectorized(tnn.Module):
    def __init__(self):
        super().__init__()
        self.lin = tnn.Linear(4, 4)
        self.scale = tnn.Parameter(torch.randn(4))

    def forward(self, x):
        h = self.lin(x)
        center = h.mean(0)  # read inside the body: the forward's value, not mapped
        y = torch.vmap(lambda row, s: row * row.sum() + center * self.scale * s, in_dims=(0, None))(h, 2.0)
        # nested: the outer maps axis 1 of both, the inner axis 0 of what is left; the output's mapped axis is 1
        return torch.vmap(torch.vmap(lambda a, b: a * b.tanh()), in_dims=(1, 1), out_dims=1)(y, h)


@pytest.fixture(scope="module")
def converted():
    torch.manual_seed(0)
    module = Vectorized()
    model, params, _ = interop.convert(module, torch.randn(2, 4))
    return module, model, params


def _oracle(module, x):
    """torch in float64 on the float32 weights: the value and every parameter's gradient of sum(y**2)."""
    twin = Vectorized().double()
    twin.load_state_dict(module.state_dict())
    y = twin(x.double())
    y.pow(2).sum().backward()
    return y.detach().numpy(), {k: p.grad.numpy() for k, p in twin.named_parameters()}


def _compare(model, params, x, want, want_grads):
    # float32: a 4-term Linear, a 4-term sum and a few products per value, so a few ulps of the largest value
    # (32 eps per term of the longest reduction is the bound the torch oracle tests use); the gradient of
    # sum(y**2) sums 5 x 4 such products per entry
    got = jax.jit(model.apply)(params, jnp.asarray(x.numpy()))
    assert np.max(np.abs(np.asarray(got, np.float64) - want)) <= 32 * EPS * 4 * np.max(np.abs(want))
    grads = funcnet.state_dict(jax.jit(jax.grad(lambda p, x: jnp.sum(model.apply(p, x) ** 2)))(
        params, jnp.asarray(x.numpy())))
    scale = max(np.max(np.abs(g)) for g in want_grads.values())
    for k, g in want_grads.items():
        assert np.max(np.abs(np.asarray(grads[k], np.float64) - g)) <= 32 * EPS * 20 * scale, k


def test_torch_vmap_in_a_forward_converts_and_matches_torch_on_a_fresh_input(converted):
    module, model, params = converted
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))  # traced on a batch of 2
    _compare(model, params, x, *_oracle(module, x))


def test_to_source_writes_jax_vmap_and_the_written_module_matches_torch(converted, tmp_path):
    module, _, _ = converted
    source = interop.to_source(module, torch.randn(2, 4))
    assert "jax.vmap(vmapped, in_axes=(0, None, None), out_axes=0)(h, 2.0, center)" in source, source
    assert "in_axes=(1, 1), out_axes=1" in source, source
    written = tmp_path / "vectorized.py"
    written.write_text(source)
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(written)], capture_output=True,
                          text=True, cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    scope: dict = {}
    exec(compile(source, "<port of Vectorized>", "exec"), scope)
    model = scope["Vectorized"]()
    params = funcnet.load_state_dict(jax.eval_shape(model.init, jax.random.key(0)), module.state_dict())
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    _compare(model, params, x, *_oracle(module, x))
    assert not model.has_state and isinstance(model, nn.Module)


class ReadsAValue(tnn.Module):
    def forward(self, x):
        return torch.vmap(lambda row: row * float(row.sum()))(x)


def test_what_torch_vmap_itself_refuses_is_the_models_error_with_its_line():
    with pytest.raises(ConversionError) as info:
        interop.convert(ReadsAValue(), torch.randn(2, 4))
    message = str(info.value)
    lines, start = inspect.getsourcelines(ReadsAValue.forward)
    assert "torch forward raised RuntimeError: vmap: It looks like you're calling .item()" in message, message
    assert f"{ME}:{start + 1}" in message and "funcnet bug" not in message, message
    assert torch.vmap.__module__.startswith("torch")  # torch's own vmap is back after recording


class SlidingMask(tnn.Module):
    """transformers' vmapped mask builder (sdpa_mask with use_vmap=True, as for a custom and_mask_function):
    four nested torch.vmap over (batch, head, query, key), the padding mask read as padding[b, kv] inside."""

    def forward(self, x, attention_mask):
        m = masking
        b, t = attention_mask.shape
        mask = m.sdpa_mask(batch_size=b, q_length=t, kv_length=t, attention_mask=attention_mask, use_vmap=True,
                           mask_function=m.and_masks(m.causal_mask_function, m.sliding_window_overlay(3)),
                           allow_is_causal_skip=False)
        return torch.where(mask, x[:, None, None, :], 0.0)


def test_transformers_vmapped_mask_builder_converts_and_matches_torch_on_a_fresh_input():
    if masking is None:
        pytest.skip("transformers is not installed")
    padding = torch.ones(2, 5, dtype=torch.bool)
    padding[0, -2:] = False
    module = SlidingMask()
    model, params, _ = interop.convert(module, torch.randn(2, 5), padding)
    x, fresh = torch.randn(3, 7, generator=torch.Generator().manual_seed(5)), torch.ones(3, 7, dtype=torch.bool)
    fresh[2, -3:] = False  # padding in another row, another batch size and length
    want = module(x, fresh)
    assert not bool(want[2, 0, 6, 6]) and bool(want[1, 0, 6, 6]) and not bool(want[1, 0, 6, 0])  # padded, window
    got = jax.jit(model.apply)(params, jnp.asarray(x.numpy()), jnp.asarray(fresh.numpy()))
    np.testing.assert_array_equal(np.asarray(got), want.numpy())  # a selection: exact
