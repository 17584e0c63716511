"""The op table of interop.convert against torch itself.

Each case runs a few torch calls under a TorchFunctionMode that records what it receives
(``func``, args, kwargs, the result); each recorded call is then looked up by its canonical
name and replayed with the table's JAX function on the same values (float64, JAX's x64
scoped on), which must equal torch's result in value and dtype; its rendered source,
evaluated with ``F``, ``jnp`` and ``ops`` in scope, must equal the JAX function's result.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.overrides import TorchFunctionMode  # noqa: E402

import torch.nn.functional as F_  # noqa: E402

from funcnet.interop import ops  # noqa: E402
from funcnet.nn import functional as F  # noqa: E402

# ---- recording and conversion ---------------------------------------------------------------


class Record(TorchFunctionMode):
    """The top-level torch calls of a block: (func, args, kwargs, args after the call, result)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before, kw_before = _clone(args), _clone(dict(kwargs))
        out = func(*args, **kwargs)
        self.calls.append((func, before, kw_before, (_clone(args), _clone(dict(kwargs))), _clone(out)))
        return out


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return tuple(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(_clone(v) for v in value)
    return value


_DTYPES = {torch.float64: jnp.float64, torch.float32: jnp.float32, torch.float16: jnp.float16,
           torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32, torch.int16: jnp.int16,
           torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_}


def to_jax(value):
    """What the recorder hands the table: arrays, jnp dtypes, tuples for sizes, None for devices."""
    if isinstance(value, torch.Tensor):
        return jnp.asarray(value.detach().numpy())
    if isinstance(value, torch.dtype):
        return _DTYPES[value]
    if isinstance(value, torch.device):
        return None
    if isinstance(value, torch.Size):
        return tuple(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # torch.return_types
        return tuple(to_jax(v) for v in value)
    if isinstance(value, (list, tuple)):
        return type(value)(to_jax(v) for v in value)
    if isinstance(value, dict):
        return {k: to_jax(v) for k, v in value.items()}
    return value


def assert_same(got, want, where):
    """``got`` (the table's) equals ``want`` (torch's, already through to_jax)."""
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{where}: {got!r} vs {want!r}"
        for g, w in zip(got, want):
            assert_same(g, w, where)
        return
    if isinstance(want, (type, np.dtype)):
        assert jnp.dtype(got) == jnp.dtype(want), f"{where}: {got!r} vs torch's {want!r}"
        return
    if hasattr(want, "dtype") and hasattr(want, "shape"):
        got = jnp.asarray(got)
        assert got.shape == want.shape, f"{where}: shape {got.shape} vs torch's {want.shape}"
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} vs torch's {want.dtype}"
        tol = 1e-12 if got.dtype == jnp.float64 or not jnp.issubdtype(got.dtype, jnp.inexact) else 1e-6
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol,
                                   err_msg=where)
        return
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), where
        return
    assert got == want, f"{where}: {got!r} vs torch's {want!r}"


def render_value(value, env):
    """Python source for a recorded argument, binding arrays to names in ``env``."""
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.dtype):
        name = f"a{len(env)}"
        env[name] = value
        return name
    if isinstance(value, (list, tuple)):
        parts = [render_value(v, env) for v in value]
        if isinstance(value, list):
            return f"[{', '.join(parts)}]"
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    if isinstance(value, slice):
        return f"slice({render_value(value.start, env)}, {render_value(value.stop, env)}, " \
               f"{render_value(value.step, env)})"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float('{value}')"
    if isinstance(value, type) or isinstance(value, np.dtype):
        return f"jnp.{jnp.dtype(value).name}"
    return repr(value)


_UNDEFINED_VALUES = {"torch.empty", "torch.empty_like", "Tensor.new_empty"}


def _is_array(v):
    return hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, (type, np.dtype))


def _tensors_only(value):
    leaves = jax.tree.leaves(to_jax(value), is_leaf=lambda v: v is None)
    return all(v is None or _is_array(v) for v in leaves)


def evaluate(op, jargs, jkwargs, text, env, key_seed, compiled):
    """``(fn(*args, **kwargs), eval(text))``, compiled as one program when the results are
    arrays (one compilation per call instead of one per primitive keeps the table fast)."""
    scope = {"F": F, "jnp": jnp, "ops": ops}

    def both(a, k, e):
        if op.random:
            k = {**k, "key": jax.random.key(key_seed)}
            e = {**e, "key": jax.random.key(key_seed)}
        return op.fn(*a, **k), eval(text, {**scope, **e})  # noqa: S307

    if not compiled:
        return both(jargs, jkwargs, env)
    leaves, tree = jax.tree.flatten((jargs, jkwargs, env), is_leaf=lambda v: v is None)
    where = [i for i, v in enumerate(leaves) if _is_array(v)]

    def run(*arrays):
        full = list(leaves)
        for i, a in zip(where, arrays):
            full[i] = a
        return both(*jax.tree.unflatten(tree, full))

    return jax.jit(run)(*[leaves[i] for i in where])


def replay(call, key_seed):
    """Run one recorded call through the table: compare with torch, and the source with fn."""
    func, args, kwargs, after, out = call
    name = ops.canonical(func)
    op = ops.lookup(name) if name else None
    assert op is not None, f"no op for {func!r} (canonical {name!r})"
    jargs, jkwargs = to_jax(args), to_jax(kwargs)
    env = {}
    rargs = [render_value(a, env) for a in jargs]
    rkwargs = {k: render_value(v, env) for k, v in jkwargs.items()}
    if op.random:
        rkwargs["key"] = "key"
    text = op.render(rargs, rkwargs)
    got, value = evaluate(op, jargs, jkwargs, text, env, key_seed,
                          compiled=_tensors_only(out) and (not op.mutates or _tensors_only(after)))
    if op.mutates:
        result, new = got
        assert len(new) == len(op.mutates), name
        for place, v in zip(ops.mutated_places(op, jargs, jkwargs), new):
            torch_after = after[0][place] if isinstance(place, int) else after[1][place]
            assert_same(v, to_jax(torch_after), f"{name} argument {place} after the call")
        if out is not None and not op.random:
            assert_same(result, to_jax(out), name)
    elif name in _UNDEFINED_VALUES:  # torch.empty: only the shape and dtype mean something
        assert_same(jnp.shape(got), tuple(out.shape), name)
        assert_same(got.dtype, to_jax(out.dtype), name)
    elif not op.random:
        assert_same(got, to_jax(out), name)
    else:  # the same distribution, not the same numbers: shape and dtype as torch
        assert_same(jax.tree.map(jnp.shape, got), jax.tree.map(lambda v: tuple(v.shape), out), name)
    # the rendered source evaluates to what fn returns
    if _jax_promotes_differently(jargs):
        # the source writes the operator (x * 0.5, jnp.exp(i)), which promotes as JAX does: with
        # x64 on an int tensor times a float is float64 there, float32 in torch and in fn
        value = jax.tree.map(lambda v, g: jnp.asarray(v).astype(g.dtype)
                             if hasattr(g, "dtype") and g.dtype == jnp.float32 and v.dtype == jnp.float64 else v,
                             value, got)
    assert_tree_close(value, got, f"{name}: {text}")
    return name, got, text


def _jax_promotes_differently(args):
    arrays = [a for a in args if hasattr(a, "dtype") and hasattr(a, "ndim")]
    ints = any(not jnp.issubdtype(a.dtype, jnp.floating) for a in arrays)
    floats = any(isinstance(a, float) for a in args) or any(
        a.ndim == 0 and jnp.issubdtype(a.dtype, jnp.floating) for a in arrays)
    mixed0d = any(a.ndim == 0 for a in arrays) and any(a.ndim > 0 for a in arrays) and len(
        {a.dtype for a in arrays}) > 1
    return ints or floats or mixed0d


def assert_tree_close(a, b, where):
    la, ta = jax.tree.flatten(a, is_leaf=lambda v: v is None)
    lb, tb = jax.tree.flatten(b, is_leaf=lambda v: v is None)
    assert len(la) == len(lb), f"{where}: {a!r} vs {b!r}"
    for u, v in zip(la, lb):
        if v is None or isinstance(v, (int, float, bool, tuple, type, np.dtype)):
            assert u == v, f"{where}: {u!r} vs {v!r}"
        else:
            assert jnp.asarray(u).dtype == jnp.asarray(v).dtype, f"{where}: {jnp.asarray(u).dtype} vs {v.dtype}"
            tol = 1e-12 if v.dtype == jnp.float64 or not jnp.issubdtype(v.dtype, jnp.inexact) else 1e-6
            np.testing.assert_allclose(np.asarray(u, np.float64), np.asarray(v, np.float64), rtol=tol, atol=tol,
                                       err_msg=where)


# ---- the cases: torch code as it appears in forward ------------------------------------------

def tensors():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return dict(x=r(2, 3, 4), y=r(2, 3, 4), m=r(3, 4), n=r(4, 5), v=r(4), b=r(2, 4, 5), c=r(2, 3, 4).abs() + 0.5,
                i=torch.tensor([[2, 0, 1], [1, 1, 0]]), s=torch.tensor(2.5, dtype=torch.float64),
                k=torch.arange(12).reshape(3, 4) - 5, z=torch.zeros(4, dtype=torch.float64),
                img=r(2, 4, 5, 5), mask=r(3, 4) > 0)


CASES = {
    "arithmetic": lambda t: [t["x"] + t["y"], t["x"] + 1, 1 + t["x"], t["x"] - t["y"], 1 - t["x"], t["x"] * 2,
                             2 * t["x"], t["x"] / t["c"], 1 / t["c"], t["x"] // t["c"], t["x"] % t["c"],
                             t["x"] ** 2, 2 ** t["x"], t["c"] ** t["x"], -t["x"], t["m"] @ t["n"],
                             torch.add(t["x"], t["y"], alpha=2), torch.sub(t["x"], t["y"], alpha=0.5),
                             t["x"].div(t["c"], rounding_mode="floor"), t["x"].div(t["c"], rounding_mode="trunc"),
                             torch.true_divide(t["k"], 4), t["k"] / 4, t["k"] * 0.5, t["k"] // 3, t["k"] % 3,
                             torch.remainder(t["k"], -3), torch.fmod(t["k"], 3), t["x"] * t["s"], t["k"] * t["s"],
                             t["x"].float() * t["s"], torch.floor_divide(t["k"], -4)],
    "matmul": lambda t: [torch.matmul(t["x"], t["n"]), t["b"].transpose(1, 2).bmm(t["b"]), t["m"].mm(t["n"]),
                         torch.addmm(t["v"][:1], t["m"], t["n"][:, :1].expand(4, 4)),
                         torch.baddbmm(t["x"], t["x"], t["b"][:, :, :4], beta=0.5, alpha=2),
                         torch.outer(t["v"], t["v"]), torch.einsum("bij,jk->bik", t["x"], t["n"]),
                         torch.einsum("bhi,bhj->bij", [t["x"], t["y"]]), t["m"].T @ t["m"], t["x"] @ t["x"].mT],
    "unary": lambda t: [t["x"].abs(), torch.exp(t["x"]), t["c"].log(), torch.log1p(t["c"]), t["c"].sqrt(),
                        torch.rsqrt(t["c"]), t["c"].reciprocal(), t["x"].sin(), torch.cos(t["x"]), t["x"].tanh(),
                        torch.sigmoid(t["x"]), t["x"].sigmoid(), torch.erf(t["x"]), t["x"].relu(),
                        torch.relu(t["x"]), t["x"].sign(), t["x"].floor(), t["x"].ceil(), (3 * t["x"]).round(),
                        torch.round(t["x"], decimals=1), t["x"].exp2(), t["k"].exp(), t["k"].abs(),
                        torch.square(t["x"]), t["x"].trunc(), t["x"].frac(), t["c"].log2(), torch.tanh(t["x"]),
                        t["x"].neg(), t["x"].softmax(-1), torch.log_softmax(t["x"], dim=1),
                        t["x"].softmax(dim=0, dtype=torch.float64)],
    "clamp_where": lambda t: [t["x"].clamp(-0.5, 0.5), torch.clamp(t["x"], min=0), t["x"].clip(max=0.1),
                              torch.clamp(t["x"], min=t["y"]), t["x"].clamp(t["y"], t["y"] + 0.1),
                              t["k"].clamp(min=-1.5), torch.maximum(t["x"], t["y"]), torch.minimum(t["x"], t["y"]),
                              torch.where(t["x"] > 0, t["x"], t["y"]), torch.where(t["x"] > 0, t["x"], 0.0),
                              t["x"].where(t["x"] > 0, t["y"]), torch.lerp(t["x"], t["y"], 0.3),
                              t["x"].lerp(t["y"], 0.8), torch.lerp(t["x"], t["y"], t["c"] - 1),
                              torch.addcmul(t["x"], t["y"], t["c"], value=0.5), t["x"].clamp_min(0.2),
                              t["x"].max(t["y"])],
    "compare_logic": lambda t: [t["x"] == t["y"], t["x"] != 0, t["x"] < t["y"], t["x"] <= 0.1, t["x"] > t["y"],
                                t["x"] >= 0, t["x"].eq(t["y"]), t["x"].gt(0), (t["x"] > 0) & (t["y"] > 0),
                                (t["x"] > 0) | (t["y"] > 0), ~(t["x"] > 0), (t["x"] > 0) ^ (t["y"] > 0),
                                torch.logical_and(t["x"] > 0, t["y"] > 0), torch.logical_not(t["x"] > 0),
                                t["x"].isnan(), torch.isfinite(t["x"] / t["z"][0]), t["k"] & 6, ~t["k"],
                                t["mask"].logical_or(t["mask"].T.T)],
    "reductions": lambda t: [t["x"].sum(), t["x"].sum(-1), t["x"].sum(dim=(0, 2), keepdim=True), t["x"].mean(1),
                             torch.mean(t["x"], dim=[1, 2]), t["x"].amax(-1), t["x"].amin(dim=(0, 1)),
                             t["x"].max(), t["x"].max(1), t["x"].min(dim=-1, keepdim=True), torch.max(t["x"], 2),
                             t["x"].argmax(), t["x"].argmax(-1), torch.argmin(t["x"], dim=1, keepdim=True),
                             t["x"].var(), t["x"].var(1), t["x"].var(1, unbiased=False), t["x"].std(-1, keepdim=True),
                             torch.var(t["x"], dim=2, correction=0), t["x"].std(False), torch.std_mean(t["x"], 1),
                             t["x"].norm(), t["x"].norm(dim=-1), torch.norm(t["x"], p=1, dim=1),
                             t["x"].norm(p=float("inf")), torch.linalg.vector_norm(t["x"], 3, dim=(1, 2)),
                             t["x"].logsumexp(-1), torch.logsumexp(t["x"], dim=(0, 1)), t["x"].cumsum(1),
                             t["k"].cumsum(0), t["c"].prod(-1), t["k"].prod(), t["k"].sum(), t["mask"].sum(),
                             t["mask"].sum(-1), t["mask"].all(), t["mask"].any(1), t["x"].topk(2, dim=1),
                             torch.sort(t["x"], dim=-1, descending=True), t["x"].argsort(dim=1),
                             t["k"].count_nonzero(), t["x"].aminmax(dim=0), t["x"].diff(),
                             torch.diff(t["k"], dim=0, prepend=t["k"][:1] - 1), t["mask"].diff(dim=1),
                             t["x"].diff(n=2, dim=1, append=t["x"][:, :1])],
    "shape": lambda t: [t["x"].view(2, 12), t["x"].view(-1), t["x"].view((6, 4)), t["x"].reshape(2, -1, 2),
                        torch.reshape(t["x"], (4, 6)), t["x"].view_as(t["x"].T), t["x"].reshape_as(t["b"][:, :3, :4].flatten(1)),
                        t["x"].permute(2, 0, 1), t["x"].permute((0, 2, 1)), t["x"].transpose(0, 2),
                        t["x"].transpose(-1, -2), torch.transpose(t["x"], 1, 0), t["x"].swapaxes(0, 1), t["m"].t(),
                        t["v"].t(), t["m"].T, t["x"].mT, t["x"].flatten(), t["x"].flatten(1), torch.flatten(t["x"], 0, 1),
                        t["x"].unflatten(2, (2, 2)), t["x"].unflatten(-1, (-1, 2)), t["x"][:, :1].squeeze(),
                        t["x"][:, :1].squeeze(1), t["x"].squeeze(0), t["x"][:1, :, :1].squeeze((0, 2)),
                        t["x"].unsqueeze(1), t["x"].unsqueeze(-1), t["v"].expand(3, 4), t["m"].expand(2, -1, -1),
                        t["v"][None].expand(3, -1), t["v"].expand_as(t["m"]), t["m"].repeat(2, 1),
                        t["v"].repeat(2, 3, 1), t["x"].repeat_interleave(2, dim=1), t["v"].repeat_interleave(3),
                        t["x"].contiguous(), t["x"].clone(), t["x"].detach(), t["x"].cpu(), t["x"].data,
                        t["x"].chunk(3, dim=-1), t["x"].chunk(2, 1), torch.chunk(t["x"], 4, 2), t["x"].split(3, -1),
                        t["x"].split([1, 2], dim=1), torch.split(t["x"], 2, 1), t["x"].unbind(1), t["x"].unbind(),
                        torch.cat([t["x"], t["y"]], dim=1), torch.cat((t["x"], t["y"])), torch.concat([t["x"]], -1),
                        torch.stack([t["x"], t["y"]], dim=1), torch.stack((t["v"], t["v"])),
                        t["x"].narrow(2, 1, 2), t["x"].flip(-1), torch.flip(t["x"], (0, 2)), t["x"].roll(1, 2),
                        torch.roll(t["x"], shifts=(1, -1), dims=(0, 1)), t["x"].movedim(0, -1),
                        t["x"].size(), t["x"].size(1), t["x"].size(-1), t["x"].shape, t["x"].shape[0], t["x"].dim(),
                        t["x"].ndim, t["x"].numel(), len(t["x"]), t["x"].type_as(t["k"]), t["i"].gather(1, t["i"]),
                        torch.gather(t["m"], 1, t["i"][:, :2].T.contiguous()), t["m"].index_select(1, t["i"][0]),
                        torch.take_along_dim(t["m"], t["m"].argmax(1, keepdim=True), dim=1),
                        t["x"].tril(), torch.triu(t["m"], diagonal=1), torch.tril(t["m"], -1)],
    "indexing": lambda t: [t["x"][0], t["x"][:, 1], t["x"][..., :2], t["x"][None, :, 1:3], t["x"][:, :, -1],
                           t["x"][1, ..., None], t["x"][::-1 if False else 2], t["x"][:, ::2], t["x"][t["i"] % 2],
                           t["x"][:, t["i"][0]], t["x"][t["i"][0] % 2, t["i"][1]], t["x"][[0, 1], :, [1, 3]],
                           t["m"].masked_fill(t["mask"], float("-inf")), t["m"].masked_fill(~t["mask"], 0.5),
                           t["k"].masked_fill(t["mask"], 2.7), t["m"].masked_fill(t["mask"][0], t["s"])],
    "dtype_and_factories": lambda t: [t["x"].float(), t["k"].double(), t["x"].long(), t["k"].bool(), t["mask"].int(),
                                      t["mask"].float(), t["x"].to(torch.float32), t["k"].to(t["x"]),
                                      t["x"].to("cpu"), t["x"].to("cpu", torch.float32), t["x"].to(dtype=torch.int32),
                                      t["x"].half(), t["x"].is_floating_point(), t["k"].is_floating_point(),
                                      t["x"].dtype, torch.zeros(2, 3), torch.zeros((2, 3), dtype=torch.int64),
                                      torch.ones(4, device="cpu"), torch.full((2, 2), 3), torch.full((2,), 1.5),
                                      torch.full((2,), True), torch.empty(3, 2).shape, torch.arange(5),
                                      torch.arange(1, 7, 2), torch.arange(0, 1, 0.1), torch.arange(5.0),
                                      torch.arange(3, dtype=torch.float64), torch.linspace(0, 1, 7),
                                      torch.linspace(-3, 2, 6, dtype=torch.float64), torch.eye(3), torch.eye(2, 4),
                                      torch.tensor([1.0, 2.5]), torch.tensor([[1, 2]]), torch.tensor(True),
                                      torch.tensor(0.1, dtype=torch.float64), torch.as_tensor([1, 2]),
                                      torch.zeros_like(t["x"]), torch.ones_like(t["k"], dtype=torch.float64),
                                      torch.full_like(t["x"], 7), torch.empty_like(t["m"]).shape,
                                      t["x"].new_zeros(2, 3), t["x"].new_ones((3,)), t["k"].new_full((2,), 4),
                                      t["x"].new_tensor([1, 2]), t["x"].new_empty(2).shape],
    "functional": lambda t: [F_.relu(t["x"]), F_.relu(t["x"], inplace=True), F_.linear(t["x"], t["n"].T, t["n"][0]),
                             F_.conv2d(t["img"], t["img"][:3, :, :3, :3], padding=1, stride=2),
                             F_.max_pool2d(t["img"], 2), F_.adaptive_avg_pool2d(t["img"], 1),
                             F_.batch_norm(t["img"], t["v"].clone(), t["c"][0, 0].clone(), training=True),
                             F_.batch_norm(t["img"], t["v"], t["c"][0, 0], t["v"], t["v"], training=False),
                             F_.batch_norm(t["img"], None, None, training=True),
                             F_.instance_norm(t["img"], t["v"].clone(), t["c"][0, 0].clone(), use_input_stats=True),
                             F_.layer_norm(t["x"], (4,), t["v"], t["v"]), F_.gelu(t["x"], approximate="tanh"),
                             F_.dropout(t["x"], 0.5, training=False), F_.dropout(t["x"], 0.5),
                             F_.dropout(t["x"], p=0.1, training=True),
                             F_.scaled_dot_product_attention(t["x"], t["y"], t["x"], is_causal=True),
                             F_.scaled_dot_product_attention(t["x"], t["y"], t["x"], dropout_p=0.2),
                             F_.interpolate(t["img"], scale_factor=2, mode="nearest"), F_.softmax(t["x"], dim=-1),
                             F_.cross_entropy(t["m"], t["i"][0]), F_.embedding(t["i"], t["m"]),
                             F_.pad(t["x"], (1, 2)), F_.hardswish(t["x"]), F_.relu6(t["x"] * 6)],
    "random": lambda t: [torch.randn_like(t["x"]), torch.rand(2, 3), torch.randint(0, 5, (3,)),
                         torch.bernoulli(t["c"] / 3), torch.multinomial(t["c"][0], 2), t["x"].bernoulli_(0.3)],
    "inplace": lambda t: _inplace(t),
}


def _inplace(t):
    z = t["x"].clone()
    z += 1
    z.add_(t["y"], alpha=0.5)
    z.mul_(2)
    z -= t["y"]
    z /= 3
    z[0] = 1.5
    z[:, 1] = t["y"][:, 1]
    z[:, :, 0] += t["v"][:3]
    z[t["i"][0] % 2, 1:] = 0.0
    z.masked_fill_(z > 1, 0.25)
    z.clamp_(min=-1)
    z.relu_()
    w = t["m"].clone()
    w.fill_(3)
    w.zero_()
    w.copy_(t["v"])
    w.exp_()
    w.index_add_(0, t["i"][0], t["m"][:3])
    return z, w


@pytest.fixture(scope="module")
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_op_equals_torch_and_its_source_equals_the_op(case, x64):
    t = tensors()
    with Record() as rec:
        CASES[case](t)
    assert rec.calls
    for n, call in enumerate(rec.calls):
        replay(call, n)
