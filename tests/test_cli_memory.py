"""`funcnet memory`'s flags and output: contradicting or absurd flags are refused before any work,
tables print whole when piped or at 80 columns, and --json holds the funcnet.memory functions' figures."""

from __future__ import annotations

import json
import re

import pytest

from funcnet.cli import memory as memory_command
from funcnet.memory import (
    PRECISIONS,
    estimate,
    parse_count,
    transformer_activations,
    transformer_params,
)
from funcnet.memory import layout as ml

SHAPE = ["--transformer", "--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "32000", "--seq", "2048",
         "--batch", "8", "--precision", "bf16"]
SEVEN_B = ml.Shape(32, 4096, 32, 32000, 2048, 8, dropout=True)


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        memory_command.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flags, message", [
    (["--layouts", "4", "--dp", "8", "--tp", "2"],
     ("--layouts 4 lists every dp x fsdp x tp (with and without sp) of 4 devices, so --dp 8 --tp 2 contradicts it")),
    (["--layouts", "8", "--fsdp", "1"], "so --fsdp 1 contradicts it: leave it out"),
    (["--layouts", "8", "--sp"], "so --sp contradicts it"),
    (["--layouts", "0"], "--layouts 0: expected a number of devices from 1 to 1,048,576"),
    (["--layouts", "-3"], "--layouts -3: expected a number of devices from 1 to 1,048,576"),
    (["--layouts", "1000000000"], "--layouts 1000000000: expected a number of devices from 1 to 1,048,576"),
    (["--dp", "2", "--flash"], "--flash does not apply to a layout"),
    (["--tp", "2", "--params", "7B", "--activation-dtype", "fp32"], "--params, --activation-dtype do not apply"),
])
def test_contradicting_or_absurd_layout_flags_are_refused_before_any_work(flags, message, capsys, monkeypatch):
    for name in ("layouts", "plan", "smallest_fitting"):
        monkeypatch.setattr(ml, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran before the flags were checked"))
    err = refused(SHAPE + flags, capsys)
    assert message in err, err


def test_the_largest_layouts_count_is_accepted(capsys):
    most = memory_command.LAYOUTS_MAX
    assert memory_command.main(SHAPE + ["--batch", str(most), "--layouts", str(most), "--remat", "full", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["layouts"]
    assert {g["layout"]["dp"] * g["layout"]["fsdp"] * g["layout"]["tp"] for g in got} == {most}
    assert len(got) == len(ml.layouts(most, SEVEN_B._replace(batch=most), sp=(False, True), remats=("full",)))


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.parametrize("terminal", [False, True])
def test_tables_print_every_figure_whole_at_80_columns(terminal, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    if terminal:  # rich treats the output as an 80-column terminal
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert memory_command.main(SHAPE + ["--layouts", "4", "--device-memory", "80GB"]) == 0
    out = _plain(capsys.readouterr().out)
    assert "…" not in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    lays = ml.layouts(4, SEVEN_B, sp=(False, True), precision="bf16")
    assert len(rows) == len(lays)
    for row, lay in zip(rows, lays):
        plan = ml.plan(SEVEN_B, lay, device_memory=80 * 10**9)
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[3:6] == ["1", "yes" if lay.sp else "-", lay.remat]  # pp, sp, remat
        assert cells[6:14] == [f"{v / 1e9:,.2f}" for v in (plan.params, plan.grads, plan.reduce_buffer, plan.accum_buffer,
                                                             plan.master, plan.optimizer, plan.activations, plan.total)], row
    assert memory_command.main(SHAPE) == 0  # the estimate table and the grid
    out = _plain(capsys.readouterr().out)
    assert "…" not in out and "247,245,832,192" in out


def test_remat_with_layouts_restricts_the_list(capsys):
    assert memory_command.main(SHAPE + ["--layouts", "4", "--remat", "full", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["layouts"]
    want = ml.layouts(4, SEVEN_B, sp=(False, True), remats=("full",), precision="bf16")
    assert [g["layout"] for g in got] == [lay._asdict() for lay in want]


def test_json_holds_the_library_figures(capsys):
    assert memory_command.main(["--params", "7B", "--optimizer", "sgd", "--precision", "bf16", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    n = parse_count("7B")
    assert got["parameters"] == n
    assert got["bytes"] == estimate(n, "sgd", activations=0, **PRECISIONS["bf16"]).as_dict()

    assert memory_command.main(SHAPE + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    n = transformer_params(32, 4096, 32000, 2048)
    act = transformer_activations(32, 4096, 32, 2048, 8, vocab=32000, bytes_per_value=2)
    assert got["parameters"] == got["counted_parameters"] == n
    assert got["activations"] == {"bytes": act, "batch": 8, "seq": 2048}
    assert got["bytes"] == estimate(n, "adam", activations=act, **PRECISIONS["bf16"]).as_dict()
    assert {(c["batch"], c["seq"]): c["bytes"] for c in got["grid"]} == {
        (b, s): transformer_activations(32, 4096, 32, s, b, vocab=32000, bytes_per_value=2)
        for b in memory_command.GRID_BATCH for s in memory_command.GRID_SEQ}

    assert memory_command.main(SHAPE + ["--fsdp", "4", "--tp", "2", "--remat", "selective", "--device-memory", "80GB",
                                        "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    plan = ml.plan(SEVEN_B, ml.Layout(1, 4, 2, remat="selective", precision="bf16"), device_memory=80 * 10**9)
    assert got["device_memory"] == 80 * 10**9
    assert got["layouts"] == [{**{k: v for k, v in plan._asdict().items() if k != "layout"},
                               "layout": plan.layout._asdict()}]

    assert memory_command.main(SHAPE + ["--layouts", "8", "--device-memory", "80GB", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    lays = ml.layouts(8, SEVEN_B, sp=(False, True), precision="bf16")
    assert [g["total"] for g in got["layouts"]] == [ml.plan(SEVEN_B, lay).total for lay in lays]
    best = ml.smallest_fitting(8, SEVEN_B, 80 * 10**9, sp=(False, True), precision="bf16")
    assert got["smallest_fitting"]["layout"] == best.layout._asdict() and got["smallest_fitting"]["total"] == best.total


@pytest.mark.parametrize("stage, paper_gb", [(1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_prints_the_zero_papers_first_figure(stage, paper_gb, capsys):
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, mixed-precision Adam (2 + 2 + K bytes, K = 12), Nd = 64
    psi, k, nd = 7.5e9, 12, 64
    closed = {1: 4 * psi + k * psi / nd, 2: 2 * psi + (2 + k) * psi / nd, 3: (2 + 2 + k) * psi / nd}[stage]
    argv = ["--params", "7.5B", "--optimizer", "adam", "--precision", "bf16", "--zero", str(stage), "--dp", "64"]
    assert memory_command.main(argv + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["per_device"]["total"] == pytest.approx(closed, rel=1e-12)
    assert got["bytes"]["total"] == (2 + 2 + k) * psi
    assert memory_command.main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"ZeRO-{stage} (Rajbhandari et al. 2020, Figure 1" in out
    assert f"{paper_gb} GB per device, 120.0 GB without ZeRO" in out
    # beside it funcnet's own step: float32 params (4 bytes, whole up to stage 2), Adam's 8 bytes over Nd, the
    # gradients (4) and their all-reduce buffer (4) whole at every stage, stage 3's gathered params (4)
    ours = {1: 4 * psi + 8 * psi / nd + 8 * psi, 2: 4 * psi + 8 * psi / nd + 8 * psi,
            3: 12 * psi / nd + 4 * psi + 8 * psi}[stage]
    assert got["funcnet_per_device"]["total"] == pytest.approx(ours, rel=1e-9)
    assert f"per device: funcnet's ZeRO-{stage} step over --dp 64" in out
    assert f"the ZeRO paper's formula, ZeRO-{stage} over --dp 64" in out


@pytest.mark.parametrize("flags, message", [
    (["--zero", "2"], "--zero 2 shards over the data-parallel devices: give their number, e.g. --dp 64"),
    (["--zero", "1", "--dp", "0"], "--dp 0: expected a number of devices from 1 to"),
    (["--zero", "2", "--dp", "8", "--fsdp", "2"], "--fsdp describes a dp x fsdp x tp layout instead"),
    (["--zero", "3", "--dp", "8", "--tp", "2", "--layouts", "16"], "--tp --layouts describe a dp x fsdp x tp layout"),
    (["--zero", "1", "--dp", "8", "--device-memory", "80GB"], "--device-memory describes"),
    (["--zero", "4", "--dp", "8"], "argument --zero: invalid choice: 4"),
])
def test_zero_with_contradicting_flags_is_refused(flags, message, capsys):
    err = refused(["--params", "7.5B"] + flags, capsys)
    assert message in err, err


def test_pipeline_flags_give_the_first_stages_plan(capsys):
    flags = ["--tp", "2", "--pp", "4", "--microbatches", "8", "--schedule", "gpipe", "--remat", "selective"]
    assert memory_command.main(SHAPE + flags + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)["layouts"]
    plan = ml.plan(SEVEN_B, ml.Layout(tp=2, pp=4, microbatches=8, schedule="gpipe", remat="selective",
                                      precision="bf16"))
    assert got == [{**{k: v for k, v in plan._asdict().items() if k != "layout"}, "layout": plan.layout._asdict()}]
    assert got[0]["layout"]["pp"] == 4 and plan.accum_buffer == plan.grads > 0
    assert memory_command.main(SHAPE + flags) == 0
    out = " ".join(_plain(capsys.readouterr().out).split())
    assert "it holds 8 of the 8 microbatches' stage inputs (1 sequence each)" in out
    assert "stages of funcnet.parallel.pipeline" in out and "the larger of that rerun and the accum buffer" in out


@pytest.mark.parametrize("flags, message", [
    (["--pp", "3"], "pp=3 stages do not split the 32 layers"),
    (["--pp", "2", "--dp", "2", "--microbatches", "8"],
     "the batch of 4 sequences per data replica (global batch 8 over dp x fsdp = 2) does not split into microbatches=8"),
    (["--pp", "0"], "--pp 0: expected an int from 1 to"),
    (["--layouts", "8", "--pp", "2"], "--layouts 8 lists dp x fsdp x tp layouts without a pipeline, so --pp contradicts"),
    (["--pp", "2", "--schedule", "zb"], "argument --schedule: invalid choice"),
])
def test_impossible_pipelines_are_refused_naming_both_numbers(flags, message, capsys):
    assert message in refused(SHAPE + flags, capsys)


def test_pipeline_flags_without_a_transformer_or_with_zero_are_refused(capsys):
    assert "need --transformer" in refused(["--params", "7B", "--pp", "2"], capsys)
    assert "--pp describes" in refused(["--params", "7B", "--zero", "1", "--dp", "8", "--pp", "2"], capsys)
