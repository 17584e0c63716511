"""Save a benchmark run the Benchmarks page shows: ``docs/data/bench_NAME.json``.

``python -m docs_hooks.save_bench NAME [ARGS ...]`` runs ``python benchmarks/NAME.py ARGS --json TMP``
and saves the script's JSON under ``"result"`` beside a ``"run"`` record of where and how it ran:
the machine (platform, CPU model, cores), the load average before and after, the exact command,
the UTC date, the process's niceness and the versions of jax and torch. The page (``docs_hooks.benchmarks``) prints that
record above each table, so a figure never appears without its machine, load and command. The
file is written only if the script exits 0 (its correctness checks against torch passed).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"

__all__ = ["cpu_model", "main", "saved_path"]


def saved_path(name: str) -> Path:
    """Where the run of ``benchmarks/NAME.py`` is saved."""
    return DATA / f"bench_{name}.json"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _version(module: str) -> str:
    code = f"import {module}; print({module}.__version__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "not installed"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or not (ROOT / "benchmarks" / f"{argv[0]}.py").is_file():
        names = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))
        print(f"save_bench: give a benchmark's name first (got {argv[:1] or 'none'}); one of {names}", file=sys.stderr)
        return 2
    name, args = argv[0], argv[1:]
    if "--json" in args:
        print("save_bench: leave out --json; the run is saved to " + str(saved_path(name)), file=sys.stderr)
        return 2
    command = " ".join(["python", f"benchmarks/{name}.py", *map(shlex.quote, args)])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        load_before = os.getloadavg()
        start = datetime.datetime.now(datetime.timezone.utc)
        code = subprocess.call([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *args, "--json", str(out)],
                               cwd=ROOT)
        load_after = os.getloadavg()
        if code != 0 or not out.exists():
            print(f"save_bench: the run exited {code}; {saved_path(name)} is unchanged", file=sys.stderr)
            return code or 1
        result = json.loads(out.read_text())
    run = {"command": command, "date": start.strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{platform.system()} {platform.machine()}, {cpu_model()}, {os.cpu_count()} cores",
           "load": [round(load_before[0], 1), round(load_after[0], 1)],
           "seconds": round((datetime.datetime.now(datetime.timezone.utc) - start).total_seconds()),
           "niceness": os.nice(0),
           "versions": {"jax": _version("jax"), "torch": _version("torch"), "python": platform.python_version()}}
    from funcnet.cli.outputs import write_atomic

    write_atomic(saved_path(name), json.dumps({"run": run, "result": result}, indent=1) + "\n")
    print(f"saved {saved_path(name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
