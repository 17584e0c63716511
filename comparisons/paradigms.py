"""The articles' PyTorch-vs-JAX table, each row backed by something that runs here.

| row | PyTorch | JAX |
|---|---|---|
| paradigm | objects mutated in place | pure functions, new values returned |
| compilation | eager, op by op | traced once, compiled by XLA |
| flexibility | any Python control flow on values | control flow on traced values needs lax.cond / static args |
| performance | per-op dispatch | one fused program per step |
| ecosystem | torch.nn / torch.optim / torch.distributed | flax / optax / orbax / jax.sharding |

plus the layered stack of each framework on this machine (``funcnet info``).
"""

from __future__ import annotations

import importlib.metadata as md

import numpy as np

from comparisons._core import Options, Result, Side, close, equal, expect, raises, source, timed

TITLE = "The paradigm table: in-place objects vs pure functions, eager vs compiled, measured"


def torch_rows(x, y, w0, b0, lr):
    import torch

    model = torch.nn.Linear(w0.shape[1], w0.shape[0])
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w0))
        model.bias.copy_(torch.from_numpy(b0))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    weight_before = model.weight                      # paradigm: the same object...
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    opt.step()                                        # ...is changed in place
    mutated = model.weight is weight_before and not np.allclose(model.weight.detach().numpy(), w0)

    def branchy(v):                                   # flexibility: Python if on a value
        return v * 2 if v.sum() > 0 else -v
    return {"loss": loss.item(), "weight": model.weight.detach().numpy().copy(), "mutated": mutated,
            "branch": branchy(torch.from_numpy(x[0])).numpy()}


def jax_rows(x, y, w0, b0, lr):
    import jax
    import jax.numpy as jnp

    from funcnet import losses

    params = {"weight": jnp.asarray(w0), "bias": jnp.asarray(b0)}
    traces = []

    @jax.jit
    def step(params, x, y):
        traces.append(1)                              # runs only while tracing
        def loss_fn(p):
            return losses.cross_entropy(x @ p["weight"].T + p["bias"], y)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

    new_params, loss = step(params, x, y)             # paradigm: a new value is returned
    for _ in range(9):                                # compilation: traced once for 10 calls
        step(params, x, y)
    unchanged = bool(jnp.array_equal(params["weight"], w0))

    def branchy(v):                                   # flexibility: lax.cond under jit
        return jax.lax.cond(v.sum() > 0, lambda v: v * 2, lambda v: -v, v)
    return {"loss": float(loss), "weight": np.asarray(new_params["weight"]), "unchanged": unchanged,
            "traces": len(traces), "branch": np.asarray(jax.jit(branchy)(jnp.asarray(x[0])))}


def _jit_python_if(x0):
    import jax

    @jax.jit
    def branchy(v):
        return v * 2 if v.sum() > 0 else -v
    return branchy(x0)


def _step_times(x, y, w0, b0, lr):
    """Median step time of a 64-256-10 MLP train step: torch eager vs jax.jit."""
    import jax
    import optax
    import torch

    from funcnet import nn, train
    from funcnet.interop import from_torch

    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    params = from_torch(tmodel)
    opt = torch.optim.SGD(tmodel.parameters(), lr=lr)
    tx_, ty_ = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(tx_), ty_)
        loss.backward()
        opt.step()
        return loss

    model = nn.MLP([64, 256, 10])
    tx = optax.sgd(lr)
    step = train.make_step(model, tx)
    state = train.create_train_state(model, tx, jax.random.key(0), params=params)
    batch = (jax.numpy.asarray(x), jax.numpy.asarray(y))
    holder = [state]

    def jax_step():
        holder[0], metrics = step(holder[0], batch)
        return metrics

    jax_step()  # compile
    torch_step()
    _, t_torch = timed(torch_step, repeat=50)
    _, t_jax = timed(jax_step, repeat=50)
    return t_torch, t_jax


def _ecosystem():
    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"
    torch_side = {p: version(p) for p in ("torch", "torchvision")}
    jax_side = {p: version(p) for p in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")}
    return torch_side, jax_side


def run(opts: Options = Options()) -> Result:
    from funcnet import data, info

    (x_all, y_all), _ = data.load("digits")
    x, y = x_all[:128], y_all[:128].astype(np.int64)
    rng = np.random.default_rng(0)
    w0 = rng.uniform(-0.1, 0.1, (10, 64)).astype(np.float32)
    b0 = np.zeros(10, np.float32)
    lr = 0.1

    t_out, t_seconds = timed(torch_rows, x, y, w0, b0, lr)
    w0_jax = w0.copy()
    w0_jax[0, 0] += opts.perturb
    j_out, j_seconds = timed(jax_rows, x, y.astype(np.int32), w0_jax, b0, lr)
    t_torch, t_jax = _step_times(x, y, w0, b0, lr)
    torch_eco, jax_eco = _ecosystem()
    stacks = info.stacks()
    import jax

    checks = [
        expect("paradigm: torch mutates the same Parameter object in place", t_out["mutated"],
               "optimizer.step() changed model.weight without replacing it"),
        expect("paradigm: JAX leaves the old params untouched", j_out["unchanged"],
               "the step returned new params; the input array still holds the initial weights"),
        close("one SGD step: same loss", j_out["loss"], t_out["loss"], **opts.tol,
              why="same weights and batch; float32 per-op agreement"),
        close("one SGD step: same new weights", j_out["weight"], t_out["weight"], **opts.tol),
        equal("compilation: jitted step traced once for 10 calls", j_out["traces"], 1),
        raises("flexibility: Python `if` on a traced value fails under jit",
               lambda: _jit_python_if(jax.numpy.asarray(x[0])), jax.errors.TracerBoolConversionError),
        close("flexibility: lax.cond gives torch's Python-if result", j_out["branch"], t_out["branch"], **opts.tol),
        expect("ecosystem: every listed JAX package is installed",
               all(v != "not installed" for v in jax_eco.values()), str(jax_eco)),
    ]
    table = (
        "row          PyTorch                          JAX\n"
        f"paradigm     param mutated in place: {t_out['mutated']!s:5}   old params unchanged: {j_out['unchanged']}\n"
        f"compilation  eager, op by op                  {j_out['traces']} trace for 10 calls\n"
        f"flexibility  Python if on values              lax.cond (Python if raises under jit)\n"
        f"performance  {t_torch * 1e3:.3f} ms/step (eager)        {t_jax * 1e3:.3f} ms/step (jit), "
        f"{t_torch / t_jax:.2f}x\n"
        f"ecosystem    {torch_eco}   {jax_eco}"
    )
    stack_lines = "\n".join(f"{layer:12s} torch: {stacks['torch'].get(layer, '')}\n{'':12s} jax:   "
                            f"{stacks['jax'].get(layer, '')}" for layer in stacks["jax"] if layer != "XLA_FLAGS")
    return Result(
        name="paradigms", title=TITLE,
        torch=Side(source(torch_rows), f"loss {t_out['loss']:.6f}; step {t_torch * 1e3:.3f} ms (median of 50)",
                   t_seconds),
        jax=Side(source(jax_rows), f"loss {j_out['loss']:.6f}; step {t_jax * 1e3:.3f} ms (median of 50)",
                 j_seconds),
        checks=checks,
        notes=table + "\n\nlayered stacks on this machine (funcnet info):\n" + stack_lines
        + "\n(step times are one noisy run on a shared machine: the ratio is the figure, not a promise)",
    )
