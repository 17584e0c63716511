"""Autograd: torch records a graph as it computes; JAX transforms the function.

torch: ``requires_grad=True`` makes every op record a node (``y.grad_fn``, linked by
``next_functions``); ``y.backward()`` walks it once, frees its saved tensors, and adds
into ``x.grad``. JAX: ``jax.grad(f)`` is a new function, traced from ``f`` (its
program is printed by ``jax.make_jaxpr``); ``jax.vjp`` returns a pullback that can be
called any number of times; gradients are return values, never accumulated.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

from comparisons._core import Options, Result, Side, close, dtypes, equal, expect, raises, run_sections, source
from funcnet import interop, losses, nn

__all__ = ["TITLE", "run"]

TITLE = "Autograd: x**2 + 3x, the recorded graph, chain rule, retain_graph, accumulation, MLP gradients"

X_CHAIN = [-1.0, 0.5, 2.0]  # where the composite sin(x**2 + 3x) is differentiated


# ---------------------------------------------------------------- PyTorch


def torch_derivative(dtype):
    x = torch.tensor([2.0], dtype=dtype, requires_grad=True)
    y = x ** 2 + 3 * x
    y.backward()
    print(f"x.grad = {x.grad}  (2x + 3 at x = 2)")

    def walk(fn, depth=0):  # the graph backward() follows, output first
        lines = ["  " * depth + fn.name()]
        for child, _ in fn.next_functions:
            if child is not None:
                lines += walk(child, depth + 1)
        return lines

    print("y.grad_fn graph:\n" + "\n".join(walk(y.grad_fn)))
    return x, y


def torch_chain_rule(dtype):
    x = torch.tensor(X_CHAIN, dtype=dtype, requires_grad=True)
    z = torch.sin(x ** 2 + 3 * x).sum()
    z.backward()  # cos(u) * (2x + 3), u = x**2 + 3x
    print(f"d/dx sum(sin(x**2 + 3x)) = {[round(v, 6) for v in x.grad.tolist()]}")
    return x.grad


def torch_second_backward(x):
    y = x ** 2 + 3 * x
    y.backward()
    y.backward()  # the first call freed the tensors the graph saved


def torch_retain_graph(dtype):
    x = torch.tensor([2.0], dtype=dtype, requires_grad=True)
    try:
        torch_second_backward(x)
    except RuntimeError as e:
        print(f"second backward(): RuntimeError: {str(e).split(' (')[0]}")
    x.grad = None
    y = x ** 2 + 3 * x
    y.backward(retain_graph=True)
    y.backward()  # allowed now; the second gradient adds to the first
    print(f"backward(retain_graph=True) then backward(): x.grad = {x.grad}")
    return x.grad


def torch_accumulate(dtype):
    x = torch.tensor([2.0], dtype=dtype, requires_grad=True)
    grads = []
    for _ in range(2):
        (x ** 2 + 3 * x).backward()  # each call adds into x.grad
        grads.append(x.grad.clone())
    print(f"x.grad after 1 and 2 backward() calls: {grads[0].item()}, {grads[1].item()}")
    x.grad.zero_()  # what optimizer.zero_grad() is for
    return grads


def torch_mlp_grads(model, x, y):
    model.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    print(f"loss {loss.item():.6f}; |grad|: " + ", ".join(f"{k} {g.norm():.6f}" for k, g in grads.items()))
    return loss, grads


# ---------------------------------------------------------------- JAX


def f(x):
    return x ** 2 + 3 * x


def jax_derivative(dtype):
    x = jnp.asarray(2.0, dtype)
    print(f"jax.grad(f)(2.0) = {jax.grad(f)(x)}  (2x + 3 at x = 2)")
    forward, backward = jax.make_jaxpr(f)(x), jax.make_jaxpr(jax.grad(f))(x)
    print(f"make_jaxpr(f):\n{forward}\nmake_jaxpr(grad(f)):\n{backward}")
    return jax.grad(f)(x), forward, backward


def jax_chain_rule(dtype):
    x = jnp.asarray(X_CHAIN, dtype)
    g = jax.jit(jax.grad(lambda x: jnp.sin(f(x)).sum()))(x)
    print(f"d/dx sum(sin(x**2 + 3x)) = {[round(v, 6) for v in g.tolist()]}")
    return g


def jax_pullback_twice(dtype):
    y, pullback = jax.vjp(f, jnp.asarray(2.0, dtype))
    (first,) = pullback(jnp.ones_like(y))
    (second,) = pullback(jnp.ones_like(y))  # a pullback is a function: call it again
    print(f"vjp pullback called twice: {first}, {second}")
    return first, second


def jax_fresh_grads(dtype):
    x = jnp.asarray(2.0, dtype)
    g1 = jax.grad(f)(x)
    g2 = jax.grad(f)(x)  # nothing is stored between calls
    total = g1 + g2  # accumulate by adding return values
    print(f"jax.grad(f)(2.0) twice: {g1}, {g2}; summed explicitly: {total}")
    return g1, g2, total


def jax_mlp_grads(params, x, y):
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))

    def loss_fn(params):
        return losses.cross_entropy(model.apply(params, x), y)

    loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
    flat = interop.to_torch(grads)  # dotted names, as torch's named_parameters
    print(f"loss {loss:.6f}; |grad|: " + ", ".join(f"{k} {np.linalg.norm(g):.6f}" for k, g in flat.items()))
    return loss, grads


# ---------------------------------------------------------------- checks


# torch's backward node for each forward op of f, and the jaxpr primitive of the same op
_NODE_TO_PRIMITIVE = {"PowBackward0": "integer_pow", "MulBackward0": "mul", "AddBackward0": "add"}


def run(opts: Options = Options()) -> Result:
    tdt, jdt = dtypes(opts)
    tol = opts.tol
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(tdt)
    x, y = torch.randn(16, 4, dtype=tdt), torch.randint(0, 3, (16,))
    params = interop.from_torch(model)  # the same weights, bit for bit
    params["2"]["weight"] = params["2"]["weight"].at[0, 0].add(opts.perturb)
    jx, jy = jnp.asarray(x.numpy()), jnp.asarray(y.numpy().astype(np.int32))

    torch_fns = (torch_derivative, torch_chain_rule, torch_retain_graph, torch_accumulate, torch_mlp_grads)
    jax_fns = (jax_derivative, jax_chain_rule, jax_pullback_twice, jax_fresh_grads, jax_mlp_grads)
    (t_d, t_chain, t_retain, t_acc, t_mlp), t_text, t_sec = run_sections(
        torch_fns, [(tdt,), (tdt,), (tdt,), (tdt,), (model, x, y)])
    # float32 matmuls in full precision, as torch's CPU kernels (GPUs would otherwise use TF32)
    with jax.default_matmul_precision("highest"):
        (j_d, j_chain, j_pull, j_fresh, j_mlp), j_text, j_sec = run_sections(
            jax_fns, [(jdt,), (jdt,), (jdt,), (jdt,), (params, jx, jy)])

    (tx, ty), (jgrad, jaxpr_f, jaxpr_grad) = t_d, j_d
    nodes, stack = [], [ty.grad_fn]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack += [child for child, _ in node.next_functions if child is not None]
    ops = sorted(_NODE_TO_PRIMITIVE.get(n.name(), n.name()) for n in nodes if n.name() in _NODE_TO_PRIMITIVE)
    leaves = [n for n in nodes if "AccumulateGrad" in n.name()]
    x_np = np.asarray(X_CHAIN, np.float64)
    chain_oracle = np.cos(x_np ** 2 + 3 * x_np) * (2 * x_np + 3)  # closed form, float64

    checks = [
        close("d/dx (x**2 + 3x) at 2: torch vs 2x + 3", tx.grad, [7.0], **tol, why="closed form"),
        close("d/dx (x**2 + 3x) at 2: JAX vs 2x + 3", jgrad, 7.0, **tol, why="closed form"),
        equal("graph: torch's backward nodes match make_jaxpr(f)'s primitives", ops,
              sorted(e.primitive.name for e in jaxpr_f.jaxpr.eqns), why="pow, mul, add"),
        expect("graph: x is used twice; both paths are summed", len(leaves) == 2 and leaves[0] is leaves[1]
               and "add_any" in [e.primitive.name for e in jaxpr_grad.jaxpr.eqns],
               "torch: both paths end in x's one AccumulateGrad node; JAX: grad(f)'s jaxpr sums them with add_any"),
        close("chain rule: torch vs cos(u)(2x + 3)", t_chain, chain_oracle, **tol, why="closed form in float64"),
        close("chain rule: JAX vs cos(u)(2x + 3)", j_chain, chain_oracle, **tol, why="closed form in float64"),
        raises("torch: second backward() without retain_graph",
               lambda: torch_second_backward(torch.tensor([2.0], dtype=tdt, requires_grad=True)),
               RuntimeError, "backward through the graph a second time"),
        close("torch: with retain_graph=True the second backward adds (7 + 7)", t_retain, [14.0], **tol),
        equal("JAX: the vjp pullback called twice gives the same gradient", j_pull[1], j_pull[0]),
        close("JAX: the pullback's gradient is 7", j_pull[0], 7.0, **tol),
        close("torch: .grad accumulates across backward calls (7, then 14)", [g.item() for g in t_acc],
              [7.0, 14.0], **tol),
        close("JAX: jax.grad returns a fresh 7 each call", [float(j_fresh[0]), float(j_fresh[1])], [7.0, 7.0], **tol),
        close("accumulated: torch's .grad after two calls vs JAX's explicit sum", j_fresh[2], t_acc[1][0], **tol),
        close("MLP: loss, torch vs JAX (same weights)", j_mlp[0], t_mlp[0], **tol,
              why="torch.testing defaults" if opts.dtype == "float32" else "float64: reassociation only"),
    ]
    j_grads = interop.to_torch(j_mlp[1])
    for name, g in t_mlp[1].items():
        checks.append(close(f"MLP: grad {name}", j_grads[name], g, **tol,
                            why="float32: a few ulps per op" if opts.dtype == "float32"
                            else "float64: both frameworks' sums differ only in order"))
    return Result(
        name="autograd", title=TITLE,
        torch=Side(source(torch_derivative, torch_chain_rule, torch_second_backward, torch_retain_graph,
                          torch_accumulate, torch_mlp_grads), t_text, t_sec),
        jax=Side(source(f, *jax_fns), j_text, j_sec),
        checks=checks,
        notes="The MLP is nn.Sequential(Linear(4, 8), Tanh(), Linear(8, 3)) with torch's seed-0 weights, moved to "
              "JAX with funcnet.interop.from_torch; cross entropy over 16 random examples. perturb is added to "
              "the JAX copy of weight 2.weight[0, 0].",
    )
