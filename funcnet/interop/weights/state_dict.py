"""torch tensors <-> funcnet params and state: ``from_torch``, ``from_torch_with_state``, ``to_torch``.

Values keep their dtype and bits; tied parameters (nanoGPT's ``lm_head.weight is
transformer.wte.weight``) stay one array, with ``nn.Tied`` at the other names. torch is
imported lazily.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.interop.trace.registry import _check_module
from funcnet.nn.module import Tied
from funcnet.state import _BUFFER_NAMES
from funcnet.state import state_dict as _state_dict


def _to_numpy(tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16; go through float32 exactly
        return tensor.float().numpy().astype(jnp.bfloat16)
    return tensor.numpy().copy()


def _to_jax(key: str, tensor) -> jax.Array:
    if not hasattr(tensor, "detach"):
        raise TypeError(f"from_torch: {key!r} holds {type(tensor).__name__}, expected a torch.Tensor")
    if getattr(tensor, "is_meta", False):
        raise ValueError(f"from_torch: {key!r} is a meta tensor (a shape without data, from a model built on "
                         f"device='meta'); load real weights first (model.to_empty(device='cpu') and "
                         f"load_state_dict, or torch.load(path, map_location='cpu'))")
    if getattr(tensor, "is_sparse", False) or "sparse" in str(getattr(tensor, "layout", "")):
        raise ValueError(f"from_torch: {key!r} is a sparse tensor ({tensor.layout}); funcnet params are dense: "
                         f"pass tensor.to_dense()")
    x64 = jax.config.jax_enable_x64
    if str(tensor.dtype) in ("torch.float64", "torch.complex128") and not x64:
        raise TypeError(
            f"from_torch: {key!r} is {tensor.dtype}, but JAX runs with 64-bit types off (x64), so it "
            f"would silently become 32-bit; set JAX_ENABLE_X64=1 before JAX starts, or convert the "
            f"model with .float() first"
        )
    array = _to_numpy(tensor)
    if array.dtype in (np.int64, np.uint64) and not x64:
        # JAX without x64 has no 64-bit integers; a count (num_batches_tracked) fits 32 bits
        narrow = np.int32 if array.dtype == np.int64 else np.uint32
        info = np.iinfo(narrow)
        if array.size and (array.min() < info.min or array.max() > info.max):
            bad = array.max() if array.max() > info.max else array.min()
            raise ValueError(
                f"from_torch: {key!r} is {tensor.dtype} and holds {int(bad)}, outside {np.dtype(narrow)} "
                f"[{info.min}, {info.max}], the widest integer JAX has with 64-bit types off; set "
                f"JAX_ENABLE_X64=1 before JAX starts (or use `with jax.enable_x64(True):`)")
        array = array.astype(narrow)
    return jnp.asarray(array)


def _shares_memory_key(tensor):
    # two state_dict entries that view the same memory the same way are one tied parameter
    if tensor.numel() == 0 or tensor.is_meta or "strided" not in str(tensor.layout):
        return None  # no storage to share (from_torch names meta and sparse tensors)
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def _split(source, buffers: Iterable[str] | None, where: str, check: bool = True):
    """``(sd, buffer keys, ties {tied key: first key})`` of a module or a state_dict mapping
    (``check``: refuse a torch.nn layer funcnet.nn has no counterpart for; ``convert`` builds
    those by tracing their forward, so it reads their tensors without the check)."""
    if hasattr(source, "state_dict") and hasattr(source, "named_parameters"):
        if buffers is not None:
            raise TypeError(f"{where}: buffers= is for a state_dict mapping; a module knows its buffers")
        if check:
            _check_module(source)
        sd = source.state_dict()
        first: dict[int, str] = {}
        ties = {}
        param_names = set()
        for name, p in source.named_parameters(remove_duplicate=False):
            param_names.add(name)
            if id(p) in first:
                ties[name] = first[id(p)]
            else:
                first[id(p)] = name
        # persistent buffers only: non-persistent ones are not in state_dict and stay out
        buffer_keys = [k for k in sd if k not in param_names]
        return sd, buffer_keys, ties
    if not isinstance(source, Mapping):
        raise TypeError(f"{where}: expected a torch.nn.Module or a state_dict mapping, got "
                        f"{type(source).__name__}")
    sd = source
    for key, tensor in sd.items():
        if not hasattr(tensor, "detach"):
            raise TypeError(f"{where}: {key!r} holds {type(tensor).__name__}, expected a torch.Tensor")
    if buffers is None:
        buffer_keys = [k for k in sd if k.rsplit(".", 1)[-1] in _BUFFER_NAMES]
    else:
        buffer_keys = list(buffers)
        unknown = [k for k in buffer_keys if k not in sd]
        if unknown:
            raise KeyError(f"{where}: buffers= names keys that are not in the state_dict: {', '.join(unknown)}")
    first_key: dict = {}
    ties = {}
    for key, tensor in sd.items():
        if key in buffer_keys:
            continue
        mem = _shares_memory_key(tensor)
        if mem is None:
            continue
        if mem in first_key:
            ties[key] = first_key[mem]
        else:
            first_key[mem] = key
    return sd, buffer_keys, ties


def _nest(items: Iterable[tuple[str, Any]], where: str) -> dict:
    tree: dict = {}
    for key, value in items:
        if not isinstance(key, str) or "" in key.split("."):
            raise ValueError(f"{where}: key {key!r} has an empty name between dots (or at an end); torch's keys are "
                             f"names joined by single dots, such as '0.weight': fix the key")
        *path, leaf = key.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"{where}: key {key!r} nests under a tensor of the same name")
        if leaf in node:
            raise ValueError(f"{where}: key {key!r} nests under a tensor of the same name")
        node[leaf] = value
    return tree


def _variables(source, buffers, where, check: bool = True):
    sd, buffer_keys, ties = _split(source, buffers, where, check)
    buffer_keys = set(buffer_keys)
    params = _nest(((k, Tied(ties[k], len(k.split("."))) if k in ties else _to_jax(k, t))
                    for k, t in sd.items() if k not in buffer_keys), where)
    state = _nest(((k, _to_jax(k, t)) for k, t in sd.items() if k in buffer_keys), where)
    return params, state


def from_torch(module_or_state_dict: Any, *, buffers: Iterable[str] | None = None) -> dict:
    """Nested params from a torch module or state_dict: ``{"0.weight": t}`` -> ``{"0": {"weight": a}}``.

    Values keep their dtype and bits (bfloat16 stays bfloat16; float64 needs JAX's x64).
    Tied parameters become ``nn.Tied`` markers. A source with buffers (running statistics)
    is refused: use ``from_torch_with_state``. For a state_dict mapping, which keys are
    buffers cannot be read off the tensors: ``buffers=`` names them (``buffers=()``: none);
    by default keys ending in running_mean, running_var or num_batches_tracked are.
    """
    params, state = _variables(module_or_state_dict, buffers, "from_torch")
    if state:
        names = ", ".join(_state_dict({}, state))
        raise ValueError(
            f"from_torch: the source has buffers ({names}), which are state, not params (an optimizer "
            f"must not update them); use params, state = interop.from_torch_with_state(...)"
            + ("" if hasattr(module_or_state_dict, "named_parameters") else
               ", or buffers=() if these keys are parameters"))
    return params


def from_torch_with_state(module_or_state_dict: Any, *, buffers: Iterable[str] | None = None) -> tuple[dict, dict]:
    """``(params, state)``: torch's parameters and its persistent buffers as two nested dicts.

    A module's buffers are those of ``named_buffers`` that are in its ``state_dict``
    (non-persistent ones stay out, as torch leaves them out of checkpoints). Integer
    buffers stay integer: ``num_batches_tracked`` is int64 with JAX's x64 on, int32 with
    it off (refused if the count does not fit). ``state`` is ``{}`` when there are none,
    as ``nn.initial_state`` gives for a model without state. ``buffers=``: see ``from_torch``.
    """
    return _variables(module_or_state_dict, buffers, "from_torch_with_state")


def to_torch(params: Any, state: Any = None) -> dict:
    """``{dotted_key: torch.Tensor}`` (CPU, same dtype) for ``module.load_state_dict``; with
    ``state``, the buffers too. A tied parameter is listed under both keys, as torch lists it."""
    import torch

    out = {}
    for key, value in _state_dict(params, state).items():
        if hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
            raise TypeError(f"to_torch: {key!r} is a JAX PRNG key ({value.dtype}), which torch has no type for; "
                            f"leave keys out of the params, or pass jax.random.key_data(key) for its raw uint32 "
                            f"words")
        if not hasattr(value, "dtype") and not isinstance(value, (int, float, bool, np.generic)):
            raise TypeError(f"to_torch: {key!r} holds {type(value).__name__}, expected an array")
        array = np.asarray(value)
        if array.dtype == jnp.bfloat16:
            out[key] = torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
        else:
            out[key] = torch.from_numpy(array.copy())
    return out


# --------------------------------------------------------------------------------------------
# Whole models.
