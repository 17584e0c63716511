"""The comparison runner and the paradigms comparison: verdicts, exit status, JSON and report."""

import json
from pathlib import Path

import pytest

from comparisons import __main__ as runner
from comparisons import paradigms
from comparisons._core import Check, Options, Result, Seconds, Side, close


def test_paradigms_passes_and_writes_json_and_report(tmp_path, capsys):
    status = runner.main(["paradigms", "--no-source", "--no-page", "--json", str(tmp_path / "r.json"),
                          "--report", str(tmp_path / "report")])
    out = json.loads((tmp_path / "r.json").read_text())
    assert status == 0, [c for r in out["results"] for c in r["checks"] if not c["ok"]]
    (result,) = out["results"]
    assert result["name"] == "paradigms" and result["ok"] and len(result["checks"]) >= 8
    # the timing split: torch eager compiles nothing; JAX's first call traces and compiles
    torch_t, jax_t = result["torch"], result["jax"]
    assert torch_t["compile_seconds"] == 0 and torch_t["steady_seconds"] == torch_t["first_call_seconds"] > 0
    assert 0 < jax_t["compile_seconds"] < jax_t["first_call_seconds"] == jax_t["seconds"]
    assert 0 < jax_t["steady_seconds"] < jax_t["first_call_seconds"]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## paradigms" in report and "PASS" in report
    assert "| JAX first call | JAX compile | JAX steady |" in report


def test_paradigms_perturbed_weight_fails():
    result = paradigms.run(Options(perturb=1e-2))
    failed = result.failed()
    assert not result.ok
    assert "one SGD step: same new weights" in failed


def test_runner_exits_non_zero_on_a_failed_verdict(monkeypatch, tmp_path):
    def fake_run_one(name, opts):
        return Result(name, "fake", Side("a = 1", "1"), Side("a = 2", "2"), [close("values agree", 2.0, 1.0, rtol=0, atol=0)],
                      series={"curve": {"torch": [1.0, 0.5], "jax": [1.0, 0.6]}})

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    assert runner.main(["paradigms", "--no-page", "--report", str(tmp_path)]) == 1
    assert (tmp_path / "paradigms_0.png").stat().st_size > 1000


def test_report_and_json_carry_the_timing_split(monkeypatch, tmp_path):
    fake = Result("paradigms", "fake", Side("a = 1", "1", Seconds(0.015, 0.0, 0.015)),
                  Side("a = 2", "2", Seconds(2.45, 2.4, 0.041)), [Check("c", True, "d")])
    monkeypatch.setattr(runner, "run_one", lambda name, opts: fake)
    assert runner.main(["paradigms", "--no-page", "--report", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "| [paradigms](#paradigms) | PASS | 1/1 | 15.0 ms | 15.0 ms | 2.45 s | 2.40 s | 41.0 ms |" in report
    assert "### JAX (first call 2.45 s, compile 2.40 s, steady 41.0 ms)" in report
    assert "### PyTorch (first call 15.0 ms, compile n/a, steady 15.0 ms)" in report  # eager compiles nothing
    (result,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert result["jax"] == {"output": "2", "source": "a = 2", "seconds": 2.45, "first_call_seconds": 2.45, "compile_seconds": 2.4,
                             "steady_seconds": 0.041}


def test_runner_list_and_unknown_name(capsys):
    assert runner.main(["--list"]) == 0
    assert "paradigms" in capsys.readouterr().out
    assert runner.main(["no_such_thing"]) == 2
    assert "unknown comparison(s): no_such_thing" in capsys.readouterr().err


def test_a_crashing_comparison_is_a_failure(monkeypatch):
    import importlib

    real_import = importlib.import_module

    def broken(name, *a):
        if name == "comparisons.paradigms":
            raise RuntimeError("boom")
        return real_import(name, *a)

    monkeypatch.setattr(runner.importlib, "import_module", broken)
    result = runner.run_one("paradigms", Options())
    assert not result.ok and "boom" in result.checks[0].detail


def test_result_needs_at_least_one_check():
    assert not Result("x", "x", Side("", ""), Side("", ""), []).ok
    assert Result("x", "x", Side("", ""), Side("", ""), [Check("c", True, "")]).ok


def test_from_json_renders_a_saved_run_without_running(monkeypatch, tmp_path, capsys):
    def fake_run_one(name, opts):
        return Result(name, "fake title", Side("a = 1", "torch printed this", Seconds(0.5)),
                      Side("b = 1", "jax printed this", Seconds(2.0, compile=1.5, steady=0.1)),
                      [close("values agree", 1.0, 1.0, rtol=0, atol=0), Check("counted", True, "3 == 3")],
                      notes="a note", series={"curve": {"torch": [1.0, 0.5], "jax": [1.0, 0.5]}})

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    assert runner.main(["tensors", "autograd", "--no-source", "--no-page", "--json", str(tmp_path / "r.json")]) == 0
    ran = capsys.readouterr().out
    assert "1/2" in ran and "2/2" in ran and "2 comparisons, 4/4 checks pass" in ran

    def must_not_run(name, opts):
        raise AssertionError("--from-json ran a comparison")

    monkeypatch.setattr(runner, "run_one", must_not_run)
    assert runner.main(["--from-json", str(tmp_path / "r.json"), "--html", str(tmp_path / "page")]) == 0
    page = (tmp_path / "page" / "index.html").read_text()
    for shown in ("torch printed this", "jax printed this", "src highlight torch", "values agree", "a note",
                  "4/4 checks pass", "data:image/png;base64,"):
        assert shown in page, shown
    assert ">n/a<" in page  # torch eager: nothing compiled, not "0.00 ms"
    assert "2 comparisons, 4/4 checks pass" in capsys.readouterr().out


def test_from_json_refuses_a_file_that_is_no_saved_run(tmp_path, capsys):
    (tmp_path / "x.json").write_text('{"something": 1}')
    assert runner.main(["--from-json", str(tmp_path / "x.json"), "--html", str(tmp_path / "page")]) == 2
    assert "not a run written by --json" in capsys.readouterr().err


def test_relative_error_is_reported_only_where_the_reference_is_clear_of_zero():
    # near zero a rounding-sized difference over a tiny reference is a meaningless ratio
    check = close("tiny reference", [1e-300, 2.0], [1e-310, 2.0 + 2e-7], rtol=1e-6, atol=1e-5)
    assert check.ok and "max rel 1.00e-07" in check.detail, check.detail
    check = close("all near zero", [1e-9], [0.0], rtol=1e-6, atol=1e-5)
    assert check.ok and "max rel n/a" in check.detail


def test_progress_reaches_the_runners_bar_and_is_silent_without_it():
    import io

    from rich.console import Console

    from comparisons import _core

    assert list(_core.progress(range(3), "steps")) == [0, 1, 2]  # no runner: nothing shown, items unchanged
    seen = []
    with _core.showing_progress(lambda *a: seen.append(a)):
        list(_core.progress(["a", "b"], "configurations"))
        list(_core.progress(iter("xyz"), "a generator", total=None))
    assert seen == [("configurations", 0, 2), ("configurations", 1, 2), ("configurations", 2, 2),
                    ("a generator", 0, None), ("a generator", 1, None), ("a generator", 2, None),
                    ("a generator", 3, None)]
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with runner._progress_bar(console, "[1/1] running fake"):
        for _ in _core.progress(range(4), "training steps"):
            pass
    shown = out.getvalue()
    assert "[1/1] running fake: training steps" in shown and "4/4" in shown


def _fake(name, opts):
    return Result(name, "fake", Side("a = 1", "1", Seconds(0.01)), Side("a = 1", "1", Seconds(0.02)),
                  [Check("c", True, "d")])


def test_a_run_writes_its_page_and_json_under_runs_by_default_and_says_where_last(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "run_one", _fake)
    assert runner.main(["tensors", "--no-source"]) == 0
    folder = tmp_path / "runs" / "comparisons"
    assert sorted(p.name for p in folder.iterdir()) == ["index.html", "results.json"]  # no temporary file left
    assert 'id="cmp-tensors"' in (folder / "index.html").read_text(encoding="utf-8")
    (saved,) = json.loads((folder / "results.json").read_text())["results"]
    assert saved["name"] == "tensors" and saved["ok"]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[-2:] == [f"page written to {Path('runs', 'comparisons', 'index.html')}",
                          f"results written to {Path('runs', 'comparisons', 'results.json')}"]
    # the saved JSON re-renders the page in place (it is the input then: not written over)
    monkeypatch.setattr(runner, "run_one", lambda *a: pytest.fail("--from-json ran a comparison"))
    before = (folder / "results.json").read_bytes()
    assert runner.main(["--from-json", str(folder / "results.json"), "--no-source"]) == 0
    assert (folder / "results.json").read_bytes() == before
    assert capsys.readouterr().out.rstrip().endswith(f"page written to {Path('runs', 'comparisons', 'index.html')}")
    # a default output that is the --from-json input is refused, as an explicit one is
    assert runner.main(["--from-json", str(folder / "index.html")]) == 2
    assert f"--html runs/comparisons/index.html is --from-json {folder / 'index.html'}" in capsys.readouterr().err


def test_no_page_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "run_one", _fake)
    assert runner.main(["tensors", "--no-source", "--no-page"]) == 0
    assert list(tmp_path.iterdir()) == []


def test_the_screenshot_helper_without_selenium_is_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    import sys

    from comparisons import _screenshot

    page = tmp_path / "index.html"
    page.write_text("<html></html>")
    monkeypatch.setitem(sys.modules, "selenium", None)  # `import selenium` raises ImportError, as when missing
    assert _screenshot.main([str(page), str(tmp_path / "shot.png")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err == ('python -m comparisons._screenshot: error: selenium is not installed; it comes with the '
                            'test extra: pip install -e ".[test]"\n')
    assert not (tmp_path / "shot.png").exists()


def test_a_log_gets_a_line_per_stage_of_a_comparison(capsys):
    # not a terminal (CI, a pipe): no bar redrawn in place, one stderr line each time a stage begins
    import io

    from rich.console import Console

    from comparisons import _core

    def torch_side():
        return 1

    with runner._progress_bar(Console(file=io.StringIO()), "[1/2] running demo"):
        _core.timed(torch_side)
        for _ in _core.progress(range(3), "JAX: steps"):
            pass
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit(" (", 1)[0] for line in lines] == ["[1/2] running demo: torch_side",
                                                           "[1/2] running demo: JAX: steps"], lines
    assert all(line.endswith(" s)") for line in lines)
