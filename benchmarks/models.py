"""Train-step throughput of real models: funcnet (make_step, run_epoch) vs torch eager vs torch.compile.

- convnet: ``funcnet.models.ConvNet`` (conv3x3-BN-ReLU-pool twice, a Linear) on 8x8 images,
  SGD with momentum; its torch twin ``TorchConvNet`` from ``examples/port_cnn.py``.
- gpt: ``funcnet.gpt.GPT`` (nanoGPT-shaped) on character blocks of CPython's documentation
  (``funcnet.text``), nanoGPT's AdamW + ``clip_grad_norm_`` + warmup-cosine schedule; its
  torch twin ``TorchGPT`` from ``comparisons/gpt.py`` (skipped, with the reason, if absent).

Both frameworks start from the same weights (torch's ``state_dict`` loaded into funcnet).
Correctness: one untimed epoch over the same batch order (run_epoch's own shuffle, handed to
torch), then parameters (and BatchNorm's running statistics) compared with torch eager within
``--tol``. Timing: every implementation shuffles each epoch its own way (torch: ``randperm``
and indexing; funcnet: ``data.batches`` for make_step, the on-device shuffle for run_epoch),
interleaved one epoch each per round; ratios are medians over rounds of per-round ratios.
FLOPs per step: XLA's cost analysis of the compiled step (``funcnet.profile.flops``), against
the float32 matmul peak sampled between rounds (best sample kept).

    python benchmarks/models.py [--models convnet gpt] [--repeat 5] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from rich.console import Console
from rich.table import Table

import funcnet
from funcnet import data, models, profile, train

IMPLS = ("torch eager", "torch.compile", "funcnet make_step", "funcnet run_epoch")
ROOT = Path(__file__).resolve().parent.parent


class Spec:
    """One model: the data, both models from the same weights, both optimizers, the loss."""

    def __init__(self, name, x, y, batch, ours, theirs, params, model_state, tx, torch_opt, torch_loss, tol, why):
        self.__dict__.update(locals())
        del self.__dict__["self"]


def convnet_spec(quick):
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from port_cnn import TorchConvNet

    (x, y), _ = data.load("synthetic", n_train=1024 if quick else 8192, n_test=1, features=64, classes=10)
    torch.manual_seed(0)
    theirs, ours = TorchConvNet(), models.ConvNet()
    params, model_state = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict(),
                                                  state=ours.init_state())

    def torch_opt(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        return opt, None, None

    return Spec("convnet", x, y, 128, ours, theirs, params, model_state, optax.sgd(0.05, momentum=0.9), torch_opt,
                torch.nn.functional.cross_entropy, 1e-4,
                "float32 over one epoch of SGD-momentum: summation order in convs and BatchNorm statistics")


def gpt_spec(quick):
    import torch

    try:
        from comparisons.gpt import TorchGPT, torch_optimizer
    except ImportError as e:
        return f"comparisons/gpt.py (TorchGPT) not importable: {e}"
    from funcnet import gpt, text

    config = gpt.GPTConfig(block_size=32, vocab_size=text.vocabulary().size, n_layer=2, n_head=4, n_embd=64)
    (x, y), _ = text.load_text(config.block_size)
    n = 512 if quick else 2048
    x, y = x[:n], y[:n]
    torch.manual_seed(0)
    theirs, ours = TorchGPT(config), gpt.GPT(config)
    params = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict())
    opt = dict(learning_rate=3e-3, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=10, decay_steps=200,
               min_lr=3e-4)

    def torch_opt(m):
        optimizer, scheduler = torch_optimizer(m, **opt)
        return optimizer, scheduler, 1.0

    def torch_loss(logits, y):
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    return Spec("gpt", x, y, 16, ours, theirs, params, {}, gpt.configure_optimizers(**opt, grad_clip=1.0),
                torch_opt, torch_loss, 1e-3,
                "float32 over one epoch (128 steps) of AdamW: its division by the running RMS turns summation-order "
                "differences of small gradients into differences of whole updates; torch.compile differs from "
                "torch eager by as much (5e-4 to 7e-4 measured)")


def torch_impl(spec, *, compiled):
    import torch

    model = type(spec.theirs)(*([spec.theirs.config] if hasattr(spec.theirs, "config") else []))
    model.load_state_dict(spec.theirs.state_dict())
    model.train()
    opt, scheduler, clip = spec.torch_opt(model)
    xs, ys = torch.from_numpy(spec.x), torch.from_numpy(spec.y.astype(np.int64))
    if not np.issubdtype(spec.x.dtype, np.floating):
        xs = xs.long()
    gen = torch.Generator().manual_seed(1)
    steps = len(xs) // spec.batch

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = spec.torch_loss(model(xb), yb)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss

    step = torch.compile(step) if compiled else step

    def epoch(order=None):
        perm = torch.randperm(len(xs), generator=gen)[: steps * spec.batch].view(steps, spec.batch) \
            if order is None else torch.from_numpy(np.asarray(order, np.int64))
        for idx in perm:
            step(xs[idx], ys[idx])
            if scheduler is not None:
                scheduler.step()

    def values():
        return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

    return epoch, values


def _fresh_state(spec):
    # copies: each step donates its state, and every implementation starts from spec's weights
    return train.create_train_state(spec.ours, spec.tx, jax.random.key(0), params=jax.tree.map(jnp.copy, spec.params),
                                    model_state=jax.tree.map(jnp.copy, spec.model_state))


def funcnet_impl(spec, *, scan):
    step = train.make_step(spec.ours, spec.tx)
    holder = [_fresh_state(spec)]
    xs, ys = jnp.asarray(spec.x), jnp.asarray(spec.y)

    def epoch(order=None):  # its own order always; the checked epoch's order is what torch gets
        state, _ = train.run_epoch(step, holder[0], xs, ys, batch_size=spec.batch, scan=scan)
        holder[0] = jax.block_until_ready(state)

    def values():
        return {k: np.asarray(v) for k, v in funcnet.state_dict(holder[0].params, holder[0].model_state).items()}

    return epoch, values, step


def first_order(spec):
    state = _fresh_state(spec)
    return np.asarray(data.epoch_indices(jax.random.split(state.key)[1], len(spec.x), spec.batch))


def bench_model(spec, impls, repeat, peaks, log):
    order = first_order(spec)
    runners, errors, step = {}, {}, None
    for name in impls:
        try:
            if name.startswith("torch"):
                epoch, values = torch_impl(spec, compiled=name == "torch.compile")
            else:
                epoch, values, step = funcnet_impl(spec, scan=name == "funcnet run_epoch")
            t0 = time.perf_counter()
            epoch(order)  # checked epoch; compiles
            log(f"{spec.name}: {name} first epoch (compile) {time.perf_counter() - t0:.1f}s")
            runners[name] = (epoch, values())
            epoch()
        except Exception as e:  # reported in the table
            errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e).strip() else ''}"
    times = {name: [] for name in runners}
    for r in range(repeat):
        for name, (epoch, _) in runners.items():
            t0 = time.perf_counter()
            epoch()
            times[name].append(time.perf_counter() - t0)
        peaks.append(profile.matmul_peak(1024, repeat=3, number=2))
        log(f"{spec.name}: round {r + 1}/{repeat}")
    state = _fresh_state(spec)
    batch = (jnp.asarray(spec.x[: spec.batch]), jnp.asarray(spec.y[: spec.batch]))
    flops = profile.flops(jax.jit(step.raw), state, batch) if step is not None else None
    ref = runners["torch eager"][1] if "torch eager" in runners else None
    steps = len(spec.x) // spec.batch
    rows = []
    for name in impls:
        row = {"model": spec.name, "impl": name, "batch": spec.batch, "steps": steps, "error": errors.get(name)}
        if name in runners:
            sec = statistics.median(times[name])
            got = runners[name][1]
            diff = None if ref is None else max(
                float(np.max(np.abs(got[k].astype(np.float64) - ref[k]))) for k in ref if k in got)
            # what one example is made of: a GPT example is a block of tokens, a conv net's an image
            per_example, unit = (spec.x.shape[1], "tokens") if spec.name == "gpt" else (1, "images")
            row.update(seconds_per_epoch=sec, seconds_all=times[name], ms_per_step=sec / steps * 1e3,
                       flops_per_step=flops, max_diff_vs_torch_eager=diff, unit=unit,
                       per_second=spec.batch * per_example * steps / sec)
            if flops:
                row["gflops"] = flops * steps / sec / 1e9
            for other, key in (("torch eager", "vs_torch_eager"), ("torch.compile", "vs_torch_compile")):
                if other in runners:  # > 1: this row is faster
                    row[key] = statistics.median(a / b for a, b in zip(times[other], times[name]))
        rows.append(row)
    if "funcnet run_epoch" in runners and "funcnet make_step" in runners:
        a, b = runners["funcnet run_epoch"][1], runners["funcnet make_step"][1]
        next(r for r in rows if r["impl"] == "funcnet run_epoch")["bitwise_equal_make_step"] = \
            all(np.array_equal(a[k], b[k]) for k in a)
    return rows


def goals(rows):
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        best = [r for r in rows if r["model"] == model and r["impl"].startswith("funcnet") and r.get("seconds_per_epoch")]
        if not best:
            continue
        best = min(best, key=lambda r: r["seconds_per_epoch"])
        if "vs_torch_eager" in best:
            out.append((f"{model}: {best['impl']} >= 1.5x torch eager", best["vs_torch_eager"] >= 1.5,
                        f"{best['vs_torch_eager']:.2f}x"))
        if "vs_torch_compile" in best:
            out.append((f"{model}: {best['impl']} ahead of torch.compile", best["vs_torch_compile"] > 1,
                        f"{best['vs_torch_compile']:.2f}x"))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["convnet", "gpt"], choices=["convnet", "gpt"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS, metavar="IMPL")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small data, one round, no torch.compile")
    parser.add_argument("--single-thread", action="store_true",
                        help="one core for each framework (torch.set_num_threads(1), XLA without its thread pool): "
                             "fair on a busy machine, where torch's OpenMP threads spin-wait for each other")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat = 1
        args.impls = [i for i in args.impls if i != "torch.compile"]
    import torch

    if args.single_thread:
        # read when XLA's CPU client starts, at the first computation below
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_cpu_multi_thread_eigen=false")
        torch.set_num_threads(1)
    console = Console(width=max(Console().width, 150))
    load_before = os.getloadavg()
    peaks = [profile.matmul_peak(1024, repeat=5)]
    rows, skipped = [], {}
    for name in args.models:
        spec = (convnet_spec if name == "convnet" else gpt_spec)(args.quick)
        if isinstance(spec, str):
            skipped[name] = spec
            continue
        rows += bench_model(spec, args.impls, args.repeat, peaks, console.log)
        for r in rows[-len(args.impls):]:
            r["tolerance"], r["tolerance_why"] = spec.tol, spec.why
    peak, load_after = max(peaks), os.getloadavg()
    checked = goals(rows)

    table = Table(title=f"train-step throughput, median of {args.repeat} interleaved epochs; float32 matmul peak "
                        f"{peak / 1e9:.1f} GFLOP/s (best of {len(peaks)}, median {statistics.median(peaks) / 1e9:.1f}); "
                        f"torch {torch.__version__}, {torch.get_num_threads()} threads; jax {jax.__version__}; "
                        f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}")
    for col in ("model", "impl", "batch", "ms/step", "per second", "x torch eager", "x torch.compile", "GFLOP/s",
                "% of peak", "max |diff| vs torch", "error"):
        table.add_column(col, justify="left" if col in ("model", "impl", "error") else "right", overflow="fold")
    bad = []
    for r in rows:
        if r.get("seconds_per_epoch") is None:
            table.add_row(r["model"], r["impl"], str(r["batch"]), *["-"] * 7, r["error"] or "")
            continue
        diff = "-" if r["max_diff_vs_torch_eager"] is None else f"{r['max_diff_vs_torch_eager']:.1e}"
        if r["max_diff_vs_torch_eager"] is not None and r["max_diff_vs_torch_eager"] > r["tolerance"]:
            bad.append(r)
        if "bitwise_equal_make_step" in r:
            diff += " (bitwise = make_step)" if r["bitwise_equal_make_step"] else " (differs from make_step)"
        g = r.get("gflops")
        table.add_row(r["model"], r["impl"], str(r["batch"]), f"{r['ms_per_step']:.2f}",
                      f"{r['per_second']:,.0f} {r['unit']}",
                      f"{r['vs_torch_eager']:.2f}" if "vs_torch_eager" in r else "-",
                      f"{r['vs_torch_compile']:.2f}" if "vs_torch_compile" in r else "-",
                      f"{g:.2f}" if g else "-", f"{g * 1e9 / peak:.1%}" if g else "-", diff, "")
    console.print(table)
    for r in rows:
        if r["impl"] == "funcnet run_epoch" and r.get("flops_per_step"):
            console.print(f"{r['model']}: {r['flops_per_step'] / 1e6:.1f} MFLOP per step (XLA cost analysis); "
                          f"tolerance {r['tolerance']:g}: {r['tolerance_why']}")
    for name, why in skipped.items():
        console.print(f"[yellow]skipped[/] {name}: {why}")
    for r in bad:
        console.print(f"[red]MISMATCH[/] {r['model']} {r['impl']}: {r['max_diff_vs_torch_eager']:.1e} > {r['tolerance']}")
    for name, ok, figure in checked:
        console.print(f"{'[green]met[/]' if ok else '[red]missed[/]'}  {name}: {figure}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.platform(), "peak_flops": peak, "peak_samples": peaks,
                       "load_average": [load_before, load_after],
                       "single_thread": args.single_thread, "torch": torch.__version__, "jax": jax.__version__,
                       "rows": rows, "skipped": skipped,
                       "goals": [{"goal": n, "met": ok, "figure": fig} for n, ok, fig in checked]}, f, indent=2)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
