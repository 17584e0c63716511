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
