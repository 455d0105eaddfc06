"""A record of a study's finished jobs on disk, so that an interrupted study resumes
(``minilm experiment ... --resume``) without running them again.

Every finished job is written at once, whole or not at all, to ``<out>/journal/<fingerprint>.json``:
its key and its ``Done`` (value and times). The fingerprint is a hash of the job's key and the
arguments it ran with (its config, checkpoint paths, lengths: plain data), so a job whose settings
changed runs again instead of being read back. ``meta.json`` holds the commit and the plan the
journal belongs to, and the inputs every job reads beside them (``bind``: the rates file, the
corpus): resuming with other code, another plan or other inputs is refused, since a report must
come from one code, one plan and one set of inputs (a job's fingerprint names the checkpoint it
scores by its path, not by what trained it).

An entry is plain data (JSON): numbers, strings, and lists, tuples, string-keyed mappings and
evaluation ``Result`` cells, each container tagged with what it was (``to_plain``), so that it
reads back as it was written and reading it can never run code. Paths under the study's
directory are stored relative to it (``$STUDY/...``) in the fingerprints and the values alike, so a
study moved or copied elsewhere resumes there. An entry that does not read back as such data
(damaged, or written by something else) is not trusted: its job runs again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
import re
from typing import Optional

from minilm.common import MinilmError, atomic_write
from minilm.evaluation.lengths import Result
from minilm.study.jobs import Done

META = "meta.json"
STUDY = "$STUDY"  # the study's directory, in a stored path
ENTRY = re.compile(r"^[0-9a-f]{32}\.(json|pkl)$")  # a job's entry (.pkl: the pickled journals of earlier versions)


class JournalError(MinilmError):
    """A journal that does not belong to this run; the message is one line for the user."""


def fingerprint(key: str, args: tuple) -> str:
    """A hash of a job's key and arguments (plain data; anything else by its repr), paths under the
    study's directory already relative to it (``Journal``)."""
    text = json.dumps([key, list(args)], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def to_plain(value, relative=lambda text: text):
    """``value`` as JSON data that ``from_plain`` reads back as it was: None, booleans, numbers and
    strings as themselves (strings through ``relative``), every container a one-key mapping that
    names it: {"list": [...]}, {"tuple": [...]}, {"dict": {...}} (string keys), {"Result": {...}}
    (an evaluation cell's fields). JournalError for anything else."""
    if value is None or isinstance(value, (bool, str)):
        return relative(value) if isinstance(value, str) else value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Result):
        return {"Result": to_plain(dataclasses.asdict(value), relative)["dict"]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [to_plain(item, relative) for item in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: to_plain(v, relative) for k, v in value.items()}}
    raise JournalError(f"a job's value holds a {type(value).__name__}, which the journal does not store as data")


def from_plain(data, absolute=lambda text: text):
    """What ``to_plain`` wrote, back (strings through ``absolute``); ValueError for anything else."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return absolute(data) if isinstance(data, str) else data
    if not (isinstance(data, dict) and len(data) == 1):
        raise ValueError(f"not journal data: {type(data).__name__}")
    ((tag, payload),) = data.items()
    if tag in ("list", "tuple") and isinstance(payload, list):
        items = [from_plain(item, absolute) for item in payload]
        return items if tag == "list" else tuple(items)
    if tag in ("dict", "Result") and isinstance(payload, dict):
        mapping = {k: from_plain(v, absolute) for k, v in payload.items()}
        return mapping if tag == "dict" else Result(**mapping)  # TypeError for fields it does not have
    raise ValueError(f"not journal data: a {tag!r} of {type(payload).__name__}")


class Journal:
    """The finished jobs under ``directory`` (a study's ``<out>/journal``); ``start`` ties it to a
    commit and a plan."""

    def __init__(self, directory: str):
        self.directory = directory
        self.root = os.path.dirname(os.path.normpath(directory)) or "."  # the study's directory, as given
        self.roots = sorted({self.root, os.path.abspath(self.root)}, key=len, reverse=True)  # either form

    def relative(self, text: str) -> str:
        """A path under the study's directory as ``$STUDY/...``; any other string as it is."""
        for root in self.roots:
            if text == root or text.startswith(root.rstrip(os.sep) + os.sep):
                return STUDY + text[len(root.rstrip(os.sep)) :]
        return text

    def absolute(self, text: str) -> str:
        """``relative``'s path back under this study's directory, where it is now."""
        if text == STUDY or text.startswith(STUDY + os.sep):
            return self.root.rstrip(os.sep) + text[len(STUDY) :]
        return text

    def _path(self, key: str, args: tuple) -> str:
        stored = to_plain(args, self.relative) if _plain(args) else args
        return os.path.join(self.directory, fingerprint(key, (stored,)) + ".json")

    def start(
        self, commit: str, plan: dict, resume: bool, precision: Optional[str] = None, command: Optional[str] = None
    ) -> int:
        """Begin a journal (``resume=False``: any earlier one is cleared) or continue one written
        by the same commit and plan, and in the same ``precision`` (the dtype the plan's runs train in on
        this machine: dtype auto is bf16 on a CPU with native bf16 units only, so a study resumed on
        another kind of CPU would mix precisions); returns which invocation of the study this is (1: the first).
        ``self.command`` is then the command that began it (``command`` at the first invocation), which a
        report records: a resumed invocation's own arguments (``--resume``) do not run the study from the start."""
        meta_path = os.path.join(self.directory, META)
        if resume:
            meta = self._meta(meta_path)
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
            if precision and meta.get("precision", precision) != precision:
                raise JournalError(
                    f"--resume: the journal's jobs trained in {meta['precision']}, this machine trains the plan in "
                    f"{precision}: resume on a machine like the first (lscpu), or start again with --overwrite"
                )
            meta["invocations"] += 1
            meta.setdefault("command", command)  # journals of earlier versions did not record it
        else:
            os.makedirs(self.directory, exist_ok=True)
            for name in os.listdir(self.directory):
                if ENTRY.match(name):
                    os.remove(os.path.join(self.directory, name))
            meta = {"commit": commit, "plan": plan, "invocations": 1, "precision": precision, "command": command}
            atomic_write(
                os.path.join(self.directory, ".gitignore"), "# the study's journal of finished jobs: not for git\n*\n"
            )
        atomic_write(meta_path, json.dumps(meta, indent=1))
        self.command = meta["command"]
        return meta["invocations"]

    def bind(self, name: str, value: str, what: str) -> None:
        """Record ``value`` of an input that every job depends on (``name``: "rates", the rates file's hash;
        "corpus", its fingerprint) in meta.json; a JournalError, naming ``what`` it is, where the journal
        (begun by ``start``) recorded another: its jobs would be read back beside jobs of other inputs.
        A journal of an earlier version that recorded none takes it now."""
        meta_path = os.path.join(self.directory, META)
        meta = self._meta(meta_path)
        inputs = meta.setdefault("inputs", {})
        if inputs.get(name, value) != value:
            raise JournalError(
                f"--resume: {what} is not the one the journal's jobs ran with: give the same, or start again "
                f"with --overwrite"
            )
        inputs[name] = value
        atomic_write(meta_path, json.dumps(meta, indent=1))

    def _meta(self, meta_path: str) -> dict:
        """The journal's meta.json, or JournalError in one line."""
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            raise JournalError(
                f"--resume: {self.directory!r} holds no journal of an earlier run (run without --resume)"
            ) from None
        count = meta.get("invocations", 1) if isinstance(meta, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise JournalError(
                f"--resume: {meta_path!r} is not a journal's meta.json (a mapping with a commit, a plan and "
                f"a count of invocations >= 1): start again with --overwrite"
            )
        return {**meta, "invocations": count}

    def read(self, key: str, args: tuple) -> Optional[Done]:
        """The ``Done`` of a job that finished with these arguments, or None (also for an entry that is
        not journal data: its job runs again)."""
        try:
            with open(self._path(key, args), encoding="utf-8") as f:
                entry = json.load(f)
            stored_key, value, started, ended, phase = (entry[k] for k in ("key", "value", "started", "ended", "phase"))
            done = Done(from_plain(value, self.absolute), float(started), float(ended), str(phase))
        except (OSError, ValueError, TypeError, KeyError, RecursionError):
            return None
        return done if stored_key == key and math.isfinite(done.started) and math.isfinite(done.ended) else None

    def record(self, key: str, args: tuple, done: Done) -> None:
        entry = {
            "key": key,
            "value": to_plain(done.value, self.relative),
            "started": done.started,
            "ended": done.ended,
            "phase": done.phase,
        }
        atomic_write(self._path(key, args), json.dumps(entry))


def _plain(args: tuple) -> bool:
    """Whether ``to_plain`` takes ``args`` (a job's arguments are plain data, but a caller's may not be)."""
    try:
        to_plain(args)
    except JournalError:
        return False
    return True
