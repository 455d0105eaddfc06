"""The code keeps one style: ``ruff check`` (pyflakes, pycodestyle, import order) and ``ruff format
--check`` pass on the whole repository, as configured in pyproject.toml (lines of at most 120)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_passes(command):
    done = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
