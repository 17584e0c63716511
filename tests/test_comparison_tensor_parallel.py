"""comparisons.tensor_parallel: torch DTensor in gloo processes against JAX meshes, JAX equal to
one device and to torch, Megatron's all-reduce count from the HLO. The default run takes TP 2
only (2 processes); the slow one every mesh of `python -m comparisons tensor_parallel` (TP 2,
TP 4 and the 2 x 2 FSDP x TP mesh in 4 processes)."""

import pytest

from comparisons import tensor_parallel
from comparisons._core import Options


def test_tensor_parallel_comparison_passes():
    result = tensor_parallel.run(Options(), meshes={"TP 2": (1, 1, 2)})
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    names = [c.name for c in result.checks]
    assert (
        "losses per step: JAX TP 2 == torch parallelize_module (2 processes)" in names
    )
    assert any(
        n.startswith("TP 2, 2 layer(s), embedding replicated: all-reduces")
        for n in names
    )
    torch_line = next(
        c for c in result.checks if c.name.startswith("final params: JAX TP 2 == torch")
    )
    assert "max |diff|" in torch_line.detail
    # in the same process, so the perturbed run reuses torch's results and the compiled JAX programs
    # (tensor_parallel._REUSED) and costs only its training steps
    _a_perturbed_jax_weight_fails_the_torch_checks_only()


def _a_perturbed_jax_weight_fails_the_torch_checks_only():
    result = tensor_parallel.run(Options(perturb=1e-2), meshes={"TP 2": (1, 1, 2)})
    failed = {c.name for c in result.checks if not c.ok}
    assert {"losses per step: JAX TP 2 == torch parallelize_module (2 processes)",
            "final params: JAX TP 2 == torch DTensor (full_tensor)"} <= failed, failed
    # the perturbation is on the JAX side's initial weights, so TP 2's losses still equal one device's (its final
    # params may not: Adam's first steps are lr x sign of near-zero gradients, which the new weights move)
    assert "TP 2: losses == one device" not in failed
    assert not result.ok


@pytest.mark.slow
def test_tp4_and_fsdp_x_tp_match_torch_in_4_processes():
    result = tensor_parallel.run(Options())
    assert result.ok, [(c.name, c.detail) for c in result.checks if not c.ok]
    names = [c.name for c in result.checks]
    for torch_side in (
        "JAX TP 4 == torch parallelize_module (4 processes)",
        "JAX FSDP 2 x TP 2 == torch fully_shard x parallelize_module (2 x 2 processes)",
    ):
        assert f"losses per step: {torch_side}" in names
    assert "final params: JAX FSDP 2 x TP 2 == torch DTensor (full_tensor)" in names


def test_torch_runs_refuse_a_data_axis():
    with pytest.raises(ValueError, match="not a data axis"):
        tensor_parallel.torch_runs({"DP 2 x TP 2": (2, 1, 2)})
