"""The one installed command: ``minilm <command>`` (``python -m minilm``), the scripts of a clone
as the same commands, and a built wheel that carries the shipped configs and the entry point."""

import os
import subprocess
import sys
import zipfile

import pytest

from minilm import __main__ as command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_no_command_prints_the_plain_usage(capsys):
    assert command.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: minilm <command>") and "``" not in err
    for name in command.COMMANDS:
        assert f"\n  {name} " in err  # every command is listed
    assert command.main(["--help"]) == 0 and capsys.readouterr().out.startswith("usage: minilm")
    assert command.main(["bogus"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown command 'bogus': valid: train, generate, evaluate")


@pytest.mark.slow
def test_the_scripts_of_a_clone_are_the_commands(capsys):
    for name in ("train", "generate", "evaluate"):
        with pytest.raises(SystemExit):
            command.main([name, "--help"])
        in_process = capsys.readouterr().out
        assert in_process.startswith(f"usage: minilm {name}")
        if name == "generate":  # one script run as a user runs it (each process start costs seconds)
            script = subprocess.run(
                [sys.executable, os.path.join(REPO, "generate.py"), "--help"], capture_output=True, text=True, cwd=REPO
            )
            assert script.returncode == 0 and script.stdout == in_process


@pytest.mark.slow
def test_a_built_wheel_trains_from_the_shipped_configs_anywhere(tmp_path):
    """pip wheel, then an install of the wheel alone (no clone on the path): the entry point runs
    and finds rope.yaml among the shipped configs from an unrelated directory."""
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            REPO,
        ],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        pytest.skip(f"no wheel could be built here: {build.stderr.strip().splitlines()[-1:]}")
    wheel = next((tmp_path / "dist").glob("minilm-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "minilm/configs/rope.yaml" in names and "minilm/configs/alibi.yaml" in names
    assert "minilm/study/registered/length-generalization.yaml" in names  # the study's report reads it
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "minilm = minilm.__main__:main" in zipfile.ZipFile(wheel).read(entry).decode()
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [str(site / "bin" / "minilm"), "train", "--config", "rope.yaml", "--print-config"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "kind: rope" in out.stdout and "out_dir: out/rope" in out.stdout
    where = subprocess.run(
        [sys.executable, "-c", "import minilm; print(minilm.__file__)"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    ).stdout
    assert where.startswith(str(site))  # the installed copy ran, not the clone
