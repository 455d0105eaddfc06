"""The command-line home: everything that parses arguments, reads stdin or prints for a user.

The ``minilm <command>`` entry (also ``python -m minilm <command>``) dispatches to the modules
here (``minilm/__main__.py``); ``train.py``, ``generate.py`` and ``evaluate.py`` at the top of
a clone call the same ``main`` functions. The library below never prints for a command line.

Every command ends the same way, through ``run_command``: a ``MinilmError`` is one line
``error: <message>`` on stderr with exit status 2, never a traceback.

Every verb that takes settings reads them one way, as ``train`` always has: ``section.key=value``
arguments anywhere among the others (``model.position.scaling.type=yarn``, ``data.dir=x``), values
parsed as YAML by ``minilm.configfile.apply_overrides`` (``Parser.take_settings``, ``split_settings``).
The old spellings (``--set KEY=VALUE``, ``evaluate --position.KEY=VALUE``) still work for one release,
each with a one-line note on stderr naming the new one.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
import typing
from typing import Callable, Optional

from minilm.checkpoints.loading import CHANGEABLE
from minilm.common import MinilmError
from minilm.config import Config

SECTIONS = tuple(name for name, hint in typing.get_type_hints(Config).items() if dataclasses.is_dataclass(hint))
# what the settings of a loaded checkpoint may change (minilm.checkpoints.loading.CHANGEABLE), as help texts say it
LOADED = ", ".join(k + "*" if k.endswith(".") else k for k in CHANGEABLE)


def one_line(message: str, limit: int = 2000) -> str:
    """An error message as one line of at most ``limit`` characters, whatever value it quotes."""
    line = " ".join(message.split("\n"))
    return line if len(line) <= limit else f"{line[: limit - 40]}... ({len(line):,} characters)"


def seed(text: str) -> int:
    """An argparse type: a seed, an integer from 0 to 2**63 - 1 (what torch's generators take)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a seed, an integer from 0 to 2**63 - 1")
    return value


MAX_NUMBER = 2**40  # a length or multiple past any text a machine holds


def number_list(text: str, kind, option: str, zero: bool = False) -> list:
    """An argparse type's body: ``text`` as comma-separated finite numbers of ``kind`` (int or float), each
    > 0 (>= 0 with ``zero``: depths), at most ``MAX_NUMBER`` and each once. An empty item (``32,,64``),
    nan, inf or a repeat (one row twice in a table) raises ``argparse.ArgumentTypeError`` naming ``option``.
    """
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not (0 <= v if zero else 0 < v) or not v <= MAX_NUMBER for v in values):  # nan fails
        raise argparse.ArgumentTypeError(
            f"{option}={text!r} is invalid: expected comma-separated numbers {'>=' if zero else '>'} 0 and "
            f"<= {MAX_NUMBER:,}, none empty"
        )
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(
            f"{option}={text!r} repeats {', '.join(str(v) if kind is int else f'{v:g}' for v in repeated)}: give "
            f"each number once"
        )
    return values


def add_probe_grid(parser: argparse.ArgumentParser, depths, what: str) -> None:
    """--lengths and --depths of a grid of probes (``passkey eval``, ``longeval``): prompt lengths in
    tokens (default 1x, 2x, 4x each block_size) and where ``what`` sits, fractions of the filler."""
    parser.add_argument(
        "--lengths",
        type=lambda s: number_list(s, int, "--lengths"),
        help="prompt lengths in tokens (default: 1x,2x,4x block_size)",
    )
    parser.add_argument(
        "--depths",
        type=lambda s: number_list(s, float, "--depths", zero=True),
        default=",".join(f"{d:g}" for d in depths),
        help=f"where {what} sits in the filler, comma-separated fractions (0: the start, 1: the end; "
        "default %(default)s)",
    )


def is_setting(token: str, sections=SECTIONS) -> bool:
    """Whether a command-line argument is a setting: a dotted key of a config section, then ``=``
    (``model.position.scaling.type=yarn``, ``data.dir=x``). Anything else (a path, a prompt, a
    scheme's name) is not, whatever it holds."""
    pattern = rf"(?:{'|'.join(map(re.escape, sections))})(?:\.[A-Za-z_][\w-]*)+="
    return re.match(pattern, token) is not None


def written(setting: str) -> str:
    """A setting as a shell takes it back: ``model.position.scaling='{type: yarn}'``."""
    key, _, value = setting.partition("=")
    return f"{key}={shlex.quote(value)}" if value else setting


def note_old(old: str, new: str) -> None:
    """The one line an old spelling earns on stderr: what it is now written as (it works for one release)."""
    print(f"note: {old} is now written {new}", file=sys.stderr)


def split_settings(parser: argparse.ArgumentParser, argv, old_position: bool = False) -> tuple:
    """(the other arguments, the settings) of ``argv``: every ``section.key=value`` argument (``is_setting``)
    is a setting, wherever it stands, except the value of an option that takes one and anything after
    ``--``. The old spellings become settings with a note (``note_old``): ``--set KEY=VALUE`` (or
    ``--set=KEY=VALUE``), and with ``old_position`` ``--position.KEY=VALUE`` (``model.position.KEY=VALUE``)."""
    rest, settings, tokens = [], [], iter(argv)
    for token in tokens:
        name, eq, value = token.partition("=")
        if token == "--":
            rest += [token, *tokens]
        elif name == "--set":
            value = value if eq else next(tokens, None)
            if value is None:
                parser.error("argument --set: expected one argument, KEY=VALUE (now written KEY=VALUE alone)")
            note_old(f"--set {written(value)}", written(value))
            settings.append(value)
        elif old_position and name.startswith("--position.") and eq:
            settings.append(f"model.{token[2:]}")
            note_old(written(token), written(settings[-1]))
        elif token.startswith("-"):
            rest.append(token)
            action = parser._option_string_actions.get(name)
            if action is not None and not eq and action.nargs in (None, 1):  # its value is no setting
                following = next(tokens, None)
                rest += [] if following is None else [following]
        else:
            (settings if is_setting(token) else rest).append(token)
    return rest, settings


SHOWN_SETTINGS = "[section.key=value ...]"  # what a usage line adds for a verb that takes settings


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line ``error: ...`` with exit status 2, and every
    verb reads its arguments one way: paths and ``key=value`` overrides anywhere among the
    options (``parse_intermixed_args``; a verb with sub-commands parses each as usual). A verb that
    takes settings says so with ``take_settings``: they come back as ``args.overrides``."""

    takes_settings = False  # section.key=value arguments (split_settings), set by take_settings
    old_position = False  # evaluate's old --position.KEY=VALUE

    def take_settings(self, applies: str, example: str, *, old_position: bool = False) -> None:
        """Take ``section.key=value`` arguments anywhere (``split_settings``) into ``args.overrides``, in
        the order given (the last of a key wins); ``applies`` says what they change, ``example`` shows one."""
        self.takes_settings, self.old_position = True, old_position
        self.add_argument_group(
            "settings",
            f"section.key=value arguments anywhere among the others, values parsed as YAML: {applies}; "
            f"e.g. {example} (--set KEY=VALUE is the old spelling, accepted for one release)",
        )

    def error(self, message):
        self.exit(2, f"error: {message}\n")

    def format_usage(self):
        return self._usage_with_settings(super().format_usage())

    def format_help(self):
        return self._usage_with_settings(super().format_help())

    def _usage_with_settings(self, text: str) -> str:
        """``text`` with ``[section.key=value ...]`` at the end of its usage lines when the verb takes settings."""
        usage, gap, rest = text.partition("\n\n")
        if not self.takes_settings or SHOWN_SETTINGS in usage:  # parse_intermixed_args keeps the usage it formats
            return text
        return f"{usage.rstrip()} {SHOWN_SETTINGS}{gap or chr(10)}{rest}"

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        taker, settings = self.settings_parser(args), []
        if taker is not None:
            args, settings = split_settings(taker, args, taker.old_position)
        if self._subparsers is not None:  # intermixed parsing cannot hand arguments to a sub-command
            parsed = super().parse_args(args, namespace)
        else:
            parsed = self.parse_intermixed_args(args, namespace)
        if taker is not None:
            parsed.overrides = settings
        return parsed

    def settings_parser(self, args) -> Optional["Parser"]:
        """The parser whose settings ``args`` may hold: this one, or the sub-command's that ``args`` names."""
        if self._subparsers is None:
            return self if self.takes_settings else None
        commands = self._subparsers._group_actions[0].choices
        named = next((commands.get(a) for a in args if not a.startswith("-")), None)
        return named if getattr(named, "takes_settings", False) else None


def run_command(body: Callable[[], Optional[int]], *, on_interrupt: Optional[str] = None) -> int:
    """Run a command's ``body`` and turn what ends it into an exit status: its own return value
    (None is 0); 2 with one ``error:`` line for a MinilmError or an OSError (naming the path);
    130 for Ctrl-C (with ``on_interrupt`` as an error line, when given); 0 when stdout was
    closed early (``| head``)."""
    try:
        return body() or 0
    except MinilmError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. head, which stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file system problem found late: say which path and why, in one line
        where = f"{exc.filename!r}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if on_interrupt:
            print(f"error: {on_interrupt}", file=sys.stderr)
        return 130
