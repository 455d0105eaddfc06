"""The shell commands of README.md and the manual, run as a reader would run them.

``shell_commands`` finds every command in a page's fenced ``bash``/``sh`` blocks (a line ending in a
backslash continues; comments dropped). ``run_page`` runs them in order in a sandbox directory that
looks like a clone after the main job (``out/rope`` trained, the corpus prepared, a few texts of
"your own"), with ``MINILM_SMOKE=1`` so that every command that trains takes seconds
(``minilm/cli/smoke.py``). A command of minilm's own runs in this process (no interpreter start);
anything else (pipes, torchrun, ``python -c``) runs under bash. ``hf download NAME`` cannot reach the
network here: it writes a random model of NAME's family into the sandbox's Hugging Face cache, so the
commands after it run against that stand-in. What cannot run here is skipped with its reason
(``SKIPS``), and counted. ``python -m tests.docs_commands BASE WORKDIR PAGE...`` runs pages one after
the other and prints each one's result as a JSON line (tests/test_docs.py runs two such lists at once).
"""

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_INFO = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
SKIPS = (
    (r"^pip install\b", "installs packages: the suite runs in an installed tree"),
    (r"^pytest\b", "the test suite itself"),
    (r"^mkdocs (serve|build)\b", "the manual's build: tests/test_docs.py builds it once"),
    (r"--nnodes=(?!1\b)\d+", "needs several machines"),
    (r"^python bench/(?!\S+ --help$)", "a benchmark: minutes by design, reported on the benchmarks page"),
    (r"(^|\s)--compile(\s|$)", "torch.compile takes tens of seconds to compile: tests/test_compiled.py checks it"),
    (r"\blmeval\b", "lm_eval's tasks download their datasets: tests/test_harness.py runs local tasks"),
    (r"^minilm experiment length-generalization$", "the quick study end to end: tests/test_experiments.py runs it"),
)
IN_PROCESS = re.compile(r"^(minilm|python -m minilm|python (train|generate|evaluate)\.py)( |$)")
SHELL_SYNTAX = re.compile(r"[|<>;`$]")
LINKED = ("train.py", "generate.py", "evaluate.py", "bench", "tests", "reports", "minilm", "pyproject.toml")
STAND_INS = {"EleutherAI/pythia": "neox", "HuggingFaceTB/": "llama"}  # hf download NAME: the family of NAME


def shell_commands(markdown: str) -> list:
    """Every command of the page's shell blocks, in order: continuation lines joined, comments dropped."""
    commands = []
    for block in FENCE.finditer(markdown):
        if block.group("info").strip() not in SHELL_INFO:
            continue
        indent = len(block.group("indent"))
        body = re.sub(r"\\\n\s*", " ", "\n".join(line[indent:] for line in block.group("body").split("\n")))
        for line in body.split("\n"):
            command = " ".join(shlex.split(line, comments=True, posix=False)) if line.strip() else ""
            if command:
                commands.append(command)
    return commands


def skip_reason(command: str):
    for pattern, reason in SKIPS:
        if re.search(pattern, command):
            return reason
    return None


def make_sandbox(sandbox: str, base: str, keep_rope: bool) -> None:
    """A working directory like a clone after the main job: the repo's files linked, the main job's
    (smoke) ``out/rope`` and prepared data copied from ``base``, and texts of the reader's own."""
    os.makedirs(os.path.join(sandbox, "docs", "images"), exist_ok=True)
    for name in LINKED:
        os.symlink(os.path.join(REPO, name), os.path.join(sandbox, name))
    shutil.copytree(os.path.join(base, "data"), os.path.join(sandbox, "data"))
    if keep_rope:
        shutil.copytree(os.path.join(base, "out", "rope"), os.path.join(sandbox, "out", "rope"))
    from tests.conftest import tiny_text

    # three documents each: the last ~10% of each is the validation split, which must hold more tokens than
    # the longest context the pages extend to (4,096 with my_texts/, 8,192 with my_long_texts/)
    for folder, lines in (("my_texts", 1000), ("my_long_texts", 2000)):
        os.makedirs(os.path.join(sandbox, folder))
        for i in range(3):
            with open(os.path.join(sandbox, folder, f"doc{i}.txt"), "w", encoding="utf-8") as f:
                f.write(tiny_text(lines, seed=i))
    with open(os.path.join(sandbox, "docs.jsonl"), "w", encoding="utf-8") as f:
        for i in range(4):
            f.write(json.dumps({"text": tiny_text(100, seed=10 + i)}) + "\n")
    with open(os.path.join(sandbox, "prompts.txt"), "w", encoding="utf-8") as f:
        f.write("ROMEO:\nJULIET: What light\nHAMLET:\n")
    os.makedirs(os.path.join(sandbox, ".bin"))
    with open(os.path.join(sandbox, ".bin", "minilm"), "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" -m minilm "$@"\n')
    os.chmod(os.path.join(sandbox, ".bin", "minilm"), 0o755)


def environment(sandbox: str) -> dict:
    return {
        **os.environ,
        "MINILM_SMOKE": "1",
        "PYTHONPATH": REPO,
        "HF_HUB_CACHE": os.path.join(sandbox, "hf-cache"),
        "PATH": os.path.join(sandbox, ".bin") + os.pathsep + os.environ.get("PATH", ""),
        "MPLBACKEND": "Agg",
        "TQDM_DISABLE": "1",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
    }


def stand_in(name: str, sandbox: str, base: str) -> None:
    """``hf download NAME`` without the network: a random model of NAME's family, exported by minilm
    with the main job's tokenizer, as the snapshot refs/main of NAME in the sandbox's cache."""
    import torch

    from minilm.checkpoints.loading import load_model
    from minilm.config import Config, DataConfig, ModelConfig
    from minilm.hf.export import export_model
    from minilm.model.gpt import GPT

    family = next((f for prefix, f in STAND_INS.items() if name.startswith(prefix)), None)
    if family is None:
        raise ValueError(f"no stand-in for {name}: give tests/docs_commands.STAND_INS its family")
    shape = {"n_layer": 1, "n_head": 2, "d_model": 32, "block_size": 2048, "position": {"kind": "rope"}}
    if family == "llama":
        shape.update(norm="rmsnorm", mlp="swiglu", d_ff=64, tie_embeddings=True)
    else:
        shape.update(norm="layernorm", mlp="gelu", parallel_residual=True, bias=True, tie_embeddings=False)
    tokenizer = load_model(os.path.join(base, "out", "rope")).tokenizer
    torch.manual_seed(0)
    model_config = ModelConfig(vocab_size=tokenizer.vocab_size, **shape)
    repo = os.path.join(sandbox, "hf-cache", "models--" + name.replace("/", "--"))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w", encoding="utf-8") as f:
        f.write("standin")
    config = Config(model=model_config, data=DataConfig(vocab_size=tokenizer.vocab_size))
    export_model(GPT(model_config), tokenizer, config, os.path.join(repo, "snapshots", "standin"))


def run_in_process(words: list, env: dict, sandbox: str) -> tuple:
    """(exit status, stdout + stderr) of a command of minilm's own, run in this process."""
    from minilm.__main__ import main

    assignments = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        key, value = words.pop(0).split("=", 1)
        assignments[key] = value
    if words[0] == "minilm":
        argv = words[1:]
    elif words[:3] == ["python", "-m", "minilm"]:
        argv = words[3:]
    else:
        argv = [words[1].removesuffix(".py")] + words[2:]
    saved, cwd, out = dict(os.environ), os.getcwd(), io.StringIO()
    os.environ.update({**env, **assignments})
    try:
        os.chdir(sandbox)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                status = main(argv)
            except SystemExit as exit:
                status = exit.code
            except Exception:  # a traceback is a failure of the command, reported with the page
                traceback.print_exc()
                status = 1
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
    return (0 if status is None else status), out.getvalue()


def run_part(part: str, env: dict, sandbox: str, base: str) -> tuple:
    download = re.match(r"^hf download (\S+)$", part)
    if download:
        stand_in(download.group(1), sandbox, base)
        return 0, ""
    if IN_PROCESS.match(re.sub(r"^([A-Z_]+=\S+ )+", "", part)) and not SHELL_SYNTAX.search(part):
        return run_in_process(shlex.split(part), env, sandbox)
    done = subprocess.run(["bash", "-c", part], cwd=sandbox, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def run_page(markdown: str, sandbox: str, base: str) -> dict:
    """Run a page's commands in order: {"ran": [command], "skipped": [[command, reason]],
    "failed": [[command, status, output's tail]]}."""
    started, commands = time.time(), shell_commands(markdown)
    trains_rope = any(re.search(r"train(\.py)? --config rope\.yaml$", c) for c in commands)
    make_sandbox(sandbox, base, keep_rope=not trains_rope)
    env, result = environment(sandbox), {"ran": [], "skipped": [], "failed": []}
    for command in commands:
        parts = command.split(" && ")
        reasons = [skip_reason(part) for part in parts]
        if all(reasons):  # nothing of it can run here
            result["skipped"].append([command, reasons[-1]])
            continue
        for part, reason in zip(parts, reasons):
            status, output = (0, "") if reason else run_part(part, env, sandbox, base)
            if status != 0:
                result["failed"].append([command, status, output[-3000:]])
                break
        else:
            result["ran"].append(command)
    result["seconds"] = round(time.time() - started, 1)
    return result


def prepare_base(base: str) -> None:
    """The main job as a smoke run: out/rope and the prepared corpus every page starts from."""
    os.makedirs(base)
    status, output = run_in_process(["minilm", "train", "--config", "rope.yaml"], environment(base), base)
    if status != 0:
        raise RuntimeError(f"the smoke main job failed:\n{output[-3000:]}")


if __name__ == "__main__":
    base, workdir, *pages = sys.argv[1:]
    for page in pages:  # one interpreter for several pages: torch is imported once
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            result = run_page(f.read(), os.path.join(workdir, re.sub(r"\W", "-", page)), base)
        print("RESULT " + json.dumps({"page": page, **result}), flush=True)
