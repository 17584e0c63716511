"""``funcnet info``: both framework stacks on this machine."""

from __future__ import annotations


def info_command(args) -> None:
    """``funcnet info``: print the JAX and torch stacks of this machine."""
    from funcnet import info

    info.print_stacks()
