"""Smoke runs of the benchmark scripts (--quick): each runs, its correctness checks against torch
pass (the script returns 1 on a mismatch beyond its tolerance), and its JSON holds the figures."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _script(name):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name, args", [
    ("throughput", ["--impls", "torch eager", "funcnet make_step", "funcnet run_epoch"]),
    ("models", ["--models", "convnet", "--impls", "torch eager", "flax nnx", "funcnet run_epoch"]),
    ("models", ["--models", "lstm", "--impls", "torch eager", "torch LSTMCell loop", "equinox", "funcnet run_epoch"]),
    ("data_loading", []),
])
def test_quick_run_writes_its_figures(name, args, tmp_path):
    out = tmp_path / f"{name}.json"
    assert _script(name).main(["--quick", "--json", str(out), *args]) == 0
    result = json.loads(out.read_text())
    timed = [r for r in result["rows"] if r.get("ms_per_step") or r.get("seconds_per_epoch")]
    assert timed and all(r.get("error") is None for r in timed)
    if name != "data_loading":
        assert result["goals"] and all(isinstance(g["met"], bool) for g in result["goals"])
