"""The saved run that the site's concept pages show (docs/data/comparisons.json) is still true.

It was written by ``python -m comparisons --json docs/data/comparisons.json``. Here:

- it holds every comparison of the registry and nothing else, each passing;
- every line of every saved source is a line of today's code (comparisons/, funcnet/,
  examples/), so a page does not show code that has since changed; ``convert``'s JAX source is
  written by ``interop.to_source`` at run time and is left out;
- the cheap comparisons (a few CPU-seconds each) run again and give the same checks with the
  same verdicts, and the same outputs and check details with their numbers within the dtype's
  tolerance. Left out: timings, which differ run to run, and the differences a ``close`` check
  measures between the frameworks, which its verdict already holds to its own tolerance.

After changing a comparison, save the run again with the command above.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from comparisons.__main__ import available, run_one
from comparisons._core import TOL, Options

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "docs" / "data" / "comparisons.json"
RERUN = "python -m docs_hooks.save_run NAME ..., or with no names to run them all"
CHEAP = ["autograd", "autograd_from_scratch"]  # 1.3 and 1.7 CPU-seconds once imported (tensors: 2.4)
GENERATED = {("convert", "jax")}  # interop.to_source's output, written at run time

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_TIME = re.compile(r"\d+(?:\.\d+)?\s*(?:s|ms|µs|us|ns)\b")


@pytest.fixture(scope="module")
def saved() -> tuple[str, dict]:
    run = json.loads(SAVED.read_text())
    return run["dtype"], {r["name"]: r for r in run["results"]}


def test_the_saved_run_holds_every_comparison_passing(saved):
    _, results = saved
    assert sorted(results) == sorted(available()), f"the comparisons changed; save the run again: {RERUN}"
    failing = [name for name, r in results.items() if not r["ok"]]
    assert not failing, f"the saved run has failing comparisons {failing}; fix them and run {RERUN}"


def test_every_saved_source_line_is_in_todays_code(saved):
    _, results = saved
    lines = {line.strip() for folder in ("comparisons", "funcnet", "examples")
             for path in (ROOT / folder).rglob("*.py") for line in path.read_text().splitlines()}
    stale = {f"{name} ({side})": missing[:3] for name, r in results.items() for side in ("torch", "jax")
             if (name, side) not in GENERATED
             and (missing := [s for s in r[side]["source"].splitlines() if s.strip() and s.strip() not in lines])}
    assert not stale, f"the saved sources differ from the code; save the run again ({RERUN}): {stale}"


def _measures_differences(check: dict) -> bool:
    """A ``close`` check: its numbers are differences between the two frameworks, which the
    check itself holds to its tolerance (and which vary with the order of float reductions)."""
    return re.fullmatch(r"rtol \S+, atol \S+", check.get("tolerance", "")) is not None


def same_up_to(saved: str, fresh: str, rtol: float | None, atol: float = 0.0) -> str | None:
    """None if ``fresh`` is ``saved`` with each number within ``atol + rtol * |saved|`` (timings
    ignored; rtol None: any numbers in the same text), else the first difference."""
    saved, fresh = _TIME.sub("<time>", saved), _TIME.sub("<time>", fresh)
    if _NUMBER.split(saved) != _NUMBER.split(fresh):
        return f"the text differs:\n  saved {saved!r}\n  fresh {fresh!r}"
    if rtol is None:
        return None
    for a, b in zip(map(float, _NUMBER.findall(saved)), map(float, _NUMBER.findall(fresh))):
        if not abs(a - b) <= atol + rtol * abs(a):
            return f"{b} differs from the saved {a} by more than rtol {rtol:g}, atol {atol:g}"
    return None


def test_same_up_to_sees_a_changed_number_and_ignores_timings():
    assert same_up_to("loss 0.5 (1.2 s)", "loss 0.5000001 (3.40 ms)", 1e-6, 1e-5) is None
    assert same_up_to("max |diff| 1e-07", "max |diff| 3e-06", None) is None
    assert "differs from the saved 0.5" in same_up_to("loss 0.5", "loss 0.6", 1e-6, 1e-5)
    assert "text differs" in same_up_to("loss 0.5", "grad 0.5", 1e-6, 1e-5)


@pytest.mark.parametrize("name", CHEAP)
def test_a_fresh_run_gives_the_saved_checks(name, saved):
    dtype, results = saved
    was, now = results[name], run_one(name, Options(dtype=dtype)).to_json()
    assert [(c["name"], c["ok"]) for c in now["checks"]] == [(c["name"], c["ok"]) for c in was["checks"]], \
        f"{name}'s checks changed; save the run again: {RERUN}"
    rtol, atol = TOL[dtype]["rtol"], TOL[dtype]["atol"]
    problems = [f"check {c['name']!r}: {why}" for c, f in zip(was["checks"], now["checks"])
                if (why := same_up_to(c["detail"], f["detail"], None if _measures_differences(c) else rtol, atol))]
    problems += [f"{side} output: {why}" for side in ("torch", "jax")
                 if (why := same_up_to(was[side]["output"], now[side]["output"], rtol, atol))]
    problems += [f"{side} source differs" for side in ("torch", "jax") if was[side]["source"] != now[side]["source"]]
    assert not problems, f"{name}: the saved run is out of date ({RERUN}):\n" + "\n".join(problems)


def test_saving_some_comparisons_again_replaces_only_those_in_the_registrys_order():
    from docs_hooks.save_run import merge

    saved = {"dtype": "float32", "results": [{"name": "a", "v": 1}, {"name": "b", "v": 1}, {"name": "c", "v": 1}]}
    fresh = {"dtype": "float32", "results": [{"name": "b", "v": 2}]}
    assert merge(saved, fresh, ["a", "b", "c"])["results"] == [{"name": "a", "v": 1}, {"name": "b", "v": 2},
                                                              {"name": "c", "v": 1}]
    with pytest.raises(ValueError, match="float64"):
        merge(saved, {"dtype": "float64", "results": []}, ["a", "b", "c"])
