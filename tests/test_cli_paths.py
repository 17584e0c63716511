"""No command writes over its own input: `funcnet port`, `funcnet train` and `python -m comparisons`
refuse an output path that is an input (the same resolved path, a symlink to it or a hard link),
naming both, before any work starts, and leave the input byte for byte as it was."""

from __future__ import annotations

import os

import pytest

from funcnet.cli import main

MODEL = """import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)
"""


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "usermodel.py"
    path.write_text(MODEL)
    return path


def _alias(kind: str, target, tmp_path) -> str:
    """Another name for ``target``: the same path relative to the current folder, a symlink, a hard link."""
    if kind == "relative":
        os.mkdir(tmp_path / "sub")
        return os.path.join("sub", "..", target.name)
    link = tmp_path / f"{kind}.py"
    (os.symlink if kind == "symlink" else os.link)(target, link)
    return str(link)


@pytest.mark.parametrize("flag", ["--out", "--weights"])
@pytest.mark.parametrize("kind", ["same", "relative", "symlink", "hardlink"])
def test_port_refuses_to_write_over_the_model_file(flag, kind, model_file, tmp_path, capsys, monkeypatch):
    from funcnet.cli import port

    monkeypatch.setattr(port, "_load_class", lambda *a: pytest.fail("imported the model before checking paths"))
    target = str(model_file) if kind == "same" else _alias(kind, model_file, tmp_path)
    other = {"--out": ["--weights", str(tmp_path / "w.safetensors")], "--weights": ["--out", str(tmp_path / "p.py")]}
    argv = ["port", f"{model_file}:Net", "--input-shape", "1,3", flag, target, *other[flag]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} {target} is the model file {model_file}" in err and "would destroy it" in err, err
    assert model_file.read_text() == MODEL
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".py" and p.name != "sub") == []


def test_port_still_writes_beside_the_model_file_and_refuses_out_equal_weights(model_file, tmp_path, capsys):
    assert main(["port", "usermodel.py:Net", "--input-shape", "1,3", "--out", "usermodel_port.py"]) == 0
    assert "nn.Linear(3, 2)" in (tmp_path / "usermodel_port.py").read_text()
    assert main(["port", "usermodel.py:Net", "--input-shape", "1,3", "--out", "a.py", "--weights", "./a.py"]) == 2
    assert "--out a.py and --weights ./a.py are the same file" in capsys.readouterr().err
    assert not (tmp_path / "a.py").exists()


def test_train_refuses_an_out_folder_that_holds_its_data_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "run" / "mnist"
    data.mkdir(parents=True)
    (data / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03")
    os.symlink(tmp_path / "run", tmp_path / "run-link")
    for out in ("run", "run-link", "run/mnist"):
        assert main(["train", "--dataset", "mnist", "--data-dir", "run/mnist", "--out", out, "--quiet"]) == 2
        err = capsys.readouterr().err
        where = "is" if out == "run/mnist" else "holds"
        assert f"--out {out} {where} --data-dir run/mnist ({data})" in err, err
    assert (data / "train-images-idx3-ubyte").read_bytes() == b"\x00\x00\x08\x03"


@pytest.mark.parametrize("flags", [["--report", "{d}"], ["--html", "{d}"]])
def test_comparisons_refuse_to_write_over_from_json(flags, tmp_path, capsys, monkeypatch):
    import comparisons.__main__ as runner

    monkeypatch.setattr(runner, "run_one", lambda *a, **k: pytest.fail("ran a comparison before checking outputs"))
    name = "report.md" if flags[0] == "--report" else "index.html"
    saved = tmp_path / name
    saved.write_text('{"dtype": "float32", "results": []}\n')
    assert runner.main(["--from-json", str(saved), *[f.format(d=tmp_path) for f in flags]]) == 2
    err = capsys.readouterr().err
    assert f"{flags[0]} {tmp_path / name} is --from-json {saved}" in err, err
    assert saved.read_text() == '{"dtype": "float32", "results": []}\n'


def test_comparisons_refuse_two_outputs_on_one_file(tmp_path, capsys, monkeypatch):
    import comparisons.__main__ as runner

    monkeypatch.setattr(runner, "run_one", lambda *a, **k: pytest.fail("ran a comparison before checking outputs"))
    assert runner.main(["tensors", "--json", str(tmp_path / "index.html"), "--html", str(tmp_path)]) == 2
    assert f"--json {tmp_path / 'index.html'} and --html {tmp_path / 'index.html'} are the same file" in \
        capsys.readouterr().err


def test_the_helper_compares_resolved_paths_and_inodes_not_strings(tmp_path):
    from funcnet.cli.errors import UsageError
    from funcnet.cli.outputs import refuse_overwriting_inputs

    a = tmp_path / "a.txt"
    a.write_text("x")
    os.link(a, tmp_path / "b.txt")
    with pytest.raises(UsageError, match="--out .*b.txt is the input .*a.txt"):
        refuse_overwriting_inputs([("--out", tmp_path / "b.txt", False)], [("the input", a)])
    refuse_overwriting_inputs([("--out", tmp_path / "c.txt", False)], [("the input", a)])  # a new file: fine
    refuse_overwriting_inputs([("--out", tmp_path, False)], [("the input", a)])  # a folder not replaced whole
    with pytest.raises(UsageError, match="holds the input"):
        refuse_overwriting_inputs([("--out", tmp_path, True)], [("the input", a)])
