"""Ways to write a small depthwise convolution's tap sum for XLA:CPU, each against torch.

The depthwise rows of ``benchmarks/conv.py`` whose planes are tiny (8x576x4x4 5x5, 8x384x7x7
7x7) stay at 1.3-3.6x torch's forward time. This script times the formulation funcnet uses
(``depthwise_conv``) beside the others tried, on one thread, CPU time, interleaved rounds, and
checks each against ``torch.nn.functional.conv2d`` (exit 1 beyond float32 rounding of the sum):

- ``funcnet``: ``depthwise_conv`` as the rule picks it (a flattened plane up to 4 wide, row
  bands past that; docs/design.md, "Convolution strategy");
- ``mask by product``: the flattened plane with the wrapped columns zeroed by multiplying the
  weight with a 0/1 row instead of a select;
- ``channels-last flat``: the plane flattened channels-last behind a conditional (so the layout
  transposes stay out of the loop), the vector along the channels;
- ``plane matrix``: one (positions x positions) matrix per channel gathered from the weight, as
  a batched ``einsum`` (``ncq,cqp->ncp``);
- ``plane matrix, summed``: the same as a broadcast product summed over the input positions.

Batch 1 against a larger batch separates the call's fixed cost from the loop's cost per example.

``--weight-grad`` times the depthwise weight gradient's two forms instead (stride 1, "same"
padding), each against torch's: ``banded`` (one batched matrix multiply per kernel row over all
padded columns) and ``batch-summed taps`` (each tap's products summed over the batch first);
the rule (``conv_depthwise.BAND_WIDTH``) takes the banded form up to 2 kernel widths of padded
input with every tap live. The input is a ReLU's output (about half zeros), as in a model.

    python benchmarks/conv_tapsum.py [--shapes 8x576x4x5 32x576x4x5 ...] [--rounds 7] [--json out.json]
    python benchmarks/conv_tapsum.py --weight-grad [--shapes 8x240x14x5 64x72x56x3x2 ...] [--baseline OLD.py]

A fifth field of a ``--weight-grad`` shape is the stride (padding stays ``kernel // 2``).
``--baseline OLD.py`` (another ``conv_depthwise.py``, say from ``git show``) adds its weight
gradient (``_weight_grad``, as its rule picks) as a column timed in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import conv  # noqa: E402  (its interleaved rounds and clock)

# batch x channels x spatial x kernel (stride 1, "same" padding)
SHAPES = ["1x576x4x5", "8x576x4x5", "32x576x4x5", "8x384x7x7", "8x96x14x7"]
WGRAD_SHAPES = ["8x240x14x5", "8x120x14x5", "64x96x14x7", "8x40x16x7", "8x576x7x5", "64x240x2x5", "8x384x7x7",
                "8x80x8x7", "8x16x4x5"]
QUICK_SHAPES = ["2x8x4x5"]


def _variants(x_shape, kernel):
    """The formulations, each ``f(x, w)`` of an NCHW input and a ``(C, 1, k, k)`` weight."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from funcnet.nn.functional.conv_depthwise import depthwise_conv, tree_sum

    batch, channels, height, width = x_shape
    pad = kernel // 2
    pads = ((pad, pad), (pad, pad))
    column = np.arange(height * width) % width
    inside = {(i, j): ((column + j - pad >= 0) & (column + j - pad < width))
              for i in range(kernel) for j in range(kernel)}
    # plane matrix: input position q meets output position p through tap index[q, p] (k*k: none)
    index = np.full((height * width, height * width), kernel * kernel, np.int32)
    for p in range(height * width):
        for i in range(kernel):
            for j in range(kernel):
                y, x = p // width + i - pad, p % width + j - pad
                if 0 <= y < height and 0 <= x < width:
                    index[y * width + x, p] = i * kernel + j

    def ours(x, w):
        return depthwise_conv(x, w, (1, 1), pads, (1, 1))

    def mask_by_product(x, w):
        flat = jnp.pad(x.reshape(batch, channels, -1), ((0, 0), (0, 0), (pad * width + pad,) * 2))
        terms = [jax.lax.slice_in_dim(flat, i * width + j, i * width + j + height * width, axis=2)
                 * (w[:, 0, i, j].reshape(-1, 1) * inside[i, j].astype(np.float32))
                 for i in range(kernel) for j in range(kernel)]
        return tree_sum(terms).reshape(x_shape)

    def channels_last_flat(x, w):
        flat = jnp.transpose(x, (0, 2, 3, 1)).reshape(batch, height * width, channels)
        flat = jnp.pad(flat, ((0, 0), (pad * width + pad,) * 2, (0, 0)))
        taps = jnp.transpose(w.reshape(channels, -1))

        def body(flat, taps):
            return tree_sum([jnp.where(inside[i, j][:, None], jax.lax.slice_in_dim(
                flat, i * width + j, i * width + j + height * width, axis=1), 0.0) * taps[i * kernel + j]
                for i in range(kernel) for j in range(kernel)])

        first = w.reshape(-1)[0]
        out = jax.lax.cond(first == first, body, body, flat, taps)
        return jnp.transpose(out.reshape(batch, height, width, channels), (0, 3, 1, 2))

    def plane(w):
        return jnp.concatenate([w.reshape(channels, -1), jnp.zeros((channels, 1), w.dtype)], axis=1)[:, index]

    def plane_matrix(x, w):
        return jnp.einsum("ncq,cqp->ncp", x.reshape(batch, channels, -1), plane(w),
                          precision=jax.lax.Precision.HIGHEST).reshape(x_shape)

    def plane_matrix_summed(x, w):
        return jnp.sum(x.reshape(batch, channels, -1, 1) * plane(w)[None], axis=2).reshape(x_shape)

    return {"funcnet": ours, "mask by product": mask_by_product, "channels-last flat": channels_last_flat,
            "plane matrix": plane_matrix, "plane matrix, summed": plane_matrix_summed}


BASELINE = []  # --baseline: another conv_depthwise module


def _weight_grad_variants(x_shape, kernel, stride=1):
    """The weight gradient's forms, each ``f(x, g)`` of the layer's input and output gradient."""
    import jax.numpy as jnp

    from funcnet.nn.functional import conv_depthwise as dw

    pad = kernel // 2
    pads = ((pad, pad), (pad, pad))
    w = jnp.zeros((x_shape[1], 1, kernel, kernel), jnp.float32)
    st = (stride, stride)
    forms = {"funcnet": lambda x, g: dw._weight_grad(x, g, w, st, pads, (1, 1))}
    if BASELINE:
        forms["baseline"] = lambda x, g: BASELINE[0]._weight_grad(x, g, w, st, pads, (1, 1))
    if stride == 1:
        forms["banded"] = lambda x, g: dw._weight_grad_banded(x, g, (kernel, kernel), pads)
        forms["batch-summed taps"] = lambda x, g: dw._weight_grad_taps(x, g, w, st, pads, (1, 1))
    return forms


def _measure(spec, variants, operands, ref, torch_call, tol, rounds):
    """Each variant jitted and checked against ``ref``, then timed with ``torch_call`` in
    ``conv.interleaved``'s rounds: the row of one shape."""
    import jax
    import numpy as np

    runners, errors = {}, {}
    for name, f in variants.items():
        jitted = jax.jit(f)
        errors[name] = float(np.max(np.abs(np.asarray(jitted(*operands)) - ref)))
        runners[name] = lambda jitted=jitted: jitted(*operands)
    runners["torch"] = torch_call
    ms = conv.interleaved(runners, rounds, reps=5)
    return {"shape": spec, "ms": ms, "max_abs_err": errors, "tolerance": tol,
            "ok": all(e <= tol for e in errors.values())}


def run_weight_grad_shape(spec: str, rounds: int) -> dict:
    import jax.numpy as jnp
    import numpy as np
    import torch

    batch, channels, size, kernel, *rest = (int(v) for v in spec.split("x"))
    stride = rest[0] if rest else 1
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1
    rng = np.random.default_rng(0)
    x_np = np.maximum(rng.standard_normal((batch, channels, size, size)), 0).astype(np.float32)
    g_np = rng.standard_normal((batch, channels, out, out)).astype(np.float32)
    tw = torch.zeros((channels, 1, kernel, kernel), requires_grad=True)
    tx, tg = torch.from_numpy(x_np), torch.from_numpy(g_np)

    def torch_step():
        tw.grad = None
        torch.nn.functional.conv2d(tx, tw, None, stride, kernel // 2, 1, channels).backward(tg)
        return tw.grad

    ref = torch_step().numpy()
    # float32 sums of batch * out**2 products of unit-scale terms
    tol = 4 * batch * out * out * 2.0 ** -24 * 4
    return _measure(spec, _weight_grad_variants(x_np.shape, kernel, stride), (jnp.asarray(x_np), jnp.asarray(g_np)),
                    ref, torch_step, tol, rounds)


def run_shape(spec: str, rounds: int) -> dict:
    import jax.numpy as jnp
    import numpy as np
    import torch

    batch, channels, size, kernel = (int(v) for v in spec.split("x"))
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((batch, channels, size, size)).astype(np.float32)
    w_np = (rng.standard_normal((channels, 1, kernel, kernel)) / kernel).astype(np.float32)
    tx, tw = torch.from_numpy(x_np), torch.from_numpy(w_np)

    def torch_fwd():
        with torch.no_grad():
            return torch.nn.functional.conv2d(tx, tw, None, 1, kernel // 2, 1, channels)

    ref = torch_fwd().numpy()
    # float32 sums of at most k*k products of unit-scale inputs and 1/k-scale weights
    tol = 4 * kernel * kernel * 2.0 ** -24 * max(1.0, float(np.max(np.abs(ref))))
    return _measure(spec, _variants(x_np.shape, kernel), (jnp.asarray(x_np), jnp.asarray(w_np)), ref, torch_fwd,
                    tol, rounds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=None, help="BATCHxCHANNELSxSIZExKERNEL (default: the sweep's)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one tiny shape, one round")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--weight-grad", action="store_true", help="the depthwise weight gradient's forms instead")
    parser.add_argument("--baseline", default=None, metavar="FILE",
                        help="with --weight-grad: another conv_depthwise.py whose weight gradient is timed beside")
    args = parser.parse_args(argv)
    if args.baseline:
        import importlib.util

        spec = importlib.util.spec_from_file_location("baseline_conv_depthwise", args.baseline)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        BASELINE.append(module)
    import torch

    torch.set_num_threads(1)
    conv.CLOCK[0] = time.process_time  # CPU time, as conv.py's --cpu-time
    run = run_weight_grad_shape if args.weight_grad else run_shape
    shapes = args.shapes or (QUICK_SHAPES if args.quick else WGRAD_SHAPES if args.weight_grad else SHAPES)
    rows = [run(s, 1 if args.quick else args.rounds) for s in shapes]
    names = list(dict.fromkeys(n for r in rows for n in r["ms"] if n != "torch"))
    print(("ms weight gradient (torch: forward and backward)" if args.weight_grad else "ms forward")
          + " (CPU time, one thread), and over torch's:")
    print(f"{'shape':<14}{'torch':>8}" + "".join(f"{n:>24}" for n in names))
    for r in rows:
        t = r["ms"]["torch"]
        cells = "".join((f"{r['ms'][n]:>12.3f} ({r['ms'][n] / t:4.2f}x)" if n in r["ms"] else f"{'-':>20}") + " " * 3
                        for n in names)
        print(f"{r['shape']:<14}{t:>8.3f}" + cells + ("" if r["ok"] else "  MISMATCH"))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    # one core for XLA as for torch, before JAX starts (a caller's process keeps its own)
    from funcnet import profile

    profile.one_core()
    profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
    sys.exit(main())
