"""The ``funcnet`` command: ``funcnet train``, ``sample``, ``info``, ``memory``, ``port``.

``funcnet train`` trains an MLP on a bundled or local data set and writes
``OUT/metrics.json`` (no timings, so the same seed gives the same file),
``OUT/params.npz`` (state_dict keys) and ``OUT/loss.png``. Bad input is reported
in one line with a non-zero exit status, never a traceback.

Nothing the user had is lost:

- ``--out`` and ``--checkpoint-dir`` are checked (created, written to, locked) before any
  data is loaded. The three outputs are written into a hidden folder beside ``--out`` and
  swapped in as a whole (``renameat2(RENAME_EXCHANGE)`` on Linux), so ``--out`` holds the
  previous complete set or the new one, never a mix, whenever the run is killed. Hence
  ``--out`` must be a folder of its own (holding nothing but those three files).
- ``--checkpoint-dir`` is locked for the whole run (``funcnet.checkpoint.lock``): a
  second run on it exits at once, naming the folder and the PID holding it.
- ``--resume auto`` resumes when the folder holds a checkpoint and starts fresh when it
  does not: the one command line a job scheduler can restart as often as it likes.
- A NaN or infinite loss stops the run (exit 3) before it is checkpointed, so the last
  checkpoint is the last good one. JSON files hold no NaN/Infinity (strict JSON; a
  non-finite number would be written as the string "NaN"/"Infinity").
- SIGTERM: with ``--checkpoint-dir`` the run saves a checkpoint at the next epoch end
  (or ``--checkpoint-every`` boundary) and exits 143; ``--resume auto`` then continues
  bit for bit. Without one it exits 143 at once. Ctrl-C (SIGINT) exits 130 keeping the
  last checkpoint. Either way ``--out`` is left as it was (or, for a SIGTERM that came
  once it was written, holds the run's complete outputs). A SIGTERM whose exception
  Python swallowed (a gc callback, ``__del__``) still exits 143.

Exit status: 0 done; 2 bad input or an I/O error (one line on stderr); 3 the loss became
NaN/Inf; 130 interrupted (SIGINT); 143 terminated (SIGTERM).
"""

from __future__ import annotations

import sys

from funcnet.cli.errors import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NONFINITE,
    EXIT_TERMINATED,
    Terminated,
    _one_line,
)
from funcnet.cli.info import info_command
from funcnet.cli.parser import build_parser, join_negative_values
from funcnet.cli.train import train_command

__all__ = ["main", "build_parser", "EXIT_ERROR", "EXIT_NONFINITE", "EXIT_INTERRUPTED", "EXIT_TERMINATED"]


def main(argv: list[str] | None = None) -> int:
    """Run ``funcnet ARGV`` and return its exit status (0, 2, 3, 130 or 143, as the module docstring lists)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["memory"]:
        from funcnet.cli import memory

        return memory.main(argv[1:])
    if argv[:1] == ["port"]:
        from funcnet.cli import port

        return port.main(argv[1:])
    args = build_parser().parse_args(join_negative_values(argv))
    from funcnet.guards import NonFiniteLossError

    prog = f"funcnet {args.command}"
    try:
        if args.command == "train":
            train_command(args)
        elif args.command == "info":
            info_command(args)
        elif args.command == "sample":
            from funcnet.cli.sample import sample_command

            sample_command(args)
    except NonFiniteLossError as e:
        print(f"{prog}: error: {_one_line(e)}{_kept(args)}", file=sys.stderr)
        return EXIT_NONFINITE
    except (ValueError, OSError) as e:  # UsageError, CheckpointError, missing files, unwritable folders
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted{_kept(args)}; --out is left as it was", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated as e:
        left = "" if e.out_written else "; --out is left as it was"
        print(f"{prog}: terminated by SIGTERM: {e}{left}", file=sys.stderr)
        return EXIT_TERMINATED
    return 0


def _kept(args) -> str:
    directory = getattr(args, "checkpoint_dir", None)
    if directory is None:
        return ""
    from funcnet import checkpoint

    newest = checkpoint.latest_step(directory)
    if newest is None:
        return f"; no checkpoint in {directory}"
    return f"; the last good checkpoint (step {newest}) in {directory} is kept"
