"""The command-line home: everything that parses arguments, reads stdin or prints for a user.

The ``minilm <command>`` entry (also ``python -m minilm <command>``) dispatches to the modules
here (``minilm/__main__.py``); ``train.py``, ``generate.py`` and ``evaluate.py`` at the top of
a clone call the same ``main`` functions. The library below never prints for a command line.

Every command ends the same way, through ``run_command``: a ``MinilmError`` is one line
``error: <message>`` on stderr with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional

from minilm.common import MinilmError


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


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line ``error: ...`` with exit status 2, and every
    verb reads its arguments one way: paths and ``key=value`` overrides anywhere among the
    options (``parse_intermixed_args``; a verb with sub-commands parses each as usual)."""

    def error(self, message):
        self.exit(2, f"error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        if self._subparsers is not None:  # intermixed parsing cannot hand arguments to a sub-command
            return super().parse_args(args, namespace)
        return self.parse_intermixed_args(args, namespace)


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
