"""The dynamic-graph comparison: the same numbers from torch's Python control flow
and JAX's traced functions, with trace and compile counts; a perturbed weight fails."""

import pytest

from comparisons import dynamic_graph
from comparisons._core import Options


@pytest.fixture(scope="module")
def result():
    return dynamic_graph.run()


def test_dynamic_graph_agrees(result):
    assert result.name == "dynamic_graph" and result.title == dynamic_graph.TITLE
    assert result.ok, result.report()


def test_every_topic_is_checked(result):
    names = " | ".join(c.name for c in result.checks)
    for topic in ("model_a/model_b loop", "JAX traces for 5 + 5 iterations", "use_dropout=False: torch vs JAX",
                  "lax.cond vs static flag", "once per value", "keep half the units", "mean over masks",
                  "`if x.sum() > 0` on a traced value", "fixes (eager, static_argnames, lax.cond, jnp.where)",
                  "calls with one shape", "new shape each", "static value", "jax.log_compiles"):
        assert topic in names, f"no check about {topic!r} in: {names}"
    assert "use_dropout=True" in result.torch.source and "static_argnames" in result.jax.source
    assert "TracerBoolConversionError" in result.jax.output


def test_series_counts_traces_per_call(result):
    (curves,) = result.series.values()
    n = dynamic_graph.N_CALLS
    assert curves["JAX traces, same shape"] == [1] * n
    assert curves["JAX traces, new shape each call"] == list(range(1, n + 1))
    assert curves["torch graphs recorded, same shape"] == list(range(1, n + 1))


def test_perturbed_weight_fails_the_output_checks():
    result = dynamic_graph.run(Options(perturb=1e-3))
    assert not result.ok
    failed = result.failed()
    assert "use_dropout=False: torch vs JAX static flag" in failed, failed
    assert any(name.startswith("model_a/model_b loop") for name in failed), failed
    # trace counts do not depend on the numbers
    assert all(c.ok for c in result.checks if "traces" in c.name), result.report()


def test_float64_without_x64_is_refused():
    with pytest.raises(RuntimeError, match="JAX_ENABLE_X64=1"):
        dynamic_graph.run(Options(dtype="float64"))
