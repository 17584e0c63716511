"""Integrity of ``funcnet.loader``'s records before training: ``records.json`` read field by
field (``check_meta``), and the shards against it (``check_records``: they open, hold
``count`` records of the size that ``shape`` and ``dtype`` give; with ``sha256`` every record
is read once for its size, its label and the SHA-256 written with them). Each problem is one
``ValueError`` naming the folder, what was found, what was expected and the fix."""

from __future__ import annotations

import hashlib

import numpy as np

_META = "records.json"


def check_meta(meta, path) -> tuple:
    """``(count, shape, dtype)`` of a records.json, each checked."""
    fix = "write the records again with funcnet.loader.write_records"
    if not isinstance(meta, dict):
        raise TypeError(f"{path} holds {type(meta).__name__}, not the object write_records writes; {fix}")
    missing = [k for k in ("count", "shape", "dtype", "shards") if k not in meta]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)}; {fix}")
    count, shape, shards = meta["count"], meta["shape"], meta["shards"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"{path}: count must be an int >= 0, got {count!r}; {fix}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ValueError(f"{path}: shape must be a list of positive ints, got {shape!r}; {fix}")
    if not isinstance(shards, list) or not shards or not all(isinstance(n, str) and n and "/" not in n for n in shards):
        raise ValueError(f"{path}: shards must be a list of file names, got {shards!r}; {fix}")
    try:
        dtype = np.dtype(meta["dtype"])
    except (TypeError, ValueError):
        raise ValueError(f"{path}: dtype {meta['dtype']!r} is not a numpy dtype (such as '<f4' or '|u1'); {fix}") \
            from None
    if dtype.kind not in "biuf":
        raise ValueError(f"{path}: dtype {meta['dtype']!r} is not a numeric dtype; {fix}")
    return count, tuple(shape), dtype


def check_records(records, *, sha256: bool = False, n_classes: int | None = None) -> None:
    """Integrity before training, every problem named with the fix: the shards open, hold
    ``count`` records between them, and the first and last records have the size that
    ``shape`` and ``dtype`` give. With ``sha256``, every record is read once: each one's
    size, its label in ``[0, n_classes)`` and the SHA-256 that ``write_records`` wrote."""
    where = f"the records in {records.directory}"
    fix = "write them again (funcnet.loader.write_records), or pass an empty --stream folder"
    try:
        source = records._open()
        total = len(source)
        ends = [source[0], source[total - 1]] if total else []
    except Exception as e:  # noqa: BLE001 - riegeli's RuntimeError, an OSError: a damaged shard
        raise ValueError(f"{where}: a shard cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:100]}); "
                         f"it is damaged or cut short: {fix}") from None
    if total != records.count:
        raise ValueError(f"{where}: {_META} says count {records.count} but the shards hold {total} records; {fix}")
    for raw in ends:
        _check_size(records, raw, where, fix)
    if not sha256:
        return
    digest = hashlib.sha256()
    for i in range(total):
        try:
            raw = source[i]
        except Exception as e:  # noqa: BLE001 - a damaged record inside an intact-looking shard
            raise ValueError(f"{where}: record {i} cannot be read ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:100]}); a shard is damaged: {fix}") from None
        _check_size(records, raw, where, fix)
        label = int(np.frombuffer(raw, "<i8", count=1)[0])
        if n_classes is not None and not 0 <= label < n_classes:
            raise ValueError(f"{where}: record {i} has label {label}, outside the {n_classes} classes "
                             f"[0, {n_classes - 1}]; {fix}")
        digest.update(raw)
    if records.sha256 is not None and digest.hexdigest() != records.sha256:
        raise ValueError(f"{where}: their SHA-256 is {digest.hexdigest()[:12]}... but {_META} says "
                         f"{records.sha256[:12]}... (a shard changed after writing); {fix}")


def _check_size(records, raw: bytes, where: str, fix: str) -> None:
    if len(raw) != records.record_bytes:
        raise ValueError(f"{where}: a record has {len(raw)} bytes but {_META}'s shape {list(records.shape)} and dtype "
                         f"{records.dtype.str} give {records.record_bytes} (8 for the label); {fix}")
