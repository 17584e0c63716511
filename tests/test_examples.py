"""Every example runs, at its ``--quick`` setting, with its exit status and stated result checked.

The full-size runs (the figures the docs quote) take minutes each on 2 cores, so they
stay out of the default suite; run them with

    FUNCNET_FULL_EXAMPLES=1 python -m pytest -q -n 0 tests/test_examples.py -k full
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))

# what each example states, as a pattern over its output, and the figure that must hold
RESULT = {
    "port_cnn": (r"max \|funcnet - torch\|.*eval (\S+)\n.*test accuracy (\S+)",
                 lambda eval_diff, acc: float(eval_diff) <= 1e-4 and float(acc) > 0.5),
    "port_resnet": (r"max \|funcnet - torch\|.*eval (\S+)\n.*test accuracy (\S+)",
                    lambda eval_diff, acc: float(eval_diff) <= 1e-4 and float(acc) > 0.5),
    "gpt_text": (r"validation loss (\S+) nats/char .*unigram baseline (\S+) nats/char",
                 lambda val, unigram: float(val) < float(unigram)),
    "loss_scaling_underflow": (r"underflow to zero: (\S+)%-(\S+)% without scaling, (\S+)%-(\S+)% with",
                               lambda lo, hi, slo, shi: float(shi) < float(hi)),
    "pmap_data_parallel": (r"epoch 2: loss \S+  test accuracy (\S+)", lambda acc: float(acc) > 0.5),
    "multi_process": (r"all (\d) processes finished", lambda n: n == "2"),
}


def run_example(name: str, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MPLBACKEND"] = "Agg"
    return subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_example_has_a_stated_result():
    assert sorted(RESULT) == EXAMPLES


# multi_process --quick is the run tests/test_parallel.py::test_two_processes_of_two_devices_match_one_device makes
# by default (the same flags, with --out), which also checks its stated result: here it runs under -m slow
QUICK_ELSEWHERE = {"multi_process"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in QUICK_ELSEWHERE else n
                                  for n in EXAMPLES])
def test_example_quick(name):
    """examples/NAME.py --quick exits 0 and prints its stated result (multi_process's run and result are checked
    by default in tests/test_parallel.py::test_two_processes_of_two_devices_match_one_device, so here it is slow)."""
    done = run_example(name, "--quick")
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"examples/{name}.py --quick exited {done.returncode}:\n{out[-3000:]}"
    pattern, holds = RESULT[name]
    found = re.search(pattern, done.stdout)
    assert found, f"examples/{name}.py --quick printed no line matching {pattern!r}:\n{done.stdout[-2000:]}"
    assert holds(*found.groups()), f"examples/{name}.py --quick: stated result not met: {found.group(0)!r}"


@pytest.mark.skipif(not os.environ.get("FUNCNET_FULL_EXAMPLES"), reason="full-size examples: set FUNCNET_FULL_EXAMPLES=1")
@pytest.mark.parametrize("name", ["port_cnn", "port_resnet", "gpt_text", "loss_scaling_underflow"])
def test_example_full(name):
    done = run_example(name, timeout=3600)
    assert done.returncode == 0, f"examples/{name}.py exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
    guide = " ".join((ROOT / "docs" / "guides" / "mixed-precision.md").read_text().split())
    if name == "loss_scaling_underflow":  # the mixed-precision guide's figures are this run's
        lo, hi, slo, shi = re.search(RESULT[name][0], done.stdout).groups()
        assert f"without scaling {lo}%-{hi}% of the float16" in guide and f"2**16, {slo}%-{shi}% do" in guide
