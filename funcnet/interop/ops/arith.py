"""Arithmetic, comparisons and element-wise math, with torch's type promotion.

Binary operators promote as torch does (``ops._core.result_type``): an int tensor times 0.5
is float32 and a float32 tensor plus a float64 0-d tensor stays float32, where JAX would
give its default float. The generated source writes the operator (``x + y``), which agrees
with this everywhere but in those mixed cases with JAX's 64-bit types on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy import special as _special

from funcnet.interop.ops._core import DEFAULT_FLOAT, as_float, atom, call, literal, promote, register, strong
from funcnet.nn import functional as F

__all__ = ["add", "sub", "rsub", "mul", "div", "floor_divide", "remainder", "fmod", "pow", "rpow", "rtruediv",
           "rfloordiv", "rmod", "neg", "matmul", "mm", "addmm", "baddbmm", "outer", "rsqrt", "erf", "erfc", "erfinv",
           "clamp", "lerp", "addcmul", "addcdiv", "where", "tensor_where", "eq", "ne", "lt", "le", "gt", "ge",
           "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor",
           "bitwise_not", "maximum", "minimum", "round", "square", "einsum", "tril", "triu", "sign", "nan_to_num",
           "unary"]


def _scaled(other, alpha):
    return other if alpha == 1 else other * alpha


def add(input, other, *, alpha=1, out=None):
    a, b = promote(input, other)
    return a + _scaled(b, alpha)


def sub(input, other, *, alpha=1, out=None):
    a, b = promote(input, other)
    return a - _scaled(b, alpha)


def rsub(input, other, alpha=1):
    """``other - alpha * input`` (torch.rsub, ``1 - x``)."""
    a, b = promote(input, other)
    return b - _scaled(a, alpha)


def mul(input, other, *, out=None):
    a, b = promote(input, other)
    return a * b


def div(input, other, *, rounding_mode=None, out=None):
    """True division (integers give torch's default float), or rounded ``'floor'``/``'trunc'``."""
    a, b = promote(input, other)
    if rounding_mode is None:
        if jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_:
            a, b = a.astype(DEFAULT_FLOAT), b.astype(DEFAULT_FLOAT)
        return a / b
    if rounding_mode == "floor":
        return a // b if not jnp.issubdtype(a.dtype, jnp.floating) else jnp.floor(a / b)
    if rounding_mode == "trunc":
        if jnp.issubdtype(a.dtype, jnp.integer):
            q = jnp.abs(a) // jnp.abs(b)
            return jnp.where((a < 0) != (b < 0), -q, q)
        return jnp.trunc(a / b)
    raise ValueError(f"div: rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")


def floor_divide(input, other, *, out=None):
    return div(input, other, rounding_mode="floor")


def remainder(input, other, *, out=None):
    a, b = promote(input, other)
    return jnp.remainder(a, b)


def fmod(input, other, *, out=None):
    a, b = promote(input, other)
    return jnp.fmod(a, b)


def pow(input, exponent, *, out=None):  # noqa: A001
    if not hasattr(exponent, "dtype") and isinstance(exponent, int) and not isinstance(exponent, bool) \
            and jnp.issubdtype(jnp.asarray(input).dtype, jnp.floating):
        return jnp.asarray(input) ** exponent  # an integer power, as torch: exact x * x for x ** 2
    a, b = promote(input, exponent)
    return a ** b


def rpow(input, other):
    """``other ** input`` (``2 ** x``)."""
    return pow(other, input)


def rtruediv(input, other):
    return div(other, input)


def rfloordiv(input, other):
    return floor_divide(other, input)


def rmod(input, other):
    return remainder(other, input)


def neg(input, *, out=None):
    return -jnp.asarray(input)


def matmul(input, other, *, out=None):
    return jnp.matmul(input, other)


def mm(input, mat2, *, out=None):
    """torch.mm / torch.bmm (``mat2=`` by keyword)."""
    return jnp.matmul(input, mat2)


def addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    """``beta * input + alpha * (mat1 @ mat2)``; ``beta=0`` ignores ``input`` (NaN included), as torch."""
    prod = jnp.matmul(mat1, mat2)
    prod = prod if alpha == 1 else alpha * prod
    if beta == 0:
        return jnp.broadcast_to(prod, jnp.broadcast_shapes(prod.shape, jnp.shape(input))).astype(prod.dtype)
    return (input if beta == 1 else beta * input) + prod


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    return addmm(input, batch1, batch2, beta=beta, alpha=alpha)


def outer(input, vec2, *, out=None):
    a, b = promote(input, vec2)
    return jnp.outer(a, b)


def rsqrt(input, *, out=None):
    return jax.lax.rsqrt(as_float(input))


def erf(input, *, out=None):
    return _special.erf(as_float(input))


def erfc(input, *, out=None):
    return _special.erfc(as_float(input))


def erfinv(input, *, out=None):
    return _special.erfinv(as_float(input))


def clamp(input, min=None, max=None, *, out=None):  # noqa: A002
    """torch.clamp / clip: bounds may be numbers or tensors; ``min > max`` gives ``max``."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given (torch refuses both None)")
    x, lo, hi = promote(input, min, max)
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


def lerp(input, end, weight, *, out=None):
    """``input + weight * (end - input)``, in torch's two-sided form (exact at both ends)."""
    a, b, w = promote(input, end, weight)
    return jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))


def addcmul(input, tensor1, tensor2, *, value=1, out=None):
    a, b, c = promote(input, tensor1, tensor2)
    return a + value * b * c


def addcdiv(input, tensor1, tensor2, *, value=1, out=None):
    a, b, c = promote(input, tensor1, tensor2)
    return a + value * b / c


def where(condition, input=None, other=None, *, out=None):
    """``torch.where(condition, input, other)``; the one-argument form is nonzero (refused)."""
    if input is None and other is None:
        raise ValueError("torch.where(condition) with one argument is nonzero: its output shape depends on the "
                         "data, which JAX cannot trace; use torch.where(condition, x, y)")
    a, b = promote(input, other)
    return jnp.where(jnp.asarray(condition).astype(bool), a, b)


def tensor_where(input, condition, other):
    """``x.where(condition, y)``: torch.where(condition, x, y)."""
    return where(condition, input, other)


def _compare(jfn):
    def compare(input, other, *, out=None):
        a, b = promote(input, other)
        return jfn(a, b)

    compare.__name__ = compare.__qualname__ = jfn.__name__
    return compare


eq, ne, lt, le, gt, ge = (_compare(f) for f in (jnp.equal, jnp.not_equal, jnp.less, jnp.less_equal, jnp.greater,
                                                 jnp.greater_equal))
for _f, _n in zip((eq, ne, lt, le, gt, ge), ("eq", "ne", "lt", "le", "gt", "ge")):
    _f.__name__ = _f.__qualname__ = _n


def logical_and(input, other, *, out=None):
    return jnp.logical_and(input, other)


def logical_or(input, other, *, out=None):
    return jnp.logical_or(input, other)


def logical_xor(input, other, *, out=None):
    return jnp.logical_xor(input, other)


def logical_not(input, *, out=None):
    return jnp.logical_not(input)


def bitwise_and(input, other, *, out=None):
    a, b = promote(input, other)
    return a & b


def bitwise_or(input, other, *, out=None):
    a, b = promote(input, other)
    return a | b


def bitwise_xor(input, other, *, out=None):
    a, b = promote(input, other)
    return a ^ b


def bitwise_not(input, *, out=None):
    return ~jnp.asarray(input)


def maximum(input, other, *, out=None):
    a, b = promote(input, other)
    return jnp.maximum(a, b)


def minimum(input, other, *, out=None):
    a, b = promote(input, other)
    return jnp.minimum(a, b)


def round(input, *, decimals=0, out=None):  # noqa: A001
    """Half to even, as torch."""
    return jnp.round(input, decimals)


def square(input, *, out=None):
    x = jnp.asarray(input)
    return x * x


def sign(input, *, out=None):
    return jnp.sign(input)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None, *, out=None):
    return jnp.nan_to_num(input, nan=nan, posinf=posinf, neginf=neginf)


def einsum(equation, *operands):
    """torch.einsum(equation, *operands) or (equation, [operands])."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return jnp.einsum(equation, *operands)


def tril(input, diagonal=0, *, out=None):
    return jnp.tril(input, diagonal)


def triu(input, diagonal=0, *, out=None):
    return jnp.triu(input, diagonal)


def unary(name: str, jfn, floats: bool = True):
    """An element-wise torch function of one tensor; ``floats``: integers compute in torch's
    default float, as torch.exp(int_tensor) does."""

    def fn(input, *, out=None):
        return jfn(as_float(input) if floats else jnp.asarray(input))

    fn.__name__ = fn.__qualname__ = name
    return fn


# ---- the table ------------------------------------------------------------------------------

def _binary_source(op: str, fn, rop: bool = False):
    def render(args, kwargs):
        from funcnet.interop.ops._core import bind

        b = bind(fn, args, kwargs)
        first, second = list(b.values())[:2]
        alpha = b.get("alpha")
        if alpha is not None and literal(alpha) != 1:
            second = f"{alpha} * {atom(second)}"
        left, right = (second, first) if rop else (first, second)
        return f"{strong(left) if op == '**' else atom(left)} {op} {atom(right)}"

    return render


def _names(name, methods=True, torch_fn=True, dunders=()):
    out = [f"Tensor.{name}"] if methods else []
    if torch_fn:
        out.append(f"torch.{name}")
    return out + [f"Tensor.{d}" for d in dunders]


def _register_table():
    binaries = [
        (add, "+", ["add"], ["__add__", "__radd__"]), (sub, "-", ["sub", "subtract"], ["__sub__"]),
        (mul, "*", ["mul", "multiply"], ["__mul__", "__rmul__"]), (matmul, "@", ["matmul"], ["__matmul__"]),
        (remainder, "%", ["remainder"], ["__mod__"]), (floor_divide, "//", ["floor_divide"], ["__floordiv__"]),
        (pow, "**", ["pow"], ["__pow__"]), (eq, "==", ["eq"], ["__eq__"]), (ne, "!=", ["ne", "not_equal"], ["__ne__"]),
        (lt, "<", ["lt", "less"], ["__lt__"]), (le, "<=", ["le", "less_equal"], ["__le__"]),
        (gt, ">", ["gt", "greater"], ["__gt__"]), (ge, ">=", ["ge", "greater_equal"], ["__ge__"]),
        (bitwise_and, "&", ["bitwise_and"], ["__and__", "__rand__"]),
        (bitwise_or, "|", ["bitwise_or"], ["__or__", "__ror__"]),
        (bitwise_xor, "^", ["bitwise_xor"], ["__xor__", "__rxor__"]),
    ]
    for fn, op, names, dunders in binaries:
        register([n for name in names for n in _names(name)] + [f"Tensor.{d}" for d in dunders], fn,
                 _binary_source(op, fn))
    register(["Tensor.mm", "torch.mm", "Tensor.bmm", "torch.bmm"], mm, _binary_source("@", mm))
    register(["Tensor.__rsub__", "torch.rsub"], rsub, None)
    register(["Tensor.__rpow__"], rpow, _binary_source("**", rpow, rop=True))
    register(["Tensor.__rtruediv__", "Tensor.__rdiv__"], rtruediv, None)
    register(["Tensor.__rfloordiv__"], rfloordiv, _binary_source("//", rfloordiv, rop=True))
    register(["Tensor.__rmod__"], rmod, _binary_source("%", rmod, rop=True))
    register(["Tensor.__rmatmul__"], lambda input, other: jnp.matmul(other, input),
             lambda a, k: f"{atom(a[1])} @ {atom(a[0])}")
    register(_names("div") + _names("divide") + _names("true_divide") + ["Tensor.__truediv__", "Tensor.__div__"],
             div, None)
    register(_names("fmod"), fmod, lambda a, k: call("jnp.fmod", a, k))
    register(_names("neg") + _names("negative") + ["Tensor.__neg__"], neg, lambda a, k: f"-{strong(a[0])}")
    register(["Tensor.__pos__", "Tensor.positive", "torch.positive"], lambda input: input, lambda a, k: a[0])
    register(_names("addmm"), addmm, None)
    register(_names("baddbmm"), baddbmm, None)  # its own names: torch passes batch1=, batch2= by keyword
    register(_names("outer") + _names("ger"), outer, lambda a, k: call("jnp.outer", a))
    register(_names("clamp") + _names("clip"), clamp, None)
    register(_names("clamp_min"), lambda input, min: clamp(input, min=min), lambda a, k: call("jnp.maximum", a))
    register(_names("clamp_max"), lambda input, max: clamp(input, max=max), lambda a, k: call("jnp.minimum", a))
    register(_names("lerp"), lerp, None)
    register(_names("addcmul"), addcmul, None)
    register(_names("addcdiv"), addcdiv, None)
    register(["torch.where"], where, lambda a, k: call("jnp.where", a, k))
    register(["Tensor.where"], tensor_where, lambda a, k: call("jnp.where", [a[1], a[0], a[2]]))
    for fn, names in ((logical_and, ["logical_and"]), (logical_or, ["logical_or"]), (logical_xor, ["logical_xor"]),
                      (maximum, ["maximum"]), (minimum, ["minimum"]), (tril, ["tril"]),
                      (triu, ["triu"]), (sign, ["sign"]), (nan_to_num, ["nan_to_num"])):
        register([n for name in names for n in _names(name)], fn,
                 (lambda jname: lambda a, k: call(f"jnp.{jname}", a, {"k" if kk == "diagonal" else kk: v
                                                                         for kk, v in k.items()}))(fn.__name__))
    register(_names("logical_not"), logical_not, lambda a, k: call("jnp.logical_not", a))
    register(_names("bitwise_not") + ["Tensor.__invert__"], bitwise_not, lambda a, k: f"~{strong(a[0])}")
    register(_names("round"), round, lambda a, k: call("jnp.round", a + list(k.values())))
    register(_names("square"), square, lambda a, k: f"{strong(a[0])} ** 2")
    register(["torch.einsum"], einsum, lambda a, k: call("jnp.einsum", a[:1] + (
        [a[1][1:-1]] if len(a) == 2 and a[1][:1] + a[1][-1:] in ("[]", "()") else a[1:])))
    for name, jfn in (("exp", jnp.exp), ("exp2", jnp.exp2), ("expm1", jnp.expm1), ("log", jnp.log),
                      ("log2", jnp.log2), ("log10", jnp.log10), ("log1p", jnp.log1p), ("sqrt", jnp.sqrt),
                      ("sin", jnp.sin), ("cos", jnp.cos), ("tan", jnp.tan), ("asin", jnp.arcsin),
                      ("acos", jnp.arccos), ("atan", jnp.arctan), ("sinh", jnp.sinh), ("cosh", jnp.cosh),
                      ("asinh", jnp.arcsinh), ("acosh", jnp.arccosh), ("atanh", jnp.arctanh),
                      ("reciprocal", jnp.reciprocal), ("trunc", jnp.trunc)):
        register(_names(name), unary(name, jfn), (lambda j: lambda a, k: call(f"jnp.{j}", a))(jfn.__name__))
    for name, jfn in (("abs", jnp.abs), ("floor", jnp.floor), ("ceil", jnp.ceil)):
        # integers keep their dtype
        register(_names(name) + (["Tensor.__abs__", "Tensor.absolute", "torch.absolute"] if name == "abs" else []),
                 unary(name, jfn, floats=False), (lambda j: lambda a, k: call(f"jnp.{j}", a))(name))
    register(["Tensor.frac", "torch.frac"], unary("frac", lambda x: x - jnp.trunc(x)),
             lambda a, k: f"{atom(a[0])} - jnp.trunc({a[0]})")
    for name, jfn in (("rsqrt", rsqrt), ("erf", erf), ("erfc", erfc), ("erfinv", erfinv)):
        register(_names(name) + ([f"torch.special.{name}"] if name != "rsqrt" else []), jfn, None)
    for name, jfn in (("isnan", jnp.isnan), ("isinf", jnp.isinf), ("isfinite", jnp.isfinite),
                      ("isposinf", jnp.isposinf), ("isneginf", jnp.isneginf), ("signbit", jnp.signbit)):
        register(_names(name), unary(name, jfn, floats=False), (lambda j: lambda a, k: call(f"jnp.{j}", a))(name))
    # the activations and softmax as torch functions and methods: funcnet's F
    activations = {"relu": ["Tensor.relu", "torch.relu"], "sigmoid": ["Tensor.sigmoid", "torch.sigmoid",
                                                                      "torch.special.expit"],
                   "tanh": ["Tensor.tanh", "torch.tanh"], "selu": ["torch.selu"], "celu": ["torch.celu"],
                   "prelu": ["torch.prelu", "Tensor.prelu"],
                   "softmax": ["Tensor.softmax", "torch.softmax", "torch.special.softmax"],
                   "log_softmax": ["Tensor.log_softmax", "torch.log_softmax", "torch.special.log_softmax"]}
    for name, names in activations.items():
        # torch.sigmoid and tanh of an integer tensor are float32, as torch.exp's
        fn = unary(name, getattr(F, name)) if name in ("sigmoid", "tanh") else getattr(F, name)
        register(names, fn, (lambda n: lambda a, k: call(f"F.{n}", a, k))(name))


_register_table()
