"""What the recorder keeps per module call: the ``Frame`` (nodes, the tensors it has seen, their
aliases) and ``Dim``, a size read off a tensor that remembers where it came from."""

from __future__ import annotations

import dataclasses
import operator
import os
import sys
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from funcnet.interop.trace.graph import GUARD_NEGATED, GUARD_OPS, Node, Ref, Slice, structure
from funcnet.interop.weights.state_dict import _to_numpy


def user_line(skip_dirs: tuple[str, ...]) -> str:
    """``file:line`` of the innermost frame that is the model's code: outside funcnet and torch's
    dispatch machinery. A torch layer's own forward (torch/nn/modules/*.py but its ``Module``
    plumbing) is model code: an op ``nn.TransformerDecoderLayer`` calls is told at its line there,
    not at the line that called ``convert``."""
    frame = sys._getframe(1)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if is_model_code(name, skip_dirs):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


_TORCH_LAYERS = os.sep + os.path.join("torch", "nn", "modules") + os.sep
_TORCH_PLUMBING = ("module.py", "container.py", "lazy.py", "_functions.py")


def is_model_code(name: str, skip_dirs: tuple[str, ...]) -> bool:
    """Whether the source file ``name`` (absolute) is a model's code, where a location is told:
    not funcnet's or torch's (``skip_dirs``) nor frozen, except torch's layers' forwards."""
    if "<frozen" in name:
        return False
    if not name.startswith(skip_dirs):
        return True
    return _TORCH_LAYERS in name and os.path.basename(name) not in _TORCH_PLUMBING


def as_replayed(value):
    """A constant argument as the replay passes it: a torch dtype as JAX's, a device (layout,
    memory format) as None, as ``Frame.arg`` records them in the caller's graph; so a child called
    with ``dtype=x.dtype, device=x.device`` is matched to its recording when the model runs."""
    kind = type(value)
    if kind.__module__ == "torch" and kind.__name__ in ("dtype", "device", "memory_format", "layout"):
        return jnp.dtype(str(value).replace("torch.", "")) if kind.__name__ == "dtype" else None
    return value


def flatten_args(value, path=()):
    """``[(path, leaf)]`` of an argument tree (tuples, lists, dicts, dataclasses)."""
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in flatten_args(v, path + (i,))]
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in flatten_args(v, path + (k,))]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [item for f in dataclasses.fields(value)
                for item in flatten_args(getattr(value, f.name), path + (f.name,))]
    return [(path, value)]


def _is_record(value) -> bool:
    """A dataclass instance (not the class itself)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


class Dim(int):
    """A size read off a tensor (or computed from sizes): an int that knows its node."""

    def __new__(cls, value: int, ref: Ref, frame: "Frame"):
        """An int ``value`` that remembers its graph reference ``ref`` and ``frame``."""
        obj = int.__new__(cls, value)
        obj.ref, obj.frame = ref, frame
        return obj

    def _op(self, other, fn, name, reverse=False):
        value = fn(int(other), int(self)) if reverse else fn(int(self), int(other))
        frame = self.frame
        if not frame.active or (isinstance(other, Dim) and other.frame is not frame):
            return value
        a, b = (other, self) if reverse else (self, other)
        ref = frame.add(Node("dim", name, (frame.arg(a), frame.arg(b)), value=value))
        return Dim(value, ref, frame) if isinstance(value, int) else value

    def __add__(self, o): return self._op(o, operator.add, "add") if isinstance(o, int) else NotImplemented
    def __radd__(self, o): return self._op(o, operator.add, "add", True) if isinstance(o, int) else NotImplemented
    def __sub__(self, o): return self._op(o, operator.sub, "sub") if isinstance(o, int) else NotImplemented
    def __rsub__(self, o): return self._op(o, operator.sub, "sub", True) if isinstance(o, int) else NotImplemented
    def __mul__(self, o): return self._op(o, operator.mul, "mul") if isinstance(o, int) else NotImplemented
    def __rmul__(self, o): return self._op(o, operator.mul, "mul", True) if isinstance(o, int) else NotImplemented
    def __floordiv__(self, o): return self._op(o, operator.floordiv, "floordiv") if isinstance(o, int) else NotImplemented
    def __rfloordiv__(self, o):
        return self._op(o, operator.floordiv, "floordiv", True) if isinstance(o, int) else NotImplemented
    def __mod__(self, o): return self._op(o, operator.mod, "mod") if isinstance(o, int) else NotImplemented
    def __neg__(self): return self._op(-1, operator.mul, "mul")

    def _compare(self, other, op: str):
        """``self <op> other`` as a plain bool; where model code compares a size (``if window >=
        x.shape[1]``), the condition that held is recorded as a ``guard`` node, so the replay and
        ``to_source``'s port check it on every input instead of keeping the branch taken here."""
        if isinstance(other, bool) or not isinstance(other, (int, float)):
            return NotImplemented
        held = GUARD_OPS[op](int(self), other if isinstance(other, float) else int(other))
        frame = self.frame
        skip = getattr(frame.recorder, "skip", None)
        if not frame.active or skip is None or (isinstance(other, Dim) and other.frame is not frame):
            return held
        caller = sys._getframe(2)
        path = os.path.abspath(caller.f_code.co_filename)
        if not is_model_code(path, skip):
            return held
        frame.add(Node("guard", op if held else GUARD_NEGATED[op], (frame.arg(self), frame.arg(other)),
                       where=f"{path}:{caller.f_lineno}"))
        return held

    def __lt__(self, o): return self._compare(o, "lt")
    def __le__(self, o): return self._compare(o, "le")
    def __gt__(self, o): return self._compare(o, "gt")
    def __ge__(self, o): return self._compare(o, "ge")
    def __eq__(self, o): return self._compare(o, "eq")
    def __ne__(self, o): return self._compare(o, "ne")
    __hash__ = int.__hash__


@dataclasses.dataclass
class Frame:
    """One module call being recorded (``silent``: a leaf or a container, not looked inside)."""

    module: Any
    silent: bool
    nodes: list = dataclasses.field(default_factory=list)
    known: dict = dataclasses.field(default_factory=dict)  # id(obj) -> (obj, Ref)
    stale: dict = dataclasses.field(default_factory=dict)  # id(obj) -> where it was changed through an alias
    views: dict = dataclasses.field(default_factory=dict)  # id(x[i]) -> (x[i], x, i): for x[i] += v's write-back
    tensors: dict | None = None  # id(param or buffer) -> ("param" | "buffer", dotted path)
    paths: dict | None = None  # id(submodule) -> dotted path
    active: bool = True
    recorder: Any = None
    inside_leaf: bool = False  # this module or an ancestor is a leaf: nothing inside is recorded
    bound: Any = None  # the forward's arguments (inspect.BoundArguments)
    inputs: dict = dataclasses.field(default_factory=dict)
    constants: dict = dataclasses.field(default_factory=dict)
    buffers_before: dict = dataclasses.field(default_factory=dict)
    names: dict = dataclasses.field(default_factory=dict)  # Ref -> variable name in the user's code
    outer: Any = None  # a torch.vmap body's frame: the frame of the forward that calls it
    captured: list = dataclasses.field(default_factory=list)  # the outer frame's tensors a vmap body reads

    def reaches(self, t) -> bool:
        """``t`` is a value of this frame, or of a frame it is the vmap body of."""
        hit = self.known.get(id(t))
        return (hit is not None and hit[0] is t) or (self.outer is not None and self.outer.reaches(t))

    def add(self, node: Node) -> Ref:
        """Append ``node`` to the graph and return its reference."""
        self.nodes.append(node)
        return Ref(len(self.nodes) - 1)

    def bind(self, value, ref: Ref) -> None:
        """Remember every tensor and size in ``value`` (a tree) as ``ref`` indexed by its position."""
        import torch

        if isinstance(value, torch.Tensor):
            self.known[id(value)] = (value, ref)
            self.stale.pop(id(value), None)
        elif isinstance(value, Dim):
            self.known[id(value)] = (value, ref)
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                self.bind(v, Ref(ref.node, ref.path + (i,)))
        elif isinstance(value, Mapping):  # dict, OrderedDict, transformers' ModelOutput: read by key
            for k, v in value.items():
                self.bind(v, Ref(ref.node, ref.path + (k,)))
        elif _is_record(value):  # a dataclass: replayed as a dict of its fields
            for f in dataclasses.fields(value):
                self.bind(getattr(value, f.name), Ref(ref.node, ref.path + (f.name,)))

    def own_tensors(self) -> dict:
        """id -> (path, kind) of the module's own parameters and buffers, read once."""
        if self.tensors is None:
            self.tensors = {}
            persistent = set()
            for name, m in self.module.named_modules():
                prefix = f"{name}." if name else ""
                persistent |= {prefix + b for b in m._buffers if b not in m._non_persistent_buffers_set}
            for name, p in self.module.named_parameters():
                self.tensors.setdefault(id(p), ("param", name))
            for name, b in self.module.named_buffers():
                if name in persistent:
                    self.tensors.setdefault(id(b), ("buffer", name))
        return self.tensors

    def module_path(self, module) -> str | None:
        """The dotted path of ``module`` inside this frame's module, or None when it is not a submodule."""
        if self.paths is None:
            self.paths = {id(m): name for name, m in self.module.named_modules() if name}
        return self.paths.get(id(module))

    def arg(self, value):
        """``value`` (an argument tree) with tensors and sizes as ``Ref``s, torch's dtypes as
        JAX's, devices dropped and other tensors kept by value."""
        import torch

        if isinstance(value, Dim):
            hit = self.known.get(id(value))
            if hit is not None and hit[0] is value:
                return hit[1]
            return value.ref if value.frame is self else int(value)  # C // n_head: a size computed here
        if isinstance(value, torch.Tensor):
            return self.tensor_ref(value)
        if isinstance(value, torch.dtype):
            return jnp.dtype(str(value).replace("torch.", ""))
        if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
            return None
        if isinstance(value, torch.Size):
            return tuple(self.arg(v) for v in value)
        if isinstance(value, slice):
            return Slice(self.arg(value.start), self.arg(value.stop), self.arg(value.step))
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return tuple(self.arg(v) for v in value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.arg(v) for v in value)
        if isinstance(value, Mapping):
            return {k: self.arg(v) for k, v in value.items()}
        if _is_record(value):
            return {f.name: self.arg(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if value is None or isinstance(value, (bool, int, float, str, complex, type(Ellipsis))):
            return value
        hint = ("; convert with use_cache=False (in the config or the call): a cache of past keys and values is "
                "state a pure forward does not keep" if type(value).__name__.endswith("Cache") else "")
        self.recorder.problem(self, f"an argument of type {type(value).__name__} ({value!r:.60}) has no JAX form{hint}")
        return None

    def tensor_ref(self, t) -> Ref:
        """The graph reference of tensor ``t``: a recorded value, an input, a parameter or buffer, or a constant."""
        hit = self.known.get(id(t))
        if hit is not None and hit[0] is t:
            if id(t) in self.stale:
                self.recorder.problem(self, f"a tensor used after an in-place change through an alias of it (at "
                                            f"{self.stale[id(t)]}); torch sees the change, a function cannot: "
                                            f"use an out-of-place form (y = x + 1, not x.add_(1) on a view)")
                self.stale.pop(id(t))
            return hit[1]
        own = self.own_tensors().get(id(t))
        if self.outer is not None and self.outer.reaches(t):  # a vmap body reads its caller's tensor: unbatched
            key = ("__captured__", (len(self.captured),))
            ref = self.add(Node("input", key))
            self.inputs[key] = ref.node
            self.captured.append(t)
        elif own is not None:
            ref = self.add(Node(own[0], own[1]))
        elif self.recorder.computed(t):
            self.recorder.problem(self, "a tensor computed while tracing reaches this module by a way the recorder "
                                        "cannot follow (an attribute set by another call, a global, an object it "
                                        "does not read), so it would be baked in as a constant; pass it as an "
                                        "argument or return it (tuples, lists, dicts, dataclasses are followed)")
            ref = self.add(Node("const", _to_numpy(t)))
        else:  # a tensor from outside the module (a constant, a non-persistent buffer)
            ref = self.add(Node("const", _to_numpy(t)))  # bf16 kept exactly, as from_torch keeps it
        self.known[id(t)] = (t, ref)
        return ref

    def mark_aliases_stale(self, changed, where: str) -> None:
        """``changed`` was written in place: every other tensor sharing its memory changed too."""
        import torch

        try:
            ptr = changed.untyped_storage().data_ptr()
        except RuntimeError:
            return
        for key, (obj, _) in list(self.known.items()):
            if obj is not changed and isinstance(obj, torch.Tensor) and obj.untyped_storage().data_ptr() == ptr:
                self.stale[key] = where


def write_back(frame, args, where) -> None:
    """``x[i] += v`` is Python's ``t = x[i]; t += v; x[i] = t``: the in-place change of the view ``t``
    leaves ``x`` stale (torch sees the change through the alias, the graph does not), and the
    write-back, on the same line with the same index object, makes ``x`` whole again: the setitem
    records ``x``'s new value from ``t``'s. Any other alias of ``x`` stays stale."""
    target, index, value = args
    view = frame.views.get(id(value))
    if (view is not None and view[0] is value and view[1] is target and view[2] is index
            and frame.stale.get(id(target)) == where):
        frame.stale.pop(id(target))


def view_base(frame, view):
    """``x`` when ``view`` is ``x[i]`` recorded in this frame, shares ``x``'s memory (a basic index,
    not a copying one) and ``x`` is current (not stale from an earlier change); else None."""
    hit = frame.views.get(id(view))
    if hit is None or hit[0] is not view:
        return None
    base = hit[1]
    known = frame.known.get(id(base))
    if known is None or known[0] is not base or id(base) in frame.stale:
        return None
    if view.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
        return None
    return base


def write_through(frame, view, base, where) -> None:
    """``x[a:b].zero_()`` (torchvision's Swin V2 zeroes the key bias so): an in-place op on a view
    ``x[i]`` of ``x``'s memory changes ``x`` as ``x[i] = <the view's new value>``, recorded as that
    setitem, so ``x`` is current again. Any other alias of ``x`` stays stale; an index that copies
    (a tensor of indices) shares no memory and leaves ``x`` alone, as in torch."""
    frame.stale.pop(id(base), None)
    index = frame.views[id(view)][2]
    node = frame.add(Node("op", "Tensor.__setitem__", frame.arg((base, index, view)), {}, where=where,
                          structure=structure(None)))
    frame.bind(base, Ref(node.node, (1, 0)))
