"""What ``funcnet train --stream`` costs against the in-memory run, from the command line.

Each round runs, back to back in new processes, the default ``funcnet train`` (digits MLP,
data in memory, one compiled ``lax.scan`` per epoch) and ``funcnet train --stream DIR
--workers K`` for each K (the records read from disk by ``funcnet.loader``, a Python loop of
the compiled step). Per run: the training seconds the command prints and the wall time of
the whole process (start-up included); per data source: medians over rounds, and the
medians of per-round ratios over the in-memory run, so the load hits them alike. An
untimed first round writes DIR's records and fills the compile cache (a folder of its own),
so every timed run starts warm. The streamed runs must end with the same parameters
whatever K (the loader's batches do not depend on the workers); the script exits 1
otherwise.

    python benchmarks/stream_train.py [--rounds 3] [--workers 0 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def run(argv: list[str], env: dict) -> tuple[float, float]:
    """(training seconds the command printed, wall seconds of the process)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "funcnet.cli", "train", *argv, "--quiet"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"funcnet train {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-600:]}")
    trained = re.search(r"^trained .* in ([\d.]+) s:", done.stdout, re.M)
    if not trained:
        raise RuntimeError(f"funcnet train {' '.join(argv)} printed no 'trained ... in N s' line:\n{done.stdout[-600:]}")
    return float(trained.group(1)), wall


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--json", type=Path, default=None, help="write the rows the table prints to this JSON file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or any(k < 0 for k in args.workers):
        parser.error(f"--rounds must be >= 1 and --workers >= 0, got {args.rounds} and {args.workers}")
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   FUNCNET_COMPILE_CACHE_DIR=str(Path(tmp) / "cache"), COLUMNS="120")
        records = Path(tmp) / "records"
        sources = {"in memory": []} | {f"stream, {k} workers": ["--stream", str(records), "--workers", str(k)]
                                       for k in args.workers}
        outs = {name: Path(tmp) / f"out-{i}" for i, name in enumerate(sources)}
        times = {name: {"train": [], "wall": []} for name in sources}
        for r in range(args.rounds + 1):  # round 0: writes the records, fills the compile cache; not counted
            for name, extra in sources.items():
                trained, wall = run([*extra, "--out", str(outs[name])], env)
                if r:
                    times[name]["train"].append(trained)
                    times[name]["wall"].append(wall)
            loads.append(os.getloadavg()[0])
            print(f"round {r}{' (untimed)' if not r else ''}: " + ", ".join(
                f"{n} {t['train'][-1]:.1f} s / {t['wall'][-1]:.1f} s" for n, t in times.items() if r), flush=True)
        finals = {name: json.loads((outs[name] / "metrics.json").read_text())["final"] for name in sources}
        params = {name: np.load(outs[name] / "params.npz") for name in sources if name != "in memory"}
        first = next(iter(params.values()))
        same_bits = all(all(np.array_equal(p[k], first[k]) for k in first.files) for p in params.values())

    base = times["in memory"]
    rows = []
    for name, t in times.items():
        rows.append({"source": name, "train_s": statistics.median(t["train"]), "wall_s": statistics.median(t["wall"]),
                     "train_vs_memory": statistics.median(a / b for a, b in zip(t["train"], base["train"])),
                     "wall_vs_memory": statistics.median(a / b for a, b in zip(t["wall"], base["wall"])),
                     "train_all": t["train"], "wall_all": t["wall"],
                     "test_accuracy": finals[name].get("test_accuracy"), "test_loss": finals[name].get("test_loss")})
    print(f"funcnet train (digits MLP), medians of {args.rounds} rounds, load {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'data':22s} {'training s':>10s} {'x memory':>9s} {'end to end s':>13s} {'x memory':>9s} {'test acc':>9s}")
    for r in rows:
        print(f"{r['source']:22s} {r['train_s']:10.1f} {r['train_vs_memory']:8.2f}x {r['wall_s']:13.1f} "
              f"{r['wall_vs_memory']:8.2f}x {r['test_accuracy']:9.4f}")
    print(f"the streamed runs' parameters are {'bitwise equal' if same_bits else 'NOT equal'} across --workers")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "loads": loads, "same_bits_across_workers": same_bits,
                                         "rows": rows}, indent=1) + "\n")
    return 0 if same_bits else 1


if __name__ == "__main__":
    raise SystemExit(main())
