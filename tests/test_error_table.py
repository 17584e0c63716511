"""Bad input and damaged files beyond ``funcnet train``'s flags: each case ends OK (exit 0, and
whatever stderr line the table gives) or CLEAR (the exit status or exception the table gives,
and exactly one line naming the file or value, what was expected and the fix) - never a
traceback, a silent success, or a wait without end.

``CASES`` is the table; docs/errors.md's section "Damaged files and other calls" is its
rendering (``render()``), which ``test_errors_md_shows_this_table`` keeps equal, and
``python tests/test_cli.py docs/errors.md`` writes. A message is matched whole: ``<name>``
stands for a temporary path of the context, ``…`` for text of another library (safetensors',
zipfile's) that the message quotes.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Damaged files and other calls"


class Case(NamedTuple):
    call: str  # as the docs show it
    run: Callable  # ctx -> (code, stdout, stderr line(s) or exception message)
    status: str  # "OK" or "CLEAR"
    code: object  # the exit status, or the exception's class name
    line: str  # the one stderr line (or the exception's message); "" for none
    check: Callable | None = None  # ctx, stdout -> None: what an OK case must have written


def _main(*argv):
    from funcnet.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as e:  # argparse exits by itself
            status = e.code
    return status, out.getvalue(), err.getvalue()


def _cli(*argv):
    return lambda ctx: _main(*(a.format_map(ctx) for a in argv))


def _raises(thunk):
    def run(ctx):
        try:
            thunk(ctx)
        except Exception as e:  # the table records what is raised
            return type(e).__name__, "", str(e)
        return "no error", "", ""

    return run


# ---- the context: small runs, checkpoints and files, made once ------------------------------

def _lm_run(folder: Path, kind: str, blank: bool = False) -> None:
    """A --out folder as ``funcnet train --model KIND`` writes it (metrics.json's config,
    params.npz in state_dict keys), with freshly initialised weights: no training needed to
    test what sample does with them. ``blank``: the decoder's bias makes a space the likeliest
    character everywhere, as in an LSTM trained a few steps."""
    import jax
    import numpy as np

    from funcnet import state_dict, text
    from funcnet.cli.train import text_model
    from types import SimpleNamespace

    config = {"model": kind, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 16, "remat": None}
    params = text_model(SimpleNamespace(**config), text.vocabulary().size).init(jax.random.key(0))
    flat = {k: np.array(v) for k, v in state_dict(params).items()}
    if blank:
        flat["decoder.bias"][text.vocabulary().encode(" ")[0]] = 100.0
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"config": config}))
    np.savez(folder / "params.npz", **flat)


def _copy_with(src: Path, dst: Path, name: str, edit) -> None:
    shutil.copytree(src, dst)
    edit(dst / name)


def _cut(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _flip(at: int | None):
    def edit(path: Path) -> None:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2 if at is None else at] ^= 0xFF
        path.write_bytes(bytes(raw))

    return edit


def _edit_config(change):
    def edit(path: Path) -> None:
        metrics = json.loads(path.read_text())
        change(metrics["config"])
        path.write_text(json.dumps(metrics))

    return edit


def _hf(folder: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)).save_pretrained(folder)


def _lm_runs(root: Path) -> None:
    _lm_run(root / "gpt", "gpt")
    _lm_run(root / "blank", "lstm", blank=True)
    _copy_with(root / "gpt", root / "npzcut", "params.npz", _cut)
    _copy_with(root / "gpt", root / "npzflip", "params.npz", _flip(None))  # inside an array: the zip's CRC
    _copy_with(root / "gpt", root / "noblock", "metrics.json", _edit_config(lambda c: c.pop("block_size")))
    _copy_with(root / "gpt", root / "strembd", "metrics.json", _edit_config(lambda c: c.update(n_embd="16")))


def _hf_folders(root: Path) -> None:
    _hf(root / "hf")
    _copy_with(root / "hf", root / "hfcut", "model.safetensors", _cut)
    _copy_with(root / "hf", root / "hfhead", "model.safetensors", _flip(20))  # inside the JSON header
    _copy_with(root / "hf", root / "hfconfig", "config.json", lambda p: p.write_text(
        p.read_text().replace('"hidden_size": 32', '"hidden_size": 48')))


def _files(root: Path) -> None:
    (root / "net").mkdir()
    (root / "net" / "net.py").write_text("import torch\n\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
                                         "        super().__init__()\n        self.fc = torch.nn.Linear(4, 2)\n\n"
                                         "    def forward(self, x):\n        return self.fc(x)\n")
    (root / "net" / "shp.py").write_text("import torch\n\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n"
                                         "        super().__init__()\n        self.a, self.b = torch.nn.Linear(4, 2), "
                                         "torch.nn.Linear(4, 2)\n\n    def forward(self, x):\n"
                                         "        if x.shape[0] > 2:\n            return self.a(x)\n"
                                         "        return self.b(x)\n")
    (root / "out").mkdir()


# each group of paths is made when a case first names one of them: pytest-xdist may give the cases
# to several processes, each with its own context, and a process makes only what its cases use
_GROUPS = {_lm_runs: ("gpt", "blank", "npzcut", "npzflip", "noblock", "strembd"),
           _hf_folders: ("hf", "hfcut", "hfhead", "hfconfig"), _files: ("missing", "net", "out")}


class Context(dict):
    """``{name: path}`` of the temporary runs and files the cases name, made on first use."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> str:
        make = next(make for make, names in _GROUPS.items() if name in names)
        make(self.root)
        self.update({n: str(self.root / n) for n in _GROUPS[make]})
        return self[name]


def make_context(root: Path) -> Context:
    return Context(root)


# ---- the OK cases' extra checks and the calls that need more than one line ------------------

def _notes_the_branch(ctx, out):
    assert out == (f"wrote {ctx['out']}/shp_port.py (12 lines); note: forward branches on a shape at shp.py:10 "
                   f"(x.shape[0] > 2): the port keeps the branch that --input-shape 4,4 took and refuses, in one "
                   f"line (size_check), a call that would take another\n"), out
    assert "size_check(x.shape[0] > 2, 'x.shape[0] > 2', 'shp.py:10')" in Path(ctx["out"], "shp_port.py").read_text()


def _greedy_text(ctx):
    return _main("sample", ctx["gpt"], "--tokens", "20", "--temperature", "0")[1]


def _same_as_greedy(ctx, out):
    # divided by a temperature this small every logit but the largest goes to -inf: the argmax
    assert out == _greedy_text(ctx) and len(out) == 21 and out.strip(), out


def _blanks(ctx, out):
    assert out == " " * 80 + "\n", repr(out)


def _loss_without_reduction(ctx):
    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import fit, nn

    calls = []

    def my_loss(outputs, targets):
        calls.append(1)  # traced as soon as a step compiles
        return jnp.mean((outputs[:, 0] - targets) ** 2)

    x, y = jnp.ones((64, 3)), jnp.zeros(64, jnp.int32)
    try:
        fit(nn.Linear(3, 2), optax.sgd(0.1), (x, y), (x, y), loss_fn=my_loss, epochs=1, batch_size=16,
            key=jax.random.key(0), progress=False)
    finally:
        assert not calls, "the loss ran (an epoch started) before the refusal"


def _full_disk(target: str, name: str):
    """``funcnet ARGV`` with ``target`` (module.attribute) raising ENOSPC, as a full disk."""

    def run(ctx):
        import importlib

        module, attribute = target.rsplit(".", 1)
        owner = importlib.import_module(module)
        real = getattr(owner, attribute)

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        setattr(owner, attribute, full)
        try:
            return _main(*(a.format_map(ctx) for a in _FULL_DISK_ARGV[name]))
        finally:
            setattr(owner, attribute, real)

    return run


_FULL_DISK_ARGV = {
    "port": ["port", "{net}/net.py:Net", "--input-shape", "1,4", "--out", "{out}/net_port.py"],
    "weights": ["port", "{net}/net.py:Net", "--input-shape", "1,4", "--out", "{out}/net_port.py", "--weights",
                "{out}/net.safetensors"],
    "stream": ["train", "--quiet", "--epochs", "1", "--hidden", "8", "--batch-size", "128", "--stream",
               "{out}/records", "--out", "{out}/run"],
}


def _stream_under_missing_parents(ctx):
    import numpy as np
    from types import SimpleNamespace

    from funcnet.cli.stream import _stream

    args = SimpleNamespace(stream=f"{ctx['missing']}/deeper/records", dataset="digits", batch_size=4, seed=0,
                           workers=0)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _stream(args, None, np.ones((8, 64), np.float32), np.arange(8, dtype=np.int32))
    return 0, out.getvalue(), ""


def _records_written(ctx, out):
    from funcnet import loader

    assert out.startswith(f"--stream {ctx['missing']}/deeper/records: wrote the 8 training examples"), out
    assert len(loader.Records(f"{ctx['missing']}/deeper/records")) == 8


def _peer_never_joins(ctx):
    code = ("from funcnet import parallel\n"
            "parallel.initialize('127.0.0.1:' + __import__('sys').argv[1], 2, 0, initialization_timeout=1)\n"
            "print('joined')\n")
    import socket

    with socket.socket() as s:  # a free port: nothing else answers there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code, str(port)], capture_output=True, text=True, timeout=120,
                          env=env)
    return proc.returncode, proc.stdout, proc.stderr.replace(f"127.0.0.1:{port}", "127.0.0.1:<port>")


def _call_the_torch_way(ctx):
    import jax.numpy as jnp

    from funcnet import nn

    nn.MLP([4, 8, 2])(jnp.ones((1, 4)))


def _from_pretrained(ctx):
    from funcnet import interop

    interop.from_pretrained(ctx["hfcut"])


CASES = [
    # funcnet sample
    Case("funcnet sample <gpt> --temperature 1e-39", _cli("sample", "{gpt}", "--temperature", "1e-39"), "CLEAR", 2,
         "funcnet sample: error: argument --temperature: expected 0 (greedy) or a temperature of at least 1.175e-38 "
         "(float32's smallest normal number), got 1e-39: the logits divided by it overflow; pass 0 for the likeliest "
         "character each time (see funcnet sample --help)"),
    Case("funcnet sample <gpt> --temperature 1e-37 --tokens 20",
         _cli("sample", "{gpt}", "--temperature", "1e-37", "--tokens", "20"), "OK", 0, "", _same_as_greedy),
    Case("funcnet sample <blank> --temperature 0 --tokens 80 (an LSTM that predicts spaces)",
         _cli("sample", "{blank}", "--temperature", "0", "--tokens", "80"), "OK", 0,
         "funcnet sample: note: the 80 greedy sampled characters are all blanks (spaces): the model in <blank> "
         "predicts nothing but whitespace, so it is undertrained; train it longer (more --epochs or --max-steps) or "
         "sample with --temperature 0.8", _blanks),
    Case("funcnet sample <gpt> --tokens 100000000", _cli("sample", "{gpt}", "--tokens", "100000000"), "CLEAR", 2,
         "funcnet sample: error: argument --tokens: expected at most 100000 characters, got 100000000: each is one "
         "forward pass of the model and nothing is printed before the last; sample in pieces, each --prompt the end "
         "of the last (see funcnet sample --help)"),
    Case("funcnet sample <npzcut> (params.npz cut in half)", _cli("sample", "{npzcut}"), "CLEAR", 2,
         "funcnet sample: error: <npzcut>/params.npz is damaged (BadZipFile: …); it is not the params.npz funcnet "
         "train wrote: train again, or sample from the run's --checkpoint-dir"),
    Case("funcnet sample <npzflip> (one byte of params.npz flipped)", _cli("sample", "{npzflip}"), "CLEAR", 2,
         "funcnet sample: error: <npzflip>/params.npz is damaged (BadZipFile: Bad CRC-32 for file …); it is not the "
         "params.npz funcnet train wrote: train again, or sample from the run's --checkpoint-dir"),
    Case("funcnet sample <noblock> (block_size deleted from metrics.json)", _cli("sample", "{noblock}"), "CLEAR", 2,
         "funcnet sample: error: <noblock>/metrics.json: the run's flags there do not build a model (AttributeError: "
         "'types.SimpleNamespace' object has no attribute 'block_size'); the file was edited or is not funcnet "
         "train's: pass an untouched --out folder or --checkpoint-dir"),
    Case("funcnet sample <strembd> (n_embd \"16\", a string, in metrics.json)", _cli("sample", "{strembd}"), "CLEAR",
         2, "funcnet sample: error: <strembd>/metrics.json: the run's flags there do not build a model (ValueError: "
            "GPTConfig: n_embd must be a positive int, got '16'); the file was edited or is not funcnet train's: pass "
            "an untouched --out folder or --checkpoint-dir"),
    # funcnet port and interop.from_pretrained
    Case("funcnet port --hf <hfcut> (model.safetensors cut in half)",
         _cli("port", "--hf", "{hfcut}", "--out", "{out}/a.py"), "CLEAR", 2,
         "funcnet port: error: from_pretrained: <hfcut>/model.safetensors is damaged (Error while deserializing "
         "header: …); it is not a whole safetensors file: save the model again with save_pretrained, or copy the "
         "file again"),
    Case("funcnet port --hf <hfhead> (a byte of the safetensors header flipped)",
         _cli("port", "--hf", "{hfhead}", "--out", "{out}/a.py"), "CLEAR", 2,
         "funcnet port: error: from_pretrained: <hfhead>/model.safetensors is damaged (Error while deserializing "
         "header: …); it is not a whole safetensors file: save the model again with save_pretrained, or copy the "
         "file again"),
    Case("funcnet port --hf <hfconfig> (config.json's hidden_size 48, the weights' 32)",
         _cli("port", "--hf", "{hfconfig}", "--out", "{out}/a.py"), "CLEAR", 2,
         "funcnet port: error: from_pretrained: <hfconfig>/config.json does not match the weights in "
         "<hfconfig>/model.safetensors: …: the file holds […32], config.json makes […48] (and 11 more); use the "
         "config.json saved with these weights (save_pretrained writes both)"),
    Case("interop.from_pretrained(<hfcut>)", _raises(_from_pretrained), "CLEAR", "ConversionError",
         "from_pretrained: <hfcut>/model.safetensors is damaged (Error while deserializing header: …); it is not a "
         "whole safetensors file: save the model again with save_pretrained, or copy the file again"),
    Case("funcnet port <net>/net.py:Net --input-shape 1,4 --seed 18446744073709551616",
         _cli("port", "{net}/net.py:Net", "--input-shape", "1,4", "--seed", "18446744073709551616", "--out",
              "{out}/b.py"), "CLEAR", 2,
         "funcnet port: error: argument --seed: expected an integer in [0, 4294967295], got '18446744073709551616' "
         "(see funcnet port --help)"),
    Case("funcnet port <net>/shp.py:Net --input-shape 4,4 (its forward: if x.shape[0] > 2: ...) says so on stdout",
         _cli("port", "{net}/shp.py:Net", "--input-shape", "4,4", "--out", "{out}/shp_port.py"), "OK", 0, "",
         _notes_the_branch),
    Case("funcnet port <net>/net.py:Net --input-shape 1,4 --out <out>/net_port.py on a full disk",
         _full_disk("funcnet.cli.port.write_atomic", "port"), "CLEAR", 2,
         "funcnet port: error: [Errno 28] --out <out>/net_port.py: could not write it: No space left on device; the "
         "file that was there (if any) is left as it was: free space there or pass a path on another disk"),
    Case("funcnet port <net>/net.py:Net --input-shape 1,4 --out <out>/net_port.py --weights <out>/net.safetensors "
         "on a full disk", _full_disk("funcnet.interop.save_safetensors", "weights"), "CLEAR", 2,
         "funcnet port: error: [Errno 28] --weights <out>/net.safetensors: could not write it: No space left on "
         "device; the file that was there (if any) is left as it was: free space there or pass a path on another "
         "disk"),
    # funcnet train --stream
    Case("funcnet train --stream <out>/records on a full disk", _full_disk("funcnet.loader.write_records", "stream"),
         "CLEAR", 2,
         "funcnet train: error: [Errno 28] --stream <out>/records: could not write the training split of digits "
         "there: No space left on device; pass a folder this user can write, with free space"),
    Case("funcnet train --stream <missing>/deeper/records (its parent folders missing; the step that writes the "
         "records, on 8 examples)", _stream_under_missing_parents, "OK", 0, "", _records_written),
    # the library
    Case("fit(model, tx, (x, y), (x, y), loss_fn=my_loss) where my_loss(outputs, targets) has no reduction=",
         _raises(lambda ctx: _loss_without_reduction(ctx)), "CLEAR", "TypeError",
         "fit: loss_fn my_loss(outputs, targets) takes no reduction= argument, but the test metrics call "
         "loss_fn(outputs, targets, reduction='sum') at each epoch's end; add reduction='mean' to it (returning the "
         "sum for 'sum', the mean for 'mean', as funcnet.losses do), or leave test_data out"),
    Case("model(x) (torch's way of calling a model)", _raises(_call_the_torch_way), "CLEAR", "TypeError",
         "Sequential is a funcnet module, not a torch one: it holds no weights, so it is not called as model(x); "
         "call model.apply(params, x), or nn.call(model, params, {}, x) for any module, with params = "
         "model.init(jax.random.key(0))"),
    Case("parallel.initialize('127.0.0.1:<port>', 2, 0, initialization_timeout=1) with no process 1 (a process)",
         _peer_never_joins, "CLEAR", 2,
         "initialize: process 0 waited 1 s for all 2 processes at the coordinator 127.0.0.1:<port> and they did not "
         "all join; start every process (process_id 0..1) with the same coordinator_address and num_processes, "
         "process 0 first, or raise initialization_timeout"),
]


def _placeholders(text: str, ctx: dict) -> str:
    for name, path in sorted(ctx.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(path, f"<{name}>")
    return text


def _pattern(line: str) -> str:
    return "".join(".*?" if part == "…" else re.escape(part) for part in re.split("(…)", line))


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    pytest.importorskip("transformers")
    return make_context(tmp_path_factory.mktemp("cases"))


@pytest.mark.parametrize("case", CASES, ids=[c.call[:60] for c in CASES])
def test_each_case_ends_as_the_table_says(case, ctx, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, err = case.run(ctx)
    assert code == case.code, (code, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    if not case.line:
        assert lines in ([], ["devices: 1 (cpu)"]), err
    else:
        assert len(lines) == 1, err
        assert re.fullmatch(_pattern(case.line), _placeholders(lines[0], ctx)), (lines[0], case.line)
    if case.status == "CLEAR":
        assert code != 0 and not out.strip(" \n").removeprefix("devices: 1 (cpu)"), out
    else:
        assert code == 0
        if case.check is not None:
            case.check(ctx, out)


def render() -> str:
    """docs/errors.md's section of this table."""

    def cell(text):
        return text.replace("|", "\\|")

    rows = [f"| `{cell(c.call)}` | {c.status} | {c.code} | {cell(c.line) or '(nothing)'} |" for c in CASES]
    return "\n".join([
        HEADING,
        "",
        "From `tests/test_error_table.py`, whose test runs each row: OK ends with exit status 0 (and the line",
        "shown, if any, on stderr); CLEAR with the status or exception shown and exactly that one line.",
        "`<name>` stands for a temporary folder; `…` for text another library (zipfile, safetensors) writes.",
        "",
        "| call | status | exit / raises | stderr / message |",
        "|---|---|---|---|",
        *rows,
        "",
    ])


def test_errors_md_shows_this_table():
    page = (ROOT / "docs" / "errors.md").read_text()
    assert HEADING in page, "docs/errors.md has no section of tests/test_error_table.py: python tests/test_cli.py " \
                            "docs/errors.md writes it"
    section = page[page.index(HEADING):]
    assert section == render(), "docs/errors.md's section differs from tests/test_error_table.py's CASES; " \
                                "python tests/test_cli.py docs/errors.md writes it again"
