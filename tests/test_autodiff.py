"""funcnet.autodiff against independent oracles: jax.grad (float64), torch.autograd, closed forms.

Property tests build random programs of the engine's primitives over random shapes
(broadcasting included), run them once through funcnet.autodiff on NumPy arrays and once
through jax.grad on jax.numpy under a scoped ``jax.enable_x64``, and compare the gradients.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, broadcastable_shapes

from funcnet import autodiff as ad

SETTINGS = settings(max_examples=50, deadline=None)
# float64 on both sides: the engines differ only in the order of summations, so agreement is
# ~1e-15 relative; entries that are themselves the result of cancellation get an absolute
# allowance scaled to the largest gradient entry.
RTOL, ATOL_SCALE = 1e-6, 1e-9


def assert_tree_close(ours, theirs):
    ours, theirs = jax.tree.leaves(ours), jax.tree.leaves(theirs)
    assert len(ours) == len(theirs)
    scale = max([1.0] + [float(np.max(np.abs(t), initial=0.0)) for t in theirs])
    for a, b in zip(ours, theirs):
        assert np.shape(a) == np.shape(b)
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL_SCALE * scale)


def jax64(transform, f, *args, jit=True):
    """``transform(f)(*args)`` in float64, x64 switched on for this call only. Compiled once with
    ``jit``: cheaper than eager jax compiling each op for each new shape; eager is cheaper where
    every example has the same shapes (its per-op compilations are cached)."""
    with jax.enable_x64(True):
        g = jax.jit(transform(f)) if jit else transform(f)
        return jax.tree.map(np.asarray, g(*jax.tree.map(jnp.asarray, args)))


# ---- the articles' example -------------------------------------------------------------------


def test_x_squared_plus_3x_is_exactly_7():
    g = ad.grad(lambda x: x**2 + 3 * x)(2.0)
    assert g == 7.0
    assert np.shape(g) == () and np.asarray(g).dtype == np.float64


def test_x_squared_plus_3x_matches_torch():
    x = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    (x**2 + 3 * x).backward()
    assert ad.grad(lambda x: np.sum(x**2 + 3 * x))(np.array([2.0])) == x.grad.numpy()


# ---- random programs of primitives vs jax.grad -----------------------------------------------
# Each step maps the running value h (and maybe an extra input y) to a new value; the forms keep
# values in the domains of log, pow and div. `xp` is numpy (funcnet.autodiff) or jax.numpy.

UNARY = {
    "tanh": lambda xp, h: xp.tanh(h),
    "exp": lambda xp, h: xp.exp(xp.tanh(h)),
    "log": lambda xp, h: xp.log(h * h + 1.0),
    "square": lambda xp, h: h**2,
    "cube": lambda xp, h: h**3,
    "sqrt": lambda xp, h: (h * h + 0.5) ** 0.5,
    "rsqrt3": lambda xp, h: (h * h + 0.5) ** -1.5,
    "neg": lambda xp, h: -h,
    "relu": lambda xp, h: xp.maximum(h, 0.0),
    "self_mul": lambda xp, h: h * xp.tanh(h),
    "scale_shift": lambda xp, h: 0.5 * h - 1.0,
    "rdiv": lambda xp, h: 1.0 / (h * h + 0.5),
}
BINARY = {
    "add": lambda xp, h, y: h + y,
    "sub": lambda xp, h, y: y - h,
    "mul": lambda xp, h, y: h * y,
    "div": lambda xp, h, y: h / (y * y + 0.5),
    "div_by": lambda xp, h, y: y / (h * h + 0.5),
    "pow_traced": lambda xp, h, y: (y * y + 0.5) ** xp.tanh(h),
    "maximum": lambda xp, h, y: xp.maximum(h, y),
}


@st.composite
def programs(draw):
    """(steps, inputs): steps are tuples naming an operation and the input(s) it uses."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = draw(array_shapes(min_dims=1, max_dims=3, max_side=4))
    inputs, steps = [rng.uniform(-1.5, 1.5, shape)], []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "matmul", "left_matmul", "reduce",
                                     "reshape", "transpose", "broadcast_to"]))
        if kind == "unary":
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY)))))
        elif kind == "binary":
            other = draw(broadcastable_shapes(shape, min_dims=0, max_dims=len(shape) + 1, max_side=4))
            inputs.append(rng.uniform(-1.5, 1.5, other))
            steps.append(("binary", draw(st.sampled_from(sorted(BINARY))), len(inputs) - 1))
            shape = np.broadcast_shapes(shape, other)
        elif kind == "matmul":  # h @ W with W traced; W may be 1-D
            k = draw(st.sampled_from([None, 1, 3]))
            inputs.append(rng.uniform(-1, 1, (shape[-1],) if k is None else (shape[-1], k)))
            steps.append(("matmul", len(inputs) - 1))
            shape = shape[:-1] if k is None else shape[:-1] + (k,)
        elif kind == "left_matmul" and len(shape) >= 2:  # a constant ndarray on the left of @
            c = rng.uniform(-1, 1, (2, shape[-2]))
            steps.append(("left_matmul", c))
            shape = shape[:-2] + (2, shape[-1])
        elif kind == "reduce" and shape:
            axis = draw(st.integers(-len(shape), len(shape) - 1))
            keepdims, fn = draw(st.booleans()), draw(st.sampled_from(["sum", "mean"]))
            steps.append(("reduce", fn, axis, keepdims))
            shape = shape[:axis % len(shape)] + (1,) * keepdims + shape[axis % len(shape) + 1:]
        elif kind == "reshape":
            new = (-1,) if len(shape) != 1 else (1, -1)
            steps.append(("reshape", new))
            shape = (int(np.prod(shape)),) if new == (-1,) else (1, int(np.prod(shape)))
        elif kind == "transpose" and len(shape) >= 2:
            axes = tuple(draw(st.permutations(range(len(shape)))))
            steps.append(("transpose", axes))
            shape = tuple(shape[a] for a in axes)
        elif kind == "broadcast_to":
            lead = draw(st.integers(1, 3))
            steps.append(("broadcast_to", (lead,) + tuple(shape)))
            shape = (lead,) + tuple(shape)
        if not shape:  # a full reduction happened; keep an axis for the next step
            steps.append(("reshape", (1,)))
            shape = (1,)
    steps.append(("final", draw(st.sampled_from(["sum", "mean"]))))
    return steps, inputs


def run_program(xp, steps, inputs):
    h = inputs[0]
    for step in steps:
        op = step[0]
        if op == "unary":
            h = UNARY[step[1]](xp, h)
        elif op == "binary":
            h = BINARY[step[1]](xp, h, inputs[step[2]])
        elif op == "matmul":
            h = h @ inputs[step[1]]
        elif op == "left_matmul":
            h = step[1] @ h
        elif op == "reduce":
            h = getattr(xp, step[1])(h, axis=step[2], keepdims=step[3])
        elif op == "reshape":
            h = xp.reshape(h, step[1])
        elif op == "transpose":
            h = xp.transpose(h, step[1])
        elif op == "broadcast_to":
            h = xp.broadcast_to(h, step[1])
        elif op == "final":
            h = getattr(xp, step[1])(h)
    return h


@SETTINGS
@given(programs())
def test_random_programs_match_jax_grad(program):
    steps, inputs = program
    value, grads = ad.value_and_grad(lambda xs: run_program(np, steps, xs))(inputs)
    jvalue, theirs = jax64(jax.value_and_grad, lambda xs: run_program(jnp, steps, xs), inputs)
    np.testing.assert_allclose(value, jvalue, rtol=1e-12)
    assert_tree_close(grads, theirs)
    # vjp with a cotangent c gives c times the gradient; the pullback can be called again
    out, pullback = ad.vjp(lambda *xs: run_program(np, steps, xs), *inputs)
    assert out == value
    assert_tree_close(pullback(np.asarray(2.5)), [2.5 * t for t in theirs])
    assert_tree_close(pullback(np.asarray(-1.0)), [-t for t in theirs])


def test_vjp_of_a_vector_function_matches_jax():
    rng = np.random.default_rng(4)
    x, W, ct = rng.normal(size=(5, 4)), rng.normal(size=(4, 3)), rng.normal(size=(5, 3))

    out, pullback = ad.vjp(lambda x, W: np.tanh(x @ W), x, W)
    with jax.enable_x64(True):
        jout, jpullback = jax.vjp(lambda x, W: jnp.tanh(x @ W), x, W)
        theirs = jax.tree.map(np.asarray, jpullback(jnp.asarray(ct)))
        jout = np.asarray(jout)
    np.testing.assert_allclose(out, jout, rtol=1e-12)
    assert_tree_close(pullback(ct), theirs)


# ---- higher order ----------------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.sampled_from(sorted(UNARY)), min_size=1, max_size=4),
       st.floats(-1.5, 1.5, allow_nan=False), st.floats(-1.0, 1.0))
def test_second_derivative_matches_jax(names, x, c):
    # relu's second derivative is zero away from 0; hypothesis may hit exactly 0, where the
    # first derivative has a kink: shift the point off it.
    x = x + 0.125 if abs(x) < 1e-3 else x

    def f(xp, h):
        for name in names:
            h = UNARY[name](xp, h) + c * h
        return h

    ours = ad.grad(ad.grad(lambda h: f(np, h)))(x)
    theirs = jax64(lambda g: jax.grad(jax.grad(g)), lambda h: f(jnp, h), x, jit=False)
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL_SCALE)


def test_third_derivative_closed_form():
    assert ad.grad(ad.grad(ad.grad(lambda x: x**4)))(2.0) == 48.0


def test_gradient_of_gradient_norm_matches_jax():
    rng = np.random.default_rng(3)
    x, W, b = rng.normal(size=(5, 4)), rng.normal(size=(4, 3)), rng.normal(size=3)

    def loss(xp, W, b):
        return xp.mean(xp.tanh(x @ W + b) ** 2)

    def penalty(xp, grad, W, b):  # the squared norm of dloss/dW, as in a gradient penalty
        return xp.sum(grad(lambda W: loss(xp, W, b))(W) ** 2)

    ours = ad.grad(lambda W, b: penalty(np, ad.grad, W, b), argnums=(0, 1))(W, b)
    theirs = jax64(lambda f: jax.grad(f, argnums=(0, 1)), lambda W, b: penalty(jnp, jax.grad, W, b), W, b)
    assert_tree_close(ours, theirs)


def test_closed_over_outer_value_is_not_confused_with_the_inner_input():
    # d/dx [d/dy (x*y) at y=x] = d/dx [x] = 1 (a naive engine that shares nodes gives 2).
    assert ad.grad(lambda x: ad.grad(lambda y: x * y)(x))(3.0) == 1.0
    assert jax.grad(lambda x: jax.grad(lambda y: x * y)(x))(3.0) == 1.0


def test_second_derivative_matches_torch_create_graph():
    x = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y = torch.tanh(x) ** 3 * torch.exp(x)
    (dy,) = torch.autograd.grad(y, x, create_graph=True)
    (d2y,) = torch.autograd.grad(dy, x)
    ours = ad.grad(ad.grad(lambda x: np.tanh(x) ** 3 * np.exp(x)))(0.7)
    np.testing.assert_allclose(ours, d2y.item(), rtol=1e-12)


# ---- torch.autograd as a second oracle -------------------------------------------------------


def test_mlp_gradients_match_torch():
    rng = np.random.default_rng(0)
    x, W1, b1 = rng.normal(size=(8, 5)), rng.normal(size=(5, 6)) / 5**0.5, np.zeros(6)
    W2, b2 = rng.normal(size=(6, 3)) / 6**0.5, np.zeros(3)

    def loss(W1, b1, W2, b2):
        h = np.maximum(x @ W1 + b1, 0.0)
        return np.mean(np.tanh(h @ W2 + b2) ** 2)

    ours = ad.grad(loss, argnums=(0, 1, 2, 3))(W1, b1, W2, b2)
    params = [torch.tensor(p, requires_grad=True) for p in (W1, b1, W2, b2)]
    h = torch.clamp(torch.from_numpy(x) @ params[0] + params[1], min=0)
    torch.mean(torch.tanh(h @ params[2] + params[3]) ** 2).backward()
    for a, p in zip(ours, params):
        np.testing.assert_allclose(a, p.grad.numpy(), rtol=1e-10, atol=1e-14)


# ---- dtypes ----------------------------------------------------------------------------------


def test_float32_inputs_stay_float32_and_match_jax():
    rng = np.random.default_rng(1)
    W, x = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(6, 4)).astype(np.float32)
    ours = ad.grad(lambda W: np.mean(np.tanh(x @ W) ** 2))(W)
    theirs = np.asarray(jax.grad(lambda W: jnp.mean(jnp.tanh(x @ W) ** 2))(W))
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1.3e-6, atol=1e-6)


def test_integer_inputs_become_float64():
    g = ad.grad(lambda x: np.sum(x * x))(np.array([1, 2, 3]))
    assert g.dtype == np.float64 and np.array_equal(g, [2.0, 4.0, 6.0])


def test_pytree_arguments():
    params = {"w": np.array([1.0, 2.0]), "b": (np.array(3.0),)}
    g = ad.grad(lambda p: np.sum(p["w"] ** 2) * p["b"][0])(params)
    assert np.array_equal(g["w"], [6.0, 12.0]) and g["b"][0] == 5.0


# ---- the graph printout ----------------------------------------------------------------------


def test_graph_printout_lists_the_primitives():
    text = str(ad.make_graph(lambda x: x**2 + 3 * x)(2.0))
    assert text.splitlines() == [
        "v0: input  shape () float64",
        "v1 = pow(v0, 2)  shape ()",
        "v2 = mul(3, v0)  shape ()",
        "v3 = add(v1, v2)  shape ()",
        "return v3",
    ]


def torch_graph_names(t):
    """Names of the backward nodes reachable from t.grad_fn, e.g. {"MulBackward0", ...}."""
    names, stack = set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is not None and type(fn).__name__ != "AccumulateGrad":
            names.add(type(fn).__name__)
            stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


def test_graph_primitives_match_torch_grad_fn_walk():
    rng = np.random.default_rng(2)
    x, W, b = rng.normal(size=(4, 3)), rng.normal(size=(3, 2)), rng.normal(size=2)
    graph = ad.make_graph(lambda W, b: np.mean(np.maximum(x @ W + b, 0.0) ** 2), argnums=(0, 1))(W, b)
    tW, tb = torch.tensor(W, requires_grad=True), torch.tensor(b, requires_grad=True)
    out = torch.mean(torch.maximum(torch.from_numpy(x) @ tW + tb, torch.tensor(0.0, dtype=torch.float64)) ** 2)
    torch_names = {"MmBackward0": "matmul", "AddBackward0": "add", "MaximumBackward0": "maximum",
                   "PowBackward0": "pow", "MeanBackward0": "mean"}
    assert {torch_names[n] for n in torch_graph_names(out)} == set(graph.primitives)
    assert graph.primitives == ["matmul", "add", "maximum", "pow", "mean"]
    assert "v2 = matmul(const(4, 3), v0)  shape (4, 2)" in str(graph)


# ---- clear errors ----------------------------------------------------------------------------


def test_unsupported_ufunc_is_named_with_the_supported_list():
    with pytest.raises(ad.UnsupportedError, match=r"numpy\.sin .*Supported ufuncs: .*tanh"):
        ad.grad(lambda x: np.sin(x))(1.0)


def test_unsupported_function_and_argument_are_named():
    with pytest.raises(ad.UnsupportedError, match=r"numpy\.concatenate.*functions: .*mean"):
        ad.grad(lambda x: np.sum(np.concatenate([x, x])))(np.ones(2))
    with pytest.raises(ad.UnsupportedError, match=r"numpy\.sum with \['dtype'\]"):
        ad.grad(lambda x: np.sum(x, dtype=np.float32))(np.ones(2))
    with pytest.raises(ad.UnsupportedError, match=r"numpy\.add\.reduce"):
        ad.grad(lambda x: np.add.reduce(x))(np.ones(2))


def test_matmul_shape_mismatch_names_primitive_and_shapes():
    with pytest.raises(ad.ShapeError, match=r"matmul: shapes \(3, 4\) and \(5, 2\) do not align"):
        ad.grad(lambda W: np.sum(W @ np.ones((5, 2))))(np.ones((3, 4)))


def test_broadcast_mismatch_names_primitive_and_shapes():
    with pytest.raises(ad.ShapeError, match=r"add: operands of shapes \(3,\) and \(4,\)"):
        ad.grad(lambda x: np.sum(x + np.ones(4)))(np.ones(3))


def test_non_scalar_output_and_bad_argnums_are_explained():
    with pytest.raises(ad.ShapeError, match=r"scalar, got shape \(3,\).*np\.sum"):
        ad.grad(lambda x: x * 2)(np.ones(3))
    with pytest.raises(ValueError, match=r"argnums=2 .*2 positional arguments"):
        ad.grad(lambda a, b: a * b, argnums=2)(1.0, 2.0)
    with pytest.raises(ad.ShapeError, match=r"cotangent of shape \(2,\) for an output of shape \(3,\)"):
        ad.vjp(lambda x: x * 2, np.ones(3))[1](np.ones(2))


def test_converting_a_tracer_to_an_array_is_refused():
    with pytest.raises(TypeError, match=r"tracer\.value"):
        ad.grad(lambda x: np.sum(np.asarray(x)))(np.ones(2))
