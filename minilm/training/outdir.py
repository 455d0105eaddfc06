"""What a training run owns in its out_dir, kept safe: one live run per out_dir (a lock that
dies with its process), no fresh run over another run's checkpoint, ``--overwrite`` replacing
only a minilm checkpoint (a ``ckpt.pt`` that is none, the user's own file, is set aside),
no run written into the directory of the model it starts from (``check_not_own_base``), the
directory proved writable before any work starts, what an earlier run left (its logs of every
logger, its snapshots) kept aside with a number when a fresh run starts (``set_aside_previous``)
instead of deleted or mixed with the new run's, and temporary files of saves that never finished
removed.

``claim(out_dir, resume=..., overwrite=...)`` does all of it around a run but the
``train.init_from`` check, which ``minilm.training.loop.train`` makes first; under DDP only
rank 0 claims.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from minilm.checkpoints import format as checkpoint
from minilm.common import MinilmError, keep_aside, numbered, output_path, remove_stale_temporaries, temporary_path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are then not protected from each other
    fcntl = None

LOCK_FILE = ".lock"


class OutDirError(MinilmError):
    """The out_dir cannot be used for this run; the message is one line for the user."""


def check_writable(directory: str, setting: str) -> None:
    """Create ``directory`` if needed and prove it writable (create and remove a file), or
    raise OutDirError naming ``setting``, the path and the reason."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = temporary_path(Path(directory) / ".write-test")
        with open(probe, "xb"):
            pass
        probe.unlink()
    except OSError as exc:
        raise OutDirError(f"{setting}={directory!r} is not a writable directory: {exc.strerror or exc}") from None


class OutDirLock:
    """An exclusive ``flock`` on ``<out_dir>/.lock`` holding the owner's process id. The kernel
    drops it when the process dies, so a lock left by a killed run is taken over at once."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, LOCK_FILE)
        self.file = None

    def __enter__(self) -> "OutDirLock":
        if fcntl is None:
            return self
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            owner = self.file.read().strip() or "unknown"
            self.file.close()
            self.file = None
            raise OutDirError(
                f"out_dir={os.path.dirname(self.path)!r} is in use by another run (process {owner}): "
                f"wait for it to finish, or choose another out_dir"
            ) from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"{os.getpid()}\n")
        self.file.flush()
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_UN)
            self.file.close()
            self.file = None


WRITTEN = {
    checkpoint.FILENAME: "file",
    "metrics.jsonl": "file",
    "metrics.csv": "file",
    checkpoint.SHARDED: "directory",
    "snapshots": "directory",
    "tensorboard": "directory",
    "wandb": "directory",
}  # what a run writes in out_dir


RESTARTED = tuple(
    name for name in WRITTEN if name not in (checkpoint.FILENAME, checkpoint.SHARDED)
)  # what a fresh run starts anew: every logger's files and the snapshots (--overwrite replaces the checkpoint)


def set_aside_previous(out_dir: str) -> list:
    """At a fresh run's start (after every check that could refuse it), keep what an earlier run (or
    the user) left under a name of ``RESTARTED`` aside with a number, whichever loggers are on now:
    ``metrics.jsonl`` as ``metrics.1.jsonl``, ``snapshots`` as ``snapshots.1`` (``.2``, ...; an
    empty directory stays), so that nothing is lost and the new run's files hold nothing of the old
    one's. Returns 'NAME as NEW' for each, in ``WRITTEN``'s order, for the one note that says so."""
    kept = []
    for name in RESTARTED:
        path = os.path.join(out_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            new = keep_directory_aside(path) if any(os.scandir(path)) else None
        else:
            new = keep_aside(path)
        if new:
            kept.append(f"{name} as {os.path.basename(new)}")
    return kept


def keep_directory_aside(path: str) -> str:
    """Move the directory ``path`` to the first free ``<path>.N`` (``common.numbered``) and return
    that name: the number is reserved by creating it empty (``mkdir`` fails on a taken name), and
    the directory takes the empty one's place in one rename."""
    n = 1
    while True:
        candidate = numbered(path, n)
        try:
            os.mkdir(candidate)
        except FileExistsError:
            n += 1
            continue
        try:
            os.rename(path, candidate)
        except OSError:
            os.rmdir(candidate)
            raise
        return candidate


def check_kinds(out_dir: str) -> None:
    """A name a run writes in ``out_dir`` that holds something of another kind (a directory where
    the run writes a file, ...) is refused before the run starts: the run would replace or fail
    on what someone else put there (``WRITTEN``)."""
    for name, kind in WRITTEN.items():
        path = os.path.join(out_dir, name)
        found = "directory" if os.path.isdir(path) else "file" if os.path.lexists(path) else None
        if found not in (None, kind):
            raise OutDirError(
                f"out_dir={out_dir!r} holds a {found} {name!r} where a run writes its {kind} of that "
                f"name: move it away, or choose another out_dir"
            )


def check_not_own_base(out_dir: str, init_from, resume: bool = False) -> None:
    """Refuse a run whose out_dir is ``init_from``'s directory (the directory itself, or the one
    holding the file): its checkpoints would take the place of the model it starts from
    (``--overwrite``), and a LoRA run would record itself as its own base, never to load again.
    A fresh run (not ``resume``) is refused too where ``init_from`` lies deeper in out_dir (one of its
    snapshots): the run keeps what an earlier run left there aside under another name
    (``set_aside_previous``), and its checkpoint would name a source that is no longer there.
    ``hf:NAME`` is no directory of the user's."""
    if not init_from or str(init_from).startswith("hf:"):
        return
    base = init_from if os.path.isdir(init_from) else os.path.dirname(os.path.abspath(init_from))
    real, own = os.path.realpath(base), os.path.realpath(out_dir)
    if real == own:
        raise OutDirError(
            f"out_dir={out_dir!r} is the directory of train.init_from={init_from!r}: the run's checkpoints "
            f"would take the place of the model it starts from; choose another out_dir"
        )
    if not resume and real.startswith(own + os.sep):
        raise OutDirError(
            f"train.init_from={init_from!r} lies inside out_dir={out_dir!r}, whose snapshots and logs a fresh run "
            f"keeps aside under other names: the run would lose the path of the model it starts from; copy it "
            f"out of out_dir, or choose another out_dir"
        )


def is_run_checkpoint(path: str) -> bool:
    """True when ``path`` is a minilm checkpoint (its format marker read, tensors memory-mapped,
    not loaded); False for anything else: the user's own file, another program's, a damaged one."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - whatever torch cannot read is no checkpoint of a run
        return False
    return isinstance(state, dict) and state.get("format") == checkpoint.FORMAT


@contextlib.contextmanager
def claim(out_dir: str, *, resume: bool, overwrite: bool, main: bool = True):
    """Hold ``out_dir`` for one run: writable, locked, and not another run's checkpoint unless
    ``resume`` (continue it) or ``overwrite`` (replace it) says so. ``overwrite`` replaces only
    a minilm checkpoint: a ``ckpt.pt`` that is none is set aside as ``ckpt.1.pt`` (``.2``, ...)
    and said so on stderr (``common.output_path``), never replaced."""
    if resume and overwrite:
        raise OutDirError("--resume continues the run in out_dir and --overwrite starts it over: give one of them")
    if not main:
        yield
        return
    created = not os.path.exists(out_dir)
    check_writable(out_dir, "out_dir")
    try:
        with OutDirLock(out_dir):
            existing = next(
                (
                    os.path.join(out_dir, name)
                    for name in (checkpoint.FILENAME, checkpoint.SHARDED)
                    if os.path.exists(os.path.join(out_dir, name))
                ),
                None,
            )
            if not resume and not overwrite and existing:
                if os.path.isfile(existing) and not is_run_checkpoint(existing):
                    raise OutDirError(
                        f"out_dir={out_dir!r} holds {existing}, which is no minilm checkpoint: --overwrite "
                        f"keeps it aside (ckpt.1.pt) and starts the run, or choose another out_dir"
                    )
                raise OutDirError(
                    f"out_dir={out_dir!r} already holds a checkpoint ({existing}): continue that run "
                    f"with --resume, replace it with --overwrite, or choose another out_dir"
                )
            check_kinds(out_dir)
            ckpt = os.path.join(out_dir, checkpoint.FILENAME)
            if overwrite and os.path.isfile(ckpt) and not is_run_checkpoint(ckpt):
                output_path(ckpt, why=": it is not a minilm checkpoint, so --overwrite does not replace it")
            remove_stale_temporaries(out_dir)  # saves of killed runs; no live one: the lock is ours
            yield
    except MinilmError:
        if created and set(os.listdir(out_dir)) <= {LOCK_FILE}:  # refused before it wrote anything: leave no trace
            Path(out_dir, LOCK_FILE).unlink(missing_ok=True)
            os.rmdir(out_dir)
        raise
