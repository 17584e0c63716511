"""``to_source(module, *example_inputs) -> str``: a torch model written out as funcnet.nn source.

The model is recorded as ``convert`` records it (funcnet/interop/trace/record.py), then written the
way a person ports it by hand: one function per torch class, named like it, returning
``nn.Composite(forward, child=..., ...)`` with the children in torch's order (own parameters
as ``nn.Parameter``, own buffers as ``nn.Buffer``, leaf layers as their constructor call with
the arguments that differ from the defaults, containers as ``nn.Sequential``/``ModuleList``/
``ModuleDict``), and a ``forward`` that reads like torch's (funcnet/interop/source/forward.py).

A class used several times is one function: what differs between its instances (a channel
count, a stride, an optional child) becomes an argument, with each instance's values at its
call site (funcnet/interop/source/classes.py). Parameters start as zeros: the values come from
torch's state_dict (``funcnet.load_state_dict``) or a safetensors file.
"""

from __future__ import annotations

import inspect
import os
import re

from funcnet.interop.trace.modules import _listed
from funcnet.interop.trace.registry import ConversionError, _container_base, _match, _own_tensors, _registry
from funcnet.interop.source.classes import ClassWriter
from funcnet.interop.source.forward import Context
from funcnet.interop.source.modes import body, signature
from funcnet.interop.source.specs import _COMPOSITE_ARGS, Container, Leaf, TensorSpec, render

WIDTH = 120


def _modes(recording, module):
    from funcnet.interop.trace.modules import _modes

    graphs = recording.graphs.get(id(module)) if recording is not None else None
    return _modes(graphs) if graphs else None


class _Writer:
    def __init__(self, root, recording, registry, reroll: bool = True):
        from funcnet.interop import ops

        self.root, self.recording, self.registry, self.lookup = root, recording, registry, ops.lookup
        self.reroll = reroll  # loops over a size written as loops (funcnet/interop/source/loops.py)
        self.classes: dict = {}  # class -> [instance, ...] in the order met
        self.order: list = []  # classes, children first
        self.specs: dict = {}  # id(instance) -> (children specs, forward statements, forward signature)
        self.constants: list = []
        self.problems: list = []
        self.where = ("", type(root).__name__)  # the module being written: its path and class

    # ---- the tree of specs
    def spec(self, module, path: str):
        outer, self.where = self.where, (path, type(module).__name__)
        out = self._spec(module, path)
        self.where = outer  # kept where an error leaves, so that its message names the module
        return out

    def _spec(self, module, path: str):
        from torch import nn as tnn

        from funcnet.interop.trace.modules import _layer_args

        base, row = _match(module, self.registry)
        if row is not None and type(module).forward is base.forward:
            found = _layer_args(module, path, base, row, self.problems,
                                lambda child, sub, found: self.spec(child, f"{path}.{sub}"))
            return None if found is None else Leaf.of(*found)
        container = _container_base(module)
        user_forward = type(module).forward is not (container or tnn.Module).forward
        if user_forward or _own_tensors(module):
            return self.instance(module, path)
        items = tuple((n, self.spec(c, f"{path}.{n}" if path else n)) for n, c in module.named_children())
        if container is tnn.Sequential:
            if [n for n, _ in items] != [str(i) for i in range(len(items))]:
                return Container("NamedSequential", items)  # Sequential(OrderedDict(conv=..., relu=...))
            return Container("nn.Sequential", items)
        if container is tnn.ModuleList:
            return Container("nn.ModuleList", items)
        return Container("nn.ModuleDict", items)

    def instance(self, module, path: str):
        cls = type(module)
        kids = []
        for n, p in module.named_parameters(recurse=False):
            kids.append((n, TensorSpec.of("Parameter", p)))
        for n, b in module.named_buffers(recurse=False):
            if n not in module._non_persistent_buffers_set:
                kids.append((n, TensorSpec.of("Buffer", b)))
        for n, c in module._modules.items():
            kids.append((n, None if c is None else self.spec(c, f"{path}.{n}" if path else n)))
        modes = _modes(self.recording, module)
        if modes is None:
            forward = [[f"raise NotImplementedError('{cls.__name__} was not called when the model was traced')"]]
            sig = "self, *args, **kwargs"
        else:
            ctx = Context(self.lookup, {n for n, _ in kids}, _lists(module), _stateful(module), self.constants,
                          _positions(module), self.reroll)
            forward = body(modes, ctx)
            sig = signature(next(iter(modes.values()))[0].signature)
        if cls not in self.classes:
            self.classes[cls] = []
        self.classes[cls].append(module)
        self.specs[id(module)] = (tuple(kids), forward, sig)
        if cls in self.order:
            self.order.remove(cls)
        self.order.append(cls)
        return ("instance", id(module))

    # ---- the file
    def write(self) -> str:
        """The source; a ConversionError naming the module for what cannot be written, and for an
        unexpected error inside the writer, which is funcnet's bug."""
        self.classes_writer = None
        try:
            return self._write()
        except ConversionError:
            raise
        except Exception as e:
            path, cls = (self.classes_writer.where if self.classes_writer is not None and
                         self.classes_writer.where else self.where)
            raise ConversionError(f"to_source: writing {path or '<root>'} ({cls}) failed: {type(e).__name__}: {e}. "
                                  f"{_BUG}") from e

    def _write(self) -> str:
        root_spec = self.spec(self.root, "")
        if self.problems:
            raise ConversionError("to_source: cannot write the model:" + _listed(self.problems))
        names = self.recording.names if self.recording is not None else {}
        classes = self.classes_writer = ClassWriter(self.specs, self.classes, self.order, WIDTH, names)
        ties = _ties(self.root)
        functions = classes.functions(root=self.root, ties=ties)
        self.where = ("", type(self.root).__name__)
        classes.where = None
        name = type(self.root).__name__
        if isinstance(root_spec, tuple):
            body_text = functions
        else:  # a container or a leaf at the root: a function returning it
            body_text = functions + [f"def {name}():\n    return {render(classes.resolve(root_spec), 11, WIDTH)}\n"]
            if ties:
                body_text[-1] = f"# tied in torch: {ties} (nn.Composite(..., tied=) ties them)\n" + body_text[-1]
        try:
            where = os.path.basename(inspect.getsourcefile(type(self.root)) or "")
        except TypeError:
            where = ""
        head = f'"""{name}{f" ({where})" if where else ""} in funcnet.nn, by interop.to_source (load the weights)."""\n'
        if any("NamedSequential(" in t for t in body_text):
            body_text.insert(0, _NAMED_SEQUENTIAL)
        code = "\n\n".join(body_text)
        consts = "".join(f"{n} = {t}\n" for n, t in self.constants)
        return head + "\n" + _imports(code + consts) + ("\n" + consts if consts else "") + "\n\n" + code


_NAMED_SEQUENTIAL = '''def NamedSequential(**layers):
    def forward(self, x):
        for name in layers:
            x = getattr(self, name)(x)
        return x

    return nn.Composite(forward, **layers)
'''


def _imports(code: str) -> str:
    lines = []
    if "jax." in code.replace("jax.numpy", ""):
        lines.append("import jax")
    if "jnp." in code:
        lines.append("import jax.numpy as jnp")
    lines.append("from funcnet import nn")  # one block: funcnet is a third-party package to the port
    interop = [name for name, used in (("ops", "ops." in code), ("size_check", "size_check(" in code)) if used]
    if interop:
        lines.append(f"from funcnet.interop import {', '.join(interop)}")
    if "F." in code:
        lines.append("from funcnet.nn import functional as F")
    return "\n".join(lines) + "\n"


def _lists(module) -> dict:
    from torch import nn as tnn

    return {name: len(m) for name, m in module.named_modules() if name and type(m).forward is tnn.ModuleList.forward
            and isinstance(m, tnn.ModuleList)}


def _positions(module) -> frozenset:
    """The dotted paths of the entries of torch containers (written as nn.Sequential/ModuleList/
    ModuleDict) whose name is their position: ``self.h[0]``, where any other entry is ``self.h["0"]``."""
    out = set()
    for name, m in module.named_modules():
        base = _container_base(m)
        if name and base is not None and type(m).forward is base.forward and not _own_tensors(m):
            out.update(f"{name}.{n}" for i, (n, _) in enumerate(m.named_children()) if n == str(i))
    return frozenset(out)


def _stateful(module) -> set:
    return {name for name, m in module.named_modules() if name and any(True for _ in m.buffers())}


def _ties(root) -> dict:
    first, ties = {}, {}
    for name, p in root.named_parameters(remove_duplicate=False):
        if id(p) in first:
            ties[name] = first[id(p)]
        else:
            first[id(p)] = name
    return ties


def to_source(module, *example_inputs, **example_kwargs) -> str:
    """Python source that defines ``module`` with funcnet.nn the way a person would write it.

    The module is recorded on the example inputs (as ``convert`` does; every problem is
    reported at once in a ``ConversionError``). The source holds one function per torch
    class, named like it, whose ``forward`` reads like the torch ``forward``; the root
    function, called with no arguments, builds the same model as ``convert``. Its
    parameters start as zeros: load torch's weights into ``model.init(key)`` with
    ``funcnet.load_state_dict(params, module.state_dict(), state=nn.initial_state(model))``.
    """
    if not (hasattr(module, "named_modules") and hasattr(module, "state_dict")):
        raise TypeError(f"to_source: expected a torch.nn.Module, got {type(module).__name__}")
    from funcnet.interop.trace.modules import _build, _trace

    registry = _registry()
    problems = _name_clashes(module, registry)
    if problems:
        raise ConversionError("to_source: cannot write the model:" + _listed(problems))
    try:
        recording, problems = _trace(module, example_inputs, example_kwargs, registry, names=True)
    except ConversionError:
        raise
    except Exception as e:  # noqa: BLE001 - the forward raised while it was recorded: said as convert says it
        told = getattr(e, "funcnet_conversion", None)
        if told is None:
            raise ConversionError(f"to_source: recording the model failed: {type(e).__name__}: {e}. {_BUG}") from e
        raise ConversionError(str(told).replace("convert:", "to_source:", 1)) from e
    if not problems:
        try:
            _build(module, "", registry, problems, recording)
        except Exception as e:
            raise ConversionError(f"to_source: building the model failed: {type(e).__name__}: {e}. {_BUG}") from e
    if problems:
        raise ConversionError("to_source: cannot convert the model:" + _listed(problems))
    free, rolled = _free_axes(module, example_inputs, example_kwargs, registry, recording)
    source = _Writer(module, recording, registry, reroll=rolled).write()
    return source if free is None else _guarded(source, module, example_inputs, example_kwargs, free)


def _free_axes(module, args: tuple, kwargs: dict, registry, recording) -> tuple[tuple | None, bool]:
    """``(axes, rolled)``: the input axes the written code is shape-generic in (None for all of
    them: no guard), and whether it is written with its loops over a size rerolled
    (funcnet/interop/source/loops.py). An axis is generic when the torch module, recorded again
    with that size one larger in every input, gives the same program (its sizes read as
    ``x.shape[i]``, a rerolled loop one step longer); it is not when it gives another (a size used
    as a number, a loop not rerolled, or rerolled over a size that only had its count). An axis
    whose size torch itself refuses (a layer's width) is left to fail as torch fails. The loops are
    rerolled when that leaves every axis generic that the program as recorded leaves generic
    (a pair stacked at batch 2 is no loop over the batch)."""
    from funcnet.interop.trace.modules import _trace

    def outcome(axes) -> tuple[str, str]:
        grown = _resized(args, axes), _resized(kwargs, axes)
        try:
            again, problems = _trace(module, *grown, registry, names=False, train=False)
        except Exception:  # noqa: BLE001 - the torch forward raised: torch refuses those sizes
            return "raised", "raised"
        if problems:
            return "differs", "differs"
        return tuple("same" if _keys(again, rolled) == _keys(recording, rolled) else "differs"
                     for rolled in (False, True))

    ndim = max((len(leaf.shape) for leaf in _leaves((args, kwargs)) if hasattr(leaf, "shape")), default=0)
    if ndim == 0:
        return None, True
    every = outcome("all")
    if every[1] == "same":
        return None, True
    per_axis = [outcome((axis,)) for axis in range(ndim)]
    free = []
    for k in (0, 1):  # as recorded, rerolled
        fixed = [axis for axis in range(ndim) if per_axis[axis][k] == "differs"]
        free.append(None if every[k] == "same" or not fixed else
                    tuple(axis for axis in range(ndim) if axis not in fixed))
    plain, rolled = free
    if plain is None or (rolled is not None and not set(plain) <= set(rolled)):
        return plain, False
    return rolled, True


def _keys(recording, rolled: bool = True) -> dict:
    """The eval-mode programs of a recording, by module (the sizes' use is checked in eval mode alone); ``rolled``:
    as written with its loops over a size rerolled (funcnet/interop/source/loops.py), one more step the same program.
    Comparisons of sizes (guards) are left out: the port checks each one where it was made (``size_check``), so a
    size compared is still a size the port reads from its input."""
    from funcnet.interop.source.loops import reroll
    from funcnet.interop.trace.graph import without_guards

    return {k: [(reroll(g) if rolled else g).key() for g in map(without_guards, by_mode.get("eval", []))]
            for k, by_mode in recording.graphs.items()}


def _leaves(tree):
    if isinstance(tree, (tuple, list)):
        return [x for v in tree for x in _leaves(v)]
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    return [tree]


def _resized(tree, axes):
    """The example inputs with the sizes on ``axes`` (``"all"``: every axis) one larger, their values cycled."""
    import numpy as np
    import torch

    if isinstance(tree, torch.Tensor):
        shape = tuple(d + 1 if axes == "all" or i in axes else d for i, d in enumerate(tree.shape))
        array = tree.detach().cpu()
        floats = array.dtype == torch.bfloat16
        return torch.from_numpy(np.resize((array.float() if floats else array).numpy(), shape)).to(tree.dtype)
    if isinstance(tree, (tuple, list)):
        return type(tree)(_resized(v, axes) for v in tree)
    if isinstance(tree, dict):
        return {k: _resized(v, axes) for k, v in tree.items()}
    return tree


def _guarded(source: str, module, args: tuple, kwargs: dict, free: tuple) -> str:
    """``source`` whose root function is decorated with ``shape_guard``: the traced input
    signature (the sizes on the ``free`` axes aside) is the only one its model accepts."""
    import inspect as _inspect

    from funcnet.interop.trace.signature import describe, leaf_signature, named_arguments

    name = type(module).__name__
    names = tuple(n for n, p in _inspect.signature(module.forward).parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    traced = tuple((n, leaf_signature(v)) for n, v in named_arguments(names, args, kwargs))
    loose = tuple((n, ("array", tuple(None if i in free else d for i, d in enumerate(s[1])), s[2])
                   if isinstance(s, tuple) and s and s[0] == "array" else s) for n, s in traced)
    if f"\ndef {name}(" not in source:
        return source
    used = tuple(n for n in names if n in dict(traced)) or names[:1]
    line = f"@shape_guard({describe(loose)!r}, names={used!r})\n"
    if len(line) > WIDTH:
        line = f"@shape_guard(\n    {describe(loose)!r},\n    names={used!r},\n)\n"
    source = source.replace(f"\ndef {name}(", f"\n{line}def {name}(", 1)
    found = re.search(r"^from funcnet\.interop import (.*)$", source, flags=re.M)
    if found:
        names = sorted([*found.group(1).split(", "), "shape_guard"], key=lambda n: (n != "ops", n))
        return source[:found.start(1)] + ", ".join(names) + source[found.end(1):]
    return source.replace("from funcnet import nn\n", "from funcnet import nn\nfrom funcnet.interop import shape_guard\n", 1)


def _name_clashes(root, registry) -> list:
    """A child, parameter or buffer of a module written as ``nn.Composite(forward, ...)`` named like
    an argument of nn.Composite itself (``self.name = nn.Linear(...)``)."""
    out = []
    for path, m in root.named_modules():
        base, row = _match(m, registry)
        container = _container_base(m)
        if (row is not None and type(m).forward is base.forward) or (
                container is not None and type(m).forward is container.forward and not _own_tensors(m)):
            continue  # a layer or a container: written as nn.Linear(...), nn.ModuleDict({...})
        clash = [n for n in (*m._parameters, *m._buffers, *m._modules) if n in _COMPOSITE_ARGS]
        if clash:
            out.append(f"{path or '<root>'} ({type(m).__name__}): {', '.join(map(repr, clash))} is also an argument "
                       f"of nn.Composite itself (name=, tied=, batch_axis=) and cannot name a child; rename the "
                       f"attribute in the torch module (its state_dict keys change with it)")
    return out


_BUG = ("This is a bug in funcnet's to_source, not in the torch model: please report it with this message, the "
        "traceback above it and the torch model's source (the smallest model that shows it). interop.convert("
        "module, *example_inputs) does not write source and may still convert the model")
