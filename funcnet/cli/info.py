"""``funcnet info``: both framework stacks on this machine."""

from __future__ import annotations


def info_command(args) -> None:
    from funcnet import info

    info.print_stacks()
