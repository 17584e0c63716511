"""What interop.convert costs and what the converted model runs at, beside torch eager.

For every model of the converter's zoo (tests/convert_zoo.py), and with ``--transformers`` the
tiny transformers models of tests/test_convert_transformers.py, on the same inputs:

- ``convert_s``: seconds for ``interop.convert`` (two recordings and the build);
- ``fwd_ms``: the eval forward, torch eager (no_grad) and the converted model under ``jax.jit``;
- ``step_ms``: one SGD train step (forward, the mean square of the outputs, backward, update),
  torch eager and the converted model's jitted ``value_and_grad`` + optax update;

the median over ``--reps`` runs after a warm-up (compiles excluded), and the ratios funcnet /
torch (below 1: funcnet faster). Figures depend on the machine and its load: compare ratios
from one run.

    python benchmarks/convert_zoo.py [--models gpt vit ...] [--transformers] [--reps 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from convert_check import loss_of, to_jax  # noqa: E402
from convert_zoo import ZOO  # noqa: E402

from funcnet import interop, nn  # noqa: E402


def _median_ms(fn, reps: int) -> float:
    fn()  # warm-up: compiles, caches
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _block(tree):
    return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, tree)


def measure(module, args, kwargs, reps: int) -> dict:
    start = time.perf_counter()
    model, params, state = interop.convert(module, *args, **kwargs)
    convert_s = time.perf_counter() - start
    jargs, jkwargs = to_jax(args), to_jax(kwargs)

    module.eval()
    fwd = jax.jit(lambda p, s: nn.call(model, p, s, *jargs, key=jax.random.key(0), **jkwargs)[0])

    def torch_fwd():
        with torch.no_grad():
            module(*args, **kwargs)

    row = {"convert_s": round(convert_s, 3), "torch_fwd_ms": _median_ms(torch_fwd, reps),
           "funcnet_fwd_ms": _median_ms(lambda: _block(fwd(params, state)), reps)}

    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)

    def torch_step():
        opt.zero_grad()
        loss_of(module(*args, **kwargs), torch).backward()
        opt.step()

    tx = optax.sgd(1e-3)

    @jax.jit
    def step(params, state, opt_state):
        def f(p):
            y, s = nn.call(model, p, state, *jargs, train=True, key=jax.random.key(0), **jkwargs)
            return loss_of(y, jnp), s

        (loss, new_state), grads = jax.value_and_grad(f, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state, opt_state, loss

    opt_state = tx.init(params)
    row["torch_step_ms"] = _median_ms(torch_step, reps)
    row["funcnet_step_ms"] = _median_ms(lambda: _block(step(params, state, opt_state)), reps)
    row["fwd_ratio"] = row["funcnet_fwd_ms"] / row["torch_fwd_ms"]
    row["step_ratio"] = row["funcnet_step_ms"] / row["torch_step_ms"]
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def _transformers_models() -> dict:
    import test_convert_transformers as t

    def build(name):
        def make():
            torch.manual_seed(0)
            module, trace, _ = t.BUILDERS[name]()
            if name in ("bert", "vit", "t5", "clip", "whisper"):
                for m in module.modules():  # the oracle's train step compares without dropout's draws
                    if isinstance(m, torch.nn.Dropout):
                        m.p = 0.0
            return module, (), trace
        return make

    return {f"hf_{n}": build(n) for n in ("bert", "gpt2", "llama", "vit")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="zoo names (default: all)")
    parser.add_argument("--transformers", action="store_true", help="also the tiny transformers models")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", help="write the rows here as JSON")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    builders = {n: ZOO[n] for n in (opts.models or ZOO)}
    if opts.transformers:
        builders.update(_transformers_models())
    rows = {}
    print(f"{'model':<22}{'convert s':>10}{'fwd torch':>11}{'fwd ours':>10}{'ratio':>7}{'step torch':>12}"
          f"{'step ours':>11}{'ratio':>7}   (ms, median of {opts.reps})")
    for name, build in builders.items():
        module, args, kwargs = build()
        r = rows[name] = measure(module, args, kwargs, opts.reps)
        print(f"{name:<22}{r['convert_s']:>10.2f}{r['torch_fwd_ms']:>11.3f}{r['funcnet_fwd_ms']:>10.3f}"
              f"{r['fwd_ratio']:>7.2f}{r['torch_step_ms']:>12.3f}{r['funcnet_step_ms']:>11.3f}{r['step_ratio']:>7.2f}",
              flush=True)
    fwd = statistics.median(r["fwd_ratio"] for r in rows.values())
    step = statistics.median(r["step_ratio"] for r in rows.values())
    load = os.getloadavg()[0]
    print(f"median ratio funcnet / torch eager: forward {fwd:.2f}, train step {step:.2f} (load {load:.1f})")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"rows": rows, "median_fwd_ratio": fwd, "median_step_ratio": step}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
