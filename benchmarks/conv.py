"""Convolutions on the CPU: funcnet against torch eager and XLA's own convolution, by shape and in whole models.

    python benchmarks/conv.py [--single-thread] [--cpu-time] [--quick] [--part sweep|models|all] [--json out.json]
                              [--baseline old_conv_strategy.py]

1. The sweep: one convolution per row (spatial 1-224, channels 3-512, kernel 1/3/5/7, stride 1/2,
   groups 1 and depthwise, batch 1-64), forward and a train step (input and weight gradients),
   timed for funcnet (``funcnet.nn.functional.conv2d``, the strategy its rule picks), raw
   ``lax.conv_general_dilated`` (``strategy("xla")``) and torch eager; ratios to torch.
2. Whole models at 32, 64 and 224 px, batch 8 and 64: ResNet-18 (torchvision's layout, written
   in torch.nn here and converted by ``funcnet.interop.convert``, and hand-written from
   ``funcnet.models.BasicBlock``), a ConvNeXt-style stack (7x7 depthwise, GroupNorm, 1x1 MLP)
   and torchvision's MobileNetV3-Small (inverted residuals, depthwise 3x3/5x5, squeeze-excite,
   hardswish; written in torch.nn layer for layer), both converted, and a smaller ResNet-style net
   (``resnet_style``: a 3x3/2 stem, one BasicBlock a stage, down to 2x2 at 32 px), converted: forward (eval) and an
   SGD-momentum train step, against torch eager and torch.compile (``--compile``; it needs a C++
   compiler and minutes per model). ``benchmarks/conv_layout.py`` measures the same models with
   activations kept channels-last.

``--baseline FILE [DEPTHWISE]`` times another version of ``conv_strategy.py`` (say ``git show
main:funcnet/nn/functional/conv_strategy.py > /tmp/old.py``), with another
``conv_depthwise.py`` as the module it imports (the second file, from ``git show`` likewise;
without it the current one), as a column of the sweep beside the current one, in the same
rounds: a before/after measured side by side. With ``--part models`` each converted model runs
through it too, a row ``converted baseline`` timed in the same rounds.

Times are medians of interleaved rounds (A, B, C, A, B, C, ...), so a load change hits every
implementation alike; the load average is printed with the figures. Every row first checks
funcnet's output against torch's (a wrong result is a failure, exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (batch, in, out, spatial, kernel, stride, groups): the sweep; groups "dw" = depthwise (out = in)
SWEEP = [
    (8, 3, 64, 56, 7, 2, 1), (8, 3, 32, 32, 3, 1, 1), (8, 64, 64, 56, 3, 1, 1), (1, 64, 64, 56, 3, 1, 1),
    (8, 64, 128, 28, 3, 2, 1), (8, 128, 128, 28, 3, 1, 1), (8, 64, 256, 28, 1, 1, 1), (8, 256, 64, 28, 1, 1, 1),
    (8, 128, 256, 14, 3, 2, 1), (8, 256, 256, 14, 3, 1, 1), (8, 256, 512, 7, 3, 2, 1), (8, 512, 512, 7, 3, 1, 1),
    (8, 512, 512, 4, 3, 1, 1), (8, 512, 512, 2, 3, 1, 1), (8, 512, 512, 1, 3, 1, 1), (64, 512, 512, 2, 3, 1, 1),
    (64, 256, 512, 4, 1, 2, 1), (64, 64, 64, 8, 3, 1, 1), (1, 512, 512, 7, 3, 1, 1),
    (8, 32, 32, 56, 3, 1, "dw"), (8, 96, 96, 28, 3, 2, "dw"), (8, 96, 96, 14, 7, 1, "dw"), (8, 384, 384, 7, 7, 1, "dw"),
    (8, 576, 576, 4, 5, 1, "dw"), (64, 240, 240, 2, 5, 1, "dw"),
    # ConvNeXt's 7x7 depthwise; MobileNetV3's and EfficientNet's 5x5 stride-2 depthwise
    (8, 192, 192, 28, 7, 1, "dw"), (8, 72, 72, 28, 5, 2, "dw"), (8, 72, 72, 56, 5, 2, "dw"),
    (8, 32, 32, 112, 5, 2, "dw"),
    # a 3x3 stride-2 stem on 224 px images (MobileNetV3, EfficientNet) and its depthwise successor
    (8, 3, 16, 224, 3, 2, 1), (8, 16, 16, 112, 3, 2, "dw"),
]
QUICK_SWEEP = [(2, 8, 8, 2, 3, 1, 1), (2, 8, 8, 8, 3, 1, 1), (2, 8, 8, 6, 3, 2, "dw")]


CLOCK = [time.perf_counter]  # --cpu-time: time.process_time, this process's CPU time
BASELINE = []  # --baseline: the other conv_strategy module's convolve


def _timer(fn, reps):
    def run():
        _block(fn())  # the previous call's work is done before the clock starts
        clock = CLOCK[0]
        start = clock()
        for _ in range(reps):
            out = fn()
        _block(out)
        return (clock() - start) / reps * 1e3
    return run


def _block(out):
    import jax

    return jax.block_until_ready(out) if not hasattr(out, "detach") else out


def interleaved(runners: dict, rounds: int, reps: int, min_ms: float = 20.0) -> dict:
    """Median ms per call of each runner, the runners taking turns ``rounds`` times, each round
    starting one runner later (no runner always goes first); each timing repeats a call until
    it spans about ``min_ms`` (at least ``reps`` calls)."""
    calls = {}
    for name, fn in runners.items():
        _block(fn())  # compile / warm up
        one = _timer(fn, 1)()
        calls[name] = max(reps, min(50, int(min_ms / max(one, 1e-3)) + 1))
    timers = {name: _timer(fn, calls[name]) for name, fn in runners.items()}
    names, times = list(timers), {name: [] for name in runners}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timers[name]())
    return {name: statistics.median(v) for name, v in times.items()}


def sweep_row(shape, rounds, reps):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from funcnet.nn.functional import conv2d
    from funcnet.nn.functional.conv_strategy import strategy

    n, c, o, s, k, stride, groups = shape
    groups = c if groups == "dw" else groups
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((n, c, s, s)).astype(np.float32)
    w_np = (rng.standard_normal((o, c // groups, k, k)) / np.sqrt(c // groups * k * k)).astype(np.float32)
    x, w = jnp.asarray(x_np), jnp.asarray(w_np)
    args = (stride, k // 2, 1, groups)

    def jitted(how, convolve=None):
        def f(x, w):
            with strategy(how), _convolving(convolve):
                return conv2d(x, w, None, *args)
        fwd = jax.jit(f)
        step = jax.jit(jax.grad(lambda x, w, g: jnp.vdot(f(x, w), g), argnums=(0, 1)))
        return fwd, step

    (ours_f, ours_s), (lax_f, lax_s) = jitted("auto"), jitted("xla")
    tx, tw = torch.from_numpy(x_np).requires_grad_(), torch.from_numpy(w_np).requires_grad_()
    with torch.no_grad():
        ref = torch.nn.functional.conv2d(tx, tw, None, *args).numpy()
    g = jnp.asarray(rng.standard_normal(ref.shape).astype(np.float32))
    tg = torch.from_numpy(np.array(g))
    # float32 sums of c/groups*k*k products of unit-scale terms: rounding ~ sqrt(terms) * 2**-24
    err = float(np.max(np.abs(np.asarray(ours_f(x, w)) - ref)))
    ok = err <= 1e-5 * max(1.0, np.sqrt(c // groups * k * k))

    def torch_fwd():
        with torch.no_grad():
            return torch.nn.functional.conv2d(tx, tw, None, *args)

    def torch_step():
        tx.grad = tw.grad = None
        torch.nn.functional.conv2d(tx, tw, None, *args).backward(tg)
        return tw.grad

    fwd_runners = {"funcnet": lambda: ours_f(x, w), "lax.conv": lambda: lax_f(x, w), "torch": torch_fwd}
    step_runners = {"funcnet": lambda: ours_s(x, w, g), "lax.conv": lambda: lax_s(x, w, g), "torch": torch_step}
    if BASELINE:
        base_f, base_s = jitted("auto", BASELINE[0])
        err = max(err, float(np.max(np.abs(np.asarray(base_f(x, w)) - ref))))
        ok = err <= 1e-5 * max(1.0, np.sqrt(c // groups * k * k))
        fwd_runners["baseline"], step_runners["baseline"] = lambda: base_f(x, w), lambda: base_s(x, w, g)
    fwd = interleaved(fwd_runners, rounds, reps)
    step = interleaved(step_runners, rounds, reps)
    return {"shape": {"batch": n, "cin": c, "cout": o, "spatial": s, "kernel": k, "stride": stride, "groups": groups},
            "forward_ms": fwd, "train_ms": step, "max_abs_err": err, "ok": bool(ok)}


def _convolving(convolve):
    """Trace convolutions through ``convolve`` (another version's) inside the block."""
    import contextlib

    from funcnet.nn.functional import conv as conv_module

    if convolve is None:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def swapped():
        current, conv_module.convolve = conv_module.convolve, convolve
        try:
            yield
        finally:
            conv_module.convolve = current
    return swapped()


def load_baseline(path: str, depthwise: str | None = None):
    """The ``convolve`` of the conv_strategy module at ``path``, importing the conv_depthwise
    module at ``depthwise`` in place of the current one when given."""
    import importlib.util

    def load(name, file):
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    current = "funcnet.nn.functional.conv_depthwise"
    if depthwise is None:
        return load("baseline_conv_strategy", path).convolve
    import funcnet.nn.functional.conv_depthwise  # noqa: F401  (the package first, then the swap)

    kept = sys.modules[current]
    sys.modules[current] = load("baseline_conv_depthwise", depthwise)
    try:
        return load("baseline_conv_strategy", path).convolve
    finally:
        sys.modules[current] = kept


def sweep(shapes, rounds, reps, console):
    rows = []
    console.print(f"{'shape':<44} {'fwd ms: funcnet':>15} {'lax':>8} {'torch':>8} {'ours/torch':>10} "
                  f"{'lax/torch':>9} | {'train ms: funcnet':>17} {'lax':>8} {'torch':>8} {'ours/torch':>10} "
                  f"{'lax/torch':>9}")
    for shape in shapes:
        r = sweep_row(shape, rounds, reps)
        rows.append(r)
        s = r["shape"]
        name = (f"N{s['batch']} {s['cin']}->{s['cout']} {s['spatial']}x{s['spatial']} k{s['kernel']} "
                f"s{s['stride']}" + (" dw" if s["groups"] > 1 else "") + ("" if r["ok"] else " WRONG"))
        f, t = r["forward_ms"], r["train_ms"]
        console.print(f"{name:<44} {f['funcnet']:>15.2f} {f['lax.conv']:>8.2f} {f['torch']:>8.2f} "
                      f"{f['funcnet'] / f['torch']:>10.2f} {f['lax.conv'] / f['torch']:>9.2f} | "
                      f"{t['funcnet']:>17.2f} {t['lax.conv']:>8.2f} {t['torch']:>8.2f} "
                      f"{t['funcnet'] / t['torch']:>10.2f} {t['lax.conv'] / t['torch']:>9.2f}"
                      + (f" | baseline/torch {f['baseline'] / f['torch']:.2f} / {t['baseline'] / t['torch']:.2f}"
                         if "baseline" in f else ""))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("sweep", "models", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny shapes and models, one round")
    parser.add_argument("--single-thread", action="store_true",
                        help="one core for each framework (torch.set_num_threads(1), XLA without its thread pool)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", nargs="+", type=int, default=[32, 64, 224], help="image sizes of the models")
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 64])
    parser.add_argument("--models", nargs="+", default=None, help="model names (default: all)")
    parser.add_argument("--rows", nargs="+", type=int, default=None, help="only these rows of the sweep (0-based)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (minutes per model)")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--baseline", default=None, nargs="+", metavar="FILE",
                        help="another conv_strategy.py whose convolve the sweep times beside the current one, "
                             "and optionally the conv_depthwise.py it imports")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this process's CPU time, not wall time: steadier on a busy machine (with "
                             "--single-thread both frameworks do the same work on one thread either way)")
    args = parser.parse_args(argv)
    if args.cpu_time:
        CLOCK[0] = time.process_time
    if args.single_thread:
        from funcnet import profile

        profile.one_core()  # JAX and torch on one core, before JAX starts
        profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
    if args.baseline:
        if len(args.baseline) > 2:
            parser.error(f"--baseline takes a conv_strategy.py and optionally a conv_depthwise.py, "
                         f"got {len(args.baseline)} files")
        BASELINE.append(load_baseline(*args.baseline))
    import jax
    import torch
    from rich.console import Console

    if args.single_thread:
        torch.set_num_threads(1)
    console = Console(width=max(Console().width, 200))
    rounds, reps = (1, 1) if args.quick else (args.rounds, 3)
    load = os.getloadavg()
    console.print(f"backend {jax.default_backend()}, torch {torch.__version__}, jax {jax.__version__}, "
                  f"single-thread {args.single_thread}, "
                  f"{'CPU' if args.cpu_time else 'wall'} time, load average {load[0]:.1f}")
    result = {"load_before": load, "single_thread": args.single_thread, "cpu_time": args.cpu_time, "backend": jax.default_backend()}
    failed = False
    if args.part in ("sweep", "all"):
        shapes = QUICK_SWEEP if args.quick else SWEEP
        rows = sweep([shapes[i] for i in args.rows] if args.rows else shapes, rounds, reps, console)
        result["sweep"] = rows
        failed |= not all(r["ok"] for r in rows)
        worst = max(max(r["forward_ms"]["funcnet"] / r["forward_ms"]["torch"],
                        r["train_ms"]["funcnet"] / r["train_ms"]["torch"]) for r in rows)
        console.print(f"sweep: the worst funcnet/torch ratio (forward or train) is {worst:.2f}")
        result["worst_sweep_ratio"] = worst
    if args.part in ("models", "all"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from conv_models import run_models

        if BASELINE:  # the converted models run through the baseline's convolve too, as a row of their own
            args.baseline_context = lambda: _convolving(BASELINE[0])
        rows = run_models(args, rounds, console, interleaved)
        result["models"] = rows
        failed |= not all(r.get("ok", True) for r in rows)
    result["load_after"] = os.getloadavg()
    console.print(f"load average after: {result['load_after'][0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if failed:
        console.print("conv: a result differs from torch's beyond its tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
