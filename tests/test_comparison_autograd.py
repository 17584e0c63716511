"""The autograd comparison: derivatives against closed forms and torch, the graph
behaviours of both frameworks, MLP gradients; float64 agreement in a 64-bit JAX process."""

import json
import os
import subprocess
import sys

import pytest

from comparisons import autograd
from comparisons._core import Options


@pytest.fixture(scope="module")
def result():
    return autograd.run()


def test_autograd_agrees(result):
    assert result.name == "autograd" and result.title == autograd.TITLE
    assert result.ok, result.report()


def test_every_topic_is_checked(result):
    names = " | ".join(c.name for c in result.checks)
    for topic in ("torch vs 2x + 3", "JAX vs 2x + 3", "backward nodes match make_jaxpr", "chain rule: torch",
                  "chain rule: JAX", "second backward() without retain_graph", "retain_graph=True",
                  "pullback called twice", ".grad accumulates", "fresh 7", "MLP: grad 0.weight", "MLP: grad 2.bias"):
        assert topic in names, f"no check about {topic!r} in: {names}"
    assert "y.backward(retain_graph=True)" in result.torch.source and "jax.vjp" in result.jax.source
    assert "AccumulateGrad" in result.torch.output and "integer_pow" in result.jax.output


def test_perturbed_weight_fails_the_gradient_checks():
    result = autograd.run(Options(perturb=1e-3))
    assert not result.ok
    failed = result.failed()
    assert "MLP: grad 2.weight" in failed and "MLP: loss, torch vs JAX (same weights)" in failed, failed
    assert all(c.ok for c in result.checks if not c.name.startswith("MLP")), result.report()


_FLOAT64 = """
import json
from comparisons import autograd
from comparisons._core import Options
out = {}
for perturb in (0.0, 1e-6):
    r = autograd.run(Options(dtype="float64", perturb=perturb))
    out[str(perturb)] = {"ok": r.ok, "checks": [[c.name, c.ok, c.detail] for c in r.checks]}
print(json.dumps(out))
"""


def test_float64_agrees_to_1e_10():
    env = dict(os.environ, JAX_ENABLE_X64="1")
    proc = subprocess.run([sys.executable, "-c", _FLOAT64], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    clean, perturbed = out["0.0"], out["1e-06"]
    assert clean["ok"], [c for c in clean["checks"] if not c[1]]
    grads = [c for c in clean["checks"] if c[0].startswith("MLP: grad")]
    assert len(grads) == 4 and all("rtol 1e-10" in c[2] for c in grads), grads
    # a 1e-6 change in one weight is far outside float64's tolerance
    assert not perturbed["ok"] and not any(c[1] for c in perturbed["checks"] if c[0].startswith("MLP: grad"))


def test_float64_without_x64_is_refused():
    with pytest.raises(RuntimeError, match="JAX_ENABLE_X64=1"):
        autograd.run(Options(dtype="float64"))
