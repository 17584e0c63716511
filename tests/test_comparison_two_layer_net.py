"""comparisons/two_layer_net.py: hand-written and nn.Sequential nets train identically in torch and JAX."""

import pytest

from comparisons import two_layer_net
from comparisons._core import Options


def test_all_checks_pass_and_curves_are_reported():
    result = two_layer_net.run()
    assert result.ok, result.report()
    assert result.name == "two_layer_net"
    assert "class TwoLayerNet" in result.torch.source and "torch.clamp" in result.torch.source
    assert "jax.tree.map" in result.jax.source
    (curves,) = result.series.values()
    assert set(curves) == {"torch hand-written", "torch nn.Sequential", "JAX hand-written", "funcnet nn.Sequential"}
    assert all(len(c) == two_layer_net.STEPS for c in curves.values())


def test_a_perturbed_jax_weight_fails_the_curve_checks():
    result = two_layer_net.run(Options(perturb=1e-2))
    assert not result.ok
    failed = result.failed()
    assert "loss curve: JAX hand-written == torch hand-written" in failed, result.report()
    assert "loss curve: funcnet nn.Sequential == torch nn.Sequential" in failed, result.report()
    # the perturbation is on the JAX side only: torch's two forms still agree with each other
    assert "loss curve: torch nn.Sequential == torch hand-written" not in failed


def test_float64_without_x64_is_refused_clearly():
    with pytest.raises(RuntimeError, match="JAX_ENABLE_X64=1"):
        two_layer_net.run(Options(dtype="float64"))
