"""``torch.vmap`` inside a recorded forward, recorded as ``jax.vmap`` of its recorded body.

While a forward is recorded, ``torch.vmap(func, in_dims, out_dims)`` (and ``torch.func.vmap``)
returns a function that, when called, (1) runs torch's own vmap for the real batched output,
out of the recorder's sight, and (2) records ``func`` once on unbatched example values (every
mapped argument at index 0 of its mapped axis) in a frame of its own. The call becomes one
``vmap`` node whose target is the recorded body (``VmapBody``); replay runs it as
``jax.vmap(body, in_axes=in_dims, out_axes=out_dims)``, and ``to_source`` writes it as a
nested ``def`` under ``jax.vmap``. A tensor of the enclosing forward that the body reads
(a closure) is passed in unbatched (``in_axes=None``); a ``torch.vmap`` inside the body
nests the same way.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from funcnet.interop.trace.frame import Frame, flatten_args, user_line
from funcnet.interop.trace.graph import Graph, Node, structure

__all__ = ["CAPTURED", "VmapBody", "recording_vmap", "replay_vmap", "vmap_call", "vmap_def", "vmap_dims"]

CAPTURED = "__captured__"  # the body's input holding the enclosing forward's tensors it reads


@dataclasses.dataclass(eq=False)
class VmapBody:
    """The recorded function of a ``torch.vmap`` call: ``graph`` takes the function's positional
    arguments by ``names``, its keyword arguments (unbatched) by their own names, and the tensors
    it read from the enclosing forward as ``__captured__``."""

    graph: Graph
    names: tuple
    in_dims: Any
    out_dims: Any

    def key(self) -> tuple:
        """What the body computes, for comparing two recordings (as ``Node.key``)."""
        return ("vmap", self.graph.key(), self.names, repr(self.in_dims), repr(self.out_dims))

    def __eq__(self, other):
        return isinstance(other, VmapBody) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())


def vmap_dims(in_dims, args) -> list:
    """The mapped axis (an int, or None) of every leaf of ``args``, in ``flatten_args`` order,
    read as torch reads ``in_dims``: one int or None for all, or a tree matching the arguments."""
    out: list = []

    def walk(spec, value):
        if spec is None or isinstance(spec, int):
            out.extend(spec for _ in flatten_args(value))
        elif isinstance(value, (tuple, list)) and isinstance(spec, (tuple, list)) and len(spec) == len(value):
            for s, v in zip(spec, value):
                walk(s, v)
        elif isinstance(value, Mapping) and isinstance(spec, Mapping):
            for k, v in value.items():
                walk(spec[k], v)
        else:
            raise ValueError(f"torch.vmap: in_dims={in_dims!r} does not match the arguments' structure")

    walk(in_dims, tuple(args))
    return out


def _names(func, count: int) -> tuple:
    """The function's own names for its first ``count`` positional parameters (``x0, x1, ...``
    where it has none: ``*args``, a builtin)."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        params = []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) >= count and all(p.kind in kinds for p in params[:count]):
        names = tuple(p.name for p in params[:count])
        if CAPTURED not in names and len(set(names)) == count:
            return names
    return tuple(f"x{i}" for i in range(count))


def recording_vmap(recorder, vmap):
    """``torch.vmap`` while ``recorder`` runs: a call inside a recorded frame runs torch's vmap
    for the value and records the body once (see the module docstring)."""
    from funcnet.interop.trace.env import _quiet

    sig = inspect.signature(vmap)

    def wrapped(func, *vmap_args, **vmap_kwargs):
        batched = vmap(func, *vmap_args, **vmap_kwargs)
        given = sig.bind(func, *vmap_args, **vmap_kwargs)
        given.apply_defaults()
        in_dims, out_dims = given.arguments["in_dims"], given.arguments["out_dims"]

        def call(*args, **kwargs):
            frame = recorder.stack[-1] if recorder.stack else None
            if frame is None or frame.silent or recorder.busy or recorder.hidden:
                return batched(*args, **kwargs)
            where = user_line(recorder.skip)
            with _quiet(recorder):
                recorder.hidden = True  # module hooks too: the batched run is torch's, not recorded
                try:
                    out = batched(*args, **kwargs)
                finally:
                    recorder.hidden = False
            body = _record_body(recorder, frame, func, args, kwargs, in_dims, out_dims)
            with _quiet(recorder):
                ref = frame.add(Node("vmap", VmapBody(body.graph, body.names, in_dims, out_dims),
                                     (frame.arg(tuple(args)), frame.arg(dict(kwargs)),
                                      tuple(frame.arg(t) for t in body.captured)), where=where,
                                     structure=structure(out)))
                frame.bind(out, ref)
            return out

        return call

    return wrapped


@dataclasses.dataclass
class _Body:
    graph: Graph
    names: tuple
    captured: list


def _record_body(recorder, frame: Frame, func, args, kwargs, in_dims, out_dims) -> _Body:
    """``func`` recorded on unbatched examples in a frame of its own, on top of ``frame``."""
    import torch

    from funcnet.interop.trace.env import _quiet

    names = _names(func, len(args))
    with _quiet(recorder):
        dims = vmap_dims(in_dims, args)
        leaves = flatten_args(tuple(args))
        sliced = _rebuild(tuple(args), {path: (leaf.select(d, 0) if d is not None and isinstance(leaf, torch.Tensor)
                                               else leaf) for (path, leaf), d in zip(leaves, dims)})
        sub = Frame(frame.module, False, recorder=recorder, outer=frame)
        for (path, leaf), d in zip(flatten_args(sliced), dims):
            key = (names[path[0]], path[1:])
            if isinstance(leaf, torch.Tensor):
                ref = sub.add(Node("input", key))
                sub.inputs[key] = ref.node
                sub.known[id(leaf)] = (leaf, ref)
            else:
                sub.constants[key] = leaf
        for name, value in kwargs.items():
            for path, leaf in flatten_args(value):
                if isinstance(leaf, torch.Tensor):
                    ref = sub.add(Node("input", (name, path)))
                    sub.inputs[(name, path)] = ref.node
                    sub.known[id(leaf)] = (leaf, ref)
                else:
                    sub.constants[(name, path)] = leaf
    recorder.stack.append(sub)
    try:
        result = func(*sliced, **kwargs)
    finally:
        recorder.stack.pop()
        sub.active = False
    with _quiet(recorder):
        output = sub.arg(result)
        signature = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        graph = Graph(signature, sub.nodes, sub.inputs, sub.constants, output, {}, sub.names)
    return _Body(graph, names, sub.captured)


def _rebuild(tree, leaves: dict, path=()):
    """``tree`` with the leaf at each path of ``leaves`` replaced (tuples, lists, dicts)."""
    if path in leaves and not isinstance(tree, (tuple, list, Mapping)):
        return leaves[path]
    if isinstance(tree, (tuple, list)):
        return type(tree)(_rebuild(v, leaves, path + (i,)) for i, v in enumerate(tree))
    if isinstance(tree, Mapping):
        return {k: _rebuild(v, leaves, path + (k,)) for k, v in tree.items()}
    return leaves.get(path, tree)


def replay_vmap(body: VmapBody, args, kwargs, captured, run_body):
    """``jax.vmap`` of the recorded body over ``args``: ``run_body(graph, arguments)`` replays it."""
    import jax

    def one(*xs):
        return run_body(body.graph, {**dict(zip(body.names, xs)), **kwargs, CAPTURED: captured})

    in_axes = tuple(body.in_dims) if isinstance(body.in_dims, list) else body.in_dims
    return jax.vmap(one, in_axes=in_axes, out_axes=body.out_dims)(*args)



def vmap_def(node: Node, names: dict, reserved: set, fn: str, write_body) -> tuple[list, tuple]:
    """For ``to_source``: the lines ``def fn(...):`` and the body (``write_body(graph)``: its
    statements) of the function a ``vmap`` node maps, and its ``(fn, in_axes)``. Its keyword
    arguments and the tensors it reads from the forward are parameters too, not mapped
    (``in_axes`` None), the latter named as the forward names them (``names``: Ref -> the user's
    variable) where that name is free."""
    body = node.target
    positional, keywords, captured = node.args
    taken, renamed = set(body.names) | set(keywords), {}
    for k, ref in enumerate(captured):
        name = names.get(ref)
        name = name if name and name not in taken and name not in reserved else f"captured{k}"
        renamed[(CAPTURED, (k,))] = (name, ())
        taken.add(name)
    graph = dataclasses.replace(
        body.graph, inputs={renamed.get(key, key): i for key, i in body.graph.inputs.items()},
        nodes=[dataclasses.replace(m, target=renamed[m.target]) if m.kind == "input" and m.target in renamed else m
               for m in body.graph.nodes], names=dict(body.graph.names))
    params = [*body.names, *keywords, *(renamed[(CAPTURED, (k,))][0] for k in range(len(captured)))]
    dims = tuple(body.in_dims) if isinstance(body.in_dims, (tuple, list)) else (body.in_dims,) * len(positional)
    lines = [f"def {fn}({', '.join(params)}):"] + ["    " + line for stmt in write_body(graph) for line in stmt]
    return lines, (fn, (*dims, *(None for _ in (*keywords, *captured))))


def vmap_call(node: Node, fn: str, axes: tuple, expr) -> str:
    """``jax.vmap(fn, in_axes=..., out_axes=...)(args...)`` of a ``vmap`` node (``expr``: a value's text)."""
    positional, keywords, captured = node.args
    parts = [expr(v) for v in (*positional, *keywords.values(), *captured)]
    return f"jax.vmap({fn}, in_axes={axes!r}, out_axes={node.target.out_dims!r})({', '.join(parts)})"
