"""Helpers every layer shares: the one error class users see, closest-name suggestions,
atomic writes, device and dtype resolution, autocast, peak memory, markdown tables, and the
YAML loader configs and plans are read with (YAML 1.2 floats, a key given twice refused).

This module imports nothing else from minilm, so any module may import it
(docs/design.md, "Layers").
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import errno
import io
import math
import os
import re
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

import numpy as np
import torch

try:
    import resource
except ImportError:  # Windows
    resource = None


class MinilmError(ValueError):
    """A problem the user can fix. The message is one line that names the bad value and what
    would be valid; every command line catches this class, prints ``error: <message>`` and
    exits with status 2. Each module subclasses it (ConfigError, CheckpointError, ...)."""


# --------------------------------------------------------------------------- names

ANSI_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours in some library messages


def first_sentence(text: str, fallback: str, limit: int = 200) -> str:
    """The first sentence of a library's message (colour codes removed), whole: never a text
    cut off mid-word; ``fallback`` when there is none or it is longer than ``limit``."""
    text = ANSI_CODES.sub("", text).strip()
    line = text.splitlines()[0] if text else ""
    sentence = re.split(r"(?<=[.!?])\s", line, maxsplit=1)[0].rstrip(".")
    return sentence if sentence and len(sentence) <= limit else fallback


def shown(value, limit: int = 60) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters: a long value (a number of 400
    digits, an expanded list) keeps its start and end and says how long it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-limit // 4 :]} ({len(text):,} characters)"


@dataclass(frozen=True)
class Range:
    """The numbers a setting takes: from ``low`` (above it where ``low_open``) to ``high`` (below
    it where ``high_open``), either bound left out by None; integers only where ``integer``; never
    a bool, NaN or an infinity; None too where ``optional``. ``str`` says it for a message, followed
    by ``note`` (what 0 means, another way to say it), or is ``text`` where that is given."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    optional: bool = False
    note: str = ""
    text: str = ""

    def holds(self, value) -> bool:
        if value is None:
            return self.optional
        whole = isinstance(value, int) and not isinstance(value, bool)
        number = whole or isinstance(value, float) and math.isfinite(value)
        return (
            number
            and (isinstance(value, int) or not self.integer)
            and (self.low is None or (value > self.low if self.low_open else value >= self.low))
            and (self.high is None or (value < self.high if self.high_open else value <= self.high))
        )

    def __str__(self) -> str:
        bounds = [(sign, v) for sign, v in self._bounds() if v is not None]
        shown = [f"{sign} {v:,}" if isinstance(v, int) else f"{sign} {v:g}" for sign, v in bounds]
        what = "an integer" if self.integer else "a number"
        if self.integer and len(shown) == 2 and not (self.low_open or self.high_open):  # '>= 1', '<= 9' -> 1 to 9
            shown = [f"from {shown[0][3:]} to {shown[1][3:]}"]
        return self.text or f"{what}{' ' + ' and '.join(shown) if shown else ''}{self.note}"

    def _bounds(self) -> tuple:
        return ((">" if self.low_open else ">=", self.low), ("<" if self.high_open else "<=", self.high))


def check_number(setting: str, value, valid: Range, error: type = None):
    """``value`` when ``valid`` holds it, else ``error`` (a MinilmError by default) in one line:
    '``setting``=VALUE is invalid: expected' what ``valid`` says. The one check of every numeric
    setting: the configs' fields (``minilm.config.option``), the schemes' options, generation's."""
    if not valid.holds(value):
        raise (error or MinilmError)(f"{setting}={shown(value)} is invalid: expected {valid}")
    return value


def suggest(name, valid: Iterable) -> str:
    """'did you mean X? valid: ...' for the closest valid names, else 'valid: ...'."""
    valid = sorted(str(v) for v in valid)
    close = difflib.get_close_matches(str(name), valid, n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(close)}? valid: {', '.join(valid)}"
    return f"valid: {', '.join(valid)}"


# --------------------------------------------------------------------------- files

LOW_DISK_BYTES = 1 << 20  # a write that fails with less free space than this failed for want of space


class WriteError(MinilmError):
    """A file minilm could not write (a full disk, no permission, ...); the message names the
    path and the reason. Whatever was there before stays whole."""

    def __init__(self, path: Union[str, Path], reason: str, advice: str = "what was there before is unchanged"):
        super().__init__(f"cannot write {str(path)!r}: {reason}; {advice}")
        self.path, self.reason, self.advice = str(path), reason, advice


def write_failure(path: Union[str, Path], exc: BaseException) -> Optional[WriteError]:
    """The one-line WriteError for a failed write to ``path``, or None when ``exc`` is not a
    failure to write (a bug keeps its traceback). Libraries report a full disk in their own
    ways (torch's zip writer: a RuntimeError about an 'unexpected pos'; safetensors: its own
    error class), so any error counts as a full disk when the disk has (almost) no space left."""
    if isinstance(exc, WriteError):
        return WriteError(path, exc.reason, exc.advice)  # named after the whole that was being written
    if isinstance(exc, MinilmError) or not isinstance(exc, Exception):
        return None
    directory = Path(path).parent
    try:
        free = shutil.disk_usage(directory if directory.exists() else Path.cwd()).free
    except OSError:
        free = None
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or (free is not None and free < LOW_DISK_BYTES):
        return WriteError(
            path,
            f"no space left on the device ({free if free is not None else 0:,} bytes free)",
            "free some space or choose another place; what was there before is unchanged",
        )
    if isinstance(exc, OSError):
        return WriteError(path, str(exc.strerror or exc))
    return None


def temporary_path(path: Union[str, Path]) -> Path:
    """A unique temporary name next to ``path``: ``.<name>.<pid>.<random>.tmp``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def remove_stale_temporaries(directory: Union[str, Path]) -> list:
    """Delete the temporary files and directories (``.*.tmp``) of writes whose process is gone: the pid in a
    ``temporary_path`` name is not running, or the name has none (an older naming). Returns
    the removed paths."""
    removed = []
    for path in Path(directory).glob(".*.tmp"):
        try:
            pid = int(path.name.split(".")[-3])
            if pid != os.getpid():
                os.kill(pid, 0)
            continue  # that process is still running
        except (ValueError, IndexError, ProcessLookupError):
            if path.is_dir() and not path.is_symlink():  # a staged directory (staged_directory) never completed
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(str(path))
        except PermissionError:
            continue
    return removed


def numbered(path: Union[str, Path], n: int) -> str:
    """``path`` with the number ``n`` before its suffix: ``eval.png`` -> ``eval.1.png``; a name
    without one (``notes``, ``.lock``) gets it at the end (``notes.1``)."""
    root, suffix = os.path.splitext(str(path))
    return f"{root}.{n}{suffix}"


def keep_aside(path: Union[str, Path]) -> Optional[str]:
    """Move an existing file aside as ``<stem>.1<suffix>`` (``eval.png`` -> ``eval.1.png``, or
    the next free number: ``.2``, ...; ``numbered``) and return that name; None when there is
    nothing at ``path``. The number is reserved first (an empty file created only if absent),
    then the file is renamed onto it in one step, so two processes setting files aside never
    take the same number, and whatever held ``path`` is kept."""
    path, n = str(path), 1
    while os.path.lexists(path):
        candidate = numbered(path, n)
        try:
            os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            n += 1
            continue
        try:
            os.rename(path, candidate)
        except FileNotFoundError:  # another process set it aside first
            os.unlink(candidate)
            return None
        except OSError:  # a directory cannot take a file's place: the reservation goes, the error stays
            os.unlink(candidate)
            raise
        return candidate
    return None


def output_path(path: Union[str, Path], say: Optional[Callable[[str], None]] = None, why: str = "") -> str:
    """The one rule for a file a command writes (a name the user gave, or a default): a file
    already at ``path`` (an earlier result, or the user's own) is set aside (``keep_aside``:
    ``eval.png`` -> ``eval.1.png``) and that is said in one line, ``kept the earlier NAME as
    NEW`` (and ``why``), through ``say`` (default: stderr); it is never replaced. Returns
    ``path``, which the writer then takes only while it is free, whole or not at all:
    ``atomic_write(keep=True)`` and the writers built on it (``write_csv``,
    ``figures.canvas.save_figure`` with ``keep=True``)."""
    kept = keep_aside(path)
    if kept:
        line = f"kept the earlier {os.path.basename(str(path))} as {kept}{why}"
        if say is None:
            print(line, file=sys.stderr, flush=True)
        else:
            say(line)
    return str(path)


def atomic_write(path: Union[str, Path], data: Union[bytes, str, np.ndarray, Callable], keep: bool = False) -> Path:
    """Write ``data`` to ``path`` so that a crash never leaves a half-written file there.

    The bytes go to a temporary file in the same directory, are fsynced, and the file is
    renamed over ``path`` (then the directory is fsynced too); with ``keep`` a file already at
    ``path`` (the user's, or another run's result) is set aside first (``keep_aside``), and the
    new one takes the name only while it is free, as one atomic step. ``data`` is bytes, text
    (UTF-8), a numpy array (raw, as ``tofile``) or a function that writes to the open
    binary file. On any failure the temporary file is removed and the old ``path`` stays; a
    failure to write (``write_failure``) becomes one WriteError naming ``path``.
    """
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "xb") as f:
            if callable(data):
                data(f)
            elif isinstance(data, np.ndarray):
                data.tofile(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if keep:
            publish(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException as exc:
        failure = write_failure(path, exc)  # judged before the partial file is removed
        if os.path.exists(tmp):
            os.unlink(tmp)
        if failure is not None:
            raise failure from None
        raise
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def publish(tmp: Union[str, Path], path: Union[str, Path]) -> None:
    """Give the finished file ``tmp`` the name ``path`` while that name is free (a hard link
    fails when it is taken: then what holds it is set aside, and the link tried again)."""
    while True:
        try:
            os.link(tmp, path)
        except FileExistsError:
            keep_aside(path)
            continue
        os.unlink(tmp)
        return


def write_csv(
    rows: Sequence[dict], path: Union[str, Path], fields: Optional[Sequence[str]] = None, keep: bool = False
) -> str:
    """``rows`` as CSV at ``path`` (the columns: ``fields``, else every key in order of first
    appearance), directories created, written whole or not at all (``atomic_write``; ``keep``:
    an earlier file there is set aside, not replaced); returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(fields or dict.fromkeys(k for row in rows for k in row)))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, text.getvalue(), keep=keep)
    return str(path)


@contextlib.contextmanager
def staged_directory(directory: Union[str, Path], *, overwrite: bool = False):
    """Write a whole directory at once: yields a new temporary directory beside ``directory``
    to fill; when the block ends well it takes ``directory``'s place (an old one is removed
    only with ``overwrite``, after the new one is complete), else it is removed and
    ``directory`` stays as it was. A non-empty ``directory`` is refused without
    ``overwrite``, also when it fills while this one is written (two writers racing for one
    name: the second fails); a failure to write is one WriteError naming ``directory``. Its
    files get the permissions of ordinary files (0666 less the umask), as its directories do."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise WriteError(directory, "it exists and is not a directory", "choose a new directory")
    if directory.is_dir() and any(directory.iterdir()) and not overwrite:
        raise WriteError(
            directory, "it exists and is not empty", "choose a new directory, or give --overwrite to replace it"
        )
    parent = directory.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = new_directory(parent, f".{directory.name}-", suffix=".tmp")
    except OSError as exc:
        raise write_failure(directory, exc) from None
    try:
        yield staging
        for path in staging.rglob("*"):  # ordinary permissions, whatever wrote the files (safetensors: 0600)
            if path.is_file() and not path.is_symlink():
                path.chmod(0o666 & ~_umask())
        old = None
        if (
            overwrite and directory.exists()
        ):  # else the rename below takes an empty one's place, and fails on a full one
            old = directory.with_name(f".{directory.name}-old-{secrets.token_hex(4)}.tmp")
            os.rename(directory, old)
        os.rename(staging, directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        failure = write_failure(directory, exc)
        shutil.rmtree(staging, ignore_errors=True)
        if failure is not None:
            raise failure from None
        raise


def new_directory(parent: Union[str, Path], prefix: str, suffix: str = "") -> Path:
    """A new, empty directory in ``parent`` with a random name, with the permissions of an
    ordinary one (``tempfile.mkdtemp`` makes it private)."""
    made = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
    made.chmod(0o777 & ~_umask())
    return made


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --------------------------------------------------------------------------- hardware

DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
DTYPES = ("auto", "float32", "bfloat16")  # what evaluation and generation compute in
TRAIN_DTYPES = (*DTYPES, "float16")  # training also takes float16, with a gradient scaler


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def resolve_device(name: str, *, setting: str = "device", local_rank: int = 0) -> torch.device:
    """``auto`` is CUDA (this process's ``local_rank``), then MPS, then the CPU; an explicit
    device must exist on this machine. ``setting`` names the option in error messages."""
    name = str(name)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    known = name in ("cpu", "cuda", "mps") or (name.startswith("cuda:") and name[5:].isdigit())
    if not known:
        raise MinilmError(f"{setting} {name!r} is unknown: valid: {', '.join(DEVICES)}")
    if (name.startswith("cuda") and not torch.cuda.is_available()) or (name == "mps" and not _mps_available()):
        raise MinilmError(f"{setting} {name!r} is not available on this machine: use auto or cpu")
    return torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)


def cpu_has_fast_bf16() -> bool:
    """True when this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX tiles)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def resolve_dtype(
    name: str, device: torch.device, *, setting: str = "dtype", valid: Sequence[str] = DTYPES
) -> torch.dtype:
    """The compute dtype for ``name`` (one of ``valid``): float32, bfloat16, float16 (training
    only: ``TRAIN_DTYPES``), or auto = bfloat16 on CUDA with bf16 support and on CPUs with native
    bf16 units, else float32 (emulated bf16 is far slower)."""
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if name not in valid:
        raise MinilmError(f"{setting} {name!r} is unknown: valid: {', '.join(valid)}")
    if name == "float16":  # for GPUs without bf16; training pairs it with a gradient scaler
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    return torch.float32


def autocast(device: torch.device, dtype: Optional[torch.dtype]):
    """Mixed precision in ``dtype`` on ``device``; nothing for float32 (or None)."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def peak_memory_mib(device: Union[str, torch.device] = "cpu") -> Optional[float]:
    """Peak CUDA memory allocated by torch on a CUDA device, else the process's peak RSS, in
    MiB (one decimal); None where it cannot be told."""
    if str(device).startswith("cuda"):
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    if resource is None:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(rss / 2**20 if sys.platform == "darwin" else rss / 2**10, 1)


def saved_tensor_bytes(forward: Callable[[], object], skip: Callable[[torch.Tensor], bool] = lambda t: False) -> tuple:
    """(bytes of the tensors autograd keeps for the backward pass while ``forward()`` runs, each
    storage counted once, none for which ``skip`` says True (the weights); what ``forward``
    returned): the activation memory of a training step. Works on the meta device too."""
    seen, total = set(), [0]

    def pack(tensor):
        key = tensor.untyped_storage()._cdata  # the storage itself, alive while autograd keeps the tensor
        if key not in seen and not skip(tensor):
            seen.add(key)
            total[0] += tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    return total[0], out


def peak_memory(device: Union[str, torch.device] = "cpu") -> str:
    """``peak_memory_mib`` as text that says what it measured."""
    mib = peak_memory_mib(device)
    if mib is None:
        return "n/a (no resource module)"
    what = "torch.cuda.max_memory_allocated" if str(device).startswith("cuda") else "peak RSS of the process"
    return f"{mib:.1f} MiB ({what})"


def available_memory(device: Union[str, torch.device] = "cpu") -> Optional[int]:
    """Bytes that can be allocated now: free CUDA memory, or the system's MemAvailable on Linux;
    None where it cannot be told."""
    if str(device).startswith("cuda"):
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# --------------------------------------------------------------------------- text


def markdown_table(header: Sequence[str], rows: Iterable[Sequence], align: str = "") -> str:
    """A markdown table; ``align`` has one letter per column, ``l`` (the default) or ``r``."""
    align = align.ljust(len(header), "l")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
