"""Shapes and views as torch: view/reshape, permute, transpose, flatten, squeeze (a no-op on a
dim that is not 1, as torch), expand (-1 keeps a size), repeat, chunk and split (torch's
uneven pieces), cat/stack, size queries, and the copies that are identities in JAX."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from funcnet.interop.ops._core import atom, call, literal, register, sizes

__all__ = ["view", "view_as", "permute", "transpose", "t", "T", "mT", "flatten", "unflatten", "squeeze", "unsqueeze",
           "expand", "expand_as", "repeat", "repeat_interleave", "chunk", "split", "tensor_split", "unbind", "cat",
           "stack", "hstack", "vstack", "narrow", "flip", "roll", "size", "shape_of", "ndim", "numel", "length",
           "identity", "detach", "movedim", "broadcast_to", "gather", "index_select", "take_along_dim",
           "diagonal", "diag", "meshgrid", "broadcast_tensors"]


def view(input, *size, shape=None):
    """``x.view(2, -1)``, ``x.view((2, -1))`` or ``torch.reshape(x, shape=(2, -1))``: a reshape (JAX
    arrays have no strides)."""
    shape = size if shape is None else (shape,)
    if len(shape) == 1 and not isinstance(shape[0], (int, tuple, list)):
        raise TypeError(f"view(dtype) reinterprets bits ({shape[0]!r}); it is not supported: use .to(dtype) to convert "
                        f"values")
    return jnp.reshape(input, sizes(shape))


def view_as(input, other):
    return jnp.reshape(input, jnp.shape(other))


def permute(input, *dims_, dims=None):
    """``x.permute(2, 0, 1)``, ``x.permute((2, 0, 1))`` or ``torch.permute(x, dims=(2, 0, 1))``."""
    return jnp.transpose(input, sizes(dims_ if dims is None else (dims,)))


def transpose(input, dim0, dim1):
    return jnp.swapaxes(input, dim0, dim1)


def t(input):
    """2-D transpose; 0-D and 1-D unchanged, as torch."""
    x = jnp.asarray(input)
    if x.ndim > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dimensions, got shape {x.shape}; use transpose(0, 1)")
    return x.T


def T(input):  # noqa: N802
    return jnp.transpose(input)


def mT(input):  # noqa: N802
    return jnp.swapaxes(input, -1, -2)


def flatten(input, start_dim=0, end_dim=-1):
    x = jnp.asarray(input)
    if x.ndim == 0:
        return x.reshape(1)
    s, e = start_dim % x.ndim, end_dim % x.ndim
    return x.reshape(x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def unflatten(input, dim, sizes):
    x = jnp.asarray(input)
    d = dim % x.ndim
    return x.reshape(x.shape[:d] + tuple(sizes) + x.shape[d + 1:])


def squeeze(input, dim=None):
    """Drop size-1 axes: all, or those of ``dim`` (an int or a tuple) that are 1; torch leaves
    a named axis of another size alone where jnp.squeeze would raise."""
    x = jnp.asarray(input)
    if dim is None:
        return jnp.squeeze(x)
    axes = (dim,) if isinstance(dim, int) else tuple(dim)
    axes = tuple(a % x.ndim for a in axes if x.ndim and x.shape[a] == 1)
    return jnp.squeeze(x, axes) if axes else x


def unsqueeze(input, dim):
    x = jnp.asarray(input)
    return jnp.expand_dims(x, dim % (x.ndim + 1))


def expand(input, *size, implicit=False):
    """Broadcast to ``size``; -1 keeps that axis, new axes go in front."""
    x = jnp.asarray(input)
    shape = sizes(size)
    lead = len(shape) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
    return jnp.broadcast_to(x, shape)


def expand_as(input, other):
    return jnp.broadcast_to(input, jnp.shape(other))


def broadcast_to(input, size):
    return expand(input, *sizes((size,)))


def repeat(input, *sizes_):
    """Tile: ``x.repeat(2, 1)``; more sizes than axes add axes in front (as jnp.tile)."""
    return jnp.tile(input, sizes(sizes_))


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Each element ``repeats`` times along ``dim`` (flattened when None). Tensor ``repeats``
    need ``output_size`` (the total), since the shape must not depend on the values."""
    x = jnp.asarray(input)
    if repeats is None:  # torch.repeat_interleave(repeats): indices
        raise ValueError("repeat_interleave(repeats) with one tensor makes an output shape that depends on the data; "
                         "pass the input to repeat and output_size")
    if hasattr(repeats, "shape") and jnp.ndim(repeats) > 0 and output_size is None:
        raise ValueError("repeat_interleave with tensor repeats has an output shape that depends on the data; pass "
                         "output_size= (the sum of repeats) so JAX can trace it")
    if dim is None:
        x, dim = x.reshape(-1), 0
    return jnp.repeat(x, repeats, axis=dim, total_repeat_length=output_size)


def chunk(input, chunks, dim=0):
    """torch's chunks: each ``ceil(n / chunks)`` long, the last shorter, possibly fewer pieces."""
    n = jnp.shape(input)[dim]
    step = -(-n // chunks) if chunks > 0 else None
    if step is None:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    return split(input, max(step, 1), dim) if n else split(input, [0] * chunks, dim)


def split(tensor, split_size_or_sections, dim=0):
    """An int: pieces of that size (the last shorter); a list: those sizes (summing to the axis)."""
    x = jnp.asarray(tensor)
    n = x.shape[dim]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        bounds = list(range(0, n, step)) + [n] if n else [0, 0]
    else:
        sections = [int(s) for s in split_size_or_sections]
        if sum(sections) != n:
            raise ValueError(f"split: sections {sections} must sum to the size {n} of dim {dim}")
        bounds = [0]
        for s in sections:
            bounds.append(bounds[-1] + s)
    return tuple(jax.lax.slice_in_dim(x, a, b, axis=dim % x.ndim) for a, b in zip(bounds[:-1], bounds[1:]))


def tensor_split(input, indices_or_sections, dim=0):
    x = jnp.asarray(input)
    n = x.shape[dim]
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        sizes_ = [n // k + (1 if i < n % k else 0) for i in range(k)]
        return split(x, sizes_, dim)
    bounds = [0] + [min(max(int(i), 0), n) for i in indices_or_sections] + [n]
    return tuple(jax.lax.slice_in_dim(x, a, max(a, b), axis=dim % x.ndim) for a, b in zip(bounds[:-1], bounds[1:]))


def unbind(input, dim=0):
    x = jnp.asarray(input)
    return tuple(jnp.moveaxis(x, dim, 0))


def cat(tensors, dim=0, *, axis=None, out=None):
    """torch.cat / concat / concatenate (``axis=``); torch's legacy skip of empty 1-D tensors included."""
    dim = axis if axis is not None else dim
    arrays = [jnp.asarray(t) for t in tensors]
    kept = [a for a in arrays if not (a.ndim == 1 and a.shape[0] == 0)] or arrays
    return jnp.concatenate(kept, axis=dim)


def stack(tensors, dim=0, *, out=None):
    return jnp.stack(list(tensors), axis=dim)


def hstack(tensors, *, out=None):
    return jnp.hstack(list(tensors))


def vstack(tensors, *, out=None):
    return jnp.vstack(list(tensors))


def narrow(input, dim, start, length):
    x = jnp.asarray(input)
    start = start % x.shape[dim] if start < 0 else start
    return jax.lax.slice_in_dim(x, start, start + length, axis=dim % x.ndim)


def flip(input, *dims_, dims=None):
    """``x.flip(0, 2)``, ``x.flip((0, 2))`` or ``torch.flip(x, dims=(0, 2))``."""
    return jnp.flip(input, sizes(dims_ if dims is None else (dims,)))


def roll(input, shifts, dims=None):
    return jnp.roll(input, shifts, axis=dims)


def movedim(input, source, destination):
    return jnp.moveaxis(input, source, destination)


def size(input, dim=None):
    """``x.size()`` the shape as a tuple of ints, ``x.size(d)`` one int."""
    shape = tuple(jnp.shape(input))
    return shape if dim is None else shape[dim]


def shape_of(input):
    return tuple(jnp.shape(input))


def ndim(input):
    return jnp.ndim(input)


def numel(input):
    return math.prod(jnp.shape(input))


def length(input):
    """``len(x)``: the size of the first axis; a 0-d tensor has none, as torch."""
    if jnp.ndim(input) == 0:
        raise TypeError("len() of a 0-d tensor")
    return jnp.shape(input)[0]


def identity(input, *args, **kwargs):
    """``contiguous()``, ``clone()``, ``cpu()``, ``cuda()``, ``requires_grad_()``: arrays are
    values in JAX, so each is the array itself."""
    return input


def detach(input):
    return jax.lax.stop_gradient(input)


def gather(input, dim, index, *, sparse_grad=False, out=None):
    """``out[i][j] = input[index[i][j]][j]`` (dim 0): index may be smaller than input on the
    other axes, as torch."""
    x, idx = jnp.asarray(input), jnp.asarray(index)
    d = dim % max(x.ndim, 1)
    x = x[tuple(slice(None) if a == d else slice(0, idx.shape[a]) for a in range(x.ndim))]
    return jnp.take_along_axis(x, idx, axis=d)


def index_select(input, dim, index, *, out=None):
    return jnp.take(input, jnp.reshape(index, (-1,)), axis=dim)


def take_along_dim(input, indices, dim=None, *, out=None):
    if dim is None:
        return jnp.take_along_axis(jnp.reshape(input, -1), jnp.reshape(indices, -1), axis=0)
    x, idx = jnp.asarray(input), jnp.asarray(indices)
    # broadcast every axis but dim, where the two keep their own lengths (torch's rule)
    dim = dim % x.ndim
    other = lambda s: s[:dim] + (1,) + s[dim + 1:]  # noqa: E731
    shape = list(jnp.broadcast_shapes(other(x.shape), other(idx.shape)))
    shape_x, shape_i = list(shape), list(shape)
    shape_x[dim], shape_i[dim] = x.shape[dim], idx.shape[dim]
    return jnp.take_along_axis(jnp.broadcast_to(x, shape_x), jnp.broadcast_to(idx, shape_i), axis=dim)


def diagonal(input, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(input, offset, dim1, dim2)


def diag(input, diagonal=0):
    return jnp.diag(input, diagonal)


def meshgrid(*tensors, indexing="ij"):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    return tuple(jnp.meshgrid(*tensors, indexing=indexing))


def broadcast_tensors(*tensors):
    return tuple(jnp.broadcast_arrays(*tensors))


# ---- the table ------------------------------------------------------------------------------

def _shape_args(args):
    """``reshape(B, T, C)`` from rendered sizes given as several or as one tuple."""
    if len(args) == 1:
        v = literal(args[0])
        if isinstance(v, (list, tuple)):
            return [repr(i) for i in v]
        if args[0].startswith(("(", "[")):
            return [args[0]]
    return args


def _method(name, shape_like=False):
    def render(a, k):
        rest = _shape_args(a[1:]) if shape_like else a[1:]
        return call(f"{atom(a[0])}.{name}", rest, k)

    return render


def _dims_tuple(parts):
    parts = _shape_args(parts)
    return parts[0] if len(parts) == 1 and parts[0].startswith("(") else f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def _register_table():
    register(["Tensor.view", "Tensor.reshape", "torch.reshape"], view,
             lambda a, k: _method("reshape", shape_like=True)(a + ([k.pop("shape")] if "shape" in k else []), k))
    register(["Tensor.view_as", "Tensor.reshape_as"], view_as, lambda a, k: f"{atom(a[0])}.reshape({a[1]}.shape)")
    register(["Tensor.permute", "torch.permute"], permute,
             lambda a, k: call("jnp.transpose", [a[0], _dims_tuple(a[1:] or [k["dims"]])]))
    register(["Tensor.transpose", "torch.transpose", "Tensor.swapaxes", "torch.swapaxes", "Tensor.swapdims",
              "torch.swapdims"], transpose, lambda a, k: call("jnp.swapaxes", a + list(k.values())))
    register(["Tensor.t", "torch.t"], t, None)
    register(["Tensor.T", "Tensor.mH", "Tensor.H"], T, lambda a, k: f"{atom(a[0])}.T")
    register(["Tensor.mT", "Tensor.adjoint", "torch.adjoint"], mT, lambda a, k: call("jnp.swapaxes", [a[0], "-1", "-2"]))
    register(["Tensor.flatten", "torch.flatten"], flatten, None)
    register(["Tensor.unflatten", "torch.unflatten"], unflatten, None)
    register(["Tensor.squeeze", "torch.squeeze"], squeeze, None)
    register(["Tensor.unsqueeze", "torch.unsqueeze"], unsqueeze, lambda a, k: call("jnp.expand_dims", a + list(k.values())))
    register(["Tensor.expand"], expand, None)
    register(["Tensor.expand_as"], expand_as, lambda a, k: call("jnp.broadcast_to", [a[0], f"{atom(a[1])}.shape"]))
    register(["Tensor.broadcast_to", "torch.broadcast_to"], broadcast_to, None)
    register(["Tensor.repeat"], repeat, lambda a, k: call("jnp.tile", [a[0], _dims_tuple(a[1:])]))
    register(["Tensor.tile", "torch.tile"], lambda input, dims: jnp.tile(input, tuple(dims)),
             lambda a, k: call("jnp.tile", a + list(k.values())))
    register(["Tensor.repeat_interleave", "torch.repeat_interleave"], repeat_interleave, None)
    register(["Tensor.chunk", "torch.chunk"], chunk, None)
    register(["Tensor.split", "torch.split"], split, None)
    register(["Tensor.tensor_split", "torch.tensor_split"], tensor_split, None)
    register(["Tensor.unbind", "torch.unbind"], unbind, None)

    def axis_source(jname):
        def render(a, k):
            axis = a[1:2] + [v for n, v in k.items() if n in ("dim", "axis")]
            return call(f"jnp.{jname}", a[:1], {"axis": axis[0]} if axis and axis[0] != "0" else {})

        return render

    register(["torch.cat", "torch.concat", "torch.concatenate"], cat, axis_source("concatenate"))
    register(["torch.stack"], stack, axis_source("stack"))
    register(["torch.hstack"], hstack, None)
    register(["torch.vstack"], vstack, None)
    register(["Tensor.narrow", "torch.narrow"], narrow, None)
    register(["Tensor.flip", "torch.flip"], flip, lambda a, k: call("jnp.flip", [a[0], _dims_tuple(a[1:] or [k["dims"]])]))  # noqa: E501
    register(["Tensor.roll", "torch.roll"], roll, lambda a, k: call("jnp.roll", a, {
        {"dims": "axis", "shifts": "shift"}[n]: v for n, v in k.items()}))
    register(["Tensor.movedim", "torch.movedim", "Tensor.moveaxis", "torch.moveaxis"], movedim,
             lambda a, k: call("jnp.moveaxis", a + list(k.values())))
    register(["Tensor.size"], size, lambda a, k: f"{atom(a[0])}.shape" + (f"[{(a[1:] + list(k.values()))[0]}]"
                                                                         if len(a) + len(k) > 1 else ""))
    register(["Tensor.shape"], shape_of, lambda a, k: f"{atom(a[0])}.shape")
    register(["Tensor.dim", "Tensor.ndim", "Tensor.ndimension"], ndim, lambda a, k: f"{atom(a[0])}.ndim")
    register(["Tensor.numel", "Tensor.nelement", "torch.numel"], numel, lambda a, k: f"{atom(a[0])}.size")
    register(["Tensor.__len__"], length, lambda a, k: f"len({a[0]})")
    register(["Tensor.contiguous", "Tensor.clone", "torch.clone", "Tensor.cpu", "Tensor.cuda", "Tensor.requires_grad_",
              "Tensor.pin_memory", "Tensor.coalesce", "Tensor.to_dense", "Tensor.resolve_conj", "Tensor.resolve_neg",
              "Tensor.retain_grad"], identity, lambda a, k: a[0])
    register(["Tensor.detach", "torch.detach", "Tensor.data"], detach, None)
    register(["Tensor.gather", "torch.gather"], gather, None)
    register(["Tensor.index_select", "torch.index_select"], index_select,
             lambda a, k: call("jnp.take", [a[0], a[2]], {"axis": a[1]}) if len(a) == 3 and not k else
             call("ops.index_select", a, k))
    register(["Tensor.take_along_dim", "torch.take_along_dim"], take_along_dim, None)
    register(["Tensor.diagonal", "torch.diagonal"], diagonal, lambda a, k: call("jnp.diagonal", a, k))
    register(["Tensor.diag", "torch.diag"], diag, lambda a, k: call("jnp.diag", a, {"k": v for v in k.values()}))
    register(["torch.meshgrid"], meshgrid, None)
    register(["torch.broadcast_tensors"], broadcast_tensors, lambda a, k: call("jnp.broadcast_arrays", a))


_register_table()
