"""Training throughput of one MLP, six ways, on the same data and the same initial weights.

MLP 784-128-10, plain SGD (lr 0.05), cross-entropy, one synthetic data set. Every
implementation shuffles each epoch the way its users do, and pays for it in the timing:

- torch eager / torch.compile: ``torch.randperm`` each epoch, then ``x[idx]`` per batch
  (what ``DataLoader(shuffle=True)`` does over a tensor, without its worker machinery);
- flax nnx and raw JAX: a ``jax.random.permutation`` per epoch, the batch gathered by
  index inside the jitted step (the cheapest hand-written loop: one dispatch per step);
- funcnet make_step: ``run_epoch(..., scan=False)``: the library's Python loop of the
  compiled step over ``data.batches``;
- funcnet run_epoch: the whole epoch (shuffle, gathers, steps, metrics) in one ``lax.scan``.

Correctness: one untimed epoch from the same weights over the same batch order (run_epoch's
own shuffle, handed to the others) is compared with torch eager (max |dparam|, float32
summation order only), and run_epoch with make_step bitwise. Timing: the implementations
run interleaved, one epoch each per round, so the load of this shared machine hits them
alike; each ratio is the median over rounds of the per-round ratio, which is steadier than
a ratio of medians when the load changes between rounds.

FLOPs per step come from XLA's cost analysis of the raw JAX step; the share of peak
compares with a measured float32 matmul (``funcnet.profile.matmul_peak``). The floor is the
model's own matmuls alone (forward, weight and input gradients, scanned over the epoch's
contiguous batches): what a step could take with everything else free.

    python benchmarks/throughput.py [--batch-sizes 32 128 512 1024] [--examples 8192] [--repeat 7]
    [--json PATH] [--single-thread] [--quick]
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
TOL = 1e-4  # max |dparam| vs torch eager after one epoch: float32 summation order only (3e-5 seen at batch 512)


def torch_impl(init, x, y, batch, *, compiled):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    gen = torch.Generator().manual_seed(1)
    steps = len(x) // batch

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    step = torch.compile(step) if compiled else step

    def epoch(order=None):
        perm = torch.randperm(len(xs), generator=gen)[: steps * batch].view(steps, batch) if order is None \
            else torch.from_numpy(np.asarray(order, np.int64))
        for idx in perm:
            step(xs[idx], ys[idx])

    return epoch, lambda: {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _jax_loop(step, carry, x, y, batch):
    # A user's JAX loop: a permutation per epoch from its own key chain, one dispatch per step.
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    key = [jax.random.key(1)]

    def epoch(order=None):
        if order is None:
            key[0], k = jax.random.split(key[0])
            order = data.epoch_indices(k, len(xs), batch)
        for idx in jnp.asarray(order):
            carry[0] = step(carry[0], xs, ys, idx)
        jax.block_until_ready(carry[0])

    return epoch


def flax_impl(init, x, y, batch):
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
    def train_step(model, optimizer, xs, ys, idx):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(xs[idx]), ys[idx]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def step(loss, xs, ys, idx):
        return train_step(model, optimizer, xs, ys, idx)

    epoch = _jax_loop(step, [None], x, y, batch)

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


@functools.partial(jax.jit, donate_argnums=0)
def raw_step_take(params, xs, ys, idx):
    return raw_step.__wrapped__(params, xs[idx], ys[idx])[0]


def raw_impl(init, x, y, batch):
    carry = [from_torch(init)]
    return _jax_loop(raw_step_take, carry, x, y, batch), lambda: _torch_names(carry[0])


def funcnet_impl(init, x, y, batch, *, scan):
    model, tx = nn.MLP(list(SIZES)), optax.sgd(LR)
    step = train.make_step(model, tx)
    holder = [train.create_train_state(model, tx, jax.random.key(0), params=from_torch(init))]
    xs, ys = jnp.asarray(x), jnp.asarray(y)

    def epoch(order=None):  # the order is always its own: the first epoch's is what the others get
        state, metrics = train.run_epoch(step, holder[0], xs, ys, batch_size=batch, scan=scan)
        holder[0] = jax.block_until_ready(state)

    return epoch, lambda: _torch_names(holder[0].params)


def first_order(init, n, batch):
    # The batches run_epoch's first epoch draws: create_train_state splits key(0), run_epoch splits again.
    state = train.create_train_state(nn.MLP(list(SIZES)), optax.sgd(LR), jax.random.key(0), params=from_torch(init))
    return np.asarray(data.epoch_indices(jax.random.split(state.key)[1], n, batch))


def _torch_names(params):
    return {f"{layer}.{name}": np.asarray(v) for layer, d in params.items() for name, v in d.items()}


def build(name, init, x, y, batch):
    if name.startswith("torch"):
        return torch_impl(init, x, y, batch, compiled=name == "torch.compile")
    if name == "flax nnx":
        return flax_impl(init, x, y, batch)
    if name == "raw JAX":
        return raw_impl(init, x, y, batch)
    return funcnet_impl(init, x, y, batch, scan=name == "funcnet run_epoch")


def matmul_floor(batch, steps):
    """``(epoch, flops_per_step)``: ``epoch()`` runs the MLP's matmuls alone (forward, both weight
    gradients, the hidden layer's input gradient) scanned over contiguous batches."""
    k = jax.random.split(jax.random.key(2), 4)
    xs = jax.random.normal(k[0], (steps, batch, SIZES[0]))
    w1, w2 = jax.random.normal(k[1], SIZES[1::-1]), jax.random.normal(k[2], SIZES[:0:-1])
    g = jax.random.normal(k[3], (batch, SIZES[2]))

    def body(ws, x):
        w1, w2 = ws
        h = x @ w1.T
        _ = h @ w2.T
        dw2, dh = g.T @ h, g @ w2
        dw1 = dh.T @ x
        return (w1 - 1e-9 * dw1, w2 - 1e-9 * dw2), None  # keeps every matmul live

    run = jax.jit(lambda ws, xs: jax.lax.scan(body, ws, xs)[0])
    flops = 2 * batch * (2 * SIZES[0] * SIZES[1] + 3 * SIZES[1] * SIZES[2])
    return lambda: jax.block_until_ready(run((w1, w2), xs)), flops


def bench_batch(batch, x, y, init, repeat, impls, log, peaks):
    steps = len(x) // batch
    order = first_order(init, len(x), batch)
    runners, errors = {}, {}
    for name in impls:
        try:
            epoch, params = build(name, init, x, y, batch)
            epoch(order)  # the checked epoch: same weights, same batches; also compiles
            runners[name] = (epoch, params, params())
            epoch()  # warm up the timed path (its own shuffle)
        except Exception as e:  # reported in the table
            errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e).strip() else ''}"
    floor, floor_flops = matmul_floor(batch, steps)
    floor()  # compile
    timed = {name: run[0] for name, run in runners.items()}
    timed["matmul floor"] = floor
    times = {name: [] for name in timed}
    for r in range(repeat):
        for name, epoch in timed.items():
            start = time.perf_counter()
            epoch()
            times[name].append(time.perf_counter() - start)
        peaks.append(profile.matmul_peak(1024, repeat=3, number=2))  # the peak, sampled under the same load
        log(f"batch {batch}: round {r + 1}/{repeat}")
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), from_torch(init))
    step_flops = profile.flops(raw_step, shapes, jax.ShapeDtypeStruct((batch, SIZES[0]), jnp.float32),
                               jax.ShapeDtypeStruct((batch,), jnp.int32))
    ref = runners["torch eager"][2] if "torch eager" in runners else None
    rows = []
    for name in impls:
        row = {"impl": name, "batch": batch, "steps": steps, "error": errors.get(name)}
        if name in runners:
            sec = statistics.median(times[name])
            got = runners[name][2]
            diff = None if ref is None else max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref)
            row.update(seconds_per_epoch=sec, seconds_all=times[name], examples_per_s=steps * batch / sec,
                       flops_per_step=step_flops, gflops=step_flops * steps / sec / 1e9, max_param_diff=diff)
            if "torch eager" in runners:  # median over rounds of the per-round ratio
                row["vs_torch_eager"] = statistics.median(a / b for a, b in zip(times["torch eager"], times[name]))
            if "funcnet run_epoch" in runners:  # > 1: run_epoch is faster than this row
                row["run_epoch_speedup"] = statistics.median(
                    b / a for a, b in zip(times["funcnet run_epoch"], times[name]))
        rows.append(row)
    sec = statistics.median(times["matmul floor"])
    rows.append({"impl": "matmul floor", "batch": batch, "steps": steps, "error": None, "seconds_per_epoch": sec,
                 "seconds_all": times["matmul floor"], "examples_per_s": steps * batch / sec,
                 "flops_per_step": floor_flops, "gflops": floor_flops * steps / sec / 1e9, "max_param_diff": None})
    if "funcnet run_epoch" in runners:
        rows[-1]["run_epoch_speedup"] = statistics.median(
            b / a for a, b in zip(times["funcnet run_epoch"], times["matmul floor"]))
    if "funcnet run_epoch" in runners and "funcnet make_step" in runners:
        a, b = runners["funcnet run_epoch"][2], runners["funcnet make_step"][2]
        next(r for r in rows if r["impl"] == "funcnet run_epoch")["bitwise_equal_make_step"] = \
            all(np.array_equal(a[k], b[k]) for k in a)
    return rows


def goals(rows, peak):
    def find(impl, batch):
        return next((r for r in rows if r["impl"] == impl and r["batch"] == batch and r.get("seconds_per_epoch")), None)

    out = []
    for batch in sorted({r["batch"] for r in rows}):
        scan = find("funcnet run_epoch", batch)
        for other in ("funcnet make_step", "raw JAX"):
            o = find(other, batch)
            if scan and o:
                speed = o["run_epoch_speedup"]
                out.append((f"funcnet run_epoch >= {other} (within 3%), batch {batch}", speed >= 0.97,
                            f"{speed:.2f}x"))
    scan = find("funcnet run_epoch", 128)
    if scan and scan.get("vs_torch_eager"):
        out.append(("funcnet run_epoch, batch 128 >= 1.8x torch eager", scan["vs_torch_eager"] >= 1.8,
                    f"{scan['vs_torch_eager']:.2f}x"))
    if scan:
        share = scan["gflops"] * 1e9 / peak
        figure = f"{share:.1%}"
        floor = find("matmul floor", 128)
        if floor:
            figure += (f"; the floor (its matmuls alone) reaches {floor['gflops'] * 1e9 / peak:.1%} of peak, and "
                       f"run_epoch takes {1 / floor['run_epoch_speedup']:.2f}x the floor's time")
        out.append(("funcnet run_epoch, batch 128 >= 80% of matmul peak", share >= 0.8, figure))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128, 512, 1024])
    parser.add_argument("--examples", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS, metavar="IMPL")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--single-thread", action="store_true",
                        help="one core for each framework (torch.set_num_threads(1), XLA without its thread pool): "
                             "fair on a busy machine, where torch's OpenMP threads spin-wait for each other")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1024 examples, batch 128, one round, no torch.compile or flax")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.batch_sizes, args.repeat = 1024, [128], 1
        args.impls = [i for i in args.impls if i not in ("torch.compile", "flax nnx")]
    import torch

    if args.single_thread:
        profile.one_core()  # before XLA's CPU client starts, at the first computation below
        profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
        torch.set_num_threads(1)

    console = Console(width=max(Console().width, 150))
    load_before = os.getloadavg()
    (x, y), _ = data.load("synthetic", n_train=args.examples, n_test=1, features=SIZES[0], classes=SIZES[-1])
    x = (x / np.abs(x).max()).astype(np.float32)
    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).state_dict()
    peaks = [profile.matmul_peak(1024, repeat=5)]
    rows = [r for b in args.batch_sizes
            for r in bench_batch(b, x, y, init, args.repeat, args.impls, console.log, peaks)]
    peak = max(peaks)  # the best the machine did during the run: shares of peak are not flattered by load
    checked = goals(rows, peak)
    load_after = os.getloadavg()

    title = (f"MLP 784-128-10, SGD, {args.examples} synthetic examples, every loop shuffling each epoch, "
             f"median of {args.repeat} interleaved rounds; float32 matmul peak {peak / 1e9:.1f} GFLOP/s "
             f"(best of {len(peaks)} samples, median {statistics.median(peaks) / 1e9:.1f}) "
             f"({jax.default_backend()}, torch {torch.__version__}, "
             f"{'one thread each' if args.single_thread else f'{torch.get_num_threads()} torch threads, XLA default'}; "
             f"load average {load_before[0]:.1f} -> {load_after[0]:.1f})")
    table = Table(title=title)
    for col in ("impl", "batch", "ms/epoch", "examples/s", "x torch eager", "run_epoch speed-up", "GFLOP/s", "% of peak",
                "max |dparam| vs torch", "error"):
        table.add_column(col, justify="left" if col in ("impl", "error") else "right", overflow="fold")
    for r in rows:
        if r.get("seconds_per_epoch") is None:
            table.add_row(r["impl"], str(r["batch"]), *["-"] * 7, r["error"] or "")
            continue
        diff = "-" if r["max_param_diff"] is None else f"{r['max_param_diff']:.1e}"
        if "bitwise_equal_make_step" in r:
            diff += " (bitwise = make_step)" if r["bitwise_equal_make_step"] else " (differs from make_step)"
        table.add_row(r["impl"], str(r["batch"]), f"{r['seconds_per_epoch'] * 1e3:.1f}", f"{r['examples_per_s']:,.0f}",
                      f"{r['vs_torch_eager']:.2f}" if "vs_torch_eager" in r else "-",
                      f"{r['run_epoch_speedup']:.2f}" if "run_epoch_speedup" in r else "-", f"{r['gflops']:.2f}",
                      f"{r['gflops'] * 1e9 / peak:.1%}", diff, "")
    console.print(table)
    console.print("x torch eager: median over rounds of (torch eager's epoch time / this row's); run_epoch speed-up: "
                  "of (this row's / run_epoch's), > 1 when run_epoch is faster")
    console.print("matmul floor: the MLP's five matmuls per step alone, no shuffle, loss or update (GFLOP/s of "
                  "those matmuls); run_epoch speed-up < 1 on it: how far run_epoch is from that floor")
    bad = [r for r in rows if r.get("max_param_diff") is not None and r["max_param_diff"] > TOL]
    for r in bad:
        console.print(f"[red]MISMATCH[/] {r['impl']} batch {r['batch']}: max |dparam| {r['max_param_diff']:.1e} > {TOL}")
    for name, ok, figure in checked:
        console.print(f"{'[green]met[/]' if ok else '[red]missed[/]'}  {name}: {figure}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.platform(), "backend": jax.default_backend(), "peak_flops": peak, "peak_samples": peaks,
                       "single_thread": args.single_thread, "load_average": [load_before, load_after],
                       "torch": torch.__version__, "jax": jax.__version__, "tolerance": TOL, "rows": rows,
                       "goals": [{"goal": n, "met": ok, "figure": fig} for n, ok, fig in checked]},
                      f, indent=2)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
