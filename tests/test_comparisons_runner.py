"""The comparison runner and the paradigms comparison: verdicts, exit status, JSON and report."""

import json


from comparisons import __main__ as runner
from comparisons import paradigms
from comparisons._core import Check, Options, Result, Side, close


def test_paradigms_passes_and_writes_json_and_report(tmp_path, capsys):
    status = runner.main(["paradigms", "--no-source", "--json", str(tmp_path / "r.json"),
                          "--report", str(tmp_path / "report")])
    out = json.loads((tmp_path / "r.json").read_text())
    assert status == 0, [c for r in out["results"] for c in r["checks"] if not c["ok"]]
    (result,) = out["results"]
    assert result["name"] == "paradigms" and result["ok"] and len(result["checks"]) >= 8
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## paradigms" in report and "PASS" in report


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
    assert runner.main(["paradigms", "--report", str(tmp_path)]) == 1
    assert (tmp_path / "paradigms_0.png").stat().st_size > 1000


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
