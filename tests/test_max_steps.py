"""``fit(max_steps=)`` / ``funcnet train --max-steps``: the run stops after that many optimizer
steps, writes its outputs and checkpoint as at a normal end, and a resumed run continues exactly;
the progress bar ends on the step count an epoch really ran."""

import contextlib
import io
import json
import re
import signal

import jax
import numpy as np
import optax
import pytest

import funcnet
from funcnet import cli, data, nn

FLAGS = ["--epochs", "2", "--optimizer", "sgd", "--lr", "0.1", "--hidden", "16", "--quiet"]


def test_max_steps_stops_inside_an_epoch_and_a_resumed_run_ends_as_an_uninterrupted_one(tmp_path, capsys):
    per_epoch = len(data.load("digits")[0][0]) // 32  # --batch-size 32
    stop = per_epoch + per_epoch // 2  # half way through epoch 2
    ck, short = str(tmp_path / "ck"), tmp_path / "short"
    assert cli.main(["train", *FLAGS, "--max-steps", str(stop), "--out", str(short), "--checkpoint-dir", ck]) == 0
    shown = capsys.readouterr().out
    assert f"trained {stop} steps (--max-steps) in 2 epochs" in shown
    assert "devices: 1 (cpu)\n" in shown and "resumed" not in shown
    metrics = json.loads((short / "metrics.json").read_text())
    assert [(h["epoch"], h["step"]) for h in metrics["history"]] == [(1, per_epoch), (2, stop)]
    assert metrics["config"]["max_steps"] == stop and "test_accuracy" in metrics["final"]
    assert funcnet.checkpoint.latest_step(ck) == stop  # saved where it stopped, not at the last epoch's end

    # the oracle: the same flags without a limit, in one go
    assert cli.main(["train", *FLAGS, "--out", str(tmp_path / "whole")]) == 0
    capsys.readouterr()
    assert cli.main(["train", *FLAGS, "--out", str(tmp_path / "resumed"), "--checkpoint-dir", ck, "--resume"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"resumed from step {stop} in {ck}\ndevices: 1 (cpu)\n"), shown  # before it trains
    whole, resumed = (np.load(tmp_path / d / "params.npz") for d in ("whole", "resumed"))
    for k in whole.files:
        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=k)
    history = [json.loads((tmp_path / d / "metrics.json").read_text())["history"] for d in ("whole", "resumed")]
    assert history[0] == history[1]


def test_max_steps_at_an_epoch_end_and_its_bad_values(tmp_path, capsys):
    per_epoch = len(data.load("digits")[0][0]) // 32
    out = tmp_path / "one"
    assert cli.main(["train", *FLAGS, "--max-steps", str(per_epoch), "--out", str(out)]) == 0
    assert [h["step"] for h in json.loads((out / "metrics.json").read_text())["history"]] == [per_epoch]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", *FLAGS, "--max-steps", "0", "--out", str(tmp_path / "zero")])
    assert exit_.value.code == 2
    assert "argument --max-steps: expected a positive integer, got 0" in capsys.readouterr().err
    x, y = np.ones((8, 3), np.float32), np.zeros(8, np.int32)
    with pytest.raises(ValueError, match="max_steps must be a positive int or None"):
        funcnet.fit(nn.MLP([3, 2]), optax.sgd(0.1), (x, y), epochs=1, batch_size=2, key=jax.random.key(0),
                    max_steps=0, progress=False)


def test_help_names_max_steps_and_the_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-steps N stop after N optimizer steps" in text
    text = text.split("options:", 1)[1]
    for flag, default in (("--epochs", "20"), ("--batch-size", "32"), ("--lr", "0.001"), ("--optimizer", "adam")):
        # the flag's own help (up to the next flag) names its default
        assert re.search(rf"{flag} \S+ [^-]*default {re.escape(default)}\b", text), flag


def test_the_progress_bar_ends_on_the_steps_the_epoch_ran(capsys):
    x, y = np.ones((800, 3), np.float32), np.zeros(800, np.int32)  # 400 steps of 2 per epoch: a step count shows
    model, tx = nn.MLP([3, 2]), optax.sgd(0.1)
    funcnet.fit(model, tx, (x, y), epochs=2, batch_size=2, key=jax.random.key(0))
    shown = capsys.readouterr().out
    assert "epoch 2/2" in shown and "step 400/400" in shown and "step 0/400" not in shown
    state, history = funcnet.fit(model, tx, (x, y), epochs=2, batch_size=2, key=jax.random.key(0), max_steps=550)
    shown = capsys.readouterr().out
    assert "step 150/400" in shown and int(state.step) == 550 and history[-1]["step"] == 550


TINY = ["--quiet", "--hidden", "8", "--batch-size", "128", "--optimizer", "sgd", "--lr", "0.1"]  # 11 steps an epoch


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as e:
            status = e.code
    return status, out.getvalue(), err.getvalue()


def _files(folder):
    """Every file under ``folder`` but the run's lock as (bytes, modification time): the same values mean
    untouched."""
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.name != ".lock"}


def _rerun_is_a_no_op(line, ck, out, stop):
    """The same line run again after the run finished: one line, exit 0, --out and the checkpoints untouched."""
    before, saved = _files(out), _files(ck)
    assert _run(line) == (0, f"the run in {ck} is finished ({stop}) and --out {out} holds its outputs: nothing to "
                             f"train (pass a larger --max-steps or --epochs to go on)\n", "")
    assert _files(out) == before and _files(ck) == saved
    return before, saved


def test_a_sigterm_recovered_max_steps_run_ends_whole_and_a_rerun_leaves_out_byte_identical(tmp_path, monkeypatch):
    # the restart-safe line the docs give schedulers: killed by SIGTERM between the checkpoint at the stop
    # and --out, restarted (it must write the complete history), then run again after it finished
    limit = ["--epochs", "2", "--max-steps", "15"]  # stops 4 steps into epoch 2
    assert _run(["train", *TINY, *limit, "--out", str(tmp_path / "whole")])[0] == 0  # the oracle: uninterrupted
    ck, out = tmp_path / "ck", tmp_path / "out"
    line = ["train", *TINY, *limit, "--checkpoint-dir", str(ck), "--resume", "auto", "--out", str(out)]
    real = funcnet.state_dict

    def state_dict(*a, **k):  # after the last checkpoint, before --out is written
        signal.raise_signal(signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(funcnet, "state_dict", state_dict)
    assert _run(line)[0] == 143 and not out.exists() and funcnet.checkpoint.latest_step(ck) == 15
    monkeypatch.undo()
    status, shown, err = _run(line)  # the scheduler restarts the same line
    assert status == 0 and shown.startswith(f"resumed from step 15 in {ck}\n"), err
    assert (out / "metrics.json").read_bytes() == (tmp_path / "whole" / "metrics.json").read_bytes()
    assert [(h["epoch"], h["step"]) for h in json.loads((out / "metrics.json").read_text())["history"]] == \
        [(1, 11), (2, 15)]
    whole, resumed = (np.load(tmp_path / d / "params.npz") for d in ("whole", "out"))
    for k in whole.files:
        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=k)

    before, saved = _rerun_is_a_no_op(line, ck, out, "step 15, --max-steps 15")
    # a smaller --max-steps cannot go back: one line, nothing touched
    assert _run([*line, "--max-steps", "14"]) == (
        2, "", f"funcnet train: error: --resume: the run in {ck} is at step 15, past --max-steps 14; pass "
               f"--max-steps 15 or more (a run cannot go back)\n")
    assert _files(out) == before and _files(ck) == saved


def test_a_rerun_of_a_run_finished_by_its_epochs_leaves_out_byte_identical(tmp_path):
    ck, out = tmp_path / "ck", tmp_path / "out"
    line = ["train", *TINY, "--epochs", "1", "--checkpoint-dir", str(ck), "--resume", "auto", "--out", str(out)]
    assert _run(line)[0] == 0
    _rerun_is_a_no_op(line, ck, out, "step 11, --epochs 1")
