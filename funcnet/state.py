"""state_dict / load_state_dict for params pytrees, with torch's flat dotted keys.

``state_dict({"0": {"weight": w, "bias": b}})`` is ``{"0.weight": w, "0.bias": b}``,
exactly the keys torch's ``nn.Sequential(nn.Linear(...), ...).state_dict()`` has.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["state_dict", "load_state_dict", "StateDictError"]


class StateDictError(ValueError):
    """Raised by strict loading; lists every missing key, unexpected key and shape mismatch."""


def state_dict(params: Any) -> dict[str, jax.Array]:
    """Flatten a nested dict of arrays into ``{"a.b.c": array}`` (torch's Module.state_dict)."""
    flat: dict[str, jax.Array] = {}

    def walk(node, prefix):
        if isinstance(node, Mapping):
            for name, child in node.items():
                name = str(name)
                if "." in name:
                    raise ValueError(f"state_dict: parameter name {name!r} contains '.', which joins key levels")
                walk(child, f"{prefix}{name}.")
        elif isinstance(node, (list, tuple)):
            for i, child in enumerate(node):
                walk(child, f"{prefix}{i}.")
        elif node is not None:
            flat[prefix[:-1]] = node

    walk(params, "")
    return flat


def _as_array(value):
    if hasattr(value, "detach"):  # a torch tensor; torch is never imported here
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def load_state_dict(params: Any, sd: Mapping[str, Any], strict: bool = True) -> Any:
    """A copy of ``params`` with every leaf replaced by ``sd[dotted_key]``.

    ``params`` is the template (from ``model.init``): it fixes the structure, the
    shapes and the dtypes (values are cast to the template's dtype, as torch's
    ``load_state_dict`` copies into existing tensors). ``sd`` may hold jax or numpy
    arrays or CPU torch tensors. With ``strict=True`` any missing or unexpected key
    is an error; a shape mismatch is always an error (as in torch). All problems are
    reported together in one ``StateDictError``.
    """
    if not isinstance(sd, Mapping):
        raise TypeError(f"load_state_dict: expected a mapping of dotted keys to arrays, got {type(sd).__name__}")
    template = state_dict(params)
    missing = [k for k in template if k not in sd]
    unexpected = [k for k in sd if k not in template]
    mismatched = []
    values = {}
    for k, leaf in template.items():
        if k not in sd:
            continue
        value = _as_array(sd[k])
        if tuple(value.shape) != tuple(jnp.shape(leaf)):
            mismatched.append(f"{k}: expected shape {tuple(jnp.shape(leaf))}, got {tuple(value.shape)}")
            continue
        values[k] = jnp.asarray(value, dtype=jnp.result_type(leaf))

    problems = []
    if strict and missing:
        problems.append("missing keys: " + ", ".join(missing))
    if strict and unexpected:
        problems.append("unexpected keys: " + ", ".join(unexpected))
    if mismatched:
        problems.append("shape mismatches: " + "; ".join(mismatched))
    if problems:
        raise StateDictError(
            "load_state_dict: the state dict does not match the model's parameters.\n  "
            + "\n  ".join(problems)
            + "\nBuild the model with the same architecture as the one that was saved"
            + (" (or pass strict=False to skip missing/unexpected keys)." if not mismatched else ".")
        )

    leaves_with_path = jax.tree_util.tree_flatten_with_path(params)[0]
    treedef = jax.tree_util.tree_structure(params)
    new_leaves = []
    for path, leaf in leaves_with_path:
        key = ".".join(_path_name(p) for p in path)
        new_leaves.append(values.get(key, leaf))
    return jax.tree_util.tree_unflatten(treedef, new_leaves)


def _path_name(entry) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)
