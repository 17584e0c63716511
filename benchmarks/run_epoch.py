"""run_epoch (one compiled lax.scan per epoch) vs make_step dispatched batch by batch.

Both run the same batches from the same state (checked: equal params), so the ratio
is the cost of a Python-level loop of dispatches and per-step host round trips.

    python benchmarks/run_epoch.py [--batch-size 32 128] [--epochs 5] [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np
import optax
from rich.console import Console
from rich.table import Table

from funcnet import data, nn, train


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="write the rows the table prints to this JSON file")
    args = parser.parse_args(argv)

    (x, y), _ = data.load("digits")
    model, tx = nn.MLP([64, 128, 10]), optax.adam(1e-3)
    step = train.make_step(model, tx)
    table = Table(title=f"digits, MLP 64-128-10, {args.epochs} epochs per run, median of {args.repeat}")
    for col in ("batch", "steps/epoch", "make_step loop (s)", "run_epoch scan (s)", "speed-up", "max |param diff|"):
        table.add_column(col, justify="right")
    rows = []
    for bs in args.batch_size:
        times = {True: [], False: []}
        finals = {}
        for scan in (True, False):
            for r in range(args.repeat + 1):  # the first run compiles and is not counted
                state = train.create_train_state(model, tx, jax.random.key(0))
                t0 = time.perf_counter()
                for _ in range(args.epochs):
                    state, metrics = train.run_epoch(step, state, x, y, batch_size=bs, scan=scan)
                jax.block_until_ready((state, metrics))
                if r:
                    times[scan].append(time.perf_counter() - t0)
            finals[scan] = state.params
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree.leaves(finals[True]), jax.tree.leaves(finals[False])))
        t_scan, t_loop = np.median(times[True]), np.median(times[False])
        rows.append({"batch": bs, "steps": len(x) // bs, "loop_seconds": float(t_loop), "scan_seconds": float(t_scan),
                     "speedup": float(t_loop / t_scan), "max_param_diff": diff,
                     "loop_all": times[False], "scan_all": times[True]})
        table.add_row(str(bs), str(len(x) // bs), f"{t_loop:.4f}", f"{t_scan:.4f}", f"{t_loop / t_scan:.2f}x",
                      f"{diff:.1e}")
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"epochs": args.epochs, "repeat": args.repeat, "rows": rows}, indent=1) + "\n")
    return 0 if all(r["max_param_diff"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
