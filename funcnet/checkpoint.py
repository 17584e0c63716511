"""Checkpoints of a whole ``TrainState``: atomic save, strict restore, resume.

``save(directory, state, step=s)`` writes ``directory/step_<s>.ckpt``: every leaf of
the state (params, optimizer state, step, PRNG key, loss scale) plus optional JSON
metadata. ``restore(directory, template)`` reads the latest one back into the
structure of ``template``. torch counterpart: ``torch.save({"model": m.state_dict(),
"optimizer": opt.state_dict(), ...}, path)`` / ``torch.load`` + ``load_state_dict``.

Resuming a run exactly: ``fit(..., callbacks=[callbacks.ModelCheckpoint(d, every_steps=100)])``,
then ``state, start = callbacks.resume(d, template)`` and ``fit(..., state=state, start=start)``
gives the same bits as an uninterrupted run: everything random derives from ``state.key``,
which is saved. ``funcnet train --checkpoint-dir D --resume`` does this too.

Guarantees:
- Atomic: the file is written under a temporary name in the same directory,
  fsync-ed, then renamed (``os.replace``), and the directory is fsync-ed. A crash at
  any point leaves either the old set of checkpoints or the old set plus the new one,
  never a half-written ``step_*.ckpt``; leftover temporary files are ignored and
  removed by the next save (only those of dead processes: a temporary file names its
  writer's PID, and a live writer's file is never touched). A failed write (full disk,
  read-only folder) raises an ``OSError`` naming the file and saying that the previous
  checkpoints are kept.
- One run per directory: ``lock(directory)`` takes an exclusive ``flock`` on
  ``directory/.lock`` (``funcnet train`` holds it for the whole run); a second taker gets
  ``CheckpointLockedError`` naming the folder and the holder's PID at once.
- Verified: a header carries the payload's length and SHA-256; a truncated, corrupted or
  renamed file raises ``CheckpointError`` naming the file, never a decoder traceback.
- Strict JSON metadata: non-finite floats are stored as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
- Strict: ``restore`` compares the saved leaves with the template's, path by path
  (``params/0/weight``, ``opt_state/0/mu/0/bias``, ``key``), and reports every missing
  path, unexpected path and shape / dtype / key-type mismatch in one error.
- Bitwise: leaves are stored as raw array bytes; typed PRNG keys as ``jax.random.key_data``
  plus their implementation's name.

Why not orbax-checkpoint: docs/design.md, "Checkpoints".

Examples:
    >>> import tempfile
    >>> import jax.numpy as jnp
    >>> from funcnet import checkpoint
    >>> folder, state = tempfile.mkdtemp(), {"w": jnp.ones(3)}
    >>> _ = checkpoint.save(folder, state, step=7)
    >>> checkpoint.latest_step(folder), checkpoint.restore(folder, state)["w"].tolist()
    (7, [1.0, 1.0, 1.0])
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import os
import re
import secrets
import struct
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

__all__ = ["CheckpointError", "CheckpointLockedError", "save", "restore", "read_metadata", "latest_step",
           "all_steps", "checkpoint_path", "lock"]

_MAGIC = b"FUNCNET-CKPT"
_VERSION = 1
_HEADER = struct.Struct(">12sIQ32s")  # magic, format version, payload length, sha256(payload)
_NAME = re.compile(r"^step_(\d+)\.ckpt$")
_TMP = re.compile(r"^\.step_\d+\.ckpt\.tmp-(\d+)-")
LOCK_NAME = ".lock"


class CheckpointError(ValueError):
    """A missing, corrupt, truncated or mismatched checkpoint; the message names the file and the fix.

    Examples:
        >>> import tempfile
        >>> from funcnet import CheckpointError, checkpoint
        >>> try:
        ...     checkpoint.restore(tempfile.mkdtemp(), {})
        ... except CheckpointError as e:
        ...     print(type(e).__name__)
        CheckpointError
    """


class CheckpointLockedError(CheckpointError):
    """Another process holds the directory's lock (``lock``); the message names the folder and its PID."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # someone else's live process (or a name we cannot judge: keep the file)
    return True


class lock:
    """Exclusive lock on a checkpoint directory, for one run at a time: a context manager
    (``with checkpoint.lock(d): ...``) or ``acquire()`` / ``release()``.

    ``fcntl.flock`` on ``directory/.lock`` (created, with the directory, if missing; the holder
    writes its PID there). The kernel drops the lock when the holder exits, however it dies, so
    a stale ``.lock`` file never blocks. A second taker, in this or another process, gets
    ``CheckpointLockedError`` at once; no waiting. No-op where ``fcntl`` is missing (Windows).
    """

    def __init__(self, directory: str | os.PathLike, *, name: str = LOCK_NAME, what: str | None = None,
                 other: str = "folder", remove: bool = False):
        # name/what/remove: the same lock for another output (``funcnet train --out`` locks
        # ``.OUT.lock`` beside its folder, removed on release so no file is left behind)
        self.directory = Path(directory)
        self.path = self.directory / name
        self.what = what or f"checkpoint folder {self.directory}"
        self.other, self.remove = other, remove
        self._fd = None

    def acquire(self) -> "lock":
        """Take the lock without waiting; raise ``CheckpointLockedError`` naming the holder's PID if another process
        has it."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return self
        path = self.path
        while True:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OSError(e.errno, f"cannot lock {self.what}: {e.strerror} ({path}); pass a folder this user "
                                       f"can write") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise CheckpointLockedError(
                    f"{self.what} is in use by another run (process {holder} holds {path}); wait for it to "
                    f"finish, stop it, or use another {self.other}"
                ) from None
            try:  # a holder that removes the file on release may have removed this one: lock the new one
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock back (removing the lock file first when ``remove``); a second call does nothing."""
        if self._fd is not None:
            if self.remove:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)  # while still held: the next taker re-checks the inode
            os.close(self._fd)  # closing drops the flock; the file stays for the next holder
            self._fd = None

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    """The file ``save(directory, state, step=step)`` writes."""
    return Path(directory) / f"step_{step:08d}.ckpt"


def all_steps(directory: str | os.PathLike) -> list[int]:
    """Steps of the checkpoints in ``directory``, ascending; ``[]`` if none or no such directory."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(directory)) if m)


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest checkpoint's step, or ``None`` when ``directory`` holds none."""
    steps = all_steps(directory)
    return steps[-1] if steps else None


def _path_str(path) -> str:
    return "/".join(str(getattr(e, "name", getattr(e, "key", getattr(e, "idx", e)))) for e in path)


def _is_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _key_impl(leaf) -> str:
    if isinstance(leaf, jax.ShapeDtypeStruct):  # key_impl wants a concrete key; the dtype knows its impl
        return leaf.dtype._impl.name
    return str(jax.random.key_impl(leaf))


def _flatten(tree, what: str):
    leaves = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = _path_str(path)
        if name in leaves:
            raise CheckpointError(f"{what}: two leaves share the path {name!r}; rename one of the keys")
        leaves[name] = leaf
    return leaves


def _check_step(step) -> int:
    if isinstance(step, (bool, np.bool_)):  # True is operator.index-able: it would save step 1
        raise TypeError(f"save: step must be a non-negative integer, got {step!r} (a bool); pass step=int(state.step)")
    try:
        step = operator.index(step) if not hasattr(step, "item") else operator.index(step.item())
    except (TypeError, ValueError):  # a float, or an array of more than one element
        raise TypeError(f"save: step must be a non-negative integer, got {step!r}; pass step=int(state.step)") from None
    if step < 0:
        raise ValueError(f"save: step must be a non-negative integer, got {step}")
    return step


def save(directory: str | os.PathLike, state: Any, *, step: int, keep: int | None = 3,
         metadata: dict | None = None) -> Path:
    """Write ``state`` (any pytree, typically a ``TrainState``) as checkpoint ``step``; return its path.

    ``keep``: how many of the newest checkpoints to leave in ``directory`` (``None``: all).
    ``metadata``: a JSON-serialisable dict stored alongside (``read_metadata``). Saving a
    step older than the newest one in ``directory`` is refused (one run per directory);
    saving the same step again replaces it atomically.
    """
    step = _check_step(step)
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"save: keep must be a positive integer or None (keep all), got {keep!r}")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"save: {directory} exists and is not a directory; pass a directory path")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"save: cannot create checkpoint folder {directory}: {e.strerror}; pass a "
                               f"folder this user can write") from None
    newest = latest_step(directory)
    if newest is not None and step < newest:
        raise CheckpointError(
            f"save: step {step} is older than the newest checkpoint in {directory} (step {newest}); "
            f"a checkpoint directory holds one run: use an empty directory or resume from step {newest}"
        )
    try:
        from funcnet.guards import json_safe

        meta_text = json.dumps(json_safe({} if metadata is None else metadata), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save: metadata must be JSON-serialisable ({e}); convert arrays with .tolist()") from None

    arrays, key_impls = {}, {}
    for name, leaf in _flatten(state, "save").items():
        if isinstance(leaf, jax.Array) and leaf.is_deleted():
            raise CheckpointError(f"save: leaf {name} was donated to a training step, which reuses its memory; "
                                  f"save the state the step returned, not the one passed in")
        if _is_key(leaf):
            key_impls[name] = _key_impl(leaf)
            leaf = jax.random.key_data(leaf)
        if not hasattr(leaf, "dtype") and not isinstance(leaf, (int, float, complex, bool)):
            raise CheckpointError(f"save: leaf {name} is {type(leaf).__name__}, not an array or a number; a "
                                  f"checkpoint holds arrays: keep other values out of the state (JSON-able ones in "
                                  f"metadata=)")
        arrays[name] = np.asarray(leaf)  # device -> host copy, taken before any later donation
    payload = serialization.msgpack_serialize(
        {"step": step, "leaves": arrays, "key_impls": key_impls, "metadata": meta_text})
    header = _HEADER.pack(_MAGIC, _VERSION, len(payload), hashlib.sha256(payload).digest())

    for stale in os.listdir(directory):
        m = _TMP.match(stale)
        if m and not _pid_alive(int(m.group(1))):  # left by a writer that died before its rename
            (directory / stale).unlink(missing_ok=True)
    final = checkpoint_path(directory, step)
    tmp = directory / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "xb") as f:
            f.write(header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            kept = (f"the previous checkpoints are kept (newest: step {newest})" if newest is not None
                    else "nothing was saved there before")
            raise OSError(e.errno, f"save: could not write checkpoint step {step} to {final}: "
                                   f"{e.strerror or e}; {kept}") from e
        raise

    if keep is not None:
        for old in all_steps(directory)[:-keep]:
            checkpoint_path(directory, old).unlink(missing_ok=True)
    return final


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; directories cannot be opened this way on Windows.
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _resolve(directory, step) -> Path:
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"restore: step must be an int or None (the latest), got {step!r} "
                            f"({type(step).__name__}); pass step={int(step) if str(step).isdigit() else 3}")
        step = int(step)
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint directory {directory}; pass the --checkpoint-dir / directory "
                              f"a run saved into")
    steps = all_steps(directory)
    if not steps:
        raise CheckpointError(f"no checkpoint in {directory} (no step_*.ckpt files); save one first, "
                              f"or start without restoring")
    if step is None:
        return checkpoint_path(directory, steps[-1])
    if step not in steps:
        raise CheckpointError(f"no checkpoint for step {step} in {directory}; available steps: "
                              f"{', '.join(map(str, steps))}")
    return checkpoint_path(directory, step)


def _read(path: Path) -> dict:
    fix = f"delete {path.name} to fall back to the previous checkpoint"
    try:
        raw = path.read_bytes()
    except OSError as e:
        what = ("a folder" if path.is_dir() else "a link to a missing file" if path.is_symlink() and not path.exists()
                else "unreadable")
        raise CheckpointError(f"{path} cannot be read as a checkpoint: it is {what} ({e.strerror}); {fix}") from None
    if len(raw) < _HEADER.size or not raw.startswith(_MAGIC):
        if raw[:len(_MAGIC)] == _MAGIC[:len(raw)]:
            raise CheckpointError(f"{path} is truncated: {len(raw)} bytes, shorter than its "
                                  f"{_HEADER.size}-byte header; {fix}")
        raise CheckpointError(f"{path} is not a funcnet checkpoint (starts with {raw[:12]!r}, expected "
                              f"{_MAGIC!r}); {fix}")
    _, version, length, digest = _HEADER.unpack_from(raw)
    if version != _VERSION:
        raise CheckpointError(f"{path} has format version {version}; this funcnet reads version {_VERSION}")
    body = raw[_HEADER.size:]
    if len(body) != length:
        state = "truncated" if len(body) < length else "longer than written"
        raise CheckpointError(f"{path} is {state}: header says {length} payload bytes, found {len(body)}; {fix}")
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(f"{path} is corrupt: its SHA-256 does not match the one written with it; {fix}")
    try:
        content = serialization.msgpack_restore(body)
        content["metadata"] = json.loads(content["metadata"])
    except Exception as e:  # checksum matched, so this is a writer bug or a foreign file
        raise CheckpointError(f"{path} passed its checksum but its payload is not a funcnet checkpoint's (msgpack: "
                              f"{type(e).__name__}); it was written by another program or version: {fix}") from e
    named = _NAME.match(path.name)
    if named and int(named.group(1)) != content["step"]:
        raise CheckpointError(f"{path} holds step {content['step']} but its name says step {int(named.group(1))} "
                              f"(renamed by hand?); rename it to {checkpoint_path(path.parent, content['step']).name} "
                              f"or delete it")
    return content


def read_metadata(directory: str | os.PathLike, step: int | None = None) -> dict:
    """The ``metadata`` dict saved with checkpoint ``step`` (default: the latest)."""
    return _read(_resolve(directory, step))["metadata"]


def _describe(leaf) -> str:
    if _is_key(leaf):
        return f"a PRNG key ({_key_impl(leaf)}) of shape {tuple(leaf.shape)}"
    dtype = np.result_type(leaf) if not hasattr(leaf, "dtype") else np.dtype(leaf.dtype)
    return f"{dtype.name}{list(np.shape(leaf))}"


def _saved_describe(value: np.ndarray, impl: str | None) -> str:
    if impl is not None:
        return f"a PRNG key ({impl}) of shape {value.shape[:-1]}"
    return f"{value.dtype.name}{list(value.shape)}"


def restore(directory: str | os.PathLike, template: Any, step: int | None = None) -> Any:
    """Checkpoint ``step`` (default: the latest) in ``template``'s structure.

    ``template`` is a state of the same kind as the saved one (``create_train_state``
    with the same model, optimizer and loss scale; ``jax.eval_shape`` of it works too):
    it fixes paths, shapes and dtypes, and where the restored arrays live (a
    ``jax.Array`` leaf's sharding). Raises ``CheckpointError`` listing every
    difference; nothing is cast.
    """
    path = _resolve(directory, step)
    content = _read(path)
    saved, impls = content["leaves"], content["key_impls"]
    expected = _flatten(template, "restore")

    problems = []
    missing = [p for p in expected if p not in saved]
    unexpected = [p for p in saved if p not in expected]
    if missing:
        problems.append("missing (in the template, not in the checkpoint): " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected (in the checkpoint, not in the template): " + ", ".join(unexpected))
    for name, leaf in expected.items():
        if name not in saved:
            continue
        value = np.asarray(saved[name])
        impl = impls.get(name)
        if _is_key(leaf):
            ok = impl == _key_impl(leaf) and value.shape[:-1] == tuple(leaf.shape)
        else:
            ok = impl is None and value.shape == tuple(np.shape(leaf)) and value.dtype == (
                np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.result_type(leaf))
        if not ok:
            problems.append(f"{name}: expected {_describe(leaf)}, got {_saved_describe(value, impl)}")
    if problems:
        raise CheckpointError(
            f"{path} (step {content['step']}) does not match the template:\n  " + "\n  ".join(problems)
            + "\nBuild the template from the same model, optimizer and loss scale as the run that saved it.")

    def rebuild(name, leaf):
        value = np.asarray(saved[name])
        if _is_key(leaf):
            out = jax.random.wrap_key_data(jnp.asarray(value), impl=impls[name])
            return jax.device_put(out, leaf.sharding) if getattr(leaf, "sharding", None) is not None else out
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
            sharding = getattr(leaf, "sharding", None)
            return jax.device_put(value, sharding) if sharding is not None else jnp.asarray(value)
        if isinstance(leaf, np.ndarray):
            return value.copy()
        if isinstance(leaf, np.generic):
            return leaf.dtype.type(value)
        return type(leaf)(value.item())  # a Python scalar leaf stays one

    leaves = [rebuild(name, leaf) for name, leaf in expected.items()]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)
