"""The Benchmarks page states only the saved runs' figures (docs/data/bench_NAME.json).

docs/benchmarks.md holds placeholders that docs_hooks.benchmarks fills at build time. These
tests check that each saved run records where and how it ran, that the page's hand-written
text states no measured number, and that every number a filled placeholder shows is one of
its run's values (formatted as shown) or, for the figures the prose derives, the value this
test derives from the run itself. tests/test_site.py checks the built page.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import pytest

from docs_hooks import benchmarks

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]\d+)?")
# numbers in the hand-written text that are no measurement: a model's layer sizes and issue numbers
NOT_MEASURED = {"784-128-10", "jax-ml/jax#23783", "openxla/xla#34273"}


SAVED = sorted(p.stem.removeprefix("bench_") for p in benchmarks.DATA.glob("bench_*.json"))  # the guides' too


@pytest.mark.parametrize("name", SAVED)
def test_each_saved_run_records_machine_load_command_and_date(name):
    saved = benchmarks.load(name)
    run = saved["run"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2} UTC)?", run["date"]), run["date"]
    assert len(run["load"]) == 2 and all(isinstance(x, (int, float)) and x >= 0 for x in run["load"])
    assert "AMD" in run["machine"] or "Intel" in run["machine"] or "cores" in run["machine"], run["machine"]
    assert {"jax", "torch"} <= set(run["versions"])
    named = re.match(r"python benchmarks/(\w+)\.py", run["command"])
    script = ROOT / "benchmarks" / f"{named.group(1) if named else name}.py"
    if script.exists():  # the command is the script's (saved as NAME, or NAME_PART with --name), with its flags
        assert named and (name == script.stem or name.startswith(script.stem + "_")), (name, run["command"])
        source = script.read_text()
        for flag in re.findall(r"(?<!\S)--[a-z][a-z-]*", run["command"]):
            assert f'"{flag}"' in source, (name, flag)
    if "transcribed_from" in run:  # figures copied from an earlier page name the commit that first stated them
        assert re.search(r"commit [0-9a-f]{7,}", run["transcribed_from"]), run["transcribed_from"]
    else:
        assert "seconds" in run and run["load"][0] >= 0


def _hand_written(text: str) -> str:
    """The page's own text: everything but placeholders and code spans (every section reads its saved runs)."""
    text = benchmarks.PLACEHOLDER.sub("", text)
    text = re.sub(r"`[^`]*`", "", text)
    for token in NOT_MEASURED:
        text = text.replace(token, "")
    return text


def test_the_page_states_no_figure_by_hand():
    text = PAGE.read_text()
    lines = [line for line in _hand_written(text).splitlines() if NUMBER.search(line)]
    assert not lines, f"numbers stated by hand in docs/benchmarks.md (make them placeholders): {lines}"
    used = {m.group(2) for m in benchmarks.PLACEHOLDER.finditer(text)}
    assert used == set(benchmarks.BENCHES), "every saved run is on the page, and only those"
    assert "{{" not in benchmarks.PLACEHOLDER.sub("", text), "a placeholder the hook does not know"


def _values(node) -> list[float]:
    """Every number in a saved result, including those inside its strings (the goals' figures)."""
    if isinstance(node, bool) or node is None:
        return []
    if isinstance(node, (int, float)):
        return [float(node)]
    if isinstance(node, str):
        return [float(t.replace(",", "").rstrip("%")) for t in NUMBER.findall(node)]
    items = node.values() if isinstance(node, dict) else node
    return [v for item in items for v in _values(item)]


def _shown_as(value: float, token: str) -> bool:
    if "e" in token:
        return f"{value:.{len(token.split('e')[0].split('.')[-1])}e}" == token
    decimals = len(token.split(".")[1]) if "." in token else 0
    plain = token.replace(",", "")
    return f"{value:.{decimals}f}" == plain or (decimals == 0 and f"{value:g}" == plain)


def _unexplained(text: str, values: list[float]) -> list[str]:
    candidates = [s * v for v in values for s in (1.0, 1e3, 1e-6, 1 / 2**20)]
    return [t for t in NUMBER.findall(text) if not any(_shown_as(c, t) for c in candidates)]


@pytest.mark.parametrize("name", benchmarks.BENCHES)
def test_every_number_in_a_table_is_its_runs(name):
    saved = benchmarks.load(name)
    text = benchmarks.table(name, saved)
    values = _values(saved["result"])
    if name == "main_command":  # the sentence under the table: cold over warm, computed here
        steps = {s["step"].split()[0]: s for s in saved["result"]["steps"]}
        values += [steps["first"][k] / steps["second"][k] for k in ("wall_s", "cpu_s")]
    if name == "start_up":  # the rounds column: how many runs each median is over
        values += [len(r["cpu"]["off"]) for r in saved["result"].values()]
    if name == "conv_sweep":  # the funcnet / torch ratio per row, forward and train step
        values += [r[k]["funcnet"] / r[k]["torch"] for r in saved["result"]["sweep"]
                   for k in ("forward_ms", "train_ms")]
    if name.startswith("conv_models"):  # torch's time over funcnet's, eager and compiled, forward and train step
        values += [r[k][t] / r[k]["funcnet"] for r in saved["result"]["models"] for k in ("forward_ms", "train_ms")
                   for t in ("torch", "torch.compile") if t in r[k]]
    if name == "parallel_step":  # planned over compiled bytes per row
        values += [r["planned_bytes"] / r["bytes_per_device"] for r in saved["result"]["pipeline"] + saved["result"]["zero"]]
    assert NUMBER.findall(text), f"{name}: the table shows no number"
    assert not _unexplained(text, values), (name, _unexplained(text, values))


def test_the_prose_figures_are_derived_from_the_runs():
    """Each ``{{ figure NAME KEY }}`` against the same figure computed here from the run."""
    models = benchmarks.load("models")["result"]["rows"]
    ms = {(r["model"], r["impl"]): r for r in models}
    conv_mb = {impl: r["peak_mb"] for (model, impl), r in ms.items() if model == "convnet"}
    start_up = benchmarks.load("start_up")["result"]
    cold_over_off = [statistics.median(c / o for c, o in zip(r["cpu"]["cold"], r["cpu"]["off"]))
                     for r in start_up.values()]
    off_over_warm = [r["cpu_ratios"]["off"] for r in start_up.values()]
    xla_over_torch = [r[k]["lax.conv"] / r[k]["torch"] for r in benchmarks.load("conv_sweep")["result"]["sweep"]
                      for k in ("forward_ms", "train_ms")]
    expected = {
        ("models", "convnet_ours_mb"): f"{conv_mb['funcnet make_step']:.1f}",
        ("models", "convnet_peers_mb"): "{:.1f}-{:.1f}".format(
            min(conv_mb[p] for p in benchmarks.PEERS), max(conv_mb[p] for p in benchmarks.PEERS)),
        ("models", "lstm_vs_cell_loop"): "{:.1f}".format(
            ms[("lstm", "torch LSTMCell loop")]["ms_per_step"] / ms[("lstm", "funcnet run_epoch")]["ms_per_step"]),
        ("conv_sweep", "xla_worst"): f"{max(xla_over_torch):.0f}",
        ("start_up", "cpu_off_over_warm"): f"{min(off_over_warm):.2f}x-{max(off_over_warm):.2f}x",
        ("start_up", "cold_over_off"): f"{min(cold_over_off):.2f}-{max(cold_over_off):.2f}",
    }
    used = {(m.group(2), m.group(3)) for m in benchmarks.PLACEHOLDER.finditer(PAGE.read_text())
            if m.group(1) == "figure"}
    assert used <= set(expected), f"a figure this test does not derive: {used - set(expected)}"
    for name, key in used:
        got = benchmarks.render(f"{{{{ figure {name} {key} }}}}")
        assert got == expected[(name, key)], (name, key, got)


def test_the_throughput_prose_holds_in_the_run():
    """"`run_epoch` is bitwise equal to the `make_step` loop", at every batch size of the run."""
    assert "`run_epoch` is bitwise equal to the `make_step` loop" in " ".join(PAGE.read_text().split())
    rows = [r for r in benchmarks.load("throughput")["result"]["rows"] if r["impl"] == "funcnet run_epoch"]
    assert rows and all(r["bitwise_equal_make_step"] for r in rows), rows


def test_the_models_prose_verdict_holds_in_the_run():
    """"funcnet's faster row is ahead of every JAX peer on every model in this run"."""
    assert "funcnet's faster row is ahead of every JAX peer on every model in this run" in " ".join(
        PAGE.read_text().split())
    rows = benchmarks.load("models")["result"]["rows"]
    for model in {r["model"] for r in rows}:
        ours = [r for r in rows if r["model"] == model and r["impl"].startswith("funcnet")]
        fastest = min(ours, key=lambda r: r["ms_per_step"])
        assert all(fastest["vs"][p] > 1 for p in benchmarks.PEERS), (model, fastest["impl"], fastest["vs"])


def test_the_convolution_runs_are_complete_and_checked_against_torch():
    """Every sweep row and model matched torch, the sweep's stated worst ratio is its rows', and the
    models run timed what its command asked for (torch.compile with ``--compile``)."""
    sweep = benchmarks.load("conv_sweep")
    rows = sweep["result"]["sweep"]
    assert rows and all(r["ok"] for r in rows), [r["shape"] for r in rows if not r["ok"]]
    worst = max(r[k]["funcnet"] / r[k]["torch"] for r in rows for k in ("forward_ms", "train_ms"))
    stated = sweep["result"]["worst_sweep_ratio"]
    assert abs(stated - worst) <= 1e-9 * worst, (stated, worst)  # the same float divisions: equal but for rounding
    assert "--quick" not in sweep["run"]["command"] and "--part sweep" in sweep["run"]["command"]
    for name in ("conv_models", "conv_models_grid"):
        models = benchmarks.load(name)
        cells = models["result"]["models"]
        assert cells and all(r["ok"] for r in cells), [(r["model"], r["variant"]) for r in cells if not r["ok"]]
        command = models["run"]["command"]
        assert "--quick" not in command and "--part models" in command
        compiled = "--compile" in command
        assert all(("torch.compile" in r["forward_ms"]) == compiled for r in cells), command
    # the grid: every model and variant at 32, 64 and 224 px, batch 8 and 64 (the script's defaults)
    grid = {(r["model"], r["variant"], r["size"], r["batch"]) for r in benchmarks.load("conv_models_grid")["result"]["models"]}
    variants = {(m, v) for m, v, _, _ in grid}
    assert variants >= {("resnet18", "converted"), ("resnet18", "hand-written"), ("convnext", "converted"),
                        ("convnext", "hand-written"), ("mobilenetv3", "converted")}, variants
    assert grid == {(m, v, s, b) for m, v in variants for s in (32, 64, 224) for b in (8, 64)}


def test_the_parallel_step_run_has_every_plan_within_10_percent_of_the_compiled_step():
    """The saved run's planner rows (funcnet.memory.layout.plan) against its compiled bytes, on CPU."""
    saved = benchmarks.load("parallel_step")
    result = saved["result"]
    assert "--cpu" in saved["run"]["command"], saved["run"]["command"]
    rows = result["pipeline"] + result["zero"]
    assert {r["zero"] for r in result["zero"]} == {0, 1, 2, 3} and {r["schedule"] for r in result["pipeline"]} == {
        "gpipe", "1f1b"}
    worst = max(abs(r["planned_bytes"] / r["bytes_per_device"] - 1) for r in rows)
    assert worst <= 0.10 and result["planner_within_10_percent"], worst


def _zoo():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import convert_zoo_libraries
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    saved = benchmarks.load("convert_zoo_libraries")
    return convert_zoo_libraries, saved, {r["model"]: r for r in saved["result"]["rows"]}


def _zoo_inputs(rows: dict, *statuses: str) -> list:
    return [(r["model"], x.get("size", "fresh batch"), x["status"], x.get("why")) for r in rows.values()
            for x in [r] + r.get("sizes", []) if x["status"] in statuses]


def test_the_converter_zoo_run_checked_every_model_at_other_shapes_and_nothing_crashed():
    """The zoo's saved run (benchmarks/convert_zoo_libraries.py --lengths): every model of its lists
    (or, for a run stopped early, those it names as not run; never a --lengths held-out one),
    each converted one checked at every other input of its kind (three text lengths, two image
    sizes) beside the fresh batch; no input CRASH; each model's overall status is its worst
    input's; the counts the page shows are the rows'."""
    zoo, saved, rows = _zoo()
    result, command = saved["result"], saved["run"]["command"]
    assert result["lengths"] and "--lengths" in command and "--models" not in command, command
    not_run = result.get("not_run", [])  # a run stopped early lists the models it did not reach
    assert sorted([*rows, *not_run], key=list(zoo.MODELS).index) == list(zoo.MODELS) and not set(rows) & set(not_run)
    assert list(rows) == [n for n in zoo.MODELS if n in rows], "the rows in the lists' order"
    assert set(zoo.LENGTHS_HELD_OUT) <= set(rows), "every --lengths held-out model was run"
    assert set(result["resumed"]) <= set(rows)
    for name, r in rows.items():
        assert r["set"] == zoo._group(name)
        if "convert_s" in r:  # converted: checked at each other input
            lists = sys.modules["convert_zoo_models"]  # imported by the script
            kinds = lists.LENGTHS if zoo.MODELS[name][3] == 0 else lists.SIZES
            assert len(r["sizes"]) == len(kinds), name
        assert r["status_all"] == zoo.worst([r["status"]] + [x["status"] for x in r.get("sizes", [])]), name
    assert not _zoo_inputs(rows, "CRASH")
    assert result["counts"] == {g: zoo.counts([r for r in rows.values() if r["model"] in members])
                                for g, members in zoo.GROUPS.items()}


def test_the_converter_zoo_run_has_no_wrong_input():
    """No input of the zoo's saved run is WRONG (a silent error)."""
    _, _, rows = _zoo()
    assert not _zoo_inputs(rows, "WRONG")


def test_the_page_renders_and_a_bad_placeholder_is_named(tmp_path):
    page = benchmarks.render(PAGE.read_text())
    assert "{{" not in page
    for name in benchmarks.BENCHES:
        assert benchmarks.provenance(benchmarks.load(name)) in page
    with pytest.raises(ValueError, match="no benchmark 'nope'"):
        benchmarks.render("{{ table nope }}")
    with pytest.raises(ValueError, match="bench_models.json: no saved run.*save_bench models"):
        benchmarks.render("{{ table models }}", data=tmp_path)


# ----------------------------------------------------------------------------- the guides' figures
def _text(page: str) -> str:
    return " ".join((ROOT / "docs" / page).read_text().split())  # lines joined, as the page shows them


def test_getting_started_quotes_the_main_commands_saved_run():
    steps = {s["step"].split()[0]: s["wall_s"] for s in benchmarks.load("main_command")["result"]["steps"]}
    stated = re.search(r"install took (\d+) minutes? .* first run of the comparisons ([\d.]+) minutes .* take "
                       r"([\d.]+) minutes", _text("getting-started.md"))
    assert stated, "docs/getting-started.md no longer states the main command's times"
    expected = (f"{steps['install'] / 60:.0f}", f"{steps['first'] / 60:.1f}", f"{steps['second'] / 60:.1f}")
    assert stated.groups() == expected
    readme = " ".join((ROOT / "README.md").read_text().split())
    stated = re.search(r"the install takes about (\d+) minutes? .* the first run about ([\d.]+) minutes and later runs, "
                       r"which read the compiled programs from the cache, about ([\d.]+)\.", readme)
    assert stated and stated.groups() == expected, "README.md's install and first/later run times"


def test_getting_started_quotes_the_autodiff_comparisons_saved_run():
    """The TwoLayerNet's accuracy and the weights' spread are the saved run's (tests/test_saved_run.py keeps
    docs/data/comparisons.json true)."""
    import json

    run = json.loads((ROOT / "docs" / "data" / "comparisons.json").read_text())
    checks = {c["name"]: c["detail"] for r in run["results"] if r["name"] == "autograd_from_scratch" for c in r["checks"]}
    accuracy = float(checks["test accuracy after training: funcnet.autodiff == jax.grad"].split(" == ")[0])
    spread = max(float(re.search(r"max \|diff\| (\S+),", d).group(1))
                 for name, d in checks.items() if name.startswith("trained parameters"))
    stated = re.search(r"with `jax.grad` and torch \(([\d.]+)%\)\. The three runs' weights differ by at most (\S+)\.",
                       _text("getting-started.md"))
    assert stated, "docs/getting-started.md no longer states the autodiff run's accuracy and spread"
    assert stated.group(1) == f"{accuracy * 100:.1f}"
    assert float(stated.group(2)) == float(f"{spread:.1e}")


def test_the_mixed_precision_guides_cpu_claims_hold_in_the_saved_run():
    """The guide: every matmul of the compiled bf16 step is float32, and the step needs more scratch memory."""
    rows = {r["mode"]: r for r in benchmarks.load("precision")["result"]["rows"]}
    guide = _text("guides/mixed-precision.md")
    assert "(every matmul of the compiled bf16 step is float32), and the step needs more scratch memory" in guide
    assert re.fullmatch(r"\d+xf32", rows["bf16"]["matmul_dtypes"]), rows["bf16"]["matmul_dtypes"]
    assert rows["bf16"]["temps_vs_fp32"] > 1, rows["bf16"]
    assert "on a CPU both half-precision steps need more temporaries than fp32's" in guide
    assert rows["bf16"]["temps_bytes"] > rows["fp32"]["temps_bytes"] < rows["fp16"]["temps_bytes"], rows


def test_the_language_model_guide_quotes_the_gpt_comparisons_saved_run_and_the_baselines():
    """The float32 loss agreement is the saved run's; the unigram and uniform baselines are the corpus's,
    and bits per character are nats over ln 2."""
    import json
    import math

    from funcnet import text

    guide = _text("guides/language-model.md")
    run = json.loads((ROOT / "docs" / "data" / "comparisons.json").read_text())
    checks = {c["name"]: c for r in run["results"] if r["name"] == "gpt" for c in r["checks"]}
    loss = next(c for name, c in checks.items() if name.startswith("training loss per step"))
    measured = float(re.search(r"max \|diff\| (\S+),", loss["detail"]).group(1))
    stated = re.search(r"losses agree step by step to (\S+) in float32 in the saved run \(tolerance (\S+):", guide)
    assert stated, "docs/guides/language-model.md no longer states the GPT comparison's loss agreement"
    atol = re.search(r"atol (\S+)", loss["tolerance"])
    assert float(stated.group(1)) == float(f"{measured:.1e}"), (stated.group(1), measured)
    assert atol and float(stated.group(2)) == float(atol.group(1)), (stated.group(2), loss["tolerance"])
    stated = re.search(r"reaches \*\*([\d.]+) nats/char\*\* on the validation split \(([\d.]+) bits/char\), against "
                       r"([\d.]+) for the unigram baseline and ([\d.]+) for uniform guessing", guide)
    assert stated, "docs/guides/language-model.md no longer states the example's validation loss and baselines"
    nats, bits, unigram, uniform = stated.groups()
    assert bits == f"{float(nats) / math.log(2):.2f}"
    assert unigram == f"{text.unigram_entropy():.2f}" and uniform == f"{math.log(text.vocabulary().size):.2f}"
