"""Shared by the port examples: run a torch model and its funcnet twin from the same weights
on the same batches, step by step, and report the largest differences."""

from __future__ import annotations

import ast
import inspect
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch

import funcnet
from funcnet import nn, train
from funcnet.precision import cast_floating


def source_lines(obj) -> int:
    """Lines of code in ``obj``'s source: no blank lines, comments or docstrings."""
    source = textwrap.dedent(inspect.getsource(obj))
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node) is not None:
            doc = node.body[0]
            docstrings.update(range(doc.lineno, doc.end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if i not in docstrings and line.strip() and not line.strip().startswith("#"))


def compare(ours: nn.Module, theirs: torch.nn.Module, x: np.ndarray, y: np.ndarray, *, steps: int = 3,
            batch: int = 32, lr: float = 0.05, momentum: float = 0.9, dtype: str = "float32") -> dict:
    """Forward (train mode), gradients and ``steps`` SGD-momentum steps of both, then eval logits.
    Returns ``{"forward", "grads", "params", "buffers", "eval"}`` maximum absolute differences."""
    tdt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    theirs = theirs.to(tdt).train()
    # the templates in the compared dtype, as torch's .to(dtype) casts parameters and float buffers; the
    # params' template is shapes only (torch's values replace it), so no initializer runs
    template = jax.eval_shape(lambda key: cast_floating(ours.init(key), dtype), jax.random.key(0))
    params, state = funcnet.load_state_dict(template, theirs.state_dict(),
                                            state=cast_floating(ours.init_state(), dtype))
    xs, ys = x[: batch * steps].astype(dtype), y[: batch * steps]
    diffs = {}

    # one forward + backward, train mode
    tx_, ty_ = torch.from_numpy(xs[:batch]), torch.from_numpy(ys[:batch]).long()
    probe = {k: v.clone() for k, v in theirs.state_dict().items()}
    loss_t = torch.nn.functional.cross_entropy(theirs(tx_), ty_)
    loss_t.backward()

    def loss_fn(p):
        out, new = nn.call(ours, p, state, jnp.asarray(xs[:batch]), train=True)
        return funcnet.losses.cross_entropy(out, jnp.asarray(ys[:batch])), (out, new)

    (loss_j, (out_j, _)), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)  # one compile
    diffs["forward"] = abs(float(loss_j) - loss_t.item())
    g = funcnet.state_dict(grads)
    diffs["grads"] = max(float(np.max(np.abs(np.asarray(g[k]) - p.grad.numpy())))
                         for k, p in theirs.named_parameters())
    theirs.load_state_dict(probe)  # undo the probe forward's buffer update
    theirs.zero_grad()

    # steps of SGD with momentum, torch's loop against make_step
    opt = torch.optim.SGD(theirs.parameters(), lr=lr, momentum=momentum)
    tx = optax.sgd(lr, momentum=momentum)
    step = train.make_step(ours, tx)
    ts = train.create_train_state(ours, tx, jax.random.key(1), params=params, model_state=state)
    for i in range(steps):
        xb, yb = xs[i * batch:(i + 1) * batch], ys[i * batch:(i + 1) * batch]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(theirs(torch.from_numpy(xb)), torch.from_numpy(yb).long()).backward()
        opt.step()
        ts, _ = step(ts, (jnp.asarray(xb), jnp.asarray(yb)))
    sd_t = theirs.state_dict()
    sd_j = funcnet.state_dict(ts.params, ts.model_state)
    buffers = {k for k, _ in theirs.named_buffers()}
    diffs["params"] = max(float(np.max(np.abs(np.asarray(sd_j[k]) - sd_t[k].numpy())))
                          for k in sd_t if k not in buffers)
    diffs["buffers"] = max(float(np.max(np.abs(np.asarray(sd_j[k]).astype(np.float64) - sd_t[k].double().numpy())))
                           for k in buffers)
    theirs.eval()
    with torch.no_grad():
        eval_t = theirs(torch.from_numpy(xs[:batch])).numpy()
    eval_j, _ = jax.jit(lambda p, s, x: nn.call(ours, p, s, x, train=False))(ts.params, ts.model_state,
                                                                            jnp.asarray(xs[:batch]))
    diffs["eval"] = float(np.max(np.abs(np.asarray(eval_j) - eval_t)))
    return diffs


def main(argv, *, description: str, name: str, torch_model, funcnet_model, torch_sources, funcnet_sources,
         epochs: int, min_accuracy: float = 0.9) -> int:
    """A port example's command line: compare ``funcnet_model()`` with ``torch_model()`` from the
    same weights (``--steps`` SGD-momentum steps, ``--float64``), print both models' lines of code
    (of ``torch_sources`` and ``funcnet_sources``), then train the funcnet model on digits for
    ``--epochs``. Exit 1 on a mismatch or a test accuracy of ``min_accuracy`` or less (``--quick``: one epoch, two
    compared steps, a bar of 0.5, five times chance), naming the bar missed."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps compared against torch")
    parser.add_argument("--float64", action="store_true", help="compare in float64 (JAX x64 on)")
    parser.add_argument("--quick", action="store_true", help="1 epoch, 2 compared steps: the CI setting")
    args = parser.parse_args(argv)
    bar = min_accuracy
    if args.quick:
        args.epochs, args.steps, bar = 1, 2, 0.5
    if args.float64:
        jax.config.update("jax_enable_x64", True)

    (x_tr, y_tr), (x_te, y_te) = funcnet.data.load("digits")
    torch.manual_seed(0)
    theirs, ours = torch_model(), funcnet_model()
    dtype = "float64" if args.float64 else "float32"
    diffs = compare(ours, theirs, x_tr, y_tr, steps=args.steps, dtype=dtype)
    print(f"lines of code: torch {sum(map(source_lines, torch_sources))}, "
          f"funcnet {sum(map(source_lines, funcnet_sources))}")
    print(f"max |funcnet - torch| ({dtype}, {args.steps} SGD-momentum steps): "
          + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    tol = 1e-10 if args.float64 else 1e-4
    if max(diffs.values()) > tol:
        worst = max(diffs, key=diffs.get)
        print(f"MISMATCH: {worst} differs from torch by {diffs[worst]:.2e}, above the tolerance {tol:g}",
              file=sys.stderr)
        return 1
    _, history = funcnet.fit(ours, optax.sgd(0.05, momentum=0.9), (x_tr, y_tr), (x_te, y_te),
                             epochs=args.epochs, batch_size=32, key=jax.random.key(0), progress=False)
    final = history[-1]
    print(f"funcnet {name} on digits, {args.epochs} epochs: train loss {final['train_loss']:.4f}, "
          f"test accuracy {final['test_accuracy']:.4f} (per epoch: "
          + ", ".join(f"{r['test_accuracy']:.3f}" for r in history) + ")")
    if final["test_accuracy"] <= bar:
        print(f"FAILED: test accuracy {final['test_accuracy']:.4f} after {args.epochs} epochs is not above the bar "
              f"{bar}", file=sys.stderr)
        return 1
    return 0
