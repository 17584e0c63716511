"""Steps per second of data-parallel training on 1, 2, 4 and 8 devices, three JAX forms.

Same global batch, same model; only the number of devices it is split over changes.
On a CPU-only machine the devices are simulated: they all share this machine's cores,
so past the core count more devices cannot go faster and the table measures the overhead
of splitting (dispatch, all-reduce, per-device launch). The figure that matters, the
scaling, comes from running this script on real accelerators (it uses the devices it finds).

    python benchmarks/data_parallel.py [--devices 1 2 4 8] [--batch-size 512] [--steps 50] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batch-size", type=int, default=512, help="global batch")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50, help="steps per timed sample")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the rows the table prints to this JSON file")
    args = parser.parse_args(argv)

    from funcnet import parallel

    parallel.simulate_cpu_devices(max(args.devices))  # before JAX starts; no effect on GPUs/TPUs
    import jax
    import optax
    from rich.console import Console
    from rich.table import Table

    from funcnet import data, nn, train

    (x, y), _ = data.load("synthetic", n_train=args.batch_size * 4, features=64)
    batches = [(x[i::4], y[i::4]) for i in range(4)]
    model, tx = nn.MLP([64, args.hidden, args.hidden, 10]), optax.sgd(0.01)
    platform = jax.devices()[0].platform
    cores = os.cpu_count()
    title = (f"MLP 64-{args.hidden}-{args.hidden}-10, global batch {args.batch_size}, SGD; "
             f"{platform} devices" + (f" simulated on {cores} CPU cores" if platform == "cpu" else ""))
    table = Table(title=title)
    for col in ("devices", "per-device batch", *parallel.KINDS, "vs 1 device"):
        table.add_column(col, justify="right")

    baseline, out = None, []
    for n in args.devices:
        row = [str(n), str(args.batch_size // n)]
        rates = []
        for kind in parallel.KINDS:
            dp = parallel.data_parallel(model, tx, kind=kind, devices=n)
            state = dp.put_state(train.create_train_state(model, tx, jax.random.key(0)))
            placed = [dp.put_batch(b) for b in batches]
            state, _ = dp.step(state, placed[0])  # compile
            samples = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                pending = None
                for i in range(args.steps):
                    state, metrics = dp.step(state, placed[i % len(placed)])
                    # two steps in flight at most (XLA:CPU can deadlock with dozens queued)
                    jax.block_until_ready(pending)
                    pending = metrics
                jax.block_until_ready(state)
                samples.append(args.steps / (time.perf_counter() - start))
            rates.append(float(np.median(samples)))
            row.append(f"{rates[-1]:.0f} steps/s")
        best = max(rates)
        baseline = baseline or best
        row.append(f"{best / baseline:.2f}x")
        out.append({"devices": n, "per_device_batch": args.batch_size // n,
                    "steps_per_s": dict(zip(parallel.KINDS, rates)), "best_vs_one_device": best / baseline})
        table.add_row(*row)
    console = Console()
    console.print(table)
    if platform == "cpu":
        console.print(f"note: the simulated devices share this machine's {cores} CPU cores. Up to {cores} devices "
                      f"can gain by using cores one device's program leaves idle; beyond that they compete "
                      f"for the same cores, and the ratio is the cost of splitting, not a measure of scaling. "
                      f"Run on GPUs/TPUs for the figure that matters.")
    if args.json:
        args.json.write_text(json.dumps({"platform": platform, "cores": cores, "hidden": args.hidden,
                                         "batch_size": args.batch_size, "steps": args.steps, "repeat": args.repeat,
                                         "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
