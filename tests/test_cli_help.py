"""Every flag of every ``funcnet`` command (and of ``python -m comparisons``) has a help text, and
that text states the flag's default, as ``--help`` prints it."""

import argparse

import comparisons.__main__ as runner
from funcnet.cli import memory, port
from funcnet.cli.parser import build_parser

# A flag that only switches something on needs no stated default: off is what leaving it out means.
_SWITCHES = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
             argparse._CountAction, argparse._VersionAction)


def _parsers():
    top = build_parser()
    found = [("funcnet", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            # memory and port parse their own flags: their own parsers, not the listing stubs
            found += [(f"funcnet {name}", sub) for name, sub in action.choices.items() if name not in ("memory", "port")]
    return found + [("funcnet memory", memory.build_parser()), ("funcnet port", port.build_parser()),
                    ("python -m comparisons", runner.build_parser())]


def _problems(prog, parser):
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help or action.help == argparse.SUPPRESS:
            yield f"{prog} {name}: no help text"
            continue
        shown = formatter._expand_help(action)  # what --help prints, %(default)s filled in
        if isinstance(action, _SWITCHES) or action.required or (not action.option_strings and action.nargs is None):
            continue
        if "default" not in shown and "required" not in shown:
            yield f"{prog} {name}: help {shown!r} states no default"
        elif action.default is not None and str(action.default) not in shown:
            yield f"{prog} {name}: help {shown!r} does not name its default {action.default!r}"


def test_every_flag_has_help_that_states_its_default():
    parsers = _parsers()
    assert {prog for prog, _ in parsers} == {"funcnet", "funcnet train", "funcnet sample", "funcnet info",
                                             "funcnet memory", "funcnet port", "python -m comparisons"}
    assert sum(len(p._actions) for _, p in parsers) > 70  # the walk reached the flags
    problems = [problem for prog, parser in parsers for problem in _problems(prog, parser)]
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_flag_without_help_or_default():
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--a", type=int, default=3)
    parser.add_argument("--b", type=int, default=3, help="a number")
    parser.add_argument("--c", default=None, help="a path")
    parser.add_argument("--d", type=int, default=3, help="a number (default %(default)s)")
    parser.add_argument("--e", action="store_true", help="a switch")
    parser.add_argument("--f", type=int, default=3, help="a number (default 4)")
    assert list(_problems("x", parser)) == ["x --a: no help text", "x --b: help 'a number' states no default",
                                           "x --c: help 'a path' states no default",
                                           "x --f: help 'a number (default 4)' does not name its default 3"]
