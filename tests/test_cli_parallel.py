"""``funcnet train --parallel fsdp | zero1 | zero2 | tp | pipe``: the sharded strategies from the command line give the
one-device run's params (the oracle: the same command on one device), and what a strategy cannot take is refused
in one line before training."""

import argparse

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from funcnet import cli, gpt
from funcnet import step as fstep
from funcnet.cli import train as cli_train
from funcnet.parallel import stages as pipe_stages
from funcnet.parallel import tensor as tp

# SGD: each weight moves by lr * gradient, so float32 rounding of the gradient's sum order stays ~1e-7 after 3 steps
# (Adam would turn the rounding of a near-zero gradient into an lr-sized step)
LR, BATCH, STEPS = 0.5, 64, 3
MLP = ["--hidden", "32", "--optimizer", "sgd", "--lr", str(LR), "--batch-size", str(BATCH), "--max-steps", str(STEPS),
       "--quiet"]
# a gradient element is a float32 sum of BATCH per-example terms of size <= 1 (weights and inputs <= 1, softmax
# gradients <= 1) added in another order: at most BATCH * eps apart; SGD moves each weight by LR times it, per step.
# About 1.1e-5, where a wrong average (a factor 2, one device's half batch) is > 1e-3 here.
ATOL = STEPS * LR * BATCH * float(np.finfo(np.float32).eps)


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
    for k in one.files:
        np.testing.assert_allclose(two[k], one[k], rtol=0, atol=ATOL, err_msg=k)


def test_the_mlp_in_two_pipeline_stages_from_the_command_line_equals_one_device(tmp_path, monkeypatch, one):
    cuts = []  # the run is pipelined (a data-parallel run would give the same params): parallel.stages cuts the MLP

    def split(model, loss_fn, params, x, y, stages, split_points=None):
        plan = real(model, loss_fn, params, x, y, stages, split_points)
        cuts.append((stages, plan.cuts))
        return plan

    real = pipe_stages.split
    monkeypatch.setattr(pipe_stages, "split", split)
    two = _params(tmp_path, "pipe", "--devices", "2", "--parallel", "pipe")
    assert [s for s, _ in cuts] == [2], cuts
    assert two.files == one.files
    for k in one.files:  # as above: the microbatches' gradients are float32 sums in another order
        np.testing.assert_allclose(two[k], one[k], rtol=0, atol=ATOL, err_msg=k)


@pytest.mark.parametrize("flags, fragment", [
    (["--model", "cnn", "--devices", "2", "--parallel", "pipe"],
     "--parallel pipe takes --model mlp or gpt; for --model cnn: the ConvNet's BatchNorm keeps running statistics"),
    (["--model", "lstm", "--devices", "2", "--parallel", "pipe"], "for --model lstm: its layers run as one LSTM"),
    (["--hidden", "32", "--devices", "4", "--parallel", "pipe"],
     "splits the MLP's 2 Linear layers into --stages 4; use at most 2 stages"),
    (["--model", "gpt", "--n-layer", "3", "--devices", "2", "--parallel", "pipe"],
     "--n-layer 3 blocks into --stages 2, which does not divide it"),
    (["--devices", "4", "--stages", "3", "--parallel", "pipe"], "--stages 3 does not divide --devices 4"),
    (["--devices", "2", "--parallel", "pipe", "--batch-size", "30", "--microbatches", "4"],
     "--batch-size 30 does not split into --microbatches 4"),
    (["--devices", "2", "--stages", "2"], "--stages set the pipeline of --parallel pipe; add --parallel pipe"),
    (["--devices", "2", "--parallel", "pipe", "--precision", "bf16"], "--parallel pipe trains in float32"),
])
def test_what_pipe_cannot_take_is_one_line(tmp_path, capsys, flags, fragment):
    assert cli.main(["train", "--epochs", "1", "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("flags, fragment", [
    (["--model", "lstm", "--devices", "2", "--parallel", "tp"], "--parallel tp takes --model mlp or gpt; for "
                                                                  "--model lstm: an LSTM's gates are packed"),
    (["--model", "cnn", "--devices", "2", "--parallel", "tp"], "--parallel tp takes --model mlp or gpt; for --model cnn"),
    (["--model", "gpt", "--n-embd", "18", "--n-head", "2", "--devices", "4", "--parallel", "tp"],
     "--devices 4, which does not divide --n-embd 18"),
    (["--hidden", "30", "--devices", "4", "--parallel", "tp"], "--devices 4, which does not divide --hidden 30"),
])
def test_what_tp_cannot_take_is_one_line(tmp_path, capsys, flags, fragment):
    assert cli.main(["train", "--epochs", "1", "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err


def test_the_gpts_command_line_plan_is_megatrons_with_c_attn_whole():
    # nanoGPT's c_attn rows [q | k | v] split over devices into no whole heads: the command line keeps it whole
    # (each device computes the attention) and splits c_fc, both c_proj and the vocabulary where 2 divides it
    for vocab, wte in ((104, P("model", None)), (103, P())):
        model = gpt.build(vocab, 8, n_layer=1, n_head=2, n_embd=16)
        strategy = cli_train._strategy(argparse.Namespace(parallel="tp", model="gpt", devices=2), model)
        state = jax.eval_shape(lambda: fstep.create_train_state(model, optax.sgd(0.1), jax.random.key(0)))
        sh = tp.state_shardings(state, tp.mesh(1, 1, 2), plan=strategy.plan, model=model).params
        block = sh["transformer"]["h"]["0"]
        assert block["attn"]["c_attn"]["weight"].spec == P()
        assert block["mlp"]["c_fc"]["weight"].spec == P("model", None)
        assert block["attn"]["c_proj"]["weight"].spec == block["mlp"]["c_proj"]["weight"].spec == P(None, "model")
        assert sh["transformer"]["wte"]["weight"].spec == wte


@pytest.mark.slow  # the plan is checked above without compiling, the pipeline on the MLP; this trains the GPT
@pytest.mark.parametrize("kind", ["tp", "pipe"])
def test_the_gpt_on_two_devices_by_tp_or_pipe_equals_one_device(tmp_path, kind):
    flags = ["--model", "gpt", "--n-layer", "2", "--n-embd", "16", "--n-head", "2", "--block-size", "8",
             "--sample-chars", "5", "--optimizer", "sgd", "--lr", str(LR), "--batch-size", str(BATCH), "--max-steps",
             str(STEPS), "--quiet"]
    runs = {}
    for name, extra in (("one", []), (kind, ["--devices", "2", "--parallel", kind])):
        assert cli.main(["train", *flags, "--out", str(tmp_path / name), *extra]) == 0
        runs[name] = np.load(tmp_path / name / "params.npz")
    for k in runs["one"].files:
        # a GPT weight's gradient sums over every token, BATCH x --block-size 8 terms: ATOL's bound times 8
        np.testing.assert_allclose(runs[kind][k], runs["one"][k], rtol=0, atol=8 * ATOL, err_msg=k)
