"""Where a converted model's train step spends its time, on one core: funcnet's kernels from a
``jax.profiler`` trace, summed by kind of compiled op, beside torch.profiler's self time per op.

    python benchmarks/step_profile.py [--model resnet18] [--size 224] [--batch 8] [--steps 3]
                                      [--top 12] [--quick] [--json out.json]

The model is one of ``benchmarks/conv_models.py``'s torch.nn models, converted by
``funcnet.interop.convert``; the step is the SGD-momentum train step the whole-model grid times.
The process runs on one core (``funcnet.profile.one_core``, torch with one thread), so the
kernels of a step run one after another and their sum is the step's time less the runtime's own
work between them. XLA names each kernel after the fusion it compiled (``ynn_fusion.12``,
``transpose_copy_fusion.3``, ...); the kinds group them:

- ``convolutions and matmuls``: YNNPACK's fused convolutions, matrix multiplies and the
  reductions it takes (``ynn_fusion``), XLA's own ``dot`` and ``convolution``;
- ``layout copies``: fusions whose root is a transpose or a copy (``transpose_copy_fusion``,
  ``copy_bitcast_fusion``, ``bitcast_copy_fusion``, ``wrapped_copy``): operands laid out again
  for the next kernel, e.g. NCHW activations to channels-last for a convolution, the
  batch-minor ``(C, H, W, N)`` operand of a weight gradient, OIHW weights to HWIO;
- ``elementwise and the rest``: every other fusion (normalization, activations, pads, slices,
  the tap sums of depthwise convolutions).

A conditional (``cond``: ``funcnet.nn.functional._common.apart``) is reported by the trace
around the kernels of its branch, which are reported too: it is left out of the sums. Each
kind's share, the top fusions by time (with the operation XLA recorded for them) and torch's
top operations are printed; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import collections
import copy
import glob
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = (("convolutions and matmuls", re.compile(r"^(ynn_fusion|dot|convolution)")),
         ("layout copies", re.compile(r"^(\w*transpose\w*|\w*copy\w*|wrapped_copy)(\.\d+)*(\.clone)?$")),
         ("elementwise and the rest", re.compile(r".")))
# trace events that are not kernels, or enclose kernels reported on their own
_NOT_KERNELS = re.compile(r"^(\$|PjitFunction|ThunkExecutor|TfrtCpu|XlaModule|jit_|Slinky|Common|Parse|Handle inputs|"
                          r"Allocate|end: |cond(\.\d+)*(\.clone)?$|while(\.\d+)*$)")


def kind_of(name: str) -> str:
    """The kind (``KINDS``) of a compiled kernel named ``name`` in the trace."""
    return next(kind for kind, pattern in KINDS if pattern.match(name))


def kernel_times(trace_dir: str, steps: int) -> dict[str, float]:
    """Milliseconds per step of each kernel in the trace under ``trace_dir`` (``steps`` steps)."""
    (path,) = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
    totals = collections.Counter()
    for event in json.load(gzip.open(path))["traceEvents"]:
        if event.get("ph") == "X" and "dur" in event and not _NOT_KERNELS.match(event["name"]):
            totals[event["name"]] += event["dur"] / 1e3 / steps
    return dict(totals)


def _ops_recorded(hlo_text: str) -> dict[str, str]:
    """For each instruction of the compiled HLO, the operation JAX recorded for it (op_name)."""
    ops = {}
    for match in re.finditer(r"\n\s*(?:ROOT )?%(\S+) = [^\n]*?op_name=\"([^\"]*)\"", hlo_text):
        ops[match.group(1)] = match.group(2)
    return ops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", help="a model of benchmarks/conv_models.py")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="steps traced (and timed) after two warm-up steps")
    parser.add_argument("--top", type=int, default=12, help="fusions and torch ops listed")
    parser.add_argument("--quick", action="store_true", help="the model's tiny widths at 32 px, batch 2")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from funcnet import profile

    profile.one_core()
    profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import torch

    import conv_models
    from funcnet import interop, nn, train

    if args.model not in conv_models.MODELS:
        parser.error(f"--model {args.model!r}: expected one of {sorted(conv_models.MODELS)}")
    torch.set_num_threads(1)
    size, batch = (32, 2) if args.quick else (args.size, args.batch)
    torch.manual_seed(0)
    module = conv_models.MODELS[args.model][0](**(conv_models.QUICK[args.model] if args.quick else {}))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    model, params, model_state = interop.convert(copy.deepcopy(module), torch.from_numpy(x))
    tx = optax.sgd(0.01, momentum=0.9)
    step = train.make_step(model, tx, donate=False)
    state = train.create_train_state(model, tx, jax.random.key(0), params=params, model_state=model_state)
    data = (jnp.asarray(x), jnp.asarray(y))

    def ours():
        return step(state, data)[1]["loss"].block_until_ready()

    _, theirs = conv_models._torch_runners(copy.deepcopy(module), x, y, compiled=False)  # the grid's torch step
    xt = torch.from_numpy(x)

    # the eval logits against torch's (a train step's loss differs by its dropout masks), the
    # grid's check: sums of up to ~10^4 products a layer through ~20 layers in float32
    module.eval()
    with torch.no_grad():
        ref = module(xt).numpy()
    # jitted: run eagerly, each of the model's operations would be compiled on its own
    out = np.asarray(jax.jit(lambda p, s, x: nn.call(model, p, s, x, train=False)[0])(params, model_state, data[0]))
    err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-12))
    if not err < 1e-3:
        print(f"FAILED: the converted model's eval logits are {err:.1e} (relative) from torch's")
        return 1
    ms = {}
    for name, run in (("funcnet", ours), ("torch", theirs)):
        run()
        start = time.process_time()
        for _ in range(args.steps):
            run()
        ms[name] = (time.process_time() - start) / args.steps * 1e3
    with tempfile.TemporaryDirectory() as trace_dir:
        with profile.trace(trace_dir):
            for _ in range(args.steps):
                ours()
        kernels = kernel_times(trace_dir, args.steps)
    ops = _ops_recorded(step.lower(state, data).compile().as_text())
    by_kind = collections.Counter()
    for name, t in kernels.items():
        by_kind[kind_of(name)] += t
    with torch.profiler.profile() as prof:
        for _ in range(args.steps):
            theirs()
    torch_ops = sorted(((e.key, e.self_cpu_time_total / 1e3 / args.steps) for e in prof.key_averages()),
                       key=lambda kv: -kv[1])
    torch_total = sum(t for _, t in torch_ops)
    kernel_total = sum(by_kind.values())

    print(f"{args.model} converted, {size} px, batch {batch}, SGD-momentum train step, one core, CPU ms per step "
          f"({args.steps} steps): funcnet {ms['funcnet']:.1f}, torch eager {ms['torch']:.1f}")
    print(f"funcnet's kernels (jax.profiler, {kernel_total:.1f} ms a step while traced), by kind:")
    for kind, _ in KINDS:
        print(f"  {by_kind[kind]:9.1f} ms  {100 * by_kind[kind] / kernel_total:5.1f}%  {kind}")
    print(f"funcnet's top {args.top} kernels:")
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:args.top]
    for name, t in top:
        print(f"  {t:9.2f} ms  {name:32} {kind_of(name):26} {ops.get(name, '')[-70:]}")
    print(f"torch's top {args.top} operations (torch.profiler self CPU, {torch_total:.1f} ms a step while profiled):")
    for name, t in torch_ops[:args.top]:
        print(f"  {t:9.2f} ms  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "size": size, "batch": batch, "steps": args.steps, "step_ms": ms,
            "kernel_ms_by_kind": dict(by_kind), "kernel_ms_total": kernel_total,
            "top_kernels": [{"name": n, "ms": t, "kind": kind_of(n), "op": ops.get(n, "")} for n, t in top],
            "torch_top_ops": [{"name": n, "ms": t} for n, t in torch_ops[:args.top]],
            "torch_ms_total": torch_total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
