"""Streaming training data from files on disk: record shards, worker processes, prefetch to
the device, per-example augmentation on the host, a seeded order and a resumable position.

torch counterpart:

```python
loader = DataLoader(dataset, batch_size, shuffle=True, drop_last=True,
                    num_workers=k, pin_memory=True)
```

Built on grain (Google's data loader for JAX): ``write_records`` stores examples as
ArrayRecord shards; ``Loader`` reads them through a ``grain.MapDataset`` (random access, so
the batch at any position of the run can be rebuilt without replaying the ones before it),
runs the per-example work in ``workers`` processes (``mp_prefetch``), and keeps the next
batches already on the device (``grain.experimental.device_put``).

- Order: epoch ``e`` visits the examples in the permutation ``index_shuffle(seed + e)`` (grain's
  stateless shuffle); the last partial batch is dropped (torch's ``drop_last=True``), so every
  epoch has ``n // batch_size`` steps of one shape and the step compiles once.
- Augmentation: ``augment(example, rng)`` runs per example on the host, its
  ``np.random.Generator`` drawn from ``(seed, position in the run)`` (grain's ``random_map``),
  so a batch is the same whichever worker builds it and whenever it is rebuilt.
- Position: batch ``s`` of the run is a pure function of ``(files, seed, batch_size, s)``;
  ``funcnet.train.fit(model, tx, loader, ...)`` takes it from ``state.step``, so a run killed
  mid-epoch and resumed from a saved ``TrainState`` sees the same batches and ends bitwise
  equal to an uninterrupted one (``funcnet.train_stream``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from funcnet.record_checks import check_meta

__all__ = ["CropFlip", "Loader", "Records", "write_records"]

_META = "records.json"
_NO_SHARED_MEMORY = 2**62  # grain's min_shm_size: no batch is that large


def _grain():
    try:
        import grain
    except ImportError:  # pragma: no cover - grain is a dependency
        raise ImportError("funcnet.loader needs grain (pip install grain), Google's data loader for JAX") from None
    from absl import flags

    if not flags.FLAGS.is_parsed():
        # grain <= 0.2.18 reads an absl flag in mp_prefetch and raises UnparsedFlagAccessError in
        # programs that never parse absl flags (google/grain#1355, fixed by #1362): use the defaults.
        flags.FLAGS.mark_as_parsed()
    return grain


def write_records(directory: str | os.PathLike, x, y, *, shards: int = 4) -> Path:
    """Write ``x`` (``(n, *shape)``, any numpy dtype: uint8 images stay uint8) and ``y`` (``(n,)``
    int class indices) as ``shards`` ArrayRecord files plus ``records.json`` in ``directory``.

    Each record is the label (int64, little-endian) followed by the example's raw bytes;
    ``records.json`` also holds the SHA-256 of all records in order (``funcnet train --stream``
    compares it on ``--resume`` without reading the shards again). Returns ``directory`` as a
    Path. torch has no file format of its own for this (``torch.save`` of the whole tensor, or
    a ``Dataset`` over image files).
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    x, y = np.ascontiguousarray(x), np.asarray(y)
    if x.ndim < 1 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"write_records: x of shape {x.shape} and y of shape {y.shape} must share their first "
                         f"axis, y of shape (n,); pass x: (n, *shape), y: (n,)")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"write_records: y must hold integer class indices, got dtype {y.dtype}")
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= max(len(x), 1):
        raise ValueError(f"write_records: shards must be an int in [1, {len(x)}] (one example per shard at "
                         f"most), got {shards!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"shard-{i:05d}-of-{shards:05d}.array_record" for i in range(shards)]
    bounds = np.linspace(0, len(x), shards + 1).astype(int)
    digest = hashlib.sha256()
    for name, lo, hi in zip(names, bounds[:-1], bounds[1:]):
        # group_size:1: each record its own chunk, so a random read decodes one example
        writer = ArrayRecordWriter(str(directory / name), "group_size:1")
        for i in range(lo, hi):
            record = np.int64(y[i]).astype("<i8").tobytes() + x[i].tobytes()
            digest.update(record)
            writer.write(record)
        writer.close()
    meta = {"count": len(x), "shape": list(x.shape[1:]), "dtype": x.dtype.str, "shards": names,
            "sha256": digest.hexdigest()}
    (directory / _META).write_text(json.dumps(meta))
    return directory


class Records:
    """The examples ``write_records`` wrote, random access: ``records[i] -> (x_i, y_i)`` as
    numpy (``x_i`` of the written shape and dtype, ``y_i`` an int64 scalar); ``len(records)``.

    A ``grain.RandomAccessDataSource``; it also serves as a torch map-style ``Dataset`` (the
    benchmarks read the same files from torch's DataLoader). Files open lazily in each process.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta_path = self.directory / _META
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path} not found: {self.directory} holds no records; write them with "
                                    f"funcnet.loader.write_records(directory, x, y)")
        meta = json.loads(meta_path.read_text())
        self.count, self.shape, self.dtype = check_meta(meta, meta_path)
        self.sha256 = meta.get("sha256")
        self.paths = [str(self.directory / name) for name in meta["shards"]]
        missing = [p for p in self.paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{len(missing)} of {len(self.paths)} shards listed in {meta_path} are missing, "
                                    f"e.g. {missing[0]}; write the records again")
        self._source = None

    def __len__(self) -> int:
        return self.count

    @property
    def record_bytes(self) -> int:
        """The size of every record: an int64 label, then the example's bytes."""
        return 8 + int(np.prod(self.shape)) * self.dtype.itemsize

    def check(self, *, sha256: bool = False, n_classes: int | None = None) -> None:
        """Integrity before training (``funcnet.record_checks.check_records``): the shards open and
        hold ``count`` records of the size ``shape`` and ``dtype`` give; with ``sha256`` every
        record is read: sizes, labels in ``[0, n_classes)`` and the SHA-256 written with them."""
        from funcnet.record_checks import check_records

        check_records(self, sha256=sha256, n_classes=n_classes)

    def _open(self):
        if self._source is None:
            self._source = _grain().sources.ArrayRecordDataSource(self.paths)
        return self._source

    def _decode(self, raw: bytes):
        return (np.frombuffer(raw, self.dtype, offset=8).reshape(self.shape),
                np.frombuffer(raw, "<i8", count=1)[0])

    def __getitem__(self, index):
        return self._decode(self._open()[int(index)])

    def __getitems__(self, indices):  # torch's fetcher batches reads through this when present
        # one read per record: measured 20 us each, where the source's own __getitems__ took 60-150 us
        # per record (its parallel reads cost more than they save on records this small)
        source = self._open()
        return [self._decode(source[int(i)]) for i in indices]

    def __getstate__(self):  # worker processes reopen the files themselves
        return {**self.__dict__, "_source": None}


class CropFlip:
    """torchvision's ``RandomCrop(size, padding)`` then ``RandomHorizontalFlip()`` on one
    ``(C, H, W)`` (or ``(H, W)``) numpy image: zero-pad ``padding`` pixels on every side, cut
    an ``H x W`` window at a uniform offset, mirror it left-right with probability 1/2.

    ``crop_flip((image, label), rng) -> (image, label)``: grain's ``random_map`` signature.
    """

    def __init__(self, padding: int = 4):
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ValueError(f"CropFlip: padding must be an int >= 0, got {padding!r}")
        self.padding = padding

    def __call__(self, example, rng: np.random.Generator):
        """The example's image cropped and maybe flipped, with its label; the offsets and the flip drawn from
        ``rng``."""
        image, label = example
        if image.ndim < 2:
            raise ValueError(f"CropFlip: an image of shape (C, H, W) or (H, W) is needed, got shape {image.shape}; "
                             f"write the records with x reshaped to images (e.g. (n, 1, 8, 8))")
        p, (h, w) = self.padding, image.shape[-2:]
        dy, dx = rng.integers(0, 2 * p + 1, size=2)
        flip = rng.random() < 0.5
        padded = np.pad(image, [(0, 0)] * (image.ndim - 2) + [(p, p), (p, p)])
        out = padded[..., dy:dy + h, dx:dx + w]
        return np.ascontiguousarray(out[..., ::-1] if flip else out), label

    def __repr__(self) -> str:
        return f"CropFlip(padding={self.padding})"


class _Locate:
    # Element i of the run -> the record it reads: epoch i // used, that epoch's permutation.
    def __init__(self, records: Records, used: int, seed: int):
        self.records, self.used, self.seed, self._shuffle = records, used, seed, None

    def __call__(self, i):
        if self._shuffle is None:  # looked up once per process
            self._shuffle = _grain().experimental.index_shuffle
        epoch, pos = divmod(int(i), self.used)
        return self.records[self._shuffle(pos, max_index=len(self.records) - 1, seed=(self.seed + epoch) % 2**32,
                                          rounds=4)]

    def __getstate__(self):
        return {**self.__dict__, "_shuffle": None}


class _Scale:
    # A batch of stored examples -> float32 in [0, 1] for integer images, flattened if asked.
    def __init__(self, flatten: bool):
        self.flatten = flatten

    def __call__(self, batch):
        x, y = batch
        scale = np.iinfo(x.dtype).max if np.issubdtype(x.dtype, np.integer) else 1
        x = x.astype(np.float32) / np.float32(scale)  # as funcnet.data scales MNIST: / 255
        return (x.reshape(len(x), -1) if self.flatten else x), y.astype(np.int32)


class Loader:
    """Shuffled, augmented batches of the records in ``directory``, ready on the device.

    ``Loader(directory, batch_size, seed=0, workers=0, augment=None, flatten=True, prefetch=2)``;
    ``loader.batches(start, stop)`` yields batches ``start .. stop-1`` of the run as
    ``(x, y)`` jax arrays: ``x`` float32 ``(batch_size, *shape)`` (flattened to
    ``(batch_size, features)`` with ``flatten=True``, the layout of ``funcnet.data``; integer
    images scaled to [0, 1]), ``y`` int32 ``(batch_size,)``. Batch ``s`` belongs to epoch
    ``s // loader.steps_per_epoch``.

    ``workers=k``: k processes build the batches (grain's ``mp_prefetch``; 0 builds them in this
    process); ``prefetch``: how many batches wait on the device (a background thread moves
    them, so host work overlaps the step even with 0 workers). ``augment(example, rng)``:
    per-example, e.g. ``CropFlip(4)``.
    """

    def __init__(self, directory: str | os.PathLike, batch_size: int, *, seed: int = 0, workers: int = 0,
                 augment: Callable | None = None, flatten: bool = True, prefetch: int = 2):
        self.records = Records(directory)
        n = len(self.records)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= n:
            raise ValueError(f"Loader: batch_size must be an int in [1, {n}] (the records hold {n} examples), "
                             f"got {batch_size!r}")
        for name, value, low in (("seed", seed, 0), ("workers", workers, 0), ("prefetch", prefetch, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"Loader: {name} must be an int >= {low}, got {value!r}")
        if augment is not None and not callable(augment):
            raise TypeError(f"Loader: augment must be a function (example, rng) -> example, got {augment!r}")
        self.batch_size, self.seed, self.workers, self.prefetch = int(batch_size), int(seed), int(workers), prefetch
        self.augment, self.flatten = augment, flatten
        self.steps_per_epoch = n // self.batch_size

    def dataset(self, stop: int):
        """The ``grain.MapDataset`` of batches ``0 .. stop-1`` on the host (numpy), before workers."""
        grain = _grain()
        used = self.steps_per_epoch * self.batch_size
        ds = grain.MapDataset.range(stop * self.batch_size).map(_Locate(self.records, used, self.seed))
        if self.augment is not None:
            ds = ds.random_map(self.augment, seed=self.seed)
        return ds.batch(self.batch_size, drop_remainder=True).map(_Scale(self.flatten))

    def batches(self, start: int, stop: int) -> Iterator[tuple[Any, Any]]:
        """Batches ``start .. stop-1`` of the run, each ``(x, y)`` on the default device."""
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start <= stop:
            raise ValueError(f"Loader.batches: need 0 <= start <= stop, got start={start!r}, stop={stop!r}")
        if start == stop:
            return _Closing(iter(()), self.records.directory)
        import jax

        grain = _grain()
        ds = self.dataset(stop)[start:]
        # Threads would fight the training step for the GIL; the parallelism is the workers'.
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        if self.workers:
            # Batches come back through the workers' pipes, not shared memory: a segment held by a
            # process that dies (SIGKILL, OOM) outlives it, and only the resource tracker frees it later.
            it = grain.experimental.WithOptionsIterDataset(it, grain.experimental.DatasetOptions(
                min_shm_size=_NO_SHARED_MEMORY))
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.workers, per_worker_buffer_size=2),
                                worker_init_fn=_worker_init)
        it = grain.experimental.device_put(it, jax.devices()[0], cpu_buffer_size=self.prefetch,
                                           device_buffer_size=self.prefetch)
        return _Closing(iter(it), self.records.directory)

    def __repr__(self) -> str:
        return (f"Loader({str(self.records.directory)!r}, batch_size={self.batch_size}, seed={self.seed}, "
                f"workers={self.workers}, augment={self.augment!r})")


def _worker_init(worker_index: int, worker_count: int) -> None:
    # Ctrl-C reaches the whole process group, as may SIGTERM (a scheduler stopping the job): leave both
    # to the main process, which stops the workers as its iteration unwinds (grain does so before
    # multiprocessing's exit would SIGTERM them). A worker killed while writing a batch leaves half a
    # message in its pipe, where the main process then waits forever. A main process that dies without
    # unwinding (SIGKILL, OOM) cannot stop them: each worker then exits by itself.
    import signal
    import threading

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, name="funcnet-exit-with-parent", daemon=True).start()


def _exit_with_parent() -> None:
    import multiprocessing

    parent = multiprocessing.parent_process()  # in a spawned worker: a pipe from the parent, at EOF once it died
    if parent is not None:  # grain always spawns its workers
        parent.join()
        os._exit(1)


class _Closing:
    # Stops the worker processes when the iteration ends early (an exception, a kill signal
    # handler unwinding) instead of leaving them to the garbage collector.
    def __init__(self, it, directory=None):
        self.it, self.directory = it, directory

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.it)
        except StopIteration:
            self.close()
            raise
        except Exception as e:  # riegeli's RuntimeError for a damaged record, from this process or a worker
            self.close()
            detail = " ".join(str(e).split())[:160]
            raise ValueError(f"reading the records in {self.directory} failed ({type(e).__name__}: {detail}); a shard "
                             f"is damaged or changed while training: write the records again "
                             f"(funcnet.loader.write_records)") from None
        except BaseException:
            self.close()
            raise

    def close(self):
        close = getattr(self.it, "close", None)
        if close is not None:
            close()
        # drop grain's iterators now: collected later (at interpreter exit), their __del__ closes
        # again after the modules it needs are gone and prints an ignored exception
        self.it = iter(())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
