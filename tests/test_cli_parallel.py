"""``funcnet train --parallel fsdp | zero1 | zero2 | tp``: the sharded strategies from the command line give the
one-device run's params (the oracle: the same command on one device), and what a strategy cannot take is refused
in one line before training."""

import numpy as np
import pytest

from funcnet import cli

# SGD: each weight moves by lr * gradient, so float32 rounding of the gradient's sum order stays ~1e-7 after 3 steps
# (Adam would turn the rounding of a near-zero gradient into an lr-sized step)
MLP = ["--hidden", "32", "--optimizer", "sgd", "--lr", "0.5", "--batch-size", "64", "--max-steps", "3", "--quiet"]


def _params(tmp_path, name, *flags):
    out = tmp_path / name
    assert cli.main(["train", *MLP, "--out", str(out), *flags]) == 0
    return np.load(out / "params.npz")


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    return _params(tmp_path_factory.mktemp("one"), "one")


@pytest.mark.parametrize("kind", ["fsdp", "tp"])
def test_sharded_strategies_from_the_command_line_equal_one_device(tmp_path, kind, one):
    two = _params(tmp_path, kind, "--devices", "2", "--parallel", kind)
    assert two.files == one.files
    for k in one.files:  # weights of size <= 1, 3 steps of lr 0.5: 1e-5 is ~100x the rounding, 1e-3 under a bug
        np.testing.assert_allclose(two[k], one[k], rtol=0, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("flags, fragment", [
    (["--model", "gpt", "--devices", "2", "--parallel", "tp"], "--parallel tp takes --model mlp; for --model gpt"),
    (["--model", "cnn", "--devices", "2", "--parallel", "tp"], "--parallel tp takes --model mlp; for --model cnn"),
    (["--hidden", "30", "--devices", "4", "--parallel", "tp"], "--devices 4, which does not divide --hidden 30"),
])
def test_what_tp_cannot_take_is_one_line(tmp_path, capsys, flags, fragment):
    assert cli.main(["train", "--epochs", "1", "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err
