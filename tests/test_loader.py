"""funcnet.loader against independent oracles: the numpy arrays written, a brute-force search
for the crop window, permutations checked as sets, and an uninterrupted run for kill-and-resume."""

import hashlib
import json

import jax
import numpy as np
import optax
import pytest

from funcnet import callbacks, data, guards, loader, models, nn, precision, train

N, SHAPE = 50, (1, 6, 6)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(N,) + SHAPE, dtype=np.uint8)
    x[:, 0, 0, 0] = np.arange(N)  # pixel (0, 0) names the example, for the order checks
    y = rng.integers(0, 5, size=N)
    return loader.write_records(tmp_path_factory.mktemp("rec"), x, y, shards=3), x, y


def _host(batches):
    return [(np.asarray(x), np.asarray(y)) for x, y in batches]


def test_records_round_trip(records):
    directory, x, y = records
    rec = loader.Records(directory)
    assert len(rec) == N and rec.shape == SHAPE and rec.dtype == np.uint8
    for i in (0, 17, N - 1):  # first, middle and last shard
        xi, yi = rec[i]
        np.testing.assert_array_equal(xi, x[i])
        assert int(yi) == y[i]
    got = rec.__getitems__([3, 40])
    np.testing.assert_array_equal(got[1][0], x[40])
    # records.json's digest: of the label (int64 little-endian) and the bytes of each example, in order
    expected = hashlib.sha256(b"".join(int(label).to_bytes(8, "little") + image.tobytes()
                                      for image, label in zip(x, y)))
    assert json.loads((directory / "records.json").read_text())["sha256"] == expected.hexdigest()


def test_each_epoch_is_a_seeded_permutation_without_the_remainder(records):
    directory, x, y = records
    lo = loader.Loader(directory, 8, seed=5)  # no augmentation: batches are the stored examples / 255
    assert lo.steps_per_epoch == N // 8
    batches = _host(lo.batches(0, 2 * lo.steps_per_epoch))
    ids = [np.rint(b[0][:, 0] * 255).astype(int) for b in batches]  # pixel (0, 0), flattened first
    epochs = [np.concatenate(ids[:6]), np.concatenate(ids[6:])]
    for e in epochs:
        assert len(set(e)) == 48 and set(e) <= set(range(N))  # 48 distinct examples, 2 dropped
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled each epoch
    for b, i in zip(batches, ids):
        np.testing.assert_array_equal(b[0], x[i].reshape(8, -1).astype(np.float32) / np.float32(255))
        np.testing.assert_array_equal(b[1], y[i])
    again = _host(loader.Loader(directory, 8, seed=5).batches(0, 2))
    other = _host(loader.Loader(directory, 8, seed=6).batches(0, 2))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(again, batches))
    assert not np.array_equal(other[0][0], batches[0][0])


def test_crop_flip_is_a_window_of_the_padded_image():
    image = np.arange(1, 1 + 2 * 5 * 5, dtype=np.uint8).reshape(2, 5, 5)  # distinct values: one window fits
    padded = np.pad(image, [(0, 0), (2, 2), (2, 2)])
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(300):
        out, label = loader.CropFlip(2)((image, 7), rng)
        assert label == 7 and out.shape == image.shape and out.dtype == image.dtype
        fits = [(dy, dx, f) for dy in range(5) for dx in range(5) for f in (False, True)
                if np.array_equal(out, (lambda w: w[..., ::-1] if f else w)(padded[:, dy:dy + 5, dx:dx + 5]))]
        assert len(fits) == 1
        seen.add(fits[0])
    assert len(seen) == 5 * 5 * 2  # every offset and both flips occur


def test_resume_from_any_position_and_workers_give_the_same_batches(records):
    directory, _, _ = records
    make = lambda workers: loader.Loader(directory, 8, seed=1, workers=workers, augment=loader.CropFlip(1))
    full = _host(make(0).batches(0, 9))
    tail = _host(make(0).batches(4, 9))  # rebuilt from the position alone
    in_workers = _host(make(1).batches(4, 9))  # a worker process, spawned: same bits
    for a, b, c in zip(full[4:], tail, in_workers):
        for u, v, w in zip(a, b, c):
            np.testing.assert_array_equal(u, v)
            np.testing.assert_array_equal(u, w)
    assert len(tail) == 5
    assert not np.array_equal(full[0][0], full[6][0])  # augmentation differs per position


class Killed(Exception):
    pass


def test_kill_mid_epoch_and_resume_ends_bitwise_equal(records, tmp_path):
    directory, _, _ = records
    model, tx = nn.MLP([36, 16, 5], dropout=0.2), optax.adam(1e-2)  # dropout: the key must resume too
    lo = loader.Loader(directory, 8, seed=2, augment=loader.CropFlip(1))
    key = lambda: jax.random.key(0)  # a fresh key each run: the suite checks key reuse
    whole, whole_history = train.fit(model, tx, lo, epochs=2, key=key())

    def die(state, position):
        if int(state.step) == 8:  # step 2 of epoch 2 (6 steps an epoch), just saved
            raise Killed

    with pytest.raises(Killed):
        train.fit(model, tx, lo, epochs=2, key=key(), callbacks=[callbacks.ModelCheckpoint(tmp_path, every_steps=4),
                                                                  callbacks.Callback(on_steps=die, every_steps=4)])
    state, start = callbacks.resume(tmp_path, train.create_train_state(model, tx, key()))
    assert int(state.step) == 8 and start.epoch == 1 and len(start.metrics["loss"]) == 2 and start.perm_key is None
    resumed, history = train.fit(model, tx, lo, epochs=2, key=key(), state=state, start=start)
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(resumed.step) == int(whole.step) == 12
    assert history == whole_history[1:]  # the interrupted epoch's record, bit for bit
    assert whole_history[1]["train_loss"] < whole_history[0]["train_loss"] * 1.5  # it trains, finitely


def test_max_steps_stops_inside_an_epoch_and_a_longer_run_continues_it_exactly(records):
    directory, _, _ = records
    model, tx = nn.MLP([36, 5]), optax.sgd(0.1)
    lo = loader.Loader(directory, 8, seed=1)  # 6 steps an epoch
    whole, whole_history = train.fit(model, tx, lo, epochs=2, key=jax.random.key(0), progress=False)
    seen = []
    stopped, history = train.fit(model, tx, lo, epochs=2, key=jax.random.key(0), progress=False, max_steps=9,
                                 callbacks=[callbacks.Callback(on_steps=lambda s, p: seen.append(p), every_steps=100)])
    assert [r["step"] for r in history] == [6, 9] and int(stopped.step) == 9
    assert [(p.epoch, len(p.metrics["loss"])) for p in seen] == [(1, 3)]  # the position to resume from, at the stop
    assert history[0] == whole_history[0]
    resumed, rest = train.fit(model, tx, lo, epochs=2, key=jax.random.key(0), progress=False, state=stopped,
                              start=seen[0])
    assert rest == whole_history[1:]
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_arguments_are_named(records, tmp_path):
    directory, _, _ = records
    with pytest.raises(ValueError, match=r"batch_size must be an int in \[1, 50\]"):
        loader.Loader(directory, 51)
    with pytest.raises(FileNotFoundError, match="write_records"):
        loader.Loader(tmp_path, 4)
    with pytest.raises(ValueError, match="share their first axis"):
        loader.write_records(tmp_path / "bad", np.zeros((3, 2)), np.zeros(4, int))
    with pytest.raises(ValueError, match="CropFlip: an image"):
        loader.CropFlip(1)((np.zeros(4), 0), np.random.default_rng(0))
    lo = loader.Loader(directory, 8)
    model, tx = nn.MLP([36, 5]), optax.sgd(0.1)
    fit = lambda *test, **kw: train.fit(model, tx, lo, *test, epochs=1, key=jax.random.key(0), **kw)
    state = train.create_train_state(model, tx, jax.random.key(0))._replace(step=np.int32(3))
    with pytest.raises(ValueError, match=r"state.step 3 is step 3 of epoch 1 .* pass start=Position\(0, metrics"):
        fit(state=state)
    with pytest.raises(ValueError, match="start.metrics must hold that many steps, got 2"):
        fit(state=state, start=train.Position(0, metrics={"loss": np.zeros(2)}))
    with pytest.raises(ValueError, match="start.epoch is 1 but state.step 3 is in epoch 1"):
        fit(state=state, start=train.Position(1, metrics={"loss": np.zeros(3)}))
    with pytest.raises(ValueError, match="start.perm_key is for in-memory data"):
        fit(state=state, start=train.Position(0, jax.random.key(1), {"loss": np.zeros(3)}))
    with pytest.raises(ValueError, match="a global batch of 8 examples does not split evenly over 3 devices"):
        fit(devices=3)
    with pytest.raises(ValueError, match="batch_size=4 but the Loader gives batches of 8"):
        fit(batch_size=4)
    with pytest.raises(ValueError, match="accum_steps must be a positive int dividing the loader's batch_size 8"):
        fit(accum_steps=3)
    with pytest.raises(ValueError, match=r"test labels range over \[0, 7\] but the model has 5 outputs"):
        fit((np.zeros((3, 36), np.float32), np.array([0, 7, 1])))
    with pytest.raises(ValueError, match="fit: test_data x holds 36 non-finite values"):
        fit((np.full((1, 36), np.nan, np.float32), np.array([0])))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """256 training examples of digits as records (8 steps of 32), 120 test examples in memory."""
    (x, y), (x_te, y_te) = data.load("digits")
    return loader.write_records(tmp_path_factory.mktemp("digits"), x[:256], y[:256]), (x_te[:120], y_te[:120])


def test_test_metrics_are_the_final_models_with_its_batchnorm_statistics(digits):
    directory, (x_te, y_te) = digits
    model, tx = models.ConvNet(10, image=8), optax.sgd(0.05, momentum=0.9)  # BatchNorm: state in TrainState
    state, history = train.fit(model, tx, loader.Loader(directory, 32, seed=3), (x_te, y_te), epochs=2,
                               key=jax.random.key(0), progress=False)
    assert [r["step"] for r in history] == [8, 16] and int(state.step) == 16
    assert set(history[-1]) == {"epoch", "step", "train_loss", "train_accuracy", "test_loss", "test_accuracy"}
    scores = train.evaluate(model, state.params, x_te, y_te, state=state.model_state)
    assert history[-1]["test_loss"] == scores["loss"] and history[-1]["test_accuracy"] == scores["accuracy"]
    # numpy on eval-mode outputs: cross entropy from log-softmax, accuracy from argmax
    logits = np.asarray(nn.call(model, state.params, state.model_state, x_te, train=False)[0], np.float64)
    log_p = logits - logits.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    np.testing.assert_allclose(history[-1]["test_loss"], -log_p[np.arange(len(y_te)), y_te].mean(), rtol=1e-5)
    assert history[-1]["test_accuracy"] == np.mean(logits.argmax(1) == y_te)
    # the running statistics moved, and the score depends on them: the stepped state was used
    assert int(state.model_state["bn1"]["num_batches_tracked"]) == 16
    fresh = train.evaluate(model, state.params, x_te, y_te, state=model.init_state())
    assert abs(fresh["loss"] - history[-1]["test_loss"]) > 1e-3


def test_records_match_fits_keys_with_a_loss_scale(digits):
    directory, test = digits
    (x, y), _ = data.load("digits")
    model, tx = nn.MLP([64, 16, 10]), optax.adam(1e-3)
    kw = lambda: dict(epochs=1, progress=False, key=jax.random.key(0),  # noqa: E731
                      precision=precision.Precision("fp16", precision.DynamicLossScale()))  # fresh: donated
    _, theirs = train.fit(model, tx, (x[:256], y[:256]), test, batch_size=32, **kw())
    _, ours = train.fit(model, tx, loader.Loader(directory, 32), test, **kw())
    assert set(ours[0]) == set(theirs[0]) >= {"skipped_steps", "loss_scale", "test_loss"}
    assert ours[0]["skipped_steps"] == theirs[0]["skipped_steps"] == 0 and ours[0]["loss_scale"] == 2.0 ** 16


def test_a_nan_in_the_records_stops_the_run_before_on_epoch(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype(np.float32), rng.integers(0, 3, size=64)
    x[37, 2] = np.nan  # 64 examples in batches of 16: every epoch reads example 37
    lo = loader.Loader(loader.write_records(tmp_path, x, y), 16)
    model, tx = nn.MLP([8, 3]), optax.sgd(0.1)
    seen = []
    with pytest.raises(guards.NonFiniteLossError, match=r"the loss is not finite in epoch 1 \(step 4\): "
                                                        r"train_loss = nan"):
        train.fit(model, tx, lo, epochs=2, key=jax.random.key(0), progress=False,
                  callbacks=[callbacks.Callback(on_epoch=lambda state, record: seen.append(record))])
    assert seen == []  # a checkpointing on_epoch never saw the bad state
    _, history = train.fit(model, tx, lo, epochs=1, key=jax.random.key(0), progress=False, check_finite=False)
    assert np.isnan(history[0]["train_loss"])  # the NaN does reach the loss: the guard is what stopped it


def _records_in_fits_order(directory, x, y, batch_size, seed, model, tx, key):
    """Records whose ``Loader(directory, batch_size, seed=seed)`` visits, in its first epoch,
    the batches ``fit(model, tx, (x, y), batch_size=batch_size, key=key)`` takes in its first
    (``len(x)`` a multiple of ``batch_size``): the loader's order read from records of the
    example ids, fit's drawn from the state's key as its epoch draws it."""
    n = len(x)
    ids = loader.write_records(directory / "ids", np.arange(n, dtype=np.float32)[:, None], np.zeros(n, int))
    with loader.Loader(ids, batch_size, seed=seed).batches(0, n // batch_size) as batches:
        visits = np.concatenate([b[:, 0] for b, _ in _host(batches)]).astype(int)
    perm_key = jax.random.split(train.create_train_state(model, tx, key).key)[1]
    takes = np.asarray(data.epoch_indices(perm_key, n, batch_size)).reshape(-1)
    order = np.empty(n, int)
    order[visits] = takes  # record visits[i] holds example takes[i]
    return loader.write_records(directory / "ordered", x[order], y[order])


@pytest.mark.parametrize("options", [dict(strategy="shard_map", devices=2), dict(accum_steps=2),
                                     dict(precision="16-mixed")], ids=["shard_map", "accum_steps", "loss_scale"])
def test_a_loader_trains_as_arrays_do_on_the_same_batches(options, tmp_path):
    # The in-memory path is the oracle: the same batches in the same order give the same params,
    # bit for bit (the same step program; one epoch, so fit's per-epoch key split of the
    # arrays' path is not yet seen by a step, and the model draws no keys).
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(48, 8)).astype(np.float32), rng.integers(0, 3, size=48).astype(np.int32)
    model, tx = nn.MLP([8, 16, 3]), optax.adam(1e-2)
    directory = _records_in_fits_order(tmp_path, x, y, 8, 4, model, tx, jax.random.key(0))
    ours, our_history = train.fit(model, tx, loader.Loader(directory, 8, seed=4), epochs=1, key=jax.random.key(0),
                                  progress=False, **options)
    theirs, their_history = train.fit(model, tx, (x, y), epochs=1, batch_size=8, key=jax.random.key(0),
                                      progress=False, **options)
    assert int(ours.step) == int(theirs.step) == 6 and our_history == their_history
    for a, b in zip(jax.tree.leaves((ours.params, ours.opt_state)), jax.tree.leaves((theirs.params, theirs.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    before = train.create_train_state(model, tx, jax.random.key(0)).params
    assert not np.array_equal(np.asarray(jax.tree.leaves(ours.params)[0]), np.asarray(jax.tree.leaves(before)[0]))


def test_a_long_loader_epoch_shows_its_step_count(tmp_path, capsys):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(200, 3)).astype(np.float32), rng.integers(0, 2, size=200)
    lo = loader.Loader(loader.write_records(tmp_path, x, y), 1)  # 200 steps an epoch: fit's bar counts them
    state, history = train.fit(nn.MLP([3, 2]), optax.sgd(0.1), lo, epochs=1, key=jax.random.key(0), max_steps=150)
    shown = capsys.readouterr().out
    assert "step 150/200" in shown and int(state.step) == 150 and history[-1]["step"] == 150
