"""``funcnet train --model gpt|lstm``'s edges: the LSTM on every ``--parallel`` path, the size
check before training, out-of-memory messages naming the model's own flags, and
``funcnet sample`` from a saved run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import cli, gpt, load_state_dict, models, parallel, text

LSTM = ["--model", "lstm", "--n-layer", "2", "--n-embd", "16", "--block-size", "8", "--sample-chars", "5", "--quiet"]
GPT = ["--model", "gpt", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8", "--sample-chars",
       "5", "--quiet"]
# SGD for the device comparison: Adam divides by the gradient's running RMS, which turns the rounding
# noise of a near-zero gradient entry into an lr-sized step; SGD moves each weight by lr * gradient
SGD = ["--optimizer", "sgd", "--lr", "0.5", "--batch-size", "64", "--max-steps", "3"]


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    out = tmp_path_factory.mktemp("lstm") / "one"
    assert cli.main(["train", *LSTM, *SGD, "--out", str(out)]) == 0
    return np.load(out / "params.npz")


# shard_map crashed (the scan's carry under shard_map); pmap and sharding, which worked, run with
# -m slow (tests/test_parallel_recurrent.py checks every recurrent layer on all three by default)
@pytest.mark.parametrize("kind", [k if k == "shard_map" else pytest.param(k, marks=pytest.mark.slow)
                                  for k in parallel.KINDS])
def test_lstm_on_two_devices_equals_one_device(tmp_path, kind, one_device):
    out = tmp_path / kind
    assert cli.main(["train", *LSTM, *SGD, "--devices", "2", "--parallel", kind, "--out", str(out)]) == 0
    two = np.load(out / "params.npz")
    assert two.files == one_device.files
    # the same batches; each device averages half of the 64 sequences' gradients and the halves are
    # averaged again, so each step's gradient differs by float32 rounding (1.2e-7 relative); three
    # steps of lr 0.5 on weights of size <= 1 leave about 1e-7, and 1e-5 still tells a wrong
    # average (a factor 2, or one device's half batch: > 1e-3 here)
    for k in one_device.files:
        np.testing.assert_allclose(two[k], one_device[k], rtol=0, atol=1e-5, err_msg=k)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["devices"] == 2 and metrics["final"]["step"] == 3


def test_language_models_too_big_are_refused_before_training(tmp_path, capsys, monkeypatch):
    from funcnet import train

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(train, "fit", no_training)
    for flags in (["--model", "gpt", "--n-layer", "64", "--n-embd", "16384", "--n-head", "8"],
                  ["--model", "lstm", "--n-layer", "40", "--n-embd", "100000"]):
        assert cli.main(["train", *flags, "--out", str(tmp_path / flags[1])]) == 2
        err = capsys.readouterr().err
        assert f"funcnet train: error: --model {flags[1]} with --n-layer {flags[3]} --n-embd {flags[5]}" in err
        assert "for one training step" in err and err.rstrip().endswith(
            "reduce --n-layer, --n-embd, --block-size or --batch-size")
        assert "reduce --hidden" not in err


def test_the_gpt_size_check_counts_the_parameters_the_model_has():
    # the closed form the check uses, against the parameters the built model really has
    from funcnet import memory

    vocab = text.vocabulary().size
    model = gpt.build(vocab, 32, n_layer=3, n_head=4, n_embd=48)
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    n = sum(leaf.size for leaf in jax.tree.leaves(shapes))  # the tied head is one array
    assert memory.transformer_params(3, 48, vocab, 32) == n


@pytest.mark.parametrize(("layers", "hidden", "seq", "batch"), [(2, 64, 32, 64), (1, 128, 16, 32)])
def test_the_lstm_size_check_is_near_what_xla_allocates(layers, hidden, seq, batch):
    # the oracle: XLA's buffer assignment for the compiled gradient of the LSTM's loss (nothing runs).
    # The closed form counts tensors; XLA reuses some buffers and adds scratch, so the two agree to
    # a small factor (seen 0.7-0.9), which is all a check refusing runs 10x too big needs
    from funcnet import losses, memory
    from funcnet.cli.sizes import lstm_activations

    vocab = text.vocabulary().size
    model = models.LSTMLM(vocab, hidden, hidden, layers, dropout=0.0, batch_first=True, return_hidden=False)
    params = jax.eval_shape(model.init, jax.random.key(0))
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    measured = memory.measure(jax.grad(lambda p, x: losses.cross_entropy(model.apply(p, x), x)), params, ids)
    assert 0.5 < lstm_activations(layers, hidden, vocab, seq, batch) / measured.temps < 1.5


@pytest.mark.parametrize("model", ["gpt", "lstm"])
def test_out_of_memory_names_the_flags_of_the_model_in_use(tmp_path, capsys, monkeypatch, model):
    from funcnet import train

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123 bytes.")

    monkeypatch.setattr(train, "fit", out_of_memory)
    flags = GPT if model == "gpt" else LSTM
    assert cli.main(["train", *flags, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "out of memory while training (RESOURCE_EXHAUSTED" in err
    assert "reduce --n-layer, --n-embd, --block-size or --batch-size" in err and "--hidden" not in err


@pytest.fixture(scope="module", params=["gpt", "lstm"])
def lm_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "run"
    flags = GPT if request.param == "gpt" else LSTM
    assert cli.main(["train", *flags, "--lr", "0.02", "--batch-size", "128", "--max-steps", "30", "--out", str(out),
                     "--checkpoint-dir", str(out.parent / "ck")]) == 0
    return request.param, out


def _greedy_by_hand(kind, run, prompt, n):
    """The oracle: the saved params loaded into a model built from the saved flags, then n times
    the model's apply on the context and the argmax of the last position's logits."""
    config = json.loads((run / "metrics.json").read_text())["config"]
    vocab = text.vocabulary()
    if kind == "gpt":
        model = gpt.build(vocab.size, config["block_size"], n_layer=config["n_layer"], n_head=config["n_head"],
                          n_embd=config["n_embd"])
    else:
        model = models.LSTMLM(vocab.size, config["n_embd"], config["n_embd"], config["n_layer"], dropout=0.0,
                              batch_first=True, return_hidden=False)
    with np.load(run / "params.npz") as saved:
        params = load_state_dict(model.init(jax.random.key(1)), {k: saved[k] for k in saved.files})
    apply = jax.jit(model.apply)
    ids, margins = list(vocab.encode(prompt)), []
    for _ in range(n):
        logits = np.asarray(apply(params, jnp.asarray([ids[-config["block_size"]:]], jnp.int32)))[0, -1]
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        ids.append(int(np.argmax(logits)))
    return vocab.decode(ids), margins


def test_sample_greedy_equals_a_greedy_decode_by_hand(lm_run, capsys):
    kind, run = lm_run
    prompt, n = "The value of ", 24
    assert cli.main(["sample", str(run), "--prompt", prompt, "--tokens", str(n), "--temperature", "0"]) == 0
    first = capsys.readouterr().out
    assert cli.main(["sample", str(run), "--prompt", prompt, "--tokens", str(n), "--temperature", "0",
                     "--seed", "7"]) == 0
    assert capsys.readouterr().out == first  # greedy draws nothing: any seed, the same text
    got = first[:-1]  # print's newline
    expected, margins = _greedy_by_hand(kind, run, prompt, n)
    assert len(got) == len(prompt) + n and got.startswith(prompt)
    if got != expected:
        # only a tie may go either way: the two programs round differently (1e-6 of logits of size ~5)
        i = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b) - len(prompt)
        assert margins[i] < 1e-4, (got, expected, i, margins[i])
    # the checkpoint folder holds the same parameters (the last checkpoint is at the last step)
    assert cli.main(["sample", str(run.parent / "ck"), "--prompt", prompt, "--tokens", str(n),
                     "--temperature", "0"]) == 0
    assert capsys.readouterr().out == first


def test_sample_with_a_temperature_is_seeded(lm_run, capsys):
    _, run = lm_run
    outs = []
    for seed in ("1", "1", "2"):
        assert cli.main(["sample", str(run), "--tokens", "40", "--temperature", "1.5", "--seed", seed]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and len(outs[0]) == 41 and outs[0] != outs[2]


def test_sample_refuses_what_is_not_a_language_model_run(tmp_path, capsys):
    (tmp_path / "mlp").mkdir()  # the two files an MLP run's --out holds that sample reads (loss.png aside)
    (tmp_path / "mlp" / "metrics.json").write_text(json.dumps({"config": {"model": "mlp", "hidden": [8]}}))
    np.savez(tmp_path / "mlp" / "params.npz", **{"0.weight": np.zeros((8, 64), np.float32)})
    (tmp_path / "empty").mkdir()
    cases = [(tmp_path / "missing", "does not exist; pass the --out folder"),
             (tmp_path / "mlp", "holds a --model mlp run; funcnet sample writes text from a --model gpt or"),
             (tmp_path / "empty", "holds neither metrics.json and params.npz (funcnet train --out) nor a checkpoint")]
    for path, message in cases:
        assert cli.main(["sample", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"funcnet sample: error: RUN_DIR {path}") and message in err, err
