"""The terminal view of a comparison, at the console's width (rich reads ``COLUMNS``).

Two sources side by side when each gets at least ``SIDE_BY_SIDE_MIN`` columns, one
above the other otherwise. A source line wider than its column is folded, never inside
a name: only between two tokens, or after a space inside a string or a comment. The
continuation is indented and marked ``↪``. A single token wider than the column (a long
string without spaces, say) is cropped with rich's ``…``; the page
(``--html``) always has the whole line.
"""

from __future__ import annotations

import io
import tokenize

from comparisons._core import Result, Side, fmt_seconds

__all__ = ["SIDE_BY_SIDE_MIN", "CONTINUATION", "fold_points", "fold_line", "print_result", "print_summary"]

SIDE_BY_SIDE_MIN = 64  # columns each source needs to sit beside the other (160 columns give 76 each)
CONTINUATION = "↪ "
_SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)  # Python 3.12 splits f-strings into tokens
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _after_spaces(line: str, lo: int, hi: int) -> set[int]:
    return {j for j in range(lo + 1, min(hi, len(line))) if line[j - 1] == " " and line[j] != " "}


_NO_FOLD_AFTER = {".", "=", "["}
_NO_FOLD_BEFORE = {".", "(", "[", ",", ":", ")", "]", "}", "="}


def _may_fold_between(prev, tok) -> bool:
    """A fold before ``tok``: never around a '.' (``model.weight.detach`` is one name to a
    reader), nor before a call's or an index's bracket, a comma, a colon or a closer."""
    if prev is None or prev.end[0] != tok.start[0]:
        return False
    if prev.type == tokenize.OP and prev.string in _NO_FOLD_AFTER:
        return False
    return not (tok.type == tokenize.OP and tok.string in _NO_FOLD_BEFORE)


def fold_points(source: str) -> list[set[int]]:
    """For each line of ``source``, the columns where it may be folded.

    Between two tokens (Python's tokenizer), or after a space inside a string or a
    comment; never inside a name, a number or an operator. Text that does not tokenize
    as Python may be folded after any space."""
    lines = source.split("\n")
    points: list[set[int]] = [set() for _ in lines]
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return [_after_spaces(line, 0, len(line)) for line in lines]
    depth, span_start = 0, None  # inside an f-string (3.12+): one literal, folded at spaces only
    prev = None
    for tok in tokens:
        if tok.type in _SKIP:
            continue
        (sr, sc), (er, ec) = tok.start, tok.end
        if tok.type == _FSTRING_START:
            depth += 1
            if depth == 1:
                span_start = (sr, sc)
            continue
        if tok.type == _FSTRING_END:
            depth -= 1
            if depth == 0:
                (sr, sc), span_start = span_start, None
            else:
                continue
        elif depth:
            continue
        if sr - 1 < len(lines) and _may_fold_between(prev, tok):
            points[sr - 1].add(sc)
        prev = tok
        if tok.type in (tokenize.STRING, tokenize.COMMENT) or tok.type == _FSTRING_END:
            for row in range(sr, er + 1):
                if row - 1 < len(lines):
                    line = lines[row - 1]
                    points[row - 1] |= _after_spaces(line, sc if row == sr else 0, ec if row == er else len(line))
    return points


def fold_line(line: str, points: set[int], width: int) -> list[tuple[int, int]]:
    """The (start, end) spans of ``line`` for rows ``width`` wide, continuations included.

    Continuation rows are prefixed by the line's indentation and ``CONTINUATION``; a span
    still wider than its row (no fold point in reach) is left for the renderer to crop."""
    indent = len(line) - len(line.lstrip(" "))
    prefix = indent + len(CONTINUATION)
    if width - prefix < 20:  # deep indentation in a narrow column: continue at the left edge
        prefix = len(CONTINUATION)
    spans, start, room = [], 0, width
    usable = sorted(p for p in points if indent < p < len(line))
    while len(line) - start > room:
        reach = [p for p in usable if start < p <= start + room]
        if reach:
            cut = reach[-1]
        else:
            beyond = [p for p in usable if p > start + room]
            if not beyond:
                break
            cut = beyond[0]
        while cut < len(line) and line[cut] == " ":  # the spaces end the row, the next starts with text
            cut += 1
        if cut >= len(line):
            break
        spans.append((start, cut))
        start, room = cut, width - prefix
    spans.append((start, len(line)))
    return spans


def _continuation(line: str, width: int) -> str:
    indent = len(line) - len(line.lstrip(" "))
    return (" " * indent if width - indent - len(CONTINUATION) >= 20 else "") + CONTINUATION


def folded_source(code: str, width: int):
    """``code`` highlighted (rich ``Text``), each line folded to ``width`` at fold points."""
    from rich.syntax import Syntax
    from rich.text import Text

    highlighted = Syntax(code, "python", theme="ansi_dark").highlight(code)
    highlighted.rstrip()
    points = fold_points(code)
    rows = []
    for i, line_text in enumerate(highlighted.split("\n", allow_blank=True)):
        plain = line_text.plain
        spans = fold_line(plain, points[i] if i < len(points) else set(), width)
        pieces = line_text.divide([s for s, _ in spans[1:]]) if len(spans) > 1 else [line_text]
        for k, piece in enumerate(pieces):
            if k < len(pieces) - 1:
                piece.rstrip()  # the spaces at a fold would only push the row past the column
            if k:
                piece = Text(_continuation(plain, width), style="dim") + piece
            rows.append(piece)
    out = Text("\n").join(rows)
    out.no_wrap, out.overflow = True, "ellipsis"
    return out


def timing_line(side: Side) -> str:
    """"first call 2.45 s (compile 2.40 s), steady 41.0 ms", "(nothing compiled)" for torch eager."""
    compiled = ("nothing compiled" if side.compile_seconds == 0 else f"compile {fmt_seconds(side.compile_seconds)}")
    return f"first call {fmt_seconds(side.seconds)} ({compiled}), steady {fmt_seconds(side.steady_seconds)}"


def _sides_table(sides, col: int, show_source: bool):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.ROUNDED, show_header=True, header_style="bold", show_lines=True, padding=(0, 1),
                  expand=False)
    for label, _ in sides:
        table.add_column(label, width=col, no_wrap=True, overflow="ellipsis")
    if show_source and any(side.source for _, side in sides):
        table.add_row(*(folded_source(side.source or "", col) for _, side in sides))
    table.add_row(*(Text(side.output or "", overflow="fold") for _, side in sides))
    table.add_row(*(Text(timing_line(side), style="dim", overflow="fold") for _, side in sides))
    return table


def print_result(console, result: Result, *, show_source: bool = True, position: str = "") -> None:
    """One comparison: header (with ``position``, "3/16", when given), the two sides (side by side or
    stacked), the checks, notes."""
    from rich.panel import Panel
    from rich.table import Table

    width = console.width
    verdict = "[bold green]PASS[/]" if result.ok else "[bold red]FAIL[/]"
    where = f"[dim]{position}[/] " if position else ""
    console.print(Panel(f"{where}[bold]{result.name}[/]: {result.title}   {verdict}", expand=False))
    sides = [("PyTorch", result.torch), ("JAX", result.jax)]
    col = (width - 7) // 2
    if col >= SIDE_BY_SIDE_MIN:
        console.print(_sides_table(sides, col, show_source))
    else:
        for side in sides:
            console.print(_sides_table([side], max(width - 4, 20), show_source))
    checks = Table(show_header=True, header_style="bold", expand=True)
    checks.add_column("", width=1, no_wrap=True)
    checks.add_column("check", ratio=1, overflow="fold")
    checks.add_column("detail", ratio=2, overflow="fold")
    for c in result.checks:
        checks.add_row("[green]✓[/]" if c.ok else "[red]✗[/]", c.name, c.detail)
    console.print(checks)
    if result.notes and not result.ok:
        console.print(result.notes, markup=False, highlight=False)
    elif result.notes:
        console.print(result.notes, style="dim", markup=False, highlight=False)
    console.print()


def print_summary(console, results: list[Result]) -> None:
    """One row per comparison, in 80 columns: verdict, checks, first call and steady state of each."""
    from rich import box
    from rich.table import Table

    table = Table(title="summary", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    table.add_column("comparison", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("ok", no_wrap=True)
    table.add_column("checks", justify="right", no_wrap=True)
    for head in ("PyTorch\nfirst", "PyTorch\nsteady", "JAX\nfirst", "JAX\nsteady"):
        table.add_column(head, justify="right", no_wrap=True, min_width=7)  # fmt_seconds: at most 7
    for r in results:
        passed = sum(c.ok for c in r.checks)
        table.add_row(r.name, "[green]PASS[/]" if r.ok else "[red]FAIL[/]", f"{passed}/{len(r.checks)}",
                      fmt_seconds(r.torch.seconds), fmt_seconds(r.torch.steady_seconds),
                      fmt_seconds(r.jax.seconds), fmt_seconds(r.jax.steady_seconds))
    console.print(table)
    n_checks, n_passed = sum(len(r.checks) for r in results), sum(c.ok for r in results for c in r.checks)
    console.print(f"{len(results)} comparisons, {n_passed}/{n_checks} checks pass")
    console.print("[dim]first: the timed work run once, tracing and compilation included; steady: the same "
                  "work called again, once compiled; -: not measured (see the comparison's notes)[/]")
