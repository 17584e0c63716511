"""Each convolution of a model, its forward, input gradient and weight gradient timed apart:
funcnet against torch eager.

    python benchmarks/conv_directions.py [--model resnet18] [--size 224] [--batch 8] [--rounds 3]
                                         [--single-thread] [--cpu-time] [--quick] [--json out.json]

A train step of a convolutional net is three convolutions per layer: the forward, the input
gradient (a convolution of the output gradient with the flipped kernel) and the weight gradient
(the input against the output gradient, summed over the batch and the positions). The model
(one of ``benchmarks/conv_models.py``'s torch.nn models) runs once in torch with a hook on each
``Conv2d`` to find its convolutions; each distinct one is then timed alone, in interleaved
rounds (``benchmarks/conv.py``'s ``interleaved``):

- funcnet: ``funcnet.nn.functional.conv2d`` (the strategy its rule picks) and ``jax.vjp``
  of it with respect to the input and to the weight, each jitted on its own;
- torch: ``F.conv2d`` and ``aten.convolution_backward`` asked for the input's or the weight's
  gradient alone (what autograd calls in a train step);
- ``weight gradient per tap`` (a formulation tried for funcnet and not kept, kept here to be
  measured again on a later XLA): for each kernel tap, the strided slice of the padded input
  times the output gradient, one matrix multiply per example, summed over the batch.

Every result is checked against torch's first (exit 1 past float32 rounding of its sums). The
totals weigh each convolution by how often the model has it; the first layer's input gradient
is printed but left out of the totals, as a train step does not compute it.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DIRECTIONS = ("forward", "input gradient", "weight gradient")


def model_convolutions(module, x):
    """The model's ``Conv2d`` calls on ``x``: ``{(batch, in, size, out, kernel, stride, padding,
    groups): count}`` in the order first met."""
    import torch

    found = collections.Counter()
    hooks = [m.register_forward_pre_hook(
        lambda m, args: found.update([(*args[0].shape[:2], args[0].shape[2], m.out_channels, m.kernel_size[0],
                                       m.stride[0], m.padding[0], m.groups)]))
        for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        module.eval()(x)
    for h in hooks:
        h.remove()
    return dict(found)


def weight_grad_per_tap(x, g, kernel, stride, padding):
    """The weight gradient of a 2D convolution (one group), as a sum over taps: for each tap the
    padded input's strided slice against the output gradient, one matrix multiply per example
    (``(O, positions) x (C, positions)^T``), summed over the examples."""
    import jax
    import jax.numpy as jnp

    batch, channels = x.shape[:2]
    out_channels, size = g.shape[1], g.shape[2]
    xp = jnp.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    gf = g.reshape(batch, out_channels, size * size)
    taps = []
    for i in range(kernel):
        for j in range(kernel):
            end = (batch, channels, i + stride * (size - 1) + 1, j + stride * (size - 1) + 1)
            col = jax.lax.slice(xp, (0, 0, i, j), end, (1, 1, stride, stride)).reshape(batch, channels, -1)
            taps.append(jax.lax.dot_general(gf, col, (((2,), (2,)), ((0,), (0,))),
                                            precision=jax.lax.Precision.HIGHEST).sum(0))
    return jnp.stack(taps, -1).reshape(out_channels, channels, kernel, kernel)


def time_convolution(conv, rounds, reps, interleaved):
    """One convolution ``conv`` (``model_convolutions``' key): ms of each direction for funcnet,
    torch and the per-tap weight gradient, and each result's error against torch's."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from funcnet.nn.functional import conv2d

    batch, cin, size, cout, kernel, stride, padding, groups = conv
    rng = np.random.default_rng(0)
    xn = rng.standard_normal((batch, cin, size, size)).astype(np.float32)
    wn = (rng.standard_normal((cout, cin // groups, kernel, kernel)) / math.sqrt(cin // groups * kernel ** 2)).astype(np.float32)
    tx, tw = torch.from_numpy(xn), torch.from_numpy(wn)
    with torch.no_grad():
        ty = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding, groups=groups)
    gn = rng.standard_normal(ty.shape).astype(np.float32)
    tg = torch.from_numpy(gn)
    x, w, g = jnp.asarray(xn), jnp.asarray(wn), jnp.asarray(gn)

    def f(x, w):
        return conv2d(x, w, stride=stride, padding=padding, groups=groups)

    ours = {"forward": jax.jit(f),
            "input gradient": jax.jit(lambda x, w, g: jax.vjp(lambda x: f(x, w), x)[1](g)[0]),
            "weight gradient": jax.jit(lambda x, w, g: jax.vjp(lambda w: f(x, w), w)[1](g)[0])}
    args = {"forward": (x, w), "input gradient": (x, w, g), "weight gradient": (x, w, g)}

    def backward(mask):
        return lambda: torch.ops.aten.convolution_backward(tg, tx, tw, None, [stride] * 2, [padding] * 2, [1, 1],
                                                           False, [0, 0], groups, mask)

    theirs = {"forward": lambda: torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding, groups=groups),
              "input gradient": lambda: backward([True, False, False])()[0],
              "weight gradient": lambda: backward([False, True, False])()[1]}
    runners = {}
    errors = {}
    for d in DIRECTIONS:
        with torch.no_grad():
            want = theirs[d]().numpy()
        runners[f"funcnet {d}"] = lambda d=d: ours[d](*args[d])
        runners[f"torch {d}"] = theirs[d]
        errors[f"funcnet {d}"] = _error(np.asarray(runners[f"funcnet {d}"]()), want)
    if groups == 1:
        per_tap = jax.jit(lambda x, g: weight_grad_per_tap(x, g, kernel, stride, padding))
        runners["per tap weight gradient"] = lambda: per_tap(x, g)
        with torch.no_grad():
            errors["per tap weight gradient"] = _error(np.asarray(per_tap(x, g)), theirs["weight gradient"]().numpy())
    with torch.no_grad():
        ms = interleaved(runners, rounds, reps)
    return ms, errors


def _error(got, want) -> float:
    import numpy as np

    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", help="a model of benchmarks/conv_models.py")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the model's tiny widths at 32 px, batch 2, one round")
    parser.add_argument("--single-thread", action="store_true",
                        help="one core for each framework (torch.set_num_threads(1), XLA without its thread pool)")
    parser.add_argument("--cpu-time", action="store_true", help="time this process's CPU time, not wall time")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.single_thread:
        from funcnet import profile

        profile.one_core()  # JAX and torch on one core, before JAX starts
        profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
    import torch

    import conv
    import conv_models

    if args.model not in conv_models.MODELS:
        parser.error(f"--model {args.model!r}: expected one of {sorted(conv_models.MODELS)}")
    if args.single_thread:
        torch.set_num_threads(1)
    if args.cpu_time:
        conv.CLOCK[0] = time.process_time
    size, batch, rounds, reps = (32, 2, 1, 1) if args.quick else (args.size, args.batch, args.rounds, 3)
    torch.manual_seed(0)
    module = conv_models.MODELS[args.model][0](**(conv_models.QUICK[args.model] if args.quick else {}))
    convs = model_convolutions(module, torch.zeros(batch, 3, size, size))
    load = os.getloadavg()
    print(f"{args.model}, {size} px, batch {batch}: {len(convs)} distinct convolutions of {sum(convs.values())}; "
          f"one core {args.single_thread}, {'CPU' if args.cpu_time else 'wall'} time, load average {load[0]:.1f}")
    print(f"{'in->out size kernel/stride (count)':38} " + " ".join(f"{d + ' f/t':>22}" for d in DIRECTIONS)
          + f" {'per tap / torch':>16}")
    rows, totals, failed = [], collections.Counter(), False
    first = next(iter(convs))
    for key, count in convs.items():
        b, cin, s, cout, k, st, p, groups = key
        ms, errors = time_convolution(key, rounds, reps, conv.interleaved)
        # float32 rounding of sums of up to ``contraction`` products grows as its square root (a
        # random walk of 2^-24 steps), relative to the largest output; 100x for the spread of sizes
        contraction = max(cin // groups * k * k, cout // groups * k * k, b * (s // st) ** 2)
        bad = {n: e for n, e in errors.items() if not e < 100 * math.sqrt(contraction) * 2.0 ** -24}
        failed |= bool(bad)
        for d in DIRECTIONS:
            if not (d == "input gradient" and key == first):
                totals[f"funcnet {d}"] += count * ms[f"funcnet {d}"]
                totals[f"torch {d}"] += count * ms[f"torch {d}"]
        if "per tap weight gradient" in ms:
            totals["per tap weight gradient"] += count * ms["per tap weight gradient"]
        else:
            totals["per tap weight gradient"] += count * ms["funcnet weight gradient"]
        label = f"{cin}->{cout}{'/g' + str(groups) if groups > 1 else ''} {s} px {k}x{k}/{st} ({count})"
        cells = " ".join(f"{ms['funcnet ' + d]:9.2f}/{ms['torch ' + d]:<9.2f}{'*' if d == 'input gradient' and key == first else ' '}"
                         for d in DIRECTIONS)
        tap = ms.get("per tap weight gradient")
        print(f"{label:38} {cells} {tap / ms['torch weight gradient'] if tap else float('nan'):>16.2f}"
              + (f"  FAILED {bad}" if bad else ""))
        rows.append({"convolution": dict(zip(("batch", "in", "size", "out", "kernel", "stride", "padding", "groups"), key)),
                     "count": count, "ms": ms, "errors": errors, "ok": not bad})
    ratios = {d: totals[f"funcnet {d}"] / totals[f"torch {d}"] if totals[f"torch {d}"] else math.nan
              for d in DIRECTIONS}  # nan: only the first layer's input gradient, which is not counted
    funcnet_all = sum(totals[f"funcnet {d}"] for d in DIRECTIONS)
    torch_all = sum(totals[f"torch {d}"] for d in DIRECTIONS)
    print("totals (ms, each convolution times its count; * not counted): "
          + ", ".join(f"{d} funcnet {totals['funcnet ' + d]:.1f} / torch {totals['torch ' + d]:.1f} = {ratios[d]:.2f}"
                      for d in DIRECTIONS))
    print(f"all three: funcnet {funcnet_all:.1f} ms, torch {torch_all:.1f} ms, funcnet/torch {funcnet_all / torch_all:.2f}; "
          f"the weight gradients per tap where there is one group: "
          f"{totals['per tap weight gradient'] / totals['torch weight gradient']:.2f} of torch's")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "size": size, "batch": batch, "single_thread": args.single_thread,
            "cpu_time": args.cpu_time, "load_before": load, "load_after": os.getloadavg(), "rows": rows,
            "totals_ms": dict(totals), "funcnet_over_torch": ratios}, indent=1))
    if failed:
        print("conv_directions: a result differs from torch's beyond float32 rounding")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
