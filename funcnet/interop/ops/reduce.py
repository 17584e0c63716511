"""Reductions as torch: sum, mean, max/min (with the ``(values, indices)`` pair over a dim),
argmax, var/std with torch's correction, norm, logsumexp, cumulative sums, topk, sort."""

from __future__ import annotations

import builtins
from typing import NamedTuple

import jax
import jax.numpy as jnp

from funcnet.interop.ops._core import (NOT_LITERAL, _category, as_float, call, dims, jdtype, literal,
                                       long_dtype, register)

__all__ = ["sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std", "var_mean",
           "std_mean", "norm", "vector_norm", "logsumexp", "cumsum", "cumprod", "all", "any", "topk", "sort",
           "argsort", "ValuesIndices", "count_nonzero", "aminmax", "diff"]


class ValuesIndices(NamedTuple):
    """torch.return_types.max and friends: ``values, indices = x.max(dim)`` or ``.values``."""

    values: jax.Array
    indices: jax.Array


def _axis(dim, x):
    """torch's dim as jnp's axis: an empty sequence reduces every axis, as torch.sum(x, ())."""
    d = dims(dim, jnp.ndim(x))
    return d if d else None


def sum(input, dim=None, keepdim=False, *, dtype=None, out=None):  # noqa: A001
    """Integers and bools sum to int64 (int32 with JAX's 64-bit types off), as torch."""
    x = jnp.asarray(input)
    if dtype is None and _category(x.dtype) <= 1:
        dtype = long_dtype()
    return jnp.sum(x, axis=_axis(dim, x), keepdims=keepdim, dtype=jdtype(dtype))


def mean(input, dim=None, keepdim=False, *, dtype=None, out=None):
    x = jnp.asarray(input)
    if dtype is not None:
        x = x.astype(jdtype(dtype))
    return jnp.mean(x, axis=_axis(dim, x), keepdims=keepdim)


def prod(input, dim=None, keepdim=False, *, dtype=None, out=None):
    x = jnp.asarray(input)
    if dtype is None and _category(x.dtype) <= 1:
        dtype = long_dtype()
    return jnp.prod(x, axis=_axis(dim, x), keepdims=keepdim, dtype=jdtype(dtype))


def amax(input, dim=(), keepdim=False, *, out=None):
    x = jnp.asarray(input)
    return jnp.max(x, axis=None if dim in ((), []) else _axis(dim, x), keepdims=keepdim)


def amin(input, dim=(), keepdim=False, *, out=None):
    x = jnp.asarray(input)
    return jnp.min(x, axis=None if dim in ((), []) else _axis(dim, x), keepdims=keepdim)


def _extreme(input, dim, keepdim, other, reduce, arg, pair, name):
    x = jnp.asarray(input)
    if hasattr(dim, "shape"):  # torch.max(x, other_tensor): element-wise
        other, dim = dim, None
    if other is not None:
        from funcnet.interop.ops.arith import maximum, minimum

        return (maximum if name == "max" else minimum)(x, other)
    if dim is None:
        return reduce(x)
    axis = dim % builtins.max(x.ndim, 1)
    return pair(reduce(x, axis=axis, keepdims=keepdim),
                arg(x, axis=axis, keepdims=keepdim).astype(long_dtype()))


def max(input, dim=None, keepdim=False, *, other=None, out=None):  # noqa: A001
    """``max(x)`` the largest value; ``max(x, dim)`` a ``(values, indices)`` pair;
    ``max(x, y)`` the element-wise maximum. NaN wins, as torch."""
    return _extreme(input, dim, keepdim, other, jnp.max, jnp.argmax, ValuesIndices, "max")


def min(input, dim=None, keepdim=False, *, other=None, out=None):  # noqa: A001
    return _extreme(input, dim, keepdim, other, jnp.min, jnp.argmin, ValuesIndices, "min")


def aminmax(input, *, dim=None, keepdim=False, out=None):
    return amin(input, () if dim is None else dim, keepdim), amax(input, () if dim is None else dim, keepdim)


def argmax(input, dim=None, keepdim=False, *, out=None):
    x = jnp.asarray(input)
    if dim is None:
        r = jnp.argmax(x.reshape(-1))
        return (r.reshape((1,) * x.ndim) if keepdim else r).astype(long_dtype())
    return jnp.argmax(x, axis=dim, keepdims=keepdim).astype(long_dtype())


def argmin(input, dim=None, keepdim=False, *, out=None):
    x = jnp.asarray(input)
    if dim is None:
        r = jnp.argmin(x.reshape(-1))
        return (r.reshape((1,) * x.ndim) if keepdim else r).astype(long_dtype())
    return jnp.argmin(x, axis=dim, keepdims=keepdim).astype(long_dtype())


def _correction(dim, unbiased, correction, keepdim, where):
    """torch's overloads: ``var(dim, unbiased, keepdim)``, ``var(unbiased)`` and
    ``var(dim, *, correction, keepdim)``; the default correction is 1 (Bessel)."""
    if isinstance(dim, bool):  # var(True): the old unbiased= positional form
        dim, unbiased = None, dim
    if isinstance(unbiased, bool) and not isinstance(keepdim, bool):
        raise TypeError(f"{where}: keepdim must be a bool, got {keepdim!r}")
    if correction is not None and unbiased is not None:
        raise TypeError(f"{where}: pass either unbiased= or correction=, not both")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, correction


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
    dim, c = _correction(dim, unbiased, correction, keepdim, "var")
    x = jnp.asarray(input)
    return jnp.var(x, axis=_axis(dim, x), ddof=c, keepdims=keepdim)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
    dim, c = _correction(dim, unbiased, correction, keepdim, "std")
    x = jnp.asarray(input)
    return jnp.std(x, axis=_axis(dim, x), ddof=c, keepdims=keepdim)


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return (var(input, dim, unbiased, keepdim, correction=correction),
            mean(input, dim if not isinstance(dim, bool) else None, keepdim))


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return (std(input, dim, unbiased, keepdim, correction=correction),
            mean(input, dim if not isinstance(dim, bool) else None, keepdim))


def _safe_sqrt(s):
    """sqrt with gradient 0 at 0, as torch's norm backward (JAX's is NaN there)."""
    zero = s == 0
    return jnp.where(zero, 0.0, jnp.sqrt(jnp.where(zero, 1.0, s))).astype(s.dtype)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):  # noqa: A002
    """torch.linalg.vector_norm: ``(sum |x|^ord)^(1/ord)`` over ``dim`` (all axes by default)."""
    x = as_float(x if dtype is None else jnp.asarray(x).astype(jdtype(dtype)))
    axis = _axis(dim, x)
    a = jnp.abs(x)
    if ord == 2:
        return _safe_sqrt(jnp.sum(x * x, axis=axis, keepdims=keepdim))
    if ord in (float("inf"), "inf"):
        return jnp.max(a, axis=axis, keepdims=keepdim)
    if ord in (float("-inf"), "-inf"):
        return jnp.min(a, axis=axis, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axis, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(a != 0, axis=axis, keepdims=keepdim).astype(x.dtype)
    return jnp.sum(a ** ord, axis=axis, keepdims=keepdim) ** (1.0 / ord)


def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    """torch.norm / Tensor.norm for vector norms (``'fro'`` over any dims is the 2-norm);
    ``p='nuc'`` is refused."""
    if p == "nuc":
        raise ValueError("norm: p='nuc' (the nuclear norm) is not supported; use torch.linalg.matrix_norm in the "
                         "model, or jnp.linalg.norm(x, 'nuc') in JAX")
    return vector_norm(input, 2 if p in ("fro", None) else p, dim, keepdim, dtype=dtype)


def logsumexp(input, dim, keepdim=False, *, out=None):
    x = as_float(input)
    return jax.nn.logsumexp(x, axis=_axis(dim, x), keepdims=keepdim)


def cumsum(input, dim, *, dtype=None, out=None):
    x = jnp.asarray(input)
    if dtype is None and _category(x.dtype) <= 1:
        dtype = long_dtype()
    return jnp.cumsum(x, axis=dim, dtype=jdtype(dtype))


def cumprod(input, dim, *, dtype=None, out=None):
    x = jnp.asarray(input)
    if dtype is None and _category(x.dtype) <= 1:
        dtype = long_dtype()
    return jnp.cumprod(x, axis=dim, dtype=jdtype(dtype))


def diff(input, n=1, dim=-1, prepend=None, append=None):
    """torch.diff: ``prepend``/``append`` joined on ``dim`` first, then ``n`` forward differences
    (a bool input gives ``!=`` of neighbours, as torch's logical xor)."""
    x = jnp.asarray(input)
    parts = [jnp.asarray(p).astype(x.dtype) for p in (prepend,) if p is not None] + [x]
    parts += [jnp.asarray(a).astype(x.dtype) for a in (append,) if a is not None]
    x = jnp.concatenate(parts, axis=dim) if len(parts) > 1 else x
    for _ in range(n):
        x = jnp.diff(x, axis=dim) if x.dtype != jnp.bool_ else x[_slice(x, dim, 1, None)] != x[_slice(x, dim, None, -1)]
    return x


def _slice(x, dim, start, stop):
    index = [slice(None)] * x.ndim
    index[dim % x.ndim] = slice(start, stop)
    return tuple(index)


def all(input, dim=None, keepdim=False, *, out=None):  # noqa: A001
    x = jnp.asarray(input)
    return jnp.all(x, axis=_axis(dim, x), keepdims=keepdim)


def any(input, dim=None, keepdim=False, *, out=None):  # noqa: A001
    x = jnp.asarray(input)
    return jnp.any(x, axis=_axis(dim, x), keepdims=keepdim)


def count_nonzero(input, dim=None):
    x = jnp.asarray(input)
    return jnp.sum(x != 0, axis=_axis(dim, x)).astype(long_dtype())


def topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):  # noqa: A002
    """``(values, indices)`` of the k largest (or smallest) along ``dim``, largest first."""
    x = jnp.moveaxis(jnp.asarray(input), dim, -1)
    values, indices = jax.lax.top_k(x if largest else -x, k)
    values = values if largest else -values
    return ValuesIndices(jnp.moveaxis(values, -1, dim), jnp.moveaxis(indices, -1, dim).astype(long_dtype()))


def sort(input, dim=-1, descending=False, stable=False, *, out=None):
    x = jnp.asarray(input)
    idx = jnp.argsort(x, axis=dim, stable=True, descending=descending)
    return ValuesIndices(jnp.take_along_axis(x, idx, axis=dim), idx.astype(long_dtype()))


def argsort(input, dim=-1, descending=False, stable=False):
    return jnp.argsort(input, axis=dim, stable=True, descending=descending).astype(long_dtype())


# ---- the table ------------------------------------------------------------------------------

def _reduce_source(jname, fn):
    """``jnp.sum(x, axis=1, keepdims=True)`` when the call is plain (jnp sums integers to its
    default int as torch does to int64); ``ops.<name>`` otherwise (a dtype= argument)."""
    from funcnet.interop.ops._core import bind, ops_source

    def render(args, kwargs):
        b = bind(fn, args, kwargs)
        if builtins.any(k not in ("input", "dim", "keepdim") for k in b):
            return ops_source(fn)(args, kwargs)
        kw = {}
        d = literal(b.get("dim", "None"))
        if d not in (None, (), []):
            kw["axis"] = repr(tuple(d)) if isinstance(d, list) else b["dim"]
        if "keepdim" in b and literal(b["keepdim"]) is not False:
            kw["keepdims"] = b["keepdim"]
        return call(f"jnp.{jname}", [b["input"]], kw)

    return render


def _var_source(jname, fn):
    from funcnet.interop.ops._core import bind, ops_source

    def render(args, kwargs):
        b = bind(fn, args, kwargs)
        c = [literal(b[k]) for k in ("dim", "unbiased", "correction") if k in b]
        if builtins.any(v is NOT_LITERAL for v in c) or "out" in b:
            return ops_source(fn)(args, kwargs)
        dim, correction = _correction(literal(b.get("dim", "None")), literal(b.get("unbiased", "None")),
                                      literal(b.get("correction", "None")), literal(b.get("keepdim", "False")),
                                      jname)
        kw = {} if dim is None else {"axis": repr(dim)}
        kw["ddof"] = repr(correction)
        if "keepdim" in b and literal(b["keepdim"]) is not False:
            kw["keepdims"] = b["keepdim"]
        return call(f"jnp.{jname}", [b["input"]], kw)

    return render


def _register_table():
    register(["Tensor.sum", "torch.sum"], sum, _reduce_source("sum", sum))
    register(["Tensor.mean", "torch.mean"], mean, _reduce_source("mean", mean))
    register(["Tensor.prod", "torch.prod"], prod, _reduce_source("prod", prod))
    register(["Tensor.amax", "torch.amax"], amax, _reduce_source("max", amax))
    register(["Tensor.amin", "torch.amin"], amin, _reduce_source("min", amin))
    register(["Tensor.max", "torch.max"], max, None)
    register(["Tensor.min", "torch.min"], min, None)
    register(["Tensor.aminmax", "torch.aminmax"], aminmax, None)
    register(["Tensor.argmax", "torch.argmax"], argmax, None)
    register(["Tensor.argmin", "torch.argmin"], argmin, None)
    register(["Tensor.var", "torch.var"], var, _var_source("var", var))
    register(["Tensor.std", "torch.std"], std, _var_source("std", std))
    register(["torch.var_mean"], var_mean, None)
    register(["torch.std_mean"], std_mean, None)
    register(["Tensor.norm", "torch.norm"], norm, None)
    register(["torch.linalg.vector_norm"], vector_norm, None)
    register(["Tensor.logsumexp", "torch.logsumexp", "torch.special.logsumexp"], logsumexp, None)
    register(["Tensor.cumsum", "torch.cumsum"], cumsum, None)
    register(["Tensor.cumprod", "torch.cumprod"], cumprod, None)
    register(["Tensor.diff", "torch.diff"], diff, None)
    register(["Tensor.all", "torch.all"], all, _reduce_source("all", all))
    register(["Tensor.any", "torch.any"], any, _reduce_source("any", any))
    register(["Tensor.count_nonzero", "torch.count_nonzero"], count_nonzero, None)
    register(["Tensor.topk", "torch.topk"], topk, None)
    register(["Tensor.sort", "torch.sort"], sort, None)
    register(["Tensor.argsort", "torch.argsort"], argsort, None)


_register_table()
