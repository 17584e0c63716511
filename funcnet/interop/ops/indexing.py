"""Indexing as torch: ``x[...]`` with ints, slices, None, Ellipsis and integer tensors;
``x[...] = v`` as ``x.at[...].set(v)``; masked_fill; scatter and index_add; and the in-place
fills (fill_, zero_, copy_) as the new value of the tensor."""

from __future__ import annotations

import ast

import jax.numpy as jnp

from funcnet.interop.ops._core import atom, call, is_array, register

__all__ = ["aten_index", "getitem", "masked_set", "setitem", "masked_fill", "scatter", "scatter_add", "index_add", "index_copy", "index_fill",
           "fill", "zero", "copy"]

_BOOL_MASK = ("indexing with a bool tensor (x[mask]) is masked_select: its output shape depends on the data, which "
              "JAX cannot trace; use torch.where(mask, x, 0) or multiply by the mask")


def _check_index(index):
    parts = index if isinstance(index, tuple) else (index,)
    for p in parts:
        if is_array(p) and jnp.asarray(p).dtype == jnp.bool_:
            raise ValueError(_BOOL_MASK)
        if isinstance(p, list) and any(isinstance(i, bool) for i in p):
            raise ValueError(_BOOL_MASK)
    return tuple(jnp.asarray(p) if isinstance(p, list) else p for p in parts) if isinstance(index, tuple) else (
        jnp.asarray(index) if isinstance(index, list) else index)


def getitem(input, index):
    """``x[index]``: basic and integer-tensor (advanced) indexing follow numpy's rules in both."""
    return jnp.asarray(input)[_check_index(index)]


def setitem(input, index, value):
    """``x[index] = value``: torch returns None and changes ``x``; here ``(None, (new x,))``.
    ``value`` takes x's dtype, as torch copies it in; a bool mask with a scalar is a ``where``."""
    x = jnp.asarray(input)
    mask = index[0] if isinstance(index, tuple) and len(index) == 1 else index
    if is_array(mask) and jnp.asarray(mask).dtype == jnp.bool_ and jnp.ndim(value) == 0:
        return None, (masked_set(x, mask, value),)
    return None, (x.at[_check_index(index)].set(jnp.asarray(value).astype(x.dtype)),)


def masked_set(input, mask, value):
    """``x[mask] = scalar`` (Wav2Vec2's ``hidden[~mask] = 0``) as the new ``x``: the mask (over
    ``x``'s leading axes) and not its count decides, so it is a ``where``, shape-static."""
    x = jnp.asarray(input)
    mask = jnp.asarray(mask).reshape(jnp.shape(mask) + (1,) * (x.ndim - jnp.ndim(mask)))
    return jnp.where(mask, jnp.asarray(value).astype(x.dtype), x)


def masked_fill(input, mask, value):
    """``value`` where ``mask`` (broadcast to x) is true; the result keeps x's dtype (a float
    value into an int tensor is truncated, as torch)."""
    x = jnp.asarray(input)
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"masked_fill: mask must be a bool tensor, got {mask.dtype} (torch refuses other dtypes); "
                        f"compare first, e.g. mask == 0")
    return jnp.where(mask, jnp.asarray(value).astype(x.dtype), x)


def _scatter_index(x, dim, index):
    idx = jnp.asarray(index)
    d = dim % x.ndim
    grids = jnp.meshgrid(*[jnp.arange(s) for s in idx.shape], indexing="ij")
    grids[d] = idx
    return tuple(grids), d


def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    """``out[index[i][j]][j] = src[i][j]`` (dim 0); ``src`` may be a number (torch's value form)."""
    x = jnp.asarray(input)
    where, _ = _scatter_index(x, dim, index)
    src = value if src is None else src
    shape = jnp.shape(index)
    vals = jnp.asarray(src)[tuple(slice(0, s) for s in shape)] if jnp.ndim(src) else jnp.broadcast_to(src, shape)
    vals = vals.astype(x.dtype)
    if reduce is None:
        return x.at[where].set(vals)
    if reduce in ("add", "sum"):
        return x.at[where].add(vals)
    if reduce in ("multiply", "prod"):
        return x.at[where].multiply(vals)
    raise ValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")


def scatter_add(input, dim, index, src):
    return scatter(input, dim, index, src, reduce="add")


def _index_axis(x, dim, index):
    d = dim % x.ndim
    return (slice(None),) * d + (jnp.reshape(index, (-1,)),), d


def index_add(input, dim, index, source, *, alpha=1):
    x = jnp.asarray(input)
    where, _ = _index_axis(x, dim, index)
    src = jnp.asarray(source).astype(x.dtype)
    return x.at[where].add(src if alpha == 1 else alpha * src)


def index_copy(input, dim, index, source):
    x = jnp.asarray(input)
    where, _ = _index_axis(x, dim, index)
    return x.at[where].set(jnp.asarray(source).astype(x.dtype))


def index_fill(input, dim, index, value):
    x = jnp.asarray(input)
    where, _ = _index_axis(x, dim, index)
    return x.at[where].set(jnp.asarray(value).astype(x.dtype))


def fill(input, value):
    """``x.fill_(v)``: x's shape and dtype, every element ``v``."""
    x = jnp.asarray(input)
    return jnp.full(x.shape, jnp.asarray(value).astype(x.dtype), x.dtype)


def zero(input):
    """``x.zero_()``."""
    x = jnp.asarray(input)
    return jnp.zeros(x.shape, x.dtype)


def copy(input, src, non_blocking=False):
    """``x.copy_(src)``: src broadcast to x's shape, in x's dtype."""
    x = jnp.asarray(input)
    return jnp.broadcast_to(jnp.asarray(src).astype(x.dtype), x.shape)


# ---- the table ------------------------------------------------------------------------------

class _Subscript(ast.NodeTransformer):
    """``slice(a, b, c)`` as ``a:b:c`` and ``Ellipsis`` as ``...`` inside a subscript."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "slice" and not node.keywords and len(node.args) <= 3:
            args = list(node.args)
            if len(args) == 1:
                args = [ast.Constant(None), args[0]]
            lo, hi, step = (args + [None, None, None])[:3]
            none = lambda n: n is None or (isinstance(n, ast.Constant) and n.value is None)  # noqa: E731
            return ast.Slice(None if none(lo) else lo, None if none(hi) else hi, None if none(step) else step)
        return node

    def visit_Name(self, node):
        return ast.Constant(...) if node.id == "Ellipsis" else node


def subscript(index: str) -> str:
    """A rendered index (``(slice(None, None, None), slice(None, T, None))``) as the text
    between brackets (``:, :T``)."""
    try:
        tree = ast.parse(index, mode="eval").body
    except SyntaxError:
        return index
    tree = _Subscript().visit(tree)
    text = ast.unparse(ast.Subscript(ast.Name("x"), tree))
    return text[2:-1]


def _getitem_source(a, k):
    return f"{atom(a[0])}[{subscript(a[1])}]"


def _setitem_source(a, k):
    return f"(None, ({atom(a[0])}.at[{subscript(a[1])}].set({a[2]}),))"


def _masked_fill_source(a, k):
    return call("ops.masked_fill", a, k)


def aten_index(input, indices):
    """``torch.ops.aten.index(x, [i, j])``: ``x[i, j]`` (torch's ``TransformGetItemToIndex`` writes
    ``x[i, j]`` with 0-d tensor indices as this inside a vmapped function)."""
    return getitem(input, tuple(indices))


def _aten_index_source(a, k):
    inner = a[1][1:-1] if a[1].startswith(("[", "(")) and a[1].endswith(("]", ")")) else f"*{a[1]}"
    return f"{atom(a[0])}[{inner}]"


def _register_table():
    register(["Tensor.__getitem__"], getitem, _getitem_source)
    register(["torch.ops.aten.index"], aten_index, _aten_index_source)
    register(["Tensor.__setitem__"], setitem, _setitem_source, mutates=(0,))
    register(["Tensor.__setitem__(bool mask)"], setitem, lambda a, k: f"(None, (ops.masked_set({a[0]}, {a[1]}, {a[2]}),))",
             mutates=(0,))
    register(["Tensor.masked_fill", "torch.masked_fill"], masked_fill, _masked_fill_source)
    register(["Tensor.scatter", "torch.scatter"], scatter, None)
    register(["Tensor.scatter_add", "torch.scatter_add"], scatter_add, None)
    register(["Tensor.index_add", "torch.index_add"], index_add, None)
    register(["Tensor.index_copy", "torch.index_copy"], index_copy, None)
    register(["Tensor.index_fill", "torch.index_fill"], index_fill, None)
    register(["Tensor.fill_"], fill, lambda a, k: call("jnp.full_like", a))
    register(["Tensor.zero_"], zero, lambda a, k: call("jnp.zeros_like", a))
    register(["Tensor.copy_"], copy, None)


_register_table()
