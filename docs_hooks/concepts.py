"""The Concepts section: one page per comparison, and the concept map, from a saved run.

The pages are written at build time from ``docs/data/comparisons.json``, the run that
``python -m comparisons --json docs/data/comparisons.json`` saves (``Result.to_json`` of each
comparison: both sources as the runner extracts them, both outputs, the checks with their
tolerances, the timings and the plotted series). Nothing is run during the build;
tests/test_site_saved_run.py keeps the saved run true against a fresh run of the cheap
comparisons.

Each page shows the PyTorch and the JAX source in content tabs (pymdownx.tabbed), each with
its output and timing, then the checks, the timings side by side, the plots (PNG files
drawn by ``comparisons._page.plot_png``, as the HTML page draws them) and the run's notes.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from comparisons._core import Result, fmt_seconds
from comparisons._page import CONCEPTS, _check_parts, plot_png
from comparisons._terminal import timing_line

__all__ = ["RERUN", "SAVED_RUN", "comparison_page", "concept_map", "figures", "load_run"]

SAVED_RUN = Path("docs/data/comparisons.json")  # relative to the repository root
RERUN = f"python -m comparisons --json {SAVED_RUN}"


def load_run(path: Path, names: list[str]) -> tuple[str, dict[str, Result]]:
    """The saved run's dtype and its results by name, checked against the registry's ``names``.

    Raises ValueError naming the comparisons missing from the run or unknown to the registry,
    and the command that saves a fresh run."""
    try:
        saved = json.loads(Path(path).read_text())
        results = {r["name"]: Result.from_json(r) for r in saved["results"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a run saved by --json ({type(e).__name__}: {e}); save one with {RERUN}") \
            from None
    missing, unknown = [n for n in names if n not in results], sorted(set(results) - set(names))
    if missing or unknown:
        raise ValueError(f"{path} does not match the comparisons: missing {missing or 'none'}, "
                         f"unknown {unknown or 'none'}; save a fresh run with {RERUN}")
    return saved.get("dtype", "float32"), results


def _fence(text: str, lang: str, indent: str = "") -> str:
    """``text`` as a fenced block longer than any backtick run in it, each line indented."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = "\n".join(indent + line if line else "" for line in text.splitlines())
    return f"{indent}{fence}{lang}\n{body}\n{indent}{fence}"


def _e(text: str) -> str:
    return html.escape(text or "", quote=False)


def _checks_table(r: Result) -> str:
    rows = "".join(
        f"<tr><td>{'✓' if c.ok else '✗'}</td><td>{_e(c.name)}</td>"
        f"<td>{_e(_check_parts(c.detail, c.tolerance, c.why))}</td><td>{_e(c.tolerance)}</td><td>{_e(c.why)}</td></tr>"
        for c in r.checks)
    return ("<table><thead><tr><th></th><th>check</th><th>measured</th><th>tolerance</th><th>why</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _timings_table(r: Result) -> str:
    def compiled(side):
        return "n/a" if not side.compile_seconds else fmt_seconds(side.compile_seconds)

    lines = ["| | first call | compile | steady |", "|---|---:|---:|---:|"]
    for label, side in (("PyTorch", r.torch), ("JAX", r.jax)):
        lines.append(f"| {label} | {fmt_seconds(side.seconds)} | {compiled(side)} | {fmt_seconds(side.steady_seconds)} |")
    return "\n".join(lines)


def figures(r: Result) -> list[tuple[str, str, bytes]]:
    """``(file name, title, PNG)`` for each plotted series of ``r``."""
    return [(f"{r.name}-{i}.png", title, plot_png(title, curves)) for i, (title, curves) in enumerate(r.series.items())]


def comparison_page(r: Result, dtype: str, figure_names: list[tuple[str, str]]) -> str:
    """The Markdown of one comparison's page; ``figure_names`` are ``(file name, title)``."""
    passed = sum(c.ok for c in r.checks)
    kind, verdict = ("success", "PASS") if r.ok else ("failure", "FAIL")
    concepts = [(concept, ours) for concept, ours, names in CONCEPTS if r.name in names]
    out = [f"# {r.name}: {r.title}", "",
           f'!!! {kind} "{verdict}: {passed}/{len(r.checks)} checks"',
           (f"    From the saved run `{SAVED_RUN}` ({dtype}), written by `{RERUN}`; "
           f"`python -m comparisons {r.name}` runs this comparison again."), ""]
    if concepts:
        out += ["| concept in the articles | funcnet |", "|---|---|"]
        out += [f"| {c.replace('|', '&#124;')} | {o.replace('|', '&#124;')} |" for c, o in concepts]
        out.append("")
    out += ["## PyTorch and JAX", ""]
    for label, side in (("PyTorch", r.torch), ("JAX", r.jax)):
        out += [f'=== "{label}"', "", _fence(side.source, "python", "    "), "",
                "    It printed:", "", _fence(side.output or "(nothing)", "text", "    "), "",
                f"    {_e(timing_line(side))}", ""]
    out += ["## Checks", "", _checks_table(r), "", "## Timings", "",
            ("First call: the timed work run once, tracing and compilation included; compile: the part of it spent "
            "tracing and compiling (n/a: nothing compiled, torch eager); steady: the same work called again. "
            "Timings are the saved run's, on the machine that saved it."), "", _timings_table(r), ""]
    if figure_names:
        out += ["## Figures", ""]
        out += [f"![{_e(title)}]({name})" + "\n" for name, title in figure_names]
    if r.notes:
        out += ["## Notes", "", _fence(r.notes, "text"), ""]
    return "\n".join(out)


def concept_map(results: list[Result], dtype: str) -> str:
    """The Markdown of the concept map: the articles' concepts with the comparisons that show
    them, then every comparison with its verdict."""
    n_checks, n_passed = sum(len(r.checks) for r in results), sum(c.ok for r in results for c in r.checks)
    present = {r.name for r in results}
    out = ["# Concept map", "",
           ("Each concept of the two source articles, funcnet's form of it, and the comparisons that run it in "
           "PyTorch and in JAX on the same numbers. Each comparison's page shows both sources side by side, what "
           "they printed, the checks that they agree, and the timings."), "",
           "| concept in the articles | funcnet | comparisons |", "|---|---|---|"]
    for concept, ours, names in CONCEPTS:
        links = ", ".join(f"[{n}]({n}.md)" if n in present else n for n in names)
        out.append(f"| {concept.replace('|', '&#124;')} | {ours.replace('|', '&#124;')} | {links} |")
    out += ["", "## Every comparison", "",
            (f"{len(results)} comparisons, {n_passed}/{n_checks} checks passing in the saved run `{SAVED_RUN}` "
            f"({dtype}); `python -m comparisons` runs them all again."), "",
            "| comparison | what it shows | verdict | checks |", "|---|---|---|---:|"]
    for r in results:
        out.append(f"| [{r.name}]({r.name}.md) | {r.title.replace('|', '&#124;')} | {'PASS' if r.ok else 'FAIL'} | "
                   f"{sum(c.ok for c in r.checks)}/{len(r.checks)} |")
    return "\n".join(out) + "\n"
