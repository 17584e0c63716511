"""What ``to_source`` writes a module tree as, and how: the specs of children (``Leaf`` layers,
``Container``s, ``TensorSpec`` parameters and buffers, ``Call``s of the written functions, a
function's ``Arg``s, ``Later`` for a subtree of a class being written) and ``render``, which
writes a spec as source broken over lines to fit the width."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np

from funcnet import nn
from funcnet.interop.source.text import is_name, literal

_TUPLE_ARGS = {"kernel_size", "stride", "padding", "dilation", "output_padding", "output_size", "scale_factor",
               "normalized_shape"}
_NO_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class Leaf:
    """A funcnet.nn layer call: the factory's name and its non-default arguments."""

    factory: str  # funcnet.nn.<factory>
    args: tuple  # ((name, value), ...): the non-default arguments, in the factory's order

    @staticmethod
    def of(factory: str, kwargs: dict) -> Leaf:
        """The Leaf of ``factory(**kwargs)``, keeping only the arguments that differ from the factory's defaults."""
        params = inspect.signature(getattr(nn, factory)).parameters
        items = []
        for name, value in kwargs.items():
            value = _compact(name, value)
            if name == "dtype" and np.dtype(value) == np.float32:
                continue
            p = params.get(name)
            if p is not None and p.default is not p.empty and _same(value, p.default):
                continue
            items.append((name, value))
        order = list(params)
        items.sort(key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
        return Leaf(factory, tuple(items))


@dataclasses.dataclass(frozen=True)
class Container:
    """An nn.Sequential, nn.ModuleList or nn.ModuleDict of specs."""

    kind: str  # nn.Sequential | nn.ModuleList | nn.ModuleDict
    items: tuple  # ((name, spec), ...)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A parameter or buffer of a module written as source: its kind, shape and dtype."""

    kind: str  # Parameter | Buffer
    shape: tuple
    dtype: str  # "" for the default float

    @staticmethod
    def of(kind: str, tensor) -> TensorSpec:
        """The TensorSpec of torch ``tensor`` (dtype name without ``torch.``; float32 is the empty default)."""
        name = str(tensor.dtype).replace("torch.", "")
        if name == "float32":
            name = ""
        elif name.startswith(("int", "uint")):
            name = "int"
        elif name == "bool":
            name = "bool"
        else:
            name = f"jnp.{name}"
        return TensorSpec(kind, tuple(int(s) for s in tensor.shape), name)


@dataclasses.dataclass(frozen=True)
class Call:
    """A call of a written function: positional arguments first, then those passed by keyword."""

    func: str
    args: tuple  # ((name, value), ...): positional first (those without a default)
    keywords: tuple  # names passed by keyword


@dataclasses.dataclass(frozen=True)
class Arg:
    """A reference to a constructor argument by name, in a class's written function."""

    name: str


@dataclasses.dataclass(eq=False)
class Later:
    """An instance of a class whose function is being written (a recursive tree: a ``Tree`` whose
    ``tree1`` is a ``Tree``): its call is known once that function is, and always passed as an argument."""

    id: int
    call: Call | None = None

    def __eq__(self, other):
        return isinstance(other, Later) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"Later({self.id})"


def _has_later(value) -> bool:
    """Whether ``value`` holds a subtree whose call is not known yet."""
    if isinstance(value, Later):
        return value.call is None
    if isinstance(value, (Leaf, Call)):
        return any(_has_later(v) for _, v in value.args)
    if isinstance(value, Container):
        return any(_has_later(v) for _, v in value.items)
    return isinstance(value, (tuple, list)) and any(_has_later(v) for v in value)


def _compact(name: str, value):
    """``(3, 3)`` as ``3`` where torch's constructor takes either (kernel_size, stride, ...)."""
    if name in _TUPLE_ARGS and isinstance(value, tuple) and value and all(v == value[0] for v in value) \
            and isinstance(value[0], (int, float)) and not isinstance(value[0], bool):
        return value[0]
    return value


def _same(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _is_literal(v) -> bool:
    if isinstance(v, tuple):
        return all(_is_literal(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str, np.dtype))


@dataclasses.dataclass(frozen=True)
class _Raw:
    text: str


def render(spec, col: int, width: int) -> str:
    """A spec (or a value) as source starting at column ``col``, broken over lines to fit ``width``."""
    if isinstance(spec, _Raw):
        return spec.text
    if isinstance(spec, Arg):
        return spec.name
    if isinstance(spec, Later):
        return render(spec.call, col, width)
    if isinstance(spec, Leaf):
        params = inspect.signature(getattr(nn, spec.factory)).parameters
        parts, positional = [], True
        for name, value in spec.args:
            p = params.get(name)
            positional = positional and p is not None and (p.default is p.empty or not parts) and \
                p.kind is p.POSITIONAL_OR_KEYWORD and list(params).index(name) == len(parts)
            parts.append((None if positional else name, value))
        return _call(f"nn.{spec.factory}", parts, col, width)
    if isinstance(spec, Container):
        if spec.kind == "nn.Sequential":
            return _call("nn.Sequential", [(None, v) for _, v in spec.items], col, width)
        if spec.kind == "NamedSequential":
            return _call("NamedSequential", keyword_parts(spec.items), col, width)
        if spec.kind == "nn.ModuleList":
            return _call("nn.ModuleList", [(None, _List([v for _, v in spec.items]))], col, width)
        return _call("nn.ModuleDict", [(None, _Dict(spec.items))], col, width)
    if isinstance(spec, TensorSpec):
        shape = render(spec.shape, col, width) if not isinstance(spec.shape, Arg) else spec.shape.name
        dtype = f", {spec.dtype}" if spec.dtype else ""
        return f"nn.{spec.kind}(jnp.zeros({shape}{dtype}))"
    if isinstance(spec, Call):
        return _call(spec.func, [(n if n in spec.keywords else None, v) for n, v in spec.args], col, width)
    if isinstance(spec, _List):
        return _brackets("[", "]", [(None, v) for v in spec.items], col, width)
    if isinstance(spec, _Dict):
        return _brackets("{", "}", [(f"{k!r}: ", v) for k, v in spec.items], col, width, sep="")
    if isinstance(spec, _Spread):
        return "**" + render(_Dict(spec.items), col + 2, width)
    if isinstance(spec, tuple) and any(isinstance(v, Arg) for v in spec):
        return "(" + ", ".join(render(v, col, width) for v in spec) + ("," if len(spec) == 1 else "") + ")"
    return literal(spec)


@dataclasses.dataclass(frozen=True)
class _List:
    items: list


@dataclasses.dataclass(frozen=True)
class _Dict:
    items: tuple


@dataclasses.dataclass(frozen=True)
class _Spread:
    items: tuple


_COMPOSITE_ARGS = {"name", "tied", "batch_axis"}


def keyword_parts(items) -> list:
    """``[(name, value), ...]`` as keyword arguments of a call: names that are no identifier
    (``"0"``, torch's ``add_module("0", ...)``) or that the factory takes itself go in a ``**{...}``
    at their place, so the children keep torch's order."""
    out: list = []
    for n, v in items:
        if is_name(n) and n not in _COMPOSITE_ARGS:
            out.append((n, v))
        elif out and isinstance(out[-1][1], _Spread):
            out[-1] = (None, _Spread(out[-1][1].items + ((n, v),)))
        else:
            out.append((None, _Spread(((n, v),))))
    return out


def _call(head: str, parts: list, col: int, width: int) -> str:
    return head + _brackets("(", ")", parts, col + len(head), width)


def _brackets(open_: str, close: str, parts: list, col: int, width: int, sep: str = "=") -> str:
    if not parts:
        return open_ + close
    flat = [(f"{k}{sep}" if k is not None else "") + render(v, 0, 10**9) for k, v in parts]
    one = open_ + ", ".join(flat) + close
    if col + len(one) <= width:
        return one
    inner = col + 1
    lines, cur = [], open_
    for (k, v), text in zip(parts, flat):
        at = (col if not lines else inner) + len(cur)
        if cur not in (open_, "") and at + len(text) + 1 > width:
            lines.append(cur.rstrip())
            cur, at = "", inner
        if at + len(text) + 1 > width:
            head = f"{k}{sep}" if k is not None else ""
            text = head + render(v, at + len(head), width)
        if "\n" in text:
            lines.append(cur + text + ",")
            cur = ""
        else:
            cur += text + ", "
    if cur:
        lines.append(cur[:-2] + close)
    else:
        lines[-1] = lines[-1][:-1] + close
    return ("\n" + " " * inner).join(lines)

