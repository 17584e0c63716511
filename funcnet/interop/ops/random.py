"""torch's random tensors from a JAX PRNG key (``key=``, keyword-only, a fresh key per call):
the same distributions as torch, not the same numbers. ``Tensor.bernoulli_``, ``normal_``,
``uniform_`` and ``exponential_`` are the new value of the tensor they would fill."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from funcnet.interop.ops._core import DEFAULT_FLOAT, is_array, jdtype, long_dtype, register, sizes

__all__ = ["rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "bernoulli_fill",
           "normal", "normal_fill", "uniform_fill", "exponential_fill", "multinomial", "randperm"]


def _need(key, where):
    if key is None:
        raise ValueError(f"{where} draws random numbers and needs a PRNG key: pass key=jax.random.key(seed)")
    return key


def _float(dtype, default=DEFAULT_FLOAT):
    return jdtype(default if dtype is None else dtype)


def rand(*args, size=None, dtype=None, generator=None, out=None, layout=None, device=None, pin_memory=False,
         requires_grad=False, key=None):
    return jax.random.uniform(_need(key, "rand"), sizes(args if size is None else (size,)), _float(dtype))


def randn(*args, size=None, dtype=None, generator=None, out=None, layout=None, device=None, pin_memory=False,
          requires_grad=False, key=None):
    return jax.random.normal(_need(key, "randn"), sizes(args if size is None else (size,)), _float(dtype))


def randint(*args, dtype=None, generator=None, out=None, layout=None, device=None, pin_memory=False,
            requires_grad=False, size=None, key=None):
    """``randint(high, size)`` or ``randint(low, high, size)``: int64, in ``[low, high)``."""
    args = list(args)
    if size is None:
        size = args.pop()
    low, high = (0, args[0]) if len(args) == 1 else args
    dt = jdtype(jnp.int64 if dtype is None else dtype)
    draw = jax.random.randint(_need(key, "randint"), sizes((size,)), low, high, dtype=long_dtype())
    return draw.astype(dt)


def rand_like(input, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None, key=None):
    x = jnp.asarray(input)
    return jax.random.uniform(_need(key, "rand_like"), x.shape, _float(dtype, x.dtype))


def randn_like(input, *, dtype=None, layout=None, device=None, requires_grad=False, memory_format=None, key=None):
    x = jnp.asarray(input)
    return jax.random.normal(_need(key, "randn_like"), x.shape, _float(dtype, x.dtype))


def randint_like(input, low=0, high=None, *, dtype=None, layout=None, device=None, requires_grad=False,
                 memory_format=None, key=None):
    """``randint_like(x, high)`` or ``(x, low, high)``: x's dtype (often float), as torch."""
    if high is None:
        low, high = 0, low
    x = jnp.asarray(input)
    draw = jax.random.randint(_need(key, "randint_like"), x.shape, low, high, dtype=long_dtype())
    return draw.astype(x.dtype if dtype is None else jdtype(dtype))


def bernoulli(input, p=None, *, generator=None, out=None, key=None):
    """1 with probability ``input`` element-wise (or ``p`` everywhere), in input's dtype."""
    x = jnp.asarray(input)
    prob = x if p is None else jnp.full(x.shape, p, x.dtype)
    return jax.random.bernoulli(_need(key, "bernoulli"), prob).astype(x.dtype)


def bernoulli_fill(input, p=0.5, *, generator=None, key=None):
    """``x.bernoulli_(p)``: x's shape and dtype, 1 with probability ``p`` (a number or tensor)."""
    x = jnp.asarray(input)
    prob = jnp.broadcast_to(jnp.asarray(p, dtype=jnp.result_type(float)), x.shape)
    return jax.random.bernoulli(_need(key, "bernoulli_"), prob).astype(x.dtype)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, out=None, dtype=None, layout=None, device=None,
           pin_memory=False, requires_grad=False, key=None):
    """``normal(mean, std)`` with tensors (broadcast) or numbers and ``size``."""
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std)) if size is None else sizes((size,))
    dt = next((m.dtype for m in (mean, std) if is_array(m)), None) or _float(dtype)
    z = jax.random.normal(_need(key, "normal"), shape, dt)
    return (mean + std * z).astype(dt)


def normal_fill(input, mean=0.0, std=1.0, *, generator=None, key=None):
    """``x.normal_(mean, std)``."""
    x = jnp.asarray(input)
    return (mean + std * jax.random.normal(_need(key, "normal_"), x.shape, x.dtype)).astype(x.dtype)


def uniform_fill(input, from_=0.0, to=1.0, *, generator=None, key=None, **kwargs):
    """``x.uniform_(a, b)`` (``from`` is a Python keyword: pass it positionally or as ``from_``)."""
    from_ = kwargs.pop("from", from_)
    x = jnp.asarray(input)
    return jax.random.uniform(_need(key, "uniform_"), x.shape, x.dtype, from_, to)


def exponential_fill(input, lambd=1.0, *, generator=None, key=None):
    x = jnp.asarray(input)
    return (jax.random.exponential(_need(key, "exponential_"), x.shape, x.dtype) / lambd).astype(x.dtype)


def multinomial(input, num_samples, replacement=False, *, generator=None, out=None, key=None):
    """Indices drawn with probabilities proportional to the rows of ``input``; without
    replacement by the Gumbel top-k trick (the same distribution as torch's)."""
    p = jnp.asarray(input)
    logits = jnp.log(p.astype(jnp.result_type(float)))
    k = _need(key, "multinomial")
    if replacement:
        draw = jax.random.categorical(k, logits, axis=-1, shape=(num_samples,) + p.shape[:-1])
        return jnp.moveaxis(draw, 0, -1).astype(long_dtype())
    g = logits + jax.random.gumbel(k, p.shape, logits.dtype)
    return jax.lax.top_k(g, num_samples)[1].astype(long_dtype())


def randperm(n, *, generator=None, out=None, dtype=None, layout=None, device=None, pin_memory=False,
             requires_grad=False, key=None):
    return jax.random.permutation(_need(key, "randperm"), n).astype(jdtype(jnp.int64 if dtype is None else dtype))


def _register_table():
    for fn in (rand, randn, randint, rand_like, randn_like, randint_like, randperm):
        register([f"torch.{fn.__name__}"], fn, None, random=True)
    register(["torch.bernoulli", "Tensor.bernoulli"], bernoulli, None, random=True)
    register(["torch.normal"], normal, None, random=True)
    register(["torch.multinomial", "Tensor.multinomial"], multinomial, None, random=True)
    register(["Tensor.bernoulli_"], bernoulli_fill, None, random=True)
    register(["Tensor.normal_"], normal_fill, None, random=True)
    register(["Tensor.uniform_"], uniform_fill, None, random=True)
    register(["Tensor.exponential_"], exponential_fill, None, random=True)


_register_table()
