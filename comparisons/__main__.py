"""``python -m comparisons [NAME ...] [--list] [--json PATH] [--report DIR] [--html DIR] [--no-page] [--float64] [--from-json PATH]``

Runs each comparison (PyTorch form and JAX form on the same numbers), prints the
two sources, the two results, the checks with their tolerances and the two timings
(first call with its compile time, and steady state) side by side, and exits non-zero
if any verdict fails (or a comparison crashes). It then writes the same as a static
page, ``runs/comparisons/index.html`` (see comparisons/_page.py), and the JSON the page
is rendered from, ``runs/comparisons/results.json``, and says where; ``--html DIR`` and
``--json PATH`` move them, ``--no-page`` writes neither unless asked for by those flags.
``--from-json PATH`` renders a saved run (terminal, ``--report``, the page) without
running anything.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import comparisons
from comparisons import _core
from comparisons._core import Check, Options, Result, Side, fmt_seconds
from comparisons._terminal import print_result, print_summary  # noqa: F401 (the runner's terminal view)

# The articles' order: tensors, then autograd, graphs, modules, the hand-written
# net, the loop, then scaling up. Comparisons not listed here run after these.
ORDER = [
    "tensors", "autograd", "autograd_from_scratch", "dynamic_graph", "modules", "buffers", "two_layer_net",
    "training_loop", "mixed_precision", "data_parallel", "memory", "performance", "paradigms", "gpt", "recurrent",
    "convert", "activation_checkpointing", "fsdp", "zero", "tensor_parallel", "pipeline_parallel",
]
# The comparisons whose float64 mode is part of the contract (agreement to ~1e-10).
FLOAT64_DEFAULT = ["autograd", "training_loop"]
# Where a run writes its page and JSON unless --html / --json / --no-page say otherwise.
DEFAULT_PAGE_DIR = Path("runs") / "comparisons"


def available() -> list[str]:
    found = [m.name for m in pkgutil.iter_modules(comparisons.__path__) if not m.name.startswith("_")]
    return sorted(found, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def run_one(name: str, opts: Options) -> Result:
    try:
        module = importlib.import_module(f"comparisons.{name}")
        start = time.perf_counter()
        result = module.run(opts)
        result.notes = (result.notes + "\n" if result.notes else "") + \
            f"wall time of the whole comparison: {time.perf_counter() - start:.2f} s"
        return result
    except Exception:
        tb = traceback.format_exc()
        return Result(name, name, Side("", ""), Side("", ""),
                      [Check("comparison ran", False, tb.strip().splitlines()[-1])], notes=tb)


@contextlib.contextmanager
def _progress_bar(console, label: str):
    """One transient line while a comparison runs: ``[k/N] running NAME``, the stage it
    reports through ``_core.progress`` with a bar of its items done, and the time elapsed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not console.is_terminal:  # a log (CI, a pipe): no bar redrawn in place, a plain line per stage instead
        started, last = time.monotonic(), [None]

        def show(description: str, done: int, total: int | None) -> None:
            if description != last[0]:
                last[0] = description
                print(f"{label}: {description} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)

        with _core.showing_progress(show):
            yield
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(f"{label} ...", total=None)

        def show(description: str, done: int, total: int | None) -> None:
            bar.update(task, description=f"{label}: {description}", completed=done, total=total)

        with _core.showing_progress(show):
            yield


def _fmt_seconds(seconds: float | None) -> str:
    return fmt_seconds(seconds)


def _timing(side: Side) -> str:
    compiled = fmt_seconds(side.compile_seconds) if side.compile_seconds else "n/a"  # torch eager: nothing
    return (f"first call {fmt_seconds(side.seconds)}, compile {compiled}, "
            f"steady {fmt_seconds(side.steady_seconds)}")


def write_report(results: list[Result], directory: Path, opts: Options) -> Path:
    from comparisons._page import plot_png

    directory.mkdir(parents=True, exist_ok=True)
    lines = ["# funcnet comparisons: PyTorch and JAX on the same numbers", "",
             f"dtype: {opts.dtype}", "",
             "first call: the timed work run once, tracing and compilation included; compile: the part of it "
             "spent tracing and compiling; steady: the same work called again, once compiled; -: not measured.", "",
             "| comparison | verdict | checks | PyTorch first call | PyTorch steady | JAX first call | JAX compile "
             "| JAX steady |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| [{r.name}](#{r.name}) | {'PASS' if r.ok else 'FAIL'} | "
                     f"{sum(c.ok for c in r.checks)}/{len(r.checks)} | {fmt_seconds(r.torch.seconds)} | "
                     f"{fmt_seconds(r.torch.steady_seconds)} | {fmt_seconds(r.jax.seconds)} | "
                     f"{fmt_seconds(r.jax.compile_seconds)} | {fmt_seconds(r.jax.steady_seconds)} |")
    for r in results:
        lines += ["", f"## {r.name}", "", f"{r.title} — **{'PASS' if r.ok else 'FAIL'}**", "",
                  "| | check | detail |", "|---|---|---|"]
        lines += [f"| {'✓' if c.ok else '✗'} | {c.name} | {c.detail.replace('|', '/')} |" for c in r.checks]
        for side, label in ((r.torch, "PyTorch"), (r.jax, "JAX")):
            lines += ["", f"### {label} ({_timing(side)})", "", "```python", side.source, "```",
                      "", "```text", side.output, "```"]
        for i, (title, curves) in enumerate(r.series.items()):
            png = f"{r.name}_{i}.png"
            (directory / png).write_bytes(plot_png(title, curves))
            lines += ["", f"![{title}]({png})"]
        if r.notes:
            lines += ["", "```text", r.notes, "```"]
    path = directory / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _unwritable(args) -> str | None:
    """The first of --json PATH, --report DIR, --html DIR that cannot be written, or that would be
    written over --from-json or over another of them, as a message."""
    from funcnet.cli.errors import UsageError
    from funcnet.cli.outputs import refuse_overwriting_inputs

    outputs = [("--json", None if args.from_json else args.json, False),  # a replayed run writes no --json
               ("--report", Path(args.report) / "report.md" if args.report else None, False),
               ("--html", Path(args.html) / "index.html" if args.html else None, False)]
    try:
        refuse_overwriting_inputs(outputs, [("--from-json", args.from_json)])
    except UsageError as e:
        return str(e)
    for flag, value, is_file in (("--json", args.json, True), ("--report", args.report, False),
                                 ("--html", args.html, False)):
        if value is None:
            continue
        path = Path(value)
        folder = path.parent if is_file else path
        if is_file and path.is_dir():
            return f"{flag} {value} is a folder; pass a file path such as {path / 'results.json'}"
        if not is_file and path.exists() and not path.is_dir():
            return f"{flag} {value} is a file; pass a folder (created if missing)"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            return f"{flag} {value} cannot be written: {e.strerror}; pass a path in a folder this user can write"
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m comparisons", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="comparisons to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the comparisons and exit")
    parser.add_argument("--json", metavar="PATH",
                        help="write machine-readable results there (default: results.json in the page's folder, "
                             f"{DEFAULT_PAGE_DIR / 'results.json'}; a --from-json run writes none)")
    parser.add_argument("--report", metavar="DIR", help="write DIR/report.md with PNG plots (default: none)")
    parser.add_argument("--html", metavar="DIR",
                        help="write DIR/index.html: the sources side by side, outputs, checks and plots in one "
                             f"static page (no server, no network) (default: {DEFAULT_PAGE_DIR})")
    parser.add_argument("--no-page", action="store_true",
                        help="write no page and no JSON but those --html and --json ask for")
    parser.add_argument("--float64", action="store_true",
                        help=f"run in float64 in a process with JAX_ENABLE_X64 (default names: "
                             f"{' '.join(FLOAT64_DEFAULT)})")
    parser.add_argument("--no-source", action="store_true", help="do not print the sources")
    parser.add_argument("--from-json", metavar="PATH",
                        help="render a run saved with --json (terminal, --report, --html) instead of running (default: none, run)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.no_page:  # a first run ends with a page to open, and the JSON it can be re-rendered from
        args.html = args.html or str(DEFAULT_PAGE_DIR)
        args.json = args.json or str(Path(args.html) / "results.json")

    names = available()
    if args.list:
        for name in names:
            title = getattr(importlib.import_module(f"comparisons.{name}"), "TITLE", "")
            print(f"{name:24s} {title}")
        return 0
    unknown = [n for n in args.names if n not in names]
    if unknown:
        print(f"unknown comparison(s): {', '.join(unknown)}; expected some of: {', '.join(names)}", file=sys.stderr)
        return 2
    problem = _unwritable(args)
    if problem:  # before any comparison runs, not after twelve minutes of them
        print(f"python -m comparisons: error: {problem}", file=sys.stderr)
        return 2
    if args.float64 and os.environ.get("JAX_ENABLE_X64", "").lower() not in ("1", "true"):
        # x64 is a process-wide JAX setting fixed at start-up: run in a child that has it.
        env = dict(os.environ, JAX_ENABLE_X64="1")
        return subprocess.call([sys.executable, "-m", "comparisons", *(argv if argv is not None else sys.argv[1:])],
                               env=env)
    __import__("funcnet.compile_cache").compile_cache.enable()  # a second run reads its compiled programs from disk
    from rich.console import Console

    console = Console()
    results = []
    if args.from_json:
        try:
            saved = json.loads(Path(args.from_json).read_text())
            results = [Result.from_json(r) for r in saved["results"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"--from-json {args.from_json}: not a run written by --json ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return 2
        opts = Options(dtype=saved.get("dtype", "float32"))
        if args.names:
            results = [r for r in results if r.name in args.names]
        for result in results:
            print_result(console, result, show_source=not args.no_source)
    else:
        opts = Options(dtype="float64" if args.float64 else "float32")
        selected = args.names or (FLOAT64_DEFAULT if args.float64 else names)
        for k, name in enumerate(selected, 1):
            with _progress_bar(console, f"[{k}/{len(selected)}] running {name}"):
                result = run_one(name, opts)
            print_result(console, result, show_source=not args.no_source, position=f"{k}/{len(selected)}")
            results.append(result)
    print_summary(console, results)
    if args.json and not args.from_json:
        from funcnet.cli.outputs import write_atomic

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.json, json.dumps({"dtype": opts.dtype, "results": [r.to_json() for r in results]},
                                           indent=2) + "\n")  # a killed run leaves the previous file whole
    written = []
    if args.report:
        written.append(("report", write_report(results, Path(args.report), opts)))
    if args.html:
        from comparisons._page import write_page

        written.append(("page", write_page(results, Path(args.html), opts)))
    if args.json and not args.from_json:
        written.append(("results", Path(args.json)))
    failed = [r.name for r in results if not r.ok]
    if failed:
        console.print(f"[bold red]{len(failed)} comparison(s) failed:[/] {', '.join(failed)}")
    else:
        console.print(f"[bold green]all {len(results)} comparisons agree[/]")
    for what, path in written:  # last, so a run ends with where to look
        console.print(f"{what} written to {path}", highlight=False, soft_wrap=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
