"""Recording a torch model's forward on real tensors, one graph per module.

The model runs once in train mode and once in eval mode on the example inputs. A
``TorchFunctionMode`` sees every torch function, Tensor method and attribute read; forward
hooks on every submodule open a frame per module call, so each module's own ``forward``
becomes its own ``Graph`` and calls of its children become ``child`` nodes (the hierarchy
is kept). Modules with a funcnet.nn counterpart (``leaf``) are not looked inside. Because
the values are real, Python control flow on configuration runs as in torch; control flow
on tensor values (``bool(tensor)``, ``.item()``) and calls with no JAX form are collected
as problems with the user's ``file:line``. Sizes (``x.size(0)``, ``x.shape``) are ``Dim``s:
ints that remember where they came from, so a converted model is not tied to the example's
batch size.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from typing import Any, Callable

from funcnet.interop.trace.frame import (Dim, Frame, as_replayed, flatten_args, user_line, view_base,
                                         write_back, write_through)
from funcnet.interop.trace.graph import Graph, Node, Ref, structure
from funcnet.interop.trace.env import _ANSWER_COMPILING, _FUNCNET_DIR, _compiling, _quiet, _raised, _run
from funcnet.interop.trace.vmap import recording_vmap



@dataclasses.dataclass
class Recording:
    """Per torch module object: its graphs by mode ("train", "eval"), one per distinct call."""

    graphs: dict = dataclasses.field(default_factory=dict)  # id(module) -> {mode: [Graph, ...]}
    problems: list = dataclasses.field(default_factory=list)  # (path, op, where, message)
    names: dict = dataclasses.field(default_factory=dict)  # id(module) -> dotted path from the root
    modes: dict = dataclasses.field(default_factory=dict)  # problem -> the modes it was met in


def skip_dirs() -> tuple[str, ...]:
    """funcnet's and torch's directories, where no line is the model's, each with its separator:
    ``.../site-packages/torch`` is a prefix of ``.../site-packages/torchvision``, whose lines are."""
    return tuple(os.path.join(d, "") for d in (_FUNCNET_DIR, os.path.dirname(os.path.abspath(
        __import__("torch").__file__))))


class Recorder:
    """Runs ``root`` on the example inputs with the mode and the hooks installed."""

    def __init__(self, root, is_leaf: Callable[[Any], bool], is_container: Callable[[Any], bool],
                 lookup: Callable[[str], Any], canonical: Callable[[Any], str | None], refused: dict):
        self.root, self.is_leaf, self.is_container = root, is_leaf, is_container
        self.lookup, self.canonical, self.refused = lookup, canonical, refused
        self.stack: list[Frame] = []
        self.busy = False
        self.hidden = False  # torch's own batched run of a torch.vmap call: module calls inside are not recorded
        self.rec = Recording(names={id(m): n for n, m in root.named_modules()})
        self.mode = "train"
        self.produced: dict = {}  # id -> tensor, every tensor a torch call made while tracing
        self.skip = skip_dirs()

    def problem(self, frame: Frame, message: str, op: str = "") -> None:
        """Record, once, why the forward cannot be replayed: module path, op, the user's line and ``message``."""
        path = self.rec.names.get(id(frame.module), "?") or "<root>"
        entry = (path, op, user_line(self.skip), message)
        if entry not in self.rec.problems:
            self.rec.problems.append(entry)
        self.rec.modes.setdefault(entry, set()).add(self.mode)

    def note(self, value, args) -> None:
        """Remember the tensors of a torch call's output, computed here and never a constant; an
        argument returned as it is (``buffer.to(its dtype)``) is not made by the call."""
        given = {id(leaf) for _, leaf in flatten_args(args)}
        for _, leaf in flatten_args(value):
            if _is_tensor(leaf) and id(leaf) not in given:
                self.produced[id(leaf)] = leaf

    def computed(self, tensor) -> bool:
        """Whether ``tensor`` was made by a torch call recorded while tracing."""
        return self.produced.get(id(tensor)) is tensor

    # ---- module calls
    def pre(self, module, args, kwargs):
        """Forward pre-hook: open a frame for ``module``'s call (quietly, as the hooks record nothing of their own)."""
        if self.hidden:
            return
        with _quiet(self):
            self._pre(module, args, kwargs)

    def post(self, module, args, kwargs, output):
        """Forward hook: close ``module``'s frame and record its output."""
        if self.hidden:
            return output
        with _quiet(self):
            return self._post(module, args, kwargs, output)

    def _pre(self, module, args, kwargs):
        parent = self.stack[-1] if self.stack else None
        inside_leaf = (parent is not None and parent.inside_leaf) or self.is_leaf(module)
        # a container with torch's forward (Sequential) is walked: its children are recorded in their own frames
        frame = Frame(module, inside_leaf or self.is_container(module), recorder=self, inside_leaf=inside_leaf)
        if not frame.silent:
            sig = _signature(module)
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                self.problem(frame, f"cannot bind its forward's arguments: {e}")
                bound = None
            frame.bound = bound
            frame.inputs, frame.constants = {}, {}
            if bound is not None:
                for name, value in bound.arguments.items():
                    for path, leaf in flatten_args(value):
                        if _is_tensor(leaf) or isinstance(leaf, Dim):
                            ref = frame.add(Node("input", (name, path)))
                            frame.inputs[(name, path)] = ref.node
                            frame.known[id(leaf)] = (leaf, ref)
                        else:
                            frame.constants[(name, path)] = as_replayed(leaf)
            frame.buffers_before = {n: b for n, b in module._buffers.items()
                                    if n not in module._non_persistent_buffers_set}
        frame.call_args = _snapshot((tuple(args), dict(kwargs)))  # the child may append to a list it was given
        self.stack.append(frame)

    def _post(self, module, args, kwargs, output):
        frame = self.stack.pop()
        frame.active = False
        parent = self.stack[-1] if self.stack else None
        if not frame.silent:
            self._finish(frame, module, output)
        if parent is not None and not parent.silent:
            path = parent.module_path(module)
            if path is None:
                self.problem(parent, f"calls a module that is not its own child ({type(module).__name__}); "
                                     f"make it an attribute of this module")
                return output
            args, kwargs = frame.call_args
            ref = parent.add(Node("child", path, parent.arg(args), parent.arg(kwargs),
                                  where=user_line(self.skip)))
            passed = {}  # inputs returned unchanged (nn.Identity): still the parent's own values
            for _, leaf in flatten_args((args, kwargs)):
                if not _is_tensor(leaf):
                    continue
                if leaf is output and getattr(module, "inplace", False):  # ReLU(inplace=True): its aliases changed too
                    parent.mark_aliases_stale(leaf, f"{path} (in place)")
                elif _changed_inside(frame, leaf):
                    parent.stale[id(leaf)] = f"{path} (changed in place there)"
                elif id(leaf) in parent.known:
                    passed[id(leaf)] = parent.known[id(leaf)]
            parent.nodes[ref.node].structure = structure(output)
            parent.bind(output, ref)
            parent.known.update(passed)
        return output

    def _finish(self, frame: Frame, module, output) -> None:
        state_out = {}
        for name, before in frame.buffers_before.items():
            now = module._buffers.get(name)
            hit = frame.known.get(id(now)) if now is not None else None
            if now is not before and hit is None:
                state_out[name] = frame.tensor_ref(now)
            elif hit is not None and hit[0] is now and frame.nodes[hit[1].node].kind != "buffer":
                state_out[name] = hit[1]
        graph = Graph(_signature(module), frame.nodes, frame.inputs, frame.constants, frame.arg(output), state_out,
                      frame.names)
        per_mode = self.rec.graphs.setdefault(id(module), {}).setdefault(self.mode, [])
        if all(g.key() != graph.key() for g in per_mode):
            per_mode.append(graph)

    # ---- torch calls
    def call(self, func, args, kwargs):
        """Record one torch function call (``__torch_function__``) in the current frame and run it."""
        import torch

        frame = self.stack[-1] if self.stack else None
        if frame is None or frame.silent:
            return _run(func, args, kwargs)
        name = self.canonical(func)
        short = name.split(".", 1)[-1] if name else getattr(func, "__name__", repr(func))
        where = user_line(self.skip)
        if short in self.refused or name in self.refused:
            self.problem(frame, self.refused.get(name, self.refused.get(short)), name or short)
            out = _run(func, args, kwargs)
            with _quiet(self):  # linked to its call (already refused), so not reported again where it is used
                frame.bind(out, frame.add(Node("op", name or short, where=where)))
            return out
        if name in _CHECKS:  # torch._assert(H == self.size, ...): a static check, run now and left out of the graph
            with _quiet(self):
                try:
                    func(*args, **kwargs)
                except Exception as e:  # noqa: BLE001 - the model's own check, whatever it raises
                    self.problem(frame, f"the model's own check fails on the example inputs: {type(e).__name__}: "
                                        f"{e}; convert with inputs the model accepts", name)
            return None
        if name == "Tensor.__setitem__" and _bool_mask_set(args):  # written as ops.masked_set, not .at[mask]
            name = short = "Tensor.__setitem__(bool mask)"
        refusal = _data_dependent_index(name, args)
        if refusal:
            self.problem(frame, self.refused.get(refusal, "with one argument its output shape depends on the data; "
                                                          "use torch.where(cond, x, y)"), refusal)
        if name == "F.scaled_dot_product_attention" and "key" in (kwargs or {}):
            # query=/key=/value= by keyword: funcnet's key= is the PRNG key, so pass them by position
            kwargs = dict(kwargs)
            named = [kwargs.pop(n) for n in ("query", "key", "value") if n in kwargs]
            args = tuple(args) + tuple(named)
        if name == "Tensor.__setitem__" and len(args) == 3:
            write_back(frame, args, where)
        grad = torch.is_grad_enabled()
        out = _run(func, args, kwargs)
        if name == "Tensor.__getitem__" and len(args) == 2 and _is_tensor(out):
            frame.views[id(out)] = (out, args[0], args[1])
        with _quiet(self):
            return self._recorded(frame, func, name, short, where, grad, args, kwargs, out)

    def _recorded(self, frame, func, name, short, where, grad, args, kwargs, out):
        if name in _FACTS:
            return out  # facts about the tensor that hold at replay too, or printing
        op = self.lookup(name) if name else None
        if op is None:
            self.problem(frame, "no JAX form in funcnet.interop.ops (the op table)", name or short)
        mutates = tuple(getattr(op, "mutates", ()) or ())
        # F.relu(x, inplace=True) arrives as F.relu and returns x: an F function gives back its input only in place
        inplace = _in_place(name or short) or (bool(name) and name.startswith("F.") and bool(args)
                                               and out is args[0] and _is_tensor(out))
        if not mutates and not inplace and args and out is args[0] and _is_tensor(out):
            return out  # x.to(its own dtype), x.contiguous(), x.float() of a float: x itself, not a change of x
        ref = frame.add(Node("op", name or short, frame.arg(tuple(args)), frame.arg(dict(kwargs or {})),
                             no_grad=not grad, where=where, structure=structure(out)))
        if mutates:
            from funcnet.interop.ops import mutated_places

            for k, place in enumerate(mutated_places(op, args, kwargs or {})):
                changed = args[place] if isinstance(place, int) else (kwargs or {}).get(place)
                if _is_tensor(changed):
                    frame.mark_aliases_stale(changed, where)
                    frame.bind(changed, Ref(ref.node, (1, k)))
            ref = Ref(ref.node, (0,))
        elif inplace and args and _is_tensor(args[0]):
            base = view_base(frame, args[0])
            frame.mark_aliases_stale(args[0], where)
            frame.bind(args[0], ref)
            if base is not None:
                write_through(frame, args[0], base, where)
        return self._sizes(frame, name, out, ref)

    def _sizes(self, frame, name, out, ref):
        if name in ("Tensor.size", "Tensor.shape", "Tensor.__len__", "Tensor.dim", "Tensor.ndim", "Tensor.numel",
                    "Tensor.ndimension", "Tensor.nelement"):
            frame.nodes[ref.node].value = int(out) if isinstance(out, int) else tuple(int(v) for v in out)
            if isinstance(out, int):
                out = Dim(out, ref, frame)
            else:
                out = tuple(Dim(v, Ref(ref.node, (i,)), frame) for i, v in enumerate(out))
            frame.bind(out, ref)
            return out
        frame.bind(out, ref)
        return out

    def name_locals(self, variables: dict) -> None:
        """Give the values bound to the user's variables (at a line of their code) those names."""
        frame = self.stack[-1] if self.stack else None
        if frame is None or frame.silent:
            return
        for var, value in variables.items():
            if var == "self" or var.startswith("_"):
                continue
            for item in (value if isinstance(value, (tuple, list)) and len(value) < 16 else (value,)):
                hit = frame.known.get(id(item))
                if hit is not None and hit[0] is item and hit[1] not in frame.names:
                    frame.names[hit[1]] = var

    def data_dependent(self, what: str) -> None:
        """Record that the forward read a value from a tensor's data (``what``), which a trace cannot follow."""
        frame = self.stack[-1] if self.stack else None
        if frame is not None and not frame.silent:
            self.problem(frame, f"{what}: Python control flow or a Python value taken from a tensor's data cannot "
                                f"be traced; use torch.where(cond, a, b) or a mask instead of the branch", what)


# torch's own bookkeeping that reaches the mode: grad mode (no_grad is read per op instead)
_PASS = {"_set_grad_enabled", "set_grad_enabled", "is_grad_enabled", "_enter_inference_mode", "_exit_inference_mode"}

# torch's static checks: evaluated while tracing (a failing one is the model's own error), never replayed
_CHECKS = {"torch._assert", "torch._check", "torch._check_is_size", "torch._check_index", "torch._check_value",
           "torch._check_type", "torch._check_not_implemented", "torch._check_with", "torch._check_tensor_all"}

_FACTS = {f"Tensor.{n}" for n in (
    "is_xpu", "is_mps", "is_cpu", "is_ipu", "is_hpu", "is_mkldnn", "is_vulkan", "is_maia", "is_mtia", "is_xla",
    "is_sparse_csr", "is_inference", "is_signed", "dtype", "device", "is_cuda", "requires_grad", "grad_fn",
    "is_floating_point", "is_complex", "layout",
    "is_sparse", "is_leaf", "get_device", "__repr__", "__str__", "__format__", "is_contiguous", "stride",
    "data_ptr", "element_size", "is_meta", "is_quantized", "is_nested", "names")}


def _data_dependent_index(name, args) -> str | None:
    """The REFUSED entry for a call whose output shape depends on tensor values: a boolean-mask
    read (``x[mask]``) or the one-argument ``torch.where(cond)``."""
    import torch

    if name == "Tensor.__getitem__" and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return "Tensor.__getitem__(bool mask)"
    if name == "torch.where" and len(args) == 1:
        return "torch.where"
    return None


def _bool_mask_set(args) -> bool:
    """``x[mask] = scalar``: one bool tensor index and a Python number or 0-d tensor."""
    import torch

    if len(args) < 3:
        return False
    index = args[1][0] if isinstance(args[1], tuple) and len(args[1]) == 1 else args[1]
    value = args[2]
    return isinstance(index, torch.Tensor) and index.dtype == torch.bool and (
        isinstance(value, (int, float, bool)) or (isinstance(value, torch.Tensor) and value.dim() == 0))


def _snapshot(value):
    """The lists, tuples and dicts of an argument tree copied (their tensors are not)."""
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    return value


def _changed_inside(frame: Frame, tensor) -> bool:
    hit = frame.known.get(id(tensor))
    return hit is not None and frame.nodes[hit[1].node].kind != "input"


def _is_tensor(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _in_place(name: str) -> bool:
    short = name.rsplit(".", 1)[-1]
    return (short.endswith("_") and not short.startswith("__")) or (
        short.startswith("__i") and short.endswith("__") and short not in ("__index__", "__int__", "__invert__",
                                                                          "__iter__"))


def _signature(module) -> inspect.Signature:
    return inspect.signature(module.forward)


def record(root, example_args: tuple, example_kwargs: dict, *, is_leaf, is_container, lookup, canonical,
           refused, names: bool = True, modes: tuple = ("train", "eval")) -> Recording:
    """Run ``root`` in train and in eval mode under the recorder; the module's parameters,
    buffers, mode and torch's random state are as before afterwards. ``names``: trace the
    user's code line by line for their variable names (``to_source`` writes them; replay
    does not need them). ``modes``: ``("eval",)`` records eval mode alone. An exception the
    forward raises becomes a ``ConversionError`` naming the module, the mode and the line."""
    import torch
    from torch.overrides import TorchFunctionMode

    recorder = Recorder(root, is_leaf, is_container, lookup, canonical, refused)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if recorder.busy or getattr(func, "__name__", None) in _PASS:
                return _run(func, args, kwargs)
            name = canonical(func)
            if name is None and getattr(func, "__name__", None) == "__set__" and \
                    getattr(getattr(func, "__self__", None), "__name__", None) == "requires_grad":
                return _run(func, args, kwargs)  # x.requires_grad = True: every JAX value can be differentiated
            if name == "Tensor.__iter__":  # iterating a tensor is unbinding its first axis
                return iter(recorder.call(torch.Tensor.unbind, args[:1], {}))
            if name in ("Tensor.__bool__", "Tensor.item", "Tensor.tolist", "Tensor.__int__", "Tensor.__float__",
                        "Tensor.__index__", "Tensor.numpy"):
                recorder.data_dependent(name)
                return _run(func, args, kwargs)
            out = recorder.call(func, args, kwargs)
            with _quiet(recorder):
                recorder.note(out, (args, kwargs))
            return out

    hooks = []
    for m in {id(m): m for m in root.modules()}.values():
        hooks.append(m.register_forward_pre_hook(lambda mod, a, k: recorder.pre(mod, a, k), with_kwargs=True))
        hooks.append(m.register_forward_hook(lambda mod, a, k, out: recorder.post(mod, a, k, out), with_kwargs=True))
    saved = {k: v.detach().clone() for k, v in root.state_dict(keep_vars=True).items()}
    was_training = root.training
    rng = torch.get_rng_state()

    def local(frame, event, arg):
        if event in ("line", "return") and not recorder.busy:
            with _quiet(recorder):
                recorder.name_locals(frame.f_locals)
        return local

    def calls(frame, event, arg):  # trace the user's own code only (variable names for to_source)
        name = os.path.abspath(frame.f_code.co_filename)
        return local if event == "call" and not name.startswith(recorder.skip) and "<frozen" not in name else None

    previous = sys.gettrace()
    vmaps = torch.vmap, torch.func.vmap
    torch.vmap = torch.func.vmap = recording_vmap(recorder, torch.func.vmap)
    is_compiling = torch.compiler.is_compiling
    if _ANSWER_COMPILING:  # libraries then skip their branches on tensor values (docs/design.md)
        torch.compiler.is_compiling = _compiling
    try:
        for mode in modes:
            recorder.mode = mode
            root.train(mode == "train")
            sys.settrace(calls if names else previous)
            try:
                with Mode():
                    root(*example_args, **example_kwargs)
            except Exception as e:
                # convert raises this ConversionError in its place (to_source and port keep theirs)
                e.funcnet_conversion = _raised(recorder, mode, e)
                raise
            finally:
                sys.settrace(previous)
            torch.set_rng_state(rng)
    finally:
        torch.compiler.is_compiling = is_compiling
        torch.vmap, torch.func.vmap = vmaps
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for k, v in root.state_dict(keep_vars=True).items():
                if k in saved and v.shape == saved[k].shape:
                    v.copy_(saved[k])
                elif k in saved:  # a buffer the forward replaced by one of another size (a table sized by the input)
                    owner, _, leaf = k.rpartition(".")
                    root.get_submodule(owner)._buffers[leaf] = saved[k]
        root.train(was_training)
        torch.set_rng_state(rng)
    return recorder.rec
