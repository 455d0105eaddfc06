"""A record of a study's finished jobs on disk, so that an interrupted study resumes
(``minilm experiment ... --resume``) without running them again.

Every finished job is written at once, whole or not at all, to ``<out>/journal/<fingerprint>.pkl``:
its key and its ``Done`` (value and times). The fingerprint is a hash of the job's key and the
arguments it ran with (its config, checkpoint paths, lengths: plain data), so a job whose settings
changed runs again instead of being read back. ``meta.json`` holds the commit and the plan the
journal belongs to: resuming with other code or another plan is refused, since a report must come
from one code and one plan. The values are pickled: a journal is read back only by the study that
wrote it, from its own output directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from typing import Optional

from minilm.common import MinilmError, atomic_write

META = "meta.json"


class JournalError(MinilmError):
    """A journal that does not belong to this run; the message is one line for the user."""


def fingerprint(key: str, args: tuple) -> str:
    """A hash of a job's key and arguments (plain data; anything else by its repr)."""
    text = json.dumps([key, list(args)], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Journal:
    """The finished jobs under ``directory``; ``start`` ties it to a commit and a plan."""

    def __init__(self, directory: str):
        self.directory = directory

    def _path(self, key: str, args: tuple) -> str:
        return os.path.join(self.directory, fingerprint(key, args) + ".pkl")

    def start(self, commit: str, plan: dict, resume: bool) -> int:
        """Begin a journal (``resume=False``: any earlier one is cleared) or continue one written
        by the same commit and plan; returns which invocation of the study this is (1: the first)."""
        meta_path = os.path.join(self.directory, META)
        if resume:
            try:
                with open(meta_path, encoding="utf-8") as f:
                    meta = json.load(f)
            except (OSError, ValueError):
                raise JournalError(
                    f"--resume: {self.directory!r} holds no journal of an earlier run (run without --resume)"
                ) from None
            if meta.get("commit") != commit:
                raise JournalError(
                    f"--resume: the journal's jobs ran at commit {meta.get('commit')!r}, the code is "
                    f"now {commit!r}: check that commit out, or start again with --overwrite"
                )
            if meta.get("plan") != json.loads(json.dumps(plan)):
                raise JournalError(
                    "--resume: the plan differs from the journal's (seeds, overrides or --quick): "
                    "give the same arguments, or start again with --overwrite"
                )
            meta["invocations"] = meta.get("invocations", 1) + 1
        else:
            os.makedirs(self.directory, exist_ok=True)
            for name in os.listdir(self.directory):
                if name.endswith(".pkl"):
                    os.remove(os.path.join(self.directory, name))
            meta = {"commit": commit, "plan": plan, "invocations": 1}
            atomic_write(
                os.path.join(self.directory, ".gitignore"), "# the study's journal of finished jobs: not for git\n*\n"
            )
        atomic_write(meta_path, json.dumps(meta, indent=1))
        return meta["invocations"]

    def read(self, key: str, args: tuple) -> Optional[object]:
        """The ``Done`` of a job that finished with these arguments, or None."""
        try:
            with open(self._path(key, args), "rb") as f:
                stored_key, done = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            return None
        return done if stored_key == key else None

    def record(self, key: str, args: tuple, done) -> None:
        atomic_write(self._path(key, args), pickle.dumps((key, done)))
