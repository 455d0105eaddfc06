"""Command lines run as fresh processes without paying for ``import torch`` each time.

``ForkRunner`` starts one Python process that imports torch and minilm's command modules once and
runs no tensor operation (so no thread pool exists yet); each ``run`` forks it, and the child
runs the command as ``python ARGV...`` would (``train.py``, ``-m minilm ...``), in its own working
directory and environment, with stdin, stdout and stderr of its own, and exits with the command's
status. Only the start differs from a fresh interpreter: a child is still a new process, so a
command's state, signals and files are its own. An uncaught exception prints its traceback and
exits 1, as Python does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Optional, Sequence

SERVER = r"""
import json, os, runpy, signal, sys, time, traceback
import importlib, pkgutil
import torch  # noqa: F401  (the cost this saves)
import minilm.cli
for module in pkgutil.iter_modules(minilm.cli.__path__):  # every command's imports (not minilm.__main__ itself)
    importlib.import_module(f"minilm.cli.{module.name}")


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
    """One forking server; ``run`` is ``subprocess.run([python, *argv], ...)`` with a faster start."""

    def __init__(self, scratch: str, env: dict):
        self.scratch, self.lock, self.count = scratch, threading.Lock(), 0
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, argv: Sequence[str], cwd: str, env: dict, input: Optional[bytes] = None, timeout: float = 300):
        with self.lock:
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
        return subprocess.CompletedProcess([sys.executable, *argv], reply["returncode"], out, err)

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=60)
