"""comparisons/autograd_from_scratch: the verdict passes, and a shifted JAX weight makes it fail."""

import pytest

from comparisons import autograd_from_scratch
from comparisons._core import Options


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_verdict_passes(dtype):
    result = autograd_from_scratch.run(Options(dtype=dtype))
    assert result.name == "autograd_from_scratch"
    assert result.ok, [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    (curves,) = result.series.values()
    assert set(curves) == {"torch.autograd", "jax.grad", "funcnet.autodiff"}
    assert len({len(c) for c in curves.values()}) == 1
    assert "def torch_train" in result.torch.source and "jax.grad" in result.jax.source
    assert "v3 = add(v1, v2)" in result.jax.output


def test_perturbed_jax_weight_fails_the_verdict():
    result = autograd_from_scratch.run(Options(perturb=1e-2))
    failed = result.failed()
    assert not result.ok
    assert "trained parameters: funcnet.autodiff == jax.grad" in failed
    assert "training loss curves: funcnet.autodiff == jax.grad" in failed
    # the torch and funcnet sides are untouched by the JAX-side shift
    assert not any("jax" not in name for name in failed), failed
