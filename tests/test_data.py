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
    # the oracle: scikit-learn's own stratified split of its digits, scaled by their maximum 16
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    want_x, want_xt, want_y, want_yt = train_test_split(x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    np.testing.assert_array_equal(x_tr, want_x.astype(np.float32))
    np.testing.assert_array_equal(y_te, want_yt)
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
    # the order is jax.random.permutation's of the key (what run_epoch draws on device), cut to whole batches
    perm = np.asarray(jax.random.permutation(jax.random.key(7), 11))
    np.testing.assert_array_equal(np.asarray(data.epoch_indices(jax.random.key(7), 11, 5)), perm[:10].reshape(2, 5))
    # and batches() gathers those rows, in that order
    got = [np.asarray(yb) for _, yb in data.batches(jax.random.key(3), x, y, 3)]
    want = np.asarray(jax.random.permutation(jax.random.key(3), 10))[:9].reshape(3, 3)
    np.testing.assert_array_equal(np.stack(got), want)


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_non_positive_batch_size(bad):
    with pytest.raises(ValueError, match=f"batch_size must be a positive integer, got {bad!r}"):
        list(data.batches(jax.random.key(0), np.zeros((4, 1)), np.zeros(4), bad))


def test_batch_size_larger_than_data():
    with pytest.raises(ValueError, match="batch_size 8 is larger than the 4 examples"):
        data.check_batch_size(8, 4)


def _mnist_dir(tmp_path, labels=None, test_images=None, compress=False):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (20, 28, 28))
    labels = rng.integers(0, 10, 20) if labels is None else labels
    for stem, arr in (("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels),
                      ("t10k-images-idx3-ubyte", images[:5] if test_images is None else test_images),
                      ("t10k-labels-idx1-ubyte", labels[:5])):
        _write_idx(tmp_path / stem, np.asarray(arr), compress)
    return tmp_path


def test_a_corrupt_label_byte_is_refused_not_a_256th_class(tmp_path):
    labels = np.arange(20) % 10
    labels[7] = 255
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte holds label 255 at index 7; MNIST labels are 0-9"):
        data.load("mnist", data_dir=_mnist_dir(tmp_path, labels=labels))
    assert data.num_classes("mnist") == data.num_classes("digits") == 10
    assert data.num_classes("synthetic", classes=3) == 3


def test_mnist_image_and_label_counts_must_agree(tmp_path):
    _mnist_dir(tmp_path, test_images=np.zeros((4, 28, 28)))
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte holds 4 images but .*t10k-labels-idx1-ubyte holds 5"):
        data.load("mnist", data_dir=tmp_path)


def test_mnist_trailing_bytes_are_not_called_truncated(tmp_path):
    _mnist_dir(tmp_path)
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes() + b"\x00\x00\x00")
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte has 3 bytes past the \(20,\) = 20 values"):
        data.load("mnist", data_dir=tmp_path)


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_a_damaged_gzip_file_is_named(tmp_path, damage):
    _mnist_dir(tmp_path, compress=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    raw = path.read_bytes()
    # cut: gzip raises EOFError; a flipped byte in the deflate stream: zlib.error or a CRC error
    raw = raw[: len(raw) // 2] if damage == "cut" else raw[:-100] + bytes([raw[-100] ^ 0xFF]) + raw[-99:]
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.gz is a damaged gzip file .*download it again"):
        data.load("mnist", data_dir=tmp_path)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"n_train": 2.5}, TypeError, r"n_train must be a positive int, got 2.5"),
    ({"classes": 0}, ValueError, r"classes must be positive, got 0"),
    ({"noise": float("nan")}, ValueError, r"noise must be a finite number >= 0 .*got nan"),
    ({"noise": float("inf")}, ValueError, r"noise must be a finite number >= 0 .*got inf"),
    ({"seed": -1}, ValueError, r"seed must be a non-negative int, got -1"),
])
def test_synthetic_refuses_bad_arguments_by_name(kwargs, error, message):
    with pytest.raises(error, match=message):
        data.load("synthetic", **kwargs)


def test_digits_seed_beyond_32_bits_is_named():
    with pytest.raises(ValueError, match=r"load\('digits'\): seed must be at most 2\*\*32 - 1"):
        data.load("digits", seed=2**64)


def test_fingerprint_changes_with_one_value_and_with_the_dtype():
    x = np.zeros((3, 4), np.float32)
    base = data.fingerprint(x, np.arange(3))
    assert base == data.fingerprint(x.copy(), np.arange(3))
    y = x.copy()
    y[2, 3] = 1e-30
    assert data.fingerprint(y, np.arange(3)) != base
    assert data.fingerprint(x.astype(np.float64), np.arange(3)) != base


def test_image_shape_gives_nchw_images_for_a_conv_net(tmp_path):
    from sklearn.datasets import load_digits

    (x_flat, y_flat), (x_te_flat, _) = data.load("digits")
    (x_img, y_img), (x_te_img, _) = data.load("digits", image_shape=True)
    assert x_img.shape == (1437, 1, 8, 8) and x_te_img.shape == (360, 1, 8, 8) and x_img.dtype == np.float32
    np.testing.assert_array_equal(x_img.reshape(1437, 64), x_flat)
    np.testing.assert_array_equal(y_img, y_flat)
    # each image is one of scikit-learn's 8x8 images, rows and columns in place (oracle: its .images)
    images = {(img / 16.0).astype(np.float32).tobytes() for img in load_digits().images}
    assert all(x_img[i, 0].tobytes() in images for i in range(0, 1437, 97))

    _mnist_dir(tmp_path)
    written = np.random.default_rng(0).integers(0, 256, (20, 28, 28))  # what _mnist_dir wrote
    (m_tr, _), (m_te, _) = data.load("mnist", data_dir=tmp_path, image_shape=True)
    assert m_tr.shape == (20, 1, 28, 28) and m_te.shape == (5, 1, 28, 28)
    np.testing.assert_allclose(m_tr[:, 0], written / 255.0, rtol=1e-6)


def test_image_shape_is_refused_where_there_are_no_images():
    with pytest.raises(ValueError, match="synthetic data set is feature vectors, not images"):
        data.load("synthetic", image_shape=True)
    with pytest.raises(TypeError, match="image_shape must be True or False, got 'yes'"):
        data.load("digits", image_shape="yes")
