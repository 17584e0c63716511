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


def test_loaded_runs_counts_every_run_and_fails_on_one_failure(tmp_path, capsys):
    import sys

    loaded = _script("loaded_runs")
    out = tmp_path / "runs.json"
    assert loaded.main(["--runs", "2", "--busy", "1", "--json", str(out), "--", sys.executable, "-c", "pass"]) == 0
    assert [r["status"] for r in json.loads(out.read_text())["runs"]] == [0, 0]
    flaky = "import os, sys; n = len(os.listdir(sys.argv[1])); open(f'{sys.argv[1]}/{n}', 'w'); sys.exit(3 * (n == 1))"
    (tmp_path / "marks").mkdir()
    status = loaded.main(["--runs", "3", "--busy", "0", "--json", str(out), "--",
                          sys.executable, "-c", flaky, str(tmp_path / "marks")])
    assert status == 1
    assert [r["status"] for r in json.loads(out.read_text())["runs"]] == [0, 3, 0]
    assert "2/3 runs passed" in capsys.readouterr().out


@pytest.mark.slow
def test_pipeline_table_quick_run(tmp_path):
    """benchmarks/pipeline.py --quick: the bubble counted in each table equals (P-1)/(M+P-1), and GPipe's
    compiled temps grow by the held stage inputs while 1F1B's stay put (the script returns 1 otherwise)."""
    out = tmp_path / "pipeline.json"
    assert _script("pipeline").main(["--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["stages"], r["microbatches"], r["schedule"]) for r in rows} == {
        (2, m, k) for m in (2, 4) for k in ("gpipe", "1f1b")}
    grown = {r["schedule"]: r["temps_growth"] for r in rows if r["microbatches"] == 4}
    assert grown["gpipe"] == 2 * rows[0]["slot_bytes"] and grown["1f1b"] == 0
    # the saved run the parallel guide's table shows: the same rows (absolute temps aside, which
    # move with XLA's flags; their growth does not)
    saved = {(r["stages"], r["microbatches"], r["schedule"]): r for r in _saved_pipeline_rows()}
    for r in rows:
        want = saved[(r["stages"], r["microbatches"], r["schedule"])]
        assert {k: v for k, v in r.items() if k != "temps"} == {k: v for k, v in want.items() if k != "temps"}


def _saved_pipeline_rows() -> list[dict]:
    return json.loads((Path(__file__).resolve().parents[1] / "docs" / "data" / "pipeline.json").read_text())["rows"]


def test_the_parallel_guides_pipeline_table_is_the_saved_run():
    """docs/guides/parallel.md's bubble and memory table is benchmarks/pipeline.py's table of the
    saved run docs/data/pipeline.json (written by `python benchmarks/pipeline.py --json
    docs/data/pipeline.json`), whose every bubble is GPipe's (P-1)/(M+P-1) and whose GPipe temps
    grow by the held stage inputs while 1F1B's stay put."""
    rows = _saved_pipeline_rows()
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "parallel.md").read_text()
    assert _script("pipeline").table(rows) in guide
    for r in rows:
        p, m = r["stages"], r["microbatches"]
        assert r["bubble"] == pytest.approx((p - 1) / (m + p - 1)) and r["idle"] == 2 * p * (p - 1)
        assert r["held"] == (m if r["schedule"] == "gpipe" else min(p, m))
        assert r["temps_growth"] == r["held_growth_bytes"]


@pytest.mark.slow
def test_conv_quick_run_checks_against_torch_and_writes_ratios(tmp_path):
    out = tmp_path / "conv.json"
    assert _script("conv").main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["sweep"] and all(r["ok"] for r in result["sweep"])
    assert all(r[k][impl] > 0 for r in result["sweep"] for k in ("forward_ms", "train_ms")
               for impl in ("funcnet", "lax.conv", "torch"))
    assert {(r["model"], r["variant"]) for r in result["models"]} >= {("resnet18", "converted"),
                                                                      ("resnet18", "hand-written")}
    assert all(r["ok"] and r["train_ms"]["funcnet"] > 0 for r in result["models"])


@pytest.mark.slow
@pytest.mark.parametrize("hwio", [False, True])
def test_channels_last_prototype_convolves_as_funcnet(hwio):
    """benchmarks/conv_layout.py's NHWC convolutions (each formulation funcnet's rule picks: XLA's,
    im2col with dropped taps, single tap, depthwise tap sum with its own gradient) give funcnet's
    NCHW results and gradients, on shapes its layout figures were not tuned on."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from funcnet.nn.functional.conv_strategy import convolve

    conv_nhwc = _script("conv_layout").conv_nhwc
    rng = np.random.default_rng(3)
    for n, c, o, s, k, st, g in [(2, 6, 6, 7, 3, 1, 6), (2, 6, 6, 9, 5, 2, 6), (2, 6, 6, 2, 5, 1, 6),
                                 (2, 6, 10, 3, 3, 1, 1), (2, 3, 10, 9, 7, 2, 1), (2, 10, 12, 5, 1, 2, 1),
                                 (2, 12, 10, 12, 3, 1, 1)]:
        x = jnp.asarray(rng.standard_normal((n, c, s, s)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((o, c // g, k, k)), jnp.float32)
        pads = ((k // 2, k // 2),) * 2

        def ours(x, w, st=st, pads=pads, g=g):
            return convolve(x, w, (st, st), pads, (1, 1), (1, 1), g)

        def proto(x, w, st=st, pads=pads, g=g):
            w = w.transpose(2, 3, 1, 0) if hwio else w
            return conv_nhwc(x.transpose(0, 2, 3, 1), w, (st, st), pads, g, hwio=hwio).transpose(0, 3, 1, 2)

        y = ours(x, w)
        gy = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
        # float32 sums: forward c/g*k*k products, input gradient o/g*k*k, weight gradient n*s*s
        terms = max(c // g * k * k, o // g * k * k, n * s * s)
        tol = 4 * terms * 2.0 ** -24 * 6.0 ** 2 * 4
        np.testing.assert_allclose(proto(x, w), y, rtol=0, atol=tol)
        for a, b in zip(jax.grad(lambda x, w: jnp.vdot(proto(x, w), gy), (0, 1))(x, w),
                        jax.grad(lambda x, w: jnp.vdot(ours(x, w), gy), (0, 1))(x, w)):
            np.testing.assert_allclose(a, b, rtol=0, atol=tol)
