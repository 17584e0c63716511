"""The guides' figures that come from the memory planner's arithmetic or from a saved example run.

The planner (``funcnet.memory``) is pure arithmetic, so its figures in docs/guides/memory.md are
recomputed here from the code itself. The port examples' and the character-level GPT's figures
(docs/guides/port-and-train.md, docs/guides/language-model.md) come from full example runs, minutes
each, saved with their command, date, machine and load by
``python -m docs_hooks.save_bench --example NAME [ARGS]`` as docs/data/example_NAME[-FLAG].json;
these tests compare the pages with those runs (tests/test_examples.py runs each example at its
``--quick`` setting, and in full with ``FUNCNET_FULL_EXAMPLES=1``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docs_hooks import save_bench
from funcnet import memory
from funcnet.cli import memory as memory_command
from funcnet.memory import layout

ROOT = Path(__file__).resolve().parents[1]
GB = 80 * 10**9


def _text(page: str) -> str:
    return " ".join((ROOT / "docs" / page).read_text().split())  # lines joined, as the page shows them


def _example(name: str, *args: str) -> str:
    """The saved run's standard output, after checking that it records where and how it ran."""
    path = save_bench.example_path(name, args)
    assert path.exists(), f"{path.relative_to(ROOT)}: no saved run; python -m docs_hooks.save_bench --example " \
                          f"{' '.join((name, *args))}"
    saved = json.loads(path.read_text())
    run = saved["run"]
    assert run["command"] == " ".join(["python", f"examples/{name}.py", *args]), run["command"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", run["date"]) and len(run["load"]) == 2, run
    assert "cores" in run["machine"] and {"jax", "torch"} <= set(run["versions"]), run
    return saved["result"]["stdout"]


# ----------------------------------------------------------------------------- memory.md: the planner
def test_the_memory_guides_articles_figures_are_the_estimates():
    """The articles' 7B table, the counted 7B shape's parts and which batch x length the 20-50 GB covers."""
    text = _text("guides/memory.md")
    est = memory.estimate("7B", "adam")
    assert (f"{est.params / 1e9:.0f} GB of params, {est.grads / 1e9:.0f} GB of gradients and "
            f"{est.optimizer / 1e9:.0f} GB of Adam state ({est.total / 1e9:.0f} GB)") in text
    low, high = (memory.estimate("7B", "adam", activations=a * 10**9).total for a in (20, 50))
    assert f"With 20-50 GB of activations that comes to {low / 1e9:.0f}-{high / 1e9:.0f} GB" in text

    n = memory.transformer_params(32, 4096, 32000, 2048)
    act = memory.transformer_activations(32, 4096, 32, 2048, 1, vocab=32000)  # the CLI's defaults: 16 bits, dropout
    shape = memory.estimate(n, "adam", activations=act)
    assert (f"for the {n / 1e9:.2f}B parameters of that shape, {shape.params / 1e9:.2f} GB params + "
            f"{shape.grads / 1e9:.2f} GB grads + {shape.optimizer / 1e9:.2f} GB Adam + {act / 1e9:.2f} GB of "
            f"activations at batch 1 × 2048 tokens") in text
    inside = [f"{b}×{s}" for b in memory_command.GRID_BATCH for s in memory_command.GRID_SEQ
              if 20e9 <= memory.transformer_activations(32, 4096, 32, s, b, vocab=32000) <= 50e9]
    assert f"The articles' \"20-50 GB\" holds at {', '.join(inside[:-1])} and {inside[-1]}." in text


SEVEN_B = layout.Shape(n_layer=32, n_embd=4096, n_head=32, vocab_size=32000, block_size=2048, batch=8)
SEVENTY_B = layout.Shape(n_layer=80, n_embd=8192, n_head=64, vocab_size=32000, block_size=4096, batch=8)


def _layout_row(name: str, shape: layout.Shape, n: int) -> str:
    """One row of the guide's 7B/70B table, computed by the planner: GB per GPU of five layouts, how many
    layouts fit and the smallest fitting one."""
    shape = shape._replace(batch=n)  # one sequence per GPU
    columns = [layout.Layout(dp=n), layout.Layout(fsdp=n), layout.Layout(dp=n // 8, tp=8, sp=True, remat="selective"),
               layout.Layout(fsdp=n // 8, tp=8, sp=True, remat="selective"), layout.Layout(fsdp=n, remat="full")]
    cells = []
    for column in columns:
        p = layout.plan(shape, column._replace(precision="bf16"), device_memory=GB)
        cells.append(f"{p.total / 1e9:.0f}{'' if p.fits else ' ✗'}")
    every = layout.layouts(n, shape, sp=(False, True))
    fitting = sum(bool(layout.plan(shape, lay, device_memory=GB).fits) for lay in every)
    best = layout.smallest_fitting(n, shape, GB, sp=(False, True))
    smallest = "none" if best is None else (
        f"{str(best.layout).replace('remat none', 'no remat').replace('remat full', 'full remat')} "
        f"({best.total / 1e9:.1f} GB)")
    return f"| {name}, seq {shape.block_size} | {n} | " + " | ".join(cells) + f" | {fitting} / {len(every)} | {smallest} |"


def test_the_memory_guides_7b_and_70b_layout_table_is_the_planners():
    """Every cell of the table recomputed from funcnet.memory.layout, and the prose under it."""
    guide = (ROOT / "docs" / "guides" / "memory.md").read_text()
    rows = [_layout_row(name, shape, n) for name, shape in (("7B", SEVEN_B), ("70B-like", SEVENTY_B)) for n in (8, 64)]
    missing = [row for row in rows if row not in guide]
    assert not missing, f"rows of the planner's table not in docs/guides/memory.md: {missing}"
    text = " ".join(guide.split())
    n7, n70 = (layout._param_count(s, layout.Layout()) for s in (SEVEN_B, SEVENTY_B))
    assert f"(LLaMA-7B's shape with a GELU MLP, {n7 / 1e9:.1f}e9 parameters)" in text
    assert f"(80 layers, h 8192, 64 heads, {n70 / 1e9:.1f}e9)" in text

    def state(p):
        return p.params + p.grads + p.master + p.optimizer

    replicated = layout.plan(SEVEN_B, layout.Layout(dp=8, precision="bf16"))
    split = layout.plan(SEVENTY_B, layout.Layout(fsdp=8, precision="bf16"))
    one_sequence = layout.plan(SEVENTY_B._replace(batch=1), layout.Layout(precision="bf16"))
    assert f"Replication never fits ({state(replicated) / 1e9:.0f} GB of state for the 7B)" in text
    assert f"the 70B fits on no 8 GPUs ({state(split) / 1e9:.0f} GB of state per GPU even split 8 ways)" in text
    scores = 1 - (memory.transformer_activations(80, 8192, 64, 4096, 1, vocab=32000, dropout=False, flash=True)
                  / memory.transformer_activations(80, 8192, 64, 4096, 1, vocab=32000, dropout=False))
    assert round(scores * 3) == 2, scores  # "two thirds"
    assert (f"its activations at 4096 tokens ({one_sequence.activations / 1e9:.0f} GB per sequence without remat, "
            f"two thirds of them the s² attention scores)") in text


# ----------------------------------------------------------------------------- port-and-train.md: the port examples
def _bound(stated: str, measured: float) -> bool:
    """``stated`` is an upper bound on ``measured`` given to its last digit (not a loose one)."""
    mantissa, exponent = stated.split("e")
    step = 10.0 ** (int(exponent) - len(mantissa.split(".")[-1]) if "." in mantissa else int(exponent))
    return measured <= float(stated) < measured + step


@pytest.mark.parametrize("name, bar", [("port_cnn", None), ("port_resnet", "0.85")])
def test_the_port_guides_table_is_the_saved_example_runs(name, bar):
    """Lines of code, the largest difference from torch in float32 and float64 and the test accuracy
    after the example's epochs: each row of the guide's table against the example's saved runs."""
    text = _text("guides/port-and-train.md")
    row = re.search(rf"\| `python examples/{name}.py`: [^|]+\| (\d+) / (\d+) \| ≤ (\S+) \(float32\), ≤ (\S+) "
                    rf"\(float64, `--float64`\) \| ([\d.]+)% \((\d+) epochs[;)]", text)
    assert row, f"docs/guides/port-and-train.md: no row for examples/{name}.py in the form this test reads"
    lines_torch, lines_ours, f32, f64, accuracy, epochs = row.groups()
    for stated, out in ((f32, _example(name)), (f64, _example(name, "--float64"))):
        diffs = re.search(r"max \|funcnet - torch\| \((float\d+), \d+ SGD-momentum steps\): (.*)", out)
        worst = max(float(v) for v in re.findall(r"\w+ (\S+?)(?:,|$)", diffs.group(2)))
        assert _bound(stated, worst), (name, diffs.group(1), stated, worst)
    out = _example(name)
    assert re.search(r"lines of code: torch (\d+), funcnet (\d+)", out).groups() == (lines_torch, lines_ours)
    trained = re.search(r"on digits, (\d+) epochs: .* test accuracy (\S+) ", out)
    assert trained.group(1) == epochs and accuracy == f"{float(trained.group(2)) * 100:.1f}", (trained.group(0), row)
    if bar is not None:  # the bar the guide names is the example's
        assert f"the example's bar is {float(bar) * 100:.0f}%" in text
        assert f"min_accuracy={bar}" in (ROOT / "examples" / f"{name}.py").read_text()


# ----------------------------------------------------------------------------- parallel.md: the DDP comparison
def test_the_parallel_guides_ddp_figure_is_the_data_parallel_comparisons_saved_run():
    """"They also match torch DDP (2 gloo processes) to 3e-8": the largest difference of the three forms'
    final weights from torch DDP's in docs/data/comparisons.json (tests/test_saved_run.py keeps it true)."""
    run = json.loads((ROOT / "docs" / "data" / "comparisons.json").read_text())
    checks = {c["name"]: c["detail"] for r in run["results"] if r["name"] == "data_parallel" for c in r["checks"]}
    worst = max(float(re.search(r"max \|diff\| (\S+),", checks[f"{form}: final weights == torch DDP's"]).group(1))
                for form in ("pmap", "shard_map", "sharding"))
    stated = re.search(r"They also match torch DDP \(2 gloo processes\) to (\S+)\.", _text("guides/parallel.md"))
    assert stated, "docs/guides/parallel.md no longer states the data-parallel comparison's agreement with DDP"
    assert float(stated.group(1)) == float(f"{worst:.0e}"), (stated.group(1), worst)


# ----------------------------------------------------------------------------- language-model.md: gpt_text.py
def test_the_language_model_guide_quotes_the_saved_example_run():
    """The model, the budget, the validation loss and the greedy sample are those of the saved full run of
    examples/gpt_text.py (tests/test_bench_page.py checks the bits per character and the baselines)."""
    out = _example("gpt_text")
    guide = (ROOT / "docs" / "guides" / "language-model.md").read_text()
    stated = re.search(r"`python examples/gpt_text.py`: a ([\d.]+)M-parameter GPT \((\d+) layers, (\d+) heads, width "
                       r"(\d+), context (\d+)\) trained (\d+) steps of (\d+)x(\d+) characters \((\d+) epochs; the saved "
                       r"run, `docs/data/example_gpt_text.json`, records its time, machine and load\) reaches "
                       r"\*\*([\d.]+) nats/char\*\*", " ".join(guide.split()))
    assert stated, "docs/guides/language-model.md no longer states the example's run in the form this test reads"
    params, layers, heads, width, context, steps, batch, length, epochs, nats = stated.groups()
    config = dict(re.findall(r"(\w+)=(\w+)", out.splitlines()[0]))
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["block_size"]) == (layers, heads, width,
                                                                                             context), config
    counted = int(re.search(r"([\d,]+) parameters", out).group(1).replace(",", ""))
    assert params == f"{counted / 1e6:.2f}", (params, counted)
    budget = re.search(r"budget: (\d+) epochs = ([\d,]+) steps of (\d+) x (\d+)", out).groups()
    assert budget == (epochs, steps, batch, length), budget
    val_loss = float(re.search(r"validation loss (\S+) nats/char", out).group(1))
    assert nats == f"{val_loss:.2f}", (nats, val_loss)
    sample = re.search(r"Greedy sample:\n\n```\n(.*)\n```", guide).group(1)
    greedy = out.split("--- greedy, prompt 'The ' ---\n")[1].split("\n\n--- temperature")[0]
    shown = sample.removesuffix(" ...")
    assert greedy.startswith(shown) and len(shown) >= 40, (sample, greedy[:200])


def test_the_memory_guides_whole_step_with_paper_remat_is_the_saved_run():
    """The whole train step with GPT(remat="paper") against the estimate, over the saved run's configurations
    (benchmarks/gpt_memory.py, docs/data/bench_gpt_memory.json)."""
    configs = json.loads((ROOT / "docs" / "data" / "bench_gpt_memory.json").read_text())["result"]["configs"]
    ratios = [r["paper_total_ratio"] for r in configs]
    text = _text("guides/memory.md")
    assert f"the estimate without remat and {min(ratios):.1f}-{max(ratios):.1f}x with `\"paper\"`" in text, ratios


def test_save_bench_names_an_unknown_example_and_where_runs_are_saved(capsys):
    assert save_bench.main(["--example", "nope"]) == 2
    assert "give an example's name (got ['nope']); one of [" in capsys.readouterr().err
    assert save_bench.example_path("port_cnn", ["--float64"]).name == "example_port_cnn-float64.json"
    assert save_bench.example_path("gpt_text").name == "example_gpt_text.json"


def test_the_port_guides_batchnorm_tolerances_are_the_tests():
    """The tolerances the guide quotes for the BatchNorm MLP are those tests/test_batchnorm_training.py applies."""
    source = (ROOT / "tests" / "test_batchnorm_training.py").read_text()
    f32_rtol, f32_atol, f64_rtol = re.search(r'^TOL = \{"float32": dict\(rtol=(\S+), atol=(\S+)\), "float64": '
                                             r"dict\(rtol=(\S+),", source, re.M).groups()
    assert (f"(the test allows {f32_rtol} relative + {f32_atol} absolute) and to {f64_rtol} relative in float64"
            in _text("guides/port-and-train.md")), (f32_rtol, f32_atol, f64_rtol)


def test_the_design_pages_pipeline_figures_are_the_planners():
    """design.md quotes what its pipeline block prints: the first stage's activations and total, 1F1B and GPipe."""
    shape = SEVEN_B
    printed = []
    for kind in ("1f1b", "gpipe"):
        p = layout.plan(shape, layout.Layout(pp=4, microbatches=8, schedule=kind))
        printed.append(f"{kind} {p.activations / 1e9:.2f} GB of activations, {p.total / 1e9:.2f} GB in all")
    assert "prints `{}` and `{}`".format(*printed) in _text("design.md"), printed


def test_the_mixed_precision_guides_underflow_figures_are_the_saved_example_run():
    """The float16 weight gradients that underflow to zero without and with loss scaling, per layer: the
    saved full run of examples/loss_scaling_underflow.py (40 epochs, scale 2**16)."""
    out = _example("loss_scaling_underflow")
    epochs = re.search(r"trained (\d+) epochs in float32", out).group(1)
    lo, hi, slo, shi, scale = re.search(r"underflow to zero: (\S+)%-(\S+)% without scaling, (\S+)%-(\S+)% with "
                                        r"scale (\S+)", out).groups()
    assert float(scale) == 2.0**16, scale
    assert (f"After {epochs} epochs, without scaling {lo}%-{hi}% of the float16 weight-gradient entries (per layer) "
            f"underflow to zero; with a scale of 2**16, {slo}%-{shi}% do (the saved run") in _text("guides/mixed-precision.md")
