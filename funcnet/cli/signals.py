"""SIGTERM during a run: saved at the next checkpoint boundary, or stop at once; honoured
wherever it lands, even inside code whose exceptions Python only prints."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path

from funcnet.cli.errors import Terminated

# After a SIGTERM whose exception was swallowed, the signal is delivered again this much later:
# by then the main thread has left the callback that swallowed it (or it is swallowed again).
_AGAIN_S = 0.05


class _Run:
    """What the run has saved so far and how SIGTERM is handled. With a checkpoint folder,
    SIGTERM during training only sets a flag: the next checkpoint callback saves and then
    stops (a step boundary; the compiled epoch cannot be interrupted anyway). Otherwise, or
    outside training, it stops at once.

    Python only prints an exception raised inside a gc callback (JAX's ``_xla_gc_callback``), a
    ``__del__`` or a weakref callback ("Exception ignored in ..."), so the handler's exception
    can be lost. Three nets catch it: such a lost ``Terminated`` reaches ``sys.unraisablehook``,
    which (instead of printing it) delivers the signal again a moment later, outside that
    callback; ``check_pending()`` stops the run before --out is written; and ``signals()``
    turns a run that ends after a SIGTERM into ``Terminated`` whatever happened in between."""

    def __init__(self, args):
        self.directory = None if args.checkpoint_dir is None else Path(args.checkpoint_dir)
        self.out = Path(args.out)
        self.training = False
        self.pending = False
        self.received = False  # set by every SIGTERM, even one whose exception was swallowed
        self.saved_step = None  # the newest checkpoint: resumed from, or saved by this run
        self.wrote_out = False  # --out holds this run's outputs (set once they are swapped in)
        self._closing = False
        self._again = None  # the timer that delivers a swallowed SIGTERM again

    @contextlib.contextmanager
    def signals(self):
        def on_sigterm(signum, frame):
            self.received = True  # first: the exception below may be lost
            if self._closing:
                return  # the run is ending: signals() raises Terminated after restoring the handlers
            if self.training and self.directory is not None:
                self.pending = True
            else:
                raise self.terminated()

        def on_unraisable(unraisable):
            if not isinstance(unraisable.exc_value, Terminated):
                previous_hook(unraisable)
                return
            # Swallowed where Python only prints (gc callback, __del__, weakref callback): deliver
            # it again from a timer thread, to be raised once the main thread is out of there.
            if not self._closing and (self._again is None or not self._again.is_alive()):
                import _thread

                self._again = threading.Timer(_AGAIN_S, _thread.interrupt_main, (signal.SIGTERM,))
                self._again.daemon = True
                self._again.start()

        try:
            previous = signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # not the main thread: leave signals alone
            yield
            return
        previous_hook, sys.unraisablehook = sys.unraisablehook, on_unraisable
        try:
            yield
        except Terminated:
            raise
        except BaseException as e:
            if not self.received:
                raise
            raise self.terminated() from e  # whatever failed after a SIGTERM (a swallowed one), it is the exit
        finally:
            self._closing = True  # a SIGTERM from here on is only recorded
            if self._again is not None:
                self._again.cancel()
                self._again.join()
            signal.signal(signal.SIGTERM, previous)
            sys.unraisablehook = previous_hook
        if self.received:  # the run went on after a SIGTERM whose exception was lost
            raise self.terminated()

    def check_pending(self, saved: bool = False):
        if self.pending or self.received:
            self.pending = False
            raise self.terminated(saved)

    def terminated(self, saved: bool = False) -> Terminated:
        e = Terminated(self.stopped_message(saved))
        e.out_written = self.wrote_out
        return e

    def kept(self) -> str:
        if self.directory is None:
            return ""
        if self.saved_step is None:
            return f"; no checkpoint was saved in {self.directory} yet"
        return f"; the last checkpoint (step {self.saved_step}) in {self.directory} is kept"

    def stopped_message(self, saved: bool = False) -> str:
        if self.wrote_out:
            return f"it came after the run ended: --out {self.out} holds its complete outputs{self.kept()}"
        if self.directory is None:
            return "nothing was saved (no --checkpoint-dir): rerun to start over"
        if self.saved_step is None:
            return f"no checkpoint was saved in {self.directory} yet: rerun with --resume auto to start over"
        how = "saved" if saved else "kept the last"
        return (f"{how} checkpoint step {self.saved_step} in {self.directory}; rerun the same command with "
                f"--resume auto to continue exactly where it stopped")
