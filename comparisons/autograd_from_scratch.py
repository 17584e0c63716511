"""Autograd from scratch: funcnet.autodiff, a hand-written reverse-mode engine, against
jax.grad and torch.autograd.

The articles' ``x**2 + 3*x`` (gradient 7 at 2), the gradients of the hand-written
TwoLayerNet's cross-entropy, a second derivative and the recorded graph are computed by
all three engines and compared. Then the TwoLayerNet (Xavier init, clamp-ReLU, manual SGD)
is trained on the digits data from the same initial weights three times: torch.autograd
on the articles' class, and funcnet.autodiff and jax.grad on one NumPy-style function that
differs only in the array namespace it is given. The three runs end with the same test
accuracy and parameters equal to float rounding.
"""

from __future__ import annotations

import contextlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

from funcnet import autodiff as ad
from funcnet import data
from comparisons._core import Options, Result, Side, close, equal, expect, raises, source, timed

__all__ = ["TITLE", "run"]

TITLE = "Autograd from scratch: a hand-written reverse-mode engine vs jax.grad vs torch.autograd"

HIDDEN, LR, EPOCHS, BATCH = 64, 0.1, 10, 64
NAMES = ("w1", "b1", "w2", "b2")  # TwoLayerNet.parameters() order
# The engines differ in the order of their summations (NumPy, XLA and torch each pick their
# own), and SGD carries those differences from step to step. Measured after the 220 steps:
# max |diff| ~2e-7 in float32 (weights of size ~0.1-1) and ~3e-16 in float64; the
# tolerances leave a factor of 10 or more.
TRAIN_TOL = {"float32": {"rtol": 1e-5, "atol": 3e-6}, "float64": {"rtol": 1e-10, "atol": 1e-12}}
TORCH_TO_PRIMITIVE = {"PowBackward0": "pow", "MulBackward0": "mul", "AddBackward0": "add"}
JAXPR_TO_PRIMITIVE = {"integer_pow": "pow", "mul": "mul", "add": "add"}


# ----------------------------------------------------------------------------- torch
class TwoLayerNet:
    """The articles' hand-written net: Xavier init, clamp-ReLU, parameters in a list."""

    def __init__(self, input_dim, hidden_dim, output_dim, dtype=torch.float32):
        self.w1 = torch.randn(input_dim, hidden_dim, dtype=dtype) / (input_dim ** 0.5)
        self.b1 = torch.zeros(hidden_dim, dtype=dtype)
        self.w2 = torch.randn(hidden_dim, output_dim, dtype=dtype) / (hidden_dim ** 0.5)
        self.b2 = torch.zeros(output_dim, dtype=dtype)
        for param in self.parameters():
            param.requires_grad = True

    def forward(self, x):
        hidden = torch.clamp(torch.matmul(x, self.w1) + self.b1, min=0)
        return torch.matmul(hidden, self.w2) + self.b2

    def parameters(self):
        return [self.w1, self.b1, self.w2, self.b2]


def grad_fn_names(grad_fn):
    """Walk the graph behind ``y.grad_fn`` through ``next_functions`` (leaves excluded)."""
    names, stack = [], [grad_fn]
    while stack:
        fn = stack.pop()
        if fn is not None and type(fn).__name__ != "AccumulateGrad":
            names.append(type(fn).__name__)
            stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return names


def torch_gradients(model, xb, yb, dtype):
    x = torch.tensor([2.0], dtype=dtype, requires_grad=True)
    y = x ** 2 + 3 * x
    y.backward()
    loss_grads = torch.autograd.grad(F.cross_entropy(model.forward(xb), yb), model.parameters())
    z = torch.tensor(0.7, dtype=dtype, requires_grad=True)
    (dz,) = torch.autograd.grad(torch.tanh(z) ** 3 * torch.exp(z), z, create_graph=True)
    (d2z,) = torch.autograd.grad(dz, z)
    return {"x_grad": x.grad, "loss_grads": loss_grads, "d2": d2z, "graph": grad_fn_names(y.grad_fn)}


def torch_train(model, x, y, *, lr, epochs, batch):
    losses = []
    for _ in range(epochs):
        for i in range(0, len(x) - batch + 1, batch):  # full batches only (DataLoader's drop_last=True)
            loss = F.cross_entropy(model.forward(x[i:i + batch]), y[i:i + batch])
            loss.backward()
            with torch.no_grad():
                for param in model.parameters():
                    param -= lr * param.grad
                    param.grad.zero_()
            losses.append(loss.item())
    return losses


# ------------------------------------------------------------- JAX and funcnet.autodiff
def two_layer_net(params, x, xp):
    """The same net as NumPy-style code; ``xp`` is numpy (traced by funcnet.autodiff) or jax.numpy."""
    hidden = xp.maximum(x @ params["w1"] + params["b1"], 0.0)  # torch.clamp(hidden, min=0)
    return hidden @ params["w2"] + params["b2"]


def cross_entropy(params, x, onehot, xp):
    logits = two_layer_net(params, x, xp)
    # log-softmax without the max shift: this net's logits stay far below exp's overflow
    log_probs = logits - xp.log(xp.sum(xp.exp(logits), axis=1, keepdims=True))
    return -xp.mean(xp.sum(onehot * log_probs, axis=1))


def sgd_step(value_and_grad, params, x, onehot, *, lr):
    """The articles' manual SGD step without mutation: it returns new parameters."""
    loss, grads = value_and_grad(params, x, onehot)
    return loss, {name: params[name] - lr * grads[name] for name in params}


def sgd_train(step, params, x, onehot, *, epochs, batch):
    losses = []
    for _ in range(epochs):
        for i in range(0, len(x) - batch + 1, batch):  # full batches only (DataLoader's drop_last=True)
            loss, params = step(params, x[i:i + batch], onehot[i:i + batch])
            losses.append(loss)
    return params, [float(loss) for loss in losses]


def funcnet_gradients(params, xb, onehot):
    graph = ad.make_graph(lambda x: x ** 2 + 3 * x)(2.0)
    return {"x_grad": ad.grad(lambda x: x ** 2 + 3 * x)(2.0),
            "loss_grads": ad.grad(partial(cross_entropy, xp=np))(params, xb, onehot),
            "d2": ad.grad(ad.grad(lambda z: np.tanh(z) ** 3 * np.exp(z)))(0.7),
            "graph": graph.primitives, "graph_text": str(graph)}


def funcnet_train(params, x, onehot, *, lr, **kw):
    step = partial(sgd_step, ad.value_and_grad(partial(cross_entropy, xp=np)), lr=lr)
    return sgd_train(step, params, x, onehot, **kw)


def jax_gradients(params, xb, onehot):
    jaxpr = jax.make_jaxpr(lambda x: x ** 2 + 3 * x)(2.0)
    return {"x_grad": jax.grad(lambda x: x ** 2 + 3 * x)(2.0),
            "loss_grads": jax.jit(jax.grad(partial(cross_entropy, xp=jnp)))(params, xb, onehot),
            "d2": jax.jit(jax.grad(jax.grad(lambda z: jnp.tanh(z) ** 3 * jnp.exp(z))))(0.7),
            "graph": [eqn.primitive.name for eqn in jaxpr.eqns], "graph_text": str(jaxpr)}


def jax_train(params, x, onehot, *, lr, **kw):
    step = jax.jit(partial(sgd_step, jax.value_and_grad(partial(cross_entropy, xp=jnp)), lr=lr))
    return sgd_train(step, jax.tree.map(jnp.asarray, params), x, onehot, **kw)


# ------------------------------------------------------------------------------ checks
def _flat(params) -> np.ndarray:
    """One vector in the torch parameter order (jax pytrees of dicts come back with sorted keys)."""
    params = [params[name] for name in NAMES] if isinstance(params, dict) else params
    return np.concatenate([np.asarray(p.detach() if hasattr(p, "detach") else p).ravel() for p in params])


def _accuracy(logits, y) -> float:
    return float(np.mean(np.argmax(np.asarray(logits), axis=1) == y))


def run(opts: Options = Options()) -> Result:
    dtype, tol, train_tol = np.dtype(opts.dtype), opts.tol, TRAIN_TOL[opts.dtype]
    tdtype = getattr(torch, opts.dtype)
    # float64 JAX needs x64; switched on for this comparison only
    x64 = jax.enable_x64(True) if opts.dtype == "float64" else contextlib.nullcontext()
    (x_train, y_train), (x_test, y_test) = data.load("digits")
    x_train, x_test = x_train.astype(dtype), x_test.astype(dtype)
    onehot = np.eye(10, dtype=dtype)[y_train]
    torch.manual_seed(0)
    model = TwoLayerNet(x_train.shape[1], HIDDEN, 10, dtype=tdtype)
    # copies: the NumPy bridge would share memory with the weights torch updates in place
    init = {name: p.detach().numpy().copy() for name, p in zip(NAMES, model.parameters())}
    jax_init = {**init, "b2": init["b2"].copy()}
    jax_init["b2"][0] += opts.perturb  # the one JAX-side weight that --perturb shifts; every logit row uses it

    xb, ob = x_train[:BATCH], onehot[:BATCH]
    tx, ty = torch.from_numpy(x_train), torch.from_numpy(y_train.astype(np.int64))
    t_grads = torch_gradients(model, tx[:BATCH], ty[:BATCH], tdtype)
    f_grads = funcnet_gradients(init, xb, ob)
    with x64:
        j_grads = jax.tree.map(lambda a: np.asarray(a) if isinstance(a, jax.Array) else a,
                               jax_gradients(jax_init, xb, ob))

    hyper = {"lr": LR, "epochs": EPOCHS, "batch": BATCH}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 64x64 matmuls: extra OpenMP threads only wait on each other
    try:
        t_losses, t_sec = timed(torch_train, model, tx, ty, **hyper)
    finally:
        torch.set_num_threads(threads)
    (f_params, f_losses), f_sec = timed(funcnet_train, init, x_train, onehot, **hyper)
    with x64:
        (j_params, j_losses), j_sec = timed(jax_train, jax_init, x_train, onehot, **hyper)
        j_params = jax.tree.map(np.asarray, j_params)
    t_params = {name: p.detach().numpy() for name, p in zip(NAMES, model.parameters())}
    with torch.no_grad():
        t_acc = _accuracy(model.forward(torch.from_numpy(x_test)).numpy(), y_test)
    f_acc = _accuracy(two_layer_net(f_params, x_test, np), y_test)
    j_acc = _accuracy(two_layer_net(j_params, x_test, np), y_test)

    why = "same weights and batch; the engines order their sums differently"
    shape_error = (np.ones((3, 4), dtype), np.ones((5, 2), dtype))
    checks = [
        equal("x**2 + 3*x at 2: funcnet.autodiff gives exactly 7.0", f_grads["x_grad"], np.asarray(7.0, dtype)),
        equal("x**2 + 3*x at 2: jax.grad gives exactly 7.0", j_grads["x_grad"], np.asarray(7.0, dtype)),
        equal("x**2 + 3*x at 2: torch x.grad is exactly [7.]", t_grads["x_grad"], np.asarray([7.0], dtype)),
        close("TwoLayerNet loss gradients: funcnet.autodiff == torch.autograd", _flat(f_grads["loss_grads"]),
              _flat(t_grads["loss_grads"]), **tol, why=why),
        close("TwoLayerNet loss gradients: funcnet.autodiff == jax.grad", _flat(f_grads["loss_grads"]),
              _flat(j_grads["loss_grads"]), **tol, why=why + " (perturbed JAX weights change these)"),
        close("d2/dz2 tanh(z)^3 exp(z) at 0.7: funcnet grad(grad) == torch create_graph", f_grads["d2"],
              t_grads["d2"], **tol),
        close("d2/dz2 tanh(z)^3 exp(z) at 0.7: funcnet grad(grad) == jax grad(grad)", f_grads["d2"],
              j_grads["d2"], **tol),
        equal("recorded graph of x**2 + 3*x: funcnet == torch grad_fn walk == jaxpr (as primitive names)",
              (sorted(f_grads["graph"]), sorted(f_grads["graph"])),
              (sorted(TORCH_TO_PRIMITIVE[n] for n in t_grads["graph"]),
               sorted(JAXPR_TO_PRIMITIVE[n] for n in j_grads["graph"]))),
        raises("matmul (3,4) @ (5,2): funcnet.autodiff names the primitive and both shapes",
               lambda: ad.grad(lambda a: np.sum(a @ shape_error[1]))(shape_error[0]), ad.ShapeError,
               "matmul: shapes (3, 4) and (5, 2)"),
        raises("matmul (3,4) @ (5,2): torch", lambda: torch.ones(3, 4) @ torch.ones(5, 2), RuntimeError,
               "(3x4 and 5x2)"),
        raises("matmul (3,4) @ (5,2): jax", lambda: jnp.ones((3, 4)) @ jnp.ones((5, 2)), TypeError,
               "dot_general requires contracting dimensions to have the same shape"),
        raises("an op without a VJP rule is named: funcnet.autodiff on np.sin",
               lambda: ad.grad(np.sin)(1.0), ad.UnsupportedError, "numpy.sin is not supported"),
        expect("training learns (all three)", min(t_acc, f_acc, j_acc) > 0.9
               and max(t_losses[-1], f_losses[-1], j_losses[-1]) < 0.5 * min(t_losses[0], f_losses[0], j_losses[0]),
               f"test accuracy torch {t_acc:.4f}, funcnet {f_acc:.4f}, jax {j_acc:.4f}; loss "
               f"{f_losses[0]:.3f} -> {f_losses[-1]:.3f} (funcnet)"),
        equal("test accuracy after training: funcnet.autodiff == jax.grad", f_acc, j_acc),
        equal("test accuracy after training: torch.autograd == jax.grad", t_acc, j_acc),
        close("trained parameters: funcnet.autodiff == jax.grad", _flat(f_params), _flat(j_params), **train_tol,
              why=f"{len(f_losses)} SGD steps carry the per-step rounding differences"),
        close("trained parameters: torch.autograd == jax.grad", _flat(t_params), _flat(j_params), **train_tol,
              why=f"{len(f_losses)} SGD steps carry the per-step rounding differences"),
        close("training loss curves: funcnet.autodiff == jax.grad", np.array(f_losses), np.array(j_losses),
              **train_tol),
    ]
    steps = f"{EPOCHS} epochs x {len(x_train) // BATCH} batches of {BATCH}, lr {LR}"
    t_out = "\n".join([
        f"x = torch.tensor([2.0], requires_grad=True); (x**2 + 3*x).backward() -> x.grad = {t_grads['x_grad']}",
        f"grad_fn walk: {' -> '.join(t_grads['graph'])}",
        f"d2/dz2 tanh(z)^3 exp(z) at 0.7 (create_graph=True): {float(t_grads['d2']):.10f}",
        f"TwoLayerNet({x_train.shape[1]}, {HIDDEN}, 10), {steps}:",
        f"  loss {t_losses[0]:.4f} -> {t_losses[-1]:.4f}, test accuracy {t_acc:.4f}",
    ])
    j_out = "\n".join([
        f"jax.grad: {j_grads['x_grad']}    funcnet.autodiff.grad: {f_grads['x_grad']}",
        f"jax.make_jaxpr:\n{j_grads['graph_text']}",
        f"funcnet.autodiff.make_graph:\n{f_grads['graph_text']}",
        f"d2/dz2 at 0.7: jax {float(j_grads['d2']):.10f}, funcnet {float(f_grads['d2']):.10f}",
        f"same {steps}:",
        f"  jax.grad:         loss {j_losses[0]:.4f} -> {j_losses[-1]:.4f}, test accuracy {j_acc:.4f}",
        f"  funcnet.autodiff: loss {f_losses[0]:.4f} -> {f_losses[-1]:.4f}, test accuracy {f_acc:.4f}"
        f" ({f_sec:.2f} s)",
    ])
    notes = ("The JAX column runs one NumPy-style function, cross_entropy(params, x, onehot, xp), under "
             "two engines: xp=jax.numpy with jax.grad, and xp=numpy with funcnet.autodiff, whose tracer "
             "joins NumPy's __array_ufunc__/__array_function__ dispatch and replays VJP rules backwards. "
             f"Times: torch {t_sec:.2f} s, jax (with one compile) {j_sec:.2f} s, funcnet.autodiff {f_sec:.2f} s.\n"
             "funcnet.autodiff source:\n" + source(funcnet_gradients, funcnet_train))
    return Result(
        name="autograd_from_scratch", title=TITLE,
        torch=Side(source(TwoLayerNet, grad_fn_names, torch_gradients, torch_train), t_out, t_sec),
        jax=Side(source(two_layer_net, cross_entropy, sgd_train, jax_gradients, jax_train), j_out, j_sec),
        checks=checks, notes=notes,
        series={"training loss per SGD step (digits, TwoLayerNet)":
                {"torch.autograd": t_losses, "jax.grad": j_losses, "funcnet.autodiff": f_losses}},
    )
