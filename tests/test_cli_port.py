"""`funcnet port`'s own errors: example inputs too large to build, and a model file that ends the
process while it is imported, each one line with exit status 2 and the fix, no traceback."""

from __future__ import annotations

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
def run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)

    def port(source: str, *flags: str) -> tuple[int, str]:
        (tmp_path / "portme.py").write_text(source)
        (tmp_path / "out.py").write_text("# kept\n")
        status = main(["port", "portme.py:Net", "--out", "out.py", *flags])
        assert (tmp_path / "out.py").read_text() == "# kept\n"
        return status, capsys.readouterr().err

    return port


@pytest.mark.parametrize("shape, values", [("100000,100000,100", "1e+12"), ("1,3,99999999999999999999", "3e+20"),
                                           ("268435457", "2.68e+08")])
def test_a_huge_input_shape_is_refused_before_the_model_is_imported(shape, values, run, monkeypatch):
    from funcnet.cli import port

    monkeypatch.setattr(port, "_load_class", lambda *a: pytest.fail("imported the model before checking shapes"))
    status, err = run(MODEL, "--input-shape", shape)
    assert status == 2
    assert err.startswith(f"funcnet port: error: --input-shape {shape}: {values} values") and err.count("\n") == 1
    assert f"more than the {port.INPUT_VALUES_MAX:,} one example input may hold" in err, err
    assert ("a batch of 1: 1,100000,100" in err) == (shape == "100000,100000,100"), err


def test_the_largest_allowed_shape_passes_the_check():
    from funcnet.cli.port import INPUT_VALUES_MAX, _shape

    assert _shape(f"2,{INPUT_VALUES_MAX // 2}") == (2, INPUT_VALUES_MAX // 2)


def test_example_inputs_that_cannot_be_allocated_are_one_line(run, monkeypatch):
    import torch

    def no_memory(*shape, **kw):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(torch, "randn", no_memory)
    status, err = run(MODEL, "--input-shape", "4,3")
    assert status == 2 and err.count("\n") == 1
    assert "the example inputs (--input-shape 4,3) could not be allocated: RuntimeError" in err, err


@pytest.mark.parametrize("where, code, message", [
    ("top", "sys.exit(3)", "portme.py called sys.exit(3) while being imported"),
    ("top", "sys.exit(0)", "portme.py called sys.exit(0) while being imported"),
    ("top", "raise SystemExit('usage: train.py')", "portme.py called sys.exit('usage: train.py') while being imported"),
    ("init", "sys.exit(4)", "Net(*[], **{}) called sys.exit(4)"),
    ("forward", "sys.exit(5)", "Net's forward called sys.exit(5) on the example inputs (--input-shape 1,3)"),
])
def test_a_model_file_that_calls_sys_exit_is_reported_as_such(where, code, message, run):
    source = "import sys\n" + MODEL
    if where == "top":
        source += f"\n{code}\n"
    elif where == "init":
        source = source.replace("        self.fc = torch.nn.Linear(3, 2)\n",
                                f"        self.fc = torch.nn.Linear(3, 2)\n        {code}\n")
    else:
        source = source.replace("        return self.fc(x)\n", f"        {code}\n")
    status, err = run(source, "--input-shape", "1,3")
    assert status == 2 and err.count("\n") == 1
    assert message in err, err


def test_port_weights_keep_the_0d_batchnorm_counter(tmp_path, monkeypatch, capsys):
    import safetensors.torch as st
    import torch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bn.py").write_text("import torch\n\n\nclass Net(torch.nn.Sequential):\n    def __init__(self):\n"
                                    "        super().__init__(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))\n")
    assert main(["port", "bn.py:Net", "--input-shape", "2,3", "--out", "p.py", "--weights", "w.safetensors"]) == 0
    written = st.load_file(tmp_path / "w.safetensors")
    twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    assert {k: tuple(v.shape) for k, v in written.items()} == {k: tuple(v.shape) for k, v in twin.state_dict().items()}
    assert written["1.num_batches_tracked"].shape == () and written["1.num_batches_tracked"].dtype == torch.int64


def test_a_forward_that_raises_is_one_message_naming_module_line_and_inputs(run):
    source = MODEL.replace("        return self.fc(x)\n", "        return self.fc(x.flatten(1))\n")
    status, err = run(source, "--input-shape", "1,2,2")  # 4 features into Linear(3, 2)
    assert status == 2 and "Traceback" not in err, err
    assert err.startswith("funcnet port: error: to_source: the torch forward raised RuntimeError"), err
    assert "fc in train mode" in err and "portme.py:10" in err, err  # the layer and the user's line
    assert "the example inputs were --input-shape 1,2,2" in err, err
