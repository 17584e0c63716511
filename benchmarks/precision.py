"""Training-step time and compiled memory in fp32, bf16 and fp16 (with dynamic loss scaling).

Each precision compiles the same ``make_step`` (MLP, Adam) with its policy; the
time is the median of timed calls on one fixed batch, the memory XLA's analysis
of the compiled step with the state donated (``funcnet.memory.measure``). The
master weights and Adam's moments stay float32 in every mode, so only the
activations and the low-precision copies of the weights change size.

XLA on CPU rewrites bfloat16/float16 matmuls as float32 ones with conversions
around them (the "matmul dtypes" column reads them from the compiled program), so
here the low-precision steps pay for conversions and float32 temporaries and may be
slower and larger; on GPUs and TPUs the matmuls run on bf16/fp16 units. The script
reports what it measures.

    python benchmarks/precision.py [--sizes 784 1024 1024 10] [--batch 256] [--repeat 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

import jax
import optax
from rich.console import Console
from rich.table import Table

from funcnet import memory, nn, profile, train
from funcnet.precision import DynamicLossScale

MODES = {"fp32": None, "bf16": None, "fp16": DynamicLossScale}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[784, 1024, 1024, 10])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=5, help="calls per timed sample")
    parser.add_argument("--json", type=Path, default=None, help="write the rows the table prints to this JSON file")
    args = parser.parse_args(argv)

    model, tx = nn.MLP(args.sizes), optax.adam(1e-3)
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (args.batch, args.sizes[0]))
    y = jax.random.randint(ky, (args.batch,), 0, args.sizes[-1])
    rows = {}
    for i, (mode, loss_scale) in enumerate(MODES.items()):
        step = train.make_step(model, tx, policy=mode, donate=False)  # timed calls reuse one state
        state = train.create_train_state(model, tx, jax.random.key(i + 1), policy=mode,
                                         loss_scale=None if loss_scale is None else loss_scale())
        bench = profile.benchmark(step, state, (x, y), warmup=2, repeat=args.repeat, number=args.number)
        compiled = jax.jit(step.raw, donate_argnums=0).lower(state, (x, y)).compile()
        mem = memory.measure(compiled)
        dots = collections.Counter(re.findall(r"= (\w+)\[[\d,]*\]\S* dot\(", compiled.as_text()))
        _, metrics = step(state, (x, y))
        rows[mode] = (bench, mem, float(metrics["loss"]), " ".join(f"{n}x{t}" for t, n in sorted(dots.items())))

    n_params = memory.mlp_params(args.sizes)
    base_t, base_m = rows["fp32"][0].median, rows["fp32"][1]
    table = Table(title=f"make_step, MLP {'-'.join(map(str, args.sizes))} ({n_params / 1e6:.2f}M params), "
                        f"Adam, batch {args.batch}, {jax.devices()[0].device_kind}; median of {args.repeat}x"
                        f"{args.number} calls")
    for col in ("mode", "step (ms)", "time vs fp32", "compiled total (MB)", "temps (MB)", "temps vs fp32",
                "matmul dtypes", "first loss"):
        table.add_column(col, justify="right")
    for mode, (bench, mem, loss, dots) in rows.items():
        table.add_row(mode, f"{bench.median * 1e3:.2f}", f"{bench.median / base_t:.2f}x", f"{mem.total / 1e6:.2f}",
                      f"{mem.temps / 1e6:.2f}", f"{mem.temps / max(base_m.temps, 1):.2f}x", dots, f"{loss:.4f}")
    Console().print(table)
    print("time vs fp32 > 1 means slower than fp32; temps are XLA's scratch buffers (activations and the "
          "low-precision weight copies), total = arguments + outputs + temps - donated")
    spread = {m: (min(r[0].samples) * 1e3, max(r[0].samples) * 1e3) for m, r in rows.items()}
    print("per-sample range (ms): " + ", ".join(f"{m} {lo:.2f}-{hi:.2f}" for m, (lo, hi) in spread.items()))
    if args.json:
        out = [{"mode": mode, "ms_per_step": bench.median * 1e3, "ms_samples": [t * 1e3 for t in bench.samples],
                "time_vs_fp32": bench.median / base_t, "total_bytes": mem.total, "temps_bytes": mem.temps,
                "temps_vs_fp32": mem.temps / max(base_m.temps, 1), "matmul_dtypes": dots, "first_loss": loss}
               for mode, (bench, mem, loss, dots) in rows.items()]
        args.json.write_text(json.dumps({"sizes": args.sizes, "params": n_params, "batch": args.batch,
                                         "repeat": args.repeat, "number": args.number,
                                         "device": jax.devices()[0].device_kind, "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
