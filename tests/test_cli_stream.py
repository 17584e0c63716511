"""`funcnet train --stream DIR --workers K`: training from record shards on disk.

Oracles: the digits split as numpy arrays (what the records must hold), funcnet.train.fit
called directly on a Loader of the same files, an uninterrupted run for kill-and-resume, and the
in-memory path's exit status and messages for a NaN run.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from funcnet import checkpoint, cli, data, loader, nn, state_dict, train

from tests.test_cli import run_main

TINY = ["--quiet", "--hidden", "8", "--batch-size", "128"]  # 11 steps an epoch of digits' 1437
CNN = ["--quiet", "--model", "cnn", "--batch-size", "128", "--optimizer", "sgd", "--lr", "0.05"]  # 11 steps


def _outputs(out):
    return np.load(out / "params.npz"), (out / "metrics.json").read_bytes()


def test_writes_the_split_once_then_reads_it_and_trains_as_fit_on_a_loader(tmp_path):
    records = tmp_path / "records"
    status, out, err = run_main(["train", *TINY, "--epochs", "2", "--stream", str(records), "--out",
                                 str(tmp_path / "a")])
    assert status == 0, err
    assert out.startswith(f"--stream {records}: wrote the 1437 training examples of digits there (4 ArrayRecord "
                          f"shards)")
    (x, y), (x_te, y_te) = data.load("digits")
    written = loader.Records(records)
    assert len(written) == len(x) and written.shape == (64,) and written.dtype == np.float32
    for i in (0, 700, len(x) - 1):  # the in-memory split, bit for bit
        np.testing.assert_array_equal(written[i][0], x[i])
        assert written[i][1] == y[i]

    status, out, err = run_main(["train", *TINY, "--epochs", "2", "--stream", str(records), "--workers", "0",
                                 "--out", str(tmp_path / "b")])
    assert status == 0, err
    assert out.startswith(f"--stream {records}: training on the 1437 records already there; --dataset digits "
                          f"gives the test split only")
    params, text = _outputs(tmp_path / "a")
    assert text == _outputs(tmp_path / "b")[1]

    # the library on the same files, with the command's defaults: Adam 1e-3, MLP 64-8-10, seed 0
    model = nn.MLP([64, 8, 10])
    state, history = train.fit(model, optax.adam(1e-3), loader.Loader(records, 128, seed=0), (x_te, y_te),
                               epochs=2, key=jax.random.key(0), progress=False)
    metrics = json.loads(text)
    assert metrics["history"] == history and metrics["config"]["stream"] == str(records)
    assert "workers" not in metrics["config"]  # never changes the numbers
    for k, v in state_dict(state.params, model=model).items():
        np.testing.assert_array_equal(params[k], np.asarray(v), err_msg=k)

    # data-parallel from the same records: the command passes --devices to fit as the library call does
    status, out, err = run_main(["train", *TINY, "--epochs", "1", "--stream", str(records), "--devices", "2",
                                 "--out", str(tmp_path / "dp")])
    assert status == 0, err
    assert "devices: 2 (cpu, simulated)" in out, out
    state, history = train.fit(model, optax.adam(1e-3), loader.Loader(records, 128, seed=0), (x_te, y_te),
                               epochs=1, devices=2, key=jax.random.key(0), progress=False)
    params, text = _outputs(tmp_path / "dp")
    assert json.loads(text)["history"] == history
    for k, v in state_dict(state.params, model=model).items():
        np.testing.assert_array_equal(params[k], np.asarray(v), err_msg=k)

    # --max-steps stops inside epoch 2 (11 steps an epoch), as fit(max_steps=) on the Loader does
    status, out, err = run_main(["train", *TINY, "--epochs", "2", "--max-steps", "15", "--stream", str(records),
                                 "--out", str(tmp_path / "c")])
    assert status == 0, err
    assert "trained 15 steps (--max-steps) in 2 epochs" in out
    _, history = train.fit(model, optax.adam(1e-3), loader.Loader(records, 128, seed=0), (x_te, y_te), epochs=2,
                           max_steps=15, key=jax.random.key(0), progress=False)
    assert [r["step"] for r in history] == [11, 15]
    assert json.loads(_outputs(tmp_path / "c")[1])["history"] == history


# slow: a kill mid-epoch and a resume of the stream loader are checked bitwise by default in-process
# (tests/test_loader.py), and BatchNorm's statistics through a CLI resume by tests/test_cli_models.py
@pytest.mark.slow
def test_killed_mid_epoch_and_resumed_with_workers_is_bitwise_equal(tmp_path, monkeypatch):
    # the conv net: BatchNorm's running statistics travel in the checkpoints too
    records, ck = str(tmp_path / "records"), str(tmp_path / "ck")
    assert cli.main(["train", *CNN, "--epochs", "2", "--stream", records, "--out", str(tmp_path / "whole")]) == 0
    save = checkpoint.save

    def save_then_die(directory, state, *, step, **kw):
        save(directory, state, step=step, **kw)
        if step == 16:  # step 5 of epoch 2, after the epoch-1 checkpoint (11)
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save", save_then_die)
    flags = [*CNN, "--epochs", "2", "--stream", records, "--checkpoint-dir", ck, "--checkpoint-every", "4"]
    status, _, err = run_main(["train", *flags, "--out", str(tmp_path / "killed")])
    assert status == 130 and "the last good checkpoint (step 16)" in err, err
    monkeypatch.setattr(checkpoint, "save", save)
    assert checkpoint.latest_step(ck) == 16 and len(checkpoint.read_metadata(ck)["position"]["metrics"]["loss"][1]) == 5
    # resumed with a worker process reading the records: the same batches
    made = []

    class Counted(loader.Loader):
        def __init__(self, *args, **kwargs):
            made.append(kwargs["workers"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(loader, "Loader", Counted)
    assert cli.main(["train", *flags, "--resume", "--workers", "1", "--out", str(tmp_path / "resumed")]) == 0
    assert made == [1]
    (whole, whole_text), (resumed, resumed_text) = _outputs(tmp_path / "whole"), _outputs(tmp_path / "resumed")
    assert list(resumed.files) == list(whole.files) and "bn1.running_mean" in whole.files
    for k in whole.files:
        np.testing.assert_array_equal(resumed[k], whole[k], err_msg=k)
    assert resumed_text.replace(ck.encode(), b"") == whole_text  # metrics.json: the same bytes


def test_resume_after_the_records_changed_is_refused(tmp_path):
    records, ck = tmp_path / "records", str(tmp_path / "ck")
    flags = ["train", *TINY, "--stream", str(records), "--checkpoint-dir", ck]
    assert run_main([*flags, "--epochs", "1", "--out", str(tmp_path / "a")])[0] == 0
    (x, y), _ = data.load("digits")
    for f in records.iterdir():
        f.unlink()
    loader.write_records(records, x, np.roll(y, 1))  # same count, shape and file sizes; other labels
    status, _, err = run_main([*flags, "--epochs", "2", "--resume", "--out", str(tmp_path / "b")])
    assert status == 2 and "--resume: the digits data changed since the run in" in err, err


def test_a_non_finite_loss_exits_3_as_in_memory(tmp_path):
    # Adam at lr 1e30: step 1 moves every weight by ~1e30, step 2's loss is NaN (as test_reliability's run)
    records, ckpt = str(tmp_path / "records"), tmp_path / "ckpt"
    status, _, err = run_main(["train", *TINY, "--epochs", "1", "--lr", "1e30", "--stream", records,
                               "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1", "--out", str(tmp_path / "a")])
    assert status == cli.EXIT_NONFINITE == 3
    assert err.startswith("funcnet train: error: the loss is not finite at step 2 (epoch 1): loss = nan; ")
    assert err.rstrip().endswith(f"the last good checkpoint (step 1) in {ckpt} is kept")
    assert checkpoint.all_steps(ckpt) == [1] and not (tmp_path / "a").exists()
    status, _, err = run_main(["train", *TINY, "--epochs", "1", "--lr", "1e30", "--stream", records,
                               "--out", str(tmp_path / "b")])
    assert status == 3 and err.startswith("funcnet train: error: the loss is not finite in epoch 1 (step 11): "
                                          "train_loss = nan"), err


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    (root / "file").write_text("not a folder\n")
    (root / "foreign").mkdir()
    (root / "foreign" / "notes.txt").write_text("the user's own file\n")
    rng = np.random.default_rng(0)
    loader.write_records(root / "small", rng.random((100, 1, 6, 6), dtype=np.float32), rng.integers(0, 10, 100))
    (x, y), _ = data.load("digits")
    loader.write_records(root / "few", x[:100], y[:100])
    return {k: str(root / k) for k in ("file", "foreign", "small", "few", "out")} | {"root": str(root)}


@pytest.mark.parametrize("flags, fragment", [
    (["--workers", "2"], "--workers 2 sets the processes that read --stream's records; pass --stream DIR to train "
                         "from records on disk, or leave --workers out"),
    (["--workers", "-1"], "argument --workers: expected an integer >= 0, got -1"),
    (["--stream", "{root}/new", "--model", "gpt"],
     "--model gpt trains on --dataset text in memory: leave --stream out"),
    (["--stream", ""], "--stream is empty"),
    (["--stream", "{file}"], "--stream {file} is a file"),
    (["--stream", "{foreign}"], "--stream {foreign} holds files but no records.json"),
    (["--stream", "{out}/data", "--out", "{out}"], "--stream {out}/data is inside --out {out}"),
    (["--stream", "{small}"], "--stream {small} holds examples of shape (1, 6, 6) (36 features) but the test split "
                              "of --dataset digits has 64"),
    (["--stream", "{few}", "--batch-size", "128"], "--batch-size 128 is larger than the 100 training examples of "
                                                   "--stream {few}; use --batch-size <= 100"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_flags_that_do_not_fit_are_one_line(folders, flags, fragment, tmp_path):
    argv = ["train", "--quiet", "--out", str(tmp_path / "o"), *[f.format(**folders) for f in flags]]
    status, out, err = run_main(argv)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("funcnet train: error: ") and fragment.format(**folders) in err, err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_ctrl_c_with_workers_is_one_line_from_the_main_process(tmp_path):
    # Ctrl-C in a terminal signals the whole process group, worker processes included
    records, ckpt = tmp_path / "records", tmp_path / "ckpt"
    loader.write_records(records, *data.load("digits")[0])
    proc = subprocess.Popen([sys.executable, "-m", "funcnet.cli", "train", *TINY, "--epochs", "1000", "--stream",
                             str(records), "--workers", "1", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5",
                             "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:  # until batches flow from the worker, which is past its set-up
        _wait_for(lambda: proc.poll() is not None or (checkpoint.latest_step(ckpt) is not None
                                                      and _workers_ready(proc.pid, count=1)), "the worker's batches")
        assert proc.poll() is None, proc.communicate()[1]
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = err.splitlines()  # no traceback from the worker, no warning of leaked shared memory
    assert proc.returncode == 130 and len(lines) == 1, err
    assert lines[0].startswith("funcnet train: interrupted; the last good checkpoint (step ")


def _stat(pid):
    try:  # (state, parent pid, command line) of a live process; None once it is gone or a zombie
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    return None if fields[0] in "ZX" else (fields[0], int(fields[1]), command)


def _children(pid):
    found = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return {p: s[2] for p in found if (s := _stat(p)) is not None and s[1] == pid}


def _shared_memory(pids):
    # the /dev/shm files (shared memory, POSIX semaphores) these processes have mapped now
    names = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            names |= {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                      if "/dev/shm/" in line}
    return names


def _wait_for(condition, what, seconds=180):
    # the overall deadline only turns a hang into a failure; every wait is for the state itself
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"still waiting after {seconds} s for {what}"
        time.sleep(0.2)


def _ignores(pid, sig) -> bool:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def _workers_ready(pid, count=2) -> bool:
    # the workers started and past their set-up, which leaves SIGTERM, then SIGINT, to the main process
    workers = [p for p, command in _children(pid).items() if "spawn_main" in command]
    return len(workers) == count and all(_ignores(p, signal.SIGINT) for p in workers)


def _wait_until_gone(name, pids):
    _wait_for(lambda: not any(_stat(p) for p in pids), f"{name}: {sorted(pids)} to exit")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads processes and their mappings in /proc")
def test_workers_leave_no_process_and_no_shared_memory_after_sigterm_sigkill_or_an_error(tmp_path):
    records = tmp_path / "records"
    loader.write_records(records, *data.load("digits")[0])
    cases = {  # name: (signal, to the whole process group, extra flags); run side by side, one process each
        "SIGTERM": (signal.SIGTERM, False, []),
        "SIGTERM to the group": (signal.SIGTERM, True, []),  # as a scheduler (or timeout) stops a job
        "SIGKILL": (signal.SIGKILL, False, []),
        "NaN loss": (None, False, ["--lr", "1e30", "--epochs", "3"]),  # an error: exit 3, after batches flowed
    }
    runs = {}
    try:
        for name, (_, _, flags) in cases.items():
            folder = tmp_path / name.replace(" ", "-")
            folder.mkdir()
            stderr = open(folder / "stderr", "w")  # noqa: SIM115 - read once the whole lineage is gone
            proc = subprocess.Popen([sys.executable, "-m", "funcnet.cli", "train", *TINY, "--epochs", "1000", *flags,
                                     "--stream", str(records), "--workers", "2", "--checkpoint-dir",
                                     str(folder / "ckpt"), "--checkpoint-every", "1", "--out", str(folder / "out")],
                                    stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
            stderr.close()
            runs[name] = (proc, folder, {}, set())
        waiting = dict(runs)

        def watch():  # record each run's lineage and mappings until it is signalled (or the NaN run exits)
            for name, (proc, folder, lineage, shm) in list(waiting.items()):
                lineage.update(_children(proc.pid))  # the workers and multiprocessing's resource tracker
                shm.update(_shared_memory([proc.pid, *lineage]))
                sig, group, _ = cases[name]
                if sig is None or proc.poll() is not None:
                    assert sig is None, (name, (folder / "stderr").read_text())
                    if proc.poll() is not None:
                        del waiting[name]
                elif checkpoint.latest_step(folder / "ckpt") is not None and _workers_ready(proc.pid):
                    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)  # batches flowed from 2 workers
                    del waiting[name]
            return not waiting

        _wait_for(watch, "the runs' workers to make batches")
        problems = []
        for name, (proc, folder, lineage, shm) in runs.items():
            status = proc.wait(timeout=300)
            try:
                _wait_until_gone(name, lineage)
            except AssertionError as e:  # orphans: reported with the other runs' problems
                problems.append((name, str(e)))
                continue
            err = (folder / "stderr").read_text()
            last = err.strip().splitlines()[-1] if err.strip() else ""
            expected = {"SIGKILL": (-signal.SIGKILL, ""), "NaN loss": (3, "funcnet train: error: the loss is not finite")}
            want, line = expected.get(name, (143, "funcnet train: terminated by SIGTERM: saved checkpoint step "))
            workers = [p for p, command in lineage.items() if "spawn_main" in command]
            left = sorted(f for f in shm if os.path.exists(f))
            if status != want or not last.startswith(line) or len(workers) != 2 or left:
                problems.append((name, status, workers, left, err))
            # nothing leaked at all; after SIGKILL the resource tracker frees what the parent held, and may say so
            if "Traceback" in err or ("leaked shared_memory" if name == "SIGKILL" else "leaked") in err:
                problems.append((name, err))
        assert not problems, problems
    finally:  # whatever failed: no process of this test outlives it
        for proc, _, lineage, _ in runs.values():
            for pid in [proc.pid, *lineage]:
                if _stat(pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            proc.wait()
