"""``python -m comparisons [NAME ...] [--list] [--json PATH] [--report DIR] [--float64]``

Runs each comparison (PyTorch form and JAX form on the same numbers), prints the
two sources, the two results, the checks with their tolerances and the two timings
side by side, and exits non-zero if any verdict fails (or a comparison crashes).
"""

from __future__ import annotations

import argparse
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
from comparisons._core import Check, Options, Result, Side

# The articles' order: tensors, then autograd, graphs, modules, the hand-written
# net, the loop, then scaling up. Comparisons not listed here run after these.
ORDER = [
    "tensors", "autograd", "autograd_from_scratch", "dynamic_graph", "modules", "two_layer_net",
    "training_loop", "mixed_precision", "data_parallel", "memory", "performance", "paradigms",
]
# The comparisons whose float64 mode is part of the contract (agreement to ~1e-10).
FLOAT64_DEFAULT = ["autograd", "training_loop"]


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


def _fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def print_result(console, result: Result, *, show_source: bool = True) -> None:
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.table import Table

    verdict = "[bold green]PASS[/]" if result.ok else "[bold red]FAIL[/]"
    table = Table(show_header=True, header_style="bold", expand=True, show_lines=True)
    table.add_column("PyTorch", ratio=1, overflow="fold")
    table.add_column("JAX", ratio=1, overflow="fold")
    if show_source and (result.torch.source or result.jax.source):
        table.add_row(Syntax(result.torch.source or "", "python", word_wrap=True, theme="ansi_dark"),
                      Syntax(result.jax.source or "", "python", word_wrap=True, theme="ansi_dark"))
    table.add_row(result.torch.output, result.jax.output)
    table.add_row(f"time: {_fmt_seconds(result.torch.seconds)}", f"time: {_fmt_seconds(result.jax.seconds)}")
    checks = Table(show_header=True, header_style="bold", expand=True)
    checks.add_column("", width=2)
    checks.add_column("check", ratio=1, overflow="fold")
    checks.add_column("detail", ratio=2, overflow="fold")
    for c in result.checks:
        checks.add_row("[green]✓[/]" if c.ok else "[red]✗[/]", c.name, c.detail)
    console.print(Panel.fit(f"[bold]{result.name}[/]: {result.title}   {verdict}"))
    console.print(table)
    console.print(checks)
    if result.notes and not result.ok:
        console.print(result.notes, markup=False, highlight=False)
    elif result.notes:
        console.print(f"[dim]{result.notes}[/]")
    console.print()


def print_summary(console, results: list[Result]) -> None:
    from rich.table import Table

    table = Table(title="summary")
    for col in ("comparison", "verdict", "checks", "PyTorch time", "JAX time"):
        table.add_column(col)
    for r in results:
        passed = sum(c.ok for c in r.checks)
        table.add_row(r.name, "[green]PASS[/]" if r.ok else "[red]FAIL[/]", f"{passed}/{len(r.checks)}",
                      _fmt_seconds(r.torch.seconds), _fmt_seconds(r.jax.seconds))
    console.print(table)


def write_report(results: list[Result], directory: Path, opts: Options) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    lines = ["# funcnet comparisons: PyTorch and JAX on the same numbers", "",
             f"dtype: {opts.dtype}", "", "| comparison | verdict | checks | PyTorch | JAX |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| [{r.name}](#{r.name}) | {'PASS' if r.ok else 'FAIL'} | "
                     f"{sum(c.ok for c in r.checks)}/{len(r.checks)} | {_fmt_seconds(r.torch.seconds)} | "
                     f"{_fmt_seconds(r.jax.seconds)} |")
    for r in results:
        lines += ["", f"## {r.name}", "", f"{r.title} — **{'PASS' if r.ok else 'FAIL'}**", "",
                  "| | check | detail |", "|---|---|---|"]
        lines += [f"| {'✓' if c.ok else '✗'} | {c.name} | {c.detail.replace('|', '/')} |" for c in r.checks]
        for side, label in ((r.torch, "PyTorch"), (r.jax, "JAX")):
            lines += ["", f"### {label} ({_fmt_seconds(side.seconds)})", "", "```python", side.source, "```",
                      "", "```text", side.output, "```"]
        for i, (title, curves) in enumerate(r.series.items()):
            png = f"{r.name}_{i}.png"
            fig, ax = plt.subplots(figsize=(7, 4))
            for (label, values), style in zip(curves.items(), ("-", "--", ":", "-.") * 4):
                ax.plot(range(len(values)), values, style, label=label, linewidth=1.5)
            ax.set_title(title)
            ax.legend()
            fig.tight_layout()
            fig.savefig(directory / png, dpi=110)
            plt.close(fig)
            lines += ["", f"![{title}]({png})"]
        if r.notes:
            lines += ["", "```text", r.notes, "```"]
    path = directory / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m comparisons", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="comparisons to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the comparisons and exit")
    parser.add_argument("--json", metavar="PATH", help="write machine-readable results")
    parser.add_argument("--report", metavar="DIR", help="write DIR/report.md with PNG plots")
    parser.add_argument("--float64", action="store_true",
                        help=f"run in float64 in a process with JAX_ENABLE_X64 (default names: "
                             f"{' '.join(FLOAT64_DEFAULT)})")
    parser.add_argument("--no-source", action="store_true", help="do not print the sources")
    args = parser.parse_args(argv)

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
    if args.float64 and os.environ.get("JAX_ENABLE_X64", "").lower() not in ("1", "true"):
        # x64 is a process-wide JAX setting fixed at start-up: run in a child that has it.
        env = dict(os.environ, JAX_ENABLE_X64="1")
        return subprocess.call([sys.executable, "-m", "comparisons", *(argv if argv is not None else sys.argv[1:])],
                               env=env)
    opts = Options(dtype="float64" if args.float64 else "float32")
    selected = args.names or (FLOAT64_DEFAULT if args.float64 else names)

    from rich.console import Console

    console = Console()
    results = []
    for name in selected:
        with console.status(f"running {name} ..."):
            result = run_one(name, opts)
        print_result(console, result, show_source=not args.no_source)
        results.append(result)
    print_summary(console, results)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"dtype": opts.dtype, "results": [r.to_json() for r in results]},
                                              indent=2) + "\n")
    if args.report:
        path = write_report(results, Path(args.report), opts)
        console.print(f"report written to {path}")
    failed = [r.name for r in results if not r.ok]
    if failed:
        console.print(f"[bold red]{len(failed)} comparison(s) failed:[/] {', '.join(failed)}")
        return 1
    console.print(f"[bold green]all {len(results)} comparisons agree[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
