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
