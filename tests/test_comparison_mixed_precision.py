"""comparisons.mixed_precision: the verdict passes (identical scale sequences and skipped
steps, bf16 losses within bf16's resolution); a perturbed JAX weight fails it."""

import pytest

from comparisons import mixed_precision
from comparisons._core import Options


@pytest.fixture(scope="module")
def result():
    return mixed_precision.run()


def test_mixed_precision_agrees(result):
    assert result.name == "mixed_precision" and result.title == mixed_precision.TITLE
    assert result.ok, result.report()
    names = " | ".join(c.name for c in result.checks)
    for topic in ("loss-scale sequence", "skipped steps: JAX == torch", "params bit-identical across every skipped",
                  "first-batch logits", "losses on the kept steps"):
        assert topic in names, f"no check about {topic!r} in: {names}"
    assert "GradScaler" in result.torch.source and "DynamicLossScale" in result.jax.source
    scales = result.series["loss scale per step"]
    assert scales["torch GradScaler"] == scales["JAX DynamicLossScale"]
    assert len(set(scales["torch GradScaler"])) >= 4  # the scale moved both ways


def test_perturbed_weight_fails_the_agreement_checks():
    # 0.01 on one output bias: above bfloat16's resolution (2**-8 relative) at the logits
    result = mixed_precision.run(Options(perturb=1e-2))
    assert not result.ok
    failed = result.failed()
    assert "first-batch logits, bf16: JAX == torch autocast" in failed
