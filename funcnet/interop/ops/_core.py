"""The op table's building blocks: ``Op``, the table ``OPS``, torch's dtype rules and the
helpers that write a call as Python source."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

# torch.get_default_dtype(): what a float factory or a division of integers makes
DEFAULT_FLOAT = jnp.float32


@dataclasses.dataclass(frozen=True)
class Op:
    """One torch function, method or attribute read as JAX.

    - ``fn``: the JAX implementation, called with torch's positional and keyword arguments
      (jax arrays for tensors, jnp dtypes for torch dtypes, None for devices).
    - ``source(args, kwargs) -> str``: the call written as Python from the already rendered
      argument strings; ``None`` writes ``ops.<fn.__name__>(...)``. The string evaluates (with
      ``F``, ``jnp`` and ``ops`` in scope) to what ``fn`` returns.
    - ``random``: ``fn`` takes ``key=``, a fresh PRNG key.
    - ``mutates``: the arguments (by position in torch's signature) torch changes in place;
      ``fn`` then returns ``(result, (new value of each, ...))``. A call may pass them by
      keyword: ``mutated_places`` says where they are.
    """

    fn: Callable
    source: Callable[[list[str], dict[str, str]], str] | None = None
    random: bool = False
    mutates: tuple[int, ...] = ()

    def render(self, args: list[str], kwargs: dict[str, str]) -> str:
        if self.source is not None:
            return self.source(list(args), dict(kwargs))
        return ops_source(self.fn)(list(args), dict(kwargs))


OPS: dict[str, Op] = {}


def mutated_places(op: Op, args, kwargs) -> list:
    """Where each argument of ``op.mutates`` sits in one call: its position in ``args``, or its
    keyword in ``kwargs`` (torch's Python functionals pass some by keyword: F.instance_norm
    hands ``running_mean=`` to TorchFunctionMode). The i-th parameter of ``op.fn`` is torch's."""
    names = list(inspect.signature(op.fn).parameters)
    return [i if i < len(args) else names[i] for i in op.mutates]


def register(names, fn, source=None, *, random: bool = False, mutates: tuple[int, ...] = ()) -> None:
    """``OPS[name] = Op(...)`` for each name of ``names`` (a string or a list of them)."""
    for name in [names] if isinstance(names, str) else names:
        if name in OPS:
            raise ValueError(f"op table: {name!r} is registered twice")
        OPS[name] = Op(fn, source, random, tuple(mutates))


# ---- dtypes ---------------------------------------------------------------------------------

def jdtype(dtype):
    """A torch dtype, already a jnp dtype, as the dtype JAX runs: int64 is int32 with JAX's
    64-bit types off (as ``interop.from_torch`` stores it); float64 without them is refused
    rather than silently computed in float32."""
    if dtype is None:
        return None
    d = jnp.dtype(dtype)
    if d in (np.dtype(np.float64), np.dtype(np.complex128)) and not jax.config.jax_enable_x64:
        raise TypeError(f"the torch code asks for {d}, but JAX runs with 64-bit types off (x64), so it would "
                        f"silently be 32-bit; set JAX_ENABLE_X64=1 before JAX starts (or `with "
                        f"jax.enable_x64(True):`), or use float32 in the model")
    return jax.dtypes.canonicalize_dtype(d)


def long_dtype():
    """torch.int64 as JAX runs it."""
    return jax.dtypes.canonicalize_dtype(jnp.int64)


def _category(dtype) -> int:
    if dtype == jnp.bool_:
        return 0
    if jnp.issubdtype(dtype, jnp.integer):
        return 1
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return 3
    return 2


def _scalar_dtype(value):
    if isinstance(value, bool):
        return jnp.dtype(jnp.bool_)
    if isinstance(value, int):
        return jnp.dtype(jnp.int64)
    if isinstance(value, complex):
        return jnp.dtype(jnp.complex64)
    return jnp.dtype(DEFAULT_FLOAT)


def is_array(value) -> bool:
    return hasattr(value, "dtype") and hasattr(value, "shape")


def result_type(*operands):
    """torch's type promotion (torch.result_type): tensors with dimensions decide, a 0-d tensor
    only when its category (bool < int < float < complex) is higher, a Python number only when
    its category is higher still, and then as torch's default for it (float32, int64)."""
    groups: list = [None, None, None]  # dimensioned, 0-d, Python numbers
    for value in operands:
        if value is None:
            continue
        if is_array(value):
            g, d = (0 if np.ndim(value) else 1), jnp.dtype(value.dtype)
        else:
            g, d = 2, _scalar_dtype(value)
        groups[g] = d if groups[g] is None else jnp.promote_types(groups[g], d)
    result = None
    for d in groups:
        if d is not None and (result is None or _category(d) > _category(result)):
            result = d
    return jax.dtypes.canonicalize_dtype(result)


def promote(*operands):
    """The operands as arrays of torch's result dtype (None stays None)."""
    dt = result_type(*operands)
    return tuple(None if v is None else jnp.asarray(v).astype(dt) for v in operands)


def as_float(x):
    """An integer or bool input as torch's default float (what torch.exp(int_tensor) does)."""
    x = jnp.asarray(x)
    return x if _category(x.dtype) >= 2 else x.astype(DEFAULT_FLOAT)


def dims(dim, ndim: int):
    """torch's ``dim`` (None, an int, or a sequence) as a tuple of non-negative axes, or None."""
    if dim is None:
        return None
    seq = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % max(ndim, 1) for d in seq)


def sizes(args):
    """``f(2, 3)``, ``f((2, 3))`` and ``f([2, 3])`` as the tuple (2, 3), as torch reads a size."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    return tuple(int(a) for a in args)


# ---- source ---------------------------------------------------------------------------------

_OPERATORS = set(" +-*/@%<>=&|~^!:,")


def atom(s: str) -> str:
    """``s`` in parentheses unless it already binds tighter than any operator (a name, a
    number, a call, an attribute, a subscript or a bracketed expression)."""
    depth, quote = 0, None
    for i, c in enumerate(s):
        if quote:
            if c == quote and s[i - 1] != "\\":
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c in _OPERATORS:
            if c == "-" and i == 0 and re.fullmatch(r"-\d+(\.\d*)?(e-?\d+)?", s):
                continue  # a negative literal: fine as an operand, not as a base of ** (see strong)
            return f"({s})"
    return s


def strong(s: str) -> str:
    """``s`` as an atom that may also stand left of ``**`` or after a unary minus."""
    s = atom(s)
    return f"({s})" if s.startswith("-") else s


def call(name: str, args, kwargs=None) -> str:
    parts = list(args) + [f"{k}={v}" for k, v in (kwargs or {}).items()]
    return f"{name}({', '.join(parts)})"


def literal(s: str):
    """The value of a rendered argument that is a literal, else the marker ``NOT_LITERAL``."""
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return NOT_LITERAL


NOT_LITERAL = object()


def bind(fn, args, kwargs) -> dict:
    """The rendered arguments of a call of ``fn`` by parameter name (``*args`` as a tuple);
    parameters not given are missing."""
    return dict(inspect.signature(fn).bind(*args, **kwargs).arguments)


def drop_defaults(fn, bound: dict) -> dict:
    """``bound`` without the arguments whose rendered value is the literal default."""
    params = inspect.signature(fn).parameters
    out = {}
    for name, value in bound.items():
        p = params.get(name)
        if (p is not None and p.default is not inspect.Parameter.empty and isinstance(value, str)
                and literal(value) is not NOT_LITERAL and literal(value) == p.default
                and type(literal(value)) is type(p.default)):
            continue
        out[name] = value
    return out


def ops_source(fn):
    """The default rendering ``ops.<name>(...)``, with arguments equal to their default dropped
    (a positional argument after a dropped one goes by name)."""
    params = inspect.signature(fn).parameters

    def render(args, kwargs):
        try:
            kept = drop_defaults(fn, bind(fn, args, kwargs))
        except TypeError:
            return call(f"ops.{fn.__name__}", args, kwargs)
        pos, kw, gap = [], {}, False
        for name, p in params.items():
            if name not in kept:
                gap = gap or p.kind is not inspect.Parameter.VAR_POSITIONAL
                continue
            value = kept[name]
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                pos.extend(value)
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                kw.update(value)
            elif p.kind is inspect.Parameter.KEYWORD_ONLY or (gap and p.kind is not inspect.Parameter.POSITIONAL_ONLY):
                kw[name] = value
            else:
                pos.append(value)
        return call(f"ops.{fn.__name__}", pos, kw)

    return render


def method_source(name: str):
    """``self.name(rest...)``: for jnp array methods whose meaning is torch's."""

    def render(args, kwargs):
        return call(f"{atom(args[0])}.{name}", args[1:], kwargs)

    return render


def jnp_source(name: str, rename: dict | None = None):
    """``jnp.name(args..., kw=...)`` with torch's keyword names mapped by ``rename``."""

    def render(args, kwargs):
        return call(f"jnp.{name}", args, {(rename or {}).get(k, k): v for k, v in kwargs.items()})

    return render
