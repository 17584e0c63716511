"""Checkpoints: bitwise round trips, atomic saves under crashes and SIGKILL, strict and
verified restores, and resumed training equal to uninterrupted training."""

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from funcnet import checkpoint, nn, precision, train
from funcnet.checkpoint import CheckpointError
from funcnet.cli import main


@functools.lru_cache(maxsize=None)
def _setup(hidden, optimizer):
    model = nn.MLP([8, hidden, 3])
    tx = optax.adam(1e-2) if optimizer == "adam" else optax.sgd(0.1, momentum=0.9)
    return model, tx, train.make_step(model, tx)  # compiled once per setup, not per test


def _trained_state(hidden=16, optimizer="adam", steps=3, loss_scale=None):
    """A state whose optimizer moments, step and key have all moved away from their initial values."""
    model, tx, step = _setup(hidden, optimizer)
    state = train.create_train_state(model, tx, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (12, 8))
    y = jnp.arange(12, dtype=jnp.int32) % 3
    for _ in range(steps):
        state, _ = step(state, (x, y))
    return state._replace(loss_scale=loss_scale)


def _raw(leaf):
    """(dtype, shape, bytes) of a leaf; typed keys by their key data. Bytes, so NaN == NaN."""
    if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return ("key", str(jax.random.key_impl(leaf)), np.asarray(jax.random.key_data(leaf)).tobytes())
    a = np.asarray(leaf)
    return (a.dtype.str, a.shape, a.tobytes())


def _same_bits(a, b):
    return (jax.tree.structure(a) == jax.tree.structure(b)
            and [_raw(x) for x in jax.tree.leaves(a)] == [_raw(x) for x in jax.tree.leaves(b)])


def test_round_trip_is_bitwise_for_every_leaf(tmp_path):
    scale = precision.DynamicLossScale(growth_interval=3).adjust(jnp.bool_(True)).adjust(jnp.bool_(False))
    state = _trained_state(loss_scale=scale)
    odd = {"bf16": jnp.array([1.5, -0.0, jnp.nan, jnp.inf], jnp.bfloat16), "empty": jnp.zeros((0, 3)),
           "raw_key": jax.random.PRNGKey(3), "flag": np.array(True), "count": 5}
    expected = [_raw(x) for x in jax.tree.leaves(state)]  # taken before anything can alias it
    checkpoint.save(tmp_path, (state, odd), step=3, metadata={"note": "x", "loss": [0.1, float("nan")]})

    template = (_trained_state(loss_scale=precision.DynamicLossScale(growth_interval=3), steps=0),
                {"bf16": jnp.zeros(4, jnp.bfloat16), "empty": jnp.ones((0, 3)), "raw_key": jax.random.PRNGKey(0),
                 "flag": np.array(False), "count": 0})
    got_state, got_odd = checkpoint.restore(tmp_path, template)
    assert [_raw(x) for x in jax.tree.leaves(got_state)] == expected
    assert isinstance(got_state, train.TrainState) and jax.tree.structure(got_state) == jax.tree.structure(state)
    assert _same_bits(got_odd, odd) and got_odd["count"] == 5 and type(got_odd["count"]) is int
    assert int(got_state.step) == 3 and got_state.opt_state[0].count == 3
    assert float(got_state.loss_scale.loss_scale) == 2.0**15  # halved once by the non-finite step
    meta = checkpoint.read_metadata(tmp_path)
    # strict JSON on disk: a non-finite float comes back as its string, which float() reads
    assert meta["note"] == "x" and meta["loss"] == [0.1, "NaN"] and np.isnan(float(meta["loss"][1]))
    # an abstract template (no arrays allocated) restores the same bits
    abstract = jax.eval_shape(lambda: _trained_state(loss_scale=scale, steps=0))
    checkpoint.save(tmp_path / "b", state, step=3)
    assert [_raw(x) for x in jax.tree.leaves(checkpoint.restore(tmp_path / "b", abstract))] == expected


def test_restored_key_continues_the_same_random_stream(tmp_path):
    state = _trained_state()
    checkpoint.save(tmp_path, state, step=1)
    back = checkpoint.restore(tmp_path, _trained_state(steps=0))
    assert np.array_equal(jax.random.uniform(state.key, (5,)), jax.random.uniform(back.key, (5,)))


def test_keeps_the_newest_k_and_refuses_to_go_back(tmp_path):
    state = _trained_state(steps=0)
    for s in (10, 20, 30, 40):
        checkpoint.save(tmp_path, state, step=s, keep=2)
    assert checkpoint.all_steps(tmp_path) == [30, 40] and checkpoint.latest_step(tmp_path) == 40
    assert sorted(os.listdir(tmp_path)) == ["step_00000030.ckpt", "step_00000040.ckpt"]
    checkpoint.save(tmp_path, state, step=40, keep=2)  # the same step again: replaced in place
    with pytest.raises(CheckpointError, match=r"step 35 is older than the newest checkpoint .* \(step 40\)"):
        checkpoint.save(tmp_path, state, step=35)
    with pytest.raises(ValueError, match=r"keep must be a positive integer or None \(keep all\), got 0"):
        checkpoint.save(tmp_path, state, step=50, keep=0)
    with pytest.raises(TypeError, match="step must be a non-negative integer, got 1.5"):
        checkpoint.save(tmp_path, state, step=1.5)
    assert checkpoint.latest_step(tmp_path / "nowhere") is None


class _DiesHalfway:
    """A file object that writes half of what it is given, then fails like a full disk."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")


def test_a_save_failing_midway_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    first = _trained_state(steps=1)
    checkpoint.save(tmp_path, first, step=1)
    expected = [_raw(x) for x in jax.tree.leaves(first)]
    monkeypatch.setattr(checkpoint, "open", lambda path, mode: _DiesHalfway(open(path, mode)), raising=False)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(tmp_path, _trained_state(steps=2), step=2)
    monkeypatch.undo()
    assert checkpoint.latest_step(tmp_path) == 1
    assert os.listdir(tmp_path) == ["step_00000001.ckpt"]  # the half-written temporary file is gone
    assert [_raw(x) for x in jax.tree.leaves(checkpoint.restore(tmp_path, _trained_state(steps=0)))] == expected


def test_sigkill_during_save_leaves_the_previous_checkpoint(tmp_path):
    # A real kill: the child dies inside save(), after writing the new file's bytes and
    # before the rename that would publish it.
    script = textwrap.dedent(f"""
        import os, signal, jax, optax
        from funcnet import checkpoint, nn, train
        model, tx = nn.MLP([8, 16, 3]), optax.adam(1e-2)
        state = train.create_train_state(model, tx, jax.random.key(0))
        checkpoint.save({str(tmp_path)!r}, state, step=1)
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.save({str(tmp_path)!r}, state._replace(step=state.step + 1), step=2)
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "not reached" not in proc.stdout
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".step_00000002.ckpt.tmp-")]
    assert len(leftovers) == 1 and (tmp_path / leftovers[0]).stat().st_size > 0
    assert checkpoint.all_steps(tmp_path) == [1]
    template = train.create_train_state(nn.MLP([8, 16, 3]), optax.adam(1e-2), jax.random.key(5))
    expected = train.create_train_state(nn.MLP([8, 16, 3]), optax.adam(1e-2), jax.random.key(0))
    assert _same_bits(checkpoint.restore(tmp_path, template), expected)
    checkpoint.save(tmp_path, expected, step=2)  # the next save clears the dead writer's file
    assert sorted(os.listdir(tmp_path)) == ["step_00000001.ckpt", "step_00000002.ckpt"]


def _damage(path, how):
    raw = path.read_bytes()
    if how == "flipped byte":
        raw = raw[:-100] + bytes([raw[-100] ^ 0x01]) + raw[-99:]
    elif how == "truncated":
        raw = raw[: len(raw) - 1000]
    elif how == "truncated header":
        raw = raw[:20]
    elif how == "empty":
        raw = b""
    elif how == "not a checkpoint":
        raw = b"PK\x03\x04" + raw[4:]
    path.write_bytes(raw)


@pytest.mark.parametrize("how, message", [
    ("flipped byte", r"is corrupt: its SHA-256 does not match"),
    ("truncated", r"is truncated: header says \d+ payload bytes, found \d+"),
    ("truncated header", r"is truncated: 20 bytes, shorter than its 56-byte header"),
    ("empty", r"is truncated: 0 bytes"),
    ("not a checkpoint", r"is not a funcnet checkpoint \(starts with b'PK"),
])
def test_damaged_files_are_refused_by_name(tmp_path, how, message):
    state = _trained_state(steps=0)
    checkpoint.save(tmp_path, state, step=1)
    path = checkpoint.save(tmp_path, state, step=2)
    _damage(path, how)
    with pytest.raises(CheckpointError, match=message) as err:
        checkpoint.restore(tmp_path, state)
    assert "step_00000002.ckpt" in str(err.value)
    if how != "not a checkpoint":
        assert "delete step_00000002.ckpt to fall back to the previous checkpoint" in str(err.value)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.read_metadata(tmp_path)
    assert _same_bits(checkpoint.restore(tmp_path, state, step=1), state)


def test_a_different_model_is_reported_path_by_path(tmp_path):
    checkpoint.save(tmp_path, _trained_state(hidden=16), step=3)
    with pytest.raises(CheckpointError) as err:
        checkpoint.restore(tmp_path, _trained_state(hidden=32, steps=0))
    text = str(err.value)
    assert "step_00000003.ckpt (step 3) does not match the template" in text
    # every mismatching leaf, params and Adam moments alike, with expected vs got
    for path in ("params/0/weight", "params/0/bias", "params/2/weight", "opt_state/0/mu/0/weight",
                 "opt_state/0/nu/2/weight"):
        assert path + ": expected float32[" in text, path
    assert "params/0/weight: expected float32[32, 8], got float32[16, 8]" in text
    assert "params/2/bias" not in text  # (3,) in both models
    assert "same model, optimizer and loss scale" in text


def test_a_wrong_template_lists_missing_unexpected_dtype_and_key_problems(tmp_path):
    checkpoint.save(tmp_path, _trained_state(), step=3)
    sgd = _trained_state(optimizer="sgd", steps=0)
    template = sgd._replace(params=jax.tree.map(lambda a: a.astype(jnp.bfloat16), sgd.params),
                            key=jax.random.PRNGKey(0), loss_scale=precision.StaticLossScale(128.0))
    with pytest.raises(CheckpointError) as err:
        checkpoint.restore(tmp_path, template)
    text = str(err.value)
    assert "missing (in the template, not in the checkpoint): opt_state/0/trace/0/bias" in text
    assert "loss_scale/loss_scale" in text.split("missing")[1].split("\n")[0]
    assert "unexpected (in the checkpoint, not in the template): opt_state/0/count, opt_state/0/mu/0/bias" in text
    assert "params/0/weight: expected bfloat16[16, 8], got float32[16, 8]" in text
    assert "key: expected uint32[2], got a PRNG key (threefry2x32) of shape ()" in text


def test_a_donated_state_is_refused_by_leaf(tmp_path):
    model, tx, step = _setup(16, "adam")
    old = train.create_train_state(model, tx, jax.random.key(0))
    new, _ = step(old, (jnp.ones((3, 8)), jnp.zeros(3, jnp.int32)))  # donates old
    with pytest.raises(CheckpointError, match="save: leaf params/0/bias was donated to a training step"):
        checkpoint.save(tmp_path, old, step=0)
    assert checkpoint.all_steps(tmp_path) == []
    checkpoint.save(tmp_path, new, step=1)


def test_missing_directory_step_and_empty_directory_are_named(tmp_path):
    state = _trained_state(steps=0)
    with pytest.raises(CheckpointError, match=f"no checkpoint directory {tmp_path / 'nope'}"):
        checkpoint.restore(tmp_path / "nope", state)
    with pytest.raises(CheckpointError, match=r"no checkpoint in .* \(no step_\*\.ckpt files\)"):
        checkpoint.restore(tmp_path, state)
    checkpoint.save(tmp_path, state, step=4)
    with pytest.raises(CheckpointError, match="no checkpoint for step 5 in .*; available steps: 4"):
        checkpoint.restore(tmp_path, state, step=5)
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="exists and is not a directory"):
        checkpoint.save(tmp_path / "file", state, step=1)


def test_cli_resumed_from_a_mid_epoch_checkpoint_writes_the_uninterrupted_files(tmp_path):
    # fit(every_steps=, on_steps=, start=Position(...)) as the CLI drives it; the Position
    # (epoch, shuffle key, per-step metrics so far) travels in the checkpoint's JSON metadata.
    # 1437 // 71 = 20 steps per epoch, checkpoints every 10 steps: 10, 20 (end of epoch 1), 30, 40
    # fp16: the state carries a dynamic loss scale and the step reports grads_finite/loss_scale too
    flags = ["train", "--quiet", "--epochs", "2", "--hidden", "16", "--batch-size", "71", "--precision", "fp16"]
    ckpt = tmp_path / "ckpt"
    assert main([*flags, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "10", "--out", str(tmp_path / "a")]) == 0
    assert checkpoint.all_steps(ckpt) == [20, 30, 40]
    checkpoint.checkpoint_path(ckpt, 40).unlink()  # as if killed right after step 30 was saved
    position = checkpoint.read_metadata(ckpt)["position"]
    assert position["epoch"] == 1 and position["metrics"]["loss"][0] == "float32" and "perm_key" in position
    assert len(position["metrics"]["loss"][1]) == 10 and position["metrics"]["grads_finite"][0] == "bool"
    assert main([*flags, "--checkpoint-dir", str(ckpt), "--resume", "--out", str(tmp_path / "resumed")]) == 0
    # the oracle is run a itself; that a run checkpointing inside epochs equals one that does not
    # is shown by the kill test below
    for name in ("metrics.json", "params.npz"):
        assert (tmp_path / "resumed" / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name


def test_killed_cli_run_resumes_to_the_uninterrupted_result(tmp_path):
    # 40 epochs of 1437 // 32 = 44 steps: seconds of training left when the first checkpoint lands
    epochs, steps = 40, 44
    flags = ["train", "--quiet", "--epochs", str(epochs), "--hidden", "32", "--seed", "3"]
    # checkpoints inside epochs too (the kill may land mid-epoch), in stretches of 10, 4, 6, 8 and
    # 2 steps, since 10 does not divide 44; the oracle runs each epoch as one scan
    every = ["--checkpoint-every", "10"]
    ckpt = tmp_path / "ckpt"
    t0 = time.perf_counter()
    victim = subprocess.Popen([sys.executable, "-m", "funcnet.cli", *flags, *every, "--checkpoint-dir", str(ckpt),
                               "--out", str(tmp_path / "killed")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = {}

    def kill_after_first_checkpoint():
        deadline = time.monotonic() + 300
        while checkpoint.latest_step(ckpt) is None and victim.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        seen["running"] = victim.poll() is None
        victim.send_signal(signal.SIGKILL)
        seen["at"] = time.perf_counter() - t0

    watcher = threading.Thread(target=kill_after_first_checkpoint)
    watcher.start()
    # Meanwhile the oracle: the same flags, uninterrupted, no checkpoints, in this process (the
    # resumed run starts from the killed process's state, so equality also shows that a fresh
    # process computes the same bits).
    assert main([*flags, "--out", str(tmp_path / "whole")]) == 0
    watcher.join()
    _, err = victim.communicate()
    assert seen["running"], f"the run ended before it could be killed: {err.decode()}"
    assert victim.returncode == -signal.SIGKILL
    killed_at = checkpoint.latest_step(ckpt)
    assert killed_at is not None and killed_at < epochs * steps and not (tmp_path / "killed").exists()

    t1 = time.perf_counter()
    assert main([*flags, *every, "--checkpoint-dir", str(ckpt), "--resume", "--out", str(tmp_path / "resumed")]) == 0
    print(f"\nkilled at step {killed_at} ({'mid-epoch' if killed_at % steps else 'epoch end'}), "
          f"{seen['at']:.1f} s after the start; resumed and finished in {time.perf_counter() - t1:.1f} s")

    got, want = np.load(tmp_path / "resumed" / "params.npz"), np.load(tmp_path / "whole" / "params.npz")
    assert sorted(got.files) == sorted(want.files) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for name in want.files:
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
    assert (tmp_path / "resumed" / "metrics.json").read_bytes() == (tmp_path / "whole" / "metrics.json").read_bytes()
    assert json.loads((tmp_path / "whole" / "metrics.json").read_text())["final"]["step"] == epochs * steps
