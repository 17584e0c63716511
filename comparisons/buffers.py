"""nn.Module's state beyond parameters: BatchNorm's buffers, mutated in torch, returned in funcnet.

The articles list "manage state" among nn.Module's jobs: ``.train()`` / ``.eval()`` and a
``state_dict()`` that holds parameters *and* buffers. A BatchNorm layer in train mode
normalizes with the batch's statistics and, as a side effect of ``forward``, updates its
``running_mean`` / ``running_var`` (with the unbiased batch variance) and
``num_batches_tracked`` in place; in eval mode it reads them. funcnet has no side
effects: the state goes in and the new state comes out (``y, state = apply(params, x,
state=state, train=True)``); gradients and the optimizer see the params only.
"""

from __future__ import annotations

import numpy as np

from comparisons._core import Options, Result, Side, close, equal, expect, raises, source, timed

__all__ = ["TITLE", "run"]

TITLE = "Buffers: BatchNorm's running statistics, mutated in place (torch) vs state in, state out (JAX)"

STEPS, BATCH, LR = 5, 16, 0.1


def torch_buffers(model, xs, ys):
    import torch
    import torch.nn.functional as F

    bn = model[1]
    held = bn.running_mean  # a reference to the buffer, taken before any forward
    before = held.clone()
    model.train()
    out = model(xs[0])  # forward updates bn.running_mean in place
    after_one = held.clone()
    print(f"the reference held before forward changed: {not torch.equal(held, before)}")
    print(f"buffers: {[n for n, _ in model.named_buffers()]} (requires_grad: {held.requires_grad})")
    F.cross_entropy(out, ys[0]).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=0.1)
    for x, y in zip(xs, ys):  # the training loop: every forward also advances the buffers
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        frozen = {k: v.clone() for k, v in model.state_dict().items()}
        out_eval = model(xs[0])  # eval: reads the running statistics, changes nothing
    unchanged = all(torch.equal(v, model.state_dict()[k]) for k, v in frozen.items())
    print(f"eval forward left the state_dict unchanged: {unchanged}")
    return {"out": out, "before": before, "after_one": after_one, "held": held, "grads": grads, "sd": model.state_dict(),
            "out_eval": out_eval, "eval_unchanged": unchanged}


def jax_buffers(model, params, state, xs, ys):
    import jax
    import optax

    import funcnet
    from funcnet import train

    apply = jax.jit(model.apply, static_argnames="train")  # one compiled program, not one per op
    out, state_1 = apply(params, xs[0], state=state, train=True)  # state in, new state out
    print(f"the state passed in is unchanged: {bool((state['1']['running_mean'] == 0).all())}")
    loss = lambda p: funcnet.losses.cross_entropy(model.apply(p, xs[0], state=state, train=True)[0], ys[0])  # noqa: E731
    grads = jax.jit(jax.grad(loss))(params)  # params only: buffers are not an argument of the gradient
    tx = optax.chain(optax.add_decayed_weights(0.1), optax.sgd(LR, momentum=0.9))  # torch SGD's weight_decay
    step = train.make_step(model, tx)
    # copies: the step donates (consumes) the state it is given
    ts = train.create_train_state(model, tx, jax.random.key(0), params=jax.tree.map(jax.numpy.copy, params),
                                  model_state=jax.tree.map(jax.numpy.copy, state_1))  # continue as torch does
    for x, y in zip(xs, ys):  # TrainState.model_state carries the buffers from step to step
        ts, _ = step(ts, (x, y))
    out_eval, state_eval = apply(ts.params, xs[0], state=ts.model_state, train=False)
    print(f"state leaves: {len(jax.tree.leaves(ts.model_state))}, optimizer sees "
          f"{len(jax.tree.leaves(ts.params))} param arrays")
    return {"out": out, "state_1": state_1, "grads": funcnet.state_dict(grads), "ts": ts, "out_eval": out_eval,
            "state_eval": state_eval, "sd": funcnet.state_dict(ts.params, ts.model_state, model=model)}


def _flat(arrays) -> np.ndarray:
    """One float64 vector of many arrays (jax or torch), in order."""
    out = []
    for a in arrays:
        a = a.detach().double().numpy() if hasattr(a, "detach") else np.asarray(a, np.float64)
        out.append(np.ravel(a))
    return np.concatenate(out)


def run(opts: Options = Options()) -> Result:
    import jax
    import torch

    import funcnet
    from comparisons._core import dtypes
    from funcnet import nn
    from funcnet.precision import cast_floating

    tdt, jdt = dtypes(opts)
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                 torch.nn.Linear(16, 3)).to(tdt)
    ours = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    rng = np.random.default_rng(0)
    xs = (rng.standard_normal((STEPS, BATCH, 8)) * np.linspace(0.5, 3, 8) + 1).astype(opts.dtype)
    ys = rng.integers(0, 3, (STEPS, BATCH))
    params, state = funcnet.load_state_dict(cast_floating(ours.init(jax.random.key(0)), jdt), theirs.state_dict(),
                                            state=cast_floating(ours.init_state(), jdt))
    params["0"]["bias"] = params["0"]["bias"].at[0].add(opts.perturb)
    t, t_seconds = timed(torch_buffers, theirs, torch.from_numpy(xs), torch.from_numpy(ys), steady=False)
    j, j_seconds = timed(jax_buffers, ours, params, state, jax.numpy.asarray(xs), jax.numpy.asarray(ys, "int32"),
                         steady=False)
    tol = dict(opts.tol)
    one = funcnet.state_dict({}, j["state_1"])
    checks = [
        close("train-mode output (batch statistics)", j["out"], t["out"].detach(), **tol),
        close("running_mean after one forward: funcnet's returned state == torch's mutated buffer",
              one["1.running_mean"], t["after_one"], **tol, why="momentum 0.1 update from the batch mean"),
        expect("torch: the running_mean tensor held before forward was mutated in place",
               not torch.equal(t["held"], t["before"]), "forward wrote into the buffer object"),
        equal("funcnet: the state passed in is untouched (running_mean still zeros)",
              np.asarray(state["1"]["running_mean"]), np.zeros(16, opts.dtype)),
        close("gradients of the parameters (buffers have none in either)",
              _flat(j["grads"][k] for k in t["grads"]), _flat(t["grads"].values()), **tol),
        equal("the gradient tree has no buffer entries", sorted(j["grads"]), sorted(t["grads"])),
        equal("state_dict keys: parameters and buffers, torch's order", list(j["sd"]), list(t["sd"])),
        close(f"after {STEPS} SGD-momentum steps with weight decay: params and buffers",
              _flat(j["sd"][k] for k in t["sd"]), _flat(t["sd"].values()),
              rtol=tol["rtol"] * 10, atol=tol["atol"] * 10,
              why="5 steps compound the per-op rounding; no weight decay reaches running_var in either"),
        equal("num_batches_tracked counts the forwards in train mode",
              int(j["sd"]["1.num_batches_tracked"]), int(t["sd"]["1.num_batches_tracked"])),
        close("eval-mode output uses the running statistics", j["out_eval"], t["out_eval"], **tol),
        expect("eval mode changes no state (torch: buffers unchanged; funcnet: same state returned)",
               t["eval_unchanged"] and all(bool((a == b).all()) for a, b in zip(
                   jax.tree.leaves(j["state_eval"]), jax.tree.leaves(j["ts"].model_state))), "both unchanged"),
        raises("funcnet: a BatchNorm model applied without its state says how to get one",
               lambda: ours.apply(params, xs[0]), ValueError, "init_state"),
    ]
    notes = ("torch's SGD weight_decay decays parameters only, because buffers are not parameters; "
             "funcnet's optimizer never sees the state at all, so no decay, gradient or update can reach "
             "running_var or the integer counter.")
    def shown(x) -> str:
        return np.array2string(np.asarray(x, np.float64)[:4], precision=4, suppress_small=True)[:-1] + " ...]"

    t_out = (f"running_mean after one forward (buffer mutated in place): {shown(t['after_one'])}\n"
             f"after {STEPS} SGD-momentum steps: num_batches_tracked {int(t['sd']['1.num_batches_tracked'])}, "
             f"running_var {shown(t['sd']['1.running_var'])}\n"
             f"eval-mode output, first row: {shown(t['out_eval'][0])}")
    j_out = (f"running_mean after one forward (returned state): {shown(one['1.running_mean'])}\n"
             f"after {STEPS} SGD-momentum steps: num_batches_tracked {int(j['sd']['1.num_batches_tracked'])}, "
             f"running_var {shown(j['sd']['1.running_var'])}\n"
             f"eval-mode output, first row: {shown(j['out_eval'][0])}")
    return Result(name="buffers", title=TITLE,
                  torch=Side(source(torch_buffers), t_out, t_seconds),
                  jax=Side(source(jax_buffers), j_out, j_seconds), checks=checks, notes=notes)
