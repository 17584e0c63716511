"""Which bf16 matmuls XLA:CPU runs on the CPU's bf16 units: one dot form per row, on one thread.

    python benchmarks/bf16_dots.py [--tokens 512] [--width 768] [--layers 3] [--repeat 5]

A GPT-2-width MLP chain (``h + W2 gelu(W1 h)``, ``--layers`` times, weights C x 4C) in bf16,
forward and the gradient of a float32 loss, with its matmuls written four ways:

- ``bf16 result, (out, in) weights``: ``h @ w.T`` as ``funcnet.nn.Linear`` computes it (the
  policy's bf16 copy of torch's layout), each dot's result bf16;
- ``bf16 result, (in, out) weights``: ``h @ w`` (transformers' ``Conv1D`` layout);
- ``float32 sum, (out, in) weights``: ``preferred_element_type=float32``, then cast to bf16;
- ``float32 sum, (in, out) weights``: the same with ``(in, out)`` weights;

and the float32 chain for reference. The compiled program's dots are read back: how many of
them take bf16 operands (the rest were rewritten as float32 dots with conversions around
them). Times are this process's CPU time, medians of ``--repeat`` calls. The values agree
within bf16 rounding in every form (the script checks them against the float32 chain).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time


def chain(form: str, layers: int):
    import jax
    import jax.numpy as jnp

    wide = form.startswith("float32 sum")
    in_out = "(in, out)" in form

    def mm(h, w):
        w = w if in_out else w.T
        if wide:
            return jnp.matmul(h, w, preferred_element_type=jnp.float32).astype(h.dtype)
        return h @ w

    def forward(ws, x):
        dtype = jnp.float32 if form == "float32" else jnp.bfloat16
        ws, h = [w.astype(dtype) for w in ws], x.astype(dtype)
        for i in range(layers):
            h = h + mm(jax.nn.gelu(mm(h, ws[2 * i])), ws[2 * i + 1])
        return h

    def loss(ws, x):
        return jnp.mean(forward(ws, x).astype(jnp.float32) ** 2)

    return jax.jit(forward), jax.jit(jax.grad(loss))


def bf16_dots(compiled_text: str) -> tuple[int, int]:
    """(dots with bf16 operands, all dots) in a compiled CPU program: XLA's dot instructions and its
    library fusions' computations that hold one."""
    comps = re.split(r"\n(?=\S)", compiled_text)
    dots = bf16 = 0
    for comp in comps:
        for line in comp.splitlines():
            m = re.search(r"= \S+ dot\((%[\w.\-]+), (%[\w.\-]+)\)", line)
            if not m:
                continue
            dots += 1
            types = [re.search(rf"(?<![\w.]){re.escape(op.lstrip('%'))}(?:: | = )(\w+)\[", comp) for op in m.groups()]
            bf16 += all(t is not None and t.group(1) == "bf16" for t in types)
    return bf16, dots


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    t, c, n = args.tokens, args.width, args.layers
    x = jnp.asarray(rng.standard_normal((t, c)), jnp.float32)
    forms = ["float32", "bf16 result, (out, in) weights", "bf16 result, (in, out) weights",
             "float32 sum, (out, in) weights", "float32 sum, (in, out) weights"]
    flops = 2 * 2 * t * c * 4 * c * n  # two C x 4C matmuls per layer
    print(f"backend {jax.default_backend()}, one thread, {n} layers of {c} -> {4 * c} -> {c}, {t} tokens; "
          f"CPU ms, medians of {args.repeat}")
    print(f"{'dots':<32} {'forward ms':>10} {'GFLOP/s':>8} {'bf16 dots':>10} | {'gradient ms':>11} {'GFLOP/s':>8} "
          f"{'bf16 dots':>10} | max rel diff vs float32")
    ref, ref_ws = None, None
    for form in forms:
        if form == "float32":  # Linear's (out, in) weights; the (in, out) forms get the same, transposed
            # std 1/sqrt(fan_in): the branch is as large as the residual, so every matmul shows in the output
            ref_ws = [jnp.asarray(rng.standard_normal(shape) / np.sqrt(shape[1]), jnp.float32)
                      for shape in [(4 * c, c), (c, 4 * c)] * n]
        ws = [w.T for w in ref_ws] if "(in, out)" in form else ref_ws
        fwd, grad = chain(form, n)
        cells = []
        for fn, work in ((fwd, flops), (grad, 3 * flops)):
            counted = bf16_dots(fn.lower(ws, x).compile().as_text())
            jax.block_until_ready(fn(ws, x))
            times = []
            for _ in range(args.repeat):
                start = time.process_time()
                jax.block_until_ready(fn(ws, x))
                times.append(time.process_time() - start)
            ms = statistics.median(times) * 1e3
            cells.append((ms, work / ms / 1e6, counted))
        out = np.asarray(fwd(ws, x), np.float32)
        if ref is None:
            ref = out
        diff = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        print(f"{form:<32} " + " | ".join(f"{ms:>10.1f} {rate:>8.1f} {f'{b}/{d}':>10}" for ms, rate, (b, d) in cells)
              + f" | {diff:.1e}")
        # bf16 keeps 8 bits: each layer's output rounds to 2**-9 relative, a sum of 2 n such errors
        if diff > 2 * n * 2.0 ** -8:
            print(f"bf16_dots: {form} differs from float32 by {diff:.2e}, beyond bf16 rounding")
            return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from funcnet import profile

    profile.one_core()  # one core for XLA (before JAX starts), as its dots are compared one thread each
    profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
    sys.exit(main())
