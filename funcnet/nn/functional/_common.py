"""Helpers shared by the functional families and the layers: argument checks and the
dtype rule for parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["apart", "float_dtype", "gradient_apart", "ntuple"]


def float_dtype(dtype=None):
    """The dtype of a layer's parameters and float buffers: ``dtype`` when given, else JAX's
    default float at the time of the call, as ``jnp.zeros`` chooses it (float64 under
    ``JAX_ENABLE_X64=1`` / ``jax.enable_x64``, float32 otherwise), so a float64 port builds
    float64 params throughout."""
    if dtype is None:
        return jax.dtypes.canonicalize_dtype(jnp.float64)
    return jnp.dtype(dtype)


def ntuple(value, n: int, what: str, where: str, minimum: int) -> tuple[int, ...]:
    """``value`` (an int or a sequence of ``n`` ints, each >= minimum) as an n-tuple."""
    values = (value,) * n if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        values = tuple(values)
    except TypeError:
        values = None
    if (values is None or len(values) != n
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in values)):
        raise ValueError(f"{where}: {what} must be an int >= {minimum} or a tuple of {n} such ints, got {value!r}")
    return values


def apart(body, *operands):
    """``body(*operands)``, computed apart from whatever produced the operands and from whatever
    consumes its result. XLA fuses elementwise producers and consumers into one loop and
    computes a fused producer again for each use (a depthwise convolution's taps read the
    BatchNorm and activation before it once per tap; a max pool's gradient reads the window
    search once per tap). Inside a conditional on the data whose two branches are both ``body``
    the body is its own computation, its operands and results buffers written once: XLA cannot
    decide the branch at compile time. An ``optimization_barrier`` does not survive to XLA:CPU's
    fusion, and a conditional whose branches are the identity is simplified away. The predicate
    reads the last operand's first element (equal to itself unless NaN, and then the same body
    runs)."""
    first = operands[-1].reshape(-1)[0]
    return jax.lax.cond(first == first, body, body, *operands)



@jax.custom_jvp
def gradient_apart(x):
    """``x`` itself, whose tangent (and so, in reverse mode, whose gradient) is computed ``apart``
    on the CPU backend: a value XLA writes to memory instead of fusing its producer into every
    consumer. A residual stream's gradient is a sum that grows by one term a layer; XLA:CPU fused
    that sum into each transposing copy a weight gradient ``g.T @ x`` makes of it, recomputing
    the terms of every layer above (funcnet's 12-layer GPT-2-small step: 462 against 73 ms of
    copies). The conditional's predicate reads ``x`` (a primal, so reverse mode can transpose
    it); both branches multiply by a factor that is 1 at run time (``x == x or x != x``), which
    XLA cannot fold into an identity (a conditional of identities is simplified away). Exact:
    values, NaN and infinities pass unchanged. Other backends: the identity."""
    return x


@gradient_apart.defjvp
def _gradient_apart_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    if jax.default_backend() != "cpu" or x.size == 0:
        return x, t
    first = x.reshape(-1)[0]
    one = ((first == first) | (first != first)).astype(t.dtype)

    def scaled(t):
        return t * one

    return x, jax.lax.cond(first == first, scaled, scaled, t)
