"""The terminal view at 80 and 160 columns: stacked or side by side, no source line broken
inside a token, a summary that fits 80 columns, and the first-call/steady timing split."""

import io
import tokenize
from pathlib import Path

import pytest

from comparisons import __main__ as runner
from comparisons._core import Check, Result, Seconds, Side, fmt_seconds, timed
from comparisons._terminal import CONTINUATION, SIDE_BY_SIDE_MIN, fold_line, fold_points

ROOT = Path(runner.__file__).parent
NAMES = runner.available()


def _sources():
    """Every comparison file, whole: each terminal test folds all their real lines."""
    return {name: (ROOT / f"{name}.py").read_text().rstrip("\n") for name in NAMES}


def _halves(text):
    """The file cut at the top-level def or class nearest its middle: each half tokenizes alone."""
    lines = text.split("\n")
    cuts = [i for i, line in enumerate(lines) if line.startswith(("def ", "class ", "@"))
            and not (i and lines[i - 1].startswith("@"))]
    cut = min(cuts, key=lambda i: abs(i - len(lines) // 2))
    return "\n".join(lines[:cut]).rstrip("\n"), "\n".join(lines[cut:])


def _fake_results(sources):
    """A Result per comparison: the first half of its file as the torch source, the second as JAX's."""
    fakes = {}
    for name, text in sources.items():
        first, second = _halves(text)
        fakes[name] = Result(name, f"title of {name}", Side(first, f"{name} torch output", Seconds(0.015, 0.0, 0.015)),
                             Side(second, f"{name} jax output", Seconds(2.45, 2.4, 0.041)),
                             [Check(f"{name} agrees", True, "max |diff| 0 (rtol 1e-06, atol 1e-05)")])
    return fakes


def _token_spans(source):
    """Per line of ``source``, (start col, end col, type) of its one-line tokens."""
    spans = {}
    for tok in tokenize.generate_tokens(io.StringIO(source + "\n").readline):
        if tok.start[0] == tok.end[0]:
            spans.setdefault(tok.start[0] - 1, []).append((tok.start[1], tok.end[1], tok.type))
    return spans


def _render(monkeypatch, capsys, columns, *flags):
    sources = _sources()
    fakes = _fake_results(sources)
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setattr(runner, "run_one", lambda name, opts: fakes[name])
    assert runner.main([*sources, "--no-page", *flags]) == 0
    return capsys.readouterr().out, sources, fakes


def _source_cells(out):
    """Per rendered table, the source cell's rows, one list per column (header order)."""
    tables, lines = [], out.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("╭") and i + 2 < len(lines) and lines[i + 2].startswith("├"):
            header = [c.strip() for c in lines[i + 1][1:-1].split("│")]
            if header[0] not in ("PyTorch", "JAX"):
                continue
            columns = [[] for _ in header]
            for row in lines[i + 3:]:
                if row.startswith("├") or row.startswith("╰"):
                    break
                for k, cell in enumerate(row[1:-1].split("│")):
                    columns[k].append(cell[1:].rstrip())
            tables.append((header, columns))
    return tables


def _check_column(rows, source):
    """The rows rebuild ``source`` line by line, and every fold lies between two tokens
    (or after a space inside a string or comment)."""
    originals = source.split("\n")
    logical = []
    for row in rows:
        stripped = row.lstrip(" ")
        if stripped.startswith(CONTINUATION.strip()):
            assert logical, row
            logical[-1].append(stripped[len(CONTINUATION):])
        else:
            logical.append([row])
    while len(logical) > len(originals) and logical[-1] == [""]:  # the shorter column's padding
        logical.pop()
    assert len(logical) == len(originals), (len(logical), len(originals))
    spans = _token_spans(source)
    folds = 0
    for n, (pieces, original) in enumerate(zip(logical, originals)):
        pos = 0
        for k, piece in enumerate(pieces):
            text = piece.rstrip("…") if piece.endswith("…") else piece
            text = text.strip(" ") if k else text.rstrip(" ")
            at = original.find(text, pos) if text else pos
            assert at >= pos, f"line {n + 1}: {piece!r} not found in {original!r}"
            if k:
                folds += 1
                for start, end, kind in spans.get(n, ()):
                    if start < at < end:
                        assert kind in (tokenize.STRING, tokenize.COMMENT) and original[at - 1] == " ", (
                            f"line {n + 1} folded inside the token {original[start:end]!r}: {pieces}")
            if not piece.endswith("…"):
                assert k or piece == original[: len(piece)], (piece, original)
            pos = at + len(text)
        assert pieces[-1].endswith("…") or pos == len(original.rstrip()), (pieces, original)
    return folds


@pytest.mark.parametrize("columns", [80, 160])
def test_no_source_line_is_broken_inside_a_token(monkeypatch, capsys, columns):
    out, sources, fakes = _render(monkeypatch, capsys, columns)
    assert max(len(line) for line in out.split("\n")) <= columns
    tables = _source_cells(out)
    if columns >= 2 * SIDE_BY_SIDE_MIN + 7:
        assert all(header == ["PyTorch", "JAX"] for header, _ in tables) and len(tables) == len(NAMES)
    else:  # one source above the other
        assert [header for header, _ in tables] == [["PyTorch"], ["JAX"]] * len(NAMES)
    folds = 0
    for i, (header, column_rows) in enumerate(tables):
        name = NAMES[i if len(header) == 2 else i // 2]
        for label, rows in zip(header, column_rows):
            side = fakes[name].torch if label == "PyTorch" else fakes[name].jax
            folds += _check_column(rows, side.source)
    assert folds > (100 if columns == 80 else 10)  # the check has folds to look at


def test_summary_fits_80_columns_with_the_timing_split(monkeypatch, capsys):
    out, _, _ = _render(monkeypatch, capsys, 80, "--no-source")
    summary = out[out.index("summary"):].split("\n")
    assert max(len(line) for line in summary) <= 80
    for name in NAMES:  # whole names, first call and steady state of both
        row = next(line for line in summary if line.split()[:1] == [name])
        assert row.split()[1:] == ["PASS", "1/1", "15.0", "ms", "15.0", "ms", "2.45", "s", "41.0", "ms"], row
    assert "first call 2.45 s (compile 2.40 s), steady 41.0 ms" in out
    assert "first call 15.0 ms (nothing compiled), steady 15.0 ms" in out


def test_fold_points_keep_names_whole():
    code = 'loss = torch.nn.functional.cross_entropy(model(x), y)  # a comment here\ns = "two words"'
    points = fold_points(code)
    line = code.split("\n")[0]
    for name in ("torch.nn.functional.cross_entropy", "model", "comment"):
        start = line.index(name)
        assert not any(start < p < start + len(name) for p in points[0]), name
    assert line.index("model") in points[0] and line.index("here") in points[0]
    assert points[1] == {code.split("\n")[1].index("words")}  # not around "=", inside the string after its space
    spans = fold_line(line, points[0], 30)
    assert "".join(line[a:b] for a, b in spans) == line
    assert all(a in points[0] for a, _ in spans[1:])


def test_fmt_seconds_is_short():
    cases = {None: "-", 0.00042: "0.42 ms", 0.0152: "15.2 ms", 0.153: "153 ms", 2.451: "2.45 s", 15.3: "15.3 s"}
    assert {k: fmt_seconds(k) for k in cases} == cases


def test_timed_splits_compile_from_the_steady_state():
    import jax
    import jax.numpy as jnp

    def fn(x):
        for i in range(12):
            x = jnp.tanh(x @ x.T + i)
        return x

    f = jax.jit(fn)
    x = jnp.ones((64, 64))
    out, first = timed(f, x)
    assert isinstance(first, Seconds) and float(first) > first.compile > 0  # the jit traced and compiled
    assert first.steady is not None and first.steady < float(first)
    _, warm = timed(f, x)  # already compiled: its own steady state, independent of the first measurement
    assert warm.compile == 0 and warm.steady == float(warm)
    assert first.steady < 20 * float(warm) + 0.05
    assert float(jnp.abs(out - fn(x)).max()) == 0.0  # the first call's result is returned

    calls = []
    _, t = timed(lambda: calls.append(1) or jax.jit(lambda v: v * 3)(x), steady=False)
    assert t.compile > 0 and t.steady is None and len(calls) == 1  # not called again
    side = Side("", "", t)
    assert (side.seconds, side.compile_seconds, side.steady_seconds) == (float(t), t.compile, None)
    assert (Seconds(1.0, 0.5, 0.2) + Seconds(2.0, 0.0, 2.0)).steady == pytest.approx(2.2)
