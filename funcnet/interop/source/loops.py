"""A loop over positions, unrolled by the recording, written as a loop again.

``for i in range(x.shape[1]): acc = f(acc, x[:, i]); out.append(g(acc))`` followed by
``torch.stack(out, 1)`` is recorded as ``n`` copies of the same nodes: the recording is a
program for one length. ``reroll(graph)`` finds such a run and puts one ``loop`` node in its
place, whose ``Loop`` target holds the steps' common body as a graph of its own:

- the run ends in a ``torch.stack``/``torch.cat`` of one value of each step, ``n >= 2`` steps
  of ``k`` nodes each, every step the same nodes as the first;
- a step reads the value another step made only from the step just before (a carry: ``acc``),
  the first step reading the value from before the loop in its place (its initial value);
- an int that is ``c + i`` in step ``i`` is the loop index (plus ``c``); every other constant
  and every value from before the loop is the same in every step;
- after the loop, only the stack and the last step's carries are read;
- ``n`` is a size the recording read before the loop (the closest one before it with that
  value): the loop runs ``range(that size)``.

The size is a guess from the values alone (two positions stacked at batch 2 look like a loop
over the batch), so ``to_source`` checks it as it checks every size: recorded again with the
input one larger, the rerolled program must be the same; it rerolls only where that leaves
generic every axis the program as recorded leaves generic (funcnet/interop/source/write.py,
``_free_axes``).
"""

from __future__ import annotations

import dataclasses
import inspect

from funcnet.interop.trace.graph import Graph, Node, Ref, Slice, Training, _frozen

_JOINS = ("torch.stack", "torch.cat", "torch.concat", "torch.concatenate")


class Loop:
    """A ``loop`` node's target: ``body`` (a Graph with inputs ``("index", ())``, the carries
    ``("carry{j}", ())`` and the values from before ``("outer{j}", ())``; output ``(carry0, ...,
    stepped)``), and how many carries and values from before its node's arguments hold after the count."""

    def __init__(self, body: Graph, carries: int, outer: int):
        self.body, self.carries, self.outer = body, carries, outer

    def key(self):
        """What the loop computes, for comparing two recordings (``Node.key``)."""
        return ("Loop", self.body.key(), self.carries, self.outer)

    def __eq__(self, other):
        return isinstance(other, Loop) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        return f"Loop({len(self.body.nodes)} nodes, {self.carries} carries)"


class _NoMatch(Exception):
    pass


def reroll(graph: Graph) -> Graph:
    """``graph`` with every unrolled loop over a size written as one ``loop`` node (the graph
    itself when it has none)."""
    start = 0
    while True:
        for s in range(start, len(graph.nodes)):
            found = _at(graph, s)
            if found is not None:
                graph, start = found
                break
        else:
            return graph


def _steps(graph: Graph, s: int):
    """``(refs, k)``: the stacked values of the join node ``s`` and the period between them."""
    node = graph.nodes[s]
    if node.kind != "op" or node.target not in _JOINS or not node.args:
        return None
    refs = node.args[0]
    if not isinstance(refs, list) or len(refs) < 2 or not all(isinstance(r, Ref) for r in refs):
        return None
    k = refs[1].node - refs[0].node
    if k < 1 or any(r.node != refs[0].node + i * k or r.path != refs[0].path for i, r in enumerate(refs)):
        return None
    return refs, k


def _at(graph: Graph, s: int):
    found = _steps(graph, s)
    if found is None:
        return None
    refs, k = found
    n = len(refs)
    for b in range(max(0, refs[0].node - k + 1), refs[0].node + 1):
        try:
            return _rewrite(graph, s, refs, b, k, n)
        except _NoMatch:
            continue
    return None


def _match(a, x, i: int, b: int, k: int, carries: dict):
    """The template of an argument of step 0 (``a``) against the same argument of step ``i`` (``x``)."""
    if isinstance(a, Ref) and isinstance(x, Ref):
        if a.path != x.path:
            raise _NoMatch
        if b <= a.node < b + k:  # a value of this step
            if x.node != a.node + i * k:
                raise _NoMatch
            return ("local", a.node - b, a.path)
        if a.node >= b:
            raise _NoMatch
        if x.node == a.node:  # a value from before the loop
            return ("outer", a)
        if i >= 1 and b + (i - 1) * k <= x.node < b + i * k:  # the step before's value: a carry
            slot = (x.node - b - (i - 1) * k, x.path)
            if carries.setdefault(slot, a) != a:
                raise _NoMatch
            return ("carry", slot)
        raise _NoMatch
    if isinstance(a, (Ref, Slice, Training)) or isinstance(x, (Ref, Slice, Training)):
        if type(a) is not type(x) or isinstance(a, Ref):
            raise _NoMatch
        return (type(a).__name__, *(_match(u, v, i, b, k, carries) for u, v in zip(a, x)))
    if isinstance(a, int) and not isinstance(a, bool) and isinstance(x, int) and not isinstance(x, bool) \
            and type(a) is type(x):
        if a == x:
            return ("const", a)
        if x == a + i:
            return ("index", a)
        raise _NoMatch
    if isinstance(a, (tuple, list)) and type(a) is type(x):
        if len(a) != len(x):
            raise _NoMatch
        return (type(a).__name__, *(_match(u, v, i, b, k, carries) for u, v in zip(a, x)))
    if isinstance(a, dict) and isinstance(x, dict):
        if list(a) != list(x):
            raise _NoMatch
        return ("dict", *((key, _match(a[key], x[key], i, b, k, carries)) for key in a))
    if _frozen(a) != _frozen(x):
        raise _NoMatch
    return ("const", _frozen(a))


def _rewrite(graph: Graph, s: int, refs: list, b: int, k: int, n: int):
    nodes = graph.nodes
    end = b + n * k  # the first node after the loop
    if end > s:
        raise _NoMatch
    carries: dict = {}  # (slot, path) -> its initial value (a Ref from before the loop)
    templates = []
    for j in range(k):
        first = nodes[b + j]
        if first.kind not in ("op", "child", "dim", "guard"):
            raise _NoMatch
        template = None
        for i in range(1, n):
            other = nodes[b + i * k + j]
            if (other.kind, _frozen(other.target), other.no_grad, other.structure) != \
                    (first.kind, _frozen(first.target), first.no_grad, first.structure):
                raise _NoMatch
            seen = _match((first.args, first.kwargs), (other.args, other.kwargs), i, b, k, carries)
            if template is None:
                template = seen
            elif _frozen(seen) != _frozen(template):
                raise _NoMatch
        templates.append(template)
    out_slot = (refs[0].node - b, refs[0].path)
    # after the loop: the stack, and the last step's carries
    last = b + (n - 1) * k
    after = [(m, r) for m in range(end, len(nodes)) for r in _refs((nodes[m].args, nodes[m].kwargs))]
    after += [(None, r) for r in _refs((graph.output, graph.state_out))]
    finals = {}
    for m, r in after:
        if r.node < b or r.node >= end:
            continue
        if m == s and r in refs:
            continue
        slot = (r.node - last, r.path) if r.node >= last else None
        if slot is None or slot not in carries:
            raise _NoMatch
        finals[slot] = True
    if any(r.node >= b and r.node < end for r in _refs(nodes[s].kwargs)) or \
            any(isinstance(a, Ref) and b <= a.node < end for a in nodes[s].args[1:]):
        raise _NoMatch
    count = _count(nodes, b, n)
    if count is None:
        raise _NoMatch
    return _build(graph, s, refs, b, k, n, templates, carries, out_slot, count)


def _refs(tree):
    if isinstance(tree, Ref):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _refs(v)
    elif isinstance(tree, (tuple, list)) and not isinstance(tree, Training):
        for v in tree:
            yield from _refs(v)


def _count(nodes: list, b: int, n: int):
    """The size read before node ``b`` whose value is ``n`` (the closest one), as a Ref."""
    for m in range(b - 1, -1, -1):
        value = nodes[m].value
        if nodes[m].kind not in ("op", "dim") or value is None:
            continue
        if isinstance(value, tuple):
            for p in range(len(value) - 1, -1, -1):
                if value[p] == n:
                    return Ref(m, (p,))
        elif value == n:
            return Ref(m)
    return None


def _build(graph: Graph, s, refs, b, k, n, templates, carries, out_slot, count):
    nodes = graph.nodes
    carry_slots = list(carries)
    body_nodes = [Node("input", ("index", ()))]
    inputs = {("index", ()): 0}
    for j, slot in enumerate(carry_slots):
        inputs[(f"carry{j}", ())] = len(body_nodes)
        body_nodes.append(Node("input", (f"carry{j}", ())))
    outer: dict = {}  # outer Ref -> its input node in the body
    offsets: dict = {}  # c -> the node of ``index + c``
    local = {}  # step-0 node -> body node

    def value(t):
        kind = t[0]
        if kind == "local":
            return Ref(local[b + t[1]], t[2])
        if kind == "carry":
            return Ref(inputs[(f"carry{carry_slots.index(t[1])}", ())])
        if kind == "outer":
            ref = t[1]
            if ref not in outer:
                key = (f"outer{len(outer)}", ())
                inputs[key] = len(body_nodes)
                outer[ref] = len(body_nodes)
                body_nodes.append(Node("input", key))
            return Ref(outer[ref])
        if kind == "index":
            if t[1] == 0:
                return Ref(0)
            if t[1] not in offsets:
                offsets[t[1]] = len(body_nodes)
                body_nodes.append(Node("dim", "add", (Ref(0), t[1])))
            return Ref(offsets[t[1]])
        if kind == "const":
            return t[1]
        if kind == "Slice":
            return Slice(*(value(v) for v in t[1:]))
        if kind == "Training":
            return Training(*(value(v) for v in t[1:]))
        if kind in ("tuple", "list"):
            items = [value(v) for v in t[1:]]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            return {key: value(v) for key, v in t[1:]}
        raise AssertionError(kind)

    for j in range(k):
        first = nodes[b + j]
        args, kwargs = value(templates[j])  # step 0 read a carry's initial value where the template says "carry"
        body_nodes.append(dataclasses.replace(first, args=tuple(args), kwargs=dict(kwargs)))
        local[b + j] = len(body_nodes) - 1
    # constants kept by value in the templates were frozen: read them back from step 0 instead
    for j in range(k):
        first = nodes[b + j]
        node = body_nodes[local[b + j]]
        body_nodes[local[b + j]] = dataclasses.replace(
            node, args=_unfreeze(node.args, first.args), kwargs=_unfreeze(node.kwargs, first.kwargs))
    output = tuple(Ref(local[b + slot[0]], slot[1]) for slot in carry_slots) + \
        (Ref(local[b + out_slot[0]], out_slot[1]),)
    names = {Ref(local[r.node], r.path): name for r, name in graph.names.items() if b <= r.node < b + k
             and not (r == refs[0] and out_slot not in carries)}  # a value appended is named by its list
    for j, slot in enumerate(carry_slots):
        name = graph.names.get(Ref(b + slot[0], slot[1]))
        if name:
            names[Ref(inputs[(f"carry{j}", ())])] = name
    for ref, m in outer.items():
        if ref in graph.names:
            names[Ref(m)] = graph.names[ref]
    signature = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                   for name, _ in inputs])
    body = Graph(signature, body_nodes, inputs, {}, output, {}, names)
    loop_args = (count, *(carries[slot] for slot in carry_slots), *outer)
    structure = tuple(None for _ in carry_slots) + (tuple(None for _ in refs),)
    loop = Node("loop", Loop(body, len(carry_slots), len(outer)), loop_args, {}, where=nodes[b].where,
                structure=structure)
    # the new graph: nodes before b, the loop at b, then the rest shifted by n * k - 1
    shift = n * k - 1
    last = b + (n - 1) * k

    def moved(tree):
        if isinstance(tree, Ref):
            if tree.node < b:
                return tree
            if tree.node >= b + n * k:
                return Ref(tree.node - shift, tree.path)
            slot = (tree.node - last, tree.path)
            return Ref(b, (carry_slots.index(slot),))
        if isinstance(tree, Slice):
            return Slice(*(moved(v) for v in tree))
        if isinstance(tree, Training):
            return tree
        if isinstance(tree, tuple):
            return tuple(moved(v) for v in tree)
        if isinstance(tree, list):
            return [moved(v) for v in tree]
        if isinstance(tree, dict):
            return {key: moved(v) for key, v in tree.items()}
        return tree

    new_nodes = list(nodes[:b]) + [loop]
    for m in range(b + n * k, len(nodes)):
        node = nodes[m]
        if m == s:
            args = (Ref(b, (len(carry_slots),)), *moved(node.args[1:]))
            new_nodes.append(dataclasses.replace(node, args=args, kwargs=moved(node.kwargs)))
        else:
            new_nodes.append(dataclasses.replace(node, args=moved(node.args), kwargs=moved(node.kwargs)))
    names = {moved(r) if not (b <= r.node < b + n * k) else None: name for r, name in graph.names.items()}
    names.pop(None, None)
    for j, slot in enumerate(carry_slots):  # after the loop, a carry has the name of its last value
        name = graph.names.get(Ref(last + slot[0], slot[1]))
        if name:
            names[Ref(b, (j,))] = name
    if refs[0] in graph.names:  # the list appended to (name_locals names its items by it)
        names[Ref(b, (len(carry_slots),))] = graph.names[refs[0]]
    new = dataclasses.replace(
        graph, nodes=new_nodes, inputs={key: (v if v < b else v - shift) for key, v in graph.inputs.items()},
        output=moved(graph.output), state_out={key: moved(v) for key, v in graph.state_out.items()}, names=names)
    return new, b + 1


def _unfreeze(template_value, original):
    """``template_value`` with each constant put back as step 0 holds it (the templates keep frozen ones)."""
    if isinstance(template_value, (Ref, Training)):
        return template_value
    if isinstance(template_value, Slice):
        return Slice(*(_unfreeze(u, v) for u, v in zip(template_value, original)))
    if isinstance(template_value, (tuple, list)) and isinstance(original, (tuple, list)) \
            and len(template_value) == len(original):
        items = [_unfreeze(u, v) for u, v in zip(template_value, original)]
        return tuple(items) if isinstance(template_value, tuple) else items
    if isinstance(template_value, dict) and isinstance(original, dict):
        return {key: _unfreeze(template_value[key], original.get(key)) for key in template_value}
    if isinstance(original, Ref):  # the index written as index + c
        return template_value
    return original


def write_loop(b, n: int, graph_body, reserved) -> None:
    """The statements of a rerolled loop node ``n`` of the body ``b`` (forward.py's ``_Body``):
    ``def step(i, carry, ...)`` with its body, then ``for i in range(size): carry, out = step(i, carry,
    ...); outs.append(out)``; ``graph_body`` writes the step's statements, ``reserved`` the names it may not take."""
    loop, args = b.nodes[n].target, b.args[n]
    count, inits, outer = args[0], args[1:1 + loop.carries], args[1 + loop.carries:]
    body = loop.body
    renamed, params = {}, []
    for key, m in body.inputs.items():
        ref = Ref(m)
        if key[0] == "index":
            want = "i"
        elif key[0].startswith("carry"):
            want = body.names.get(ref) or "carry"
        else:
            want = b.g.names.get(outer[int(key[0][len("outer"):])]) or "value"
        name, k = want, 1
        while name in params or name in reserved:
            k += 1
            name = f"{want}_{k}"
        params.append(name)
        renamed[key] = (name, ())
    *nexts, stepped = body.output
    shared = nexts.index(stepped) if stepped in nexts else None  # the value kept is a carry (acc): not returned twice
    returned = list(nexts) if shared is not None else [*nexts, stepped]
    output = returned[0] if len(returned) == 1 else tuple(returned)
    graph = dataclasses.replace(
        body, output=output, inputs={renamed[key]: m for key, m in body.inputs.items()},
        nodes=[dataclasses.replace(m, target=renamed[m.target]) if m.kind == "input" else m for m in body.nodes],
        names={r: v for r, v in body.names.items() if body.nodes[r.node].kind != "input"})
    fn = b._placeholder(("loop", n), "step")
    lines = [f"def {fn}({', '.join(params)}):"] + ["    " + line for stmt in graph_body(graph, b.ctx)
                                                   for line in stmt]
    b.stmts.append((lines, [fn]))
    carries = []
    for j, init in enumerate(inits):
        p = b._placeholder((n, (j,)), b.g.names.get(Ref(n, (j,))) or params[1 + j])
        b.stmts.append(([f"{p} = {b.expr(init)}"], [p]))
        carries.append(p)
    listed = b.g.names.get(Ref(n, (loop.carries,)))
    if not listed or listed in {b.names[p] for p in carries}:  # named by its items, which are a carry's
        listed = f"{listed or 'step'}s"
    steps = b._placeholder((n, (loop.carries,)), listed)
    i = b._placeholder(("loop index", n), "i")
    out = b._placeholder(("loop out", n), "out") if shared is None else carries[shared]
    call = ", ".join([i, *carries, *(b.expr(v) for v in outer)])
    got = carries if shared is not None else [*carries, out]
    b.stmts.append(([f"{steps} = []", f"for {i} in range({b.expr(count)}):",
                        f"    {', '.join(got)} = {fn}({call})",
                        f"    {steps}.append({out})"], [steps, i, *dict.fromkeys([out, *carries])]))
