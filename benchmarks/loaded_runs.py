"""A command run N times in a row while other processes keep every core busy: does it pass
every time on a loaded machine?

The default command is the multi-process comparisons (torch DDP and FSDP on gloo
processes beside JAX's simulated devices), the ones a busy machine once broke. Each round
starts the command as a new process; ``--busy K`` processes (default: one per core) spin
for the whole run. Printed per run: exit status, wall time, the load average at its end
and, for a failure, the last lines of its output. Exits 1 if any run failed.

    python benchmarks/loaded_runs.py [--runs 10] [--busy K] [--json PATH] [-- COMMAND ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [sys.executable, "-m", "comparisons", "data_parallel", "fsdp", "--no-source"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1,
                        help="processes spinning on the CPU during the runs (default: one per core)")
    parser.add_argument("--json", metavar="PATH", help="write the runs as JSON")
    parser.add_argument("command", nargs="*", help="the command (after --); default: " + " ".join(DEFAULT[1:]))
    args = parser.parse_args(argv)
    if args.runs < 1 or args.busy < 0:
        parser.error(f"--runs must be >= 1 and --busy >= 0, got {args.runs} and {args.busy}")
    command = args.command or DEFAULT
    # separate interpreters spinning (no fork of this process, whose caller may run JAX's threads)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    runs = []
    try:
        print(f"{args.runs} runs of: {' '.join(command)}; {args.busy} busy processes on {os.cpu_count()} cores",
              flush=True)
        for i in range(1, args.runs + 1):
            start = time.perf_counter()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, COLUMNS="100"))
            seconds = time.perf_counter() - start
            run = {"run": i, "status": done.returncode, "seconds": round(seconds, 1),
                   "load": [round(x, 1) for x in os.getloadavg()]}
            if done.returncode != 0:
                run["tail"] = (done.stdout + done.stderr).strip().splitlines()[-15:]
            runs.append(run)
            verdict = "passed" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
            print(f"run {i:2d}/{args.runs}: {verdict} in {seconds:6.1f} s, load average {run['load']}", flush=True)
            for line in run.get("tail", []):
                print("    " + line)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    passed = sum(r["status"] == 0 for r in runs)
    print(f"{passed}/{len(runs)} runs passed")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "busy": args.busy, "runs": runs}, indent=2) + "\n")
    return 0 if passed == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
