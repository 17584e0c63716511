"""BatchNorm's train-mode gradient on the CPU: funcnet against another version of it and torch eager.

    python benchmarks/batchnorm.py [--baseline OLD_NORM.py] [--shapes 64x64x32x32 8x64x112x112]
                                   [--models resnet18 --sizes 224 --batches 8] [--rounds 9] [--quick]

1. The layer: BatchNorm2d (train mode, running statistics) then ReLU, the gradient of
   ``vdot(relu(y), g)`` with respect to the params and the input, against torch's
   ``BatchNorm2d`` and ``relu`` forward and backward.
2. ``--models``: a model of ``benchmarks/conv_models.py`` converted from torch.nn, its
   SGD-momentum train step, against torch eager.

``--baseline FILE``: another ``funcnet/nn/functional/norm.py`` (``git show
COMMIT:funcnet/nn/functional/norm.py > /tmp/old_norm.py``), whose ``batch_norm_train`` the
programs of a second column are traced with: a before/after in one process, timed in the
same rounds. One thread a framework and the CPU time of the process; medians of interleaved
rounds, each round starting with another column. Every column is first checked against
torch (the gradients of the layer; the models' train-step losses).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _traced_with(module):
    """A wrapper that traces (calls) ``fn`` with ``module.batch_norm_train`` in place of funcnet's."""
    import funcnet.nn.functional.norm as norm

    def wrap(fn):
        def run(*args):
            current, norm.batch_norm_train = norm.batch_norm_train, module.batch_norm_train
            try:
                return fn(*args)
            finally:
                norm.batch_norm_train = current
        return run
    return wrap


def _interleaved(runners: dict, rounds: int, calls: int) -> dict:
    import jax

    # JAX dispatches asynchronously: each call's work is done before the clock reads again
    runners = {name: (fn if name == "torch" else (lambda fn=fn: jax.block_until_ready(fn())))
               for name, fn in runners.items()}
    for fn in runners.values():
        fn()  # compile / warm up
    times = {name: [] for name in runners}
    names = list(runners)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.process_time()
            for _ in range(calls):
                runners[name]()
            times[name].append((time.process_time() - start) / calls * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def layer_row(shape, baseline, rounds):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from funcnet import nn

    c = shape[1]
    bn = nn.BatchNorm2d(c)
    state = bn.init_state()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    w, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    params, xj, gj = {"weight": jnp.asarray(w), "bias": jnp.asarray(b)}, jnp.asarray(x), jnp.asarray(g)

    def loss(p, x):
        return jnp.vdot(jax.nn.relu(bn.apply(p, x, state=state, train=True)[0]), gj)

    columns = {"funcnet": jax.jit(jax.grad(loss, argnums=(0, 1)))}
    if baseline is not None:
        columns["baseline"] = jax.jit(jax.grad(_traced_with(baseline)(loss), argnums=(0, 1)))
    tbn = torch.nn.BatchNorm2d(c)
    tbn.weight.data, tbn.bias.data = torch.from_numpy(w), torch.from_numpy(b)
    tx, tg = torch.from_numpy(x).requires_grad_(), torch.from_numpy(g)

    def torch_step():
        tx.grad = None
        tbn.zero_grad(set_to_none=True)
        torch.relu(tbn(tx)).backward(tg)

    torch_step()
    # float32 sums over n*h*w terms of unit scale: rounding ~ sqrt(n*h*w) * 2**-24 relative
    bound = 1e-6 * max(1.0, (x.size / c) ** 0.5)
    ok = True
    for name, f in columns.items():
        (gp, gx) = jax.block_until_ready(f(params, xj))
        for got, want in ((gx, tx.grad), (gp["weight"], tbn.weight.grad), (gp["bias"], tbn.bias.grad)):
            want = want.numpy()
            ok &= float(np.max(np.abs(np.asarray(got) - want))) <= bound * max(1.0, float(np.max(np.abs(want))))
    runners = {name: (lambda f=f: jax.block_until_ready(f(params, xj))) for name, f in columns.items()}
    runners["torch"] = torch_step
    return {"shape": list(shape), "train_ms": _interleaved(runners, rounds, 3), "ok": bool(ok)}


def model_row(name, size, batch, baseline, rounds):
    import jax
    import numpy as np
    import torch

    from conv_models import MODELS, QUICK, _funcnet_runners, _torch_runners
    from funcnet import interop

    torch.manual_seed(0)
    module = MODELS[name][0](**(QUICK[name] if size <= 16 else {}))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    model, params, state = interop.convert(copy.deepcopy(module), torch.from_numpy(x))
    runners = {"funcnet": _funcnet_runners(model, params, state, x, y)[1]}
    if baseline is not None:
        runners["baseline"] = _traced_with(baseline)(_funcnet_runners(model, params, state, x, y)[1])
    runners["torch"] = _torch_runners(copy.deepcopy(module), x, y, compiled=False)[1]
    # the first step's loss (same weights, same batch) agrees: float32 through ~20 layers
    first = {k: float(np.asarray(jax.block_until_ready(f()) if k != "torch" else f().detach()))
             for k, f in runners.items()}
    ok = all(abs(v - first["torch"]) <= 1e-4 * max(1.0, abs(first["torch"])) for v in first.values())
    return {"model": name, "size": size, "batch": batch, "train_ms": _interleaved(runners, rounds, 1), "ok": ok}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help="another funcnet/nn/functional/norm.py")
    parser.add_argument("--shapes", nargs="*", default=["64x64x32x32", "8x64x112x112"])
    parser.add_argument("--models", nargs="*", default=[])
    parser.add_argument("--sizes", nargs="+", type=int, default=[224])
    parser.add_argument("--batches", nargs="+", type=int, default=[8])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny shapes and model, one round")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("baseline_norm", args.baseline)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
    shapes = ["4x3x5x2"] if args.quick else args.shapes
    models, sizes, batches = (["resnet18"], [16], [2]) if args.quick else (args.models, args.sizes, args.batches)
    rounds = 1 if args.quick else args.rounds
    print(f"CPU time, one thread, medians of {rounds} interleaved rounds, load average {os.getloadavg()[0]:.1f}")
    failed = False
    for text in shapes:
        r = layer_row(tuple(int(d) for d in text.split("x")), baseline, rounds)
        failed |= not r["ok"]
        t = r["train_ms"]
        print(f"BatchNorm2d + ReLU gradient {text:<14} ms: " + ", ".join(f"{k} {v:.2f}" for k, v in t.items())
              + f"; funcnet/torch {t['funcnet'] / t['torch']:.2f}" + ("" if r["ok"] else "  WRONG"))
    for name in models:
        for size in sizes:
            for batch in batches:
                r = model_row(name, size, batch, baseline, rounds)
                failed |= not r["ok"]
                t = r["train_ms"]
                print(f"{name} converted {size}px b{batch} train step ms: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in t.items())
                      + f"; torch/funcnet {t['torch'] / t['funcnet']:.2f}" + ("" if r["ok"] else "  WRONG"))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    from funcnet import profile

    profile.one_core()  # one core for JAX as for torch, before JAX starts (a caller's process keeps its own)
    profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
    sys.exit(main())
