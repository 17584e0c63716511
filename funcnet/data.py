"""Data sets with no network access, and shuffled batches driven by a PRNG key.

``load(name)`` returns ``(x_train, y_train), (x_test, y_test)``: ``x`` float32 of
shape ``(n, features)`` scaled to [0, 1], ``y`` int32 class indices of shape ``(n,)``.
Images come flat, as an MLP takes them (digits: ``(n, 64)``); ``image_shape=True`` gives
torch's NCHW layout for a conv net (digits: ``(n, 1, 8, 8)``, MNIST: ``(n, 1, 28, 28)``),
the same pixels in the same order.

- ``"digits"``: scikit-learn's bundled 8x8 digits (1797 images, 64 features), split
  80/20 stratified by ``seed``.
- ``"mnist"``: the standard IDX files (``train-images-idx3-ubyte`` etc., gzipped or not)
  from ``data_dir``; nothing is downloaded.
- ``"synthetic"``: Gaussian class clusters, any size, for tests and benchmarks.

torch counterpart: ``DataLoader(dataset, batch_size, shuffle=True)`` reshuffles from
the global generator; ``batches(key, ...)`` gives the same order for the same key.

Examples:
    >>> from funcnet import data
    >>> (x_train, y_train), (x_test, y_test) = data.load("digits")
    >>> x_train.shape, x_test.shape, data.num_classes("digits")
    ((1437, 64), (360, 64), 10)
"""

from __future__ import annotations

import gzip
import hashlib
import math
import operator
import os
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DATASETS", "IMAGE_SHAPES", "load", "num_classes", "fingerprint", "epoch_indices", "batches", "check_batch_size"]

DATASETS = ("digits", "mnist", "synthetic")

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


IMAGE_SHAPES = {"digits": (1, 8, 8)}  # (channels, height, width); MNIST's comes from its files


def load(name: str, *, data_dir: str | os.PathLike | None = None, seed: int = 0, image_shape: bool = False,
         **kwargs):
    """``(x_train, y_train), (x_test, y_test)`` as numpy arrays (float32 in [0, 1], int32).

    ``x`` is flat, ``(n, features)``, unless ``image_shape=True``: then ``(n, 1, height, width)``,
    the layout torch's ``Conv2d`` and ``funcnet.nn.Conv2d`` take (digits ``(n, 1, 8, 8)``,
    MNIST ``(n, 1, 28, 28)``). ``"synthetic"`` has no image shape.

    Labels are class indices in ``[0, num_classes(name, **kwargs))``; a file holding any other
    label is refused (a model sized from the labels would silently grow a class per bad byte).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"load({name!r}): seed must be a non-negative int, got {seed!r}")
    if not isinstance(image_shape, bool):
        raise TypeError(f"load({name!r}): image_shape must be True or False, got {image_shape!r}")
    if name == "digits":
        out, shape = _digits(seed=seed, **kwargs), IMAGE_SHAPES["digits"]
    elif name == "mnist":
        if data_dir is None:
            raise ValueError(
                "load('mnist') needs data_dir=... pointing at a folder with the IDX files "
                + ", ".join(MNIST_FILES.values())
                + " (optionally .gz); nothing is downloaded"
            )
        out, shape = _mnist(Path(data_dir), **kwargs)
    elif name == "synthetic":
        if image_shape:
            raise ValueError("load('synthetic', image_shape=True): the synthetic data set is feature vectors, "
                             "not images; drop image_shape or use 'digits' or 'mnist'")
        return _synthetic(seed=seed, **kwargs)
    else:
        raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    if not image_shape:
        return out
    (x_tr, y_tr), (x_te, y_te) = out
    return (x_tr.reshape(len(x_tr), *shape), y_tr), (x_te.reshape(len(x_te), *shape), y_te)


def num_classes(name: str, **kwargs) -> int:
    """How many classes ``load(name, **kwargs)`` has: the size of a classifier's last layer,
    fixed by the data set, never derived from the labels found."""
    if name in ("digits", "mnist"):
        return 10
    if name == "synthetic":
        return _count(kwargs.get("classes", 10), "classes")
    raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")


def fingerprint(*arrays) -> str:
    """SHA-256 (hex) of the arrays' dtypes, shapes and bytes: equal exactly when the data is.
    ``funcnet train`` stores it in each checkpoint, so a resume on changed data is refused."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _count(value, name: str) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"load('synthetic'): {name} must be a positive int, got {value!r}") from None
    if n <= 0:
        raise ValueError(f"load('synthetic'): {name} must be positive, got {value}")
    return n


def _digits(*, seed: int = 0, test_size: float = 0.2):
    if seed > 2**32 - 1:  # scikit-learn's random_state is a 32-bit seed
        raise ValueError(f"load('digits'): seed must be at most 2**32 - 1 = {2**32 - 1}, got {seed}")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    return (x_tr, y_tr), (x_te, y_te)


def _synthetic(*, seed: int = 0, n_train: int = 1024, n_test: int = 256, features: int = 32,
               classes: int = 10, noise: float = 1.0):
    n_train, n_test, features, classes = (_count(v, k) for k, v in (
        ("n_train", n_train), ("n_test", n_test), ("features", features), ("classes", classes)))
    if isinstance(noise, bool) or not isinstance(noise, (int, float, np.integer, np.floating)) \
            or not math.isfinite(noise) or noise < 0:
        raise ValueError(f"load('synthetic'): noise must be a finite number >= 0 (the clusters' standard "
                         f"deviation), got {noise!r}")
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
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ValueError(f"{path} is a damaged gzip file ({type(e).__name__}: {e}); download it again or "
                         f"replace it with the uncompressed {path.stem}") from None
    except OSError as e:
        raise OSError(e.errno, f"cannot read MNIST file {path}: {e.strerror}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (magic {raw[:4].hex()!r}, expected "
                         f"'0000080N'); pass the original MNIST files")
    ndim = raw[3]
    offset = 4 + 4 * ndim
    if len(raw) < offset:
        raise ValueError(f"{path} is truncated: {len(raw)} bytes, shorter than its {offset}-byte header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=offset)
    expected = math.prod(dims)
    if data.size < expected:
        raise ValueError(f"{path} is truncated: its header says {dims} = {expected} values, found {data.size}; "
                         f"download it again")
    if data.size > expected:
        raise ValueError(f"{path} has {data.size - expected} bytes past the {dims} = {expected} values its header "
                         f"announces; the file is damaged or not MNIST: download it again")
    return data.reshape(dims)


def _mnist(data_dir: Path):
    arrays, paths = {}, {}
    for part, stem in MNIST_FILES.items():
        candidates = [data_dir / stem, data_dir / (stem + ".gz")]
        found = next((p for p in candidates if p.exists()), None)
        if found is None:
            raise FileNotFoundError(
                f"MNIST file {stem} (or {stem}.gz) not found in {data_dir}; expected the four IDX files "
                + ", ".join(MNIST_FILES.values())
                + " there"
            )
        arrays[part], paths[part] = _read_idx(found), found
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim < 2 or labels.ndim != 1:
            raise ValueError(f"{paths[split + '_images']} / {paths[split + '_labels']}: expected images of shape "
                             f"(n, rows, cols) and labels of shape (n,), got {images.shape} and {labels.shape}")
        if len(images) != len(labels):
            raise ValueError(f"{paths[split + '_images']} holds {len(images)} images but "
                             f"{paths[split + '_labels']} holds {len(labels)} labels; use files of the same split")
        if len(images) == 0:
            raise ValueError(f"{paths[split + '_images']} holds 0 images (its header says {images.shape}); MNIST's "
                             f"{split} split has {60000 if split == 'train' else 10000}, so the file is empty or cut: "
                             f"download it again")
        if len(labels) and labels.max() > 9:
            i = int(np.argmax(labels > 9))
            raise ValueError(f"{paths[split + '_labels']} holds label {int(labels[i])} at index {i}; MNIST labels "
                             f"are 0-9, so the file is damaged: download it again")
    x_tr = arrays["train_images"].reshape(len(arrays["train_images"]), -1).astype(np.float32) / 255.0
    x_te = arrays["test_images"].reshape(len(arrays["test_images"]), -1).astype(np.float32) / 255.0
    if x_tr.shape[1] != x_te.shape[1]:
        raise ValueError(f"{paths['train_images']} has {x_tr.shape[1]} pixels per image but "
                         f"{paths['test_images']} has {x_te.shape[1]}; use files of the same data set")
    images = arrays["train_images"]
    shape = (1, *images.shape[1:3]) if images.ndim == 3 else (1, x_tr.shape[1])  # (1, rows, cols)
    return ((x_tr, arrays["train_labels"].astype(np.int32)), (x_te, arrays["test_labels"].astype(np.int32))), shape


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
