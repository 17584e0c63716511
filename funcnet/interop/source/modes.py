"""A forward's recorded variants as one body: ``if self.training: ... else: ...`` where train
and eval differ, ``if targets is None: ...`` where arguments picked different recordings,
the statements both branches share written once; and the ``def forward(...)`` signature."""

from __future__ import annotations

import ast
import io
import tokenize

from funcnet.interop.trace.graph import Graph
from funcnet.interop.source.forward import Context, graph_body
from funcnet.interop.source.text import atom, index, literal


def _indent(stmts: list) -> list:
    return ["    " + line for s in stmts for line in s]


def _negate(cond: str) -> str:
    if cond.endswith(" is not None"):
        return cond[: -len(" is not None")] + " is None"
    if cond.startswith("not "):
        return cond[4:]
    return f"not {atom(cond)}"


def branch(cond: str, a: list, b: list) -> list:
    """``if cond: a else: b`` with the statements both start and end with written once."""
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        s += 1
    mid_a, mid_b, tail = a[p:len(a) - s], b[p:len(b) - s], a[len(a) - s:]
    out = list(a[:p])
    if not mid_a and not mid_b:
        pass
    elif not mid_b:
        out.append([f"if {cond}:"] + _indent(mid_a))
    elif not mid_a:
        out.append([f"if {_negate(cond)}:"] + _indent(mid_b))
    elif not tail and mid_a[-1][0].startswith("return"):
        out.append([f"if {cond}:"] + _indent(mid_a))
        out.extend(mid_b)
    else:
        out.append([f"if {cond}:"] + _indent(mid_a) + ["else:"] + _indent(mid_b))
    return out + tail


def branches(cases: list) -> list:
    """``[(cond, statements), ..., (None, statements)]`` as one if/elif chain, factored."""
    cond, stmts = cases[0]
    if len(cases) == 1 or cond is None:
        return stmts
    return branch(cond, stmts, branches(cases[1:]))


def _facts(g: Graph) -> dict:
    out = {k: ("input",) for k in g.inputs}
    out.update({k: ("const", v) for k, v in g.constants.items()})
    return out


def _fact_text(key, fact) -> str:
    arg, path = key
    name = index(arg, path)
    if fact[0] == "input":
        return f"{name} is not None"
    value = fact[1]
    if value is None:
        return f"{name} is None"
    if value is True:
        return name
    if value is False:
        return f"not {name}"
    return f"{name} == {literal(value)}"


def _untraced_guards(g: Graph) -> list:
    """``if targets is None: raise ...`` for an optional argument the tracing always gave (or
    gave another value than its default): the path it would take was never recorded."""
    out = []
    for (arg, path), fact in _facts(g).items():
        p = g.signature.parameters.get(arg)
        if path or p is None or p.default is p.empty:
            continue
        if fact[0] == "input" and p.default is None:
            cond, what = f"{arg} is None", f"{arg} given"
        elif fact[0] == "const" and repr(fact[1]) != repr(p.default) and not isinstance(p.default, (list, dict)):
            cond, what = f"{arg} == {literal(p.default)}", f"{arg}={literal(fact[1])}"
        else:
            continue
        message = f"this path was not traced (traced with {what}); convert with example inputs that take it"
        out.append([f"if {cond}:", f"    raise ValueError({message!r})"])
    return out


def variants(graphs: list, ctx: Context) -> list:
    """The statements of a mode: one graph, or an if-chain over the arguments that picked each."""
    if len(graphs) == 1:
        return _untraced_guards(graphs[0]) + graph_body(graphs[0], ctx)
    facts = [_facts(g) for g in graphs]
    keys = [k for k in dict.fromkeys(k for f in facts for k in f)
            if len({repr(f.get(k)) for f in facts}) > 1]
    cases = []
    for i, (g, f) in enumerate(zip(graphs, facts)):
        cond = " and ".join(_fact_text(k, f.get(k, ("const", None))) for k in keys) or "True"
        cases.append((None if i == len(graphs) - 1 else cond, graph_body(g, ctx)))
    return branches(cases)


def body(modes: dict, ctx: Context) -> list:
    """The statements of ``forward`` for ``{"both": graphs}`` or ``{"train": ..., "eval": ...}``."""
    if "both" in modes:
        return variants(modes["both"], ctx)
    train, evaluation = modes.get("train"), modes.get("eval")
    if not train or not evaluation:
        mode = "eval" if train else "train"
        only = variants(train or evaluation, ctx)
        return branch("self.training" if mode == "train" else "not self.training",
                      [[f"raise ValueError('not called in {mode} mode when traced')"]], only)
    return branch("self.training", variants(train, ctx), variants(evaluation, ctx))


def signature(sig) -> str:
    """``self, x, targets=None``: torch's forward signature without annotations."""
    parts = ["self"]
    star = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.default is p.empty:
            parts.append(p.name)
        else:
            text = literal(p.default)
            try:
                ast.literal_eval(text)
            except (ValueError, SyntaxError):
                text = "None"
            parts.append(f"{p.name}={text}")
    return ", ".join(parts)


def masked(stmts: list) -> str:
    """The statements' text with every number as ``#``: forwards that differ only in constants
    (a head count, a width) have the same mask."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(_text(stmts)).readline))
    except (tokenize.TokenError, IndentationError):
        return _text(stmts)
    return " ".join("#" if t.type == tokenize.NUMBER else t.string for t in tokens)


def _text(stmts: list) -> str:
    return "\n".join(line for s in stmts for line in s)


def parameterized(members: list, forwards: list, arg_for) -> list:
    """One forward for instances whose forwards differ only in numbers: each differing number
    becomes an argument (``arg_for(values, hint, kind)``), named after an attribute of the torch
    modules that holds those values (``n_head``) where one does."""
    texts = [_text(f) for f in forwards]
    tokens = [list(tokenize.generate_tokens(io.StringIO(t).readline)) for t in texts]
    first = tokens[0]
    names = [n for n, v in vars(members[0]).items() if not n.startswith("_") and isinstance(v, (int, float))
             and not isinstance(v, bool)]
    replace = {}
    for i, tok in enumerate(first):
        if tok.type != tokenize.NUMBER or len({t[i].string for t in tokens}) == 1:
            continue
        values = tuple(ast.literal_eval(t[i].string) for t in tokens)
        hint = next((n for n in names if tuple(getattr(m, n, None) for m in members) == values), "n")
        replace[i] = arg_for(values, hint, "value").name
    lines = texts[0].split("\n")
    for i in sorted(replace, reverse=True):
        (row, col), (_, end) = first[i].start, first[i].end
        lines[row - 1] = lines[row - 1][:col] + replace[i] + lines[row - 1][end:]
    out, at = [], 0
    for s in forwards[0]:
        out.append(lines[at:at + len(s)])
        at += len(s)
    return out
