"""The training loop against independent oracles: torch's SGD, jax.grad by hand, numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from scipy.special import logsumexp

import funcnet
from funcnet import data, interop, losses, nn, train


@pytest.fixture(scope="module")
def digits():
    return data.load("digits")


def test_steps_match_torch_sgd(digits):
    (x, y), _ = digits
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    params = interop.from_torch(theirs)
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    model, tx = nn.MLP([64, 32, 10]), optax.sgd(0.1)
    step = train.make_step(model, tx)
    state = train.create_train_state(model, tx, jax.random.key(0), params=params)
    for i in range(5):
        xb, yb = x[i * 32:(i + 1) * 32], y[i * 32:(i + 1) * 32]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(xb)), torch.from_numpy(yb).long())
        loss.backward()
        opt.step()
        state, metrics = step(state, (jnp.asarray(xb), jnp.asarray(yb)))
        np.testing.assert_allclose(float(metrics["loss"]), loss.item(), rtol=1e-5)
    for key, tensor in theirs.state_dict().items():
        np.testing.assert_allclose(np.asarray(funcnet.state_dict(state.params)[key]), tensor.numpy(), atol=1e-6)
    assert int(state.step) == 5


def test_gradient_accumulation_equals_full_batch_gradient(digits):
    (x, y), _ = digits
    xb, yb = jnp.asarray(x[:64]), jnp.asarray(y[:64])
    model, tx = nn.MLP([64, 32, 10]), optax.sgd(0.5)
    params = model.init(jax.random.key(0))
    # oracle: one plain jax.grad of the full-batch mean loss, updated by hand
    grads = jax.grad(lambda p: losses.cross_entropy(model.apply(p, xb), yb))(params)
    expected = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
    for k in (1, 4):
        step = train.make_step(model, tx, accum_steps=k)
        state = train.create_train_state(model, tx, jax.random.key(1), params=jax.tree.map(jnp.copy, params))
        state, _ = step(state, (xb, yb))
        for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=1e-6)


def test_run_epoch_scan_equals_step_by_step(digits):
    (x, y), _ = digits
    model, tx = nn.MLP([64, 32, 10], dropout=0.1), optax.adam(1e-3)
    step = train.make_step(model, tx)
    scanned = train.create_train_state(model, tx, jax.random.key(0))
    stepped = train.create_train_state(model, tx, jax.random.key(0))
    for _ in range(2):
        scanned, m_scan = train.run_epoch(step, scanned, x, y, batch_size=64)
        stepped, m_step = train.run_epoch(step, stepped, x, y, batch_size=64, scan=False)
        assert m_scan["loss"].shape == (len(x) // 64,)
        np.testing.assert_allclose(np.asarray(m_scan["loss"]), np.asarray(m_step["loss"]), rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(scanned.params), jax.tree.leaves(stepped.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert int(scanned.step) == int(stepped.step) == 2 * (len(x) // 64)


def test_step_compiles_once_and_donates_old_state():
    model, tx = nn.MLP([4, 8, 2]), optax.sgd(0.1)
    traces = []

    def counting_loss(logits, labels):
        traces.append(1)
        return losses.cross_entropy(logits, labels)

    step = train.make_step(model, tx, counting_loss)
    state = train.create_train_state(model, tx, jax.random.key(0))
    batch = (jnp.ones((8, 4)), jnp.zeros((8,), jnp.int32))
    old = state
    for _ in range(4):
        state, _ = step(state, batch)
    assert len(traces) == 1
    assert old.params["0"]["weight"].is_deleted()  # its buffers were reused for the new state


def test_step_bad_inputs_are_named():
    model, tx = nn.MLP([4, 8, 2]), optax.sgd(0.1)
    step = train.make_step(model, tx, donate=False)
    state = train.create_train_state(model, tx, jax.random.key(0))
    x = jnp.ones((8, 4))
    with pytest.raises(ValueError, match=r"labels of shape \(8, 1\)"):
        step(state, (x, jnp.zeros((8, 1), jnp.int32)))
    with pytest.raises(TypeError, match="labels have dtype float32"):
        step(state, (x, jnp.zeros((8,), jnp.float32)))
    with pytest.raises(ValueError, match=r"input of shape \(8, 3\) has 3 features"):
        step(state, (jnp.ones((8, 3)), jnp.zeros((8,), jnp.int32)))
    with pytest.raises(ValueError, match="must share the leading batch axis"):
        step(state, (x, jnp.zeros((7,), jnp.int32)))
    with pytest.raises(ValueError, match="accum_steps must be a positive int, got 0"):
        train.make_step(model, tx, accum_steps=0)
    with pytest.raises(ValueError, match="does not split into accum_steps=3"):
        train.make_step(model, tx, accum_steps=3)(state, (x, jnp.zeros((8,), jnp.int32)))
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        train.run_epoch(step, state, np.ones((8, 4)), np.zeros(8, np.int32), batch_size=0)


def test_evaluate_against_numpy(digits):
    _, (x, y) = digits
    model = nn.MLP([64, 16, 10])
    params = model.init(jax.random.key(0))
    scores = train.evaluate(model, params, x, y, batch_size=100)
    w1, b1 = np.asarray(params["0"]["weight"]), np.asarray(params["0"]["bias"])
    w2, b2 = np.asarray(params["2"]["weight"]), np.asarray(params["2"]["bias"])
    logits = np.maximum(x.astype(np.float64) @ w1.T + b1, 0) @ w2.T + b2
    loss = np.mean(logsumexp(logits, axis=1) - logits[np.arange(len(y)), y])
    assert scores["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y))
    assert scores["loss"] == pytest.approx(loss, rel=1e-5)


def test_fit_reaches_95_percent_on_digits(digits):
    model = nn.MLP([64, 128, 10])
    state, history = train.fit(model, optax.adam(1e-3), *digits, epochs=20, batch_size=32,
                               key=jax.random.key(0), progress=False)
    assert len(history) == 20
    assert history[-1]["test_accuracy"] >= 0.95
    assert history[-1]["train_loss"] < history[0]["train_loss"]


def test_fit_refuses_labels_outside_the_model_outputs(digits):
    (x, y), (xt, yt) = digits
    model = nn.MLP([64, 16, 10])
    with pytest.raises(ValueError, match=r"train labels range over \[10, 19\] but the model has 10 outputs"):
        train.fit(model, optax.sgd(0.1), (x, y + 10), epochs=1, batch_size=32, key=jax.random.key(0), progress=False)
    with pytest.raises(ValueError, match=r"test labels range over \[-1, 8\]"):
        train.fit(model, optax.sgd(0.1), (x, y), (xt, yt - 1), epochs=1, batch_size=32, key=jax.random.key(1),
                  progress=False)


def test_conv_net_epochs_equal_the_step_loop_bitwise(digits):
    # XLA:CPU runs convolutions inside a loop body on a naive kernel (other bits, 3-4x slower), so
    # run_epoch and fit's mid-epoch stretches step such a model from Python: the oracle here is
    # that Python loop of make_step, and fit with and without mid-epoch callbacks must agree.
    from funcnet import models

    (x, y), _ = digits
    x, y = x[:256], y[:256]
    model, tx = models.ConvNet(channels=(2, 4)), optax.sgd(0.1, momentum=0.9)
    step = train.make_step(model, tx)
    runs = {}
    for scan in (True, False):
        state = train.create_train_state(model, tx, jax.random.key(0))
        state, metrics = train.run_epoch(step, state, x, y, batch_size=32, scan=scan)
        runs[scan] = (state, metrics)
    np.testing.assert_array_equal(np.asarray(runs[True][1]["loss"]), np.asarray(runs[False][1]["loss"]))
    for a, b in zip(jax.tree.leaves((runs[True][0].params, runs[True][0].model_state)),
                    jax.tree.leaves((runs[False][0].params, runs[False][0].model_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    fits = [train.fit(model, tx, (x, y), epochs=1, batch_size=32, key=jax.random.key(0), progress=False,
                      **kw)[0] for kw in ({}, {"every_steps": 3, "on_steps": lambda s, p: None})]
    for a, b in zip(jax.tree.leaves(fits[0].params), jax.tree.leaves(fits[1].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_regression_with_mse_loss_trains_with_make_step_and_fit():
    """Metrics fit the targets: float targets get the loss only (no accuracy), and the fit
    converges to the least-squares solution (closed form: numpy's lstsq)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 4)).astype(np.float32)
    w = np.array([[1.0, -2.0], [0.5, 0.0], [0.0, 3.0], [-1.0, 1.0]], np.float32)
    y = x @ w + 0.5
    model = nn.Linear(4, 2)
    state, history = train.fit(model, optax.adam(0.05), (x, y), (x[:64], y[:64]), epochs=30, batch_size=64,
                               key=jax.random.key(0), loss_fn=losses.mse_loss, progress=False)
    assert set(history[-1]) == {"epoch", "step", "train_loss", "test_loss"}
    coef, *_ = np.linalg.lstsq(np.c_[x, np.ones(len(x))], y, rcond=None)
    np.testing.assert_allclose(np.asarray(state.params["weight"]).T, coef[:4], atol=1e-2)
    np.testing.assert_allclose(np.asarray(state.params["bias"]), coef[4], atol=1e-2)
    step = train.make_step(model, optax.sgd(0.1), losses.mse_loss)
    _, metrics = step(train.create_train_state(model, optax.sgd(0.1), jax.random.key(1)),
                      (jnp.asarray(x[:8]), jnp.asarray(y[:8])))
    assert set(metrics) == {"loss"}
