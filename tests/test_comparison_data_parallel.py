"""The data-parallel comparison: torch DDP (2 gloo processes) against pmap, shard_map,
jit-sharding and one device; the all-reduce where each form puts it; a perturbed weight fails."""

import json
import os
import re
import subprocess
import sys

from comparisons import data_parallel
from comparisons._core import Options

WEIGHTS_VS_DDP = [f"{kind}: final weights == torch DDP's" for kind in data_parallel.FORMS]
EVIDENCE = ["torch: DDP all-reduced one bucket of all 4 gradients per backward()",
            "pmap: the all-reduce is the pmean written in the step",
            "shard_map: the all-reduce is the pmean written in the step",
            "jit-sharding: no collective written, the compiler inserted the all-reduce",
            "one device: no all-reduce at all"]


def _failed(checks):
    return "\n".join(f"{c['name']}: {c['detail']}" for c in checks if not c["ok"])


def test_runner_with_one_device_runs_the_jax_part_in_a_child(tmp_path):
    # `python -m comparisons` starts with one CPU device: the JAX forms must still run on 2.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-m", "comparisons", "data_parallel", "--no-source", "--no-page", "--json",
                          str(tmp_path / "r.json")], env=dict(env, JAX_PLATFORMS="cpu"), capture_output=True,
                         text=True, timeout=400, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (result,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert result["ok"], _failed(result["checks"])
    names = [c["name"] for c in result["checks"]]
    for name in WEIGHTS_VS_DDP + EVIDENCE:
        assert name in names
    # jit-sharding: no psum written, the compiler's all-reduces: the gradients and metrics in one,
    # plus the global count of labels cross_entropy's mean divides by (torch's ignore_index rule)
    assert re.search(r"sharding : jaxpr psum 0, HLO all-reduce [12],", result["jax"]["output"])
    assert "DDP, 2 processes (gloo)" in result["torch"]["output"]


def test_perturbed_weight_fails_the_weight_checks_only():
    result = data_parallel.run(Options(perturb=1e-3))  # 8 devices here: the JAX part runs in-process
    checks = [c.__dict__ for c in result.checks]
    assert not result.ok
    failed = {c["name"] for c in checks if not c["ok"]}
    assert set(WEIGHTS_VS_DDP) <= failed, failed
    # the JAX forms still agree with each other, and the all-reduce is where it was
    for c in checks:
        if c["name"] in EVIDENCE or c["name"].endswith("== one device, whole batch"):
            assert c["ok"], c
    detail = next(c["detail"] for c in checks if c["name"] == WEIGHTS_VS_DDP[0])
    assert float(re.search(r"max \|diff\| ([0-9.e+-]+)", detail).group(1)) > 1e-4, detail
