"""Where, when and with what code a study ran: the git commit (and whether the tree was
dirty), the machine, its CPU's vector extensions, the load, and the time its jobs ran."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from typing import Optional

import torch

from minilm.common import cpu_has_fast_bf16


def git_commit(repo: str, exclude: Optional[str] = None) -> str:
    """``git rev-parse HEAD`` of the repository, plus ' (dirty: ...)' when files differ from it
    (untracked ones included, except under ``exclude``: the experiment's own output), with a hash of
    the changes themselves (``changes_hash``): two different edits never read as the same code."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    skip = None if exclude is None else os.path.relpath(os.path.abspath(exclude), repo) + os.sep
    kept = [line for line in status if skip is None or not (line[3:].strip('"') + os.sep).startswith(skip)]
    if not kept:
        return head
    changed = [line[3:] for line in kept]
    untracked = [line[3:].strip('"') for line in kept if line.startswith("??")]
    return head + (
        f" (dirty: {len(changed)} uncommitted or untracked files, e.g. {changed[0]}; "
        f"changes {changes_hash(repo, untracked)})"
    )


def changes_hash(repo: str, untracked: list) -> str:
    """12 hex digits of a hash of ``git diff HEAD`` and the untracked files' names and contents."""
    digest = hashlib.sha256(
        subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=repo, capture_output=True, check=True).stdout
    )
    for name in sorted(untracked):
        digest.update(name.encode() + b"\0")
        try:
            with open(os.path.join(repo, name), "rb") as f:
                digest.update(f.read())
        except OSError:
            pass  # a directory or a file gone since: its name counts
    return digest.hexdigest()[:12]


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} logical CPUs "
        f"({torch.get_num_threads()} torch threads){gpu}; Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def load_average() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def cpu_flags() -> str:
    """The CPU's vector and matrix extensions that decide float32 / bf16 speed."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return (", ".join(shown) or "none of avx2/avx512/amx") + f"; torch sees native bf16: {cpu_has_fast_bf16()}"


def host_line() -> str:
    """This machine and the CPU extensions that decide its speed, as a report's Machine line gives them."""
    return f"{machine()}; CPU flags: {cpu_flags()}"


def busy_seconds(done: dict) -> float:
    """The time during which at least one job ran (the union of the jobs' intervals): the wall
    time of a study that ran in several invocations (``--resume``), without the gaps between them."""
    total, reach = 0.0, None
    for started, ended in sorted((d.started, d.ended) for d in done.values()):
        if reach is None or started > reach:
            total, reach = total + ended - started, ended
        elif ended > reach:
            total, reach = total + ended - reach, ended
    return total
