"""`funcnet train --model cnn`: every flag works for a model with state (BatchNorm)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from funcnet import cli, data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from port_cnn import TorchConvNet  # noqa: E402

FAST = ["--model", "cnn", "--batch-size", "64", "--optimizer", "sgd", "--lr", "0.05", "--quiet"]


def _run(tmp_path, name, *flags):
    out = tmp_path / name
    assert cli.main(["train", *FAST, "--out", str(out), *flags]) == 0
    return np.load(out / "params.npz"), json.loads((out / "metrics.json").read_text())


def test_cnn_outputs_load_into_the_torch_twin(tmp_path):
    params, metrics = _run(tmp_path, "one", "--epochs", "1")
    theirs = TorchConvNet()
    assert list(params.files) == list(theirs.state_dict())  # parameters and buffers, torch's order
    theirs.load_state_dict({k: torch.from_numpy(params[k]) for k in params.files})
    assert int(params["bn1.num_batches_tracked"]) == metrics["final"]["step"] == len(data.load("digits")[0][0]) // 64
    assert metrics["model"].startswith("ConvNet(") and metrics["final"]["test_accuracy"] > 0.5


def test_cnn_resumed_from_a_mid_epoch_checkpoint_is_bitwise_equal(tmp_path):
    whole, _ = _run(tmp_path, "whole", "--epochs", "2")
    ck = str(tmp_path / "ck")
    _run(tmp_path, "first", "--epochs", "1", "--checkpoint-dir", ck, "--checkpoint-every", "7")
    resumed, _ = _run(tmp_path, "resumed", "--epochs", "2", "--checkpoint-dir", ck, "--checkpoint-every", "7",
                      "--resume")
    for k in whole.files:
        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=k)


@pytest.mark.parametrize("kind", ["shard_map", "pmap"])
def test_cnn_on_two_devices_in_bf16_with_checkpoints(tmp_path, kind):
    one, m1 = _run(tmp_path, "one", "--epochs", "1", "--precision", "bf16")
    two, m2 = _run(tmp_path, kind, "--epochs", "1", "--precision", "bf16", "--devices", "2", "--parallel", kind,
                   "--checkpoint-dir", str(tmp_path / f"ck-{kind}"))
    assert (tmp_path / f"ck-{kind}").exists() and m2["config"]["devices"] == 2
    # BatchNorm sees each device's half batch (DDP semantics), so the runs differ a little:
    # same keys, finite, and the same quality
    assert list(two.files) == list(one.files)
    assert all(np.isfinite(two[k]).all() for k in two.files)
    assert abs(m2["final"]["test_accuracy"] - m1["final"]["test_accuracy"]) < 0.1


def test_cnn_flags_that_do_not_fit_are_refused(tmp_path, capsys):
    assert cli.main(["train", "--model", "cnn", "--hidden", "64", "--out", str(tmp_path / "a")]) == 2
    assert "--hidden 64 sets the MLP's layers" in capsys.readouterr().err
    assert cli.main(["train", "--model", "cnn", "--dataset", "synthetic", "--out", str(tmp_path / "b")]) == 2
    assert "--model cnn needs square images" in capsys.readouterr().err


TINY_GPT = ["--model", "gpt", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16",
            "--batch-size", "1024", "--lr", "0.01", "--sample-chars", "20", "--quiet"]


@pytest.mark.slow
def test_gpt_trains_on_the_bundled_text_with_checkpoints_in_bf16(tmp_path):
    out = tmp_path / "gpt"
    assert cli.main(["train", *TINY_GPT, "--epochs", "1", "--precision", "bf16", "--out", str(out),
                     "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "10"]) == 0
    params = np.load(out / "params.npz")
    # nanoGPT's state_dict: the tied head is listed under both names, as torch lists it
    assert "transformer.wte.weight" in params.files and "lm_head.weight" in params.files
    np.testing.assert_array_equal(params["lm_head.weight"], params["transformer.wte.weight"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final"]["test_loss"] < metrics["unigram_baseline"]  # beats a model that ignores context
    assert len(metrics["sample"]) == 1 + 20 and metrics["model"].startswith("GPT(")
    assert len(set(metrics["sample"].strip())) >= 3  # real text: not empty, not one character repeated


@pytest.mark.slow
def test_gpt_remat_trains_to_the_same_params(tmp_path):
    # --remat changes what the backward keeps, not what it computes: the oracle is the plain run
    tiny = [*TINY_GPT, "--n-layer", "2", "--epochs", "1"]
    assert cli.main(["train", *tiny, "--out", str(tmp_path / "plain")]) == 0
    assert cli.main(["train", *tiny, "--remat", "full", "--out", str(tmp_path / "remat")]) == 0
    plain, remat = np.load(tmp_path / "plain" / "params.npz"), np.load(tmp_path / "remat" / "params.npz")
    assert plain.files == remat.files
    # float32: the scan's body compiles apart from the loop, so gradients differ by an ulp here and
    # there. The key's bias (c_attn.bias[C:2C]) is left out: it adds q.b_k to a whole row of scores,
    # which the softmax cancels, so its true gradient is 0 and Adam turns the rounding noise of
    # both runs into lr-sized steps (seen: 7e-4 apart, every other entry within 6e-6).
    C = 16
    for k in plain.files:
        a, b = remat[k], plain[k]
        if k.endswith("attn.c_attn.bias"):
            a, b = np.delete(a, np.s_[C:2 * C]), np.delete(b, np.s_[C:2 * C])
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=k)
    ours, theirs = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("remat", "plain"))
    assert "remat=full" in ours["model"] and "remat" not in theirs["model"]
    assert ours["final"]["test_loss"] == pytest.approx(theirs["final"]["test_loss"], rel=1e-4)


def test_gpt_flags_that_do_not_fit_are_refused(tmp_path, capsys):
    cases = [(["--model", "gpt", "--dataset", "digits"], "--model gpt does not train on --dataset digits"),
             (["--dataset", "text"], "--model mlp does not train on --dataset text"),
             (["--n-layer", "2"], "--n-layer set the GPT; --model mlp has no such setting"),
             (["--remat", "full"], "--remat set the GPT; --model mlp has no such setting"),
             (["--model", "gpt", "--n-embd", "30", "--n-head", "4"], "--n-embd 30 does not split over --n-head 4"),
             (["--model", "gpt", "--hidden", "64"], "--hidden sets the MLP's layers")]
    for i, (flags, message) in enumerate(cases):
        assert cli.main(["train", *flags, "--out", str(tmp_path / str(i))]) == 2, flags
        assert message in capsys.readouterr().err


TINY_LSTM = ["--model", "lstm", "--n-layer", "1", "--n-embd", "32", "--block-size", "16", "--batch-size", "1024",
             "--lr", "0.05", "--sample-chars", "20", "--quiet"]


@pytest.mark.slow
def test_lstm_trains_on_the_bundled_text_with_checkpoints_in_bf16(tmp_path):
    out = tmp_path / "lstm"
    assert cli.main(["train", *TINY_LSTM, "--epochs", "1", "--precision", "bf16", "--out", str(out),
                     "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "10"]) == 0
    params = np.load(out / "params.npz")
    # word_language_model's state_dict: the tied decoder is listed under both names, as torch lists it
    assert {"encoder.weight", "decoder.weight", "rnn.weight_hh_l0", "decoder.bias"} <= set(params.files)
    np.testing.assert_array_equal(params["decoder.weight"], params["encoder.weight"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final"]["test_loss"] < metrics["unigram_baseline"]  # beats a model that ignores context
    assert len(metrics["sample"]) == 1 + 20 and metrics["model"].startswith("RNNModel(LSTM")


def test_lstm_flags_that_do_not_fit_are_refused(tmp_path, capsys):
    cases = [(["--model", "lstm", "--dataset", "digits"], "--model lstm does not train on --dataset digits"),
             (["--model", "lstm", "--n-head", "2"], "--n-head set the GPT; --model lstm has no such setting"),
             (["--model", "lstm", "--remat", "full"], "--remat set the GPT; --model lstm has no such setting"),
             (["--model", "lstm", "--hidden", "64"], "--hidden sets the MLP's layers; --model lstm takes"),
             (["--model", "lstm", "--stream", str(tmp_path / "s")], "--model lstm trains on --dataset text")]
    for i, (flags, message) in enumerate(cases):
        assert cli.main(["train", *flags, "--out", str(tmp_path / str(i))]) == 2, flags
        assert message in capsys.readouterr().err
