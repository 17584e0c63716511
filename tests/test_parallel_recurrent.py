"""Recurrent layers on every data-parallel path (pmap, shard_map, jit-sharding) end where
full-batch SGD written with jax.grad ends."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import losses, nn, parallel, train

STEPS, BATCH, T, F, CLASSES, LR = 4, 8, 5, 3, 4, 0.2

# every recurrent layer and option the scan treats differently: several layers, both directions,
# GRU's b_hn inside the reset product, relu, LSTM's projection
LAYERS = {
    "lstm": nn.LSTM(F, 6, 2, batch_first=True, bidirectional=True),
    "gru": nn.GRU(F, 6, 2, batch_first=True),
    "rnn": nn.RNN(F, 6, nonlinearity="relu", batch_first=True, bidirectional=True),
    "lstm_proj": nn.LSTM(F, 6, batch_first=True, proj_size=2),
}


def _classifier():
    """Each layer's last output through its own Linear, the logits summed: one program for all."""
    heads = {}
    for name, rnn in LAYERS.items():
        width = jax.eval_shape(lambda p, x, r=rnn: r.apply(p, x)[0], rnn.init(jax.random.key(0)),
                               jnp.zeros((1, T, F))).shape[-1]
        heads[f"{name}_fc"] = nn.Linear(width, CLASSES)

    def forward(self, x):
        return sum(getattr(self, f"{name}_fc")(getattr(self, name)(x)[0][:, -1]) for name in LAYERS)

    return nn.Composite(forward, **LAYERS, **heads)


@pytest.fixture(scope="module")
def problem():
    """``(model, batches, initial params, params after full-batch SGD)``: the oracle is
    ``w <- w - lr * grad(mean loss over the whole batch)`` by jax.grad on one device."""
    model = _classifier()
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(STEPS, BATCH, T, F)).astype(np.float32)
    ys = rng.integers(0, CLASSES, size=(STEPS, BATCH)).astype(np.int32)
    init = jax.device_get(model.init(jax.random.key(2)))

    @jax.jit
    def sgd(params, x, y):
        grads = jax.grad(lambda p: losses.cross_entropy(model.apply(p, x), y))(params)
        return jax.tree.map(lambda w, g: w - LR * g, params, grads)

    expected = init
    for x, y in zip(xs, ys):
        expected = sgd(expected, x, y)
    return model, (xs, ys), init, jax.device_get(expected)


@pytest.mark.parametrize("kind", parallel.KINDS)
def test_recurrent_data_parallel_equals_full_batch_sgd(kind, problem):
    model, (xs, ys), init, expected = problem
    dp = parallel.data_parallel(model, optax.sgd(LR), kind=kind, devices=2)
    state = dp.put_state(train.create_train_state(model, optax.sgd(LR), jax.random.key(3),
                                                  params=jax.tree.map(jnp.array, init)))
    for x, y in zip(xs, ys):
        state, metrics = dp.step(state, dp.put_batch((x, y)))
        jax.block_until_ready(metrics)
    got = dp.get(state.params)
    # Each device averages its half batch and the halves are averaged again: the same sum in
    # another order, so each gradient entry differs by a few float32 roundings (eps 1.2e-7 times
    # the 8-term sum's magnitude, about 1); four lr-0.2 steps keep that below 1e-6, and 1e-5
    # leaves room while any real difference (a missing average, one device's half) is >= 1e-3.
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                zip(jax.tree.leaves(expected), jax.tree.leaves(init)))
    assert moved > 1e-3  # the run went somewhere
