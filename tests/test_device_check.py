"""benchmarks/device_check.sh on a machine without GPUs or TPUs says so in one line and exits 0;
its train-step benchmark runs on CPU with --tiny, its pipeline and ZeRO steps with --cpu."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_device_check_exits_cleanly_without_an_accelerator():
    # the script calls `python`: this interpreter's, as in the activated venv it is run from
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), PATH=path)
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh")], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "device_check: no GPU or TPU here (JAX's backend is cpu); nothing to check"


@pytest.mark.slow
def test_device_step_runs_its_tiny_model_on_cpu():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import device_step
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import jax

    from funcnet import gpt

    r = device_step.run(gpt.GPTConfig(8, 32, 1, 2, 16), 2, 2, 1)
    assert r["n"] == 2 and r["tokens_per_s"] > 0 and r["planned"] > 0
    assert r["mfu"] != r["mfu"] or jax.default_backend() != "cpu"  # no bf16 peak is known for a CPU: NaN
    assert device_step.peak("NVIDIA H100 80GB HBM3") == 989e12


@pytest.mark.slow
def test_device_check_cpu_runs_the_pipeline_and_zero_steps():
    # the script's `python` is this interpreter (its environment has jax)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh"), "--cpu"], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "pipeline P=4 M=8 gpipe: bubble 0.273 ((P-1)/(M+P-1) = 0.273), inputs held 8" in out
    assert "pipeline P=4 M=8  1f1b: bubble 0.273 ((P-1)/(M+P-1) = 0.273), inputs held 4" in out
    assert all(f"ZeRO-{z} on 4:" in out for z in (0, 1, 2, 3))
    assert out.rstrip().endswith("the ZeRO stages' losses agree and the bubbles are GPipe's")
