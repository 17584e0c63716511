"""A recorded forward replayed in JAX: the ``forward`` of a converted module's ``nn.Composite``.

Each node of the ``Graph`` runs through the op table (``funcnet.interop.ops``) on JAX
arrays; a ``child`` node calls the child as ``self.<name>(...)`` does in a hand-written
composite, so children get their own params, state, PRNG key and ``train`` flag. Random
ops draw from the composite's key stream; ``self.training`` picks the train or eval graph
(or fills the flags merged into one graph); buffers the torch forward changed come back
as new state (``self.<buffer> = new``).
"""

from __future__ import annotations

import operator
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from funcnet.interop.trace.frame import as_replayed
from funcnet.interop.trace.graph import GUARD_NEGATED, GUARD_OPS, GUARD_TEXT, Graph, Ref, Slice, Training
from funcnet.interop.trace.vmap import replay_vmap

_DIM_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
            "mod": operator.mod}


class GuardFailed(ValueError):
    """A comparison of sizes that held when the forward was recorded does not hold at this call."""


def child_of(self, path: str):
    """``self.a.b[0]`` for the dotted path ``"a.b.0"`` (a child of a child, or a list entry)."""
    first, *rest = path.split(".")
    obj = getattr(self, first)
    for p in rest:
        obj = obj._child(p)
    return obj


def _tensor_of(self, path: str, kind: str):
    *owner, leaf = path.split(".")
    if not owner:
        return getattr(self, leaf)
    node = child_of(self, ".".join(owner))
    return (node.params if kind == "param" else node.state)[leaf]


def candidates(graphs: list[Graph], name: str, args: tuple, kwargs: dict) -> list:
    """``[(graph, bound)]``: every recorded graph whose constant arguments (flags, None, strings)
    these arguments match, in recording order (the replay takes the first whose size guards
    hold); a clear error when none does."""
    seen, found = [], []
    for g in graphs:
        try:
            bound = g.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{name}: {e} (the torch forward's signature is {g.signature})") from None
        bound.apply_defaults()
        got = {}
        for (arg, path) in g.constants:
            value = bound.arguments.get(arg, _MISSING)
            for p in path:
                value = value[p] if value is not _MISSING else value
            got[(arg, path)] = as_replayed(value)  # dtype=torch.float32 given by the caller
        if all(_same(got[k], v) for k, v in g.constants.items()) and _has_inputs(g, bound):
            found.append((g, bound))
        else:
            seen.append({".".join(map(str, (a, *p))): v for (a, p), v in g.constants.items()})
    if found:
        return found
    raise ValueError(f"{name}: called with arguments that take a path the tracing did not see; the recorded calls "
                     f"had {seen}; convert with example inputs that take this path (or use the arguments traced)")


_MISSING = object()


class _Bound:
    """The arguments of a vmap body, read as ``run`` reads ``inspect.BoundArguments``."""

    def __init__(self, arguments: dict):
        self.arguments = arguments


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _has_inputs(g: Graph, bound) -> bool:
    for (arg, path) in g.inputs:
        value = bound.arguments.get(arg, _MISSING)
        for p in path:
            if value is _MISSING or value is None:
                return False
            value = value[p]
        if value is _MISSING or value is None:
            return False
    return True


def run(graph: Graph, self, bound, lookup) -> Any:
    """Replay ``graph`` with ``self`` (the composite's scope) on the bound arguments."""
    env: list = []

    def value(tree):
        if isinstance(tree, Ref):
            v = env[tree.node]
            for p in tree.path:
                v = v[p]
            return v
        if isinstance(tree, Training):
            return self.training != tree.negate
        if isinstance(tree, Slice):
            return slice(value(tree.start), value(tree.stop), value(tree.step))
        if isinstance(tree, tuple):
            return tuple(value(v) for v in tree)
        if isinstance(tree, list):
            return [value(v) for v in tree]
        if isinstance(tree, dict):
            return {k: value(v) for k, v in tree.items()}
        if isinstance(tree, np.ndarray):
            return jnp.asarray(tree)
        return tree

    for node in graph.nodes:
        if node.kind == "input":
            arg, path = node.target
            v = bound.arguments[arg]
            for p in path:
                v = v[p]
            env.append(v)
        elif node.kind in ("param", "buffer"):
            env.append(_tensor_of(self, node.target, node.kind))
        elif node.kind == "const":
            env.append(value(node.target))
        elif node.kind == "dim":
            env.append(_DIM_OPS[node.target](*value(node.args)))
        elif node.kind == "guard":
            a, b = value(node.args)
            if not GUARD_OPS[node.target](a, b):
                op, negated = GUARD_TEXT[node.target], GUARD_TEXT[GUARD_NEGATED[node.target]]
                raise GuardFailed(f"the model's code at {os.path.basename(node.where)} compares sizes and took its branch where "
                                  f"the left side {op} the right; here {a} {negated} {b}, so the recorded forward does "
                                  f"not hold: record the module again at these input sizes (interop.convert does "
                                  f"it per input signature)")
            env.append(None)
        elif node.kind == "child":
            env.append(child_of(self, node.target)(*value(node.args), **value(node.kwargs)))
        elif node.kind == "vmap":  # torch.vmap(func): jax.vmap of func's recorded body
            env.append(replay_vmap(node.target, *value(node.args),
                                   lambda body, arguments: run(body, self, _Bound(arguments), lookup)))
        else:
            op = lookup(node.target)
            kwargs = value(node.kwargs)
            if op.random:
                kwargs["key"] = self.key_or_none()
            out = op.fn(*value(node.args), **kwargs)
            if node.no_grad:
                out = jax.tree.map(lambda a: jax.lax.stop_gradient(a) if isinstance(a, jax.Array) else a, out)
            env.append(out)
    for name, ref in graph.state_out.items():
        setattr(self, name, value(ref))
    return value(graph.output)


def forward_of(graphs: dict, name: str, lookup):
    """A composite ``forward(self, *args, **kwargs)`` replaying ``graphs`` (``{"train": [...],
    "eval": [...]}`` or ``{"both": [...]}``)."""

    def forward(self, *args, **kwargs):
        mode = "both" if "both" in graphs else ("train" if self.training else "eval")
        if not graphs.get(mode):
            raise ValueError(f"{name} was not called in {mode} mode when tracing, so it has no recorded forward "
                             f"there")
        found = candidates(graphs[mode], name, args, kwargs)
        for graph, bound in found[:-1]:  # a module recorded at several sizes that took another path at each
            try:
                return run(graph, self, bound, lookup)
            except GuardFailed:
                continue
        graph, bound = found[-1]
        return run(graph, self, bound, lookup)

    forward.__qualname__ = forward.__name__ = name
    return forward


def unrecorded_forward(name: str):
    """The forward of a module that was never called while tracing: it says so when called."""

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{name} was not called when the model was traced, so its forward was not "
                                  f"recorded; convert with example inputs that reach it")

    forward.__qualname__ = forward.__name__ = name
    return forward
