"""python -m comparisons refuses an output path it cannot write before running anything."""

import pytest

from comparisons.__main__ import main


@pytest.mark.parametrize("flags, message", [
    (["--json", "/proc/x.json"], "--json /proc/x.json cannot be written: No such file or directory"),
    (["--html", "/proc/h"], "--html /proc/h cannot be written"),
    (["--json", "{tmp}"], "--json {tmp} is a folder; pass a file path such as {tmp}/results.json"),
    (["--html", "{tmp}/file"], "--html {tmp}/file is a file; pass a folder"),
])
def test_unwritable_outputs_are_refused_before_running(tmp_path, capsys, monkeypatch, flags, message):
    import comparisons.__main__ as runner

    monkeypatch.setattr(runner, "run_one", lambda *a, **k: pytest.fail("ran a comparison before checking outputs"))
    (tmp_path / "file").write_text("x")
    assert main(["tensors", "--no-page", *[f.format(tmp=tmp_path) for f in flags]]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
