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


def test_float64_bound_scales_with_the_float32_distances_from_the_exact_answer():
    x, exact = 4e-3, [3e-3, 2e-3]  # the two float32 results 5e-3 from the answer between them
    assert status(grad=x, grad64=3.9 * 5e-3 * RATIO, grad_exact=exact) == "match (f32 rounding)"
    assert status(grad=x, grad64=4.1 * 5e-3 * RATIO, grad_exact=exact) == "WRONG"
    # a logic error does not shrink with the precision: float64 far above float64's eps
    assert status(grad=x, grad64=1e-6, grad_exact=exact) == "WRONG"


def test_float32_errors_on_the_same_side_do_not_shrink_the_float64_bound():
    # two float32 runs 6.2e-4 apart, each 1.8e-3 from the answer (timm's ReXNet at 96 px): their float64 runs
    # may be up to 4 * (1.8e-3 + 1.9e-3) * 2**-29 apart; the gap alone would allow 4 * 6.2e-4 * 2**-29 = 4.6e-12
    row = dict(grad=6.2e-4, grad_exact=[1.8e-3, 1.9e-3])
    assert status(**row, grad64=8.4e-12) == "match (f32 rounding)"
    assert status(**row, grad64=2.8e-11) == "WRONG"  # past 4 * 3.7e-3 * 2**-29 = 2.76e-11
    # the float32 gap still bounds it from below: errors reported smaller than the gap cannot shrink it
    assert status(grad=4e-3, grad64=3.9 * 4e-3 * RATIO, grad_exact=[1e-3, 1e-3]) == "match (f32 rounding)"


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


def _libraries():
    sys.path.insert(0, BENCH)
    try:
        import convert_zoo_libraries
    finally:
        sys.path.remove(BENCH)
    return convert_zoo_libraries


def test_a_models_status_over_its_inputs_is_the_worst_and_the_counts_cover_each_input():
    """--lengths: a model matching on the fresh batch and WRONG at one length counts as WRONG over
    all inputs; a model refused at convert counts as refused at each of its inputs (three for text,
    two for vision); the inputs' counts are taken per position."""
    lib = _libraries()
    assert lib.worst(["match", "match (f32 rounding)"]) == "match (f32 rounding)"
    assert lib.worst(["match", "WRONG", "refused"]) == "WRONG"
    assert lib.worst(["WRONG", "CRASH"]) == "CRASH"
    text, vision = "hf/roberta", "tv/squeezenet1_0"
    assert lib.MODELS[text][3] == 0 and lib.MODELS[vision][3] > 0
    sizes = lambda *s: [{"size": f"input {i}", "status": x} for i, x in enumerate(s)]  # noqa: E731
    rows = [
        {"model": text, "status": "match", "convert_s": 1.0, "sizes": sizes("match", "WRONG", "match"),
         "status_all": "WRONG"},
        {"model": vision, "status": "match", "convert_s": 1.0, "sizes": sizes("match (f32 rounding)", "match"),
         "status_all": "match (f32 rounding)"},
        {"model": "hf/albert", "status": "refused", "status_all": "refused"},  # refused at convert: 3 lengths
        {"model": "tv/mobilenet_v2", "status": "CRASH", "status_all": "CRASH"},  # crashed at convert: 2 sizes
    ]
    c = lib.counts(rows)
    assert list(c) == ["fresh batch", "input 1", "input 2", "input 3", "all inputs"]
    assert c["fresh batch"]["models"] == 4 and c["fresh batch"]["match"] == 2
    assert c["input 1"] == {**dict.fromkeys(lib.ORDER, 0), "match": 1, "match (f32 rounding)": 1, "refused": 1,
                            "CRASH": 1, "models": 4}
    assert c["input 2"]["WRONG"] == 1 and c["input 2"]["models"] == 4
    assert c["input 3"] == {**dict.fromkeys(lib.ORDER, 0), "match": 1, "refused": 1, "models": 2}  # text only
    assert c["all inputs"]["WRONG"] == 1 and c["all inputs"]["CRASH"] == 1
    assert "input 1" not in lib.counts([{k: v for k, v in r.items() if k != "sizes"} for r in rows[:2]])


def test_the_lengths_held_out_list_is_its_own_and_every_input_is_another_shape():
    """The --lengths held-out models are in no other list; each text length and image size differs
    from the traced and the fresh one (6 and 7 tokens; the traced side)."""
    lib = _libraries()
    models = sys.modules["convert_zoo_models"]
    assert not set(models.LENGTHS_HELD_OUT) & (set(models.NAMED) | set(models.HELD_OUT))
    assert len(models.LENGTHS) == 3 and not {6, 7} & set(models.LENGTHS)
    assert len(models.SIZES) == 2 and 1 not in models.SIZES
    assert lib.GROUPS["every model"] == models.MODELS
