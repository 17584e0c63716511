"""A small reverse-mode autodiff engine over NumPy: what ``loss.backward()`` does.

``grad(f)(x)`` calls ``f`` on a :class:`Tracer` wrapping ``x``. Each operation on a tracer computes
its value with NumPy and records a node (primitive, inputs, parameters): torch's ``grad_fn`` graph.
The backward pass walks it from the output in reverse topological order, applies each primitive's
vector-Jacobian product (VJP) and sums the cotangents of inputs used twice: the chain rule. Users
write plain NumPy (``np.tanh(x @ W + b)``, ``np.maximum(h, 0.0)``, ``x ** 0.5``): tracers join
``__array_ufunc__``/``__array_function__`` dispatch. Values are float64 unless the inputs are another
float dtype. VJP rules use the same traced operations, so a backward pass run inside an enclosing
``grad`` is recorded and can be differentiated again (torch's ``create_graph=True``).

torch: ``y.backward()``, ``x.grad``, ``y.grad_fn.next_functions``; JAX: ``jax.grad``, ``jax.vjp``,
``jax.make_jaxpr`` (here ``make_graph``).

Examples:
    >>> from funcnet import autodiff
    >>> float(autodiff.grad(lambda x: (x * x).sum())(3.0))  # d(x^2)/dx at 3
    6.0
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

__all__ = ["grad", "value_and_grad", "vjp", "make_graph", "Graph", "Tracer", "ShapeError", "UnsupportedError"]


class ShapeError(ValueError):
    """Operand shapes a primitive cannot combine; the message names the primitive and the shapes."""


class UnsupportedError(TypeError):
    """A NumPy function or ufunc without a VJP rule, called on a traced value."""


class Primitive(NamedTuple):
    """``forward(*values, **params)`` on plain arrays; ``vjps[i](g, out, *inputs, **params)`` is the
    cotangent of input ``i`` given the output's cotangent ``g``."""

    name: str
    forward: Callable
    vjps: tuple


_raw = lambda x: x.value if isinstance(x, Tracer) else x  # noqa: E731


def bind(prim: Primitive, *inputs, **params):
    """Apply ``prim``; record a node only if an input is traced (constants fold to plain arrays)."""
    try:
        out = prim.forward(*map(_raw, inputs), **params)
    except ValueError as e:
        shapes = " and ".join(str(np.shape(_raw(x))) for x in inputs)
        raise ShapeError(f"{prim.name}: operands of shapes {shapes} do not fit ({e})") from None
    return Tracer(out, prim, inputs, params) if any(isinstance(x, Tracer) for x in inputs) else out


# ---- primitives: each forward next to its VJP rules, one per input --------------------------
def _unbroadcast(g, shape):
    """Sum ``g`` down to ``shape``: the VJP of NumPy's implicit broadcasting."""
    if np.shape(g) == tuple(shape):
        return g
    lead = np.ndim(g) - len(shape)
    kept = [lead + i for i, n in enumerate(shape) if n == 1 and np.shape(g)[lead + i] != 1]
    return np.reshape(np.sum(g, axis=tuple(range(lead)) + tuple(kept), keepdims=True), shape)


def _elementwise(name, fn, *vjps):
    """An elementwise primitive; each input's cotangent is summed back to that input's shape."""
    rules = tuple(lambda g, out, *xs, i=i, r=r: _unbroadcast(r(g, out, *xs), np.shape(xs[i]))
                  for i, r in enumerate(vjps))
    prim = Primitive(name, fn, rules)
    return lambda *xs: bind(prim, *xs)


add = _elementwise("add", np.add, lambda g, out, a, b: g, lambda g, out, a, b: g)
sub = _elementwise("sub", np.subtract, lambda g, out, a, b: g, lambda g, out, a, b: -g)
mul = _elementwise("mul", np.multiply, lambda g, out, a, b: g * b, lambda g, out, a, b: g * a)
div = _elementwise("div", np.true_divide, lambda g, out, a, b: g / b, lambda g, out, a, b: -g * out / b)
power = _elementwise("pow", np.power, lambda g, out, a, b: g * b * a ** (b - 1),
                     lambda g, out, a, b: g * out * np.log(a))
neg = _elementwise("neg", np.negative, lambda g, out, a: -g)
exp = _elementwise("exp", np.exp, lambda g, out, a: g * out)
log = _elementwise("log", np.log, lambda g, out, a: g / a)
tanh = _elementwise("tanh", np.tanh, lambda g, out, a: g * (1 - out * out))


# Ties split the gradient evenly, as jax.numpy.maximum does (torch.clamp gives all of it to x).
_wins = lambda out, a, b: ((_raw(a) > _raw(b)) + 0.5 * (_raw(a) == _raw(b))).astype(_raw(out).dtype)  # noqa: E731
maximum = _elementwise("maximum", np.maximum, lambda g, out, a, b: g * _wins(out, a, b),
                       lambda g, out, a, b: g * _wins(out, b, a))


def _expand(g, x, axis, keepdims):
    """Undo a reduction over ``axis``: reinsert the reduced axes as size 1, broadcast to ``x``'s shape."""
    shape = np.shape(x)
    if not keepdims:
        axes = set(range(len(shape)) if axis is None else (np.atleast_1d(axis) % max(len(shape), 1)).tolist())
        g = np.reshape(g, [1 if i in axes else n for i, n in enumerate(shape)])
    return np.broadcast_to(g, shape)


_swap = lambda x: np.transpose(x, (*range(np.ndim(x) - 2), np.ndim(x) - 1, np.ndim(x) - 2))  # noqa: E731
_identity = Primitive("identity", np.array, (lambda g, out, x: g,))
_reshape = Primitive("reshape", lambda x, shape: np.reshape(x, shape),
                     (lambda g, out, x, shape: np.reshape(g, np.shape(x)),))
_transpose = Primitive("transpose", np.transpose,
                       (lambda g, out, x, axes: np.transpose(g, None if axes is None else np.argsort(axes)),))
_broadcast = Primitive("broadcast_to", np.broadcast_to,
                       (lambda g, out, x, shape: _unbroadcast(g, np.shape(x)),))
_sum = Primitive("sum", np.sum, (lambda g, out, x, axis, keepdims: _expand(g, x, axis, keepdims),))
_mean = Primitive("mean", np.mean, (lambda g, out, x, axis, keepdims:
                                    _expand(g, x, axis, keepdims) * (np.size(out) / np.size(x)),))
_matmul = Primitive("matmul", np.matmul, (lambda g, out, a, b: _unbroadcast(g @ _swap(b), np.shape(a)),
                                          lambda g, out, a, b: _unbroadcast(_swap(a) @ g, np.shape(b))))


# The public forms of the structural primitives, with NumPy's signatures (np.sum(x, axis=1) lands here).
reshape = lambda x, shape: bind(_reshape, x, shape=tuple(np.atleast_1d(shape).tolist()))  # noqa: E731
broadcast_to = lambda x, shape: bind(_broadcast, x, shape=tuple(np.atleast_1d(shape).tolist()))  # noqa: E731
sum_ = lambda x, axis=None, keepdims=False: bind(_sum, x, axis=axis, keepdims=keepdims)  # noqa: E731
mean = lambda x, axis=None, keepdims=False: bind(_mean, x, axis=axis, keepdims=keepdims)  # noqa: E731
transpose = lambda x, axes=None: bind(  # noqa: E731
    _transpose, x, axes=None if axes is None else tuple(int(a) % max(np.ndim(x), 1) for a in axes))


def matmul(a, b):
    """``a @ b``, operands of 1 or more axes; a 1-D operand is promoted to a matrix, as NumPy does."""
    sa, sb = np.shape(a), np.shape(b)
    if not sa or not sb or sa[-1] != sb[-2 if len(sb) > 1 else 0]:
        raise ShapeError(f"matmul: shapes {sa} and {sb} do not align: the left operand's last axis must equal "
                         f"the right's {'second-to-last' if len(sb) > 1 else 'only'} axis (and neither may be "
                         "0-d). Transpose or reshape an operand.")
    out = bind(_matmul, reshape(a, (1,) + sa) if len(sa) == 1 else a,
               reshape(b, sb + (1,)) if len(sb) == 1 else b)
    if len(sa) == 1 or len(sb) == 1:  # drop the promoted axes again
        out = reshape(out, np.broadcast_shapes(sa[:-2], sb[:-2]) + sa[-2:-1] + sb[-1:] * (len(sb) > 1))
    return out


# ---- the traced value -----------------------------------------------------------------------
def _operator(op, swapped=False):
    return (lambda a, b: op(b, a)) if swapped else (lambda a, *b, **kw: op(a, *b, **kw))


def _constant(op):  # comparisons give masks: constants, whose derivative is zero almost everywhere
    return lambda *xs, **kw: op(*map(_raw, xs), **kw)


class Tracer:
    """An array value and the node that made it, ``prim(*inputs, **params)`` (``prim`` is None for
    an input). Never mutated after construction; a node's identity is the object's identity."""

    __slots__ = ("value", "prim", "inputs", "params")

    def __init__(self, value, prim=None, inputs=(), params=None):
        self.value, self.prim, self.inputs, self.params = np.asarray(value), prim, inputs, params or {}

    shape, ndim = property(lambda s: s.value.shape), property(lambda s: s.value.ndim)
    dtype, size = property(lambda s: s.value.dtype), property(lambda s: s.value.size)
    T = property(lambda s: transpose(s))
    __add__, __radd__ = _operator(add), _operator(add, swapped=True)
    __sub__, __rsub__ = _operator(sub), _operator(sub, swapped=True)
    __mul__, __rmul__ = _operator(mul), _operator(mul, swapped=True)
    __truediv__, __rtruediv__ = _operator(div), _operator(div, swapped=True)
    __pow__, __rpow__ = _operator(power), _operator(power, swapped=True)
    __matmul__, __rmatmul__ = _operator(matmul), _operator(matmul, swapped=True)
    __neg__ = _operator(neg)
    __lt__, __le__ = _constant(np.less), _constant(np.less_equal)
    __gt__, __ge__ = _constant(np.greater), _constant(np.greater_equal)
    sum, mean = _operator(sum_), _operator(mean)
    reshape = lambda s, *shape: reshape(s, shape[0] if len(shape) == 1 else shape)  # noqa: E731
    transpose = lambda s, *axes: transpose(s, axes[0] if len(axes) == 1 else (axes or None))  # noqa: E731
    __len__ = lambda s: len(s.value)  # noqa: E731
    __repr__ = lambda s: f"Tracer({s.prim.name if s.prim else 'input'}, shape {s.shape}, {s.dtype})"  # noqa: E731

    def __array__(self, dtype=None, copy=None):
        raise TypeError(f"cannot convert {self!r} to a NumPy array: it would leave the graph and its gradient "
                        "would silently be zero. Use tracer.value for a constant, or keep to supported operations.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs or ufunc not in _UFUNCS:
            _unsupported(f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
                         + (f" with {sorted(kwargs)}" if kwargs else ""))
        return _UFUNCS[ufunc](*inputs)

    def __array_function__(self, func, types, args, kwargs):
        try:
            inspect.signature(_FUNCTIONS[func]).bind(*args, **kwargs)
        except (KeyError, TypeError):
            _unsupported(f"numpy.{func.__name__}" + (f" with {sorted(kwargs)}" if kwargs else ""))
        return _FUNCTIONS[func](*args, **kwargs)


_UFUNCS = {np.add: add, np.subtract: sub, np.multiply: mul, np.true_divide: div, np.power: power,
           np.negative: neg, np.exp: exp, np.log: log, np.tanh: tanh, np.maximum: maximum, np.matmul: matmul,
           **{u: _constant(u) for u in (np.greater, np.greater_equal, np.less, np.less_equal, np.equal,
                                        np.not_equal)}}
_FUNCTIONS = {np.sum: sum_, np.mean: mean, np.reshape: reshape, np.transpose: transpose,
              np.broadcast_to: broadcast_to, np.shape: _constant(np.shape), np.ndim: _constant(np.ndim),
              np.size: _constant(np.size)}


def _unsupported(what):
    raise UnsupportedError(
        f"{what} is not supported on traced values by funcnet.autodiff (it has no VJP rule). "
        f"Supported ufuncs: {', '.join(sorted(u.__name__ for u in _UFUNCS))}; functions: "
        f"{', '.join(sorted(f.__name__ for f in _FUNCTIONS))}; "
        "operators + - * / ** @ and comparisons. Rewrite with these, or use jax.grad.")


# ---- the backward pass ----------------------------------------------------------------------
def _toposort(out, leaves):
    """Tracers reachable from ``out``, inputs before users (in evaluation order); stops at ``leaves``."""
    order, seen, stack = [], set(), [(out, False)] if isinstance(out, Tracer) else []
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            if id(node) not in leaves:
                stack.extend((x, False) for x in reversed(node.inputs) if isinstance(x, Tracer))
    return order


_running = [0]  # traced functions running; inside one, a backward pass is recorded too


def _backward(out, trees, seed):
    """Cotangents of ``out`` for each traced argument tree, given ``out``'s cotangent ``seed``."""
    leaves = [t for _, ts in trees for t in ts]
    wanted, nested = {id(x) for x in leaves}, _running[0] > 0 or isinstance(seed, Tracer)
    order, live = _toposort(out, wanted), set(wanted)
    for node in order:  # live: depends on a leaf (torch's requires_grad); only such nodes pass cotangents on
        if any(id(x) in live for x in node.inputs):
            live.add(id(node))
    cts = {id(out): seed}
    for node in reversed(order):
        if id(node) in wanted or id(node) not in cts:
            continue
        args = node.inputs if nested else [_raw(x) for x in node.inputs]
        for i, x in enumerate(node.inputs):
            if id(x) in live:
                ct = node.prim.vjps[i](cts[id(node)], node if nested else node.value, *args, **node.params)
                cts[id(x)] = cts[id(x)] + ct if id(x) in cts else ct
    grads = [cts.get(id(x), np.zeros_like(x.value)) for x in leaves]
    if not nested:  # fresh writable arrays of the inputs' dtypes (a cotangent may be a broadcast view)
        grads = [np.array(g, dtype=x.dtype) for g, x in zip(grads, leaves)]
    grads = iter(grads)
    return tuple(jax.tree.unflatten(treedef, [next(grads) for _ in ts]) for treedef, ts in trees)


def _leaf(x):
    if isinstance(x, Tracer):  # a fresh node, so that a closed-over outer value is not this input
        return bind(_identity, x)
    x = np.asarray(x)
    return Tracer(x if x.dtype.kind == "f" else x.astype(np.float64))


def _trace(f, args, argnums):
    """``(value, output, traced trees)`` of ``f`` with arguments ``argnums`` (pytrees) traced."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if any(not -len(args) <= n < len(args) for n in nums):
        raise ValueError(f"argnums={argnums!r} but f was called with {len(args)} positional arguments; "
                         f"pass argnums within range({len(args)}).")
    args, trees = list(args), []
    for n in nums:
        leaves, treedef = jax.tree.flatten(args[n])
        traced = [_leaf(x) for x in leaves]
        args[n] = jax.tree.unflatten(treedef, traced)
        trees.append((treedef, traced))
    _running[0] += 1
    try:
        out = f(*args)
    finally:
        _running[0] -= 1
    return (out if _running[0] else _raw(out)), out, trees


def vjp(f: Callable, *primals) -> tuple[Any, Callable]:
    """``(f(*primals), pullback)``; ``pullback(ct)`` gives a tuple of cotangents, one per primal. The
    pullback can be called again (torch frees its graph after ``backward()`` unless ``retain_graph=True``)."""
    value, out, trees = _trace(f, primals, tuple(range(len(primals))))

    def pullback(ct):
        if np.shape(ct) != np.shape(out):
            raise ShapeError(f"vjp: cotangent of shape {np.shape(ct)} for an output of shape {np.shape(out)}; "
                             "pass an array shaped like f's output.")
        return _backward(out, trees, ct)
    return value, pullback


def value_and_grad(f: Callable, argnums: int | tuple[int, ...] = 0) -> Callable:
    """``(f(*args), gradient w.r.t. args[argnums])`` for scalar ``f``; a tuple of gradients if ``argnums``
    is a tuple. torch: ``loss.backward()`` then each ``param.grad``."""
    def wrapped(*args):
        value, out, trees = _trace(f, args, argnums)
        if np.shape(out) != ():
            raise ShapeError(f"grad: f must return a scalar, got shape {np.shape(out)}; reduce it "
                             "(np.sum, np.mean) or use vjp with a cotangent of that shape.")
        grads = _backward(out, trees, np.ones_like(_raw(out)))
        return value, (grads[0] if isinstance(argnums, int) else grads)
    return wrapped


def grad(f: Callable, argnums: int | tuple[int, ...] = 0) -> Callable:
    """Gradient of scalar ``f``: ``grad(lambda x: x**2 + 3*x)(2.0) == 7.0``. ``grad(grad(f))`` is the
    second derivative. jax: ``jax.grad``; torch: ``torch.autograd.grad(..., create_graph=True)``."""
    return lambda *args: value_and_grad(f, argnums)(*args)[1]


class Graph(NamedTuple):
    """The recorded graph of one call, as ``jax.make_jaxpr`` prints one and as walking torch's
    ``grad_fn.next_functions`` finds one. ``str(graph)`` lists ``v3 = mul(v1, v2)  shape (3,)`` lines."""

    inputs: tuple
    output: Any

    @property
    def nodes(self) -> list:
        """The recorded operations (nodes with a primitive), inputs first, in topological order."""
        return [n for n in _toposort(self.output, {id(x) for x in self.inputs}) if n.prim is not None]

    @property
    def primitives(self) -> list[str]:
        """The names of ``nodes``' primitives, in the same order."""
        return [n.prim.name for n in self.nodes]

    def __str__(self):
        names = {id(x): f"v{i}" for i, x in enumerate(self.inputs)}
        lines = [f"{names[id(x)]}: input  shape {x.shape} {x.dtype}" for x in self.inputs]

        def ref(x):
            if isinstance(x, Tracer):
                return names.get(id(x), "outer")
            return repr(x) if np.ndim(x) == 0 else f"const{np.shape(x)}"

        for node in self.nodes:
            names[id(node)] = f"v{len(names)}"
            params = "".join(f", {k}={v}" for k, v in node.params.items() if v is not None and v is not False)
            lines.append(f"{names[id(node)]} = {node.prim.name}({', '.join(map(ref, node.inputs))}{params})"
                         f"  shape {node.shape}")
        return "\n".join(lines + [f"return {ref(self.output)}"])


def make_graph(f: Callable, argnums: int | tuple[int, ...] = 0) -> Callable[..., Graph]:
    """``make_graph(f)(*args)`` traces ``f`` once on arguments ``argnums``; returns the :class:`Graph`."""
    def wrapped(*args):
        _, out, trees = _trace(f, args, argnums)
        return Graph(tuple(t for _, leaves in trees for t in leaves), out)
    return wrapped
