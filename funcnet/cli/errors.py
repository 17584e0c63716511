"""Exit statuses and the one-line errors of the ``funcnet`` command."""

from __future__ import annotations

__all__ = ["EXIT_ERROR", "EXIT_NONFINITE", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "UsageError", "Terminated"]

EXIT_ERROR, EXIT_NONFINITE, EXIT_INTERRUPTED, EXIT_TERMINATED = 2, 3, 130, 143


class UsageError(ValueError):
    """A bad flag value; printed as one line."""


class Terminated(BaseException):
    """SIGTERM arrived; a BaseException like KeyboardInterrupt, so no ``except Exception`` swallows it.
    ``out_written``: it came after --out was written (otherwise --out is left as it was)."""

    out_written = False


def _one_line(e: BaseException) -> str:
    # Strict-restore errors list one problem per line; the command reports in one line.
    return " ".join(line.strip() for line in str(e).splitlines())
