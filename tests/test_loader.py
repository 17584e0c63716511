"""funcnet.loader against independent oracles: the numpy arrays written, a brute-force search
for the crop window, permutations checked as sets, and an uninterrupted run for kill-and-resume."""

import jax
import numpy as np
import optax
import pytest

from funcnet import checkpoint, loader, nn, train

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
    whole, whole_history = loader.fit_stream(model, tx, lo, epochs=2, key=key())

    def save_then_die(state, partial):
        checkpoint.save(tmp_path, state, step=int(state.step),
                        metadata={k: np.asarray(v).tolist() for k, v in partial.items()})
        if int(state.step) == 8:  # step 2 of epoch 2 (6 steps an epoch)
            raise Killed

    with pytest.raises(Killed):
        loader.fit_stream(model, tx, lo, epochs=2, key=key(), every_steps=4, on_steps=save_then_die)
    template = train.create_train_state(model, tx, key())
    state = checkpoint.restore(tmp_path, template)
    partial = {k: np.asarray(v, np.float32) for k, v in checkpoint.read_metadata(tmp_path).items()}
    assert int(state.step) == 8 and len(partial["loss"]) == 2
    resumed, history = loader.fit_stream(model, tx, lo, epochs=2, key=key(), state=state, partial_metrics=partial)
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(resumed.step) == int(whole.step) == 12
    assert history == whole_history[1:]  # the interrupted epoch's record, bit for bit
    assert whole_history[1]["train_loss"] < whole_history[0]["train_loss"] * 1.5  # it trains, finitely


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
    with pytest.raises(ValueError, match="partial_metrics"):
        lo = loader.Loader(directory, 8)
        model, tx = nn.MLP([36, 5]), optax.sgd(0.1)
        state = train.create_train_state(model, tx, jax.random.key(0))._replace(step=np.int32(3))
        loader.fit_stream(model, tx, lo, epochs=1, key=jax.random.key(0), state=state)
