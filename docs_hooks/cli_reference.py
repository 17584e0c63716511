"""The command line's reference page, generated from its argparse parsers.

``funcnet`` dispatches some subcommands (``memory``, ``port``) to a module that builds its own
parser; the top-level parser lists them with a stub. So each subcommand's parser is the one
that ``funcnet.cli.main([name, "--help"])`` would parse with: ``parser_of`` runs ``main`` with
``ArgumentParser.parse_args`` replaced by a catch of the parser it is called on, so nothing
else of the command runs. Every flag is listed with its default and its help (``%(default)s``
expanded, as ``--help`` prints it), grouped as ``--help`` groups them.
"""

from __future__ import annotations

import argparse
import html
from unittest import mock

__all__ = ["cli_page", "parser_of", "subcommands"]


class _Caught(BaseException):  # not an Exception: the command's own error handling lets it through
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def _catch(self, *args, **kwargs):
    raise _Caught(self)


def parser_of(name: str) -> argparse.ArgumentParser:
    """The parser that ``funcnet NAME ...`` parses its flags with."""
    from funcnet.cli import build_parser, main

    with mock.patch.object(argparse.ArgumentParser, "parse_args", _catch):
        try:
            main([name, "--help"])
        except _Caught as caught:
            parser = caught.parser
        else:
            raise RuntimeError(f"funcnet {name} parsed no flags")
    if parser.prog == build_parser().prog:  # parsed by the top-level parser: its subparser
        return _subparsers(parser)[name]
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def subcommands() -> list[tuple[str, str, argparse.ArgumentParser]]:
    """``(name, one-line help, parser)`` for each subcommand, in ``funcnet --help``'s order."""
    from funcnet.cli import build_parser

    top = build_parser()
    helps = {a.dest: a.help for sub in top._actions if isinstance(sub, argparse._SubParsersAction)
             for a in sub._choices_actions}
    return [(name, helps.get(name, ""), parser_of(name)) for name in _subparsers(top)]


_PLAIN_GROUPS = ("positional arguments", "options", "optional arguments")


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if action.default is False else "on"
    if action.default is None or action.default is argparse.SUPPRESS:
        return "none" if not action.required else "required"
    if isinstance(action.default, str) and not action.default:
        return '""'
    return f"<code>{html.escape(str(action.default))}</code>"


def _flag(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return "<br>".join(f"<code>{html.escape(part)}</code>"
                       for part in formatter._format_action_invocation(action).split(", "))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    if action.choices and action.metavar is not None:  # else the flag's column shows {a,b,c}
        text += f" (one of: {', '.join(map(str, action.choices))})"
    return html.escape(text.strip())


def _table(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> str:
    rows = "".join(f"<tr><td>{_flag(parser, a)}</td><td>{_default(a)}</td><td>{_help(parser, a)}</td></tr>"
                   for a in actions)
    return f"<table><thead><tr><th>flag</th><th>default</th><th>help</th></tr></thead><tbody>{rows}</tbody></table>"


def cli_page() -> str:
    """The Markdown of the command line's reference page."""
    out = ["# Command line", "",
           ("`funcnet` (installed with the package; `python -m funcnet.cli` runs the same) has these subcommands. "
           "This page is generated from their argparse parsers when the site is built, so every flag, its default "
           "and its help are what `funcnet SUBCOMMAND --help` prints."), ""]
    for name, summary, parser in subcommands():
        out += [f"## funcnet {name}", ""]
        about = parser.description or (summary[:1].upper() + summary[1:] + "." if summary else "")
        if about:  # its own description where it has one, else the line funcnet --help shows for it
            out += [html.escape(about), ""]
        out += ["```text", parser.format_usage().strip(), "```", ""]
        plain, named = [], []  # argparse's own groups share one table; each named group gets its own
        for group in parser._action_groups:
            actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
            if group.title in _PLAIN_GROUPS:
                plain += actions
            elif actions:
                named.append((group, actions))
        out += [_table(parser, plain), ""]
        for group, actions in named:
            out += [f"### {html.escape(group.title)}", ""]
            if group.description:
                out += [html.escape(group.description), ""]
            out += [_table(parser, actions), ""]
        if parser.epilog:
            out += [html.escape(parser.epilog[0].upper() + parser.epilog[1:]) + ".", ""]
    return "\n".join(out)
