"""Which torch modules have a funcnet.nn counterpart, and how their constructor arguments are read.

One row per torch class (``_Row``): ``convert`` builds the funcnet layer from it and
``from_torch`` checks a module against it before converting its tensors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from funcnet import nn


class ConversionError(TypeError):
    """A torch module that cannot become a funcnet model; the message lists every reason."""


# --------------------------------------------------------------------------------------------
# The registry: torch class -> funcnet.nn factory and its constructor arguments.

@dataclasses.dataclass(frozen=True)
class _Row:
    torch_name: str  # torch.nn.<torch_name>; subclasses match too (isinstance)
    ours: str  # funcnet.nn.<ours>; the row is active once that layer exists
    # (torch module, build) -> constructor arguments that cannot be read off attributes of the same name;
    # build(child, path, problems) converts a child module (an encoder's layers)
    args: Callable[[Any, Callable], dict] | None = None


def _mha_args(m, build) -> dict:
    return {"bias": m.in_proj_bias is not None, "add_bias_kv": m.bias_k is not None}


def _encoder_layer_args(m, build) -> dict:
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


def _encoder_args(m, build) -> dict:
    problems: list[str] = []  # the encoder's layers are built like any module: build(child, path, problems)
    layers = [build(layer, f"layers.{i}", problems) for i, layer in enumerate(m.layers)]
    norm = None if m.norm is None else build(m.norm, "norm", problems)
    if problems:
        raise ValueError("; ".join(problems))
    if len({getattr(layer, "name", repr(layer)) for layer in layers}) > 1:  # a Module, or to_source's Leaf
        raise ValueError("its layers were built with different arguments; funcnet.nn.TransformerEncoder repeats "
                         "one encoder_layer (as torch's constructor does)")
    return {"encoder_layer": layers[0], "num_layers": len(layers), "norm": norm}


def _rnn_args(m, build) -> dict:
    # torch's RNN classes take *args/**kwargs in __init__: read every argument off the attributes
    names = ["input_size", "hidden_size", "bias"]
    if not type(m).__name__.endswith("Cell") or hasattr(m, "nonlinearity"):
        names += [] if type(m).__name__.endswith("Cell") else ["num_layers", "batch_first", "dropout", "bidirectional"]
    out = {n: getattr(m, n) for n in names}
    if getattr(m, "proj_size", 0):
        out["proj_size"] = m.proj_size
    if getattr(m, "nonlinearity", None) is not None and type(m).__name__.startswith("RNN"):
        out["nonlinearity"] = m.nonlinearity
    return out


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
    "Softmin", "Softmax2d", "Threshold",
]
_ROWS = [_Row(n, n) for n in _SIMPLE] + [
    _Row("MultiheadAttention", "MultiheadAttention", _mha_args),
    _Row("TransformerEncoderLayer", "TransformerEncoderLayer", _encoder_layer_args),
    _Row("TransformerEncoder", "TransformerEncoder", _encoder_args),
    *(_Row(n, n, _rnn_args) for n in ("RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell")),
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
    """(torch base class, row) of the nearest registered class in ``module``'s MRO, or (None, None).
    A parametrized layer (weight_norm's ``ParametrizedConv1d``) is none: its weight is computed
    in its forward from ``parametrizations.weight.original0/1``, so it is traced, keeping torch's keys."""
    if _parametrized(module):
        return None, None
    for cls in type(module).__mro__:
        if cls in registry:
            return cls, registry[cls]
    return None, None


def _parametrized(module) -> bool:
    from torch.nn.utils import parametrize

    return parametrize.is_parametrized(module)


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
    """Refuse torch.nn layers that funcnet.nn has no counterpart for. A module of the user's own
    class (nanoGPT's LayerNorm, a ViT holding ``cls_token`` as an ``nn.Parameter``) is accepted:
    its tensors are params like any other, and ``nn.Composite`` with ``nn.Parameter`` children
    holds them; only its forward must be written by hand (``interop.convert`` says so)."""
    registry = _registry()
    unsupported = []
    for name, sub in module.named_modules():
        if _container_base(sub) is not None or _match(sub, registry)[0] is not None or _parametrized(sub):
            continue
        cls = type(sub)
        if cls.__module__.startswith("torch.nn") and _has_tensors(sub):
            unsupported.append(f"{name or '<root>'} ({cls.__name__}, torch.nn's own layer)")
    if unsupported:
        raise TypeError(
            "from_torch: funcnet.nn has no counterpart for " + ", ".join(unsupported)
            + f"; supported torch layers are {', '.join(SUPPORTED_MODULES)} (and their subclasses), containers of "
            "them and modules of your own classes. Pass model.state_dict() to convert the tensors without this "
            "check."
        )


def _has_tensors(module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


# --------------------------------------------------------------------------------------------
# Tensors.
