"""Every rule of the converter's op table (``interop.ops.OPS``) run against the torch op itself.

The table below (``CASES``) gives each registered name its calls: tiny random arrays (float64
unless a case says otherwise), positional and keyword arguments, broadcasting, and the dtype
cases the rule claims (integer inputs, Python numbers, 0-d tensors of another dtype). Each
call runs on torch (CPU) and on the rule (eagerly, no jit: a few CPU-seconds for the whole
table), and the results must agree in shape, dtype and value. A registered name without an
entry fails, so a new rule cannot go in untested. Random rules are checked by shape, dtype
and a statistic of a larger draw; rules that mutate (``Op.mutates``) by their result and the
new value of each mutated argument.
"""

from __future__ import annotations

import functools
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from funcnet.interop import ops  # noqa: E402

# ---- the arguments ------------------------------------------------------------------------

_NP = {"f8": np.float64, "f4": np.float32, "f2": np.float16, "i8": np.int64, "i4": np.int32, "u1": np.uint8,
       "b": np.bool_}
_TORCH_DT = {"f8": torch.float64, "f4": torch.float32, "f2": torch.float16, "bf16": torch.bfloat16,
             "i8": torch.int64, "i4": torch.int32, "i2": torch.int16, "i1": torch.int8, "u1": torch.uint8,
             "b": torch.bool}
_JAX_DT = {"f8": jnp.float64, "f4": jnp.float32, "f2": jnp.float16, "bf16": jnp.bfloat16, "i8": jnp.int64,
           "i4": jnp.int32, "i2": jnp.int16, "i1": jnp.int8, "u1": jnp.uint8, "b": jnp.bool_}


class A:
    """An array argument: ``A(2, 3)`` uniform in [lo, hi) float64; ``dtype="i8"`` integers in
    [lo, hi); ``"b"`` bools; ``values=`` a fixed list."""

    def __init__(self, *shape, dtype="f8", lo=-2.0, hi=2.0, values=None, post=None):
        self.shape, self.dtype, self.lo, self.hi, self.values, self.post = shape, dtype, lo, hi, values, post

    def make(self, rng):
        if self.post is not None:
            return self.post(A(*self.shape, dtype=self.dtype, lo=self.lo, hi=self.hi, values=self.values).make(rng))
        if self.values is not None:
            return np.asarray(self.values, _NP[self.dtype]).reshape(self.shape or np.shape(self.values))
        if self.dtype == "b":
            return rng.random(self.shape) < 0.5
        if self.dtype[0] in "iu":
            return rng.integers(int(self.lo), int(self.hi), self.shape).astype(_NP[self.dtype])
        return rng.uniform(self.lo, self.hi, self.shape).astype(_NP[self.dtype])


class D:
    """A dtype argument: torch's on torch's side, jnp's on the rule's."""

    def __init__(self, dtype):
        self.dtype = dtype


DEV = object()  # torch.device("cpu") on torch's side, None on the rule's (devices are dropped)


class C:
    """One call: its arguments, with ``A``/``D``/``DEV`` placeholders anywhere inside lists."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class X(C):
    """A call the rule refuses (a ValueError or TypeError) where torch accepts it: a choice of the rule."""


class R(C):
    """A call of a random rule: shape and dtype against torch's, and ``stat`` (a function of the
    result as a float64 numpy array: a mean, a fraction) within ``tol`` of torch's."""

    def __init__(self, *args, stat=None, tol=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stat, self.tol = stat, tol


def _materialise(value, rng):
    if isinstance(value, A):
        return value.make(rng)
    if isinstance(value, (list, tuple)):
        return type(value)(_materialise(v, rng) for v in value)
    if isinstance(value, dict):
        return {k: _materialise(v, rng) for k, v in value.items()}
    return value


def _side(value, torch_side: bool):
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy()) if torch_side else jax.device_put(value)  # no compile, as asarray's
    if isinstance(value, D):
        return (_TORCH_DT if torch_side else _JAX_DT)[value.dtype]
    if value is DEV:
        return torch.device("cpu") if torch_side else None
    if isinstance(value, (list, tuple)):
        return type(value)(_side(v, torch_side) for v in value)
    if isinstance(value, dict):
        return {k: _side(v, torch_side) for k, v in value.items()}
    return value


# ---- the table ----------------------------------------------------------------------------

CASES: dict[str, list[C]] = {}


def cases(names: str, *calls: C) -> None:
    for name in names.split():
        assert name not in CASES, f"{name} twice in the table"
        CASES[name] = list(calls)


def both(stem: str, extra: str = "") -> str:
    """``Tensor.stem torch.stem`` plus the names in ``extra``."""
    return f"Tensor.{stem} torch.{stem} {extra}"


F2, I2, B2 = A(2, 3), A(2, 3, dtype="i8", lo=-5, hi=6), A(2, 3, dtype="b")
POS = A(2, 3, lo=0.25, hi=2.0)  # away from 0: a divisor, a log's argument
NONZERO_I = A(3, dtype="i8", lo=1, hi=4)

# binary arithmetic: broadcasting, Python numbers, integer tensors with float numbers (torch's
# promotion: int tensor * 0.5 is float32), a float32 tensor with a float64 0-d tensor (stays float32)
BINARY = [C(A(2, 3), A(3)), C(A(2, 1), A(1, 3)), C(A(2, 3), 2.5), C(I2, 3), C(I2, 0.5),
          C(A(2, 3, dtype="f4"), A(dtype="f8")), C(A(2, 3, dtype="i4"), A(3, dtype="i8"))]
DIVIDING = [C(A(2, 3), A(3, lo=0.5, hi=2.0)), C(A(2, 3, lo=-3, hi=3), -1.5), C(I2, NONZERO_I), C(I2, 2),
            C(A(2, 3, dtype="f4"), A(dtype="f8", lo=0.5, hi=1))]
COMPARE = [C(A(2, 3), A(3)), C(I2, A(2, 1, dtype="i8", lo=-5, hi=6)), C(I2, 0.5), C(A(2, 3), 0),
           C(A(2, 3, values=[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]), A(3, values=[1.0, 0.0, 3.0]))]
BITWISE = [C(A(2, 3, dtype="i8", lo=0, hi=16), A(3, dtype="i8", lo=0, hi=16)), C(B2, A(3, dtype="b")),
           C(A(2, 3, dtype="i8", lo=0, hi=16), 5)]


def _kw(calls, **names):
    """``calls`` with their second argument also passed by keyword (``other=``)."""
    (name,) = names
    out = list(calls)
    for c in calls[:2]:
        out.append(C(c.args[0], **{name: c.args[1]}, **c.kwargs))
    return out


cases(both("add", "Tensor.__add__ Tensor.__radd__"), *BINARY, C(A(2, 3), A(3), alpha=2), C(I2, 2, alpha=3))
CASES["Tensor.add"] += _kw(BINARY, other=None)[len(BINARY):]
CASES["torch.add"] += _kw(BINARY, other=None)[len(BINARY):]
cases(both("sub", both("subtract", "Tensor.__sub__")), *BINARY, C(A(2, 3), A(3), alpha=0.5))
for n in ("Tensor.sub", "torch.sub", "torch.subtract"):
    CASES[n] += _kw(BINARY, other=None)[len(BINARY):]
cases(both("mul", both("multiply", "Tensor.__mul__ Tensor.__rmul__")), *BINARY, C(B2, A(3, dtype="b")))
CASES["torch.mul"] += _kw(BINARY, other=None)[len(BINARY):]
cases(both("div", both("divide", both("true_divide", "Tensor.__truediv__ Tensor.__div__"))), *DIVIDING)
for n in ("torch.div", "Tensor.div", "torch.divide"):
    CASES[n] += [C(A(2, 3), other=A(3, lo=0.5, hi=2)), C(A(2, 3, lo=-4, hi=4), A(3, lo=0.5, hi=2), rounding_mode="floor"),
                 C(A(2, 3, lo=-4, hi=4), A(3, lo=0.5, hi=2), rounding_mode="trunc"),
                 C(I2, A(3, dtype="i8", lo=-3, hi=-1), rounding_mode="trunc"), C(I2, 2, rounding_mode="floor")]
cases(both("remainder", "Tensor.__mod__"), *DIVIDING, C(I2, A(3, dtype="i8", lo=-3, hi=-1)))
CASES["torch.remainder"] += [C(A(2, 3), other=A(3, lo=0.5, hi=2))]
cases(both("fmod"), *DIVIDING, C(I2, A(3, dtype="i8", lo=-3, hi=-1)), C(A(2, 3), other=1.5))
cases(both("floor_divide", "Tensor.__floordiv__"), *DIVIDING)
cases(both("pow", "Tensor.__pow__"), C(A(2, 3), 2), C(A(2, 3), 3), C(A(2, 3, lo=0.5, hi=2), A(3)),
      C(A(2, 3, lo=0.5, hi=2), 0.5), C(A(2, 3, dtype="i8", lo=0, hi=5), 2), C(A(2, 3, dtype="i8", lo=1, hi=5), 0.5),
      C(A(2, 3, dtype="f4"), A(dtype="f8", lo=1, hi=2)))
CASES["torch.pow"] += [C(A(2, 3, lo=0.5, hi=2), exponent=A(3))]
CASES["Tensor.pow"] += [C(A(2, 3, lo=0.5, hi=2), exponent=1.5)]
for stem, dunder, alias in (("eq", "__eq__", ""), ("ne", "__ne__", "not_equal"), ("lt", "__lt__", "less"),
                            ("le", "__le__", "less_equal"), ("gt", "__gt__", "greater"),
                            ("ge", "__ge__", "greater_equal")):
    cases(both(stem, f"Tensor.{dunder}" + (" " + both(alias) if alias else "")), *COMPARE)
    CASES[f"torch.{stem}"] += [C(A(2, 3), other=A(3))]
for stem, dunders in (("bitwise_and", "__and__ __rand__"), ("bitwise_or", "__or__ __ror__"),
                      ("bitwise_xor", "__xor__ __rxor__")):
    cases(both(stem, " ".join(f"Tensor.{d}" for d in dunders.split())), *BITWISE)
    CASES[f"torch.{stem}"] += [C(B2, other=A(3, dtype="b"))]
cases("Tensor.__rsub__ torch.rsub", *BINARY)
CASES["torch.rsub"] += [C(A(2, 3), A(3), alpha=2)]
cases("Tensor.__rpow__", C(A(2, 3), 2), C(A(2, 3), 0.5), C(A(2, 3, dtype="i8", lo=0, hi=4), 2))
cases("Tensor.__rtruediv__ Tensor.__rdiv__", C(POS, 3), C(A(2, 3, dtype="i8", lo=1, hi=5), 2))
cases("Tensor.__rfloordiv__ Tensor.__rmod__", C(POS, 3.5), C(A(2, 3, dtype="i8", lo=1, hi=5), 7),
      C(A(2, 3, lo=-2, hi=-0.5), 3.5))
cases("Tensor.__rmatmul__", C(A(3, 4), A(2, 3)))
cases(both("matmul", "Tensor.__matmul__"), C(A(2, 3), A(3, 4)), C(A(2, 2, 3), A(3)), C(A(3), A(2, 3, 4)),
      C(A(2, 1, 2, 3), A(3, 3, 2)))
CASES["torch.matmul"] += [C(A(2, 3), other=A(3, 4))]
cases(both("mm"), C(A(2, 3), A(3, 4)))
CASES["torch.mm"] += [C(A(2, 3), mat2=A(3, 4))]
cases(both("bmm"), C(A(2, 2, 3), A(2, 3, 4)))
CASES["torch.bmm"] += [C(A(2, 2, 3), mat2=A(2, 3, 4))]
cases(both("neg", both("negative", "Tensor.__neg__")), C(F2), C(I2))
cases("Tensor.__pos__ Tensor.positive torch.positive", C(F2), C(I2))
cases(both("addmm"), C(A(2, 4), A(2, 3), A(3, 4)), C(A(4), A(2, 3), A(3, 4), beta=0.5, alpha=2),
      C(A(2, 4), mat1=A(2, 3), mat2=A(3, 4)), C(A(2, 4, values=[float("nan")] * 8), A(2, 3), A(3, 4), beta=0))
cases(both("baddbmm"), C(A(2, 2, 4), A(2, 2, 3), A(2, 3, 4)), C(A(2, 4), A(2, 2, 3), A(2, 3, 4), beta=0.5, alpha=2),
      C(A(2, 2, 4), batch1=A(2, 2, 3), batch2=A(2, 3, 4), alpha=0.5))
cases(both("outer", both("ger")), C(A(3), A(4)), C(A(3, dtype="i8"), A(2)))
CASES["torch.outer"] += [C(A(3), vec2=A(4))]
CASES["Tensor.outer"] += [C(A(3), vec2=A(4))]
cases(both("clamp", both("clip")), C(F2, -0.5, 0.5), C(F2, min=-0.5), C(F2, max=0.5), C(F2, A(3), A(2, 1)),
      C(I2, -1, 2), C(I2, 0.5), C(F2, 0.5, -0.5))
cases(both("clamp_min"), C(F2, 0.1), C(I2, -1))
cases(both("clamp_max"), C(F2, 0.1), C(I2, -1))
cases(both("lerp"), C(A(2, 3), A(3), 0.3), C(A(2, 3), A(3), 0.8), C(A(2, 3), A(3), A(2, 1, lo=0, hi=1)),
      C(A(2, 3), end=A(3), weight=0.25))
cases(both("addcmul"), C(A(2, 3), A(3), A(2, 1)), C(A(2, 3), A(3), A(2, 1), value=0.5),
      C(A(2, 3), tensor1=A(3), tensor2=A(2, 3), value=-2))
cases(both("addcdiv"), C(A(2, 3), A(3), A(2, 1, lo=0.5, hi=2)), C(A(2, 3), A(3), A(2, 1, lo=0.5, hi=2), value=0.5),
      C(A(2, 3), tensor1=A(3), tensor2=A(2, 3, lo=0.5, hi=2), value=-2))
cases("torch.where", C(B2, A(2, 3), A(3)), C(A(2, 1, dtype="b"), A(2, 3), 0.0), C(B2, I2, 0.5),
      C(B2, input=A(3), other=A(2, 3)))
cases("Tensor.where", C(A(2, 3), B2, A(3)), C(A(2, 3), B2, 1.5))
cases(both("logical_and") + both("logical_or") + both("logical_xor"), C(A(2, 3, values=[0.0, 1, -2, 0, 3, 0]), A(3)),
      C(B2, A(3, dtype="b")), C(I2, A(2, 1, dtype="i8", lo=0, hi=2)))
cases(both("logical_not"), C(A(2, 3, values=[0.0, 1, -2, 0, 3, 0])), C(B2), C(I2))
cases(both("maximum") + both("minimum"), C(A(2, 3), A(3)), C(I2, A(2, 1, dtype="i8")),
      C(A(3, values=[1.0, float("nan"), 2.0]), A(3, values=[float("nan"), 1.0, 1.0])))
CASES["torch.maximum"] += [C(A(2, 3), other=A(3))]
cases(both("tril") + both("triu"), C(A(3, 4)), C(A(2, 3, 4), 1), C(A(3, 4), diagonal=-1), C(A(3, 3, dtype="i8")))
cases(both("sign"), C(A(2, 3, values=[-1.5, 0.0, 2.0, -0.0, 3.0, -2.0])), C(I2))
cases(both("nan_to_num"), C(A(5, values=[1.0, float("nan"), float("inf"), -float("inf"), -2.0])),
      C(A(5, values=[1.0, float("nan"), float("inf"), -float("inf"), -2.0]), 0.5, 100.0, -100.0),
      C(A(5, values=[1.0, float("nan"), float("inf"), -float("inf"), -2.0]), nan=1.5, posinf=9.0))
cases(both("bitwise_not", "Tensor.__invert__"), C(I2), C(B2))
cases(both("round"), C(A(2, 3, values=[0.5, 1.5, 2.5, -0.5, -1.5, 0.49])), C(A(2, 3, lo=-5, hi=5), decimals=2), C(I2))
cases(both("square"), C(F2), C(I2))
cases("torch.einsum", C("ij,jk->ik", A(2, 3), A(3, 4)), C("bij,bjk->bik", [A(2, 2, 3), A(2, 3, 4)]),
      C("ii->i", A(3, 3)), C("i,j", A(2), A(3)))

_UNARY_DOMAIN = {"exp": (-2, 2), "exp2": (-2, 2), "expm1": (-2, 2), "log": (0.1, 3), "log2": (0.1, 3),
                 "log10": (0.1, 3), "log1p": (-0.5, 3), "sqrt": (0, 3), "sin": (-3, 3), "cos": (-3, 3),
                 "tan": (-1.2, 1.2), "asin": (-0.95, 0.95), "acos": (-0.95, 0.95), "atan": (-3, 3),
                 "sinh": (-2, 2), "cosh": (-2, 2), "asinh": (-3, 3), "acosh": (1.05, 3), "atanh": (-0.95, 0.95),
                 "reciprocal": (0.2, 3), "trunc": (-3, 3), "rsqrt": (0.1, 3), "erf": (-2, 2), "erfc": (-2, 2),
                 "erfinv": (-0.95, 0.95), "frac": (-3, 3), "sigmoid": (-4, 4), "tanh": (-3, 3)}
_INT_DOMAIN = {"log": (1, 5), "log2": (1, 5), "log10": (1, 5), "sqrt": (0, 5), "reciprocal": (1, 5), "acosh": (1, 5),
               "rsqrt": (1, 5), "asin": (0, 1), "acos": (0, 1), "atanh": (0, 1), "erfinv": (0, 1), "log1p": (0, 5)}
for stem, (lo, hi) in _UNARY_DOMAIN.items():
    extra = {"erf": "torch.special.erf", "erfc": "torch.special.erfc", "erfinv": "torch.special.erfinv",
             "sigmoid": "torch.special.expit F.sigmoid", "tanh": "F.tanh"}.get(stem, "")
    ilo, ihi = _INT_DOMAIN.get(stem, (-3, 4))
    int_case = [] if stem in ("frac", "trunc") else [C(A(2, 3, dtype="i8", lo=ilo, hi=ihi))]
    cases(both(stem, extra), C(A(2, 3, lo=lo, hi=hi)), C(A(2, 3, lo=lo, hi=hi, dtype="f4")), *int_case)
cases(both("abs", "Tensor.__abs__ " + both("absolute")), C(F2), C(I2), C(A(3, values=[-0.0, 1.0, -3.0])))
cases(both("floor") + both("ceil"), C(A(2, 3, lo=-3, hi=3)), C(I2))
_SPECIAL = A(6, values=[1.0, float("nan"), float("inf"), -float("inf"), -0.0, -2.0])
cases(both("isnan") + both("isinf") + both("isfinite") + both("isposinf") + both("isneginf") + both("signbit"),
      C(_SPECIAL), C(I2))
cases(both("relu", "F.relu"), C(F2), C(I2))
cases("torch.selu F.selu torch.celu", C(F2))
cases("F.celu", C(F2), C(F2, alpha=0.5), C(F2, 2.0))
cases("torch.prelu Tensor.prelu F.prelu", C(A(2, 3, 4), A(3)), C(A(2, 3), A(1)))
_SOFTMAX = [C(A(2, 3, 4), 1), C(A(2, 3, 4), dim=-1), C(A(2, 3), 0, dtype=D("f4")), C(A(2, 3), dim=1, dtype=D("f8"))]
cases("Tensor.softmax torch.softmax Tensor.log_softmax torch.log_softmax", *_SOFTMAX)
cases("torch.special.softmax torch.special.log_softmax", *_SOFTMAX[:2])
cases("F.softmax F.log_softmax F.softmin", *_SOFTMAX, C(A(2, 3, dtype="f4"), dim=1, dtype=D("f8")))

# ---- factories and casts
cases("torch.zeros torch.ones", C(2, 3), C((2, 3)), C([2, 3], dtype=D("i8")), C(2, dtype=D("b"), device=DEV),
      C(size=(3,)))
cases("torch.empty", R(2, 3), R((2, 3), dtype=D("i8")))  # values undefined: shape and dtype (R)
cases("torch.full", C((2, 3), 1.5), C((2,), 7), C((2,), True), C((2, 2), 2, dtype=D("f8")),
      C(size=(3,), fill_value=-1.0))
cases("torch.arange", C(5), C(1, 7, 2), C(0.0, 1.0, 0.25), C(5, dtype=D("f4")), C(start=1, end=4),
      C(-1.0, 2), C(0, 1, 0.1))
cases("torch.linspace", C(0, 1, 5), C(-2.0, 3.0, steps=4), C(0, 10, 3, dtype=D("i8")), C(start=1, end=2, steps=1))
cases("torch.eye", C(3), C(2, 3), C(3, dtype=D("i8")), C(n=2, m=4))
cases("torch.tensor torch.as_tensor torch.asarray", C([1, 2, 3]), C([[1.5, 2.0]]), C(3.0), C(True), C([1, 2], dtype=D("f8")),
      C(A(2, 3)), C(A(2, dtype="i4")))
cases("torch.zeros_like torch.ones_like", C(F2), C(I2), C(F2, dtype=D("i8")))
cases("torch.empty_like", R(F2), R(I2), R(F2, dtype=D("i8")))
cases("torch.full_like", C(F2, 2.5), C(I2, 3), C(F2, fill_value=1, dtype=D("i8")))
cases("Tensor.new_zeros Tensor.new_ones", C(F2, 2, 3), C(I2, (3,)), C(F2, [2], dtype=D("i8")))
cases("Tensor.new_empty", R(F2, 2, 3), R(I2, (3,)), R(F2, [2], dtype=D("i8")))
cases("Tensor.new_full", C(F2, (2,), 1.5), C(I2, (3,), 2), C(F2, size=(2, 2), fill_value=3, dtype=D("i8")))
cases("Tensor.new_tensor", C(F2, [1, 2]), C(I2, [1.5, 2.5]), C(F2, [1, 2], dtype=D("i4")))
cases("Tensor.to", C(F2, D("f4")), C(F2, dtype=D("i8")), C(I2, DEV, D("f8")), C(I2, A(2, dtype="f4")), C(F2, DEV))
cases("Tensor.float Tensor.double Tensor.half Tensor.bfloat16 Tensor.long Tensor.int Tensor.short Tensor.char "
      "Tensor.bool", C(A(2, 3, lo=-3, hi=3)), C(A(2, 3, dtype="i8", lo=0, hi=100)))
# a negative float into uint8 is undefined in C (torch wraps, XLA saturates): in range only
cases("Tensor.byte", C(A(2, 3, lo=0, hi=200)), C(A(2, 3, dtype="i8", lo=0, hi=100)))
cases("Tensor.type_as", C(F2, A(2, dtype="i4")), C(I2, A(2, dtype="f4")))
cases("Tensor.type", C(F2, D("i8")), C(I2, dtype=D("f4")))
cases("Tensor.is_floating_point torch.is_floating_point Tensor.dtype Tensor.device", C(F2), C(I2), C(A(2, dtype="f4")))
cases("torch._weight_norm", C(A(4, 3), A(4, 1), 0), C(A(4, 3), A(1, 3), 1), C(A(4, 3), A(), -1))

# ---- functional
cases("F.relu6", C(A(2, 3, lo=-3, hi=8)))
cases("F.hardtanh", C(F2), C(F2, -0.5, 0.5), C(F2, min_val=-1.5, max_val=0.25))
cases("F.hardswish F.hardsigmoid F.silu F.mish F.logsigmoid F.softsign F.tanhshrink",
      C(A(2, 3, lo=-4, hi=4)), C(A(2, 3, lo=-4, hi=4, dtype="f4")))
cases("F.gelu", C(F2), C(F2, approximate="tanh"))
cases("F.softplus", C(F2), C(A(2, 3, lo=-10, hi=10), beta=2, threshold=5), C(F2, 0.5))
cases("F.elu", C(F2), C(F2, alpha=0.5), C(F2, 2.0))
cases("F.leaky_relu", C(F2), C(F2, 0.2), C(F2, negative_slope=0.3))
cases("F.threshold", C(F2, 0.5, -1.0), C(F2, threshold=0.1, value=20.0))
cases("F.glu", C(A(2, 4)), C(A(4, 2), 0), C(A(2, 2, 6), dim=-1))
cases("F.linear", C(A(2, 3), A(4, 3)), C(A(2, 5, 3), A(4, 3), A(4)), C(A(3), weight=A(4, 3), bias=A(4)))
cases("F.conv1d torch.conv1d", C(A(2, 4, 7), A(6, 4, 3)), C(A(2, 4, 7), A(6, 2, 3), A(6), 2, 1, 1, 2),
      C(A(1, 2, 9), A(3, 2, 3), bias=A(3), padding="same", dilation=2))
cases("F.conv2d torch.conv2d", C(A(1, 2, 5, 6), A(3, 2, 3, 2)),
      C(A(1, 4, 6, 6), A(4, 2, 3, 3), A(4), (2, 1), (1, 0), 1, 2), C(A(1, 2, 5, 5), A(3, 2, 3, 3), stride=2, padding=1))
cases("F.conv3d torch.conv3d", C(A(1, 2, 4, 4, 3), A(3, 2, 2, 2, 2), A(3), 1, 1))
cases("F.conv_transpose1d torch.conv_transpose1d", C(A(1, 4, 5), A(4, 3, 3)),
      C(A(1, 4, 5), A(4, 2, 3), A(4), 2, 1, 1, 2), C(A(1, 2, 5), A(2, 3, 3), stride=2, padding=1, dilation=2))
cases("F.conv_transpose2d torch.conv_transpose2d", C(A(1, 2, 3, 4), A(2, 3, 3, 2)),
      C(A(1, 2, 3, 3), A(2, 2, 3, 3), A(2), 2, 1, 1))
cases("F.conv_transpose3d torch.conv_transpose3d", C(A(1, 2, 2, 3, 2), A(2, 3, 2, 2, 2), A(3), 2))
cases("F.max_pool1d torch.max_pool1d", C(A(2, 3, 8), 2), C(A(2, 3, 9), 3, 2, 1), C(A(1, 2, 7), kernel_size=2, ceil_mode=True))
cases("F.max_pool2d torch.max_pool2d", C(A(1, 2, 6, 6), 2), C(A(1, 2, 7, 6), (3, 2), (2, 1), 1),
      C(A(1, 2, 5, 5), kernel_size=2, stride=2, ceil_mode=True))
cases("F.max_pool3d torch.max_pool3d", C(A(1, 2, 4, 4, 4), 2), C(A(1, 1, 5, 4, 3), 3, 2, 1))
cases("F.max_pool1d_with_indices", C(A(2, 3, 8), 2), C(A(1, 2, 7), 3, 2, 1))
cases("F.max_pool2d_with_indices", C(A(1, 2, 6, 6), 2), C(A(1, 2, 7, 6), (3, 2), (2, 1), 1))
cases("F.max_pool3d_with_indices", C(A(1, 2, 4, 4, 4), 2))
cases("F.avg_pool1d torch.avg_pool1d", C(A(2, 3, 8), 2), C(A(2, 3, 9), 3, 2, 1),
      C(A(1, 2, 7), 3, 2, 1, count_include_pad=False), C(A(1, 2, 7), kernel_size=2, ceil_mode=True))
cases("F.avg_pool2d", C(A(1, 2, 6, 6), 2), C(A(1, 2, 7, 6), (3, 2), (2, 1), 1),
      C(A(1, 2, 5, 5), 3, 2, 1, count_include_pad=False), C(A(1, 2, 4, 4), 2, divisor_override=3))
cases("F.avg_pool3d", C(A(1, 2, 4, 4, 4), 2), C(A(1, 1, 5, 4, 3), 3, 2, 1, count_include_pad=False))
cases("F.adaptive_avg_pool1d torch.adaptive_avg_pool1d", C(A(2, 3, 8), 4), C(A(2, 3, 7), 3), C(A(1, 2, 5), output_size=1))
cases("F.adaptive_avg_pool2d", C(A(1, 2, 6, 6), 3), C(A(1, 2, 7, 5), (3, 2)), C(A(1, 2, 5, 5), (None, 2)))
cases("F.adaptive_avg_pool3d", C(A(1, 2, 4, 5, 6), 2), C(A(1, 1, 4, 4, 4), (1, 2, 3)))
cases("F.adaptive_max_pool1d torch.adaptive_max_pool1d", C(A(2, 3, 8), 4), C(A(2, 3, 7), 3))
CASES["F.adaptive_max_pool1d"] += [C(A(1, 2, 6), 3, return_indices=True)]
cases("F.adaptive_max_pool2d", C(A(1, 2, 6, 6), 3), C(A(1, 2, 7, 5), (3, 2)), C(A(1, 2, 4, 4), 2, True))
cases("F.adaptive_max_pool3d", C(A(1, 2, 4, 4, 4), 2), C(A(1, 1, 4, 5, 6), (2, 2, 3)))


def _unpool(n, size, kernel):
    shape = (1, 2) + (size,) * n
    pooled = getattr(torch.nn.functional, f"max_pool{n}d")(
        torch.from_numpy(np.random.default_rng(3).standard_normal(shape)), kernel, return_indices=True)
    return A(*pooled[0].shape), A(*pooled[1].shape, dtype="i8", values=pooled[1].numpy().ravel())


for _n in (1, 2, 3):
    _x, _i = _unpool(_n, 4, 2)
    cases(f"F.max_unpool{_n}d", C(_x, _i, 2), C(_x, _i, kernel_size=2, stride=2))
cases("F.layer_norm", C(A(2, 3, 4), (4,)), C(A(2, 3, 4), [3, 4], A(3, 4), A(3, 4)),
      C(A(2, 4), normalized_shape=(4,), weight=A(4), eps=1e-3))
cases("torch.layer_norm", C(A(2, 3, 4), [4], A(4), A(4), 1e-5))
cases("F.group_norm torch.group_norm", C(A(2, 4, 3), 2), C(A(2, 4, 3, 2), 2, A(4), A(4)), C(A(2, 6, 3), 3, eps=1e-2))
cases("F.local_response_norm", C(A(2, 5, 3), 3), C(A(1, 4, 3, 3), size=2, alpha=0.1, beta=0.5, k=2.0))
cases("F.scaled_dot_product_attention", C(A(2, 2, 3, 4), A(2, 2, 5, 4), A(2, 2, 5, 6)),
      C(A(1, 2, 3, 4), A(1, 2, 3, 4), A(1, 2, 3, 4), is_causal=True),
      C(A(1, 2, 3, 4), A(1, 2, 3, 4), A(1, 2, 3, 4), attn_mask=A(3, 3, dtype="b", values=[1, 0, 1, 1, 1, 0, 1, 1, 1])),
      C(A(1, 2, 3, 4), A(1, 2, 3, 4), A(1, 2, 3, 4), attn_mask=A(1, 3, 3), scale=0.3),
      C(A(1, 4, 3, 4), A(1, 2, 3, 4), A(1, 2, 3, 4), enable_gqa=True))
_IDS = A(2, 3, dtype="i8", lo=0, hi=5)
cases("F.embedding", C(_IDS, A(5, 4)), C(_IDS, A(5, 4), 1), C(_IDS, weight=A(5, 4), padding_idx=0))
cases("torch.embedding", C(A(5, 4), _IDS), C(A(5, 4), _IDS, 2))
cases("F.one_hot", C(_IDS, 6), C(A(4, dtype="i8", values=[0, 2, 1, 2])), C(_IDS, num_classes=5))
cases("F.normalize", C(A(2, 3)), C(A(2, 3, 4), 1.0, -1), C(A(2, 3), p=3, dim=0), C(A(2, 3, values=[0.0] * 6)))
cases("F.cosine_similarity torch.cosine_similarity", C(A(2, 3), A(2, 3)), C(A(2, 3, 4), A(1, 3, 4), 2),
      C(A(4, 3), A(4, 3), dim=0, eps=1e-3))
cases("F.pairwise_distance torch.pairwise_distance", C(A(2, 3), A(2, 3)), C(A(2, 3), A(3), 1.0),
      C(A(2, 3), A(2, 3), p=3, keepdim=True))
cases("F.pad", C(A(2, 3), (1, 2)), C(A(1, 2, 3), (1, 1, 2, 0), value=1.5), C(A(1, 2, 4), (2, 1), "reflect"),
      C(A(1, 2, 3, 3), (1, 1, 1, 1), mode="replicate"), C(A(1, 2, 3), [1, 2], mode="circular"),
      C(A(2, 4), (-1, 1)))
cases("F.interpolate", C(A(1, 2, 4), scale_factor=2), C(A(1, 2, 3, 4), size=(5, 6), mode="bilinear"),
      C(A(1, 2, 3, 4), size=(5, 6), mode="bilinear", align_corners=True), C(A(1, 2, 4, 4), (2, 2), mode="area"),
      C(A(1, 2, 3, 3), scale_factor=1.5, mode="nearest"), C(A(1, 2, 5), size=3, mode="linear"),
      C(A(1, 1, 4, 4), size=(6, 5), mode="bicubic"), C(A(1, 2, 3, 3), scale_factor=2, mode="nearest-exact"))
cases("F.upsample", C(A(1, 2, 4), scale_factor=2), C(A(1, 2, 3, 4), size=(5, 6), mode="bilinear", align_corners=False))
cases("F.upsample_nearest", C(A(1, 2, 3, 3), scale_factor=2), C(A(1, 2, 3), size=5))
cases("F.upsample_bilinear", C(A(1, 2, 3, 3), scale_factor=2), C(A(1, 2, 3, 3), size=(4, 5)))
cases("F.pixel_shuffle torch.pixel_shuffle", C(A(1, 8, 2, 3), 2), C(A(2, 9, 2, 2), upscale_factor=3))
cases("F.pixel_unshuffle torch.pixel_unshuffle", C(A(1, 2, 4, 6), 2), C(A(2, 1, 3, 3), downscale_factor=3))
_LOGITS, _LABELS = A(4, 5), A(4, dtype="i8", values=[0, 3, 4, 1])
cases("F.cross_entropy", C(_LOGITS, _LABELS), C(_LOGITS, _LABELS, A(5, lo=0.5, hi=2)), C(_LOGITS, _LABELS, reduction="none"),
      C(_LOGITS, A(4, dtype="i8", values=[0, -100, 4, 1]), reduction="sum"),
      C(_LOGITS, _LABELS, ignore_index=3, label_smoothing=0.1), C(A(2, 5, 3), A(2, 3, dtype="i8", lo=0, hi=5)),
      C(_LOGITS, A(4, 5, lo=0, hi=1)), C(input=_LOGITS, target=_LABELS, weight=A(5, lo=0.5, hi=2), label_smoothing=0.2))
cases("F.nll_loss", C(_LOGITS, _LABELS), C(_LOGITS, _LABELS, A(5, lo=0.5, hi=2)), C(_LOGITS, _LABELS, reduction="none"),
      C(_LOGITS, A(4, dtype="i8", values=[0, 2, 2, 1]), ignore_index=2), C(A(2, 5, 3), A(2, 3, dtype="i8", lo=0, hi=5)))
# torch broadcasts target to input with a warning; the rules refuse (X): shapes that differ are a bug more often
_REG = [C(A(2, 3), A(2, 3)), X(A(2, 3), A(3)), C(A(2, 3), A(2, 3), reduction="sum"), C(A(2, 3), A(2, 3), reduction="none"),
        C(input=A(4), target=A(4))]
cases("F.mse_loss F.l1_loss", *_REG)
cases("F.smooth_l1_loss", *_REG, C(A(2, 3), A(2, 3), beta=0.5))
cases("F.huber_loss", *_REG, C(A(2, 3), A(2, 3), delta=0.5), C(A(2, 3), A(2, 3), "sum", 2.0))
cases("F.binary_cross_entropy", C(A(2, 3, lo=0.05, hi=0.95), A(2, 3, lo=0, hi=1)),
      C(A(2, 3, lo=0.05, hi=0.95), A(2, 3, lo=0, hi=1), A(3, lo=0.5, hi=2)),
      C(A(4, values=[0.0, 1.0, 0.5, 1.0]), A(4, values=[1.0, 0.0, 0.5, 1.0]), reduction="none"))
cases("F.binary_cross_entropy_with_logits", C(A(2, 3), A(2, 3, lo=0, hi=1)),
      C(A(2, 3), A(2, 3, lo=0, hi=1), A(3, lo=0.5, hi=2), reduction="sum"),
      C(A(2, 3, lo=-30, hi=30), A(2, 3, lo=0, hi=1), pos_weight=A(3, lo=0.5, hi=3)))
cases("F.kl_div", C(A(2, 3), A(2, 3, lo=0.1, hi=1)), C(A(2, 3), A(2, 3), reduction="batchmean", log_target=True),
      C(A(2, 3), A(2, 3, lo=0, hi=1), reduction="none"), C(A(2, 3), A(2, 3, values=[0.0, 0.5, 1, 0, 0.2, 0.3]), reduction="sum"))
cases("F.cosine_embedding_loss", C(A(4, 3), A(4, 3), A(4, values=[1.0, -1, 1, -1])),
      C(A(4, 3), A(4, 3), A(4, values=[1.0, -1, -1, -1]), margin=0.2, reduction="sum"))
cases("F.margin_ranking_loss", C(A(4), A(4), A(4, values=[1.0, -1, 1, -1])),
      C(A(4), A(4), A(4, values=[1.0, -1, -1, 1]), margin=0.5, reduction="none"))
cases("F.triplet_margin_loss", C(A(4, 3), A(4, 3), A(4, 3)), C(A(4, 3), A(4, 3), A(4, 3), margin=0.5, p=1, swap=True),
      C(A(4, 3), A(4, 3), A(4, 3), reduction="none"))
cases("F.poisson_nll_loss", C(A(2, 3), A(2, 3, lo=0, hi=3)), C(A(2, 3, lo=0.1, hi=2), A(2, 3, lo=0, hi=3), False),
      C(A(2, 3), A(2, 3, lo=0, hi=3), full=True, reduction="none"))
cases("F.gaussian_nll_loss", C(A(2, 3), A(2, 3), A(2, 3, lo=0.1, hi=2)), C(A(2, 3), A(2, 3), A(2, 1, lo=0.1, hi=2), full=True),
      C(A(2, 3), A(2, 3), A(2, 3, lo=0.1, hi=2), reduction="none"))
# log-probabilities, as ctc_loss requires (log_softmax of random logits)
_LOGP = A(6, 2, 4, lo=-3, hi=3, post=lambda z: z - np.log(np.exp(z).sum(-1, keepdims=True)))
cases("F.ctc_loss", C(_LOGP, A(2, 3, dtype="i8", lo=1, hi=4), A(2, dtype="i8", values=[6, 5]), A(2, dtype="i8", values=[3, 2])),
      C(_LOGP, A(2, 3, dtype="i8", lo=1, hi=4), A(2, dtype="i8", values=[6, 6]), A(2, dtype="i8", values=[3, 1]),
        reduction="sum"),
      C(_LOGP, A(5, dtype="i8", lo=1, hi=4), A(2, dtype="i8", values=[6, 4]), A(2, dtype="i8", values=[3, 2]),
        reduction="none", blank=0))
# batch norm: the running statistics are mutated (Op.mutates); in training and eval
_BN = (A(4, 3, 2), A(3), A(3, lo=0.5, hi=2))
cases("F.batch_norm", C(*_BN), C(*_BN, A(3), A(3), True, 0.2), C(A(4, 3), A(3), A(3, lo=0.5, hi=2), training=True),
      C(*_BN, weight=A(3), bias=A(3), training=False, eps=1e-3))
cases("torch.batch_norm", C(A(4, 3, 2), A(3), A(3), A(3), A(3, lo=0.5, hi=2), True, 0.1, 1e-5, False),
      C(A(4, 3, 2), None, None, A(3), A(3, lo=0.5, hi=2), False, 0.1, 1e-5, False))
cases("F.instance_norm", C(A(2, 3, 4)), C(A(2, 3, 4), A(3), A(3, lo=0.5, hi=2), A(3), A(3), True, 0.2),
      C(A(2, 3, 4), running_mean=A(3), running_var=A(3, lo=0.5, hi=2), use_input_stats=False))
# the stochastic functionals: exact when off, statistics when on
_BIG = A(40, 50, lo=1, hi=2)
_ZEROS = lambda y: float(np.mean(y == 0))  # noqa: E731
_MEAN = lambda y: float(np.mean(y))  # noqa: E731
_STD = lambda y: float(np.std(y))  # noqa: E731
cases("F.dropout", C(F2, 0.5, False), C(F2, p=0.2, training=False), R(_BIG, 0.3, stat=_ZEROS, tol=0.05),
      R(_BIG, p=0.3, stat=_MEAN, tol=0.1))
cases("torch.dropout", C(F2, 0.5, False), R(_BIG, 0.3, True, stat=_ZEROS, tol=0.05))
cases("F.dropout1d", C(A(2, 3, 4), 0.5, False), R(A(40, 50, 4, lo=1, hi=2), 0.3, stat=_ZEROS, tol=0.05))
cases("F.dropout2d", C(A(2, 3, 4, 4), 0.5, False), R(A(40, 50, 2, 2, lo=1, hi=2), 0.3, stat=_ZEROS, tol=0.05))
cases("F.dropout3d", C(A(2, 3, 2, 2, 2), 0.5, False), R(A(40, 50, 2, 2, 2, lo=1, hi=2), 0.3, stat=_ZEROS, tol=0.05))
cases("F.alpha_dropout F.feature_alpha_dropout", C(F2, 0.5, False), R(A(40, 50), 0.2, True, stat=_MEAN, tol=0.1))
cases("F.stochastic_depth", C(F2, 0.5, "row", False), R(A(400, 5, lo=1, hi=2), 0.3, "row", stat=_ZEROS, tol=0.08),
      R(_BIG, 0.3, "batch", stat=lambda y: float(np.mean(y == 0) in (0.0, 1.0)), tol=0))  # all or none
# torchvision::roi_align(input, rois [K, 5], spatial_scale, pooled h, pooled w, sampling_ratio, aligned); boxes
# reach past the map's edges; the adaptive grid (sampling_ratio <= 0) and the legacy unaligned form included
_ROIS = A(3, 5, values=[[0, 0.5, 1.0, 6.0, 4.5], [1, -2.0, 3.0, 9.5, 7.0], [0, 2.0, 2.0, 2.0, 2.0]])
cases("torch.ops.torchvision.roi_align", C(A(2, 3, 6, 7), _ROIS, 1.0, 2, 3, 2, True),
      C(A(2, 3, 6, 7), _ROIS, 0.5, 3, 2, -1, False), C(A(2, 3, 6, 7, dtype="f4"), A(3, 5, dtype="f4", values=_ROIS.values), 1.0, 2, 2, 0, True))

# ---- indexing
cases("Tensor.__getitem__", C(A(3, 4), 1), C(A(3, 4), (slice(None), slice(1, 3))), C(A(3, 4), (Ellipsis, None, -1)),
      C(A(3, 4), A(2, dtype="i8", values=[2, 0])), C(A(3, 4), (A(2, dtype="i8", values=[2, 0]), A(2, dtype="i8", values=[1, 3]))),
      C(A(3, 4, 2), (slice(None), [0, 2], 1)), C(A(4, 3), slice(None, None, 2)))
cases("torch.ops.aten.index", C(A(3, 4), [A(2, dtype="i8", values=[2, 0]), A(2, dtype="i8", values=[1, 3])]),
      C(A(3, 4), [A(dtype="i8", values=1)]))
cases("Tensor.__setitem__", C(A(3, 4), 1, 5.0), C(A(3, 4), (slice(None), slice(1, 3)), A(3, 2)),
      C(A(3, 4), A(2, dtype="i8", values=[2, 0]), A(4)), C(A(3, 4, dtype="i8"), 0, 2.7))
CASES["Tensor.__setitem__(bool mask)"] = [C(A(3, 4), A(3, 4, dtype="b"), 0.0), C(A(3, 4), A(3, dtype="b"), 2.5)]
cases(both("masked_fill"), C(A(3, 4), A(4, dtype="b"), -1.0), C(A(3, 4, dtype="i8"), A(3, 4, dtype="b"), 2.7),
      C(A(3, 4), A(3, 1, dtype="b"), A(dtype="f8")))
CASES["Tensor.masked_fill"] += [C(A(3, 4), mask=A(4, dtype="b"), value=3.0)]
_IDX = A(2, 3, dtype="i8", values=[2, 0, 1, 1, 2, 0])
cases(both("scatter"), C(A(3, 3), 0, _IDX, A(2, 3)), C(A(3, 3), 1, _IDX, 1.5), C(A(3, 3), 1, _IDX, A(2, 3), reduce="add"),
      C(A(3, 3), dim=0, index=_IDX, src=A(2, 4)), C(A(3, 3), 0, _IDX, value=2.0))
cases(both("scatter_add"), C(A(3, 3), 0, _IDX, A(2, 3)), C(A(3, 3), 1, _IDX, A(3, 3)),
      C(A(3, 3), dim=0, index=_IDX, src=A(2, 3)))
_IDX1 = A(3, dtype="i8", values=[2, 0, 2])
cases(both("index_add"), C(A(3, 4), 0, _IDX1, A(3, 4)), C(A(4, 3), 1, _IDX1, A(4, 3), alpha=2),
      C(A(3, 4), dim=1, index=_IDX1, source=A(3, 3)))
cases(both("index_copy"), C(A(3, 4), 0, A(2, dtype="i8", values=[2, 0]), A(2, 4)),
      C(A(3, 4), dim=1, index=A(2, dtype="i8", values=[3, 1]), source=A(3, 2)))
cases(both("index_fill"), C(A(3, 4), 0, A(2, dtype="i8", values=[2, 0]), -1.0), C(A(3, 4, dtype="i8"), 1, _IDX1, 7))
cases("Tensor.fill_", C(A(2, 3), 1.5), C(A(2, 3, dtype="i8"), 2.7), C(A(2, 3), A(dtype="f8")))
cases("Tensor.zero_", C(A(2, 3)), C(A(2, 3, dtype="i8")))
cases("Tensor.copy_", C(A(2, 3), A(2, 3)), C(A(2, 3), A(3)), C(A(2, 3, dtype="i8"), A(2, 3, lo=-3, hi=3)))

# ---- random: shapes, dtypes and statistics of a larger draw
_M4, _S4 = 0.5, 0.1  # mean and standard deviation of a uniform [0, 1) draw: 0.5 and 0.29
cases("torch.rand", R(2, 3), R((2, 3), dtype=D("f8")), R(4000, stat=_MEAN, tol=0.03), R(size=(2,)))
cases("torch.randn", R(2, 3), R([4000], stat=_STD, tol=0.06), R(4000, dtype=D("f8"), stat=_MEAN, tol=0.06))
cases("torch.randint", R(5, (2, 3)), R(2, 6, (4000,), stat=_MEAN, tol=0.1), R(3, (2,), dtype=D("i4")),
      R(0, 4, size=(3,)))
cases("torch.rand_like", R(F2), R(A(4000), stat=_MEAN, tol=0.03), R(A(2, dtype="f4"), dtype=D("f8")))
cases("torch.randn_like", R(F2), R(A(4000), stat=_STD, tol=0.06))
cases("torch.randint_like", R(F2, 5), R(A(4000), 2, 6, stat=_MEAN, tol=0.1), R(I2, high=3))
cases("torch.randperm", R(5), R(6, dtype=D("f8")), R(50, stat=lambda y: float(np.sort(y).tolist() == list(range(50))), tol=0))
cases("torch.bernoulli Tensor.bernoulli", R(A(2, 3, lo=0, hi=1)), R(A(4000, values=[0.3] * 4000), stat=_MEAN, tol=0.04),
      R(A(4000), 0.7, stat=_MEAN, tol=0.04))
cases("torch.normal", R(A(2, 3), A(3, lo=0.5, hi=1)), R(0.5, 2.0, (4000,), stat=_MEAN, tol=0.2),
      R(A(4000, values=[1.0] * 4000), 0.5, stat=_STD, tol=0.04), R(mean=0.0, std=1.0, size=(2,)))
cases("torch.multinomial Tensor.multinomial", R(A(2, 5, lo=0.1, hi=1), 3), R(A(5, lo=0.1, hi=1), 4, True),
      R(A(4000, 3, values=[0.2, 0.3, 0.5] * 4000), 1, stat=_MEAN, tol=0.06),
      R(A(3, values=[0.0, 1.0, 0.0]), num_samples=1, stat=_MEAN, tol=0))
cases("Tensor.bernoulli_", R(A(2, 3)), R(A(4000), 0.25, stat=_MEAN, tol=0.04), R(A(4000), p=0.6, stat=_MEAN, tol=0.04))
cases("Tensor.normal_", R(A(2, 3)), R(A(4000), 2.0, 0.5, stat=_MEAN, tol=0.06), R(A(4000), mean=0.0, std=3.0, stat=_STD, tol=0.3))
cases("Tensor.uniform_", R(A(2, 3)), R(A(4000), -2.0, 4.0, stat=_MEAN, tol=0.15), R(A(4000), to=2.0, stat=_MEAN, tol=0.06))
cases("Tensor.exponential_", R(A(2, 3)), R(A(4000), 2.0, stat=_MEAN, tol=0.05), R(A(4000), lambd=0.5, stat=_MEAN, tol=0.2))

# ---- reductions: all, over a dim, keepdim, several dims, dtype=, integer inputs
_R3 = A(2, 3, 4)
REDUCE = [C(_R3), C(_R3, 1), C(_R3, -1, True), C(_R3, (0, 2)), C(_R3, dim=1, keepdim=True), C(I2)]
cases(both("sum"), *REDUCE, C(_R3, 1, dtype=D("f4")), C(B2), C(B2, 0))
cases(both("prod"), *[c for c in REDUCE if not isinstance(c.args[-1:] and c.args[-1], tuple)], C(_R3, 1, dtype=D("f4")),
      C(B2), C(B2, 0))  # torch's prod takes one dim
cases(both("mean"), *REDUCE[:-1], C(A(2, 3, dtype="i8"), dtype=D("f8")), C(_R3, 1, dtype=D("f4")))
cases(both("amax") + both("amin"), C(_R3, 1), C(_R3, (0, 2), True), C(_R3, dim=-1), C(I2, 0), C(_R3))
cases(both("max") + both("min"), C(_R3), C(_R3, 1), C(_R3, -1, True), C(_R3, dim=0, keepdim=True), C(I2, 1),
      C(A(2, 3), A(3)), C(A(3, values=[1.0, float("nan"), 3.0])))
cases(both("aminmax"), C(_R3), C(_R3, dim=1), C(_R3, dim=-1, keepdim=True), C(I2))
cases(both("argmax") + both("argmin"), C(_R3), C(_R3, 1), C(_R3, -1, True), C(I2, dim=0, keepdim=True),
      C(A(4, values=[1.0, 3.0, 3.0, 0.0])))
_VAR = [C(_R3), C(_R3, 1), C(_R3, (0, 2), keepdim=True), C(_R3, 1, False), C(_R3, dim=-1, correction=0),
        C(_R3, 1, unbiased=False), C(_R3, dim=None, correction=2)]
cases(both("var") + both("std") + " torch.var_mean torch.std_mean", *_VAR)
cases(both("norm"), C(_R3), C(_R3, 1), C(_R3, 2, 1), C(_R3, "fro", (1, 2)), C(_R3, p=1, dim=-1, keepdim=True),
      C(_R3, float("inf"), 0), C(A(2, 3, 4, dtype="f4"), 3), C(A(3, values=[0.0, 0.0, 0.0])))
cases("torch.linalg.vector_norm", C(_R3), C(_R3, 1), C(_R3, 2, 1, True), C(_R3, ord=float("inf"), dim=(0, 2)),
      C(_R3, ord=0.5, dim=-1), C(_R3, ord=0), C(A(2, 3, dtype="f4"), dtype=D("f8")))
cases(both("logsumexp", "torch.special.logsumexp"), C(_R3, 1), C(_R3, (0, 2), True), C(_R3, dim=-1),
      C(A(3, values=[-float("inf")] * 3), 0), C(A(3, values=[1000.0, 1000.0, -1.0]), 0))
cases(both("cumsum") + both("cumprod"), C(_R3, 1), C(_R3, dim=-1), C(I2, 0), C(_R3, 0, dtype=D("f4")), C(B2, 1))
cases(both("diff"), C(A(5)), C(A(3, 5), 2), C(A(3, 5), dim=0), C(A(3, 4), 1, 0, A(1, 4), A(2, 4)),
      C(A(5), append=A(2)), C(I2))
cases(both("all") + both("any"), C(B2), C(B2, 1), C(B2, -1, True), C(A(2, 3, values=[0.0, 1, 2, 0, 0, 0])),
      C(I2, dim=0))
cases(both("count_nonzero"), C(A(2, 3, values=[0.0, 1, 2, 0, 0, 3])), C(A(2, 3, values=[0.0, 1, 2, 0, 0, 3]), 1),
      C(I2, dim=(0, 1)))
cases(both("topk"), C(A(2, 5), 2), C(A(3, 5), 3, 0), C(A(2, 5), 2, largest=False), C(A(2, 5), k=1, dim=-1, sorted=True))
cases(both("sort"), C(A(2, 5)), C(A(2, 5), 0), C(A(2, 5), descending=True), C(A(6, values=[2.0, 1, 2, 1, 3, 1]), stable=True),
      C(I2, dim=1, descending=True, stable=True))
cases(both("argsort"), C(A(2, 5)), C(A(2, 5), 0), C(A(2, 5), descending=True),
      C(A(6, values=[2.0, 1, 2, 1, 3, 1]), stable=True), C(I2, dim=1, descending=True, stable=True))

# ---- shapes and views
_S = A(2, 3, 4)
cases("Tensor.view Tensor.reshape", C(_S, 6, 4), C(_S, (4, -1)), C(_S, [-1]), C(_S, 2, 3, 2, 2))
cases("torch.reshape", C(_S, (6, 4)), C(_S, shape=(-1, 2)))
cases("Tensor.view_as Tensor.reshape_as", C(_S, A(4, 6)))
cases(both("permute"), C(_S, (2, 0, 1)), C(_S, [1, 0, 2]))
CASES["Tensor.permute"] += [C(_S, 2, 0, 1), C(_S, dims=(0, 2, 1))]
cases(both("transpose", both("swapaxes", both("swapdims"))), C(_S, 0, 2), C(_S, -1, 1))
CASES["torch.transpose"] += [C(_S, dim0=0, dim1=1)]
cases(both("t"), C(A(2, 3)), C(A(3)))
cases("Tensor.T", C(A(2, 3)), C(A(3)))
cases("Tensor.mH Tensor.H Tensor.mT Tensor.adjoint torch.adjoint", C(A(2, 3)))
CASES["Tensor.mT"] += [C(_S)]
cases(both("flatten"), C(_S), C(_S, 1), C(_S, 0, 1), C(_S, start_dim=-2, end_dim=-1), C(A(dtype="f8")))
cases(both("unflatten"), C(_S, 2, (2, 2)), C(_S, -1, [2, -1]), C(_S, dim=1, sizes=(3, 1)))
cases(both("squeeze"), C(A(2, 1, 3, 1)), C(A(2, 1, 3, 1), 1), C(A(2, 1, 3, 1), 0), C(A(2, 1, 3, 1), dim=-1),
      C(A(2, 1, 3, 1), (1, 3)))
cases(both("unsqueeze"), C(_S, 0), C(_S, -1), C(_S, dim=2))
cases("Tensor.expand", C(A(3, 1), 2, 3, 4), C(A(3, 1), (-1, 5)), C(A(3, 1), [2, -1, 2]))
cases("Tensor.expand_as", C(A(3, 1), A(2, 3, 4)))
cases(both("broadcast_to"), C(A(3, 1), (2, 3, 4)), C(A(3, 1), size=(-1, 2)))
cases("Tensor.repeat", C(A(2, 3), 2, 1), C(A(2, 3), (1, 2, 2)), C(A(3), [2]))
cases(both("tile"), C(A(2, 3), (2, 1)), C(A(2, 3), (3,)), C(A(2, 3), dims=(1, 2, 2)))
cases(both("repeat_interleave"), C(A(2, 3), 2), C(A(2, 3), 2, 1), C(A(2, 3), A(2, dtype="i8", values=[1, 3]), 0,
                                                                         output_size=4),
      C(A(2, 3), repeats=3, dim=0))
cases(both("chunk"), C(A(5, 2), 2), C(A(6, 2), 3), C(A(2, 7), 3, 1), C(A(2, 7), chunks=4, dim=-1))
cases(both("split"), C(A(5, 2), 2), C(A(6, 2), [1, 5]), C(A(2, 7), 3, 1), C(A(2, 7), (3, 4), dim=-1))
cases(both("tensor_split"), C(A(7, 2), 3), C(A(6, 2), [1, 4]), C(A(2, 7), 2, 1), C(A(2, 7), (2, 5), dim=-1))
cases(both("unbind"), C(_S), C(_S, 1), C(_S, dim=-1))
cases("torch.cat torch.concat torch.concatenate", C([A(2, 3), A(1, 3)]), C((A(2, 3), A(2, 2)), 1), C([A(2, 3), A(2, 3)], dim=-1),
      C([A(2, 3), A(2, 3, dtype="i8")]), C([A(2, 3, dtype="f4"), A(1, 3, dtype="f8")]))
CASES["torch.cat"] += [C([A(2, 3), A(0, 3)])]
cases("torch.stack", C([A(2, 3), A(2, 3)]), C((A(2, 3), A(2, 3)), 2), C([A(2, 3), A(2, 3)], dim=-1))
cases("torch.hstack torch.vstack", C([A(2, 3), A(2, 3)]), C([A(3), A(3)]), C((A(2, 3, 2), A(2, 3, 2))))
cases(both("narrow"), C(_S, 1, 1, 2), C(_S, -1, 0, 3), C(_S, dim=0, start=1, length=1))
cases(both("flip"), C(_S, (0, 2)), C(_S, [1]), C(_S, dims=(-1,)))
CASES["Tensor.flip"] += [C(_S, 0, 2)]
cases(both("roll"), C(_S, 1), C(_S, 2, 1), C(_S, (1, -1), (0, 2)), C(_S, shifts=-1, dims=-1))
cases(both("movedim", both("moveaxis")), C(_S, 0, 2), C(_S, (0, 1), (2, 0)), C(_S, source=-1, destination=0))
cases("Tensor.size", C(_S), C(_S, 1), C(_S, -1), C(_S, dim=0))
cases("Tensor.shape Tensor.dim Tensor.ndim Tensor.ndimension Tensor.numel Tensor.nelement torch.numel Tensor.__len__",
      C(_S), C(A(4)))
cases("Tensor.contiguous Tensor.clone torch.clone Tensor.cpu Tensor.to_dense Tensor.resolve_conj Tensor.resolve_neg "
      "Tensor.detach torch.detach Tensor.data", C(_S), C(I2))
cases("Tensor.requires_grad_", C(_S), C(_S, False))
# no accelerator, no sparse tensor, no autograd here: torch's side is the identity the rule claims (_IDENTITY)
cases("Tensor.cuda Tensor.pin_memory Tensor.coalesce Tensor.retain_grad", C(_S))
_GI = A(2, 2, dtype="i8", values=[0, 2, 1, 0])
cases(both("gather"), C(A(2, 3), 1, _GI), C(A(3, 2), 0, A(2, 2, dtype="i8", values=[2, 0, 1, 1])),
      C(A(2, 3), dim=-1, index=_GI))
cases(both("index_select"), C(A(3, 4), 0, A(2, dtype="i8", values=[2, 0])), C(A(3, 4), 1, _IDX1),
      C(A(3, 4), dim=-1, index=A(2, dtype="i8", values=[3, 3])))
cases(both("take_along_dim"), C(A(2, 3), _GI, 1), C(A(2, 3), A(2, dtype="i8", values=[5, 0])),
      C(A(2, 3), indices=A(1, 3, dtype="i8", values=[1, 0, 1]), dim=0))
cases(both("diagonal"), C(A(3, 4)), C(A(3, 4), 1), C(A(2, 3, 4), 0, 1, 2), C(A(3, 4), offset=-1, dim1=1, dim2=0))
cases(both("diag"), C(A(3)), C(A(3), 1), C(A(3, 4)), C(A(3, 4), diagonal=-1))
cases("torch.meshgrid", C(A(2), A(3), indexing="ij"), C([A(2), A(3)], indexing="xy"), C(A(2), A(3), A(4), indexing="ij"))
cases("torch.broadcast_tensors", C(A(2, 1), A(3)), C(A(3), A(2, 3), A(1, 1)))


# ---- running a case -----------------------------------------------------------------------

_IDENTITY = {"Tensor.cuda", "Tensor.pin_memory", "Tensor.coalesce", "Tensor.retain_grad"}


def _stochastic_depth(input, p, mode, training=True):
    """torchvision.ops.stochastic_depth (torchvision is not a dependency): each row ("row") or the
    whole batch ("batch") kept with probability 1 - p and scaled by 1 / (1 - p)."""
    if not training or p == 0.0:
        return input
    shape = [input.shape[0]] + [1] * (input.ndim - 1) if mode == "row" else [1] * input.ndim
    return input * torch.empty(shape, dtype=input.dtype).bernoulli_(1 - p).div_(1 - p)


def _roi_align(*args):
    """torchvision::roi_align where torchvision is installed, else its numpy oracle (tests/vision_oracle.py)."""
    try:
        import torchvision  # noqa: F401

        return torch.ops.torchvision.roi_align(*args)
    except ImportError:
        from tests import vision_oracle

        return torch.from_numpy(vision_oracle.roi_align(*(_np(a) if isinstance(a, torch.Tensor) else a
                                                          for a in args))).to(args[0].dtype)


_TORCH_NAME = {"F.stochastic_depth": _stochastic_depth, "torch.ops.torchvision.roi_align": _roi_align}


def _torch_callable(name: str):
    if name in _TORCH_NAME:
        return _TORCH_NAME[name]
    name = name.split("(")[0]
    if name == "torch.ops.aten.index":
        return torch.ops.aten.index.Tensor
    if name in _IDENTITY:
        return lambda t: t
    if name.startswith("Tensor."):
        attr = name[len("Tensor."):]
        static = inspect.getattr_static(torch.Tensor, attr)
        if type(static).__name__ in ("getset_descriptor", "property"):
            return lambda t: getattr(t, attr)
        return getattr(torch.Tensor, attr)
    if name.startswith("F."):
        return getattr(torch.nn.functional, name[2:])
    owner = torch
    for part in name.split(".")[1:-1]:
        owner = getattr(owner, part)
    return getattr(owner, name.rpartition(".")[2])


def _np(value):
    if isinstance(value, torch.Tensor):
        return value.detach().numpy() if value.dtype != torch.bfloat16 else value.float().numpy()
    return np.asarray(value)


def _tol(dtype):
    """float64: rounding over the few dozen operations of the largest rule (a conv of 24 taps, a
    loss), rtol 1e-10 leaves room for different summation orders; float32 and narrower: a few ulps
    of their epsilon over sums of up to ~50 terms."""
    if dtype in (torch.float16, torch.bfloat16):
        return dict(rtol=1e-2, atol=1e-2)
    if dtype == torch.float32:
        return dict(rtol=2e-5, atol=2e-6)
    return dict(rtol=1e-10, atol=1e-12)


def _same(got, want, where: str, exact_values: bool = True):
    if isinstance(want, torch.Tensor):
        assert hasattr(got, "shape"), f"{where}: torch gives a tensor, the rule {type(got).__name__}"
        assert tuple(got.shape) == tuple(want.shape), f"{where}: shape {tuple(got.shape)}, torch {tuple(want.shape)}"
        want_dt = jnp.dtype(_JAX_DT[next(k for k, v in _TORCH_DT.items() if v == want.dtype)])
        assert jnp.dtype(got.dtype) == want_dt, f"{where}: dtype {got.dtype}, torch {want.dtype}"
        if not exact_values:
            return
        g, w = np.asarray(got).astype(np.float64) if want.dtype == torch.bfloat16 else np.asarray(got), _np(want)
        if want.is_floating_point():
            np.testing.assert_allclose(g, w, equal_nan=True, err_msg=where, **_tol(want.dtype))
        else:
            np.testing.assert_array_equal(g, w, err_msg=where)
    elif isinstance(want, (tuple, list)) and not isinstance(want, torch.Size):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{where}: {type(got)} vs torch's {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]", exact_values)
    elif isinstance(want, torch.dtype):
        assert jnp.dtype(got) == jnp.dtype(_JAX_DT[next(k for k, v in _TORCH_DT.items() if v == want)]), where
    elif isinstance(want, torch.device):
        assert got is None, f"{where}: a device is dropped (None), got {got!r}"
    elif isinstance(want, torch.Size):
        assert tuple(got) == tuple(want), f"{where}: {got} vs torch's {want}"
    elif isinstance(want, float):
        assert math.isclose(float(got), want, rel_tol=1e-12), f"{where}: {got} vs torch's {want}"
    else:
        assert got == want, f"{where}: {got!r} vs torch's {want!r}"


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


class _Call:
    """One case, ready: torch's result, and the rule's call with its array arguments as leaves."""

    def __init__(self, name: str, case: C, index: int):
        self.name, self.case, self.index, self.op = name, case, index, ops.OPS[name]
        rng = np.random.default_rng(index)
        args, kwargs = _materialise(case.args, rng), _materialise(case.kwargs, rng)
        self.t_args, self.t_kwargs = _side(args, True), _side(kwargs, True)
        self.where = (f"{name} case {index} ("
                      f"{', '.join([repr(getattr(a, 'shape', a)) for a in args] + [f'{k}=' for k in kwargs])})")
        j_args, j_kwargs = _side(args, False), _side(kwargs, False)
        if self.op.random:
            # XLA's own generator: threefry's unrolled rounds cost most of the table's compile for the
            # random rules, which check shapes, dtypes and statistics, not a particular stream
            j_kwargs["key"] = jax.random.key(index, impl="rbg")
        leaves, self.treedef = jax.tree.flatten((j_args, j_kwargs), is_leaf=lambda v: v is None)
        self.is_array = [isinstance(v, jax.Array) for v in leaves]
        self.arrays = [v for v, a in zip(leaves, self.is_array) if a]
        self.static = [None if a else v for v, a in zip(leaves, self.is_array)]
        self.want = self.error = self.got = None
        if isinstance(case, X):
            _torch_callable(name)(*self.t_args, **self.t_kwargs)  # torch accepts it
            return
        torch.manual_seed(index)
        self.want = _torch_callable(name)(*self.t_args, **self.t_kwargs)

    def call(self, arrays):
        """The rule on ``arrays`` (traced or not), its Python arguments as given."""
        it = iter(arrays)
        leaves = [next(it) if a else v for v, a in zip(self.static, self.is_array)]
        j_args, j_kwargs = jax.tree.unflatten(self.treedef, leaves)
        return self.op.fn(*j_args, **j_kwargs)


_ARRAY = object()  # where an array leaf was


def _split(out):
    leaves, treedef = jax.tree.flatten(out, is_leaf=lambda v: v is None)
    arrays = [v for v in leaves if isinstance(v, jax.Array)]
    return arrays, (treedef, [_ARRAY if isinstance(v, jax.Array) else v for v in leaves])


@functools.cache
def _table() -> dict:
    """Every case of every rule, torch's side eagerly and the rules' in ONE compiled program:
    XLA:CPU compiles each eager primitive on its own (tens of ms each, thousands of shapes and
    dtypes), where one program of them all compiles once. A rule that cannot be traced (it reads
    a value) is run eagerly instead; a rule that raises keeps its error for its own test."""
    with jax.enable_x64(True):
        calls = [_Call(name, case, i) for name in sorted(ops.OPS) if name in CASES
                 for i, case in enumerate(CASES[name])]
        structures: dict = {}
        failed: dict = {}

        # aliases (Tensor.add, torch.add, __add__...) share a rule and their cases: the rule runs once
        # per (function, case); each alias still meets torch's own op
        first: dict = {}
        for k, call in enumerate(calls):
            first.setdefault((id(call.op.fn), id(call.case), call.index), k)

        def program(all_arrays, ks):
            outs = []
            for k, arrays in zip(ks, all_arrays):
                call = calls[k]
                same = first[(id(call.op.fn), id(call.case), call.index)]
                if isinstance(call.case, X) or same != k:
                    outs.append([])
                    continue
                try:
                    arrays_out, structures[k] = _split(call.call(arrays))
                except Exception as error:  # noqa: BLE001 (kept for the rule's own test)
                    failed[k] = error
                    arrays_out = []
                outs.append(arrays_out)
            return outs

        ks = list(range(len(calls)))
        results = jax.jit(lambda arrays: program(arrays, ks))([call.arrays for call in calls])
        for k, call in enumerate(calls):
            k = first[(id(call.op.fn), id(call.case), call.index)]
            out = results[k]
            if isinstance(call.case, X):
                try:
                    jax.eval_shape(call.call, call.arrays)
                except (ValueError, TypeError) as error:
                    call.error = error
                continue
            if k in failed:
                try:  # a rule that needs concrete values (none should: converted models run jitted)
                    call.got = call.call(call.arrays)
                    call.eager = True
                except Exception as error:  # noqa: BLE001
                    call.error = error
                continue
            treedef, static = structures[k]
            it = iter(out)
            call.got = jax.tree.unflatten(treedef, [next(it) if v is _ARRAY else v for v in static])
    table: dict = {}
    for call in calls:
        table.setdefault(call.name, []).append(call)
    return table


def check(call: _Call) -> None:
    name, case, where = call.name, call.case, call.where
    if isinstance(case, X):
        assert isinstance(call.error, (ValueError, TypeError)), f"{where}: the rule should refuse this call"
        return
    if call.error is not None:
        raise call.error
    got, want, op = call.got, call.want, call.op
    random = isinstance(case, R)
    if op.mutates:
        got, new = got
        places = ops.mutated_places(op, call.t_args, call.t_kwargs)
        for place, value in zip(places, new):
            t_arg = call.t_args[place] if isinstance(place, int) else call.t_kwargs.get(place)
            if t_arg is None:
                continue
            _same(value, t_arg, f"{where}: the new value of argument {place}")
    elif name.startswith("Tensor.") and name.endswith("_") and not name.endswith("__"):
        # an in-place method: the rule returns the new value; torch's result is the mutated tensor itself
        assert want is call.t_args[0]
    if name.startswith("Tensor.__setitem__"):
        assert got is None and want is None
        return
    _same(got, want, where, exact_values=not random)
    if random and case.stat is not None:
        g = case.stat(np.asarray(got, np.float64))
        w = case.stat(_np(want).astype(np.float64))
        assert abs(g - w) <= case.tol, f"{where}: statistic {g:.4f}, torch's {w:.4f} (tolerance {case.tol})"


def test_every_registered_rule_has_a_table_entry():
    missing, stale = sorted(set(ops.OPS) - set(CASES)), sorted(set(CASES) - set(ops.OPS))
    assert not missing, (f"op rules with no entry in tests/test_op_table.py's CASES: {missing}; add their calls "
                         f"(positional and keyword arguments, broadcasting, the dtypes they claim)")
    assert not stale, f"CASES names rules that are not registered (renamed or removed?): {stale}"
    assert all(CASES.values()), [n for n, c in CASES.items() if not c]
    assert len(ops.OPS) >= 570  # the table's size when this test was written: a sudden drop is a lost module


def test_every_rule_matches_torch():
    # one test, not one per rule: the rules run in one compiled program, built once per process
    # (parametrized items would be spread over pytest-xdist's workers, each building it again)
    table = _table()
    failures = {}
    with jax.enable_x64(True):
        for name, calls in table.items():
            try:
                for call in calls:
                    check(call)
            except Exception as error:  # noqa: BLE001 (every failing rule is reported, not the first)
                failures[name] = f"{type(error).__name__}: {str(error).strip()[:400]}"
    runs = sum(len(c) for c in table.values())
    eager = sorted({c.name for v in table.values() for c in v if getattr(c, "eager", False)})
    print(f"op table: {len(table)} of {len(ops.OPS)} registered rules run, {runs} calls against torch, "
          f"{len(failures)} failing; run eagerly (not traceable): {eager}")
    assert len(table) == len(ops.OPS)
    assert not failures, "\n".join(f"{n}: {m}" for n, m in failures.items())
