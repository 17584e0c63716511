"""A recorded forward as Python source: the body of a generated composite's ``forward``.

``body(graphs, ctx)`` writes the statements of a ``forward`` from the module's recorded
graphs (see funcnet/interop/trace/graph.py): the user's variable names where the recording kept
them, single-use values inlined into the expression that uses them, no dead code, children
as ``self.conv1(x)``, descendants' tensors as ``self.wte.params["weight"]``, every torch call
through the op table's own rendering (``Op.render``), a chain of calls over every entry of a
ModuleList as a ``for`` loop, and ``if self.training:`` where train and eval differ.

Statements are lists of lines. Values are written first with placeholders (``_v3_``) and
named at the end, so a name the user reused (``x = f(x)``) is kept where that is safe and
renamed (``x_2``) where an older value of it is still needed.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import keyword
import os
import re
from typing import Callable


from funcnet.interop.trace.graph import GUARD_TEXT, Graph, Ref, Slice, Training
from funcnet.interop.source.text import (_is_self_assign, _is_tuple_literal, _same_for_each, atom, child_expr, index,
                                         is_name, literal, own_expr)
from funcnet.interop.trace.vmap import vmap_call, vmap_def
from funcnet.interop.source.loops import reroll, write_loop

_DIM_OPS = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%"}
# names the generated module uses itself, and names ruff refuses (E741)
RESERVED = {"self", "jnp", "jax", "nn", "F", "ops", "np", "l", "I", "O", "block", *keyword.kwlist}
_SIZES = {"Tensor.size", "Tensor.shape", "Tensor.dim", "Tensor.ndim", "Tensor.numel", "Tensor.ndimension",
          "Tensor.nelement", "Tensor.__len__", "torch.numel"}
_PLACEHOLDER = re.compile(r"_v(\d+)_")


@dataclasses.dataclass
class Context:
    """What a forward's source needs to know about its module."""

    lookup: Callable  # op name -> Op
    own: set  # own parameters and buffers: self.<name>
    lists: dict  # dotted path of a ModuleList child -> its length
    stateful: set  # dotted child paths whose call changes state (kept even when the output is unused)
    constants: list  # module-level constants [(name, source)], shared by the whole file
    positions: frozenset = frozenset()  # dotted paths of container entries named by their position ("h.0")
    reroll: bool = True  # loops over a size written as loops (funcnet/interop/source/loops.py)


def _refs(tree):
    if isinstance(tree, Ref):
        yield tree
    elif isinstance(tree, Slice):
        for v in tree:
            yield from _refs(v)
    elif isinstance(tree, (tuple, list)) and not isinstance(tree, Training):
        for v in tree:
            yield from _refs(v)
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _refs(v)


class _Body:
    """The statements of one recorded graph."""

    def __init__(self, graph: Graph, ctx: Context):
        graph = reroll(graph) if ctx.reroll else graph
        self.g, self.ctx, self.nodes = graph, ctx, graph.nodes
        self.arg_paths: dict = {}
        for arg, path in list(graph.inputs) + list(graph.constants):
            self.arg_paths.setdefault(arg, set()).add(path)
        self.bound: dict = {}  # (node, path) -> placeholder
        self.names: dict = {}  # placeholder -> preferred name
        self.stmts: list = []  # [lines, defined placeholders]
        self.vmapped: dict = {}  # node of a torch.vmap call -> (its function's placeholder, in_axes)
        for ref, name in graph.names.items():
            if name in RESERVED:
                graph.names[ref] = f"{name}_"

    # ---- what is needed, and how often
    def _struct(self, n: int):
        node = self.nodes[n]
        op = self.ctx.lookup(node.target) if node.kind == "op" else None
        if op is not None and op.mutates:
            return (node.structure, tuple(None for _ in op.mutates))
        return node.structure

    def _collapse(self, tree):
        """A tuple of every entry of one value (``(h[0], h[1])`` for the pair ``h``) as that value."""
        if isinstance(tree, (Ref, Slice, Training)) or not isinstance(tree, (tuple, list)):
            if isinstance(tree, dict):
                return {k: self._collapse(v) for k, v in tree.items()}
            return tree
        items = [self._collapse(v) for v in tree]
        if items and all(isinstance(v, Ref) for v in items):
            first = items[0]
            node, parent = first.node, first.path[:-1]
            if all(v.node == node and v.path == parent + (i,) for i, v in enumerate(items)) and first.path:
                struct = self._struct(node)
                for p in parent:
                    struct = struct[p] if isinstance(struct, tuple) and isinstance(p, int) else None
                if isinstance(struct, tuple) and len(struct) == len(items):
                    return Ref(node, parent)
            if all(self.nodes[v.node].kind == "input" and not v.path for v in items):
                targets = [self.nodes[v.node].target for v in items]
                arg, path0 = targets[0]
                parent = path0[:-1]
                if path0 and all(t[0] == arg and t[1] == parent + (i,) for i, t in enumerate(targets)):
                    under = {p[len(parent)] for p in self.arg_paths.get(arg, ()) if p[:len(parent)] == parent
                             and len(p) > len(parent)}
                    if under == set(range(len(items))):
                        return ("__input__", arg, parent)
        return type(tree)(items)

    def run(self) -> list:
        g = self.g
        self.args = [tuple(self._collapse(a) for a in n.args) for n in self.nodes]
        self.kwargs = [self._collapse(n.kwargs) for n in self.nodes]
        self.output = self._collapse(g.output)
        self.state = {k: self._collapse(v) for k, v in g.state_out.items()}
        live = self._live()
        self.uses: dict = {}
        for n in sorted(live):
            for r in self._node_refs(n):
                self.uses.setdefault(r.node, []).append(r.path)
        for r in list(_refs(self.output)) + list(_refs(list(self.state.values()))):
            self.uses.setdefault(r.node, []).append(r.path)
        self.loops = self._loops(live)
        inside = {m for start, end, _ in self.loops.values() for m in range(start, end)}
        for n in range(len(self.nodes)):
            if n in live and n not in inside:
                self._emit(n)
        for name, tree in self.state.items():
            value = self.expr(tree)
            line = f"self.{name} = {value}" if is_name(name) else f"setattr(self, {name!r}, {value})"
            self.stmts.append(([line], []))
        self.stmts.append(([f"return {self.expr(self.output, top=True)}"], []))
        return self._named()

    def _node_refs(self, n):
        yield from _refs(self.args[n])
        yield from _refs(self.kwargs[n])

    def _live(self) -> set:
        todo = [r.node for r in _refs(self.output)] + [r.node for r in _refs(list(self.state.values()))]
        todo += [n for n, node in enumerate(self.nodes) if node.kind == "child" and node.target in self.ctx.stateful]
        todo += [n for n, node in enumerate(self.nodes) if node.kind == "guard"]  # a branch on sizes: checked
        live = set()
        while todo:
            n = todo.pop()
            if n in live:
                continue
            live.add(n)
            todo.extend(r.node for r in self._node_refs(n))
        return live

    def _loops(self, live) -> dict:
        """``{last node: (first node, last node, list path)}`` for ``x = self.h[i](x)`` over every i."""
        loops = {}
        for n, node in enumerate(self.nodes):
            if node.kind != "child" or n not in live or not node.target.endswith(".0"):
                continue
            path = node.target[:-2]
            k = self.ctx.lists.get(path, 0)
            if k < 2 or n + k > len(self.nodes) or not self.args[n]:
                continue
            ok = True
            for j in range(1, k):
                m = self.nodes[n + j]
                if m.kind != "child" or m.target != f"{path}.{j}" or self.args[n + j][:1] != (Ref(n + j - 1),) \
                        or self.args[n + j][1:] != self.args[n][1:] or self.kwargs[n + j] != self.kwargs[n] \
                        or self.uses.get(n + j - 1) != [()]:
                    ok = False
                    break
            if ok:
                loops[n + k - 1] = (n, n + k - 1, path)
        return loops

    # ---- statements
    def _placeholder(self, key, name: str) -> str:
        p = f"_v{len(self.names)}_"
        self.names[p] = name
        self.bound[key] = p
        return p

    def _gen_name(self, n: int) -> str:
        node = self.nodes[n]
        for name, tree in self.state.items():
            if tree == Ref(n):
                return name
        if node.kind == "child":
            last = node.target.split(".")[-1]
            return last if is_name(last) and last not in RESERVED else "out"
        if node.kind == "dim":
            return "size"
        short = str(node.target).rsplit(".", 1)[-1].strip("_")
        return short if short.isidentifier() and short not in RESERVED else "out"

    def _emit(self, n: int) -> None:
        node = self.nodes[n]
        if node.kind in ("input", "param", "buffer", "const"):
            return
        if node.kind == "vmap":  # def vmapped(...): the body of a torch.vmap call, before the statement mapping it
            fn = self._placeholder(("vmap", n), "vmapped")
            lines, self.vmapped[n] = vmap_def(node, self.g.names, RESERVED, fn, lambda g: graph_body(g, self.ctx))
            self.stmts.append((lines, [fn]))
        if node.kind == "loop":
            self._rolled(n)
            return
        if node.kind == "guard":  # the torch code branched on sizes here: the port holds where it took this branch
            a, b = (self.expr(v) for v in self.args[n])
            condition = f"{a} {GUARD_TEXT[node.target]} {b}"
            self.stmts.append(([f"size_check({condition}, {condition!r}, {os.path.basename(node.where)!r})"], []))
            return
        names = self.g.names
        paths = self.uses.get(n, [])
        if n in self.loops:
            start, end, path = self.loops[n]
            source = self.expr(self.args[start][0])
            var = self._placeholder((n, ()), names.get(Ref(n)) or self._name_of(source) or "x")
            kw = "".join(f", {self.expr(v)}" for v in self.args[start][1:])
            kw += "".join(f", {k}={self.expr(v)}" for k, v in self.kwargs[start].items())
            self.stmts.append(([f"{var} = {source}", f"for block in {child_expr(path, self.ctx.positions)}:",
                                f"    {var} = block({var}{kw})"], [var]))
            return
        if not paths and node.kind == "child":
            self.stmts.append(([self.node_text(n)], []))
            return
        if Ref(n) in names or () in paths:
            if Ref(n) in names or len(paths) > 1:
                text = self.node_text(n)
                if _PLACEHOLDER.fullmatch(text):  # an identity (x.contiguous()): the same value, no statement
                    self.bound[(n, ())] = text
                    return
                p = self._placeholder((n, ()), names.get(Ref(n)) or self._gen_name(n))
                self.stmts.append(([f"{p} = {text}"], [p]))
            return
        tops = sorted({p[0] for p in paths if p}, key=str)
        struct = self._struct(n)
        named = {i: self._pref((n, (i,))) or _common_name(names, n, i) for i in tops}
        if not (any(named.values()) or len(paths) > 1 or any(self._pref((n, p)) for p in paths)):
            return  # used once, through one index: inlined
        text = self.node_text(n)
        if _is_tuple_literal(text):  # an in-place op's (result, (new values,)) written out: one statement each
            for path in dict.fromkeys(paths):
                if self._pref((n, path)) or paths.count(path) > 1:
                    p = self._placeholder((n, path), self._pref((n, path)) or self._gen_name(n))
                    self.stmts.append(([f"{p} = {index(text, path)}"], [p]))
            return
        if isinstance(struct, tuple) and all(isinstance(i, int) and i < len(struct) for i in tops):
            parts, defined = [], []
            for i in range(len(struct)):
                deeper = sorted({p[1] for p in paths if p[:1] == (i,) and len(p) > 1}, key=str)
                if i not in tops:
                    parts.append("_")
                elif isinstance(struct[i], tuple) and (i,) not in paths and not named[i] and deeper and \
                        all(isinstance(j, int) and j < len(struct[i]) for j in deeper):
                    inner = [self._placeholder((n, (i, j)), self._pref((n, (i, j))) or f"{self._gen_name(n)}{i}{j}")
                             if j in deeper else "_" for j in range(len(struct[i]))]
                    defined += [q for q in inner if q != "_"]
                    parts.append(f"({', '.join(inner)}{',' if len(inner) == 1 else ''})")
                else:
                    parts.append(self._placeholder((n, (i,)), named[i] or f"{self._gen_name(n)}{i}"))
                    defined.append(parts[-1])
            self.stmts.append(([f"{', '.join(parts)}{',' if len(parts) == 1 else ''} = {text}"], defined))
            return
        p = self._placeholder((n, ()), self._gen_name(n))
        self.stmts.append(([f"{p} = {text}"], [p]))

    def _rolled(self, n: int) -> None:
        """A rerolled loop: ``def step(i, carry, ...)`` then ``for i in range(size): ...``
        (``write_loop`` in funcnet/interop/source/loops.py)."""
        write_loop(self, n, graph_body, RESERVED)

    def _pref(self, key) -> str | None:
        """The user's name for the value ``Ref(*key)``, or the buffer it becomes (``running_mean``)."""
        ref = Ref(*key)
        if ref in self.g.names:
            return self.g.names[ref]
        return next((name for name, tree in self.state.items() if tree == ref), None)

    def _name_of(self, text: str) -> str | None:
        return self.names.get(text) if _PLACEHOLDER.fullmatch(text) else None

    # ---- expressions
    def expr(self, tree, top: bool = False) -> str:
        if isinstance(tree, Ref):
            return self.ref_text(tree)
        if isinstance(tree, Training):
            return "not self.training" if tree.negate else "self.training"
        if isinstance(tree, Slice):
            return f"slice({self.expr(tree.start)}, {self.expr(tree.stop)}, {self.expr(tree.step)})"
        if isinstance(tree, tuple) and tree[:1] == ("__input__",):
            return self._input(tree[1], tree[2])
        if isinstance(tree, tuple):
            inner = ", ".join(self.expr(v) for v in tree) + ("," if len(tree) == 1 else "")
            return inner if top and tree else f"({inner})"
        if isinstance(tree, list):
            return "[" + ", ".join(self.expr(v) for v in tree) + "]"
        if isinstance(tree, dict):
            return "{" + ", ".join(f"{k!r}: {self.expr(v)}" for k, v in tree.items()) + "}"
        return literal(tree, self.ctx)

    def _input(self, arg: str, path: tuple) -> str:
        key = ("input", arg)
        if key not in self.bound:
            self.bound[key] = f"_v{len(self.names)}_"
            self.names[self.bound[key]] = arg
        return index(self.bound[key], path)

    def ref_text(self, ref: Ref) -> str:
        node = self.nodes[ref.node]
        if node.kind == "input":
            arg, path = node.target
            return index(self._input(arg, path), ref.path)
        for k in range(len(ref.path), -1, -1):
            p = self.bound.get((ref.node, ref.path[:k]))
            if p is not None:
                return index(p, ref.path[k:])
        return index(self.node_text(ref.node), ref.path)

    def node_text(self, n: int) -> str:
        node, args, kwargs = self.nodes[n], self.args[n], self.kwargs[n]
        if node.kind in ("param", "buffer"):
            *owner, leaf = node.target.split(".")
            if not owner:
                return own_expr(leaf)
            owner_text = child_expr(".".join(owner), self.ctx.positions)
            return f"{owner_text}.{'params' if node.kind == 'param' else 'state'}[{leaf!r}]"
        if node.kind == "const":
            return literal(node.target, self.ctx)
        if node.kind == "dim":
            a, b = (self.expr(v) for v in args)
            return f"{atom(a)} {_DIM_OPS[node.target]} {atom(b)}"
        if node.kind == "child":
            parts = [self.expr(a) for a in args] + [f"{k}={self.expr(v)}" for k, v in kwargs.items()]
            return f"{child_expr(node.target, self.ctx.positions)}({', '.join(parts)})"
        if node.kind == "vmap":
            return vmap_call(node, *self.vmapped[n], self.expr)
        op = self.ctx.lookup(node.target)
        if op is None:
            raise ValueError(f"to_source: {node.target} has no entry in the op table ({node.where})")
        kw = _without_defaults(op.fn, {k: self.expr(v) for k, v in kwargs.items()})
        if op.random:
            kw["key"] = "self.key_or_none()"
        text = op.render([self.expr(a) for a in args], kw)
        if node.no_grad and node.target not in _SIZES and self._grad_escapes(n):
            text = f"jax.lax.stop_gradient({text})"
        return text

    def _grad_escapes(self, n: int) -> bool:
        """A value computed under no_grad that reaches code outside it (the outermost of a no_grad block)."""
        if any(r.node == n for r in _refs([self.output, list(self.state.values())])):
            return True
        return any(r.node == n and not self.nodes[m].no_grad for m in range(n + 1, len(self.nodes))
                   for r in self._node_refs(m))

    # ---- names
    def _named(self) -> list:
        """The statements with each placeholder replaced by its name: the preferred one unless an
        older value of that name is still used after this statement (then ``name_2``)."""
        last: dict = {}
        for i, (lines, _) in enumerate(self.stmts):
            for line in lines:
                for m in _PLACEHOLDER.finditer(line):
                    last[m.group(0)] = i
        taken = set(self.g.names.values()) | RESERVED | set(self.arg_paths)
        current = {self.names[p]: p for key, p in self.bound.items() if key[0] == "input"}
        final = {p: self.names[p] for p in current.values()}
        for i, (lines, defined) in enumerate(self.stmts):
            for p in defined:
                name = self.names[p]
                k = 1
                while name in current and current[name] != p and last.get(current[name], -1) > i:
                    k += 1
                    name = f"{self.names[p]}_{k}"
                    while name in taken and name not in current:
                        k += 1
                        name = f"{self.names[p]}_{k}"
                current[name] = p
                final[p] = name
        out = []
        for lines, _ in self.stmts:
            lines = [_PLACEHOLDER.sub(lambda m: final.get(m.group(0), m.group(0)), line) for line in lines]
            lines = [line for line in lines if not _is_self_assign(line)]
            if lines:
                out.append(lines)
        return _same_for_each(out)


def _common_name(names: dict, n: int, i) -> str | None:
    """The name of every entry of ``Ref(n, (i, ...))`` when they share one (``hidden`` for ``(h, c)``)."""
    found = {name for ref, name in names.items() if ref.node == n and ref.path[:1] == (i,) and len(ref.path) > 1}
    return found.pop() if len(found) == 1 else None


def _without_defaults(fn, kwargs: dict) -> dict:
    """The keyword arguments whose value is not the function's default (``inplace=False``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    out = {}
    for k, text in kwargs.items():
        p = params.get(k)
        if p is not None and p.default is not p.empty:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = _MISSING
            if value is not _MISSING and type(value) is type(p.default) and value == p.default:
                continue
        if k.startswith("_"):
            continue
        out[k] = text
    return out


_MISSING = object()


def graph_body(graph: Graph, ctx: Context) -> list:
    """The statements (lists of lines) of one recorded graph."""
    return _Body(graph, ctx).run()
