"""torch <-> funcnet parameters, exactly (torch is imported lazily, here only).

``from_torch(module_or_state_dict)`` turns a torch ``nn.Module`` (or its
``state_dict()``) into a nested params dict with the same names, shapes and values;
``to_torch(params)`` gives back ``{dotted_key: torch.Tensor}`` that
``module.load_state_dict`` accepts. Both copy; values are bit-for-bit equal.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.state import state_dict as _state_dict

__all__ = ["from_torch", "to_torch", "SUPPORTED_MODULES"]

# torch module types with a funcnet.nn counterpart (containers are walked into).
SUPPORTED_MODULES = ("Linear", "ReLU", "Tanh", "Sigmoid", "Identity", "Dropout", "Flatten", "Sequential",
                     "ModuleList", "ModuleDict")


def _check_module(module) -> None:
    unsupported = []
    for name, sub in module.named_modules():
        kind = type(sub).__name__
        if kind in SUPPORTED_MODULES:
            continue
        own = list(sub.named_parameters(recurse=False)) + list(sub.named_buffers(recurse=False))
        # a user's own container (class Net(nn.Module) holding Linear layers) has no tensors of its own
        if type(sub).__module__.startswith("torch.nn") or own:
            unsupported.append(f"{name or '<root>'} ({kind})")
    if unsupported:
        raise TypeError(
            "from_torch: funcnet.nn has no counterpart for " + ", ".join(unsupported)
            + f"; supported modules are {', '.join(SUPPORTED_MODULES)} and containers of them. "
            "Pass model.state_dict() to convert the tensors without this check."
        )


def _to_numpy(tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16; go through float32 exactly
        return tensor.float().numpy().astype(jnp.bfloat16)
    return tensor.numpy().copy()


def from_torch(module_or_state_dict: Any) -> dict:
    """Nested params from a torch module or state_dict: ``{"0.weight": t}`` -> ``{"0": {"weight": a}}``."""
    if hasattr(module_or_state_dict, "state_dict") and hasattr(module_or_state_dict, "named_modules"):
        _check_module(module_or_state_dict)
        sd = module_or_state_dict.state_dict()
    elif isinstance(module_or_state_dict, Mapping):
        sd = module_or_state_dict
    else:
        raise TypeError(
            f"from_torch: expected a torch.nn.Module or a state_dict mapping, got "
            f"{type(module_or_state_dict).__name__}"
        )
    params: dict = {}
    for key, tensor in sd.items():
        if not hasattr(tensor, "detach"):
            raise TypeError(f"from_torch: {key!r} holds {type(tensor).__name__}, expected a torch.Tensor")
        *path, leaf = key.split(".")
        node = params
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"from_torch: key {key!r} nests under a tensor of the same name")
        if str(tensor.dtype) in ("torch.float64", "torch.complex128") and not jax.config.jax_enable_x64:
            raise TypeError(
                f"from_torch: {key!r} is {tensor.dtype}, but JAX runs with 64-bit types off (x64), so it "
                f"would silently become 32-bit; set JAX_ENABLE_X64=1 before JAX starts, or convert the "
                f"model with .float() first"
            )
        node[leaf] = jnp.asarray(_to_numpy(tensor))
    return params


def to_torch(params: Any) -> dict:
    """``{dotted_key: torch.Tensor}`` (CPU, same dtype) for ``module.load_state_dict``."""
    import torch

    out = {}
    for key, value in _state_dict(params).items():
        array = np.asarray(value)
        if array.dtype == jnp.bfloat16:
            out[key] = torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
        else:
            out[key] = torch.from_numpy(array.copy())
    return out
