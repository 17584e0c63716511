"""comparisons.memory: the verdict passes, and a mismatched JAX-side model fails it."""

from comparisons import memory
from comparisons._core import Options


def test_memory_comparison_passes():
    result = memory.run(Options())
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    assert len(result.checks) >= 8
    assert "28 GB" in result.notes and "56 GB" in result.notes


def test_perturbed_jax_model_fails_the_cross_framework_counts():
    result = memory.run(Options(perturb=1.0))  # one more hidden unit on the JAX side
    assert not result.ok
    failed = result.failed()
    assert "params: torch numel x element_size == JAX tree bytes" in failed
    assert "Adam moments: torch exp_avg + exp_avg_sq == optax mu + nu" in failed
    # the 7B arithmetic and JAX's own estimate-vs-XLA check do not depend on torch
    assert not any(name.startswith("7B") or name.startswith("estimate within") for name in failed)
