"""The recorded forward of one torch module: nodes on real values, replayable in JAX.

A ``Graph`` is what ``interop.convert`` keeps of a module's ``forward``: its inputs, every
torch call on them (``op``), every call of a child module (``child``), the parameters and
buffers it read, the shape arithmetic (``dim``) and its output. Values are referenced as
``Ref(node, path)``: the output of node ``node``, indexed by ``path`` (a tuple of
positions) when it is a tuple. Constants are kept by value.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, NamedTuple

import numpy as np


class Ref(NamedTuple):
    """The value of node ``node`` (indexed by ``path`` when that value is a tuple)."""

    node: int
    path: tuple = ()


class Slice(NamedTuple):
    """``slice(start, stop, step)`` whose fields may be ``Ref``s (``x[:, :T]`` with ``T`` a size)."""

    start: Any
    stop: Any
    step: Any


class Training(NamedTuple):
    """``self.training`` (``negate``: ``not self.training``) where the train and eval recordings
    differ only by that flag (``F.dropout(x, p, self.training)``)."""

    negate: bool = False


@dataclasses.dataclass
class Node:
    """One recorded value: an input, parameter, buffer, constant, op result, size or child-module call."""

    kind: str  # "input" | "param" | "buffer" | "const" | "op" | "dim" | "child" | "guard"
    # input (name, path) | dotted param/buffer path | value | op name | operator name | child path | comparison
    # ("lt", "ge", ...: a guard is a comparison of sizes the model's code made, as it held when recorded)
    target: Any
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    no_grad: bool = False  # recorded under torch.no_grad(): its value gets no gradient
    where: str = ""  # the user's source file:line
    name: str | None = None  # the variable the user's code bound it to, where known
    structure: Any = None  # the output's nesting: None for a leaf, a tuple of these for a tuple or list
    # a size's value at the traced shapes (an int, or a tuple of them for ``x.shape``): not part of the program
    # (``key``), read by ``to_source`` to tell which size a loop of that many steps ran over
    value: Any = dataclasses.field(default=None, compare=False)

    def key(self) -> tuple:
        """What the node computes, for comparing two recordings (not its name or line)."""
        return (self.kind, _frozen(self.target), _frozen(self.args), _frozen(self.kwargs), self.no_grad)


@dataclasses.dataclass
class Graph:
    """A recorded forward: its nodes in order, where the inputs enter and which nodes are the output and new state."""

    signature: Any  # inspect.Signature of the torch forward, without self
    nodes: list[Node]
    inputs: dict  # (argument name, path within it) -> node index, for arrays and sizes
    constants: dict  # (argument name, path) -> the constant argument recorded there (None, flags, ...)
    output: Any  # tree of Refs and constants
    state_out: dict  # own buffer name -> Ref of its new value
    names: dict = dataclasses.field(default_factory=dict)  # Ref -> the user's variable name for that value

    def key(self) -> tuple:
        """A hashable summary of the graph: two forwards with the same key replay the same way."""
        return (tuple(n.key() for n in self.nodes), _frozen(self.output), _frozen(self.state_out))


def structure(value):
    """The nesting of a recorded value: None for a leaf, a tuple of these for a tuple or list
    (``to_source`` unpacks ``q, k, v = ...`` by it)."""
    if isinstance(value, (tuple, list)):
        return tuple(structure(v) for v in value)
    return None


def _frozen(value):
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not isinstance(value, (Ref, Slice, Training)):
        return (type(value).__name__, *(_frozen(v) for v in value))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (Ref, Slice, Training)):
        return (type(value).__name__, *(_frozen(v) for v in value))
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


# a guard node's target: the comparison that held when recorded, its Python operator and text, and its negation
GUARD_OPS = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq,
             "ne": operator.ne}
GUARD_TEXT = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
GUARD_NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def without_guards(graph: Graph) -> Graph:
    """``graph`` without its ``guard`` nodes (no node reads one), every reference renumbered."""
    kept = [n for n, node in enumerate(graph.nodes) if node.kind != "guard"]
    if len(kept) == len(graph.nodes):
        return graph
    new = {old: i for i, old in enumerate(kept)}

    def moved(tree):
        if isinstance(tree, Ref):
            return Ref(new[tree.node], tree.path)
        if isinstance(tree, Slice):
            return Slice(*(moved(v) for v in tree))
        if isinstance(tree, Training):
            return tree
        if isinstance(tree, (tuple, list)):
            return type(tree)(moved(v) for v in tree)
        if isinstance(tree, dict):
            return {k: moved(v) for k, v in tree.items()}
        return tree

    nodes = [dataclasses.replace(graph.nodes[n], args=moved(graph.nodes[n].args), kwargs=moved(graph.nodes[n].kwargs))
             for n in kept]
    return dataclasses.replace(graph, nodes=nodes, inputs={k: new[v] for k, v in graph.inputs.items()},
                               output=moved(graph.output), state_out={k: moved(v) for k, v in graph.state_out.items()},
                               names={moved(r): v for r, v in graph.names.items() if r.node in new})


def merge_modes(train: Graph, evaluation: Graph) -> Graph | None:
    """One graph for both modes when the two recordings differ only where a flag is
    ``self.training`` (True in train, False in eval, or the reverse); None otherwise."""
    if train.key() == evaluation.key():
        return train
    if len(train.nodes) != len(evaluation.nodes) or _frozen(train.output) != _frozen(evaluation.output) \
            or _frozen(train.state_out) != _frozen(evaluation.state_out):
        return None
    nodes = []
    for a, b in zip(train.nodes, evaluation.nodes):
        if a.key() == b.key():
            nodes.append(a)
            continue
        if (a.kind, _frozen(a.target), a.no_grad) != (b.kind, _frozen(b.target), b.no_grad):
            return None
        args = _flag(a.args, b.args)
        kwargs = _flag(a.kwargs, b.kwargs)
        if args is None or kwargs is None:
            return None
        nodes.append(dataclasses.replace(a, args=args, kwargs=kwargs))
    return dataclasses.replace(train, nodes=nodes)


def _flag(a, b):
    """``a`` with ``Training()`` wherever ``a`` is True and ``b`` False (``Training(True)`` for
    the reverse); None where they differ otherwise."""
    if _frozen(a) == _frozen(b):
        return a
    if a is True and b is False:
        return Training()
    if a is False and b is True:
        return Training(negate=True)
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        out = {k: _flag(a[k], b[k]) for k in a}
        return None if any(v is None and a[k] is not None for k, v in out.items()) else out
    if isinstance(a, (list, tuple)) and type(a) is type(b) and len(a) == len(b) and not isinstance(a, Ref):
        out = [_flag(x, y) for x, y in zip(a, b)]
        if any(v is None and x is not None for v, x in zip(out, a)):
            return None
        return type(a)(*out) if isinstance(a, (Slice, Training)) else type(a)(out)
    return None
