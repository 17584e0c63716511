"""The ``funcnet`` command: bad input gets one line and exit status 2, defaults reach 95 %
on digits, the same seed writes the same metrics.json.

The tables below also generate docs/errors.md from real runs:
``python tests/test_cli.py docs/errors.md``.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# (flags after `funcnet train`, a fragment of the message that names the bad value)
CLI_CASES = [
    (["--batch-size", "0"], "argument --batch-size: expected a positive integer, got 0"),
    (["--batch-size", "-3"], "argument --batch-size: expected a positive integer, got -3"),
    (["--batch-size", "abc"], "argument --batch-size: expected a positive integer, got 'abc'"),
    (["--batch-size", "5000"], "--batch-size 5000 is larger than the 1437 training examples of digits"),
    (["--epochs", "0"], "argument --epochs: expected a positive integer, got 0"),
    (["--lr", "nan"], "argument --lr: expected a positive finite number, got nan"),
    (["--lr", "-0.1"], "argument --lr: expected a positive finite number, got -0.1"),
    (["--hidden", "128", "0"], "argument --hidden: expected a positive integer, got 0"),
    (["--dataset", "cifar"], "argument --dataset: invalid choice: 'cifar'"),
    (["--optimizer", "rmsprop"], "argument --optimizer: invalid choice: 'rmsprop'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--dataset", "mnist"], "--dataset mnist needs --data-dir DIR"),
    (["--dataset", "mnist", "--data-dir", "{empty}"],
     "MNIST file train-images-idx3-ubyte (or train-images-idx3-ubyte.gz) not found in {empty}"),
    (["--data-dir", "{empty}"], "--data-dir {empty} is only read with --dataset mnist"),
    (["--out", "{file}"], "--out {file} is a file"),
    (["--resume"], "--resume needs --checkpoint-dir DIR"),
    (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir DIR"),
    (["--checkpoint-every", "0", "--checkpoint-dir", "{empty}"],
     "argument --checkpoint-every: expected a positive integer, got 0"),
    (["--checkpoint-dir", "{file}"], "--checkpoint-dir {file} is a file"),
    (["--resume", "--checkpoint-dir", "{empty}"], "--resume: no checkpoint in {empty}"),
    (["--checkpoint-dir", "{ckpt}", "{run}"],
     "--checkpoint-dir {ckpt} already holds checkpoints (newest: step 22)"),
    (["--resume", "--checkpoint-dir", "{ckpt}", "--lr", "0.01", "{run}"], "--lr 0.001 (now 0.01)"),
    (["--resume", "--checkpoint-dir", "{ckpt}", "{run}", "--epochs", "1"],
     "is in epoch 2, past --epochs 1; pass --epochs 2 or more"),
    (["--resume", "--checkpoint-dir", "{corrupt}", "{run}"], "{corrupt}/step_00000022.ckpt is corrupt"),
    # issue 13: nothing lost, nothing wrong passes, no traceback
    (["--seed", "18446744073709551616"], "argument --seed: expected an integer in [0, 4294967295]"),
    (["--resume", "5", "--checkpoint-dir", "{empty}"], "argument --resume: expected nothing or 'auto', got '5'"),
    (["--out", ""], "--out is empty"),
    (["--checkpoint-dir", ""], "--checkpoint-dir is empty"),
    (["--out", "{file}/sub"], "--out {file}/sub is inside {file}, which is a file"),
    (["--checkpoint-dir", "{file}/sub"], "--checkpoint-dir {file}/sub is inside {file}, which is a file"),
    (["--out", "{foreign}"], "--out {foreign} holds other files (notes.txt)"),
    (["--out", "{empty}/o", "--checkpoint-dir", "{empty}/o/ckpt"], "--checkpoint-dir {empty}/o/ckpt is inside --out"),
    (["--checkpoint-dir", "{locked}"], "checkpoint folder {locked} is in use by another run (process "),
    (["--resume", "--checkpoint-dir", "{libckpt}", "{run}"],
     "{libckpt}/step_00000003.ckpt was not written by funcnet train"),
    (["--hidden", "300000", "300000"], "--hidden 300000 300000 needs about 1.44e+03 GB for one training step"),
    (["--lr", "1e30", "--epochs", "1"], "the loss is not finite in epoch 1 (step 44): train_loss = nan", 3),
    # issue 14: streaming from disk
    (["--workers", "2"], "--workers 2 sets the processes that read --stream's records; pass --stream DIR"),
    (["--stream", "{file}"], "--stream {file} is a file; pass a folder of records"),
    (["--stream", "{empty}/s", "--model", "gpt"], "--model gpt trains on --dataset text in memory"),
    (["--remat", "full"], "--remat set the GPT; --model mlp has no such setting"),
    # issue 20: the reliability probe
    (["--lr", "1e-50"], "argument --lr: expected a learning rate of at least 1e-10, got 1e-50: a step that small"),
    (["--lr", "-1e-3"], "argument --lr: expected a positive finite number, got -0.001"),
    (["--workers", "1000", "--stream", "{empty}/s"], "--workers 1000 is more than 4 per CPU core"),
    (["--verify-records"], "--verify-records checks --stream's records; pass --stream DIR"),
    (["--out", "{empty}/../busy"], "is in use by another run (process "),
]
RUN = ["--epochs", "2", "--hidden", "8", "--batch-size", "128"]  # the run that {ckpt} holds


def _expand(items, ctx):
    out = []
    for item in items:
        out.extend(RUN if item == "{run}" else [item.format(**ctx)])
    return out


def run_main(argv):
    """``(exit status, stdout, stderr)`` of ``funcnet`` in this process."""
    from funcnet.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse exits by itself
            status = e.code
    return status, out.getvalue(), err.getvalue()


_LOCKS = []  # held for the whole session: the {locked} folder of the cases


def make_context(root: Path) -> dict:
    """The folders and files the cases refer to, a real checkpoint among them."""
    from funcnet import checkpoint

    ctx = {"empty": root / "empty", "file": root / "file.txt", "ckpt": root / "ckpt", "corrupt": root / "corrupt",
           "foreign": root / "foreign", "locked": root / "locked", "libckpt": root / "libckpt"}
    ctx["empty"].mkdir()
    ctx["file"].write_text("not a folder\n")
    ctx["foreign"].mkdir()
    (ctx["foreign"] / "notes.txt").write_text("the user's own file\n")
    _LOCKS.append(checkpoint.lock(ctx["locked"]).acquire())  # as a live run would hold it
    from funcnet.cli.outputs import _Outputs

    _LOCKS.append(_Outputs(root / "busy").lock().acquire())  # an --out a live run is writing
    import jax
    import optax

    from funcnet import nn, train

    state = train.create_train_state(nn.MLP([64, 8, 10]), optax.adam(1e-3), jax.random.key(0))
    checkpoint.save(ctx["libckpt"], state, step=3)  # written by the library: no run flags in its metadata
    status, _, err = run_main(["train", "--quiet", *RUN, "--checkpoint-dir", str(ctx["ckpt"]), "--out", str(root / "run")])
    assert status == 0, err
    ctx["corrupt"].mkdir()
    for step in checkpoint.all_steps(ctx["ckpt"]):
        raw = bytearray(checkpoint.checkpoint_path(ctx["ckpt"], step).read_bytes())
        raw[-10] ^= 0xFF
        checkpoint.checkpoint_path(ctx["corrupt"], step).write_bytes(bytes(raw))
    return {k: str(v) for k, v in ctx.items()}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return make_context(tmp_path_factory.mktemp("cli"))


@pytest.mark.parametrize("flags, fragment, status", [(c + (2,))[:3] for c in CLI_CASES],
                         ids=[" ".join(c[0]) for c in CLI_CASES])
def test_bad_input_is_one_line_naming_the_value(ctx, flags, fragment, status, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out runs/train lands here, not in the repository
    got, out, err = run_main(["train", "--quiet", *_expand(flags, ctx)])
    assert got == status
    # nothing but the start-up line, printed once the flags and data are checked, before training
    assert out in ("", "devices: 1 (cpu)\n"), out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # argparse reports unknown flags from the top-level parser, as "funcnet: error: ..."
    assert lines[0].startswith("funcnet train: error: " if flags != ["--bogus"] else "funcnet: error: ")
    assert fragment.format(**ctx) in lines[0]
    assert "Traceback" not in err


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "funcnet.cli", *args], capture_output=True, text=True, timeout=300)


def test_a_real_process_exits_2_without_traceback():
    proc = _cli("train", "--resume")  # through main's error handler and the console entry's sys.exit
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "funcnet train: error: --resume needs --checkpoint-dir DIR, the folder the run saves " \
                          "its checkpoints in\n"


def test_defaults_reach_95_percent_and_the_same_seed_gives_the_same_file(tmp_path):
    runs = [subprocess.Popen([sys.executable, "-m", "funcnet.cli", "train", "--quiet", "--out", str(tmp_path / name)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    for proc in runs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    first, second = (tmp_path / "a" / "metrics.json").read_bytes(), (tmp_path / "b" / "metrics.json").read_bytes()
    assert first == second
    metrics = json.loads(first)
    assert metrics["config"]["epochs"] == 20 and metrics["config"]["dataset"] == "digits"
    assert len(metrics["history"]) == 20 and metrics["final"]["test_accuracy"] >= 0.95
    assert (tmp_path / "a" / "params.npz").read_bytes() == (tmp_path / "b" / "params.npz").read_bytes()
    assert (tmp_path / "a" / "loss.png").stat().st_size > 0
    # the accuracy docs/getting-started.md states for this run, to the two decimals it gives
    import re

    page = " ".join((Path(__file__).resolve().parents[1] / "docs" / "getting-started.md").read_text().split())
    stated = re.search(r"It reaches ([\d.]+)% test accuracy \(`tests/test_cli.py` runs the default command", page)
    assert stated, "docs/getting-started.md no longer states the default run's test accuracy"
    assert stated.group(1) == f"{100 * metrics['final']['test_accuracy']:.2f}", \
        (stated.group(1), metrics["final"]["test_accuracy"])


def test_log_every_prints_per_step_losses_and_changes_nothing_else(tmp_path):
    flags = ["train", "--quiet", "--epochs", "2", "--hidden", "8", "--batch-size", "128"]  # 11 steps an epoch
    status, logged, err = run_main([*flags, "--log-every", "5", "--out", str(tmp_path / "logged")])
    assert status == 0, err
    lines = [line for line in logged.splitlines() if line.startswith("step ")]
    # each epoch's own steps: 5, 10 in the first; 15 (12-15) and 20 in the second
    assert [line.split(":")[0] for line in lines] == ["step 5 (epoch 1)", "step 10 (epoch 1)", "step 15 (epoch 2)",
                                                       "step 20 (epoch 2)"], logged
    assert lines[2].endswith("(mean of steps 12-15)"), lines[2]
    status, _, err = run_main([*flags, "--out", str(tmp_path / "plain")])
    assert status == 0, err
    # the stretches of 5 steps give the run without them, bit for bit; metrics.json does not hold the flag
    for name in ("metrics.json", "params.npz"):
        if name == "params.npz":
            import numpy as np

            with np.load(tmp_path / "logged" / name) as a, np.load(tmp_path / "plain" / name) as b:
                assert a.files == b.files and all(a[k].tobytes() == b[k].tobytes() for k in a.files)
        else:
            assert (tmp_path / "logged" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


# ---- docs/errors.md ----------------------------------------------------------------------

def _library_cases(ctx):
    """``(call as written, thunk)`` for bad input to the library; each thunk raises (or not)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from funcnet import checkpoint, data, load_state_dict, nn, state_dict, train

    (x, y), _ = data.load("digits")
    model, tx = nn.MLP([64, 8, 10]), optax.adam(1e-3)
    state = lambda hidden=8: train.create_train_state(nn.MLP([64, hidden, 10]), tx, jax.random.key(0))
    fit = lambda xy, **kw: train.fit(model, tx, xy, **{"epochs": 1, "batch_size": 32, "key": jax.random.key(0),
                                                       "progress": False, **kw})
    ckpt, corrupt = ctx["ckpt"], ctx["corrupt"]
    truncated = Path(ctx["empty"]).parent / "truncated"
    truncated.mkdir(exist_ok=True)
    src = checkpoint.checkpoint_path(ckpt, 22).read_bytes()
    checkpoint.checkpoint_path(truncated, 22).write_bytes(src[: len(src) // 2])
    return [
        ("train.fit(..., key=0)", lambda: fit((x, y), key=0)),
        ("train.fit(..., batch_size=0)", lambda: fit((x, y), batch_size=0)),
        ("train.fit(..., batch_size=5000)", lambda: fit((x, y), batch_size=5000)),
        ("train.fit(..., epochs=-1)", lambda: fit((x, y), epochs=-1)),
        ("train.fit(..., every_steps=0)", lambda: fit((x, y), every_steps=0)),
        ("train.fit((x, y[:-1]), ...)", lambda: fit((x, y[:-1]))),
        ("train.fit((x[:, :10], y), ...) (10 features, model wants 64)", lambda: fit((x[:, :10], y))),
        ("train.fit((x, y.astype(float32)), ...)", lambda: fit((x, y.astype(np.float32)))),
        ("train.fit((x, one_hot(y)), ...)", lambda: fit((x, np.eye(10, dtype=np.float32)[y].astype(np.int32)))),
        ("train.fit((x, y + 10), ...) (labels past the 10 classes)", lambda: fit((x, y + 10))),
        ("train.make_step(model, tx, accum_steps=0)", lambda: train.make_step(model, tx, accum_steps=0)),
        ("Dropout(0.5).apply(params, x, train=True) without key",
         lambda: nn.Dropout(0.5).apply({}, jnp.ones((2, 3)), train=True)),
        ("data.load('cifar')", lambda: data.load("cifar")),
        ("data.load('mnist')", lambda: data.load("mnist")),
        ("data.load('mnist', data_dir=empty)", lambda: data.load("mnist", data_dir=ctx["empty"])),
        ("checkpoint.restore(missing_dir, template)", lambda: checkpoint.restore(ctx["empty"] + "/nope", state())),
        ("checkpoint.restore(empty_dir, template)", lambda: checkpoint.restore(ctx["empty"], state())),
        ("checkpoint.restore(dir, template, step=7)", lambda: checkpoint.restore(ckpt, state(), step=7)),
        ("checkpoint.restore(dir, template) of a file with one byte flipped", lambda: checkpoint.restore(corrupt, state())),
        ("checkpoint.restore(dir, template) of a file cut in half", lambda: checkpoint.restore(truncated, state())),
        ("checkpoint.restore(dir, template) with hidden 16, saved with hidden 8",
         lambda: checkpoint.restore(ckpt, state(16))),
        ("checkpoint.restore(dir, template) with SGD-momentum state and a raw uint32 key, saved with Adam",
         lambda: checkpoint.restore(ckpt, train.create_train_state(
             nn.MLP([64, 8, 10]), optax.sgd(0.1, momentum=0.9), jax.random.PRNGKey(0)))),
        ("checkpoint.save(dir, state, step=5) where dir holds step 22", lambda: checkpoint.save(ckpt, state(), step=5)),
        ("checkpoint.save(dir, state, step=30, keep=0)", lambda: checkpoint.save(ctx["empty"], state(), step=30, keep=0)),
        ("checkpoint.save(dir, old_state, step=1) after step(old_state, batch) donated it", lambda: _save_donated(ctx)),
        # issue 13
        ("train.fit((torch.tensor(x), torch.tensor(y)), ...)", lambda: fit((_torch().tensor(x), _torch().tensor(y)))),
        ("train.fit((x, y), x_test) (test_data not a pair)", lambda: fit((x, y), test_data=x[:10])),
        ("train.fit(..., tx=optax.adam) (not called)", lambda: train.fit(model, optax.adam, (x, y), epochs=1,
                                                                          batch_size=32, key=jax.random.key(0))),
        ("train.fit(..., tx='adam')", lambda: train.fit(model, "adam", (x, y), epochs=1, batch_size=32,
                                                        key=jax.random.key(0))),
        ("train.fit((x with a NaN, y), ...)", lambda: fit((np.where(np.arange(64) == 5, np.nan, x), y))),
        ("train.run_epoch([1], state, x, y, batch_size=32)", lambda: train.run_epoch([1], state(), x, y, batch_size=32)),
        ("train.make_step([1], tx) (not a model)", lambda: train.make_step([1], tx)),
        ("step(state, x) (x is not an (x, y) pair)", lambda: train.make_step(model, tx)(state(), x[:4])),
        ("step(params, (x, y))", lambda: train.make_step(model, tx)(state().params, (x[:4], y[:4]))),
        ("model.apply(state_dict(params), x)", lambda: model.apply(state_dict(state().params), x[:4])),
        ("model.apply(x, params)", lambda: model.apply(x[:4], state().params)),
        ("data.load('synthetic', n_train=2.5)", lambda: data.load("synthetic", n_train=2.5)),
        ("data.load('synthetic', noise=nan)", lambda: data.load("synthetic", noise=float("nan"))),
        ("data.load('digits', seed=2**64)", lambda: data.load("digits", seed=2**64)),
        ("data.load('mnist', data_dir=d) with a label byte 255", lambda: data.load("mnist", data_dir=_mnist(ctx, 255))),
        ("data.load('mnist', data_dir=d) with a .gz cut in half", lambda: data.load("mnist", data_dir=_mnist(ctx, "cut"))),
        ("load_state_dict(params, {k: bf16 torch tensor})", lambda: load_state_dict(
            state().params, {k: _torch().tensor(np.asarray(v)).bfloat16() for k, v in state_dict(state().params).items()})),
        ("load_state_dict(params, {k: complex64 torch tensor})", lambda: load_state_dict(
            state().params, {k: _torch().tensor(np.asarray(v)).to(_torch().complex64)
                             for k, v in state_dict(state().params).items()})),
        ("load_state_dict(params, {k: meta tensor})", lambda: load_state_dict(
            state().params, {k: _torch().empty(v.shape, device="meta") for k, v in state_dict(state().params).items()})),
        ("load_state_dict(params, {k: sparse tensor})", lambda: load_state_dict(
            state().params, {k: _torch().tensor(np.asarray(v)).to_sparse() for k, v in state_dict(state().params).items()})),
        ("checkpoint.restore(dir, template, step='3')", lambda: checkpoint.restore(ctx["libckpt"], state(), step="3")),
        ("checkpoint.restore(dir, template) of step_00000003.ckpt renamed to step_00000009.ckpt",
         lambda: checkpoint.restore(_renamed(ctx), state())),
    ]


def _torch():
    import torch

    return torch


def _mnist(ctx, damage):
    import gzip

    import numpy as np

    folder = Path(ctx["empty"]).parent / f"mnist-{damage}"
    folder.mkdir(exist_ok=True)
    images, labels = np.zeros((20, 28, 28), np.uint8), (np.arange(20) % 10).astype(np.uint8)
    if damage == 255:
        labels[3] = 255
    for stem, arr in (("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels),
                      ("t10k-images-idx3-ubyte", images[:5]), ("t10k-labels-idx1-ubyte", labels[:5])):
        raw = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape) + arr.tobytes()
        packed = gzip.compress(raw)
        (folder / f"{stem}.gz").write_bytes(packed[: len(packed) // 2] if damage == "cut" else packed)
    return folder


def _renamed(ctx):
    folder = Path(ctx["empty"]).parent / "renamed"
    folder.mkdir(exist_ok=True)
    src = Path(ctx["libckpt"]) / "step_00000003.ckpt"
    (folder / "step_00000009.ckpt").write_bytes(src.read_bytes())
    return folder


def _save_donated(ctx):
    import jax
    import jax.numpy as jnp
    import optax

    from funcnet import checkpoint, nn, train

    model, tx = nn.MLP([4, 8, 2]), optax.sgd(0.1)
    old = train.create_train_state(model, tx, jax.random.key(0))
    train.make_step(model, tx)(old, (jnp.ones((2, 4)), jnp.zeros(2, jnp.int32)))
    checkpoint.save(ctx["empty"], old, step=1)


def _cell(text, ctx):
    for name, path in sorted(ctx.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(path, f"<{name}>")
    text = text.replace(f"process {os.getpid()} ", "process <pid> ")
    return text.replace(str(Path(ctx["empty"]).parent), "<tmp>").replace("|", "\\|").replace("\n", "<br>")


def write_errors_md(path: Path) -> None:
    import tempfile

    rows_cli, rows_lib = [], []
    path, cwd = Path(path).resolve(), os.getcwd()
    with tempfile.TemporaryDirectory() as root:
        ctx = make_context(Path(root))
        os.chdir(root)  # the default --out runs/train lands here, not in the repository
        for flags, *_ in CLI_CASES:
            argv = _expand(flags, ctx)
            status, _, err = run_main(["train", "--quiet", *argv])
            command = _cell("funcnet train " + " ".join(argv), ctx)
            rows_cli.append(f"| `{command}` | {status} | {_cell(err.strip(), ctx)} |")
        for call, thunk in _library_cases(ctx):
            try:
                thunk()
                kind, message = "no error", "(none: accepted)"
            except Exception as e:  # the table records whatever is raised
                kind, message = type(e).__name__, str(e)
            rows_lib.append(f"| `{_cell(call, ctx)}` | {kind} | {_cell(message, ctx)} |")
        os.chdir(cwd)
    text = "\n".join([
        "# Errors: what bad input gets",
        "",
        "Generated from real runs by `python tests/test_cli.py docs/errors.md`; `<empty>`, `<file>`,",
        "`<ckpt>` (a real two-epoch checkpoint folder) and `<corrupt>` (the same with one byte flipped)",
        "stand for temporary paths.",
        "",
        "## `funcnet train`",
        "",
        "Every error is one line on stderr, never a traceback. Exit status: 2 bad input or an I/O error,",
        "3 the loss became NaN/Inf (the run stops before checkpointing it), 130 interrupted (SIGINT),",
        "143 terminated (SIGTERM; with --checkpoint-dir a checkpoint is saved first). `<locked>` is a",
        "checkpoint folder whose lock a live run holds; `<libckpt>` holds a checkpoint written by",
        "`funcnet.checkpoint.save` (no run flags in it); `<foreign>` holds a file of the user's;",
        "`busy` is an `--out` a live run is writing. `--out` defaults to `runs/train-MODEL`",
        "(`runs/train-mlp`, `runs/train-cnn`, `runs/train-gpt`), so a run of one model never replaces",
        "another model's outputs, and a second run on the same `--out` exits 2 at once.",
        "",
        "| command | exit | stderr |",
        "|---|---|---|",
        *rows_cli,
        "",
        "## Library",
        "",
        "| call | raises | message |",
        "|---|---|---|",
        *rows_lib,
        "",
    ])
    from test_error_table import render  # the table of damaged files and other calls, run by its own test

    path.write_text(text + "\n" + render())


if __name__ == "__main__":
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    write_errors_md(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/errors.md"))
