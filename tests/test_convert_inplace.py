"""In-place forms in a forward (``x += y``, ``x.add_(...)``, ``x[i] = ...``, ``x[i] += ...``) through
``interop.convert`` and ``interop.to_source``: each is recorded as a change of the tensor, so a
read after it sees the new values and a read from before keeps the old ones, as in torch; reading
an alias of a tensor changed in place is refused (tests/test_convert.py checks that message)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import funcnet  # noqa: E402
from funcnet import interop  # noqa: E402


class InPlace(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 5)

    def forward(self, x, y):
        h = self.lin(x)
        before = h * 1.0  # read before the changes: keeps the old values
        h += y  # Tensor.__iadd__
        h.add_(y, alpha=0.5)  # Tensor.add_
        h *= 2.0  # Tensor.__imul__
        h[:, 0] = y[:, 1]  # Tensor.__setitem__
        h[:, 1:3] += 1.0  # an in-place change of a slice, written back into h
        h.clamp_(min=-1.0)
        g = y.clone()
        g.mul_(h)  # a second tensor changed in place, reading the first's new values
        return h, before, h - before, g


def _inputs(seed, batch):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 4, generator=gen), torch.randn(batch, 5, generator=gen)


@pytest.fixture(scope="module")
def traced():
    torch.manual_seed(0)
    module = InPlace()
    return module, _inputs(0, 3)


def _check(got, module, fresh):
    with torch.no_grad():
        want = module(*fresh)
    assert len(got) == len(want) == 4
    for name, g, w in zip(("h", "before", "h - before", "g"), got, want):
        # float32, one 4-wide matmul and a few element-wise steps: a few ulps of values of size ~3
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-6, atol=1e-6, err_msg=name)
    # the changes moved h away from its first value: a rule that dropped one would show
    assert float((want[0] - want[1]).abs().max()) > 0.5


def test_in_place_changes_are_seen_by_later_reads_in_the_converted_model(traced):
    module, trace = traced
    model, params, state = interop.convert(module, *trace)
    fresh = _inputs(1, 3)
    got = model.apply(params, *(jnp.asarray(t.numpy()) for t in fresh))
    _check(got, module, fresh)


def test_in_place_changes_are_written_by_to_source(traced):
    module, trace = traced
    scope: dict = {}
    exec(compile(interop.to_source(module, *trace), "<port of InPlace>", "exec"), scope)  # noqa: S102
    model = scope["InPlace"]()
    params = funcnet.load_state_dict(jax.eval_shape(model.init, jax.random.key(0)), module.state_dict())
    fresh = _inputs(2, 3)
    _check(model.apply(params, *(jnp.asarray(t.numpy()) for t in fresh)), module, fresh)


class ViewWrite(torch.nn.Module):
    """An in-place op on a slice changes the tensor it views (torchvision's Swin V2 zeroes the
    middle third of its qkv bias so); an op on a copying index (a tensor of indices) does not."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 6)

    def forward(self, x):
        bias = self.lin.bias.clone()
        n = bias.numel() // 3
        bias[n:2 * n].zero_()
        bias[:1].mul_(3.0)
        h = torch.nn.functional.linear(x, self.lin.weight, bias)
        h[:, 4:].clamp_(min=0.0)
        h[torch.tensor([0])].zero_()  # a copy: h unchanged, as in torch
        return h


class ViewWriteAlias(torch.nn.Module):
    def forward(self, x):
        h = x * 1.0
        other = h[:, 1:3]  # a second alias of h's memory
        h[:, 0:2].zero_()
        return other + 1.0


def test_in_place_change_of_a_view_changes_its_base():
    torch.manual_seed(0)
    module = ViewWrite()
    model, params, _ = interop.convert(module, torch.randn(2, 4))
    fresh = torch.randn(3, 4)
    with torch.no_grad():
        want = module(fresh).numpy()
        plain = torch.nn.functional.linear(fresh, module.lin.weight, module.lin.bias).numpy()
    got = np.asarray(model.apply(params, jnp.asarray(fresh.numpy())))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # float32, 4-wide dot products
    assert np.abs(want - plain).max() > 0.1  # the writes changed the output: dropping one would show
    scope: dict = {}
    exec(compile(interop.to_source(module, torch.randn(2, 4)), "<port of ViewWrite>", "exec"), scope)  # noqa: S102
    port = scope["ViewWrite"]()
    port_params = funcnet.load_state_dict(jax.eval_shape(port.init, jax.random.key(0)), module.state_dict())
    np.testing.assert_allclose(np.asarray(port.apply(port_params, jnp.asarray(fresh.numpy()))), want, rtol=1e-6,
                               atol=1e-6)


def test_another_alias_of_a_view_written_in_place_is_still_refused():
    with pytest.raises(interop.ConversionError, match="in-place change through an alias"):
        interop.convert(ViewWriteAlias(), torch.randn(2, 4))
