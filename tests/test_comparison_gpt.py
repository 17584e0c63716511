"""comparisons/gpt.py: nanoGPT in torch and funcnet's GPT train to the same losses, step by step."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from comparisons import gpt
from comparisons._core import Options

ROOT = Path(__file__).resolve().parents[1]


def test_all_checks_pass_over_at_least_100_steps():
    result = gpt.run()
    assert result.ok, result.report()
    curves = result.series["training loss per step"]
    assert len(curves["torch"]) == len(curves["funcnet"]) >= 100
    assert curves["funcnet"][-1] < curves["funcnet"][0] - 1.0  # it learns
    names = {c.name for c in result.checks}
    assert "state_dict keys in torch's order, both tied keys included" in names
    assert "gradient clipping was exercised" in names
    assert "clip_grad_norm_" in result.torch.source and "LambdaLR" in result.torch.source
    assert "configure_optimizers" in result.jax.source and "nn.Composite" in result.jax.source


def test_a_perturbed_jax_weight_fails_the_curve_check():
    result = gpt.run(Options(perturb=1e-2), steps=30)
    failed = result.failed()
    assert "training loss per step (30 steps): funcnet == torch" in failed, result.report()
    assert "initial logits (B, T, vocab): funcnet == torch" in failed
    # what does not depend on the weights' values still agrees
    assert "state_dict keys in torch's order, both tied keys included" not in failed
    assert "learning rate per step: optax warmup_cosine_decay_schedule == LambdaLR" not in failed


@pytest.mark.slow  # a float64 rerun in a fresh process: the float32 run above and test_gpt.py's float64 checks run by default
def test_float64_agrees_to_1e_10():
    code = textwrap.dedent("""
        import torch
        torch.set_num_threads(1)
        from comparisons import gpt
        from comparisons._core import Options
        result = gpt.run(Options(dtype="float64"), steps=40)
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
        gpt.run(Options(dtype="float64"))
