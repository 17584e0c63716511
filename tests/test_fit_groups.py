"""fit's grouped options (precision, strategy/devices, callbacks), the old keywords' deprecation,
and ModelCheckpoint + resume.

Oracles: the pieces the groups stand for, each already tested against torch (make_step's
policy and loss scale against autocast + GradScaler, data parallelism against DDP): a
grouped run must equal the run built from those pieces, bit for bit on one device and to
float summation order on several; a resumed run must equal the uninterrupted one bitwise.
"""

import warnings

import jax
import numpy as np
import optax
import pytest

from funcnet import callbacks, nn, precision, train
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
    return train.fit(MODEL, optax.adam(1e-2), xy, epochs=2, batch_size=16, key=jax.random.key(0), **kw)


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
