"""``convert(module) -> (model, params, state)``: a torch module as a funcnet.nn model.

Containers and supported leaf layers become their funcnet.nn counterparts, built with the
constructor arguments read off the torch module (the registry's rows).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from funcnet import nn
from funcnet.interop.trace.registry import (
    _IGNORED,
    ConversionError,
    _container_base,
    _match,
    _own_tensors,
    _registry,
    _Row,
)
from funcnet.interop.weights import state_dict as _weights
from funcnet.interop.weights.state_dict import _to_jax
from funcnet.nn.module import Module, Tied
from funcnet.state import state_dict as _state_dict
from funcnet.state import tied_keys


_HINT = ("pass example inputs, convert(module, x), to convert it by tracing (or write it as "
         "nn.Composite(forward, ...), docs/design.md 'Composites')")


def _same_as_default(value, default) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if isinstance(value, tuple) and not isinstance(default, tuple):
        return all(v == default for v in value)
    return value == default


def _layer(module, path: str, base, row: _Row, problems: list) -> Module | None:
    found = _layer_args(module, path, base, row, problems,
                        lambda child, sub, found: _build(child, sub, _registry(), found))
    if found is None:
        return None
    kwargs = found[1]
    try:
        return getattr(nn, row.ours)(**kwargs)
    except (TypeError, ValueError) as e:
        where = f"{path or '<root>'} ({type(module).__name__})"
        problems.append(f"{where}: funcnet.nn.{row.ours}(**{kwargs}) failed: {e}")
        return None


def _layer_args(module, path: str, base, row: _Row, problems: list, build) -> tuple[str, dict] | None:
    """``(factory name, kwargs)``: the funcnet.nn layer a torch leaf layer becomes, its
    constructor arguments read off the module (``build(child, path, problems)`` converts a
    child module argument, an encoder's layer); None with the reason added to ``problems``."""
    factory = getattr(nn, row.ours)
    where = f"{path or '<root>'} ({type(module).__name__})"
    if type(module).forward is not base.forward:
        problems.append(f"{where}: a subclass of torch.nn.{base.__name__} with its own forward; {_HINT}")
        return None
    torch_sig = inspect.signature(base.__init__)
    ours_sig = inspect.signature(factory)
    try:
        values = row.args(module, build) if row.args else {}
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
    return row.ours, kwargs


def _named_sequential(children: list[tuple[str, Module]], name: str) -> Module:
    names = [n for n, _ in children]

    def forward(self, x):
        for n in names:
            x = getattr(self, n)(x)
        return x

    return nn.Composite(forward, name=name, **dict(children))


def _recorded(module, path: str, registry, problems: list, recording) -> Module | None:
    """A module whose forward is Python code, as an ``nn.Composite`` replaying its recording:
    its own parameters and buffers as ``nn.Parameter``/``nn.Buffer``, its children converted."""
    from funcnet.interop import ops
    from funcnet.interop.trace.replay import forward_of, unrecorded_forward

    name = type(module).__name__
    kids = {}
    prefix = f"{path}." if path else ""
    for n, p in module.named_parameters(recurse=False):
        kids[n] = nn.Parameter(_to_jax(prefix + n, p))  # from_torch's conversion and checks (x64, int64)
    for n, b in module.named_buffers(recurse=False):
        if n not in module._non_persistent_buffers_set:
            kids[n] = nn.Buffer(_to_jax(prefix + n, b))
    ok = True
    for n, c in module.named_children():
        built = _build(c, f"{path}.{n}" if path else n, registry, problems, recording)
        ok = ok and built is not None
        kids[n] = built
    if not ok:
        return None
    graphs = recording.graphs.get(id(module)) if recording is not None else None
    if not graphs:
        forward = unrecorded_forward(name)
    else:
        forward = forward_of(_modes(graphs), name, ops.lookup)
    composite = nn.Composite(forward, name=name, batch_axis=None, **kids)
    return composite


def _modes(graphs: dict) -> dict:
    """``{"both": [...]}`` where each train graph merges with its eval graph (they differ only
    by ``self.training`` flags), else the recorded ``{"train": [...], "eval": [...]}``."""
    from funcnet.interop.trace.graph import merge_modes

    train, evaluation = graphs.get("train", []), graphs.get("eval", [])
    merged = [merge_modes(a, b) for a, b in zip(train, evaluation)] if len(train) == len(evaluation) else [None]
    return {"both": merged} if merged and all(g is not None for g in merged) else graphs


def _build(module, path: str, registry, problems: list, recording=None) -> Module | None:
    from torch import nn as tnn

    where = f"{path or '<root>'} ({type(module).__name__})"
    base, row = _match(module, registry)
    if row is not None and (type(module).forward is base.forward or recording is None):
        return _layer(module, path, base, row, problems)
    container = _container_base(module)
    user_forward = type(module).forward is not (container or tnn.Module).forward
    if user_forward and recording is not None:
        return _recorded(module, path, registry, problems, recording)
    if container is None and type(module).forward is not tnn.Module.forward:
        if type(module).__module__.startswith("torch.nn"):
            problems.append(f"{where}: funcnet.nn has no counterpart yet; {_HINT}")
        else:
            problems.append(f"{where}: a module whose forward is Python code; {_HINT}")
        return None
    if container is not None and user_forward:
        problems.append(f"{where}: a {container.__name__} subclass with its own forward; {_HINT}")
        return None
    if _own_tensors(module):
        if recording is not None:
            return _recorded(module, path, registry, problems, recording)
        problems.append(f"{where}: a container with tensors of its own ({', '.join(_own_tensors(module))}); "
                        f"write it as nn.Composite with nn.Parameter children")
        return None
    children = [(n, _build(c, f"{path}.{n}" if path else n, registry, problems, recording))
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


def _is_leaf(module, registry) -> bool:
    base, row = _match(module, registry)
    return row is not None and type(module).forward is base.forward


def _is_walked_container(module) -> bool:
    container = _container_base(module)
    return container is not None and type(module).forward is container.forward


_TRAIN_ONLY = "; met in train mode alone: convert(module, x, train=False) converts the inference forward"


def _trace(module, args, kwargs, registry, *, names: bool, train: bool = True):
    from funcnet.interop import ops
    from funcnet.interop.trace.record import record

    recording = record(module, args, kwargs, is_leaf=lambda m: _is_leaf(m, registry),
                       is_container=_is_walked_container, lookup=ops.lookup, canonical=ops.canonical,
                       refused=ops.REFUSED, names=names, modes=("train", "eval") if train else ("eval",))
    grouped: dict = {}  # one line per problem: a block used twice is one line naming both paths
    for path, op, where, message in recording.problems:
        paths = grouped.setdefault((op, where, message), [])
        if path not in paths:
            paths.append(path)
    in_eval = {entry[1:] for entry in recording.problems if "eval" in recording.modes.get(entry, {"eval"})}
    problems = [f"{', '.join(paths)}: {op + ': ' if op else ''}{message} ({where})"
                + (_TRAIN_ONLY if train and (op, where, message) not in in_eval else "")
                for (op, where, message), paths in grouped.items()]
    return recording, problems


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


def convert(module: Any, *example_inputs, train: bool = True, **example_kwargs) -> tuple[Module, dict, dict]:
    """``(model, params, state)``: a torch module as a funcnet.nn model and its variables.

    ``nn.Sequential``/``ModuleList``/``ModuleDict`` and every supported leaf layer (see
    ``SUPPORTED_MODULES``; subclasses that keep torch's forward count) become their
    funcnet.nn counterparts, built with the constructor arguments read off the torch
    module (``in_features``, ``kernel_size``, ``eps``, ``momentum``, ...). A module whose
    ``forward`` is the user's Python code is traced on ``example_inputs`` /
    ``example_kwargs`` (torch tensors): its forward, recorded in train and in eval mode,
    becomes an ``nn.Composite`` (docs/design.md, "Converting by tracing"). Every problem
    (an unsupported op, a branch on data, in-place aliasing) is reported in one
    ``ConversionError``, each with its module path, the torch op and the source line. ``state`` is
    ``{}`` for a model without buffers. ``train=False`` traces eval mode alone (inference only: a
    train path that is not wanted or not traceable is never run); the model then refuses
    ``train=True``. Use ``model.apply(params, x)``, or ``nn.call(model, params, state, x, train=...)``.
    """
    if not (hasattr(module, "named_modules") and hasattr(module, "state_dict")):
        raise TypeError(f"convert: expected a torch.nn.Module, got {type(module).__name__}")
    model, params, state = _converted(module, example_inputs, example_kwargs, train)
    if example_inputs or example_kwargs:  # a recording holds for its input signature alone (jax.jit's rule)
        from funcnet.interop.trace.signature import specialise

        model = specialise(module, model, example_inputs, example_kwargs,
                           lambda args, kwargs: _converted(module, args, kwargs, train, ties=tied_keys(params))[0])
    return model, params, state


def _converted(module, example_inputs, example_kwargs, train, ties=None):
    """``_convert`` with every failure said as a ``ConversionError``."""
    try:
        return _convert(module, example_inputs, example_kwargs, train, ties)
    except ConversionError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure is said as a ConversionError
        if getattr(e, "funcnet_conversion", None) is not None:  # the torch forward raised while tracing
            raise e.funcnet_conversion from e
        if isinstance(e, (TypeError, ValueError)) and _raised_in(e, _weights.__file__):
            raise  # from_torch's checks of the tensors (meta, sparse): clear, kept as they are
        raise _internal(e) from e  # anything else is ours, said as such


def _raised_in(error: Exception, filename: str) -> bool:
    """Whether the innermost frame of ``error``'s traceback is in the file ``filename``."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(filename)


def _listed(problems: list[str]) -> str:
    """One problem on the same line (a one-line error); several, one per line."""
    return f" {problems[0]}" if len(problems) == 1 else "\n  " + "\n  ".join(problems)


def _internal(e: Exception) -> ConversionError:
    return ConversionError(f"convert: internal error ({type(e).__name__}: {e}). This is a funcnet bug: please "
                           f"report it with this message and the model's code")


def _convert(module, example_inputs, example_kwargs, train: bool, ties=None) -> tuple[Module, dict, dict]:
    """``(model, params, state)``; with ``ties`` (a new recording of a model already converted,
    whose ties they are) ``(model, None, None)``: torch's tensors are not converted again."""
    problems: list[str] = []
    registry = _registry()
    recording = None
    if example_inputs or example_kwargs:
        recording, problems = _trace(module, example_inputs, example_kwargs, registry, names=False, train=train)
    model = _build(module, "", registry, problems, recording)
    if problems:
        raise ConversionError("convert: cannot build a funcnet model:" + _listed(problems))
    if ties is not None:  # the params tree is checked against the first recording's (signature.specialise)
        return (_with_ties(model, ties) if ties else model), None, None
    # every module was built from the registry or its traced forward (a torch.nn layer with no counterpart in
    # funcnet.nn too, as nn.TransformerDecoderLayer): its tensors are read without from_torch's refusal of those
    params, state = _weights._variables(module, None, "convert", check=False)
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
