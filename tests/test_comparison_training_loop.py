"""comparisons/training_loop.py: torch's five-line loop and funcnet's make_step/run_epoch give one curve."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from comparisons import training_loop
from comparisons._core import Options

ROOT = Path(__file__).resolve().parents[1]


def test_all_checks_pass_over_at_least_200_steps():
    result = training_loop.run()
    assert result.ok, result.report()
    curves = result.series["training loss per step"]
    assert set(curves) == {"torch", "funcnet"}
    assert len(curves["torch"]) == len(curves["funcnet"]) >= 200
    assert "optimizer.zero_grad()" in result.torch.source and "run_epoch" in result.jax.source


def test_a_perturbed_jax_weight_fails_the_curve_check():
    result = training_loop.run(Options(perturb=1e-2), epochs=1)
    assert not result.ok
    failed = result.failed()
    assert "training loss per step: funcnet run_epoch == torch loop" in failed, result.report()
    # both JAX runs carry the same perturbation, so they still agree with each other
    assert "run_epoch (one lax.scan) == make_step per batch: losses" not in failed


@pytest.mark.slow  # a float64 rerun in a fresh process: the float32 run above runs by default
def test_float64_agrees_to_1e_10():
    code = textwrap.dedent("""
        import torch
        torch.set_num_threads(1)
        from comparisons import training_loop
        from comparisons._core import Options
        result = training_loop.run(Options(dtype="float64"), epochs=1)
        for c in result.checks:
            print("ok  " if c.ok else "FAIL", c.name, "|", c.detail)
        raise SystemExit(0 if result.ok else 1)
    """)
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    curve = next(line for line in done.stdout.splitlines() if "training loss per step" in line)
    assert "rtol 1e-10" in curve  # the float64 tolerance was the one applied


def test_float64_without_x64_is_refused_clearly():
    with pytest.raises(RuntimeError, match="JAX_ENABLE_X64=1"):
        training_loop.run(Options(dtype="float64"))
