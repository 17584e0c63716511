"""comparisons.performance: the verdict passes; a perturbed JAX weight breaks the cross-framework checks."""

from comparisons import performance
from comparisons._core import Options


def test_performance_comparison_passes():
    result = performance.run(Options())
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    names = " ".join(c.name for c in result.checks)
    for row in ("data loading", "out of memory", "compute", "gradient sync", ".item()", "copy per step"):
        assert row in names
    assert "torch.cuda.Event" in result.torch.source and "synchronize" in result.torch.source


def test_perturbed_jax_weight_fails_only_the_torch_vs_jax_checks():
    # without the remedies' table (JAX against JAX, most of the run's time): the checks the weight reaches
    result = performance.run(Options(perturb=0.5), table=False)
    failed = result.failed()
    assert "timing: same forward output (1024 x 784 MLP)" in failed
    assert f"same {performance.STEPS} SGD losses in torch and JAX" in failed
    # each framework still agrees with itself, both ways of each trap
    assert not any(name.startswith(("torch:", "jax:")) for name in failed)
