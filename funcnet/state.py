"""state_dict / load_state_dict for params pytrees, with torch's flat dotted keys.

``state_dict({"0": {"weight": w, "bias": b}})`` is ``{"0.weight": w, "0.bias": b}``,
exactly the keys torch's ``nn.Sequential(nn.Linear(...), ...).state_dict()`` has.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["state_dict", "load_state_dict", "StateDictError", "merge", "tied_keys", "keys_in_order"]


class StateDictError(ValueError):
    """Raised by strict loading; lists every missing key, unexpected key and shape mismatch.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from funcnet import StateDictError, load_state_dict, nn
        >>> params = nn.Linear(3, 2).init(jax.random.key(0))
        >>> try:
        ...     load_state_dict(params, {"weight": jnp.zeros((2, 3))})
        ... except StateDictError as e:
        ...     print("bias" in str(e))
        True
    """


def _is_leaf(node) -> bool:
    return not isinstance(node, (Mapping, list, tuple)) and node is not None


def merge(params: Any, state: Any = None) -> dict:
    """One nested dict of params and state (torch's parameters and buffers), in torch's order:
    at each level a module's own params, then its own buffers, then its children."""
    if not state:
        return params
    if not isinstance(params, Mapping) or not isinstance(state, Mapping):
        raise TypeError("state_dict: params and state must be nested dicts shaped like the model "
                        "(model.init(key), model.init_state())")
    own = [(k, v) for k, v in params.items() if not isinstance(v, Mapping)]
    own += [(k, v) for k, v in state.items() if not isinstance(v, Mapping)]
    names = [k for k, v in params.items() if isinstance(v, Mapping)]
    names += [k for k, v in state.items() if isinstance(v, Mapping) and k not in names]
    if all(str(n).isdigit() for n in names):
        names.sort(key=int)
    children = [(k, merge(params.get(k, {}), state.get(k))) for k in names]
    return dict(own + children)


def state_dict(params: Any, state: Any = None, *, model: Any = None) -> dict[str, jax.Array]:
    """Flatten params (and the model's state, torch's buffers) into ``{"a.b.c": array}``,
    the keys of torch's ``Module.state_dict()``. A tied parameter (``nn.Tied``) is listed
    under both of its names, as torch lists it.

    The order is that of the dicts, and every JAX transformation (jit, grad, tree_map)
    returns dicts with sorted keys; pass ``model=`` for torch's order (a module's own
    parameters, then its buffers, then its children in the order they were declared).

    Examples:
        >>> import jax
        >>> from funcnet import nn, state_dict
        >>> model = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))
        >>> {k: v.shape for k, v in state_dict(model.init(jax.random.key(0))).items()}  # torch's keys
        {'0.weight': (2, 3), '0.bias': (2,), '2.weight': (1, 2), '2.bias': (1,)}
    """
    flat = _flatten(params, state)
    if model is None:
        return flat
    order = keys_in_order(model)
    return {k: flat[k] for k in sorted(flat, key=lambda k: order.get(k, len(order)))}


def keys_in_order(model: Any) -> dict[str, int]:
    """``{key: position}`` of ``model``'s state_dict keys in torch's order: a composite's own
    parameters, then its children in the order they were declared; inside a layer, its
    params then its buffers, in the order its ``init`` builds them (traced on shapes only)."""
    from funcnet.nn.module import Module, initial_state

    order: list[str] = []

    def visit(m, prefix, key):
        if not m.children:
            order.extend(prefix + k for k in _flatten(m.init(jax.random.clone(key)), initial_state(m)))
            return
        # a composite's own parameters, then its own buffers (nn.Buffer), then its children
        own = sorted((n for n, c in m.children if c is not None and not isinstance(c, Module)),
                     key=lambda n: type(dict(m.children)[n]).__name__ == "Buffer")
        order.extend(prefix + n for n in own)
        for n, c in m.children:
            if isinstance(c, Module):
                visit(c, f"{prefix}{n}.", key)

    jax.eval_shape(lambda key: visit(model, "", key), jax.random.key(0))
    return {k: i for i, k in enumerate(order)}


def _flatten(params: Any, state: Any = None) -> dict:
    from funcnet.nn.module import Tied

    flat: dict[str, jax.Array] = {}

    def walk(node, prefix, ancestors):
        if isinstance(node, Mapping):
            for name, child in node.items():
                name = str(name)
                if "." in name:
                    raise ValueError(f"state_dict: parameter name {name!r} contains '.', which joins key levels")
                if isinstance(child, Tied):
                    owner = (ancestors + [node])[-child.depth]
                    target = owner
                    for part in child.target.split("."):
                        target = target[part]
                    flat[f"{prefix}{name}"] = target
                else:
                    walk(child, f"{prefix}{name}.", ancestors + [node])
        elif isinstance(node, (list, tuple)):
            for i, child in enumerate(node):
                walk(child, f"{prefix}{i}.", ancestors + [node])
        elif node is not None:
            flat[prefix[:-1]] = node

    walk(merge(params, state), "", [])
    return flat


def tied_keys(params: Any) -> dict[str, str]:
    """``{dotted key of a tied parameter: dotted key of the array it is}``."""
    from funcnet.nn.module import Tied

    out = {}

    def walk(node, path):
        if isinstance(node, Mapping):
            for name, child in node.items():
                if isinstance(child, Tied):
                    owner = path[:len(path) + 1 - child.depth]
                    out[".".join(path + [str(name)])] = ".".join(owner + child.target.split("."))
                else:
                    walk(child, path + [str(name)])

    walk(params, [])
    return out


def _as_array(value, key: str = "?"):
    if hasattr(value, "detach"):  # a torch tensor; torch is never imported here
        if getattr(value, "is_meta", False):
            raise StateDictError(f"load_state_dict: {key} is a meta tensor (a shape without data); load real "
                                 f"weights, e.g. torch.load(path, map_location='cpu'), not a model built on "
                                 f"device='meta'")
        if getattr(value, "is_sparse", False) or "sparse" in str(getattr(value, "layout", "")):
            raise StateDictError(f"load_state_dict: {key} is a sparse tensor ({value.layout}); pass "
                                 f"tensor.to_dense()")
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # numpy has no bfloat16; float32 holds it exactly
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def _convert(key: str, value: np.ndarray, leaf, mismatched: list, cast: bool = False):
    """``value`` in the template leaf's dtype, or None with the reason added to ``mismatched``.

    The cast rule: a cast that loses information is refused unless ``cast=True``: a float to a
    float of fewer bits (float64 -> float32, float32 -> float16/bfloat16), decided by the dtypes
    (a float64 port whose values happen to fit float32 is still a float64 port), and any other
    cast whose values do not come back unchanged (int64 -> int32 beyond its range, 2.5 -> int).
    A finite value that would become inf is refused even with ``cast=True``."""
    dtype = jnp.result_type(leaf)
    name = np.dtype(dtype).name
    if np.iscomplexobj(value) and not jnp.issubdtype(dtype, jnp.complexfloating):
        mismatched.append(f"{key}: holds {value.dtype} values but the model's parameter is {name} "
                          f"(the imaginary part would be dropped); pass tensor.real if that is intended")
        return None
    # A copy: on CPU jnp.asarray may alias a numpy buffer, and a torch tensor's numpy view
    # shares torch's storage, which torch mutates in place (BatchNorm's running statistics).
    with np.errstate(over="ignore", invalid="ignore"):
        out = jnp.array(value, dtype=dtype, copy=True)
        floats = jnp.issubdtype(dtype, jnp.floating) and np.issubdtype(value.dtype, np.floating)
        if floats and value.size:
            overflow = np.isfinite(value) & ~np.isfinite(np.asarray(out, np.float64))
            if overflow.any():
                worst = float(np.max(np.abs(value[overflow])))
                mismatched.append(f"{key}: holds {worst:.6g}, beyond {name}'s largest value "
                                  f"{float(jnp.finfo(dtype).max):.6g} (it would become inf); keep this parameter in "
                                  f"a wider dtype (float32) or rescale the weights")
                return None
        if cast:
            return out
        if floats:
            lossy = jnp.finfo(dtype).bits < np.finfo(value.dtype).bits
        elif value.dtype == np.bool_ or value.size == 0:
            lossy = False
        else:
            lossy = not np.array_equal(np.asarray(out).astype(value.dtype), value)
    if lossy:
        mismatched.append(f"{key}: holds {value.dtype} values but the model's parameter is {name}, a lossy cast; "
                          f"build the model in {value.dtype} (for float64: JAX_ENABLE_X64=1 and dtype=jnp.float64) "
                          f"or pass cast=True to round into {name}")
        return None
    return out


def load_state_dict(params: Any, sd: Mapping[str, Any], strict: bool = True, *, state: Any = None,
                    cast: bool = False) -> Any:
    """A copy of ``params`` with every leaf replaced by ``sd[dotted_key]``; with ``state=``
    (the model's state, e.g. ``model.init_state()``) the buffers are loaded too and
    ``(params, state)`` is returned.

    ``params`` (and ``state``) are the template: they fix the structure, the shapes and
    the dtypes (values are cast to the template's dtype, as torch's ``load_state_dict``
    copies into existing tensors, but a lossy cast, such as float64 into float32 or int64
    values beyond int32, is refused naming the key and both dtypes unless ``cast=True``; a
    finite value that would become inf is always refused). ``sd`` may hold jax or numpy arrays or CPU torch
    tensors. With ``strict=True`` any missing or unexpected key is an error; a shape
    mismatch is always an error (as in torch), except a one-element ``(1,)`` array for a
    0-d leaf (``num_batches_tracked`` as older files stored it), which torch loads too. All
    problems are reported together in one ``StateDictError``. A tied parameter's second key must hold the same values as its first.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from funcnet import load_state_dict, nn
        >>> params = nn.Linear(3, 2).init(jax.random.key(0))
        >>> loaded = load_state_dict(params, {"weight": jnp.zeros((2, 3)), "bias": jnp.ones(2)})
        >>> loaded["bias"].tolist()
        [1.0, 1.0]
    """
    if not isinstance(sd, Mapping):
        raise TypeError(f"load_state_dict: expected a mapping of dotted keys to arrays, got {type(sd).__name__}")
    template = state_dict(params, state)
    ties = tied_keys(params)
    missing = [k for k in template if k not in sd and not (k in ties and ties[k] in sd)]
    unexpected = [k for k in sd if k not in template]
    mismatched = []
    values = {}
    for k, leaf in template.items():
        if k not in sd:
            continue
        value = _as_array(sd[k], k)
        if value.shape == (1,) and jnp.ndim(leaf) == 0:  # a 0-d buffer that older writers stored as (1,); torch too
            value = value.reshape(())
        if tuple(value.shape) != tuple(jnp.shape(leaf)):
            mismatched.append(f"{k}: expected shape {tuple(jnp.shape(leaf))}, got {tuple(value.shape)}")
            continue
        if k in ties:
            if ties[k] in sd and not np.array_equal(value, _as_array(sd[ties[k]], ties[k])):
                mismatched.append(f"{k}: is tied to {ties[k]} in this model but holds different values")
            elif ties[k] not in sd:
                converted = _convert(k, value, leaf, mismatched, cast)
                if converted is not None:
                    values[ties[k]] = converted
            continue
        converted = _convert(k, value, leaf, mismatched, cast)
        if converted is not None:
            values[k] = converted

    problems = []
    if strict and missing:
        problems.append("missing keys: " + ", ".join(missing))
    if strict and unexpected:
        hint = ""
        if state is None and any(k.rsplit(".", 1)[-1] in _BUFFER_NAMES for k in unexpected):
            hint = " (buffers such as running statistics: pass state=model.init_state() to load them too)"
        problems.append("unexpected keys: " + ", ".join(unexpected) + hint)
    if mismatched:
        problems.append("mismatches: " + "; ".join(mismatched))
    if problems:
        raise StateDictError(
            "load_state_dict: the state dict does not match the model's parameters.\n  "
            + "\n  ".join(problems)
            + "\nBuild the model with the same architecture as the one that was saved"
            + (" (or pass strict=False to skip missing/unexpected keys)." if not mismatched else ".")
        )

    def fill(tree, prefix=""):
        leaves_with_path = jax.tree_util.tree_flatten_with_path(tree)[0]
        treedef = jax.tree_util.tree_structure(tree)
        new_leaves = []
        for path, leaf in leaves_with_path:
            key = prefix + ".".join(_path_name(p) for p in path)
            new_leaves.append(values.get(key, leaf))
        return jax.tree_util.tree_unflatten(treedef, new_leaves)

    if state is None:
        return fill(params)
    return fill(params), fill(state)


_BUFFER_NAMES = ("running_mean", "running_var", "num_batches_tracked")


def _path_name(entry) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)
