"""Smoke runs of the benchmark scripts (--quick): each runs, its correctness checks against torch
pass (the script returns 1 on a mismatch beyond its tolerance), and its JSON holds the figures."""

import importlib.util
import json
import re
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


# ----------------------------------------------------------------------------- the memory guide's saved runs
def _saved(name: str) -> dict:
    """docs/data/bench_NAME.json's result, saved by `python -m docs_hooks.save_bench NAME`."""
    return json.loads((Path(__file__).resolve().parents[1] / "docs" / "data" / f"bench_{name}.json").read_text())["result"]


def _memory_guide() -> str:
    return (Path(__file__).resolve().parents[1] / "docs" / "guides" / "memory.md").read_text()


def _bytes_pair(xla: float, paper: int, ratio: float) -> str:
    shown = f"{round(xla):,} / {paper:,}"
    return shown if f"{ratio:.3f}" == "1.000" else f"{shown} ({ratio:.3f})"


def test_the_memory_guides_remat_table_is_the_saved_run():
    """docs/guides/memory.md's per-layer table is benchmarks/gpt_memory.py's saved run: each remat policy's
    XLA bytes per layer over the paper's variant, and no remat over the paper's list."""
    layers = _saved("gpt_memory")["layers"]
    configs = list(dict.fromkeys(tuple(r["config"][k] for k in ("hidden", "heads", "seq", "batch")) for r in layers))
    lines = []
    for c in configs:
        rows = {r["remat"]: r for r in layers if tuple(r["config"][k] for k in ("hidden", "heads", "seq", "batch")) == c}
        cells = [_bytes_pair(rows[k]["xla_per_layer"], rows[k]["paper_per_layer"], rows[k]["ratio"])
                 for k in ("paper", "selective", "full")]
        none = rows["no remat"]
        cells.append(f"{round(none['xla_per_layer']):,} ({none['ratio']:.2f}x)")
        lines.append("| " + " | ".join(map(str, c)) + " | " + " | ".join(cells) + " |")
    guide = _memory_guide()
    missing = [line for line in lines if line not in guide]
    assert not missing, f"rows of the saved run docs/data/bench_gpt_memory.json not in the memory guide: {missing}"
    text = " ".join(guide.split())
    policed = [abs(r["ratio"] - 1) for r in layers if r["remat"] != "no remat"]
    stated = re.search(r"Every policy is within ([\d.]+)% of the paper's variant", text)
    assert stated and 0 <= float(stated.group(1)) - max(policed) * 100 < 0.1, (stated, max(policed))  # a tight bound
    assert "`\"selective\"` and `\"full\"` keep the paper's bytes exactly" in text and "each less than one s·b·h " \
        "float32 tensor" in text
    for r in layers:
        c = r["config"]
        if r["remat"] in ("selective", "full"):
            assert r["xla_per_layer"] == r["paper_per_layer"], r
        elif r["remat"] == "paper":
            assert abs(r["xla_per_layer"] - r["paper_per_layer"]) < c["seq"] * c["batch"] * c["hidden"] * 4, r
    none = [r["ratio"] for r in layers if r["remat"] == "no remat"]
    assert f"{min(none):.1f}-{max(none):.1f}x in all" in text


def test_the_memory_guides_gpt_figures_are_the_saved_run():
    """The formula against torch's saved tensors, and the whole step against the estimate without remat."""
    configs = _saved("gpt_memory")["configs"]
    text = " ".join(_memory_guide().split())
    dev = [abs(r["torch_vs_flash"]) * 100 for r in configs]
    assert f"within {min(dev):.1f}-{max(dev):.1f}% over {len(configs)} GPT configurations" in text
    total = [r["total_ratio"] for r in configs]
    assert f"is {min(total):.1f}-{max(total):.1f}x the estimate without remat" in text


def test_the_memory_guides_layout_table_is_the_saved_run():
    """The planner against XLA's compiled step per layout: benchmarks/layout_memory.py's table of its saved run."""
    rows = [dict(r, layout=tuple(r["layout"])) for r in _saved("layout_memory")["rows"]]
    assert _script("layout_memory").table(rows) in _memory_guide()


def test_the_memory_guides_layout_prose_is_the_saved_run():
    """The paragraph under the layout table: each layout's deviation it names, how many layouts are within 10%,
    the state's slack, the data axis's combined all-reduce and its temps, one device's temps and the fsdp
    axis's largest all-gather, all read from the same saved run."""
    rows = {tuple(r["layout"]): r for r in _saved("layout_memory")["rows"]}

    def deviation(r):
        return (r["arguments"] + r["temps"]) / r["plan"]["total"] - 1

    text = " ".join(_memory_guide().split())
    named = re.findall(r"`\((\d), (\d), (\d)\)` \(?([+-]\d+\.\d)%", text)
    assert len(named) >= 5, named
    for *layout, stated in named:
        assert stated == f"{deviation(rows[tuple(map(int, layout))]) * 100:+.1f}", (layout, stated)
    words = ["None", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight"]
    within = sum(abs(deviation(r)) <= 0.10 for r in rows.values())
    assert f"{words[within]} layouts are within 10%" in text
    slack = max(r["arguments"] - r["plan"]["params"] - r["plan"]["optimizer"] for r in rows.values())
    assert f"the planner's to within {slack} bytes" in text
    dp = rows[(2, 1, 1)]
    assert f"({dp['largest all-reduce'].replace(' B', ' bytes')} on `(2, 1, 1)`)" in text
    assert f"temps of {dp['temps']:,} bytes are {dp['temps'] / dp['plan']['grads']:.2f}x the gradients" in text
    one = rows[(1, 1, 1)]
    assert f"one device's temps, {one['temps']:,}, are less than its gradients alone, {one['plan']['grads']:,}" in text
    assert one["temps"] < one["plan"]["grads"]
    assert f"the largest all-gather is `{rows[(1, 4, 1)]['largest all-gather']}`" in text


def test_the_memory_guides_mesh_figures_are_the_tensor_parallel_comparisons_saved_run():
    """Per-device bytes over the plan and the collectives of each mesh, from the JAX side's table in
    docs/data/comparisons.json (tests/test_saved_run.py keeps it true)."""
    run = json.loads((Path(__file__).resolve().parents[1] / "docs" / "data" / "comparisons.json").read_text())
    out = next(r for r in run["results"] if r["name"] == "tensor_parallel")["jax"]["output"]
    # mesh, losses, all-reduce, all-gather, other, bytes moved, per-device bytes, planned, ratio
    row = r"^(one device|TP 2|TP 4|FSDP 2 x TP 2) +\S+ -> \S+ +(\d+) +(\d+) +(\d+) +([\d,]+) +[\d,]+ +[\d,]+ +([\d.]+)$"
    mesh = {m.group(1): [int(x.replace(",", "")) for x in m.groups()[1:5]] + [m.group(6)]
            for m in re.finditer(row, out, re.M)}
    assert set(mesh) == {"one device", "TP 2", "TP 4", "FSDP 2 x TP 2"}, out
    text = " ".join(_memory_guide().split())
    ratios = {k: v[-1] for k, v in mesh.items()}
    assert (f"the totals are {ratios['one device']}x (one device), {ratios['TP 2']}x (TP 2), {ratios['TP 4']}x (TP 4) "
            f"and {ratios['FSDP 2 x TP 2']}x (FSDP 2 x TP 2) the plan") in text
    ar, ag, _, moved = mesh["TP 2"][:4]
    assert f"The TP 2 step moves {moved:,} bytes in {ar} all-reduces and {ag} all-gathers" in text
    ar, ag, other, moved = mesh["FSDP 2 x TP 2"][:4]
    assert f"FSDP 2 x TP 2 {moved:,} bytes in {ar + ag + other} collectives" in text


def test_the_memory_guides_checkpointing_figures_are_the_comparisons_saved_run():
    """torch's saved bytes against the estimate and XLA's gradient temps with and without full remat, from the
    activation_checkpointing comparison in docs/data/comparisons.json."""
    run = json.loads((Path(__file__).resolve().parents[1] / "docs" / "data" / "comparisons.json").read_text())
    result = next(r for r in run["results"] if r["name"] == "activation_checkpointing")
    checks = {c["name"]: c["detail"] for c in result["checks"]}
    none, full = (re.search(r"\(([+-][\d.]+%)\)", d).group(1) for name, d in checks.items()
                  if name.startswith("torch saved bytes"))
    temps = {m.group(1): int(m.group(2).replace(",", "")) for m in
             re.finditer(r"^(GPT\(remat=\S+\)) +temps +([\d,]+)", result["jax"]["output"], re.M)}
    text = " ".join(_memory_guide().split())
    assert f"torch's saved bytes match the estimate for no and full recomputation ({none}, {full})" in text
    plain, full_remat = temps["GPT(remat=None)"], temps["GPT(remat='full')"]
    assert f"fall from {plain / 1e6:.1f} MB (`GPT`) to {full_remat / 1e6:.1f} MB" in text, temps

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


def test_conv_tapsum_quick_run_checks_every_formulation(tmp_path):
    """benchmarks/conv_tapsum.py --quick: every tap-sum formulation, and with --weight-grad both
    forms of the weight gradient, are timed and match torch."""
    out = tmp_path / "tapsum.json"
    assert _script("conv_tapsum").main(["--quick", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert set(row["ms"]) == {"funcnet", "mask by product", "channels-last flat", "plane matrix",
                              "plane matrix, summed", "torch"}
    assert all(t > 0 for t in row["ms"].values()) and row["ok"]
    assert all(e <= row["tolerance"] for e in row["max_abs_err"].values())
    assert _script("conv_tapsum").main(["--quick", "--weight-grad", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert set(row["ms"]) == {"funcnet", "banded", "batch-summed taps", "torch"} and row["ok"]


def test_conv_directions_finds_every_convolution_and_checks_each_direction(tmp_path, monkeypatch):
    """benchmarks/conv_directions.py --quick: the hook finds each Conv2d call (ResNet-18 has 20
    convolutions, 11 distinct at 32 px), every direction and the per-tap weight gradient match
    torch, and a wrong per-tap weight gradient fails the run."""
    import torch

    script = _script("conv_directions")
    models = _script("conv_models")
    convs = script.model_convolutions(models.torch_resnet18(widths=(4, 8, 8, 8)), torch.zeros(2, 3, 32, 32))
    assert sum(convs.values()) == 20 and len(convs) == 11
    assert next(iter(convs)) == (2, 3, 32, 4, 7, 2, 3, 1)  # the stem first: batch, in, size, out, kernel, stride, pad
    out = tmp_path / "directions.json"
    assert script.main(["--quick", "--model", "resnet_style", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert sum(r["count"] for r in result["rows"]) == 12  # stem, two a block, three 1x1 shortcuts
    for row in result["rows"]:
        assert row["ok"] and set(row["errors"]) == {"funcnet forward", "funcnet input gradient",
                                                    "funcnet weight gradient", "per tap weight gradient"}
        assert all(t > 0 for t in row["ms"].values())
    assert set(result["funcnet_over_torch"]) == {"forward", "input gradient", "weight gradient"}
    right = script.weight_grad_per_tap  # one convolution, its per-tap weight gradient 1% off
    monkeypatch.setattr(script, "weight_grad_per_tap", lambda x, g, *a: 1.01 * right(x, g, *a))
    monkeypatch.setattr(script, "model_convolutions", lambda module, x: {(2, 4, 8, 8, 3, 1, 1, 1): 1})
    assert script.main(["--quick", "--model", "resnet_style"]) == 1


@pytest.mark.slow
def test_batchnorm_quick_run_checks_every_column_against_torch(tmp_path, capsys):
    norm = (BENCHMARKS.parent / "funcnet" / "nn" / "functional" / "norm.py").read_text()
    assert _script("batchnorm").main(["--quick", "--baseline", str(BENCHMARKS.parent / "funcnet" / "nn" /
                                                                  "functional" / "norm.py")]) == 0
    assert "WRONG" not in capsys.readouterr().out
    # a baseline whose tangent drops the xhat term of the input gradient is caught
    broken = tmp_path / "norm.py"
    mutated = norm.replace("c = -jnp.mean(xhat * t,", "c = 0 * jnp.mean(xhat * t,")
    assert mutated != norm
    broken.write_text(mutated)
    assert _script("batchnorm").main(["--quick", "--baseline", str(broken)]) == 1
    assert "WRONG" in capsys.readouterr().out


def test_step_profile_groups_a_traced_step_by_kind_of_kernel(tmp_path):
    """benchmarks/step_profile.py --quick (in a child: it confines its process to one core): the
    first losses agree with torch, the traced kernels are grouped into the three kinds, and the
    kind of a kernel follows from the name XLA gave its fusion."""
    import subprocess
    import sys

    kind_of = _script("step_profile").kind_of
    assert kind_of("ynn_fusion.12") == kind_of("dot.3") == "convolutions and matmuls"
    assert kind_of("transpose_copy_fusion.30") == kind_of("copy_bitcast_fusion") == kind_of("wrapped_copy.1") \
        == kind_of("bitcast_copy_fusion.7") == "layout copies"
    assert kind_of("broadcast_select_fusion") == kind_of("multiply_add_fusion.4") == "elementwise and the rest"
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "step_profile.py"), "--quick", "--model", "resnet_style",
                           "--steps", "2", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["kernel_ms_by_kind"]) == {"convolutions and matmuls", "layout copies", "elementwise and the rest"}
    assert result["kernel_ms_by_kind"]["convolutions and matmuls"] > 0 and result["kernel_ms_total"] > 0
    assert result["top_kernels"] and all(k["kind"] == kind_of(k["name"]) for k in result["top_kernels"])
    assert result["torch_top_ops"] and result["step_ms"]["funcnet"] > 0 and result["step_ms"]["torch"] > 0
