"""Canonical op names from what ``TorchFunctionMode.__torch_function__`` receives, the
fallback of in-place methods, and the refused data-dependent ops."""

from __future__ import annotations

from funcnet.interop.ops._core import OPS, Op

__all__ = ["canonical", "lookup", "REFUSED"]

_MODULES = {"torch.nn.functional": "F", "torch._C._nn": "F", "torch": "torch", "torch.functional": "torch",
            "torch._C._VariableFunctions": "torch", "torch._C._linalg": "torch.linalg", "torch.linalg": "torch.linalg",
            "torch._C._special": "torch.special", "torch.special": "torch.special", "torch._C._fft": "torch.fft",
            "torch.fft": "torch.fft", "torch.random": "torch", "torch._tensor": "Tensor"}


def canonical(func) -> str | None:
    """``"F.relu"``, ``"torch.cat"``, ``"Tensor.add"``, ``"Tensor.shape"``: the name of ``func``
    as TorchFunctionMode receives it; None for something else (a user's own function)."""
    name = getattr(func, "__name__", None)
    if name is None:
        return None
    qualified = getattr(func, "_qualified_op_name", None) or getattr(
        getattr(func, "overloadpacket", None), "_qualified_op_name", None) or ""  # "aten::index" of torch.ops.aten.index(.Tensor)
    if type(func).__name__ in ("OpOverloadPacket", "OpOverload") and qualified.startswith("aten::"):
        return f"torch.ops.aten.{qualified[6:]}"  # transformers' vmapped mask reads x[i, j] as aten.index
    if type(func).__name__ in ("OpOverloadPacket", "OpOverload") and qualified.startswith("torchvision::"):
        return f"torch.ops.torchvision.{qualified[13:]}"  # torchvision.ops.roi_align calls torchvision::roi_align
    owner = getattr(func, "__self__", None)
    if name == "__get__" and type(owner).__name__ == "getset_descriptor":
        # an attribute read: x.shape arrives as the __get__ of the descriptor named "shape"
        return f"Tensor.{owner.__name__}"
    objclass = getattr(func, "__objclass__", None)
    if objclass is not None and objclass.__name__ in ("TensorBase", "Tensor", "_TensorBase"):
        return f"Tensor.{name}"
    qualname = getattr(func, "__qualname__", "") or ""
    if qualname.startswith(("Tensor.", "TensorBase.", "_TensorBase.")):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", None)
    if qualname.startswith("_VariableFunctionsClass."):
        return f"torch.{name}"
    prefix = _MODULES.get(module)
    if prefix is None or prefix == "Tensor":
        return None
    if prefix == "F" and module == "torch._C._nn":
        import torch.nn.functional

        if getattr(torch.nn.functional, name, None) is None:
            return f"torch._C._nn.{name}"
    sub = prefix.rpartition(".")[2]
    if prefix != "torch" and name.startswith(sub + "_"):  # torch._C._linalg.linalg_vector_norm
        name = name[len(sub) + 1:]
    return f"{prefix}.{name}"


def lookup(name: str) -> Op | None:
    """``OPS[name]``; an in-place method (``Tensor.add_``, ``Tensor.__iadd__``) without its
    own entry is its functional form (the caller rebinds the variable to the result)."""
    if name in OPS:
        return OPS[name]
    head, _, method = name.rpartition(".")
    if head != "Tensor":
        return None
    if method.startswith("__i") and method.endswith("__"):  # __iadd__ -> __add__
        return OPS.get(f"Tensor.__{method[3:]}")
    if method.endswith("_") and not method.endswith("__"):
        return OPS.get(f"Tensor.{method[:-1]}")
    return None


_SHAPE = "its output shape depends on the data, which JAX cannot trace"
REFUSED: dict[str, str] = {
    "torch.nonzero": f"{_SHAPE}; use torch.where(mask, x, 0) or a mask multiply",
    "Tensor.nonzero": f"{_SHAPE}; use torch.where(mask, x, 0) or a mask multiply",
    "torch.argwhere": f"{_SHAPE}; use torch.where(mask, x, 0) or a mask multiply",
    "Tensor.argwhere": f"{_SHAPE}; use torch.where(mask, x, 0) or a mask multiply",
    "torch.masked_select": f"{_SHAPE}; use torch.where(mask, x, 0) and reduce, or a mask multiply",
    "Tensor.masked_select": f"{_SHAPE}; use torch.where(mask, x, 0) and reduce, or a mask multiply",
    "Tensor.masked_scatter": f"{_SHAPE} (it reads as many values as the mask holds); use torch.where",
    "torch.unique": f"{_SHAPE}; use a fixed-size one-hot count (F.one_hot(x, n).sum(0)) instead",
    "Tensor.unique": f"{_SHAPE}; use a fixed-size one-hot count (F.one_hot(x, n).sum(0)) instead",
    "torch.unique_consecutive": f"{_SHAPE}; keep the full tensor and a mask of the kept positions",
    "torch.bincount": f"{_SHAPE} (its length is the largest value + 1); use F.one_hot(x, n).sum(0) with a fixed n",
    "Tensor.bincount": f"{_SHAPE} (its length is the largest value + 1); use F.one_hot(x, n).sum(0) with a fixed n",
    "torch.repeat_interleave(repeats)": f"{_SHAPE}; pass output_size=",
    "Tensor.item": "it turns a traced value into a Python number, which JAX cannot do inside jit; keep it a tensor "
                   "(x.sum() instead of x.sum().item())",
    "Tensor.tolist": "it turns a traced value into Python data, which JAX cannot do inside jit; keep it a tensor",
    "Tensor.numpy": "it turns a traced value into a NumPy array, which JAX cannot do inside jit; keep it a tensor",
    "Tensor.__bool__": "Python control flow on a tensor's value (if x.any(): ...) depends on the data; use "
                       "torch.where(cond, a, b) for both branches",
    "Tensor.__int__": "int(tensor) reads a traced value as a Python number; keep it a tensor or use x.shape",
    "Tensor.__float__": "float(tensor) reads a traced value as a Python number; keep it a tensor",
    "Tensor.__index__": "using a tensor as a Python index reads its value; index with the tensor (x[idx]) instead",
    "Tensor.__getitem__(bool mask)": f"{_SHAPE}; use torch.where(mask, x, 0) or a mask multiply",
    "Tensor.__setitem__(bool mask)": "a boolean-mask assignment is fine as torch.where(mask, value, x); write that",
    "torch.ops.torchvision.nms": f"{_SHAPE}: it returns as many indices as it keeps boxes (the code after it reads "
                                 "the boxes by that number); run the model up to the boxes and scores with the converted "
                                 "model and call funcnet.interop.ops.nms / batched_nms (fixed-size indices and a count) "
                                 "on its outputs",
    "Tensor.backward": "gradients come from jax.grad of the loss, not from inside forward",
    "torch.autograd.grad": "gradients come from jax.grad of the loss, not from inside forward",
}
