"""Data sets with no network access, and shuffled batches driven by a PRNG key.

``load(name)`` returns ``(x_train, y_train), (x_test, y_test)``: ``x`` float32 of
shape ``(n, features)`` scaled to [0, 1], ``y`` int32 class indices of shape ``(n,)``.

- ``"digits"``: scikit-learn's bundled 8x8 digits (1797 images, 64 features), split
  80/20 stratified by ``seed``.
- ``"mnist"``: the standard IDX files (``train-images-idx3-ubyte`` etc., gzipped or not)
  from ``data_dir``; nothing is downloaded.
- ``"synthetic"``: Gaussian class clusters, any size, for tests and benchmarks.

torch counterpart: ``DataLoader(dataset, batch_size, shuffle=True)`` reshuffles from
the global generator; ``batches(key, ...)`` gives the same order for the same key.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DATASETS", "load", "epoch_indices", "batches", "check_batch_size"]

DATASETS = ("digits", "mnist", "synthetic")

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def load(name: str, *, data_dir: str | os.PathLike | None = None, seed: int = 0, **kwargs):
    """``(x_train, y_train), (x_test, y_test)`` as numpy arrays (float32 in [0, 1], int32)."""
    if name == "digits":
        return _digits(seed=seed, **kwargs)
    if name == "mnist":
        if data_dir is None:
            raise ValueError(
                "load('mnist') needs data_dir=... pointing at a folder with the IDX files "
                + ", ".join(MNIST_FILES.values())
                + " (optionally .gz); nothing is downloaded"
            )
        return _mnist(Path(data_dir), **kwargs)
    if name == "synthetic":
        return _synthetic(seed=seed, **kwargs)
    raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")


def _digits(*, seed: int = 0, test_size: float = 0.2):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    return (x_tr, y_tr), (x_te, y_te)


def _synthetic(*, seed: int = 0, n_train: int = 1024, n_test: int = 256, features: int = 32,
               classes: int = 10, noise: float = 1.0):
    for name, value in (("n_train", n_train), ("n_test", n_test), ("features", features), ("classes", classes)):
        if int(value) <= 0:
            raise ValueError(f"load('synthetic'): {name} must be positive, got {value}")
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 3.0, size=(classes, features))

    def draw(n):
        y = rng.integers(0, classes, size=n).astype(np.int32)
        x = centers[y] + noise * rng.normal(size=(n, features))
        return x, y

    x_tr, y_tr = draw(n_train)
    x_te, y_te = draw(n_test)
    lo, hi = x_tr.min(0), x_tr.max(0)
    scale = np.where(hi > lo, hi - lo, 1.0)
    return (((x_tr - lo) / scale).astype(np.float32), y_tr), (np.clip((x_te - lo) / scale, 0, 1).astype(np.float32), y_te)


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (magic {raw[:4].hex()!r})")
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path} is truncated: header says {dims}, found {data.size} values")
    return data.reshape(dims)


def _mnist(data_dir: Path):
    arrays = {}
    for part, stem in MNIST_FILES.items():
        candidates = [data_dir / stem, data_dir / (stem + ".gz")]
        found = next((p for p in candidates if p.exists()), None)
        if found is None:
            raise FileNotFoundError(
                f"MNIST file {stem} (or {stem}.gz) not found in {data_dir}; expected the four IDX files "
                + ", ".join(MNIST_FILES.values())
                + " there"
            )
        arrays[part] = _read_idx(found)
    x_tr = arrays["train_images"].reshape(len(arrays["train_images"]), -1).astype(np.float32) / 255.0
    x_te = arrays["test_images"].reshape(len(arrays["test_images"]), -1).astype(np.float32) / 255.0
    return (x_tr, arrays["train_labels"].astype(np.int32)), (x_te, arrays["test_labels"].astype(np.int32))


def check_batch_size(batch_size, n: int) -> int:
    """``batch_size`` as an int in [1, n], or a clear error."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if batch_size > n:
        raise ValueError(f"batch_size {batch_size} is larger than the {n} examples; use batch_size <= {n}")
    return int(batch_size)


def epoch_indices(key: jax.Array, n: int, batch_size: int) -> jax.Array:
    """A shuffled ``(n // batch_size, batch_size)`` index array; the last partial batch is dropped
    (torch's ``drop_last=True``) so every step has the same shape and compiles once."""
    batch_size = check_batch_size(batch_size, n)
    steps = n // batch_size
    return jax.random.permutation(key, n)[: steps * batch_size].reshape(steps, batch_size)


def batches(key: jax.Array, x, y, batch_size: int):
    """Yield shuffled ``(x_batch, y_batch)`` pairs, the order fixed by ``key``.

    The same key gives the same batches as ``train.run_epoch`` draws on device.
    """
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}; they must be equal")
    x, y = jnp.asarray(x), jnp.asarray(y)
    for idx in epoch_indices(key, len(x), batch_size):
        yield x[idx], y[idx]
