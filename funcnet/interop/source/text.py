"""Text helpers of ``to_source``: constants as source, ``self.h[0]`` paths, indexing and
parentheses where an expression becomes an operand."""

from __future__ import annotations

import ast
import keyword
import math
import re

import numpy as np

from funcnet.interop.ops._core import atom  # noqa: F401 (source_forward and source_modes import it here)


def child_expr(path: str, positions=frozenset()) -> str:
    """``self.h[0].attn`` for the dotted path ``"h.0.attn"``: a name that is not an identifier is
    ``getattr(self, "0")`` on ``self`` and ``self.layers["0"]`` below it, except an entry of a torch
    container that is also its position (``positions``: those dotted paths), indexed as ``[0]``."""
    parts = path.split(".")
    out = own_expr(parts[0])
    for k, part in enumerate(parts[1:], 2):
        if part.isdigit() and ".".join(parts[:k]) in positions:
            out += f"[{part}]"
        elif is_name(part):
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


def own_expr(name: str) -> str:
    """``self.weight``, or ``getattr(self, "0")`` for a name that is not an identifier."""
    return f"self.{name}" if is_name(name) else f"getattr(self, {name!r})"


def is_name(part: str) -> bool:
    """A name usable as ``self.<part>`` and as a keyword argument."""
    return part.isidentifier() and not keyword.iskeyword(part)


def index(text: str, path: tuple) -> str:
    """``text[i][j]``; an element of a tuple written out (``(a, (b,))``) is taken directly."""
    for p in path:
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError:
            tree = None
        if isinstance(tree, (ast.Tuple, ast.List)) and isinstance(p, int) and 0 <= p < len(tree.elts):
            text = ast.unparse(tree.elts[p])
        else:
            text = f"{atom(text)}[{p!r}]"
    return text


def literal(value, ctx=None) -> str:
    """A constant argument as source: dtypes as ``jnp.float32``, infinities as ``jnp.inf``; an
    array of more than 8 values becomes a module-level constant of ``ctx.constants``."""
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        name = np.dtype(value).name
        return "jnp.bool_" if name == "bool" else f"jnp.{name}"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "jnp.nan" if math.isnan(value) else ("jnp.inf" if value > 0 else "-jnp.inf")
    if value is Ellipsis:
        return "..."
    if isinstance(value, np.ndarray):
        dtype = literal(value.dtype)
        text = f"jnp.array({value.tolist()!r}, {dtype})"
        if value.size <= 8 or ctx is None:
            return text
        name = f"CONST_{len(ctx.constants)}"
        ctx.constants.append((name, text))
        return name
    if isinstance(value, tuple):
        return "(" + ", ".join(literal(v, ctx) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v, ctx) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {literal(v, ctx)}" for k, v in value.items()) + "}"
    return repr(value)


def _same_for_each(stmts: list) -> list:
    """``q = f(q)``, ``k = f(k)``, ``v = f(v)`` in a row as ``q, k, v = (f(t) for t in (q, k, v))``. A name
    counts as the variable only where it is one, not an attribute (``jnp.cos`` in ``cos = jnp.cos(f)``)."""
    def split(stmt):
        if len(stmt) != 1 or " = " not in stmt[0] or "'" in stmt[0] or '"' in stmt[0]:
            return None
        name, _, value = stmt[0].partition(" = ")
        if not name.isidentifier() or not re.search(rf"(?<![.\w]){name}\b", value):
            return None
        return name, value

    out, i = [], 0
    while i < len(stmts):
        first = split(stmts[i])
        j = i + 1
        if first is not None:
            var = next(v for v in ("t", "u", "w", "z_") if not re.search(rf"(?<![.\w]){v}\b", first[1]))
            shape = re.sub(rf"(?<![.\w]){first[0]}\b", var, first[1])
            names = [first[0]]
            while j < len(stmts):
                nxt = split(stmts[j])
                if nxt is None or nxt[0] in names or re.sub(rf"(?<![.\w]){nxt[0]}\b", var, nxt[1]) != shape \
                        or re.search(rf"(?<![.\w]){var}\b", nxt[1]):
                    break
                names.append(nxt[0])
                j += 1
            if len(names) > 1 and not any(re.search(rf"(?<![.\w]){a}\b", shape) for a in names):
                group = ", ".join(names)
                out.append([f"{group} = ({shape} for {var} in ({group}))"])
                i = j
                continue
        out.append(stmts[i])
        i += 1
    return out


def _is_tuple_literal(text: str) -> bool:
    try:
        return isinstance(ast.parse(text, mode="eval").body, ast.Tuple)
    except SyntaxError:
        return False


def _is_self_assign(line: str) -> bool:
    left, eq, right = line.partition(" = ")
    return bool(eq) and left == right and left.isidentifier()
