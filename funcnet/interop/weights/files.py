"""safetensors files without torch: ``save_safetensors`` (atomic) and ``load_safetensors``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safetensors.numpy needs)
import numpy as np

from funcnet.state import state_dict as _state_dict
from funcnet.state import tied_keys


def _flat_for_file(params, state) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    flat = _state_dict(params, state)
    ties = tied_keys(params) if isinstance(params, Mapping) else {}
    arrays = {}
    for k, v in flat.items():
        if k in ties:
            continue
        try:
            # asarray(order="C"), not ascontiguousarray, which gives a 0-d array (num_batches_tracked) shape (1,)
            arrays[k] = np.asarray(v, order="C")
        except Exception as e:  # noqa: BLE001 - report which entry, whatever numpy says
            raise TypeError(f"save_safetensors: {k!r} holds {type(v).__name__}, which is not an array: {e}") from e
        dtype = arrays[k].dtype
        if not (dtype.kind in "biuf" or dtype.type.__module__.startswith("ml_dtypes")):  # bfloat16, float8
            raise TypeError(f"save_safetensors: {k!r} holds {type(v).__name__} ({dtype}), expected a numeric "
                            f"array (safetensors stores bool, integer and floating dtypes)")
    return arrays, ties


def save_safetensors(path: str | os.PathLike, params: Any, state: Any = None,
                     metadata: Mapping[str, str] | None = None) -> None:
    """Write ``state_dict(params, state)`` to a safetensors file at ``path``, atomically.

    Keys are torch's (flat, dotted). bfloat16 is stored as BF16. A tied parameter is
    stored once, under its target key, and the file's metadata maps the tied key to it
    (``{"lm_head.weight": "transformer.wte.weight"}``), which is what
    ``safetensors.torch.save_model`` writes, so torch's ``load_model`` and
    ``load_safetensors`` fill both keys. ``metadata``: extra ``str -> str`` entries.
    The file is written to a temporary file in the same folder and renamed over
    ``path``, so a failed write leaves any existing file untouched.
    """
    from safetensors.numpy import save_file

    arrays, ties = _flat_for_file(params, state)
    meta = {str(k): v for k, v in (metadata or {}).items()}
    bad = [k for k, v in meta.items() if not isinstance(v, str)]
    if bad:
        raise TypeError(f"save_safetensors: metadata values must be str, got {bad[0]!r}: "
                        f"{type(meta[bad[0]]).__name__}; convert them (str(value), json.dumps)")
    clash = [k for k in ties if k in meta and meta[k] != ties[k]]
    if clash:
        raise ValueError(f"save_safetensors: metadata key {clash[0]!r} is a tied parameter's key, which the file "
                         f"uses to record the tie; rename the metadata entry")
    meta.update(ties)
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(21, f"save_safetensors: {path} is a folder; pass a file path such as "
                                    f"{os.path.join(path, 'model.safetensors')}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    except OSError as e:  # the temporary file's name would hide the path the caller gave
        raise OSError(e.errno, f"save_safetensors: cannot write {path}: {e.strerror} in {folder}; pass a path "
                               f"in an existing folder this user can write") from None
    os.close(fd)
    try:
        save_file(arrays, tmp, metadata=meta or None)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a saved file gets the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise OSError(e.errno, f"save_safetensors: could not write {path}: {e.strerror or e}; any existing file "
                                   f"there is left as it was") from None
        raise


def load_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """``{dotted_key: np.ndarray}`` from a safetensors file (torch's or ours), for
    ``funcnet.load_state_dict(params, sd, state=...)``. bfloat16 comes back as
    ``ml_dtypes.bfloat16``, int64 as int64. Keys a tied-weights file left out (the metadata
    entries of ``safetensors.torch.save_model``/``save_safetensors`` whose value names a
    stored tensor) are filled with that tensor, so the result has every key of torch's
    ``state_dict()``."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(21, f"load_safetensors: {path} is a folder; pass the .safetensors file inside it")
    if not os.path.exists(path):
        raise FileNotFoundError(2, f"load_safetensors: no file {path}; pass the path of a .safetensors file")
    try:
        sd = load_file(path)
        with safe_open(path, framework="np") as f:
            meta = f.metadata() or {}
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError, ...: the file is what is named
        with open(path, "rb") as f:
            head = f.read(2)
        hint = (" (a zip: a torch.save .pt file; read it with torch.load(path, map_location='cpu'))"
                if head == b"PK" else "")
        detail = " ".join(str(e).split())[:120]
        raise ValueError(f"load_safetensors: {path} is not a readable safetensors file{hint}: {type(e).__name__}: "
                         f"{detail}; it is damaged or of another format: write it again with save_safetensors or "
                         f"safetensors' save_file") from None
    for key, target in meta.items():
        if key not in sd and target in sd:
            sd[key] = sd[target]
    return sd
