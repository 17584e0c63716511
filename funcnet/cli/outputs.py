"""``--out``'s files, replaced as a whole: staged beside it, fsync-ed, swapped in atomically.

Also the checks that a folder can be written before any data is loaded, ``refuse_overwriting_inputs``
(every command's outputs against its inputs), ``write_atomic`` and the loss plot.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from funcnet.cli.errors import UsageError

OUTPUTS = ("metrics.json", "params.npz", "loss.png")


def _same_file(a: str, b: str) -> bool:
    """One file under two names: the same resolved path (symlinks, ``..``, relative to the current
    folder) or, when both exist, the same inode (a hard link, a bind mount)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


def _inside(inner: str, folder: str) -> bool:
    """``inner`` is ``folder`` or lies under it, once both are resolved."""
    inner, folder = os.path.realpath(inner), os.path.realpath(folder)
    return inner == folder or inner.startswith(folder.rstrip(os.sep) + os.sep) or _same_file(inner, folder)


def refuse_overwriting_inputs(outputs: Iterable[tuple[str, str | os.PathLike | None, bool]],
                              inputs: Iterable[tuple[str, str | os.PathLike | None]]) -> None:
    """Raise ``UsageError`` naming both paths when an output would be written over an input, or two
    outputs over each other, before any work starts.

    ``outputs``: ``(flag, path, whole)``; ``whole=True`` is a folder replaced as a whole (``funcnet
    train --out``), which destroys every input inside it too. ``inputs``: ``(what, path)``, ``what``
    as the message names it (``--data-dir``, ``the model file``). ``None`` paths are skipped.
    """
    outputs = [(flag, os.fspath(path), whole) for flag, path, whole in outputs if path is not None]
    inputs = [(what, os.fspath(path)) for what, path in inputs if path is not None]
    for flag, out, whole in outputs:
        for what, source in inputs:
            if _same_file(out, source) or (whole and _inside(source, out)):
                where = "is" if _same_file(out, source) else "holds"
                raise UsageError(f"{flag} {out} {where} {what} {source} ({os.path.realpath(source)}), which this "
                                 f"command reads: writing {flag} would destroy it; pass another {flag} path")
    for i, (flag, out, _) in enumerate(outputs):
        for other, path, _ in outputs[i + 1:]:
            if _same_file(out, path):
                raise UsageError(f"{flag} {out} and {other} {path} are the same file ({os.path.realpath(out)}); "
                                 f"pass two different paths")


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, fsync-ed and renamed over
    ``path``: a failed or killed write leaves the file that was there as it was."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _probe_writable(folder: Path, flag: str) -> None:
    probe = folder / f".write-test-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(probe, "xb") as f:
            f.write(b"funcnet")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OSError(e.errno, f"{flag} {folder} cannot be written: {e.strerror}; pass a folder this user can "
                               f"write, with free space") from None
    finally:
        probe.unlink(missing_ok=True)


class _Outputs:
    """``--out``'s three files, replaced together: written into a hidden folder beside ``--out``
    (``.NAME.tmp-PID-RANDOM``), fsync-ed, then exchanged with ``--out`` in one atomic rename."""

    def __init__(self, out: Path):
        self.out = out
        self.staging = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"

    def _stale(self):
        prefix = f".{self.out.name}."
        for entry in os.listdir(self.out.parent):
            if not entry.startswith(prefix):
                continue
            kind, _, rest = entry[len(prefix):].partition("-")
            pid = rest.split("-")[0]
            if kind in ("tmp", "old") and pid.isdigit() and not _pid_alive(int(pid)):
                yield kind, self.out.parent / entry

    def lock(self):
        """``checkpoint.lock`` on ``.NAME.lock`` beside ``--out`` (not inside: --out is swapped as a
        whole), removed when the run ends: a second run on the same --out is refused at once."""
        from funcnet import checkpoint

        return checkpoint.lock(self.out.parent, name=f".{self.out.name}.lock", what=f"--out {self.out}",
                               other="--out", remove=True)

    def prepare(self) -> None:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            stale = sorted(self._stale())
            for kind, path in stale:
                if kind == "old" and not self.out.exists():
                    os.rename(path, self.out)  # a fallback swap that died between its two renames
                else:
                    shutil.rmtree(path, ignore_errors=True)
            self.staging.mkdir()
            _probe_writable(self.staging, "--out")
            if self.out.exists() and not os.access(self.out, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied", str(self.out))
        except OSError as e:
            if e.strerror and e.strerror.startswith("--out"):
                raise
            raise OSError(e.errno, f"--out {self.out} cannot be written: {e.strerror} ({e.filename or self.out}); "
                                   f"pass a folder this user can write") from None

    def commit(self, metrics: dict, arrays: dict, history: list, kept: str = "", steps=()) -> None:
        import numpy as np

        from funcnet import guards

        try:
            text = json.dumps(guards.json_safe(metrics), indent=2, allow_nan=False) + "\n"
            with open(self.staging / "metrics.json", "x") as f:
                f.write(text)
                _sync(f)
            with open(self.staging / "params.npz", "xb") as f:
                np.savez(f, **arrays)
                _sync(f)
            _plot_loss(history, self.staging / "loss.png", steps)
            with open(self.staging / "loss.png", "rb") as f:
                os.fsync(f.fileno())
            _fsync_dir(self.staging)
            self._swap()
        except OSError as e:
            raise OSError(e.errno, f"could not write the outputs to {self.out}: {e.strerror or e} "
                                   f"({e.filename or self.staging}); {self.out} is left as it was{kept}") from None

    def _swap(self) -> None:
        if not self.out.exists():
            os.rename(self.staging, self.out)
        elif _exchange(self.staging, self.out):
            pass  # self.staging now holds the previous set
        else:  # no atomic exchange here: two renames; prepare() repairs a death between them
            old = self.out.parent / f".{self.out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(self.out, old)
            os.rename(self.staging, self.out)
            os.rename(old, self.staging)
        _fsync_dir(self.out.parent)
        shutil.rmtree(self.staging, ignore_errors=True)

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    from funcnet.checkpoint import (
        _fsync_dir as fsync_dir,  # one copy: the rename made durable
    )

    fsync_dir(directory)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    import errno as _errno

    if err in (_errno.EINVAL, _errno.ENOSYS, _errno.ENOTSUP):  # a file system without RENAME_EXCHANGE
        return False
    raise OSError(err, os.strerror(err), str(b))


def _pid_alive(pid: int) -> bool:
    from funcnet.checkpoint import _pid_alive as alive

    return alive(pid)


def _file_above(path: Path):
    """The nearest existing ancestor of ``path`` if it is not a folder (so ``path`` cannot be created)."""
    for parent in path.absolute().parents:
        if os.path.lexists(parent):
            return parent if not parent.is_dir() else None
    return None


def _check_out(args) -> None:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is a file; pass a folder (created if missing)")
    resolved, cwd = out.resolve(), Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents or resolved.parent == resolved:
        raise UsageError(f"--out {args.out} is the current folder or one above it; the outputs replace --out as a "
                         f"whole, so give the run a folder of its own (e.g. --out runs/train-{args.model})")
    refuse_overwriting_inputs([("--out", args.out, True)], [("--data-dir", getattr(args, "data_dir", None))])
    for flag, value, beside in (("--checkpoint-dir", args.checkpoint_dir, "ckpt"), ("--stream", args.stream, "data")):
        inner = None if value is None else Path(value).resolve()
        if inner is not None and (inner == resolved or resolved in inner.parents):
            raise UsageError(f"{flag} {value} is inside --out {args.out}, which is replaced as a whole when the run "
                             f"ends; put it beside, e.g. {flag} {args.out}-{beside}")
    if not out.is_dir():
        return
    entries = os.listdir(out)
    foreign = sorted(e for e in entries if e not in OUTPUTS)
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise UsageError(f"--out {args.out} holds other files ({shown}); the outputs replace --out as a whole, so "
                         f"it may hold only {', '.join(OUTPUTS)}: choose a new folder")
    for name in OUTPUTS:
        path = out / name
        if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
            raise UsageError(f"--out {args.out}: {name} is not a regular file (a folder or a link); move it away "
                             f"or choose another --out")


def _plot_loss(history, path: Path, steps=()) -> None:
    """The losses per epoch; with ``steps`` (``(step, loss)`` of --log-every) the training loss
    per logged step too, against the step count (epochs at their last step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if steps:
        ax.plot([s for s, _ in steps], [v for _, v in steps], label="train loss (logged steps)", alpha=0.6)
        epochs, xlabel = [r["step"] for r in history], "optimizer step"
        ax.plot(epochs, [r["train_loss"] for r in history], "o", label="train loss (epoch mean)")
    else:
        epochs, xlabel = [r["epoch"] for r in history], "epoch"
        ax.plot(epochs, [r["train_loss"] for r in history], label="train loss")
    if history and "test_loss" in history[0]:
        ax.plot(epochs, [r["test_loss"] for r in history], "o-" if steps else "-", label="test loss")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("cross entropy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
