"""The silent traps found by porting real torch models: each test fails on the code that had
the trap (it ran, with wrong numbers or a foreign message) and passes now."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import nn
from funcnet.step import TrainState


def _mse(o, t):
    return jnp.mean((o - t) ** 2)


def test_accum_steps_cuts_a_sequence_first_transformer_along_its_batch_axis():
    # torch's layout (S, N, E): accum_steps=2 must cut N, not S. Oracle: the full-batch step
    # (the mean of two equal micro-batch means is the full mean), which never cuts anything.
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    model = nn.TransformerEncoder(layer, 1)
    assert model.batch_axis == 1
    kx, ky = jax.random.split(jax.random.key(0))
    x, y = jax.random.normal(kx, (6, 4, 8)), jax.random.normal(ky, (6, 4, 8))
    tx = optax.sgd(0.5)
    results = []
    for k in (1, 2):
        state = funcnet.create_train_state(model, tx, jax.random.key(7))
        state, metrics = funcnet.make_step(model, tx, _mse, accum_steps=k)(state, (x, y))
        results.append((state.params, float(metrics["loss"])))
    (p1, l1), (p2, l2) = results
    assert l2 == pytest.approx(l1, rel=1e-5)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_accum_steps_refuses_a_composite_whose_batch_axis_is_unknown():
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, dim_feedforward=16), 1)
    model = nn.Composite(lambda self, x: self.enc(jnp.swapaxes(x, 0, 1)), name="Wrapper", enc=encoder)
    assert model.batch_axis is None
    with pytest.raises(ValueError, match=r"accum_steps=2 cuts the batch .* batch axis of Wrapper is not known .* "
                                         r"pass make_step\(\.\.\., batch_axis=0 or 1\)"):
        funcnet.make_step(model, optax.sgd(0.1), _mse, accum_steps=2)
    funcnet.make_step(model, optax.sgd(0.1), _mse, accum_steps=2, batch_axis=0)  # said explicitly: accepted
    funcnet.make_step(model, optax.sgd(0.1), _mse)  # nothing to cut: accepted


def test_a_stateless_model_given_state_refuses_instead_of_returning_y_alone():
    model = nn.MLP([3, 4, 2])
    params = model.init(jax.random.key(0))
    x = jnp.ones((2, 3))
    for state in ({}, {"anything": 1}):
        with pytest.raises(TypeError, match=r"Sequential has no state .* call y = model.apply\(params, x\), or "
                                            r"funcnet.nn.call\(model, params, state, x\)"):
            model.apply(params, x, state=state)
    y, s = nn.call(model, params, {}, x)  # the one form for every model
    assert y.shape == (2, 2) and s == {}


def test_params_given_to_create_train_state_survive_the_donating_step():
    model, tx = nn.MLP([3, 2]), optax.sgd(0.1)
    loaded = model.init(jax.random.key(1))
    before = jax.tree.map(np.array, loaded)
    state = funcnet.create_train_state(model, tx, jax.random.key(0), params=loaded)
    step = funcnet.make_step(model, tx)
    step(state, (jnp.ones((4, 3)), jnp.zeros(4, jnp.int32)))
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(before)):
        np.testing.assert_array_equal(np.asarray(a), b)  # not "Array has been deleted"


def test_a_state_holding_one_array_twice_trains_or_is_named():
    model, tx = nn.MLP([3, 2]), optax.sgd(0.1)
    z = jnp.zeros((2, 5))
    batch = (jnp.ones((4, 3)), jnp.zeros(4, jnp.int32))
    step = funcnet.make_step(model, tx)
    state = funcnet.create_train_state(model, tx, jax.random.key(0), model_state={"hidden": (z, z)})
    new, _ = step(state, batch)  # the LSTM idiom (z, z): create_train_state gives each its own buffer
    np.testing.assert_array_equal(new.model_state["hidden"][1], 0.0)
    by_hand = TrainState(state.params, state.opt_state, state.step, state.key, None, {"hidden": (z, z)})
    with pytest.raises(ValueError, match=r"holds one array twice, at state.model_state\['hidden'\]\[0\] and "
                                         r"state.model_state\['hidden'\]\[1\]; the step "
                                         r"donates .* give each its own array \(jnp.copy\)"):
        step(by_hand, batch)


def _vae_like():
    def forward(self, x):  # samples noise in eval too, like pytorch/examples' VAE
        mu = self.enc(x)
        return mu + jax.random.normal(self.next_key(), mu.shape)

    return nn.Composite(forward, name="VAE", enc=nn.Linear(3, 2))


def test_next_key_without_a_key_names_the_module_and_evaluate_takes_one():
    model = _vae_like()
    params = model.init(jax.random.key(0))
    x, y = np.ones((4, 3), np.float32), np.zeros(4, np.int32)
    with pytest.raises(ValueError, match=r"VAE: self.next_key\(\) needs a PRNG key, but apply was called without "
                                         r"one; pass key=jax.random.key\(seed\)"):
        model.apply(params, x)
    scores = funcnet.evaluate(model, params, x, y, key=jax.random.key(1))
    assert np.isfinite(scores["loss"])
    _, history = funcnet.fit(model, optax.sgd(0.1), (x, y), (x, y), epochs=1, batch_size=2, key=jax.random.key(0),
                             progress=False)
    assert np.isfinite(history[-1]["test_loss"])


def test_load_state_dict_refuses_a_lossy_cast_unless_asked():
    params = {"w": jnp.zeros((2,), jnp.float32), "h": jnp.zeros((2,), jnp.float16), "n": jnp.zeros((), jnp.int32)}
    good = {"w": np.ones(2, np.float32), "h": np.ones(2, np.float16), "n": np.array(3, np.int64)}
    loaded = funcnet.load_state_dict(params, good)  # int64 3 fits int32: no loss, accepted
    assert int(loaded["n"]) == 3 and loaded["n"].dtype == jnp.int32
    f64 = {**good, "w": np.array([0.1, 0.2])}  # a .double() port
    with pytest.raises(funcnet.StateDictError, match=r"w: holds float64 values but the model's parameter is float32, "
                                                     r"a lossy cast; build the model in float64 .* or pass cast=True"):
        funcnet.load_state_dict(params, f64)
    np.testing.assert_array_equal(funcnet.load_state_dict(params, f64, cast=True)["w"], np.float32([0.1, 0.2]))
    with pytest.raises(funcnet.StateDictError, match=r"n: holds int64 values but the model's parameter is int32"):
        funcnet.load_state_dict(params, {**good, "n": np.array(2**40)})
    big = {**good, "h": np.array([1e6, 1.0], np.float32)}  # 1e6 is inf in float16
    for cast in (False, True):
        with pytest.raises(funcnet.StateDictError, match=r"h: holds 1e\+06, beyond float16's largest value 65504 "
                                                         r"\(it would become inf\)"):
            funcnet.load_state_dict(params, big, cast=cast)


def test_out_of_range_labels_are_refused_by_the_step_and_evaluate():
    model, tx = nn.MLP([3, 4]), optax.sgd(0.1)
    params = model.init(jax.random.key(0))
    x, y = np.ones((4, 3), np.float32), np.array([0, 1, 4, 2], np.int32)
    with pytest.raises(ValueError, match=r"evaluate: test labels range over \[0, 4\] but the model has 4 outputs; "
                                         r"labels must be class indices in \[0, 3\]"):
        funcnet.evaluate(model, params, x, y)
    step = funcnet.make_step(model, tx)
    state = funcnet.create_train_state(model, tx, jax.random.key(1))
    with pytest.raises(ValueError, match=r"step: the labels range over \[0, 4\] but the model has 4 outputs"):
        step(state, (x, y))
    with pytest.raises(ValueError, match=r"range over \[-1, 2\]"):
        funcnet.make_step(model, tx, accum_steps=2)(state, (x, np.array([0, 1, -1, 2], np.int32)))
    state, _ = step(state, (x, y % 4))  # in range: trains


def test_run_epoch_loop_checks_all_labels_before_its_steps():
    # run_epoch's Python loop reads the labels once (the per-call check would wait for each batch)
    model, tx = nn.MLP([3, 4]), optax.sgd(0.1)
    x, y = np.ones((8, 3), np.float32), np.array([0, 1, 2, 3, 0, 1, 2, 7], np.int32)
    step = funcnet.make_step(model, tx)
    state = funcnet.create_train_state(model, tx, jax.random.key(1))
    with pytest.raises(ValueError, match=r"run_epoch: train labels range over \[0, 7\] but the model has 4 outputs"):
        funcnet.run_epoch(step, state, x, y, batch_size=2, scan=False)
    state, metrics = funcnet.run_epoch(step, state, x, y % 4, batch_size=2, scan=False)
    assert metrics["loss"].shape == (4,) and int(state.step) == 4


def test_long_epochs_show_a_step_count(monkeypatch):
    # issue 19: a GPT epoch sat on "epoch 0/2" for minutes; fit now counts the steps inside it
    from funcnet import train as train_module

    seen = []
    real = train_module._EpochProgress.callback

    def spy(self):
        cb = real(self)

        def on_steps(state, position):
            cb.on_steps(state, position)
            seen.append(self._bar.tasks[0].description)

        return cb._replace(on_steps=on_steps)

    monkeypatch.setattr(train_module._EpochProgress, "callback", spy)
    x, y = np.ones((800, 3), np.float32), np.zeros(800, np.int32)  # 400 steps of 2
    model = nn.MLP([3, 2])
    quiet_state, _ = funcnet.fit(model, optax.sgd(0.1), (x, y), epochs=1, batch_size=2, key=jax.random.key(0),
                                 progress=False)
    state, _ = funcnet.fit(model, optax.sgd(0.1), (x, y), epochs=1, batch_size=2, key=jax.random.key(0))
    assert seen[0] == "step 8/400" and seen[-1] == "step 392/400" and len(seen) == 49
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(quiet_state.params)):
        np.testing.assert_array_equal(a, b)  # counted in stretches: the same batches, the same bits
