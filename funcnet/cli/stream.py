"""``funcnet train --stream DIR``: records on disk, written from --dataset when DIR is empty."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from funcnet.cli.errors import UsageError
from funcnet.cli.outputs import _fsync_dir, _Outputs


def _records_in(args, n_features: int, n_classes: int | None = None):
    """The ``loader.Records`` in --stream DIR, or None when DIR is missing or empty (``_stream``
    writes --dataset's training split there)."""
    import numpy as np

    from funcnet import loader

    directory = Path(args.stream)
    if not (directory / loader._META).is_file():
        if directory.is_dir() and any(directory.iterdir()):
            raise UsageError(f"--stream {args.stream} holds files but no {loader._META}, so no records written by "
                             f"funcnet.loader.write_records; pass an empty or missing folder (the training split of "
                             f"--dataset {args.dataset} is written there) or a folder of records")
        return None
    try:
        records = loader.Records(directory)
    except (KeyError, TypeError, ValueError) as e:  # a records.json of something else
        raise UsageError(f"--stream {args.stream}: {loader._META} is not funcnet.loader's ({type(e).__name__}: {e}); "
                         f"write the records again, or pass an empty folder") from None
    try:  # count, sizes (shape and dtype), readable shards; every record and the SHA-256 with --verify-records
        records.check(sha256=args.verify_records, n_classes=n_classes)
    except ValueError as e:
        raise UsageError(f"--stream {args.stream}: {e}") from None
    if int(np.prod(records.shape)) != n_features:
        raise UsageError(f"--stream {args.stream} holds examples of shape {records.shape} "
                         f"({int(np.prod(records.shape))} features) but the test split of --dataset {args.dataset} has "
                         f"{n_features}; pass the --dataset the records were written from, or an empty --stream folder")
    return records


def _stream(args, records, x_tr, y_tr):
    """A ``loader.Loader`` over --stream DIR, after writing the training split ``(x_tr, y_tr)``
    there when ``records`` is None. The records are written into a hidden folder beside DIR
    and renamed into place, so a run killed while writing leaves no half-written DIR."""
    from funcnet import loader

    directory = Path(args.stream)
    if records is None:
        staging = directory.parent / f".{directory.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)  # created if missing, as --out and --checkpoint-dir
            for kind, stale in _Outputs(directory)._stale():  # what killed writers left (dead PIDs only)
                if kind == "tmp":
                    shutil.rmtree(stale, ignore_errors=True)
            shards = min(4, len(x_tr))
            loader.write_records(staging, x_tr, y_tr, shards=shards)  # float32 as loaded: the same bits as in memory
            os.rename(staging, directory)  # onto a missing or empty folder
            _fsync_dir(directory.parent)
        except OSError as e:
            raise OSError(e.errno, f"--stream {args.stream}: could not write the training split of {args.dataset} "
                                   f"there: {e.strerror or e}; pass a folder this user can write, with free space") \
                from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        print(f"--stream {args.stream}: wrote the {len(x_tr)} training examples of {args.dataset} there ({shards} "
              f"ArrayRecord shards); training reads them from disk, the test split stays in memory")
    else:
        print(f"--stream {args.stream}: training on the {len(records)} records already there; --dataset "
              f"{args.dataset} gives the test split only")
    return loader.Loader(directory, args.batch_size, seed=args.seed, workers=args.workers)


def _stream_fingerprint(records, x_te, y_te) -> str:
    """What --resume compares for --stream: records.json (count, shape, dtype, shard names and
    the SHA-256 of the records, taken by write_records as it wrote them) and the shards' sizes,
    plus the test split. Cheap at any size: the shards are not read again (streamed data may
    be far larger than memory), so shards changed in place after writing go unnoticed."""
    import numpy as np

    from funcnet import data, loader

    listing = np.frombuffer((records.directory / loader._META).read_bytes(), np.uint8)
    sizes = np.array([os.path.getsize(p) for p in records.paths], np.int64)
    return data.fingerprint(listing, sizes, x_te, y_te)


def _check_stream_flags(args) -> None:
    """--stream DIR [--workers K]: one device, the MLP and conv net (not the GPT's text)."""
    if args.stream is None:
        if args.verify_records:
            raise UsageError("--verify-records checks --stream's records; pass --stream DIR, or leave it out")
        if args.workers is not None:
            raise UsageError(f"--workers {args.workers} sets the processes that read --stream's records; pass "
                             f"--stream DIR to train from records on disk, or leave --workers out")
        return
    args.workers = args.workers or 0
    most = 4 * (os.cpu_count() or 1)
    if args.workers > most:
        raise UsageError(f"--workers {args.workers} is more than 4 per CPU core ({os.cpu_count()} here): each worker is "
                         f"a process of its own, and that many only wait on each other; pass --workers <= {most}")
    if args.verify_records and args.stream is None:
        raise UsageError("--verify-records checks --stream's records; pass --stream DIR, or leave it out")
    if args.model in ("gpt", "lstm"):
        raise UsageError(f"--stream {args.stream} reads image or feature records with class labels; --model "
                         f"{args.model} trains on --dataset text in memory: leave --stream out")
    if Path(args.stream).exists() and not Path(args.stream).is_dir():
        raise UsageError(f"--stream {args.stream} is a file; pass a folder of records (funcnet.loader.write_records) "
                         f"or an empty or missing one, where the training split of --dataset is written")
