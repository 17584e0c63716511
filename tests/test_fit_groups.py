"""fit's grouped options (precision, strategy/devices, callbacks), the old keywords' deprecation,
and ModelCheckpoint + resume.

Oracles: the pieces the groups stand for, each already tested against torch (make_step's
policy and loss scale against autocast + GradScaler, data parallelism against DDP): a
grouped run must equal the run built from those pieces, bit for bit on one device and to
float summation order on several; a resumed run must equal the uninterrupted one bitwise.
"""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import callbacks, checkpoint, guards, nn, precision, train
from funcnet.parallel import strategy

MODEL = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


@pytest.fixture(scope="module")
def xy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 64)).astype(np.float32)
    y = rng.integers(0, 10, 96).astype(np.int32)
    return x, y


def _fit(xy, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("epochs", 2)
    return train.fit(MODEL, optax.adam(1e-2), xy, batch_size=16, key=jax.random.key(0), **kw)


def _same(a, b, exact=True):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if exact:
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        else:
            np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text, policy, scaled", [
    ("32", None, False), ("32-true", None, False), (None, None, False),
    ("bf16-mixed", "bf16", False), ("16-mixed", "fp16", True), ("fp16", "fp16", True),
])
def test_precision_strings_are_lightnings(text, policy, scaled):
    got_policy, scale = precision.resolve_precision(text)
    assert got_policy == policy
    if scaled:  # torch.amp.GradScaler's defaults
        assert isinstance(scale, precision.DynamicLossScale)
        assert float(scale.loss_scale) == 2.0**16
    else:
        assert scale is None


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(ValueError, match=r"precision='bf16-true'.*bf16-mixed.*16-mixed"):
        precision.resolve_precision("bf16-true")
    with pytest.raises(TypeError, match=r"precision must be a string such as 'bf16-mixed'.*int 16"):
        precision.resolve_precision(16)


def test_grouped_precision_equals_the_old_keywords(xy):
    new_state, new_hist = _fit(xy, precision="16-mixed")
    with pytest.warns(DeprecationWarning, match=r"fit\(policy=\.\.\.\) is deprecated; use precision="):
        old_state, old_hist = _fit(xy, policy="fp16", loss_scale=precision.DynamicLossScale())
    assert new_hist == old_hist
    assert "skipped_steps" in new_hist[0]
    _same(new_state.params, old_state.params)


def test_every_old_keyword_warns_naming_the_new_form(xy):
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(xy, on_epoch=lambda s, r: seen.append(r["epoch"]), every_steps=5, on_steps=lambda s, p: None,
             buffers="broadcast")
    messages = sorted(str(w.message) for w in caught if w.category is DeprecationWarning)
    assert [m.split("(")[1].split("=")[0] for m in messages] == ["buffers", "every_steps", "on_epoch", "on_steps"]
    assert all("use callbacks=" in m or "use strategy=" in m for m in messages)
    assert seen == [1, 2]
    with pytest.raises(TypeError, match="unexpected keyword argument 'epoch_hook'"):
        _fit(xy, epoch_hook=print)


@pytest.mark.parametrize("name", ["shard_map", "ddp", "sharding", "fsdp"])
def test_strategies_equal_one_device(xy, name):
    one, hist_one = _fit(xy)
    many, hist_many = _fit(xy, strategy=name, devices=2)
    _same(one.params, many.params, exact=False)
    np.testing.assert_allclose([r["train_loss"] for r in hist_one], [r["train_loss"] for r in hist_many],
                               rtol=1e-5)


def test_fsdp_with_zero1_and_checkpoints_mid_epoch_equals_one_device(xy):
    one, _ = _fit(xy)
    saved = []
    many, _ = _fit(xy, strategy=strategy.Strategy("fsdp", zero=1), devices=4,
                   callbacks=[callbacks.Callback(on_steps=lambda s, p: saved.append(int(s.step)), every_steps=4)])
    _same(one.params, many.params, exact=False)
    assert saved == [4, 8]  # 6 steps an epoch: inside epochs only (12 ends the run)


def test_bad_strategies_and_callbacks_are_named():
    with pytest.raises(ValueError, match=r"unknown strategy 'horovod'; expected one of single, pmap, shard_map"):
        strategy.resolve("horovod", None)
    with pytest.raises(ValueError, match=r"strategy='single' runs on one device, but devices=4"):
        strategy.resolve("single", 4)
    assert strategy.resolve(None, 4).kind == "shard_map"
    with pytest.raises(TypeError, match=r"callbacks\[1\] is function, expected a funcnet.callbacks.Callback"):
        callbacks.check([callbacks.Callback(), lambda: 0])
    with pytest.raises(ValueError, match=r"callbacks\[0\] has on_steps but no every_steps"):
        callbacks.check([callbacks.Callback(on_steps=print)])


def test_two_callbacks_run_at_their_own_multiples(xy):
    threes, fours = [], []
    _fit(xy, callbacks=[callbacks.Callback(on_steps=lambda s, p: threes.append(int(s.step)), every_steps=3),
                        callbacks.Callback(on_steps=lambda s, p: fours.append(int(s.step)), every_steps=4)])
    assert threes == [3, 9]  # 6 steps an epoch; a multiple at an epoch's end goes to on_epoch instead
    assert fours == [4, 8]


def test_model_checkpoint_resumes_bitwise(xy, tmp_path):
    full, full_hist = _fit(xy)

    class Stop(Exception):
        pass

    def stop_at_8(state, position):
        if int(state.step) == 8:
            raise Stop

    with pytest.raises(Stop):
        _fit(xy, callbacks=[callbacks.ModelCheckpoint(tmp_path, every_steps=4),
                            callbacks.Callback(on_steps=stop_at_8, every_steps=4)])
    template = train.create_train_state(MODEL, optax.adam(1e-2), jax.random.key(0))
    state, start = callbacks.resume(tmp_path, template)
    assert int(state.step) == 8 and start.epoch == 1 and len(start.metrics["loss"]) == 2
    resumed, hist = _fit(xy, state=state, start=start)
    _same((full.params, full.opt_state, full.step, jax.random.key_data(full.key)),
          (resumed.params, resumed.opt_state, resumed.step, jax.random.key_data(resumed.key)))
    assert hist == full_hist[1:]


def _diverging(from_step):
    """Adam whose updates turn NaN in optimizer step ``from_step``: the params are NaN after that
    step, the loss from the next one on (a run that diverges at a known step)."""

    def update(updates, count, params=None):
        count = count + 1
        scale = jnp.where(count >= from_step, jnp.nan, 1.0)
        return jax.tree.map(lambda u: u * scale, updates), count

    return optax.chain(optax.adam(1e-2), optax.GradientTransformation(lambda p: jnp.zeros((), jnp.int32), update))


@pytest.mark.parametrize("check_finite", [True, False])
def test_model_checkpoint_never_saves_a_diverged_state_and_keeps_the_last_finite_one(xy, tmp_path, check_finite):
    tx = _diverging(7)  # 6 steps an epoch: the params turn NaN in step 7 (epoch 2), the loss in step 8
    with pytest.raises(guards.NonFiniteLossError, match=r"^the parameters are not finite at step 7 \(epoch 2\): "
                                                         r"\S+ holds NaN/Inf, so it is not saved; lower the learning"):
        train.fit(MODEL, tx, xy, epochs=2, batch_size=16, key=jax.random.key(0), progress=False,
                  check_finite=check_finite, callbacks=[callbacks.ModelCheckpoint(tmp_path, every_steps=1, keep=3)])
    # before the check every step saved its NaN state, and keep=3 deleted the last finite one (6)
    assert checkpoint.all_steps(tmp_path) == [4, 5, 6]
    state, start = callbacks.resume(tmp_path, train.create_train_state(MODEL, tx, jax.random.key(0)))
    assert int(state.step) == 6 and start == train.Position(1)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state.params))


def test_model_checkpoint_refuses_a_nan_loss_inside_an_epoch_naming_the_step(xy, tmp_path):
    nan_loss = lambda out, y: jnp.where(jnp.abs(out).sum() > -1, jnp.nan, 0.0)  # noqa: E731  finite params, NaN loss
    with pytest.raises(guards.NonFiniteLossError, match=r"^the loss is not finite at step 1 \(epoch 1\): loss = nan"):
        train.fit(MODEL, optax.sgd(0.0), xy, epochs=1, batch_size=16, key=jax.random.key(0), progress=False,
                  loss_fn=nan_loss, callbacks=[callbacks.ModelCheckpoint(tmp_path, every_steps=2)])
    assert checkpoint.all_steps(tmp_path) == []


def test_resume_refuses_non_finite_params_in_one_line(xy, tmp_path):
    # checkpoints saved without the check (checkpoint.save itself, or an older funcnet): step 6 diverged
    state, _ = _fit(xy, epochs=1)
    position = {"position": callbacks.encode_position(train.Position(1))}
    checkpoint.save(tmp_path, state._replace(step=jnp.asarray(4, state.step.dtype)), step=4, metadata=position)
    bad = state._replace(params=jax.tree.map(lambda p: p.at[0].set(jnp.nan), state.params))
    checkpoint.save(tmp_path, bad, step=6, metadata=position)
    template = train.create_train_state(MODEL, optax.adam(1e-2), jax.random.key(0))
    with pytest.raises(checkpoint.CheckpointError) as e:
        callbacks.resume(tmp_path, template)
    message = str(e.value)
    assert "\n" not in message and message == (
        f"{checkpoint.checkpoint_path(tmp_path, 6)}: its params are not finite (0/bias holds NaN/Inf), it was "
        f"saved after the run diverged; resume from an earlier step (4: callbacks.resume(directory, template, "
        f"step=4)), or start over with a lower learning rate")
    assert int(callbacks.resume(tmp_path, template, step=4)[0].step) == 4


def test_a_position_inside_an_epoch_comes_back_with_its_shuffle_key(xy):
    # the one decoder of the resume position (fit's ModelCheckpoint and funcnet train both use it):
    # the same key bits and implementation, so the resumed epoch draws the same permutation
    for key in (jax.random.key(3), jax.random.key(3, impl="rbg")):
        perm_key = jax.random.split(key)[1]
        metrics = {"loss": np.array([0.5, np.float32(1) / 3], np.float32), "grads_finite": np.array([True, False])}
        saved = json.loads(json.dumps(callbacks.encode_position(train.Position(2, perm_key, metrics))))
        back = callbacks.decode_position(saved)
        assert back.epoch == 2 and jax.random.key_impl(back.perm_key) == jax.random.key_impl(perm_key)
        np.testing.assert_array_equal(jax.random.key_data(back.perm_key), jax.random.key_data(perm_key))
        np.testing.assert_array_equal(jax.random.permutation(back.perm_key, 96),
                                      jax.random.permutation(perm_key, 96))
        for k, v in metrics.items():
            assert back.metrics[k].dtype == v.dtype and back.metrics[k].tobytes() == v.tobytes()
    assert callbacks.decode_position({"epoch": 3}) == train.Position(3)


def test_fit_resumed_where_max_steps_stopped_returns_the_stopped_epoch_and_refuses_going_back(xy, tmp_path):
    # a checkpoint at the stop (every_steps: a ModelCheckpoint without it saves at epochs' ends only)
    stopped, hist = _fit(xy, max_steps=8, callbacks=[callbacks.ModelCheckpoint(tmp_path, every_steps=100)])
    template = train.create_train_state(MODEL, optax.adam(1e-2), jax.random.key(0))
    state, start = callbacks.resume(tmp_path, template)
    assert hist[-1]["step"] == int(state.step) == 8 and len(start.metrics["loss"]) == 2  # 2 steps into epoch 2
    again, rerun = _fit(xy, max_steps=8, state=state, start=start)  # a restart of the same run: no step runs
    assert rerun == hist[-1:] and int(again.step) == 8
    _same(again.params, stopped.params)
    state, start = callbacks.resume(tmp_path, template)
    with pytest.raises(ValueError, match=r"^fit: max_steps=7 is below the resumed state's step 8 .*max_steps >= 8"):
        _fit(xy, max_steps=7, state=state, start=start)
