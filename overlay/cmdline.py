"""The command line's parser, made from a table of commands (overlay/cli.py's ``COMMANDS``).

Options before the command. The options every command of the series takes (overlay/cli.py's
``COMMON``: --series, --upstream, --lock, --cache-dir, --json, -q) may also stand before the
command: `apply.py --upstream 0.34.0 fuzz --help`, `apply.py --json check`. Given in both places,
the one after the command wins: the command's parser has no defaults for them
(``_without_default``), so it sets only what was given after the command, over what the
top-level parser set from before it, and ``parse`` fills in the defaults last. One given before a
command that does not take it (`--json` before `test`, which of these takes --upstream alone) is
refused, as is an option before the command that the tool does not know: only what stands after
`test` and `fuzz` goes on to pytest and the fuzzer (``passed_on``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from overlay import __version__ as OVERLAY_VERSION


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    name: str
    help: str  # one line for --help's command list (and overlay/cli.py's docstring)
    run: Callable[[argparse.Namespace], int]
    description: str = ""
    options: tuple[Arg, ...] = ()
    one_of: tuple[Arg, ...] = ()  # exactly one of these is required
    common: bool = True  # takes the options every command of the series takes (--series, --json, ...)
    # Where arguments the command does not know go ("pytest"; none: they are an error).
    passes_on: str = ""
    own_help: bool = True  # False: --help goes on too (the fuzzer's own)


class CommandParser(argparse.ArgumentParser):
    """One command's parser. What it does not know goes to ``passed_on`` where the command passes
    arguments on, and is an error here otherwise; either way the top-level parser gets none of it
    back, so whatever that one cannot place stood before the command."""

    passes_on = ""
    defaults: dict[str, Any]  # dest -> default of its options that may also stand before the command

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace, extra = super().parse_known_args(args, namespace)
        if extra and not self.passes_on:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        namespace.passed_on = extra
        return namespace, []


def parse(argv: list[str], commands: Sequence[Command], common: Sequence[Arg], *, description: str,
          epilog: str) -> tuple[Command, argparse.Namespace]:  # fmt: skip
    """The command ``argv`` names and its arguments, with the options before the command settled."""
    top = argparse.ArgumentParser(prog="apply.py", description=description, epilog=epilog,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    top.add_argument("--version", action="version", version=f"vllm-overlay {OVERLAY_VERSION}")
    before = top.add_argument_group(
        "options before the command",
        "Every command but test and fuzz takes these (those two: --upstream alone),\n"
        "here or after the command; given in both places, the one after it wins.",
    )
    flags = {}  # dest -> its flags, of the options that may stand before the command
    for a in common:
        action = before.add_argument(*a.flags, **a.options)
        _without_default(action)
        flags[action.dest] = "/".join(action.option_strings)
    sub = top.add_subparsers(dest="command", required=True, metavar="command", help="one of those listed below",
                             parser_class=CommandParser)  # fmt: skip
    parsers = {c.name: _add_command(sub, c, common, flags) for c in commands}
    args = top.parse_args(argv)  # the command's parser has taken everything after the command
    command = next(c for c in commands if c.name == args.command)
    _settle_options_before(top, parsers[command.name], args, flags)
    return command, args


def _add_command(sub: argparse._SubParsersAction, command: Command, common: Sequence[Arg],
                 flags: dict[str, str]) -> CommandParser:  # fmt: skip
    usage = f"apply.py {command.name} [options] [{command.passes_on} arguments]" if command.passes_on else None
    c = sub.add_parser(command.name, description=command.description or command.help, usage=usage,
                       add_help=command.own_help, allow_abbrev=not command.passes_on)  # fmt: skip
    c.passes_on = command.passes_on
    c.defaults = {}
    for a in (*(common if command.common else ()), *command.options):
        action = c.add_argument(*a.flags, **a.options)
        if action.dest in flags:
            c.defaults[action.dest] = _without_default(action)
    if command.one_of:
        group = c.add_mutually_exclusive_group(required=True)
        for a in command.one_of:
            group.add_argument(*a.flags, **a.options)
    return c


def _without_default(action: argparse.Action) -> Any:
    """Take ``action``'s default away and return it: parsing then sets its dest only where the
    option is given, so a command's parser cannot overwrite with its default what was given
    before the command. The help's %(default)s is written out first: argparse shows no default
    it was told to suppress."""
    default = action.default
    if action.help:
        action.help = action.help.replace("%(default)s", str(default))
    action.default = argparse.SUPPRESS
    return default


def _settle_options_before(top: argparse.ArgumentParser, command: CommandParser, args: argparse.Namespace,
                           flags: dict[str, str]) -> None:  # fmt: skip
    """Refuse an option given before a command that does not take it; give each option of the
    command's that was given nowhere its default."""
    refused = [flag for dest, flag in flags.items() if hasattr(args, dest) and dest not in command.defaults]
    if refused:
        top.error(f"{args.command} does not take {', '.join(refused)} (given before it)")
    for dest, default in command.defaults.items():
        if not hasattr(args, dest):
            setattr(args, dest, default)
