"""Cold and warm start of funcnet's commands: JAX's persistent compilation cache (funcnet.compile_cache).

Each command runs in a new process, three ways per round, back to back:

- off: ``FUNCNET_NO_COMPILE_CACHE=1``, every program compiled (what every run paid before);
- cold: the cache on in an empty folder (the first run ever: compiles and writes);
- warm: the cache on in the folder the cold run filled (every later run).

Wall times and CPU times (user + system of the process and its children, far less
sensitive to a busy machine's load) are medians over rounds; the ratios (off / warm,
cold / warm) are medians of per-round ratios, so the load hits the three alike. The load
average is printed.

    python benchmarks/start_up.py [--rounds 3] [--json PATH] [--commands train cnn comparisons]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    # funcnet train's start-up: one epoch of the default MLP on digits is mostly start-up
    "train": ["-m", "funcnet.cli", "train", "--epochs", "1", "--quiet"],
    "cnn": ["-m", "funcnet.cli", "train", "--model", "cnn", "--epochs", "1", "--quiet"],
    "gpt": ["-m", "funcnet.cli", "train", "--model", "gpt", "--epochs", "1", "--quiet"],
    "comparisons": ["-m", "comparisons", "--no-source", "--no-page"],
    "tensors": ["-m", "comparisons", "tensors", "--no-source", "--no-page"],
}


def run(argv, env, out) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the child and its children)."""
    if "--quiet" in argv:
        argv = [*argv, "--out", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    if "rejects its own entries" in done.stderr:
        print(done.stderr.strip().splitlines()[-1])
    return seconds, cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", nargs="+", default=["train", "cnn"], choices=list(COMMANDS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    base = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base.pop("FUNCNET_NO_COMPILE_CACHE", None)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.commands:
            times = {"off": [], "cold": [], "warm": []}
            cpu = {"off": [], "cold": [], "warm": []}
            loads = [os.getloadavg()[0]]
            for r in range(args.rounds):
                folder = Path(tmp) / f"cache-{name}-{r}"
                out = Path(tmp) / f"out-{name}"
                env_on = dict(base, FUNCNET_COMPILE_CACHE_DIR=str(folder))
                envs = {"off": dict(base, FUNCNET_NO_COMPILE_CACHE="1"), "cold": env_on, "warm": env_on}
                for kind, env in envs.items():
                    wall, used = run(COMMANDS[name], env, out)
                    times[kind].append(wall)
                    cpu[kind].append(used)
                files = list(folder.iterdir()) if folder.exists() else []
                entries, size = len(files), sum(f.stat().st_size for f in files)
                shutil.rmtree(folder, ignore_errors=True)
                loads.append(os.getloadavg()[0])
                print(f"{name} round {r + 1}: wall off {times['off'][-1]:.1f}s, cold {times['cold'][-1]:.1f}s, "
                      f"warm {times['warm'][-1]:.1f}s; CPU off {cpu['off'][-1]:.1f}s, cold {cpu['cold'][-1]:.1f}s, "
                      f"warm {cpu['warm'][-1]:.1f}s; {entries} cache entries, {size / 2**20:.1f} MB; "
                      f"load {loads[-1]:.1f}", flush=True)

            def ratios(t):
                return {k: statistics.median(a / b for a, b in zip(t[k], t["warm"])) for k in ("off", "cold")}

            results[name] = {"argv": COMMANDS[name], "wall": times, "cpu": cpu, "loads": loads, "entries": entries,
                             "bytes": size, "wall_ratios": ratios(times), "cpu_ratios": ratios(cpu),
                             "median_wall": {k: statistics.median(v) for k, v in times.items()},
                             "median_cpu": {k: statistics.median(v) for k, v in cpu.items()}}
            m, c = results[name]["median_wall"], results[name]["median_cpu"]
            w, u = results[name]["wall_ratios"], results[name]["cpu_ratios"]
            print(f"{name}: wall off {m['off']:.1f}s, cold {m['cold']:.1f}s, warm {m['warm']:.1f}s; CPU off "
                  f"{c['off']:.1f}s, cold {c['cold']:.1f}s, warm {c['warm']:.1f}s (medians of {args.rounds}); "
                  f"off/warm {w['off']:.2f}x wall, {u['off']:.2f}x CPU; cold/warm {w['cold']:.2f}x wall, "
                  f"{u['cold']:.2f}x CPU; load {min(loads):.1f}-{max(loads):.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
