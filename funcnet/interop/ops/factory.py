"""Tensor factories and dtype conversions as torch: zeros/ones/full/empty (empty is zeros),
arange and linspace with torch's dtype inference and values, eye, tensor, the ``*_like`` and
``new_*`` forms, ``to``/``float``/``long``/``type_as``. Devices, ``requires_grad``,
``layout`` and ``pin_memory`` are accepted and ignored.

Float factories without ``dtype=`` make torch's default float (float32), integer ones
int64 (int32 with JAX's 64-bit types off, as ``interop.from_torch`` stores int64)."""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from funcnet.interop.ops._core import (DEFAULT_FLOAT, _scalar_dtype, atom, call, is_array, jdtype, register, sizes)

__all__ = ["zeros", "ones", "full", "empty", "arange", "linspace", "eye", "tensor", "zeros_like", "ones_like",
           "full_like", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "to", "astype",
           "type_as", "tensor_type", "is_floating_point", "dtype_of", "device_of"]


def _dt(dtype, default=DEFAULT_FLOAT):
    return jdtype(default if dtype is None else dtype)


def _size(args, size):
    """A factory's size: ``f(2, 3)``, ``f((2, 3))`` or ``f(size=(2, 3))``."""
    return sizes(args if size is None else (size,))


def zeros(*args, size=None, dtype=None, out=None, layout=None, device=None, pin_memory=False, requires_grad=False,
          memory_format=None, names=None):
    return jnp.zeros(_size(args, size), _dt(dtype))


def ones(*args, size=None, dtype=None, out=None, layout=None, device=None, pin_memory=False, requires_grad=False,
         memory_format=None, names=None):
    return jnp.ones(_size(args, size), _dt(dtype))


def empty(*args, size=None, dtype=None, out=None, layout=None, device=None, pin_memory=False, requires_grad=False,
          memory_format=None, names=None):
    """Uninitialised memory in torch: zeros here (a program must not read it before writing)."""
    return jnp.zeros(_size(args, size), _dt(dtype))


def _fill_dtype(fill_value):
    if is_array(fill_value):
        return fill_value.dtype
    return _scalar_dtype(fill_value)


def full(size, fill_value, *, dtype=None, out=None, layout=None, device=None, pin_memory=False,
         requires_grad=False, names=None):
    """dtype from ``fill_value`` when not given: bool, int64 or the default float, as torch."""
    return jnp.full(sizes((size,)), fill_value, _dt(dtype, _fill_dtype(fill_value)))


def arange(start, end=None, step=1, *, dtype=None, out=None, layout=None, device=None, pin_memory=False,
           requires_grad=False):
    """``arange(end)`` or ``(start, end, step)``: int64 when every bound is an integer, else
    the default float; the values ``start + i * step`` computed in float64, as torch's CPU
    kernel, then rounded to the dtype."""
    if end is None:
        start, end = 0, start
    bounds = [start, end, step]
    if any(is_array(b) for b in bounds):
        bounds = [b.item() if is_array(b) else b for b in bounds]  # a 0-d tensor: a concrete number at trace time
    start, end, step = bounds
    is_int = all(isinstance(b, int) for b in bounds)
    dt = _dt(dtype, jnp.int64 if is_int else DEFAULT_FLOAT)
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    n = max(int(np.ceil((end - start) / step)), 0)
    if is_int:
        return jnp.asarray(start + step * np.arange(n, dtype=np.int64), dtype=dt)
    return jnp.asarray(start + step * np.arange(n, dtype=np.float64), dtype=dt)


def linspace(start, end, steps, *, dtype=None, out=None, layout=None, device=None, requires_grad=False):
    """torch's two-sided formula: ``start + i * step`` for the first half, ``end - (steps-1-i) * step``
    for the second (exact at both ends)."""
    dt = _dt(dtype)
    if steps == 1:
        return jnp.asarray([start], dtype=dt)
    i = np.arange(steps, dtype=np.float64)
    step = (end - start) / (steps - 1)
    values = np.where(i < steps // 2, start + i * step, end - (steps - 1 - i) * step)
    return jnp.asarray(values, dtype=dt)


def eye(n, m=None, *, dtype=None, out=None, layout=None, device=None, pin_memory=False, requires_grad=False):
    return jnp.eye(n, n if m is None else m, dtype=_dt(dtype))


def _infer(data):
    """torch.tensor's dtype for Python data: bool, int64, or the default float."""
    flat = np.asarray(data, dtype=object).reshape(-1)
    if flat.size and all(isinstance(v, bool) for v in flat):
        return jnp.bool_
    if all(isinstance(v, int) for v in flat) and flat.size:
        return jnp.int64
    if any(isinstance(v, complex) for v in flat):
        return jnp.complex64
    return DEFAULT_FLOAT


def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """torch.tensor / as_tensor: an array keeps its dtype; Python data infers torch's."""
    if is_array(data):
        return jnp.asarray(data, dtype=None if dtype is None else jdtype(dtype))
    return jnp.asarray(np.asarray(data, dtype=np.float64 if _infer(data) == DEFAULT_FLOAT else None),
                       dtype=_dt(dtype, _infer(data)))


def _like_dtype(input, dtype):
    return jnp.asarray(input).dtype if dtype is None else jdtype(dtype)


def zeros_like(input, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
    return jnp.zeros(jnp.shape(input), _like_dtype(input, dtype))


def ones_like(input, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
    return jnp.ones(jnp.shape(input), _like_dtype(input, dtype))


def empty_like(input, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
    return jnp.zeros(jnp.shape(input), _like_dtype(input, dtype))


def full_like(input, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None):
    return jnp.full(jnp.shape(input), fill_value, _like_dtype(input, dtype))


def new_zeros(input, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    """``x.new_zeros(size)``: x's dtype unless ``dtype=``."""
    return jnp.zeros(sizes(size), _like_dtype(input, dtype))


def new_ones(input, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    return jnp.ones(sizes(size), _like_dtype(input, dtype))


def new_empty(input, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    return jnp.zeros(sizes(size), _like_dtype(input, dtype))


def new_full(input, size, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None,
             pin_memory=False):
    return jnp.full(sizes((size,)), fill_value, _like_dtype(input, dtype))


def new_tensor(input, data, *, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    """``x.new_tensor(data)``: x's dtype unless ``dtype=``."""
    return jnp.asarray(data, dtype=_like_dtype(input, dtype))


def _is_dtype(value) -> bool:
    if value is None or isinstance(value, (str, int, bool)) or is_array(value):
        return False
    try:
        jnp.dtype(value)
    except TypeError:
        return False
    return True


def to(input, *args, dtype=None, device=None, non_blocking=False, copy=False, memory_format=None):
    """``x.to(dtype)``, ``x.to(other)`` (its dtype), ``x.to(device, dtype)``; devices ignored."""
    for a in args:
        if is_array(a):
            dtype = a.dtype
        elif _is_dtype(a):
            dtype = a
    x = jnp.asarray(input)
    return x if dtype is None else x.astype(jdtype(dtype))


def astype(dtype):
    """The method that converts to ``dtype``: ``x.float()``, ``x.long()``, ``x.bool()``..."""

    def convert(input, memory_format=None):
        return jnp.asarray(input).astype(jdtype(dtype))

    convert.__name__ = convert.__qualname__ = f"to_{jnp.dtype(dtype).name}"
    return convert


def type_as(input, other):
    return jnp.asarray(input).astype(jnp.asarray(other).dtype)


def tensor_type(input, dtype=None, non_blocking=False):
    """``x.type(dtype)``; ``x.type()`` (a string such as 'torch.FloatTensor') is not supported."""
    if dtype is None or isinstance(dtype, str):
        raise TypeError("Tensor.type() with no dtype (or a string type name) is not supported: use .dtype or "
                        ".to(dtype)")
    return jnp.asarray(input).astype(jdtype(dtype))


def is_floating_point(input):
    return bool(jnp.issubdtype(jnp.asarray(input).dtype, jnp.floating))


def dtype_of(input):
    return jnp.asarray(input).dtype


def device_of(input):
    """Devices are dropped: None."""
    return None


# ---- the table ------------------------------------------------------------------------------

def _register_table():
    for fn in (zeros, ones, empty, full, arange, linspace, eye):
        register([f"torch.{fn.__name__}"], fn, None)
    register(["torch.tensor", "torch.as_tensor", "torch.asarray"], tensor, None)
    for fn in (zeros_like, ones_like, full_like, empty_like):
        register([f"torch.{fn.__name__}"], fn, None)
    for fn in (new_zeros, new_ones, new_full, new_empty, new_tensor):
        register([f"Tensor.{fn.__name__}"], fn, None)
    register(["Tensor.to"], to, None)
    casts = {"float": jnp.float32, "double": jnp.float64, "half": jnp.float16, "bfloat16": jnp.bfloat16,
             "long": jnp.int64, "int": jnp.int32, "short": jnp.int16, "char": jnp.int8, "byte": jnp.uint8,
             "bool": jnp.bool_}
    for name, dt in casts.items():
        fn = astype(dt)
        globals()[fn.__name__] = fn
        __all__.append(fn.__name__)
        register([f"Tensor.{name}"], fn, (lambda f: lambda a, k: call(f"ops.{f}", a[:1]))(fn.__name__))
    register(["Tensor.type_as"], type_as, lambda a, k: f"{atom(a[0])}.astype({atom(a[1])}.dtype)")
    register(["Tensor.type"], tensor_type, None)
    register(["Tensor.is_floating_point", "torch.is_floating_point"], is_floating_point, None)
    register(["Tensor.dtype"], dtype_of, lambda a, k: f"{atom(a[0])}.dtype")
    register(["Tensor.device"], device_of, lambda a, k: "None")


_register_table()
