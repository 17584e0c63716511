"""funcnet.models against their torch twins (examples/port_*.py): same weights, same batches."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import funcnet
from funcnet import models, nn, train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from _port import compare, source_lines  # noqa: E402
from port_cnn import TorchConvNet  # noqa: E402
from port_resnet import TorchBasicBlock, TorchResNet  # noqa: E402

# float32: each op rounds differently in torch's CPU kernels and XLA's (~1e-7 relative); a few
# conv/BatchNorm layers and 3 momentum steps stay well under 1e-5. float64: the same math to
# the last few bits.
TOL = {"float32": 1e-5, "float64": 1e-10}


@pytest.fixture(scope="module")
def digits():
    return funcnet.data.load("digits")

CASES = {"cnn": (TorchConvNet, models.ConvNet), "resnet": (TorchResNet, models.ResNet)}


# float32 is slow-marked: both port examples' --quick runs (tests/test_examples.py, default run)
# make the same float32 comparison with torch through the same _port.compare
@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_port_equals_torch_forward_gradients_and_steps(name, dtype, digits):
    (x, y), _ = digits
    torch_cls, ours = CASES[name]
    torch.manual_seed(0)
    with jax.enable_x64(dtype == "float64"):
        diffs = compare(ours(), torch_cls(), x, y, steps=3, batch=16, dtype=dtype)
    assert max(diffs.values()) < TOL[dtype], diffs


def test_state_dict_keys_and_order_equal_torch():
    for torch_cls, ours in CASES.values():
        model = ours()
        sd = funcnet.state_dict(model.init(jax.random.key(0)), model.init_state(), model=model)
        theirs = torch_cls().state_dict()
        assert list(sd) == list(theirs)
        assert {k: tuple(v.shape) for k, v in sd.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


def test_funcnet_models_are_no_longer_than_torch():
    assert source_lines(models.ConvNet) <= source_lines(TorchConvNet)
    assert (source_lines(models.BasicBlock) + source_lines(models.ResNet)
            <= source_lines(TorchBasicBlock) + source_lines(TorchResNet))


def test_loaded_weights_do_not_alias_torch_storage():
    theirs = TorchConvNet().train()
    model = models.ConvNet()
    _, state = funcnet.load_state_dict(model.init(jax.random.key(0)), theirs.state_dict(), state=model.init_state())
    before = np.asarray(state["bn1"]["running_mean"]).copy()
    theirs(torch.randn(4, 64))  # torch updates its running_mean in place
    np.testing.assert_array_equal(np.asarray(state["bn1"]["running_mean"]), before)


def test_cnn_trains_with_fit_and_eval_uses_running_stats(digits):
    (x, y), (xt, yt) = digits
    model = models.ConvNet(channels=(4, 8))
    state, history = funcnet.fit(model, optax.sgd(0.05, momentum=0.9), (x[:512], y[:512]), (xt, yt), epochs=2,
                                 batch_size=32, key=jax.random.key(0), progress=False)
    assert history[-1]["train_loss"] < history[0]["train_loss"] and history[-1]["test_accuracy"] > 0.5
    assert int(state.model_state["bn1"]["num_batches_tracked"]) == 2 * (512 // 32)
    # eval mode uses the running statistics and leaves them as they are
    _, same = nn.call(model, state.params, state.model_state, jnp.asarray(xt[:8]), train=False)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), same, state.model_state))
    # evaluate (which fit's history also calls) against the test set scored here from the final weights:
    # eval-mode logits, then accuracy and mean cross entropy in float64 numpy
    logits = np.asarray(nn.call(model, state.params, state.model_state, jnp.asarray(xt), train=False)[0], np.float64)
    log_p = logits - logits.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    accuracy, loss = np.mean(logits.argmax(1) == yt), -np.mean(log_p[np.arange(len(yt)), yt])
    for batch_size in (None, 100):  # one batch, and batches with a short last one
        scores = train.evaluate(model, state.params, xt, yt, state=state.model_state, batch_size=batch_size)
        assert scores["accuracy"] == accuracy
        # float32 log-softmax over 10 classes (a few eps of the largest logit) averaged over the test set
        assert scores["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-5 * np.abs(logits).max())
    assert history[-1]["test_accuracy"] == accuracy
