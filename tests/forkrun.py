"""Command lines run as fresh processes without paying for ``import torch`` each time.

``ForkRunner`` starts one Python process that imports torch and minilm's command modules once and
runs no tensor operation (so no thread pool exists yet); each ``run`` forks it, and the child
runs the command as ``python ARGV...`` would (``train.py``, ``-m minilm ...``), in its own working
directory and environment, with stdin, stdout and stderr of its own, and exits with the command's
status. Only the start differs from a fresh interpreter: a child is still a new process, so a
command's state, signals and files are its own. An uncaught exception prints its traceback and
exits 1, as Python does."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Sequence

from tests.conftest import REPO

SERVER = r"""
import json, os, runpy, signal, sys, time, traceback
import importlib, pkgutil
import torch  # noqa: F401  (the cost this saves)
import minilm.cli
for module in pkgutil.iter_modules(minilm.cli.__path__):  # every command's imports (not minilm.__main__ itself)
    importlib.import_module(f"minilm.cli.{module.name}")
for name in json.loads(sys.argv[1]):  # the optional extras' imports, where they are installed
    try:
        importlib.import_module(name)
    except ImportError:
        pass


def child(request):
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stdin, out, err = request["files"]
    for path, target, flags in ((stdin, 0, os.O_RDONLY), (out, 1, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (err, 2, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        os.dup2(os.open(path, flags, 0o600), target)
    sys.stdin, sys.stdout, sys.stderr = (open(fd, mode, closefd=False) for fd, mode in ((0, "r"), (1, "w"), (2, "w")))
    argv, code = request["argv"], 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = child(request)
        finally:
            os._exit(code)
    deadline = time.monotonic() + request["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class ForkRunner:
    """One forking server; ``run`` is ``subprocess.run([python, *argv], capture_output=True, ...)`` with
    a faster start (argv: a script and its arguments, ``-m MODULE ...`` or ``-c CODE ...``). ``preload``:
    modules the server imports as well where they are installed (e.g. transformers, for the commands that
    read or write its models)."""

    def __init__(self, scratch: str, env: dict, preload: Sequence[str] = ()):
        self.scratch, self.lock, self.count = scratch, threading.Lock(), 0
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVER, json.dumps(list(preload))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, argv: Sequence[str], cwd: str, env: dict, input=None, timeout: float = 300, text: bool = False):
        """The finished command: returncode, and stdout and stderr as bytes (``text``: as str). The caller
        holds ``self.lock`` (one command at a time per server: ``run_python`` picks a free one)."""
        if isinstance(input, str):
            input = input.encode()
        self.count += 1
        base = os.path.join(self.scratch, f"fork-{os.getpid()}-{id(self)}-{self.count}")
        files = [base + ".in", base + ".out", base + ".err"]
        with open(files[0], "wb") as f:
            f.write(input or b"")
        argv = [os.fsdecode(a) for a in argv]  # bytes as a process gets them (surrogate escapes)
        request = {"argv": argv, "cwd": str(cwd), "env": dict(env), "files": files, "timeout": timeout}
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        reply = json.loads(self.server.stdout.readline())
        out, err = (open(p, "rb").read() for p in files[1:])
        for p in files:
            os.remove(p)
        if text:
            out, err = out.decode(), err.decode()
        return subprocess.CompletedProcess([sys.executable, *argv], reply["returncode"], out, err)

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=60)


EXTRAS = ("transformers", "peft", "minilm.hf.reading", "minilm.hf.families")  # what the hf commands read
_servers: list = []  # this process's servers: one more is started whenever all are busy (commands at once)
_servers_lock = threading.Lock()


def run_python(argv, cwd=REPO, env=None, input=None, timeout: float = 300, text: bool = True):
    """``subprocess.run([sys.executable, *argv], capture_output=True, ...)`` as a fork of one of this
    process's servers (started as needed with the optional extras imported, closed at exit), so a command
    starts in a fraction of a second instead of seconds; commands from several threads run at once.
    ``env`` None: this process's environment. A test of a fresh interpreter's own start (what it imports,
    its memory) or of signals sent to a running command starts a real one instead."""
    with _servers_lock:
        runner = next((r for r in _servers if r.lock.acquire(blocking=False)), None)
        if runner is None:
            if not _servers:
                atexit.register(_close_servers)
            runner = ForkRunner(tempfile.mkdtemp(prefix="forkrun-"), {**os.environ, "PYTHONPATH": REPO}, EXTRAS)
            runner.lock.acquire()
            _servers.append(runner)
    try:
        env = dict(os.environ if env is None else env)
        return runner.run(argv, cwd, env, input, timeout, text)
    finally:
        runner.lock.release()


def _close_servers() -> None:
    for runner in _servers:
        runner.close()
        shutil.rmtree(runner.scratch, ignore_errors=True)
