"""Bundled data, MNIST IDX files written here, shuffled batches."""

import gzip

import jax
import numpy as np
import pytest

from funcnet import data


def test_digits_split_scaled_and_fixed_by_seed():
    (x_tr, y_tr), (x_te, y_te) = data.load("digits")
    assert x_tr.shape == (1437, 64) and x_te.shape == (360, 64)
    assert x_tr.dtype == np.float32 and y_tr.dtype == np.int32
    assert x_tr.min() >= 0 and x_tr.max() <= 1 and x_tr.max() == 1
    assert set(np.unique(y_te)) == set(range(10))
    (x_tr2, _), _ = data.load("digits")
    np.testing.assert_array_equal(x_tr, x_tr2)
    (x_tr3, _), _ = data.load("digits", seed=1)
    assert not np.array_equal(x_tr, x_tr3)


def _write_idx(path, array, compress):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (20, 28, 28))
    labels = rng.integers(0, 10, 20)
    for stem, arr in (("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels),
                      ("t10k-images-idx3-ubyte", images[:5]), ("t10k-labels-idx1-ubyte", labels[:5])):
        _write_idx(tmp_path / stem, arr, compress)
    (x_tr, y_tr), (x_te, y_te) = data.load("mnist", data_dir=tmp_path)
    assert x_tr.shape == (20, 784) and x_te.shape == (5, 784)
    np.testing.assert_allclose(x_tr, images.reshape(20, -1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y_tr, labels)


def test_mnist_missing_and_truncated_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train-images-idx3-ubyte \(or train-images-idx3-ubyte.gz\) not found"):
        data.load("mnist", data_dir=tmp_path)
    with pytest.raises(ValueError, match="needs data_dir"):
        data.load("mnist")
    _write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 2, 2)), False)
    (tmp_path / "train-images-idx3-ubyte").write_bytes((tmp_path / "train-images-idx3-ubyte").read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated"):
        data.load("mnist", data_dir=tmp_path)


def test_unknown_dataset_is_named():
    with pytest.raises(ValueError, match="unknown dataset 'cifar'; expected one of digits, mnist, synthetic"):
        data.load("cifar")


def test_synthetic_is_seeded_and_learnable_shape():
    (x, y), (xt, yt) = data.load("synthetic", n_train=100, n_test=10, features=5, classes=3)
    assert x.shape == (100, 5) and xt.shape == (10, 5) and set(np.unique(y)) <= {0, 1, 2}
    (x2, _), _ = data.load("synthetic", n_train=100, n_test=10, features=5, classes=3)
    np.testing.assert_array_equal(x, x2)
    with pytest.raises(ValueError, match="features must be positive, got 0"):
        data.load("synthetic", features=0)


def test_batches_are_a_permutation_fixed_by_key():
    x = np.arange(10, dtype=np.float32)[:, None]
    y = np.arange(10, dtype=np.int32)
    k1, k2 = jax.random.split(jax.random.key(0))
    seen = np.concatenate([np.asarray(yb) for _, yb in data.batches(k1, x, y, 3)])
    assert len(seen) == 9 and len(set(seen.tolist())) == 9  # drop_last: 3 batches of 3, no repeats
    again = np.concatenate([np.asarray(yb) for _, yb in data.batches(k2, x, y, 3)])
    assert not np.array_equal(seen, again)
    np.testing.assert_array_equal(np.asarray(data.epoch_indices(jax.random.key(7), 10, 5)),
                                  np.asarray(data.epoch_indices(jax.random.key(7), 10, 5)))


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_non_positive_batch_size(bad):
    with pytest.raises(ValueError, match=f"batch_size must be a positive integer, got {bad!r}"):
        list(data.batches(jax.random.key(0), np.zeros((4, 1)), np.zeros(4), bad))


def test_batch_size_larger_than_data():
    with pytest.raises(ValueError, match="batch_size 8 is larger than the 4 examples"):
        data.check_batch_size(8, 4)
