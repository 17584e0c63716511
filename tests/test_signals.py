"""SIGTERM wherever it lands: inside code whose exceptions Python only prints (a gc callback
such as JAX's ``_xla_gc_callback``, a ``__del__``, a weakref callback) or swallowed by a
library's ``except BaseException``, after training, before or after --out is written.

The signal is raised from inside that code (``signal.raise_signal`` runs the handler before it
returns), so the race a busy machine only sometimes loses is forced every time. The oracle:
exit 143, --out absent (or the complete set when the signal came after it was written, compared
with an uninterrupted run), the last checkpoint kept, one line on stderr.
"""

import gc
import signal
import time
import weakref

import pytest

import funcnet
from funcnet import checkpoint
from funcnet.cli import outputs
from tests.test_reliability import TINY, one_line, run_main, snapshot


def _swallowed_in_gc_callback():
    def callback(phase, info):
        if phase == "start":
            gc.callbacks.remove(callback)
            signal.raise_signal(signal.SIGTERM)

    gc.callbacks.append(callback)
    gc.collect()


def _swallowed_in_del():
    class Dying:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)

    Dying()


def _swallowed_in_weakref_callback():
    class Target:
        pass

    target = Target()
    ref = weakref.ref(target, lambda _: signal.raise_signal(signal.SIGTERM))
    del target
    return ref


def _swallowed_by_a_library():
    try:
        signal.raise_signal(signal.SIGTERM)
    except BaseException:  # noqa: BLE001, S110 - the careless library under test
        pass


SWALLOWERS = {"gc callback": _swallowed_in_gc_callback, "__del__": _swallowed_in_del,
              "weakref callback": _swallowed_in_weakref_callback, "except BaseException": _swallowed_by_a_library}


def _then_wait_for_the_signal_again(missed: list):
    # the run's own code after the callback: a swallowed SIGTERM must reach it (delivered again),
    # well before this deadline, which only turns a run that never stops into a failure
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.01)
    missed.append(True)


@pytest.mark.parametrize("where", list(SWALLOWERS))
def test_a_swallowed_sigterm_after_training_exits_143_before_writing_out(tmp_path, monkeypatch, where):
    swallow, ckpt, missed = SWALLOWERS[where], tmp_path / "ckpt", []
    real = funcnet.state_dict

    def state_dict(*a, **k):  # after training, before --out is written
        swallow()
        if where != "except BaseException":  # no hook sees that one: check_pending catches it
            _then_wait_for_the_signal_again(missed)
        return real(*a, **k)

    monkeypatch.setattr(funcnet, "state_dict", state_dict)
    status, _, err = run_main(["train", *TINY, "--checkpoint-dir", str(ckpt), "--out", str(tmp_path / "out")])
    assert status == 143 and not missed, err
    assert one_line(err) == (f"funcnet train: terminated by SIGTERM: kept the last checkpoint step 11 in {ckpt}; "
                             f"rerun the same command with --resume auto to continue exactly where it stopped; "
                             f"--out is left as it was")
    assert checkpoint.all_steps(ckpt) == [11] and not (tmp_path / "out").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigterm_swallowed_after_out_is_written_exits_143_naming_the_outputs(tmp_path, monkeypatch):
    status, _, err = run_main(["train", *TINY, "--out", str(tmp_path / "whole")])
    assert status == 0, err
    commit = outputs._Outputs.commit

    def commit_then_swallow(self, *a, **k):
        commit(self, *a, **k)
        _swallowed_in_gc_callback()

    monkeypatch.setattr(outputs._Outputs, "commit", commit_then_swallow)
    out = tmp_path / "out"
    status, _, err = run_main(["train", *TINY, "--out", str(out)])
    assert status == 143, err
    assert one_line(err) == (f"funcnet train: terminated by SIGTERM: it came after the run ended: --out {out} holds "
                             f"its complete outputs")
    assert snapshot(out) == snapshot(tmp_path / "whole")
