"""The five-line training loop: torch.optim.SGD vs funcnet's make_step / run_epoch with optax.

torch: ``optimizer.zero_grad()``, forward, ``F.cross_entropy``, ``loss.backward()``,
``optimizer.step()`` over a list of batches. funcnet: ``make_step(model, optax.sgd(lr))``
is one compiled pure function ``(state, batch) -> (state, metrics)``; ``run_epoch`` scans
it over a whole epoch on device, drawing the shuffle from ``state.key``. Both start from
the same weights (``interop.from_torch``) and see the same batches: the torch loop is fed
the permutation ``run_epoch`` draws, replayed from the state's key the way
``funcnet.train`` does it. The loss curves must agree step by step; gradients that
accumulate in torch's ``.grad`` are plain return values in JAX.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F
from torch import nn as tnn

import funcnet
from funcnet import nn
from funcnet.interop import from_torch
from comparisons._core import Options, Result, Side, close, equal, require_x64, source, timed

__all__ = ["TITLE", "run"]

TITLE = "The five-line training loop: torch.optim.SGD vs funcnet make_step / run_epoch with optax.sgd"

LR, BATCH, EPOCHS, HIDDEN = 0.01, 32, 5, 128  # digits: 1437 // 32 = 44 steps per epoch, 220 in all


# ----------------------------------------------------------------------------- torch
def torch_train(model, batches, lr=LR):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for data, target in batches:
        optimizer.zero_grad()  # 1. .grad accumulates otherwise
        output = model(data)  # 2.
        loss = F.cross_entropy(output, target)  # 3.
        loss.backward()  # 4. fills each parameter's .grad
        optimizer.step()  # 5. p -= lr * p.grad, in place
        losses.append(loss.detach())
    return torch.stack(losses)


def torch_grads_accumulate(model, data, target):
    model.zero_grad()
    F.cross_entropy(model(data), target).backward()
    once = [p.grad.clone() for p in model.parameters()]
    F.cross_entropy(model(data), target).backward()  # no zero_grad(): added to .grad
    return once, [p.grad.clone() for p in model.parameters()]


# ------------------------------------------------------------------------------ funcnet
def funcnet_epochs(step, state, x, y, epochs):
    losses, epoch_keys = [], []
    for _ in range(epochs):
        epoch_keys.append(jax.random.clone(state.key))  # kept only to replay the shuffle for torch
        state, metrics = funcnet.run_epoch(step, state, x, y, batch_size=BATCH)  # one lax.scan
        losses.append(metrics["loss"])
    return state, jnp.concatenate(losses), epoch_keys


@functools.partial(jax.jit, static_argnums=(1, 2))
def run_epoch_batches(epoch_key, n, batch_size=BATCH):
    """The ``(steps, batch_size)`` indices run_epoch draws from a state whose key is
    ``epoch_key``: it splits the key and shuffles with the second half."""
    _, perm_key = jax.random.split(epoch_key)
    return funcnet.data.epoch_indices(perm_key, n, batch_size)


def funcnet_steps(step, state, batches):
    losses = []
    for batch in batches:  # the torch-style Python loop, one compiled step per batch
        state, metrics = step(state, batch)
        losses.append(metrics["loss"])
    return state, jnp.stack(losses)


def jax_grads_twice(model, params, data, target):
    def loss_fn(p):
        return funcnet.losses.cross_entropy(model.apply(p, data), target)

    grad = jax.jit(jax.grad(loss_fn))
    return grad(params), grad(params)  # a function: same in, same out


# ------------------------------------------------------------------------------ checks


def _state(model, params, perturb, seed=0):
    params = jax.tree.map(jnp.array, params)  # own buffers: each state is donated to its steps
    # the one JAX-side weight that perturb shifts: the first output bias feeds every logit
    params["2"]["bias"] = params["2"]["bias"].at[0].add(perturb)
    return funcnet.create_train_state(model, optax.sgd(LR), jax.random.key(seed), params=params)


def run(opts: Options = Options(), *, epochs: int = EPOCHS) -> Result:
    """``epochs`` of the digits training set (44 steps each); fewer keep a float64 test short."""
    require_x64(opts)
    tdtype = getattr(torch, opts.dtype)
    (x_train, y_train), (x_test, y_test) = funcnet.data.load("digits")
    x_train, x_test = x_train.astype(opts.dtype), x_test.astype(opts.dtype)
    n, features = x_train.shape

    torch.manual_seed(0)
    net = tnn.Sequential(tnn.Linear(features, HIDDEN), tnn.ReLU(), tnn.Linear(HIDDEN, 10)).to(tdtype)
    model = nn.MLP([features, HIDDEN, 10])  # the same layers, the same state_dict keys
    params0 = from_torch(net)

    step = funcnet.make_step(model, optax.sgd(LR))
    # a fresh state per call: the steps donate it, and timed() calls once more for the steady state
    (scan_state, scan_losses, epoch_keys), j_sec = timed(
        lambda: funcnet_epochs(step, _state(model, params0, opts.perturb), x_train, y_train, epochs))

    # the batch order, generated once and fed to both the torch loop and the make_step loop
    order = np.concatenate([np.asarray(run_epoch_batches(k, n)) for k in epoch_keys])
    xb, yb = x_train[order], y_train[order]
    torch_batches = [(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))) for x, y in zip(xb, yb)]
    t_losses, t_sec = timed(torch_train, net, torch_batches)
    step_state, step_losses = funcnet_steps(step, _state(model, params0, opts.perturb),
                                            [(jnp.asarray(x), jnp.asarray(y)) for x, y in zip(xb, yb)])

    # gradients: accumulate in torch's .grad, returned fresh by jax.grad
    fresh = tnn.Sequential(tnn.Linear(features, HIDDEN), tnn.ReLU(), tnn.Linear(HIDDEN, 10)).to(tdtype)
    data, target = torch_batches[0]
    t_once, t_twice = torch_grads_accumulate(fresh, data, target)
    fresh_params = from_torch(fresh)
    fresh_params["2"]["bias"] = fresh_params["2"]["bias"].at[0].add(opts.perturb)
    j_once, j_again = jax_grads_twice(model, fresh_params, jnp.asarray(data.numpy()), jnp.asarray(yb[0]))
    names = list(dict(fresh.named_parameters()))

    net.eval()
    with torch.no_grad():
        logits = net(torch.from_numpy(x_test))
        t_eval = {"loss": float(F.cross_entropy(logits, torch.from_numpy(y_test.astype(np.int64)))),
                  "accuracy": float((logits.argmax(-1).numpy() == y_test).mean())}
    j_eval = funcnet.evaluate(model, scan_state.params, x_test, y_test)

    steps = len(order)
    if opts.dtype == "float32":
        # per step the frameworks differ by ~1e-7 relative (summation order in the matmuls);
        # SGD at lr 0.01 feeds that back into the weights, so it grows slowly with the steps:
        # measured 5e-7 after 220 steps. rtol 1e-5 + atol 2e-5 on a loss of order 1 leaves
        # two orders of margin and still fails on a 1e-3 shift of one output bias (1.4e-4 apart).
        curve_tol, why = {"rtol": 1e-5, "atol": 2e-5}, f"float32 over {steps} steps: drift grows with the steps"
    else:
        curve_tol, why = opts.tol, f"float64 over {steps} steps"
    t_final = {k: v.detach() for k, v in net.state_dict().items()}
    j_final = funcnet.state_dict(scan_state.params)
    checks = [
        close("training loss per step: funcnet run_epoch == torch loop", scan_losses, t_losses, **curve_tol, why=why),
        *[close(f"final {k}: funcnet == torch", j_final[k], t_final[k], **curve_tol, why=why) for k in t_final],
        close("run_epoch (one lax.scan) == make_step per batch: losses", scan_losses, step_losses, **opts.tol,
              why="same step function, same batches; compiled in two contexts"),
        *[close(f"run_epoch == make_step per batch: final {k}", v, funcnet.state_dict(step_state.params)[k],
                **opts.tol) for k, v in j_final.items()],
        *[close(f"torch: two backward() without zero_grad() give 2x the gradient of {k}", b, 2 * a, **opts.tol)
          for k, a, b in zip(names, t_once, t_twice)],
        *[equal(f"JAX: jax.grad twice gives the same gradient of {k}", funcnet.state_dict(j_again)[k],
                funcnet.state_dict(j_once)[k], why="nothing accumulates, nothing to zero") for k in names],
        *[close(f"jax.grad == torch backward (one call) for {k}", funcnet.state_dict(j_once)[k], a, **opts.tol)
          for k, a in zip(names, t_once)],
        close("test loss after training: funcnet.evaluate == torch eval", j_eval["loss"], t_eval["loss"],
              **curve_tol),
        close("test accuracy: funcnet == torch (one example may sit on an argmax tie)", j_eval["accuracy"],
              t_eval["accuracy"], rtol=0.0, atol=1.0 / len(y_test) + 1e-12),
    ]
    t_np, j_np = t_losses.numpy(), np.asarray(scan_losses)
    shown = [0, 1, steps // 2, steps - 1]
    t_out = "\n".join([
        f"torch.optim.SGD(lr={LR}), F.cross_entropy, {steps} steps of {BATCH} on digits:",
        *[f"  step {s:3d}: loss {t_np[s]:.6f}" for s in shown],
        f"two backward() without zero_grad(): .grad doubles (max |g2 - 2 g1| "
        f"{max(float((b - 2 * a).abs().max()) for a, b in zip(t_once, t_twice)):.1e})",
        f"test: loss {t_eval['loss']:.4f}, accuracy {t_eval['accuracy']:.4f}",
    ])
    j_out = "\n".join([
        f"make_step(model, optax.sgd({LR})) + run_epoch, {steps} steps of {BATCH}:",
        *[f"  step {s:3d}: loss {j_np[s]:.6f}" for s in shown],
        f"max |funcnet - torch| over the curve: {np.abs(j_np - t_np).max():.1e}; "
        f"run_epoch vs make_step loop: {np.abs(j_np - np.asarray(step_losses)).max():.1e}",
        "jax.grad twice: the same gradient (no .grad to zero)",
        f"test: loss {j_eval['loss']:.4f}, accuracy {j_eval['accuracy']:.4f}",
    ])
    notes = ("torch's loop mutates: zero_grad() clears .grad, backward() adds into it, step() updates the "
             "parameters in place. funcnet's step is a pure function of (state, batch): the gradient is a "
             "value inside it, the optimizer state travels in TrainState, and the old state's buffers are "
             "donated to the new one. run_epoch compiles a whole epoch as one lax.scan and gives the same "
             "numbers as calling the step once per batch from Python.")
    return Result(
        name="training_loop", title=TITLE,
        torch=Side(source(torch_train, torch_grads_accumulate), t_out, t_sec),
        jax=Side(source(funcnet_epochs, run_epoch_batches, funcnet_steps, jax_grads_twice), j_out, j_sec),
        checks=checks, notes=notes,
        series={"training loss per step": {"torch": t_np.tolist(), "funcnet": j_np.tolist()}},
    )
