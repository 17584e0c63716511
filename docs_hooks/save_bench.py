"""Save a benchmark run the Benchmarks page shows: ``docs/data/bench_NAME.json``.

``python -m docs_hooks.save_bench NAME [ARGS ...]`` runs ``python benchmarks/NAME.py ARGS --json TMP``
and saves the script's JSON under ``"result"`` beside a ``"run"`` record of where and how it ran:
the machine (platform, CPU model, cores), the load average before and after, the exact command,
the UTC date, the process's niceness and the versions of jax and torch. The page (``docs_hooks.benchmarks``) prints that
record above each table, so a figure never appears without its machine, load and command. The
file is written only if the script exits 0 (its correctness checks against torch passed).

``--name SAVED`` (anywhere after NAME) saves to ``docs/data/bench_SAVED.json`` instead, for two runs of one
script with different arguments, e.g. ``save_bench conv --name conv_sweep --part sweep``.

``python -m docs_hooks.save_bench --example NAME [ARGS ...]`` does the same for ``examples/NAME.py``,
which print their results rather than write JSON: its standard output is saved as
``{"stdout": ...}`` in ``docs/data/example_NAME.json`` (``example_NAME-FLAG.json`` with flags, e.g.
``example_port_cnn-float64.json``), so the guides' figures from a full example run have a record too.
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

__all__ = ["cpu_model", "example_path", "main", "saved_path"]


def saved_path(name: str) -> Path:
    """Where the run of ``benchmarks/NAME.py`` is saved."""
    return DATA / f"bench_{name}.json"


def example_path(name: str, args: list[str] | tuple[str, ...] = ()) -> Path:
    """Where the run of ``examples/NAME.py ARGS`` is saved: flags joined to the name, values too."""
    tag = "".join("-" + a.lstrip("-").replace("/", "_") for a in args)
    return DATA / f"example_{name}{tag}.json"


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


def _record(command: str, start: datetime.datetime, load_before: tuple) -> dict:
    load_after = os.getloadavg()
    return {"command": command, "date": start.strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.system()} {platform.machine()}, {cpu_model()}, {os.cpu_count()} cores",
            "load": [round(load_before[0], 1), round(load_after[0], 1)],
            "seconds": round((datetime.datetime.now(datetime.timezone.utc) - start).total_seconds()),
            "niceness": os.nice(0),
            "versions": {"jax": _version("jax"), "torch": _version("torch"), "python": platform.python_version()}}


def _example(argv: list[str]) -> int:
    if not argv or not (ROOT / "examples" / f"{argv[0]}.py").is_file():
        names = sorted(p.stem for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))
        print(f"save_bench --example: give an example's name (got {argv[:1] or 'none'}); one of {names}",
              file=sys.stderr)
        return 2
    name, args = argv[0], argv[1:]
    command = " ".join(["python", f"examples/{name}.py", *map(shlex.quote, args)])
    load_before, start = os.getloadavg(), datetime.datetime.now(datetime.timezone.utc)
    done = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), *args], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        print(f"save_bench: the run exited {done.returncode}; {example_path(name, args)} is unchanged", file=sys.stderr)
        return done.returncode
    from funcnet.cli.outputs import write_atomic

    run = _record(command, start, load_before)
    write_atomic(example_path(name, args), json.dumps({"run": run, "result": {"stdout": done.stdout}}, indent=1) + "\n")
    print(f"saved {example_path(name, args).relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--example"]:
        return _example(argv[1:])
    if not argv or not (ROOT / "benchmarks" / f"{argv[0]}.py").is_file():
        names = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))
        print(f"save_bench: give a benchmark's name first (got {argv[:1] or 'none'}); one of {names}", file=sys.stderr)
        return 2
    script, args = argv[0], argv[1:]
    name = script
    if "--name" in args:
        at = args.index("--name")
        if at + 1 >= len(args) or args[at + 1].startswith("-"):
            print("save_bench: --name needs a value, e.g. --name conv_sweep (saved as bench_conv_sweep.json)",
                  file=sys.stderr)
            return 2
        name, args = args[at + 1], args[:at] + args[at + 2:]
    if "--json" in args:
        print("save_bench: leave out --json; the run is saved to " + str(saved_path(name)), file=sys.stderr)
        return 2
    command = " ".join(["python", f"benchmarks/{script}.py", *map(shlex.quote, args)])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        load_before = os.getloadavg()
        start = datetime.datetime.now(datetime.timezone.utc)
        code = subprocess.call([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *args, "--json", str(out)],
                               cwd=ROOT)
        if code != 0 or not out.exists():
            print(f"save_bench: the run exited {code}; {saved_path(name)} is unchanged", file=sys.stderr)
            return code or 1
        result = json.loads(out.read_text())
    run = _record(command, start, load_before)
    from funcnet.cli.outputs import write_atomic

    write_atomic(saved_path(name), json.dumps({"run": run, "result": result}, indent=1) + "\n")
    print(f"saved {saved_path(name).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
