"""The tensors comparison: torch and JAX agree on values, and each framework's
aliasing / immutability behaviour is asserted; a perturbed JAX input fails the verdict."""

import pytest

from comparisons import tensors
from comparisons._core import Options


@pytest.fixture(scope="module")
def result():
    return tensors.run()


def test_tensors_agree(result):
    assert result.name == "tensors" and result.title == tensors.TITLE
    assert result.ok, result.report()


def test_every_topic_is_checked(result):
    names = " | ".join(c.name for c in result.checks)
    for topic in ("same key repeats", "two-sample KS", "requires_grad vs argnums", "ops: matmul", "ops: cat",
                  "strides (1, 4)", "writing b[0, 0] changed a", "contiguous() copies", ".at[].set left a",
                  "donated input deleted", "from_numpy shares memory", "jnp.asarray copied", "read-only view"):
        assert topic in names, f"no check about {topic!r} in: {names}"
    # the sources shown are the functions that ran
    assert "b[0, 0] = 99" in result.torch.source and "torch.from_numpy(n)" in result.torch.source
    assert "donate_argnums=0" in result.jax.source and "jax.random.clone" in result.jax.source
    assert "a[0, 0] = 99" in result.torch.output and "deleted True" in result.jax.output


def test_perturbed_input_fails_the_value_checks():
    result = tensors.run(Options(perturb=1e-3))
    assert not result.ok
    failed = result.failed()
    assert {"ops: matmul", "ops: mul", "in-place result vs functional result"} <= failed, failed
    # what does not depend on the shared numbers still holds
    behaviour = [c for c in result.checks if c.name.startswith(("torch:", "JAX: donated", "JAX: np.asarray"))]
    assert behaviour and all(c.ok for c in behaviour), result.report()


def test_float64_without_x64_is_refused():
    with pytest.raises(RuntimeError, match="JAX_ENABLE_X64=1"):
        tensors.run(Options(dtype="float64"))


def test_unknown_dtype_is_named():
    with pytest.raises(ValueError, match="'float16'.*float32"):
        tensors.run(Options(dtype="float16"))
