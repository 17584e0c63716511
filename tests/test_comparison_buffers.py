"""comparisons/buffers.py: torch mutates BatchNorm's buffers, funcnet returns them; both agree."""

import jax
import pytest

from comparisons import buffers
from comparisons._core import Options


def test_all_checks_pass():
    result = buffers.run()
    assert result.ok, result.report()
    names = {c.name for c in result.checks}
    assert "torch: the running_mean tensor held before forward was mutated in place" in names
    assert "the gradient tree has no buffer entries" in names
    assert "def torch_buffers" in result.torch.source and "state=state, train=True" in result.jax.source


@pytest.mark.slow  # a float64 rerun: the float32 run above runs by default
def test_float64_agrees_to_1e_10():
    with jax.enable_x64(True):
        result = buffers.run(Options(dtype="float64"))
    assert result.ok, result.report()


def test_a_perturbed_jax_weight_fails_the_numeric_checks():
    result = buffers.run(Options(perturb=1e-2))
    failed = result.failed()
    # the shifted bias feeds the BatchNorm, which subtracts the batch mean in train mode: the
    # train-mode output cannot see it, the running mean and everything after it do
    assert "train-mode output (batch statistics)" not in failed, result.report()
    assert "running_mean after one forward: funcnet's returned state == torch's mutated buffer" in failed
    assert "eval-mode output uses the running statistics" in failed
