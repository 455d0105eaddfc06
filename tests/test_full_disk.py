"""A real full disk: a tmpfs of a few hundred KB mounted for the test (root on CI; skipped,
with the reason, where mounting is refused). Training's second save, export, prepared data
and make-corpus each end with one line and exit status 2, keep what was there whole, and
leave no temporary or partial files."""

import os
import subprocess

import pytest

from minilm.checkpoints import format as checkpoint
from minilm.training import saving
from tests.conftest import REPO, tiny_overrides
from tests.forkrun import run_python

FIXTURE = os.path.join(REPO, "tests", "fixtures", "main-7334668", "rope.pt")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(size) -> the mount point of a fresh tmpfs of that size ('700k')."""
    mounted = []

    def mount(size: str):
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here ({(result.stderr or result.stdout).strip()[:120]}): "
                f"a real full disk needs root"
            )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], capture_output=True)


def run(*argv):
    return run_python([*argv], cwd=REPO, env=ENV, timeout=300)


def one_line_error(result, *words):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word.lower() in lines[0].lower(), lines[0]


def leftovers(directory):
    return sorted(
        str(p.relative_to(directory)) for p in directory.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".")
    )


@pytest.mark.slow
def test_training_keeps_its_previous_checkpoint_when_the_disk_fills(tiny_corpus, small_disk):
    disk = small_disk("700k")  # the step-6 checkpoint (~470 KB) fits, a second one beside it does not
    out = disk / "run"
    result = run("train.py", *tiny_overrides(tiny_corpus, out, "train.sample_tokens=0"), "--quiet")
    one_line_error(result, str(out / "ckpt.pt"), "no space left on the device", "--resume")
    assert checkpoint.load(str(out))["step"] == 6
    assert [p for p in leftovers(out) if p != ".lock"] == []


@pytest.mark.slow
def test_a_sharded_save_on_a_full_disk_keeps_the_previous_checkpoint(tiny_corpus, small_disk):
    disk = small_disk("1000k")  # the step-6 shards (~650 KB) fit, a second version beside them does not
    out = disk / "run"
    result = run(
        "train.py",
        *tiny_overrides(tiny_corpus, out, "train.sample_tokens=0", "train.checkpoint_format=sharded"),
        "--quiet",
    )
    one_line_error(result, str(out / "ckpt.dcp"), "no space left on the device", "--resume")
    assert saving.read_record(str(out / "ckpt.dcp"))["step"] == 6
    version = os.readlink(out / "ckpt.dcp")  # the one version left, whole
    assert [p for p in leftovers(out) if p != ".lock"] == [version, f"{version}/.metadata"]


@pytest.mark.slow
def test_export_on_a_full_disk_leaves_no_directory(small_disk):
    disk = small_disk("60k")
    result = run("-m", "minilm", "export", FIXTURE, str(disk / "hf"))
    one_line_error(result, str(disk / "hf"), "no space left on the device")
    assert os.listdir(disk) == []


@pytest.mark.slow
def test_preparing_data_on_a_full_disk_leaves_no_partial_directory(tiny_corpus, small_disk, tmp_path):
    disk = small_disk("60k")
    result = run("train.py", *tiny_overrides(tiny_corpus, tmp_path / "run", f"data.dir={disk / 'data'}"), "--quiet")
    one_line_error(result, "cannot write the prepared corpus", "no space left on")
    assert list((disk / "data").iterdir()) == []


@pytest.mark.slow
def test_make_corpus_on_a_full_disk_leaves_nothing(small_disk):
    disk = small_disk("20k")
    result = run(
        "-m",
        "minilm",
        "passkey",
        "make-corpus",
        str(disk / "pk"),
        "--checkpoint",
        FIXTURE,
        "--n",
        "300",
        "--length",
        "120",
    )
    one_line_error(result, str(disk / "pk"), "no space left on the device")
    assert os.listdir(disk) == []
