"""comparisons.pipeline_parallel: torch.distributed.pipelining in 2 gloo processes against funcnet.parallel.pipeline,
both equal to one device; the schedule torch runs, laid out in ticks, is the table JAX runs. The perturbed
run (one JAX weight moved) must fail the checks against torch: the verdict can fail."""

import pytest

from comparisons import pipeline_parallel
from comparisons._core import Options


def test_pipeline_parallel_comparison_passes():
    result = pipeline_parallel.run(Options())
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    names = [c.name for c in result.checks]
    for kind, torch_name in (("GPipe", "ScheduleGPipe"), ("1F1B", "Schedule1F1B")):
        assert f"{kind}: losses per step: JAX == torch {torch_name}" in names
        assert f"{kind}: torch's logged F/B order per stage, laid out in ticks == the table JAX runs" in names
    assert "stage 0  F0 F1  . B0 F2 B1 F3 B2  . B3" in result.torch.output  # torch's 1F1B, drawn from its log
    assert "stage 0  F0 F1  . B0 F2 B1 F3 B2  . B3" in result.jax.output
    # in the same process, so the perturbed run reuses torch's results and the jitted JAX steps
    # (pipeline_parallel._REUSED) and costs only its JAX steps
    _a_perturbed_jax_weight_fails_the_checks_against_torch()


def _a_perturbed_jax_weight_fails_the_checks_against_torch():
    result = pipeline_parallel.run(Options(perturb=1e-3), kinds=("1f1b",))
    assert not result.ok
    failed = result.failed()
    # one embedding entry moved by 1e-3 moves the loss by about its gradient x 1e-3, inside the loss check's
    # float32 tolerance; the gradients and the params after the steps show it
    for check in ("1F1B: final params: JAX == torch", "1F1B: first-step gradients: JAX == torch (tied weight all-reduced)"):
        assert check in failed, (check, result.report())
    # the pipeline still equals one device run from the same (perturbed) weights, and the schedule is unchanged
    assert "1F1B: JAX pipeline losses == one device" not in failed
    assert "1F1B: torch's logged F/B order per stage, laid out in ticks == the table JAX runs" not in failed


def test_unknown_schedules_are_refused():
    with pytest.raises(ValueError, match="kinds must be some of"):
        pipeline_parallel.run(Options(), kinds=("interleaved",))
