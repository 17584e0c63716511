"""Issue 13: nothing the user had is lost, nothing wrong passes silently, no traceback.

Each test drives the real command (in this process, or as a real process where a signal,
a second process or the environment is the point) and checks the exit status, the one
line on stderr and what is left on disk against an independent reference: the bytes of
an earlier run's outputs, a run that was never interrupted, a checkpoint saved before.
"""

import contextlib
import errno
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from funcnet import checkpoint
from funcnet.cli import main

TINY = ["--quiet", "--epochs", "1", "--hidden", "8", "--batch-size", "128"]  # 11 steps of digits


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code
    return status, out.getvalue(), err.getvalue()


def one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def snapshot(folder: Path) -> dict:
    """The three outputs as comparable values (params.npz by its arrays: the zip holds times)."""
    names = sorted(os.listdir(folder))
    assert names == ["loss.png", "metrics.json", "params.npz"], names
    with np.load(folder / "params.npz") as z:
        params = {k: (z[k].dtype.str, z[k].tobytes()) for k in z.files}
    return {"metrics": (folder / "metrics.json").read_bytes(), "png": (folder / "loss.png").read_bytes(),
            "params": params}


def hidden_leftovers(parent: Path) -> list:
    return [n for n in os.listdir(parent) if n.startswith(".")]


def _script(body: str) -> list:
    return [sys.executable, "-c", textwrap.dedent(body)]


# ---- 1. outputs are replaced as a whole ---------------------------------------------------

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """An earlier run (seed 0) and the run that replaces it (seed 1), uninterrupted."""
    root = tmp_path_factory.mktemp("runs")
    for name, seed in (("old", "0"), ("new", "1")):
        status, _, err = run_main(["train", *TINY, "--seed", seed, "--out", str(root / name)])
        assert status == 0, err
    return root


_PATCH = {  # where the writer waits to be killed: an attribute of funcnet.cli.outputs (as c)
    "writing": "c._plot_loss",            # metrics.json and params.npz written, loss.png not yet
    "before swap": "c._Outputs._swap",    # all three written and fsync-ed, not yet swapped in
    "after swap": "c.shutil.rmtree",      # swapped in; the previous set not yet deleted
}


@pytest.mark.slow
def test_killed_while_writing_outputs_leaves_the_old_or_the_new_complete_set(two_runs, tmp_path):
    old, new = snapshot(two_runs / "old"), snapshot(two_runs / "new")
    assert old["metrics"] != new["metrics"] and old["params"] != new["params"] and old["png"] != new["png"]
    cases = [("SIGKILL", "writing", old), ("SIGINT", "writing", old), ("SIGKILL", "before swap", old),
             ("SIGKILL", "after swap", new)]
    procs = []
    for i, (sig, moment, _) in enumerate(cases):
        out = tmp_path / f"case{i}" / "out"
        shutil.copytree(two_runs / "old", out)
        argv = ["train", *TINY, "--seed", "1", "--out", str(out)]
        target = _PATCH[moment]
        procs.append(subprocess.Popen(_script(f"""
            import sys, time
            import funcnet.cli.outputs as c
            from funcnet.cli import main
            original = {target}
            def wait_to_be_killed(*a, **k):
                print("WRITING", file=sys.stderr, flush=True)
                time.sleep(120)
                return original(*a, **k)
            {target} = wait_to_be_killed
            sys.exit(main({argv!r}))
        """), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True))
    for proc, (sig, moment, expected) in zip(procs, cases):
        seen = []
        for line in proc.stderr:  # the marker: the process is inside the write now
            seen.append(line)
            if line.startswith("WRITING"):
                break
        assert seen and seen[-1].startswith("WRITING"), "".join(seen)
        proc.send_signal(getattr(signal, sig))
        rest = proc.stderr.read()
        proc.wait(timeout=60)
        out = tmp_path / f"case{cases.index((sig, moment, expected))}" / "out"
        assert snapshot(out) == expected, (sig, moment)
        if sig == "SIGINT":
            assert proc.returncode == 130
            assert "funcnet train: interrupted; --out is left as it was" in rest
            assert hidden_leftovers(out.parent) == []  # the staging folder is removed
        else:
            assert proc.returncode == -signal.SIGKILL
    # A killed writer's staging folder is cleaned up by the next run into the same --out.
    out = tmp_path / "case0" / "out"
    assert hidden_leftovers(out.parent)
    status, _, err = run_main(["train", *TINY, "--seed", "1", "--out", str(out)])
    assert status == 0, err
    assert hidden_leftovers(out.parent) == [] and snapshot(out) == new


def test_full_disk_while_writing_outputs_keeps_the_previous_set(two_runs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    shutil.copytree(two_runs / "old", out)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "savez", full)
    status, _, err = run_main(["train", *TINY, "--seed", "1", "--out", str(out)])
    assert status == 2
    line = one_line(err)
    assert line.startswith(f"funcnet train: error: [Errno 28] could not write the outputs to {out}: No space left "
                           f"on device (")
    assert line.endswith(f"{out} is left as it was")
    assert snapshot(out) == snapshot(two_runs / "old") and hidden_leftovers(tmp_path) == []


# ---- --out / --checkpoint-dir refused before any data is loaded -----------------------------

@pytest.mark.parametrize("flags, fragment", [
    (["--out", "{file}/sub"], "--out {file}/sub is inside {file}, which is a file; pass a folder path"),
    (["--checkpoint-dir", "{file}/sub"], "--checkpoint-dir {file}/sub is inside {file}, which is a file"),
    (["--out", "{withdir}"], "--out {withdir}: params.npz is not a regular file (a folder or a link)"),
    (["--out", "{foreign}"], "--out {foreign} holds other files (notes.txt)"),
    (["--out", ""], "--out is empty"),
    (["--checkpoint-dir", ""], "--checkpoint-dir is empty"),
    (["--out", "{tmp}/o", "--checkpoint-dir", "{tmp}/o/ckpt"], "--checkpoint-dir {tmp}/o/ckpt is inside --out {tmp}/o"),
    (["--out", "."], "--out . is the current folder or one above it"),
])
def test_unusable_output_folders_are_refused_before_loading_data(tmp_path, monkeypatch, flags, fragment):
    from funcnet import data

    ctx = {"file": tmp_path / "file.txt", "withdir": tmp_path / "withdir", "foreign": tmp_path / "foreign",
           "tmp": tmp_path}
    ctx["file"].write_text("a file\n")
    (ctx["withdir"] / "params.npz").mkdir(parents=True)
    ctx["foreign"].mkdir()
    (ctx["foreign"] / "notes.txt").write_text("mine\n")

    def must_not_load(*a, **k):
        raise AssertionError("data loaded before the output folders were checked")

    monkeypatch.setattr(data, "load", must_not_load)
    monkeypatch.chdir(tmp_path)
    status, out, err = run_main(["train", *TINY, *[f.format(**ctx) for f in flags]])
    assert status == 2 and out == ""
    assert fragment.format(**ctx) in one_line(err)
    assert (ctx["withdir"] / "params.npz").is_dir() and (ctx["foreign"] / "notes.txt").read_text() == "mine\n"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".") and "tmp-" in n]


# ---- 2. one run per checkpoint folder ----------------------------------------------------------

def test_a_locked_checkpoint_folder_is_refused_naming_the_holder(tmp_path, monkeypatch):
    from funcnet import data

    monkeypatch.setattr(data, "load", lambda *a, **k: pytest.fail("data loaded while the folder is locked"))
    ckpt = tmp_path / "ckpt"
    with checkpoint.lock(ckpt):
        status, _, err = run_main(["train", *TINY, "--checkpoint-dir", str(ckpt), "--resume", "auto",
                                   "--out", str(tmp_path / "out")])
        assert status == 2
        assert one_line(err) == (f"funcnet train: error: checkpoint folder {ckpt} is in use by another run (process "
                                 f"{os.getpid()} holds {ckpt}/.lock); wait for it to finish, stop it, or use another "
                                 f"folder")
    with checkpoint.lock(ckpt):  # released by the refused run and by the with-block: free again
        pass


@pytest.mark.slow
def test_two_runs_started_together_on_one_checkpoint_folder(tmp_path):
    ckpt = tmp_path / "ckpt"
    procs = [subprocess.Popen([sys.executable, "-m", "funcnet.cli", "train", *TINY, "--epochs", "3",
                               "--checkpoint-dir", str(ckpt), "--resume", "auto", "--out", str(tmp_path / f"out{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [(p, *p.communicate(timeout=300)) for p in procs]
    winners = [r for r in results if r[0].returncode == 0]
    losers = [r for r in results if r[0].returncode != 0]
    assert len(winners) == 1 and len(losers) == 1, [(p.returncode, e) for p, _, e in results]
    (winner, _, _), (loser, _, err) = winners[0], losers[0]
    assert loser.returncode == 2
    assert one_line(err).startswith(f"funcnet train: error: checkpoint folder {ckpt} is in use by another run "
                                    f"(process {winner.pid} holds")
    assert checkpoint.all_steps(ckpt) == [11, 22, 33]  # one run's checkpoints only
    assert not (tmp_path / f"out{procs.index(loser)}").exists()


def test_save_never_deletes_a_live_writers_temporary_file(tmp_path):
    import jax
    import optax

    from funcnet import nn, train

    state = train.create_train_state(nn.MLP([2, 3]), optax.sgd(0.1), jax.random.key(0))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
        live_tmp = tmp_path / f".step_00000005.ckpt.tmp-{sleeper.pid}-abcd1234"
        dead_tmp = tmp_path / f".step_00000005.ckpt.tmp-{dead}-abcd1234"
        live_tmp.write_bytes(b"being written")
        dead_tmp.write_bytes(b"left by a dead writer")
        checkpoint.save(tmp_path, state, step=1)
        assert live_tmp.read_bytes() == b"being written" and not dead_tmp.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# ---- full disk during a checkpoint save ------------------------------------------------------

def test_full_disk_during_a_checkpoint_save_keeps_the_previous_one(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    assert run_main(["train", *TINY, "--checkpoint-dir", str(ckpt), "--out", str(tmp_path / "a")])[0] == 0
    before = checkpoint.checkpoint_path(ckpt, 11).read_bytes()
    real_open = open

    def full_disk_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if "x" in mode and ".tmp-" in str(path):
            f.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return f

    monkeypatch.setattr(checkpoint, "open", full_disk_open, raising=False)
    status, _, err = run_main(["train", *TINY, "--epochs", "2", "--checkpoint-dir", str(ckpt), "--resume",
                               "--out", str(tmp_path / "b")])
    assert status == 2
    assert one_line(err) == (f"funcnet train: error: [Errno 28] save: could not write checkpoint step 22 to "
                             f"{ckpt}/step_00000022.ckpt: No space left on device; the previous checkpoints are "
                             f"kept (newest: step 11)")
    assert sorted(os.listdir(ckpt)) == [".lock", "step_00000011.ckpt"]
    assert checkpoint.checkpoint_path(ckpt, 11).read_bytes() == before
    assert not (tmp_path / "b").exists()


# ---- 3. garbage never exits 0 ----------------------------------------------------------------

def _strict_json(text):
    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    # Adam at lr 1e30: step 1 moves every weight by ~1e30 (finite), step 2's loss is NaN.
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    status, _, err = run_main(["train", *TINY, "--lr", "1e30", "--checkpoint-dir", str(ckpt),
                               "--checkpoint-every", "1", "--out", str(out)])
    assert status == 3
    assert one_line(err) == (
        "funcnet train: error: the loss is not finite at step 2 (epoch 1): loss = nan; lower the learning rate "
        "(--lr), check the inputs for NaN/Inf, or train in fp32 (or with --precision fp16's loss scaling); the "
        f"last good checkpoint (step 1) in {ckpt} is kept")
    assert checkpoint.all_steps(ckpt) == [1] and not out.exists()
    raw = checkpoint.checkpoint_path(ckpt, 1).read_bytes()
    meta = checkpoint.read_metadata(ckpt)
    assert np.isfinite(meta["position"]["metrics"]["loss"][1]).all()
    assert b"NaN" not in raw and b"Infinity" not in raw


def test_a_non_finite_loss_without_checkpoints_names_the_epoch(tmp_path):
    status, _, err = run_main(["train", *TINY, "--lr", "1e30", "--out", str(tmp_path / "out")])
    assert status == 3
    assert one_line(err).startswith("funcnet train: error: the loss is not finite in epoch 1 (step 11): "
                                    "train_loss = nan")
    assert not (tmp_path / "out").exists()


def test_json_that_funcnet_writes_is_strict(tmp_path):
    import jax
    import optax

    from funcnet import guards, nn, train

    state = train.create_train_state(nn.MLP([2, 3]), optax.sgd(0.1), jax.random.key(0))
    checkpoint.save(tmp_path, state, step=1, metadata={"loss": float("nan"), "hi": [float("inf"), -float("inf"), 1.5]})
    assert checkpoint.read_metadata(tmp_path) == {"loss": "NaN", "hi": ["Infinity", "-Infinity", 1.5]}
    assert np.asarray(["NaN", "Infinity", 1.5], np.float32).tolist()[1:] == [float("inf"), 1.5]
    assert json.loads(json.dumps(guards.json_safe({"a": (float("nan"), 2.0)}), allow_nan=False)) == {"a": ["NaN", 2.0]}


def _write_mnist(folder: Path, n=64, bad_label=None):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    images, labels = rng.integers(0, 256, (n, 28, 28)), np.arange(n) % 10
    if bad_label is not None:
        labels[3] = bad_label
    for stem, arr in (("train-images-idx3-ubyte", images), ("train-labels-idx1-ubyte", labels),
                      ("t10k-images-idx3-ubyte", images[:16]), ("t10k-labels-idx1-ubyte", labels[:16])):
        header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
        with gzip.open(folder / f"{stem}.gz", "wb") as f:
            f.write(header + arr.astype(np.uint8).tobytes())
    return folder


def test_a_corrupt_mnist_label_is_refused_not_a_256_class_model(tmp_path):
    mnist = _write_mnist(tmp_path / "mnist", bad_label=255)
    status, _, err = run_main(["train", "--quiet", "--dataset", "mnist", "--data-dir", str(mnist), "--epochs", "1",
                               "--hidden", "4", "--batch-size", "16", "--out", str(tmp_path / "out")])
    assert status == 2
    assert one_line(err) == (f"funcnet train: error: {mnist}/train-labels-idx1-ubyte.gz holds label 255 at index 3; "
                             f"MNIST labels are 0-9, so the file is damaged: download it again")


def test_resume_after_the_data_files_changed_is_refused(tmp_path):
    mnist, ckpt = _write_mnist(tmp_path / "mnist"), tmp_path / "ckpt"
    flags = ["train", "--quiet", "--dataset", "mnist", "--data-dir", str(mnist), "--hidden", "4", "--batch-size", "16",
             "--checkpoint-dir", str(ckpt)]
    assert run_main([*flags, "--epochs", "1", "--out", str(tmp_path / "a")])[0] == 0
    _write_mnist(mnist, n=65)  # one more training image
    status, _, err = run_main([*flags, "--epochs", "2", "--resume", "--out", str(tmp_path / "b")])
    assert status == 2
    assert "--resume: the mnist data changed since the run in" in one_line(err)
    assert "resume with the same data files or start over in a new --checkpoint-dir" in err


# ---- 4. tracebacks become one line -------------------------------------------------------------

def test_resume_over_a_checkpoint_written_by_the_library_is_one_line(tmp_path):
    import jax
    import optax

    from funcnet import nn, train

    state = train.create_train_state(nn.MLP([64, 8, 10]), optax.adam(1e-3), jax.random.key(0))
    checkpoint.save(tmp_path / "ckpt", state, step=3)
    status, _, err = run_main(["train", *TINY, "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume",
                               "--out", str(tmp_path / "out")])
    assert status == 2
    assert one_line(err).startswith(f"funcnet train: error: --resume: {tmp_path}/ckpt/step_00000003.ckpt was not "
                                    f"written by funcnet train (its metadata has nothing,")


def test_a_model_too_big_for_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    from funcnet import nn

    def built(sizes):  # the model would be built, its 1.44 TB of parameters and state next
        raise AssertionError(f"nn.MLP({sizes}) was built: the run was not refused before allocating")

    monkeypatch.setattr(nn, "MLP", built)
    status, _, err = run_main(["train", *TINY, "--hidden", "300000", "300000", "--out", str(tmp_path / "out")])
    assert status == 2
    line = one_line(err)
    assert "--hidden 300000 300000 needs about 1.44e+03 GB for one training step" in line
    assert line.endswith("reduce --hidden or --batch-size")


def test_memory_command_with_an_absurd_count_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "funcnet.cli", "memory", "--params", "1e400B"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("funcnet memory: error: --params 1e400B is about 1e409, beyond what this table shows (at "
                           "most 1e30); pass a realistic size such as 7B or 20e9 (see funcnet memory --help)\n")


def test_a_missing_jax_platform_is_one_line(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cuda"}
    proc = subprocess.run([sys.executable, "-m", "funcnet.cli", "train", *TINY, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc.stderr)
    assert line.startswith("funcnet train: error: JAX could not start a backend (JAX_PLATFORMS='cuda'): ")
    assert line.endswith("unset JAX_PLATFORMS or set JAX_PLATFORMS=cpu")


# ---- 6./7. restart-safe command, SIGTERM ---------------------------------------------------------

@pytest.mark.slow
def test_sigterm_saves_and_the_restart_safe_command_finishes_bitwise_equal(tmp_path):
    ckpt = tmp_path / "ckpt"
    # 1437 // 64 = 22 steps an epoch, checkpoints every 5 steps (not a divisor: stretches of 5, 5, 5, 5, 2, 3, ...)
    flags = ["train", "--quiet", "--epochs", "3", "--hidden", "8", "--batch-size", "64", "--seed", "7"]
    command = [*flags, "--checkpoint-every", "5", "--checkpoint-dir", str(ckpt), "--resume", "auto",
               "--out", str(tmp_path / "out")]
    # The child announces its first save and waits there until the signal has arrived, so it lands mid-run.
    victim = subprocess.Popen(_script(f"""
        import sys, time
        import funcnet.checkpoint as ck
        import funcnet.cli.signals as signals
        from funcnet.cli import main
        runs, original, init = [], ck.save, signals._Run.__init__
        def record(self, args):
            init(self, args)
            runs.append(self)
        def save(*a, **k):
            path = original(*a, **k)
            print("SAVED", path, file=sys.stderr, flush=True)
            deadline = time.monotonic() + 120  # only turns a lost signal into a failure
            while not runs[0].pending and time.monotonic() < deadline:
                time.sleep(0.01)
            return path
        signals._Run.__init__ = record
        ck.save = save
        sys.exit(main({command!r}))
    """), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in victim.stderr:
        if line.startswith("SAVED"):
            break
    victim.send_signal(signal.SIGTERM)
    rest = victim.stderr.read()
    victim.wait(timeout=120)
    assert victim.returncode == 143, rest
    assert rest.strip().splitlines()[-1] == (
        f"funcnet train: terminated by SIGTERM: saved checkpoint step 5 in {ckpt}; rerun the same command with "
        f"--resume auto to continue exactly where it stopped; --out is left as it was")
    assert checkpoint.all_steps(ckpt) == [5] and not (tmp_path / "out").exists()

    assert run_main(command)[0] == 0  # the same command line, restarted
    # the oracle: never interrupted, no checkpoints, each epoch one scan
    assert run_main([*flags, "--out", str(tmp_path / "whole")])[0] == 0
    assert snapshot(tmp_path / "out") == snapshot(tmp_path / "whole")
    assert run_main(command)[0] == 0  # restarted once more after the end: the same outputs again
    assert snapshot(tmp_path / "out") == snapshot(tmp_path / "whole")


def test_sigterm_without_a_checkpoint_folder_exits_143_at_once(tmp_path):
    proc = subprocess.Popen(_script(f"""
        import os, signal, sys
        import funcnet.data as d
        from funcnet.cli import main
        d.load = lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM)
        sys.exit(main({["train", *TINY, "--out", str(tmp_path / "out")]!r}))
    """), stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert one_line(err) == ("funcnet train: terminated by SIGTERM: nothing was saved (no --checkpoint-dir): rerun "
                             "to start over; --out is left as it was")
    assert os.listdir(tmp_path) == []


def test_resume_auto_starts_fresh_on_an_empty_folder_and_plain_resume_does_not(tmp_path):
    ckpt = tmp_path / "ckpt"
    status, _, err = run_main(["train", *TINY, "--checkpoint-dir", str(ckpt), "--resume", "--out", str(tmp_path / "a")])
    assert status == 2 and "--resume: no checkpoint in" in err and "(or pass --resume auto" in err
    assert run_main(["train", *TINY, "--checkpoint-dir", str(ckpt), "--resume", "auto",
                     "--out", str(tmp_path / "b")])[0] == 0
    assert checkpoint.all_steps(ckpt) == [11]


# ---- 8. library misuse ---------------------------------------------------------------------------

def _library():
    import optax

    from funcnet import data

    (x, y), (xt, yt) = data.load("digits")
    return x, y, xt, yt, optax


def test_guards_name_torch_tensors_bad_pairs_and_uncalled_optimizers():
    import torch

    from funcnet import guards

    x, y, xt, yt, optax = _library()
    adam = optax.adam(1e-3)
    cases = [
        ((adam, (torch.tensor(x), torch.tensor(y))), TypeError,
         "fit: train_data x is a torch Tensor; funcnet takes numpy or jax arrays: pass x.detach().cpu().numpy()"),
        ((adam, torch.tensor(x)), TypeError, "fit: train_data is a single torch Tensor; pass a pair (x, y)"),
        ((adam, (x, y), xt), TypeError, "fit: test_data must be a pair (x, y) of inputs and labels, got an array of "
                                        "shape (360, 64); pass test_data=(x, y)"),
        ((adam, (x, y, y)), TypeError, "fit: train_data must be a pair (x, y) of inputs and labels, got a tuple of "
                                       "length 3"),
        ((optax.adam, (x, y)), TypeError, "(call it: optax.adam(1e-3), not optax.adam)"),
        (("adam", (x, y)), TypeError, "got the string 'adam'; pass e.g. optax.adam(1e-3)"),
        ((adam, (x, y[:-1])), ValueError, "x has 1437 examples but y has 1436"),
        ((adam, (np.where(np.arange(64) == 5, np.nan, x), y)), ValueError,
         "fit: train_data x holds 1437 non-finite values (the first, nan, at index (0, 5))"),
        ((adam, (x, y), (np.full_like(xt, np.inf), yt)), ValueError, "fit: test_data x holds 23040 non-finite values"),
    ]
    for args, error, message in cases:
        with pytest.raises(error) as info:
            guards.check_fit_args(*args)
        assert message in str(info.value), (message, str(info.value))
    guards.check_fit_args(adam, (x, y), (xt, yt))  # good input passes
    with pytest.raises(TypeError, match=r"run_epoch: the first argument must be the step from make_step\(model, tx\), "
                                        r"got list"):
        guards.check_step_fn([1])


def test_fit_refuses_nan_inputs_torch_tensors_and_a_bare_test_array():
    import jax

    from funcnet import nn, train

    x, y, xt, yt, optax = _library()
    fit = lambda tx, *data: train.fit(nn.MLP([64, 4, 10]), tx, *data, epochs=1, batch_size=64,
                                      key=jax.random.key(0), progress=False)
    x_nan = x.copy()
    x_nan[3, 7] = np.nan
    with pytest.raises(ValueError, match=r"train_data x holds 1 non-finite values \(the first, nan, at index \(3, 7\)\)"):
        fit(optax.adam(1e-3), (x_nan, y))
    with pytest.raises(TypeError, match="test_data must be a pair"):
        fit(optax.adam(1e-3), (x, y), xt)
    with pytest.raises(TypeError, match="got the string 'adam'"):
        fit("adam", (x, y))


def test_load_state_dict_takes_bf16_and_refuses_complex_meta_and_sparse_tensors():
    import jax
    import torch

    from funcnet import StateDictError, load_state_dict, nn, state_dict

    model = nn.MLP([3, 2])
    params = model.init(jax.random.key(0))
    weights = {k: torch.tensor(np.asarray(v)) for k, v in state_dict(params).items()}
    bf16 = {k: v.to(torch.bfloat16) for k, v in weights.items()}
    loaded = load_state_dict(params, bf16)
    for k, v in state_dict(loaded).items():  # bf16 -> float32 is exact: torch's own upcast is the oracle
        np.testing.assert_array_equal(np.asarray(v), bf16[k].float().numpy())
    with pytest.raises(StateDictError, match=r"0.weight: holds complex64 values but the model's parameter is float32 "
                                             r"\(the imaginary part would be dropped\); pass tensor.real"):
        load_state_dict(params, {k: v.to(torch.complex64) for k, v in weights.items()})
    with pytest.raises(StateDictError, match=r"0.weight is a meta tensor \(a shape without data\)"):
        load_state_dict(params, {k: torch.empty(v.shape, device="meta") for k, v in weights.items()})
    with pytest.raises(StateDictError, match=r"0.weight is a sparse tensor \(torch.sparse_coo\); pass tensor.to_dense\(\)"):
        load_state_dict(params, {k: v.to_sparse() for k, v in weights.items()})


def test_restore_with_a_string_step_and_a_renamed_file(tmp_path):
    import jax
    import optax

    from funcnet import nn, train

    state = train.create_train_state(nn.MLP([2, 3]), optax.sgd(0.1), jax.random.key(0))
    checkpoint.save(tmp_path, state, step=3)
    with pytest.raises(TypeError, match=r"restore: step must be an int or None \(the latest\), got '3' \(str\); "
                                        r"pass step=3"):
        checkpoint.restore(tmp_path, state, step="3")
    os.rename(checkpoint.checkpoint_path(tmp_path, 3), checkpoint.checkpoint_path(tmp_path, 9))
    with pytest.raises(checkpoint.CheckpointError, match=r"step_00000009.ckpt holds step 3 but its name says step 9 "
                                                         r"\(renamed by hand\?\); rename it to step_00000003.ckpt"):
        checkpoint.restore(tmp_path, state)


# ---- issue 20: what the 312-case probe still found ----------------------------------------------

def test_a_second_run_on_a_locked_out_is_refused_naming_the_holder(tmp_path, monkeypatch):
    from funcnet import data
    from funcnet.cli.outputs import _Outputs

    monkeypatch.setattr(data, "load", lambda *a, **k: pytest.fail("data loaded while --out is locked"))
    out = tmp_path / "out"
    with _Outputs(out).lock():  # another run writing --out
        status, _, err = run_main(["train", *TINY, "--out", str(out)])
    assert status == 2
    assert one_line(err) == (f"funcnet train: error: --out {out} is in use by another run (process {os.getpid()} "
                             f"holds {tmp_path}/.out.lock); wait for it to finish, stop it, or use another --out")
    assert not out.exists()


def test_the_default_out_is_per_model_so_a_cnn_run_keeps_the_mlp_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_main(["train", *TINY])[0] == 0
    mlp = snapshot(tmp_path / "runs" / "train-mlp")
    status, out, err = run_main(["train", "--quiet", "--epochs", "1", "--batch-size", "128", "--model", "cnn"])
    assert status == 0, err
    assert "wrote runs/train-cnn/metrics.json" in out
    assert snapshot(tmp_path / "runs" / "train-mlp") == mlp
    assert sorted(os.listdir(tmp_path / "runs")) == ["train-cnn", "train-mlp"]  # no lock file left behind


def test_a_sigterm_swallowed_by_a_callback_still_exits_143_without_writing_out(tmp_path):
    # JAX's gc callback (like any __del__) only prints what its code raises: the handler's
    # exception is lost there, and the run went on to write --out and exit 0
    proc = subprocess.Popen(_script(f"""
        import signal, sys
        import funcnet.data as d
        from funcnet.cli import main
        real = d.load
        class Dying:
            def __del__(self):
                signal.raise_signal(signal.SIGTERM)  # the handler runs in here, before it returns
        def load(*a, **k):
            Dying()
            return real(*a, **k)
        d.load = load
        sys.exit(main({["train", *TINY, "--out", str(tmp_path / "out")]!r}))
    """), stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == ("funcnet train: terminated by SIGTERM: nothing was saved (no "
                                            "--checkpoint-dir): rerun to start over; --out is left as it was")
    assert not (tmp_path / "out").exists()


def _library_misuse_cases(tmp):
    """(call, error type, fragments the message must hold: the value, what was expected, the fix)."""
    import jax
    import optax

    from funcnet import gpt, nn, train
    from funcnet.interop import load_safetensors, save_safetensors

    state = train.create_train_state(nn.MLP([2, 3]), optax.sgd(0.1), jax.random.key(0))
    (tmp / "ck").mkdir()
    os.mkdir(tmp / "ck" / "step_00000004.ckpt")  # a folder named like a checkpoint
    (tmp / "dangling").mkdir()
    os.symlink(tmp / "nowhere", tmp / "dangling" / "step_00000002.ckpt")
    (tmp / "garbage.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage}")
    (tmp / "huge.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    (tmp / "model.pt").write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    model = gpt.build(10, 8, n_layer=1, n_head=1, n_embd=8)
    params = model.init(jax.random.key(0))
    idx = np.zeros((1, 2), np.int32)
    return [
        (lambda: checkpoint.save(tmp / "s", state, step=True), TypeError, ["got True (a bool)", "step=int(state.step)"]),
        (lambda: checkpoint.save(tmp / "o", {"w": object()}, step=1), checkpoint.CheckpointError,
         ["leaf w is object, not an array", "keep other values out of the state"]),
        (lambda: checkpoint.restore(tmp / "ck", state), checkpoint.CheckpointError,
         ["step_00000004.ckpt cannot be read as a checkpoint: it is a folder", "delete step_00000004.ckpt"]),
        (lambda: checkpoint.restore(tmp / "dangling", state), checkpoint.CheckpointError,
         ["it is a link to a missing file"]),
        (lambda: load_safetensors(tmp / "garbage.safetensors"), ValueError,
         [f"{tmp}/garbage.safetensors is not a readable safetensors file", "write it again"]),
        (lambda: load_safetensors(tmp / "huge.safetensors"), ValueError, [f"{tmp}/huge.safetensors is not a readable"]),
        (lambda: load_safetensors(tmp / "model.pt"), ValueError, ["a torch.save .pt file", "torch.load(path"]),
        (lambda: load_safetensors(tmp), IsADirectoryError, [f"{tmp} is a folder", "pass the .safetensors file"]),
        (lambda: save_safetensors(tmp / "gone" / "m.safetensors", {"w": np.ones(2)}), OSError,
         [f"cannot write {tmp}/gone/m.safetensors", "No such file or directory", "an existing folder"]),
        (lambda: save_safetensors(tmp, {"w": np.ones(2)}), IsADirectoryError, [f"{tmp} is a folder"]),
        (lambda: gpt.generate(model, params, idx, 3, key=0), TypeError, ["key must be one PRNG key", "got 0"]),
        (lambda: gpt.generate(model, params, idx, 3, key=jax.random.key(0), block_size=99), ValueError,
         ["block_size must be an int in [1, 8]", "got 99"]),
        (lambda: gpt.generate(model, params, idx + 10, 3, key=jax.random.key(0)), ValueError,
         ["token ids in [10, 10], outside the vocabulary of 10", "encode the prompt"]),
        (lambda: train.create_train_state([nn.Linear(2, 2)], optax.sgd(0.1), jax.random.key(0)), TypeError,
         ["got list (a list of layers: wrap it, nn.Sequential(*layers))"]),
    ]


def test_library_misuse_is_named(tmp_path):
    for i, (call, error, fragments) in enumerate(_library_misuse_cases(tmp_path)):
        with pytest.raises(error) as info:
            call()
        for fragment in fragments:
            assert fragment in str(info.value), (i, fragment, str(info.value))


def _records(root: Path, name: str, bad_label=None) -> Path:
    from funcnet import loader

    rng = np.random.default_rng(0)
    x, y = rng.random((100, 64), dtype=np.float32), np.arange(100) % 10
    if bad_label is not None:
        y[3] = bad_label
    return loader.write_records(root / name, x, y, shards=2)


def _edit_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "records.json").read_text())
    (folder / "records.json").write_text(json.dumps({**meta, **changes}))


def _cut(path: Path, keep: float) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[:int(len(raw) * keep)])


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) // 10, len(raw) // 10 + 64):  # inside the records (the rest is padding)
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


STREAM_CASES = [  # (how the records are damaged, extra flags, exit status, fragments of the one line)
    ("count lowered", lambda d: _edit_meta(d, count=50), [], 2,
     ["records.json says count 50 but the shards hold 100 records", "write them again"]),
    ("count raised", lambda d: _edit_meta(d, count=500), [], 2, ["says count 500 but the shards hold 100 records"]),
    ("dtype edited", lambda d: _edit_meta(d, dtype="<f8"), [], 2,
     ["a record has 264 bytes but records.json's shape [64] and dtype <f8 give 520"]),
    ("dtype garbage", lambda d: _edit_meta(d, dtype="float99"), [], 2, ["dtype 'float99' is not a numpy dtype"]),
    ("shard truncated", lambda d: _cut(d / "shard-00001-of-00002.array_record", 0.5), [], 2,
     ["a shard cannot be read", "damaged or cut short", "write them again"]),
    ("shard byte-flipped", lambda d: _flip(d / "shard-00000-of-00002.array_record"), ["--verify-records"], 2,
     ["cannot be read", "write them again"]),
    ("label out of range, verified", None, ["--verify-records"], 2,
     ["record 3 has label 12, outside the 10 classes [0, 9]", "write them again"]),
    ("label out of range, streamed", None, [], 2,
     ["the labels range over [0, 12] but the model has 10 outputs", "class indices in [0, 9]"]),
    ("too many workers", lambda d: None, ["--workers", "1000"], 2, ["--workers 1000 is more than 4 per CPU core",
                                                                   "pass --workers <="]),
]


@pytest.mark.parametrize("case", STREAM_CASES, ids=[c[0] for c in STREAM_CASES])
def test_damaged_stream_records_are_refused_before_training(tmp_path, case):
    name, damage, flags, status, fragments = case
    folder = _records(tmp_path, "rec", bad_label=12 if damage is None else None)
    if damage is not None:
        damage(folder)
    got, _, err = run_main(["train", *TINY, "--batch-size", "16", "--stream", str(folder), *flags,
                            "--out", str(tmp_path / "out")])
    assert got == status, err
    line = one_line(err)
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    assert not (tmp_path / "out").exists()


def test_probe_cli_cases_are_one_line_naming_the_value(tmp_path):
    from funcnet.cli import memory

    ckpt = tmp_path / "ckpt"
    assert run_main(["train", *TINY, "--checkpoint-dir", str(ckpt), "--out", str(tmp_path / "a")])[0] == 0
    meta = checkpoint.read_metadata(ckpt)
    del meta["config"]["precision"]  # as an older funcnet train wrote it, before --precision existed
    import jax
    import optax

    from funcnet import nn, train

    template = train.create_train_state(nn.MLP([64, 8, 10]), optax.adam(1e-3), jax.random.key(0))
    state = checkpoint.restore(ckpt, template)
    checkpoint.save(ckpt, state, step=11, metadata=meta)
    mnist = _write_mnist(tmp_path / "mnist0", n=0)
    cases = [
        (["train", *TINY, "--checkpoint-dir", str(ckpt), "--resume", "--precision", "bf16", "--out",
          str(tmp_path / "b")], 2, ["--precision unrecorded (an older funcnet train, which had no --precision: its "
                                    "default fp32) (now bf16)", "pass the same flags"]),
        (["train", "--quiet", "--dataset", "mnist", "--data-dir", str(mnist), "--out", str(tmp_path / "c")], 2,
         [f"{mnist}/train-images-idx3-ubyte.gz holds 0 images", "download it again"]),
    ]
    for argv, status, fragments in cases:
        got, _, err = run_main(argv)
        assert got == status, err
        for fragment in fragments:
            assert fragment in one_line(err), (fragment, err)
    # the same old checkpoint resumes when the flag has the default it had then
    assert run_main(["train", *TINY, "--epochs", "2", "--checkpoint-dir", str(ckpt), "--resume",
                     "--out", str(tmp_path / "d")])[0] == 0
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            pytest.raises(SystemExit) as exited:
        memory.main(["--params", "-7B"])
    assert exited.value.code == 2
    assert "cannot read the parameter count '-7B'" in one_line(err.getvalue())


def test_devices_with_fp16_trains_from_the_command_line(tmp_path):
    # the fp16 loss scale is an array: made before the simulated devices, it started JAX's
    # backend with one device and the CLI user was told to call simulate_cpu_devices in Python
    proc = subprocess.run([sys.executable, "-m", "funcnet.cli", "train", *TINY, "--devices", "2", "--precision",
                           "fp16", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "params.npz").exists()
    assert "devices: 2 (cpu, simulated)\n" in proc.stdout  # it says what it runs on
