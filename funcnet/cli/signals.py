"""SIGTERM during a run: saved at the next checkpoint boundary, or stop at once."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

from funcnet.cli.errors import Terminated


class _Run:
    """What the run has saved so far and how SIGTERM is handled. With a checkpoint folder,
    SIGTERM during training only sets a flag: the next checkpoint callback saves and then
    stops (a step boundary; the compiled epoch cannot be interrupted anyway). Otherwise, or
    outside training, it stops at once."""

    def __init__(self, args):
        self.directory = None if args.checkpoint_dir is None else Path(args.checkpoint_dir)
        self.training = False
        self.pending = False
        self.received = False  # set by every SIGTERM, even one whose exception was swallowed
        self.saved_step = None  # the newest checkpoint: resumed from, or saved by this run

    @contextlib.contextmanager
    def signals(self):
        def on_sigterm(signum, frame):
            # The flag first: the exception below is lost when the signal lands inside a callback
            # whose errors Python only prints ("Exception ignored in _xla_gc_callback", a __del__);
            # check_pending() then still stops the run before --out is written.
            self.received = True
            if self.training and self.directory is not None:
                self.pending = True
            else:
                raise Terminated(self.stopped_message())

        try:
            previous = signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # not the main thread: leave signals alone
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def check_pending(self, saved: bool = False):
        if self.pending or self.received:
            self.pending = self.received = False
            raise Terminated(self.stopped_message(saved))

    def kept(self) -> str:
        if self.directory is None:
            return ""
        if self.saved_step is None:
            return f"; no checkpoint was saved in {self.directory} yet"
        return f"; the last checkpoint (step {self.saved_step}) in {self.directory} is kept"

    def stopped_message(self, saved: bool = False) -> str:
        if self.directory is None:
            return "nothing was saved (no --checkpoint-dir): rerun to start over"
        if self.saved_step is None:
            return f"no checkpoint was saved in {self.directory} yet: rerun with --resume auto to start over"
        how = "saved" if saved else "kept the last"
        return (f"{how} checkpoint step {self.saved_step} in {self.directory}; rerun the same command with "
                f"--resume auto to continue exactly where it stopped")
