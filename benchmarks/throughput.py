"""Training throughput of one MLP, six ways, on the same data and the same initial weights.

MLP 784-128-10, plain SGD (lr 0.05), cross-entropy, one synthetic data set; each
batch size runs every implementation for the same epochs over the same batches
(run_epoch draws its own shuffle on device), interleaved so that load on the
machine hits all of them alike. The first epoch (compilation) is not timed.

- torch eager: the five-line loop; torch.compile: the same step compiled (an error
  is reported in the table, not hidden);
- flax nnx: ``nnx.jit`` train step; raw JAX: a hand-written jitted, donated step;
- funcnet make_step: a Python loop of the compiled step; funcnet run_epoch: the
  whole epoch in one ``lax.scan``.

FLOPs per step come from XLA's cost analysis of the raw JAX step; the share of peak
compares with a measured float32 matmul (``funcnet.profile.matmul_peak``).

    python benchmarks/throughput.py [--batch-sizes 32 128 512] [--examples 8192] [--repeat 5] [--json PATH]
    [--single-thread]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from rich.console import Console
from rich.table import Table

from funcnet import data, nn, profile, train
from funcnet.interop import from_torch

SIZES, LR = (784, 128, 10), 0.05
IMPLS = ("torch eager", "torch.compile", "flax nnx", "raw JAX", "funcnet make_step", "funcnet run_epoch")


def torch_impl(init, xb, yb, *, compiled):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xs, ys = torch.from_numpy(xb), torch.from_numpy(yb.astype(np.int64))

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step = torch.compile(step) if compiled else step

    def epoch():
        for i in range(len(xs)):
            step(xs[i], ys[i])

    return epoch, lambda: {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def flax_impl(init, xb, yb):
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.fc1, self.fc2 = nnx.Linear(784, 128, rngs=rngs), nnx.Linear(128, 10, rngs=rngs)

        def __call__(self, x):
            return self.fc2(jax.nn.relu(self.fc1(x)))

    model = MLP(nnx.Rngs(0))
    for name, layer in (("0", model.fc1), ("2", model.fc2)):  # flax kernels are (in, out)
        layer.kernel[...] = jnp.asarray(init[f"{name}.weight"].numpy().T)
        layer.bias[...] = jnp.asarray(init[f"{name}.bias"].numpy())
    optimizer = nnx.Optimizer(model, optax.sgd(LR), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    xs, ys = [jnp.asarray(b) for b in xb], [jnp.asarray(b) for b in yb]

    def epoch():
        for x, y in zip(xs, ys):
            loss = train_step(model, optimizer, x, y)
        loss.block_until_ready()

    def params():
        return {"0.weight": np.asarray(model.fc1.kernel[...]).T, "0.bias": np.asarray(model.fc1.bias[...]),
                "2.weight": np.asarray(model.fc2.kernel[...]).T, "2.bias": np.asarray(model.fc2.bias[...])}

    return epoch, params


def raw_loss(p, x, y):
    h = jax.nn.relu(x @ p["0"]["weight"].T + p["0"]["bias"])
    logits = h @ p["2"]["weight"].T + p["2"]["bias"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@functools.partial(jax.jit, donate_argnums=0)
def raw_step(params, x, y):
    loss, grads = jax.value_and_grad(raw_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss


def raw_impl(init, xb, yb):
    holder = [from_torch(init)]
    xs, ys = [jnp.asarray(b) for b in xb], [jnp.asarray(b) for b in yb]

    def epoch():
        params = holder[0]
        for x, y in zip(xs, ys):
            params, loss = raw_step(params, x, y)
        holder[0] = jax.block_until_ready(params)

    return epoch, lambda: _torch_names(holder[0])


def funcnet_impl(init, xb, yb, *, scan):
    model, tx = nn.MLP(list(SIZES)), optax.sgd(LR)
    step = train.make_step(model, tx)
    holder = [train.create_train_state(model, tx, jax.random.key(0), params=from_torch(init))]
    xs, ys = [jnp.asarray(b) for b in xb], [jnp.asarray(b) for b in yb]
    x_all, y_all = jnp.asarray(xb.reshape(-1, xb.shape[-1])), jnp.asarray(yb.reshape(-1))

    def epoch():
        state = holder[0]
        if scan:
            state, metrics = train.run_epoch(step, state, x_all, y_all, batch_size=xb.shape[1])
        else:
            for x, y in zip(xs, ys):
                state, metrics = step(state, (x, y))
        holder[0] = jax.block_until_ready(state)

    return epoch, lambda: _torch_names(holder[0].params)


def _torch_names(params):
    return {f"{layer}.{name}": np.asarray(v) for layer, d in params.items() for name, v in d.items()}


def build(name, init, xb, yb):
    if name.startswith("torch"):
        return torch_impl(init, xb, yb, compiled=name == "torch.compile")
    if name == "flax nnx":
        return flax_impl(init, xb, yb)
    if name == "raw JAX":
        return raw_impl(init, xb, yb)
    return funcnet_impl(init, xb, yb, scan=name == "funcnet run_epoch")


def bench_batch(batch, x, y, init, repeat, impls):
    steps = len(x) // batch
    xb = x[: steps * batch].reshape(steps, batch, -1)
    yb = y[: steps * batch].reshape(steps, batch)
    runners, errors, times = {}, {}, {name: [] for name in impls}
    for name in impls:
        try:
            epoch, params = build(name, init, xb, yb)
            epoch()  # compile / warm up, not timed
            runners[name] = (epoch, params)
        except Exception as e:  # reported in the table
            errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e).strip() else ''}"
    for _ in range(repeat):
        for name, (epoch, _) in runners.items():
            start = time.perf_counter()
            epoch()
            times[name].append(time.perf_counter() - start)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), from_torch(init))
    step_flops = profile.flops(raw_step, shapes, jax.ShapeDtypeStruct((batch, SIZES[0]), jnp.float32),
                               jax.ShapeDtypeStruct((batch,), jnp.int32))
    ref = runners["torch eager"][1]() if "torch eager" in runners else None
    rows = []
    for name in impls:
        row = {"impl": name, "batch": batch, "steps": steps, "error": errors.get(name)}
        if name in runners:
            sec = statistics.median(times[name])
            got = runners[name][1]()
            diff = None if ref is None or name == "funcnet run_epoch" else \
                max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref)
            row.update(seconds_per_epoch=sec, examples_per_s=steps * batch / sec,
                       flops_per_step=step_flops, gflops=step_flops * steps / sec / 1e9, max_param_diff=diff)
        rows.append(row)
    base = next((r for r in rows if r["impl"] == "torch eager" and r.get("seconds_per_epoch")), None)
    for r in rows:
        if base and r.get("seconds_per_epoch"):
            r["vs_torch_eager"] = base["seconds_per_epoch"] / r["seconds_per_epoch"]
    return rows


def goals(rows, peak):
    def find(impl, batch):
        return next((r for r in rows if r["impl"] == impl and r["batch"] == batch and r.get("seconds_per_epoch")), None)

    out = []
    scan, raw, step = find("funcnet run_epoch", 128), find("raw JAX", 128), find("funcnet make_step", 128)
    if scan and scan.get("vs_torch_eager"):
        out.append(("funcnet run_epoch, batch 128 >= 1.8x torch eager", scan["vs_torch_eager"] >= 1.8,
                    f"{scan['vs_torch_eager']:.2f}x"))
    if scan:
        share = scan["gflops"] * 1e9 / peak
        out.append(("funcnet run_epoch, batch 128 >= 80% of matmul peak", share >= 0.8, f"{share:.1%}"))
    if raw and step:
        slower = step["seconds_per_epoch"] / raw["seconds_per_epoch"] - 1
        out.append(("funcnet make_step within 5% of raw JAX step, batch 128", slower <= 0.05, f"{slower:+.1%}"))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--examples", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS, metavar="IMPL")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--single-thread", action="store_true",
                        help="one core for each framework (torch.set_num_threads(1), XLA without its thread pool): "
                             "fair on a busy machine, where torch's OpenMP threads spin-wait for each other")
    args = parser.parse_args(argv)
    import torch

    if args.single_thread:
        # read when XLA's CPU client starts, at the first computation below
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
        torch.set_num_threads(1)

    (x, y), _ = data.load("synthetic", n_train=args.examples, n_test=1, features=SIZES[0], classes=SIZES[-1])
    x = (x / np.abs(x).max()).astype(np.float32)
    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).state_dict()
    peak = profile.matmul_peak(1024, repeat=5)
    rows = [r for b in args.batch_sizes for r in bench_batch(b, x, y, init, args.repeat, args.impls)]
    checked = goals(rows, peak)

    title = (f"MLP 784-128-10, SGD, {args.examples} synthetic examples, median of {args.repeat} epochs; "
             f"float32 matmul peak {peak / 1e9:.1f} GFLOP/s ({jax.default_backend()}, torch {torch.__version__}, "
             f"{'one thread each' if args.single_thread else f'{torch.get_num_threads()} torch threads, XLA default'})")
    table = Table(title=title)
    for col in ("impl", "batch", "ms/epoch", "examples/s", "x torch eager", "GFLOP/s", "% of peak",
                "max |dparam| vs torch", "error"):
        table.add_column(col, justify="left" if col in ("impl", "error") else "right", overflow="fold")
    for r in rows:
        if r.get("seconds_per_epoch") is None:
            table.add_row(r["impl"], str(r["batch"]), *["-"] * 6, r["error"] or "")
            continue
        diff = (f"{r['max_param_diff']:.1e}" if r["max_param_diff"] is not None
                else "own shuffle" if r["impl"] == "funcnet run_epoch" else "-")
        ratio = f"{r['vs_torch_eager']:.2f}" if "vs_torch_eager" in r else "-"
        table.add_row(r["impl"], str(r["batch"]), f"{r['seconds_per_epoch'] * 1e3:.1f}", f"{r['examples_per_s']:,.0f}",
                      ratio, f"{r['gflops']:.2f}",
                      f"{r['gflops'] * 1e9 / peak:.1%}", diff, "")
    console = Console(width=max(Console().width, 150))
    console.print(table)
    for name, ok, figure in checked:
        console.print(f"{'[green]met[/]' if ok else '[red]missed[/]'}  {name}: {figure}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.platform(), "backend": jax.default_backend(), "peak_flops": peak,
                       "single_thread": args.single_thread, "load_average": os.getloadavg(),
                       "torch": torch.__version__, "jax": jax.__version__, "rows": rows,
                       "goals": [{"goal": n, "met": ok, "figure": fig} for n, ok, fig in checked]}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
