"""torch <-> funcnet: weights, buffers, whole models and safetensors files.

- ``from_torch(module_or_state_dict) -> params`` and ``to_torch(params, state=None)``: torch's
  parameters as a nested params dict with the same names, shapes, dtypes and bits, and back
  as ``{dotted_key: torch.Tensor}`` for ``module.load_state_dict``.
- ``from_torch_with_state(module_or_state_dict) -> (params, state)``: the same, with torch's
  buffers (BatchNorm's running statistics) as the state tree of the module contract.
  ``from_torch`` refuses a source with buffers and names this function, rather than mixing
  buffers into params (an optimizer would update them) or dropping them.
- ``convert(module) -> (model, params, state)``: a torch module made of supported layers and
  containers as a ready funcnet.nn model, with its variables.
- ``save_safetensors`` / ``load_safetensors``: the safetensors file format, without torch.

Tied parameters (nanoGPT's ``lm_head.weight is transformer.wte.weight``) stay tied: the
params tree holds the array once, at the first name torch lists, and ``nn.Tied`` at the
others. torch is imported lazily, inside the functions that need it; the safetensors
functions never import it.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safetensors.numpy needs)
import numpy as np

from funcnet import nn
from funcnet.nn.module import Module, Tied
from funcnet.state import _BUFFER_NAMES, tied_keys
from funcnet.state import state_dict as _state_dict

__all__ = ["from_torch", "from_torch_with_state", "to_torch", "convert", "save_safetensors", "load_safetensors",
           "SUPPORTED_MODULES", "ConversionError"]


class ConversionError(TypeError):
    """A torch module that cannot become a funcnet model; the message lists every reason."""


# --------------------------------------------------------------------------------------------
# The registry: torch class -> funcnet.nn factory and its constructor arguments.

@dataclasses.dataclass(frozen=True)
class _Row:
    torch_name: str  # torch.nn.<torch_name>; subclasses match too (isinstance)
    ours: str  # funcnet.nn.<ours>; the row is active once that layer exists
    # torch module -> constructor arguments that cannot be read off attributes of the same name
    args: Callable[[Any], dict] | None = None


def _mha_args(m) -> dict:
    return {"bias": m.in_proj_bias is not None, "add_bias_kv": m.bias_k is not None}


def _encoder_layer_args(m) -> dict:
    import torch.nn.functional as F
    from torch import nn as tnn

    act = m.activation
    if act is F.relu or type(act) is tnn.ReLU:
        act = "relu"
    elif act is F.gelu or (type(act) is tnn.GELU and act.approximate == "none"):
        act = "gelu"
    else:
        raise ValueError(f"activation {act!r} is not 'relu' or 'gelu'")
    return {"d_model": m.self_attn.embed_dim, "nhead": m.self_attn.num_heads,
            "dim_feedforward": m.linear1.out_features, "dropout": m.dropout.p, "activation": act,
            "layer_norm_eps": m.norm1.eps, "batch_first": m.self_attn.batch_first, "norm_first": m.norm_first,
            "bias": m.linear1.bias is not None}


def _encoder_args(m) -> dict:
    problems: list[str] = []
    registry = _registry()
    layers = [_build(layer, f"layers.{i}", registry, problems) for i, layer in enumerate(m.layers)]
    norm = None if m.norm is None else _build(m.norm, "norm", registry, problems)
    if problems:
        raise ValueError("; ".join(problems))
    if len({layer.name for layer in layers}) > 1:
        raise ValueError("its layers were built with different arguments; funcnet.nn.TransformerEncoder repeats "
                         "one encoder_layer (as torch's constructor does)")
    return {"encoder_layer": layers[0], "num_layers": len(layers), "norm": norm}


_SIMPLE = [
    "Linear", "Identity", "Flatten", "Unflatten", "Dropout",
    "ReLU", "Tanh", "Sigmoid", "GELU", "SiLU", "Mish", "ELU", "CELU", "SELU", "LeakyReLU", "Softplus",
    "Hardtanh", "ReLU6", "Hardsigmoid", "Hardswish", "LogSigmoid", "Softsign", "Tanhshrink", "Softmax",
    "LogSoftmax", "GLU", "PReLU",
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm", "RMSNorm",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm", "AdaptiveMaxPool3d",
    "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
    "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle", "PixelUnshuffle",
    *(f"{kind}Pad{n}d" for kind in ("Zero", "Constant", "Reflection", "Replication", "Circular") for n in (1, 2, 3)),
    "Embedding", "Dropout1d", "Dropout2d", "Dropout3d",
]
_ROWS = [_Row(n, n) for n in _SIMPLE] + [
    _Row("MultiheadAttention", "MultiheadAttention", _mha_args),
    _Row("TransformerEncoderLayer", "TransformerEncoderLayer", _encoder_layer_args),
    _Row("TransformerEncoder", "TransformerEncoder", _encoder_args),
]
_CONTAINERS = ("Sequential", "ModuleList", "ModuleDict")

# torch constructor arguments with no meaning for a pure function of arrays
_IGNORED = {"self", "device", "dtype", "inplace", "_weight", "_freeze", "factory_kwargs"}


def _active_rows() -> list[_Row]:
    return [row for row in _ROWS if hasattr(nn, row.ours)]


SUPPORTED_MODULES = tuple(row.torch_name for row in _active_rows()) + _CONTAINERS
"""torch.nn classes (and their subclasses) with a funcnet.nn counterpart; containers are walked into."""


def _registry() -> dict:
    from torch import nn as tnn

    return {getattr(tnn, row.torch_name): row for row in _active_rows() if hasattr(tnn, row.torch_name)}


def _match(module, registry):
    """(torch base class, row) of the nearest registered class in ``module``'s MRO, or (None, None)."""
    for cls in type(module).__mro__:
        if cls in registry:
            return cls, registry[cls]
    return None, None


def _container_base(module):
    from torch import nn as tnn

    for cls in (tnn.Sequential, tnn.ModuleList, tnn.ModuleDict):
        if isinstance(module, cls):
            return cls
    return None


def _own_tensors(module) -> list[str]:
    return [n for n, _ in module.named_parameters(recurse=False)] + \
        [n for n, _ in module.named_buffers(recurse=False)]


def _check_module(module) -> None:
    registry = _registry()
    unsupported = []
    for name, sub in module.named_modules():
        if _container_base(sub) is not None or _match(sub, registry)[0] is not None:
            continue
        # a user's own module holding supported layers has no tensors of its own: its tensors convert
        if type(sub).__module__.startswith("torch.nn") or _own_tensors(sub):
            unsupported.append(f"{name or '<root>'} ({type(sub).__name__})")
    if unsupported:
        raise TypeError(
            "from_torch: funcnet.nn has no counterpart for " + ", ".join(unsupported)
            + f"; supported modules are {', '.join(SUPPORTED_MODULES)} (and their subclasses) and containers of "
            "them. Pass model.state_dict() to convert the tensors without this check."
        )


# --------------------------------------------------------------------------------------------
# Tensors.

def _to_numpy(tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16; go through float32 exactly
        return tensor.float().numpy().astype(jnp.bfloat16)
    return tensor.numpy().copy()


def _to_jax(key: str, tensor) -> jax.Array:
    if not hasattr(tensor, "detach"):
        raise TypeError(f"from_torch: {key!r} holds {type(tensor).__name__}, expected a torch.Tensor")
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
    if tensor.numel() == 0:
        return None
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def _split(source, buffers: Iterable[str] | None, where: str):
    """``(sd, buffer keys, ties {tied key: first key})`` of a module or a state_dict mapping."""
    if hasattr(source, "state_dict") and hasattr(source, "named_parameters"):
        if buffers is not None:
            raise TypeError(f"{where}: buffers= is for a state_dict mapping; a module knows its buffers")
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


def _variables(source, buffers, where):
    sd, buffer_keys, ties = _split(source, buffers, where)
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
        array = np.asarray(value)
        if array.dtype == jnp.bfloat16:
            out[key] = torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
        else:
            out[key] = torch.from_numpy(array.copy())
    return out


# --------------------------------------------------------------------------------------------
# Whole models.

def _same_as_default(value, default) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if isinstance(value, tuple) and not isinstance(default, tuple):
        return all(v == default for v in value)
    return value == default


def _layer(module, path: str, base, row: _Row, problems: list) -> Module | None:
    factory = getattr(nn, row.ours)
    where = f"{path or '<root>'} ({type(module).__name__})"
    if type(module).forward is not base.forward:
        problems.append(f"{where}: a subclass of torch.nn.{base.__name__} with its own forward; write it as "
                        f"nn.Composite(forward, ...) (docs/design.md, 'Composites')")
        return None
    torch_sig = inspect.signature(base.__init__)
    ours_sig = inspect.signature(factory)
    try:
        values = row.args(module) if row.args else {}
    except (AttributeError, ValueError) as e:
        problems.append(f"{where}: {e}")
        return None
    for name, p in torch_sig.parameters.items():
        if name in _IGNORED or name in values or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        value = getattr(module, name, p.empty)
        if name == "bias" and value is not p.empty:
            values[name] = value is not None  # torch keeps the tensor (or None) under the argument's name
        elif value is not p.empty and not hasattr(value, "named_parameters") and not hasattr(value, "detach"):
            values[name] = value
        elif p.default is p.empty:
            problems.append(f"{where}: cannot read its constructor argument {name!r}")
            return None
    kwargs, dropped = {}, []
    for name, value in values.items():
        if name in ours_sig.parameters:
            kwargs[name] = value
        elif not _same_as_default(value, torch_sig.parameters[name].default if name in torch_sig.parameters
                                  else inspect.Parameter.empty):
            dropped.append(f"{name}={value!r}")
    if dropped:
        problems.append(f"{where}: funcnet.nn.{row.ours} has no argument for {', '.join(dropped)}")
        return None
    weights = list(module.parameters())
    if "dtype" in ours_sig.parameters and weights and weights[0].is_floating_point():
        kwargs["dtype"] = jnp.dtype(str(weights[0].dtype).replace("torch.", ""))
    try:
        return factory(**kwargs)
    except (TypeError, ValueError) as e:
        problems.append(f"{where}: funcnet.nn.{row.ours}(**{kwargs}) failed: {e}")
        return None


def _named_sequential(children: list[tuple[str, Module]], name: str) -> Module:
    names = [n for n, _ in children]

    def forward(self, x):
        for n in names:
            x = getattr(self, n)(x)
        return x

    return nn.Composite(forward, name=name, **dict(children))


def _build(module, path: str, registry, problems: list) -> Module | None:
    from torch import nn as tnn

    where = f"{path or '<root>'} ({type(module).__name__})"
    base, row = _match(module, registry)
    if row is not None:
        return _layer(module, path, base, row, problems)
    container = _container_base(module)
    if container is None and type(module).forward is not tnn.Module.forward:
        if type(module).__module__.startswith("torch.nn"):
            problems.append(f"{where}: funcnet.nn has no counterpart yet (supported: "
                            f"{', '.join(SUPPORTED_MODULES)})")
        else:
            problems.append(f"{where}: a user-defined module whose forward is Python code; write it as "
                            f"nn.Composite(forward, **children) (docs/design.md, 'Composites'); its children "
                            f"convert with interop.convert(child)")
        return None
    if container is not None and type(module).forward is not container.forward:
        problems.append(f"{where}: a {container.__name__} subclass with its own forward; write it as "
                        f"nn.Composite(forward, ...) (docs/design.md, 'Composites')")
        return None
    if _own_tensors(module):
        problems.append(f"{where}: a container with tensors of its own ({', '.join(_own_tensors(module))}); "
                        f"write it as nn.Composite with nn.Parameter children")
        return None
    children = [(n, _build(c, f"{path}.{n}" if path else n, registry, problems))
                for n, c in module.named_children()]
    if any(c is None for _, c in children):
        return None
    if container is tnn.Sequential:
        if [n for n, _ in children] == [str(i) for i in range(len(children))]:
            return nn.Sequential(*[c for _, c in children])
        return _named_sequential(children, type(module).__name__)
    if container is tnn.ModuleList:
        return nn.ModuleList([c for _, c in children])
    return nn.ModuleDict(dict(children))  # a ModuleDict, or a plain nn.Module with no forward


def _set(tree: dict, dotted: str, value) -> None:
    *path, leaf = dotted.split(".")
    for p in path:
        tree = tree[p]
    tree[leaf] = value


def _get(tree, dotted: str):
    for p in dotted.split("."):
        tree = tree[p]
    return tree


def _copy(tree):
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, Mapping) else tree


def _with_ties(model: Module, ties: dict[str, str]) -> Module:
    """``model`` whose params hold ``nn.Tied`` at each key of ``ties`` (``{tied: target}``,
    dotted from the root), resolved to the target array before ``model.apply`` runs."""

    def init(key):
        params = _copy(model.init(key))
        for src, dst in ties.items():
            _set(params, src, Tied(dst, len(src.split("."))))
        return params

    def apply(params, *inputs, **kwargs):
        resolved = _copy(params)
        for src, dst in ties.items():
            _set(resolved, src, _get(params, dst))
        return model.apply(resolved, *inputs, **kwargs)

    return Module(init, None if model.apply is None else apply, model.init_state, model.children, model.name)


def convert(module: Any) -> tuple[Module, dict, dict]:
    """``(model, params, state)``: a torch module as a funcnet.nn model and its variables.

    ``nn.Sequential``/``ModuleList``/``ModuleDict`` and every supported leaf layer (see
    ``SUPPORTED_MODULES``; subclasses that keep torch's forward count) become their
    funcnet.nn counterparts, built with the constructor arguments read off the torch
    module (``in_features``, ``kernel_size``, ``eps``, ``momentum``, ...). A module whose
    ``forward`` is the user's Python code cannot be converted: write it as
    ``nn.Composite`` and load its weights with ``from_torch_with_state``. Every problem is
    reported in one ``ConversionError``. ``state`` is ``{}`` for a model without buffers.
    Use ``model.apply(params, x)``, or ``nn.call(model, params, state, x, train=...)``.
    """
    if not (hasattr(module, "named_modules") and hasattr(module, "state_dict")):
        raise TypeError(f"convert: expected a torch.nn.Module, got {type(module).__name__}")
    problems: list[str] = []
    model = _build(module, "", _registry(), problems)
    if problems:
        raise ConversionError("convert: cannot build a funcnet model:\n  " + "\n  ".join(problems))
    params, state = from_torch_with_state(module)
    ties = tied_keys(params)
    # the built model must have exactly torch's keys and shapes (a subclass may add tensors)
    want = {k: tuple(v.shape) for k, v in _state_dict(*jax.eval_shape(
        lambda: (model.init(jax.random.key(0)), nn.initial_state(model)))).items()}
    got = {k: tuple(v.shape) for k, v in _state_dict(params, state).items()}
    if want != got:
        diff = sorted(f"{k}: torch {got.get(k, 'missing')}, funcnet {want.get(k, 'missing')}"
                      for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise ConversionError("convert: the funcnet model's state_dict does not match torch's:\n  "
                              + "\n  ".join(diff))
    if ties:
        model = _with_ties(model, ties)
    if not model.has_state:
        state = {}
    return model, params, state


# --------------------------------------------------------------------------------------------
# safetensors, without torch.

def _flat_for_file(params, state) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    flat = _state_dict(params, state)
    ties = tied_keys(params) if isinstance(params, Mapping) else {}
    arrays = {}
    for k, v in flat.items():
        if k in ties:
            continue
        try:
            arrays[k] = np.ascontiguousarray(np.asarray(v))
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
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        save_file(arrays, tmp, metadata=meta or None)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a saved file gets the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
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

    sd = load_file(os.fspath(path))
    with safe_open(os.fspath(path), framework="np") as f:
        meta = f.metadata() or {}
    for key, target in meta.items():
        if key not in sd and target in sd:
            sd[key] = sd[target]
    return sd
