"""The acceptance rule of benchmarks/convert_zoo_libraries.py (benchmarks/convert_zoo_rule.py) on
synthetic figures.

``classify`` decides match / match (f32 rounding) / WRONG / vacuous from a row's figures alone;
these rows are made up to sit on each side of each condition, so the rule is checked without
timm, torchvision or a model run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)
try:
    import convert_zoo_rule as zoo
finally:
    sys.path.remove(BENCH)

RATIO = 2.0 ** -29  # float64's eps over float32's
FINE = {"fwd": 3e-7, "grad": 2e-6, "state": 1e-6, "fwd_scale": 2.5, "grad_scale": 0.3}


def status(**figures) -> str:
    return zoo.classify({**FINE, **figures})[0]


def test_within_every_bound_is_a_match():
    assert zoo.classify(FINE) == ("match", "")
    assert status(state=None) == "match"  # no buffers: nothing to compare, not a failure


@pytest.mark.parametrize("m", ["fwd", "grad", "state"])
def test_past_a_bound_without_float64_figures_is_wrong(m):
    assert status(**{m: 10 * zoo.TOLS[m]}) == "WRONG"
    assert status(**{m: float("inf")}) == "WRONG"  # a missing key or a shape mismatch


@pytest.mark.parametrize("m", ["fwd", "grad", "state"])
def test_rounding_amplified_by_the_model_is_a_marked_match(m):
    x = 4e-3
    row = {m: x, m + "64": x * RATIO, m + "_exact": [3e-3, 2e-3]}
    assert status(**row) == "match (f32 rounding)"
    assert f"{m} 4.0e-03" in zoo.classify({**FINE, **row})[1]


def test_float64_bound_scales_with_the_float32_figure():
    x, exact = 4e-3, [3e-3, 2e-3]
    assert status(grad=x, grad64=3.9 * x * RATIO, grad_exact=exact) == "match (f32 rounding)"
    assert status(grad=x, grad64=4.1 * x * RATIO, grad_exact=exact) == "WRONG"
    # a logic error does not shrink with the precision: float64 far above float64's eps
    assert status(grad=x, grad64=1e-6, grad_exact=exact) == "WRONG"


def test_float64_bound_is_capped():
    # a float32 figure of 5 would allow 4 * 5 * 2**-29 = 3.7e-8; the cap 1e-8 holds
    assert status(fwd=5.0, fwd64=2e-8, fwd_exact=[5.0, 5.0]) == "WRONG"
    assert status(fwd=5.0, fwd64=0.9e-8, fwd_exact=[5.0, 5.0]) == "match (f32 rounding)"


def test_ours_must_be_as_near_the_exact_answer_as_torch_float32():
    x = 1.5e-3
    f64 = 1e-13
    assert status(grad=x, grad64=f64, grad_exact=[7e-4, 1.8e-4]) == "match (f32 rounding)"  # 3.9x
    assert status(grad=x, grad64=f64, grad_exact=[1.5e-3, 1.8e-4]) == "WRONG"  # 8x torch's error
    # within the float32 bound of the exact answer: torch's float32 is the one that strays
    assert status(grad=x, grad64=f64, grad_exact=[9e-5, 1e-6]) == "match (f32 rounding)"


def test_both_conditions_are_needed():
    assert status(grad=1e-3, grad64=1e-13) == "WRONG"  # no comparison with the exact answer
    assert status(grad=1e-3, grad_exact=[1e-4, 1e-4]) == "WRONG"  # no float64 conversion


def test_zeros_compared_are_vacuous_not_a_match():
    assert status(fwd=0.0, fwd_scale=0.0) == "vacuous"
    assert status(grad=0.0, grad_scale=1e-25) == "vacuous"
    assert "grad compares zeros" in zoo.classify({**FINE, "grad": 0.0, "grad_scale": 0.0})[1]
    assert status(fwd=0.0, fwd_scale=0.0, state=1.0) == "WRONG"  # a failure outranks it


def test_the_rule_imports_without_torch_or_timm():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import convert_zoo_libraries, convert_zoo_rule; "
            "print(sorted(m for m in ('torch', 'timm', 'torchvision', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, BENCH], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
