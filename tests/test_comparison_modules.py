"""comparisons/modules.py: torch nn.Module, funcnet Module and flax nnx agree, and a shifted weight is caught."""

import pytest

from comparisons import modules
from comparisons._core import Options


def test_all_checks_pass():
    result = modules.run()
    assert result.ok, result.report()
    assert result.name == "modules" and result.title == modules.TITLE
    assert "class SimpleModel(tnn.Module)" in result.torch.source and "def mlp_model" in result.jax.source
    assert "class NnxMLP(nnx.Module)" in result.jax.source
    assert result.torch.output and result.jax.output
    assert result.torch.seconds > 0 and result.jax.seconds > 0
    names = {c.name for c in result.checks}
    for needle in ["MLP eval: funcnet apply(train=False) == torch eval()", "MLP eval: nnx eval() == torch eval()",
                   "jax.device_put returns a new pytree on the requested device",
                   "funcnet strict load, wrong hidden size", "torch strict load, wrong hidden size"]:
        assert needle in names


def test_a_perturbed_jax_weight_fails_the_forward_checks():
    result = modules.run(Options(perturb=1e-2))
    assert not result.ok
    failed = result.failed()
    assert "MLP eval: funcnet apply(train=False) == torch eval()" in failed, result.report()
    assert "MLP eval: nnx eval() == torch eval()" in failed, result.report()


def test_float64_without_x64_is_refused_clearly():
    with pytest.raises(RuntimeError, match="JAX_ENABLE_X64=1"):
        modules.run(Options(dtype="float64"))
