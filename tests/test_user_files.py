"""What minilm does around the files a user already has, and how every verb reads its
arguments: an output name that holds a file is set aside as ``<stem>.1<suffix>``, never replaced; two
commands racing for one name both keep their work (or the second is refused); a resumed run
says whose settings it takes; paths and overrides go anywhere among the options."""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from minilm.checkpoints import format as checkpoint
from minilm.common import atomic_write, keep_aside
from minilm.config import resolve_config
from minilm.configfile import load_config
from minilm.training.loop import train
from tests.conftest import REPO, tiny_overrides
from tests.forkrun import run_python

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}


def run(*argv, cwd):
    return run_python(["-m", "minilm", *argv], cwd=cwd, env=ENV, timeout=300)


@pytest.fixture(scope="module")
def checkpoints(tiny_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("user_files")
    out = []
    for name in ("a", "b"):
        config = load_config(
            None,
            tiny_overrides(
                tiny_corpus, root / name, "train.max_steps=4", "train.sample_tokens=0", "train.final_eval_tokens=0"
            ),
        )
        out.append(os.path.dirname(train(resolve_config(config), quiet=True)["checkpoint"]))
    return out


def test_keep_aside_numbers_what_it_moves(tmp_path):
    target = tmp_path / "eval.csv"
    assert keep_aside(target) is None
    for n in (1, 2):
        target.write_text(f"run {n}")
        assert keep_aside(target) == str(tmp_path / f"eval.{n}.csv")  # the number before the suffix
    assert not target.exists() and (tmp_path / "eval.1.csv").read_text() == "run 1"
    atomic_write(target, "run 3")
    atomic_write(target, "run 4", keep=True)  # a result over a result: the earlier one kept as .3
    assert target.read_text() == "run 4" and (tmp_path / "eval.3.csv").read_text() == "run 3"


def test_racing_writers_keep_every_file(tmp_path):
    """Sixteen writers of one name at once: every text survives, under the name or a number."""
    target = tmp_path / "out.png"
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda n: atomic_write(target, f"writer {n}", keep=True), range(16)))
    texts = sorted(p.read_text() for p in tmp_path.iterdir())
    assert texts == sorted(f"writer {n}" for n in range(16))


@pytest.mark.slow
def test_evaluate_sets_the_users_file_aside_and_reads_paths_anywhere(checkpoints, tmp_path):
    first, second = checkpoints
    mine = tmp_path / "keep.txt"
    mine.write_bytes(b"the user's own notes\n")
    result = run(
        "evaluate", first, "--lengths", "32", second, "--csv", str(mine), "--max-tokens", "600", "--quiet", cwd=tmp_path
    )  # a checkpoint after an option, as train takes overrides
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "keep.1.txt").read_bytes() == b"the user's own notes\n"
    assert "kept the earlier keep.txt" in result.stderr
    rows = mine.read_text().splitlines()
    assert len(rows) == 3 and {os.path.basename(first), os.path.basename(second)} <= {r.split(",")[0] for r in rows[1:]}


# every command that writes a file a user names, its path given last
EVALUATE = ["evaluate", "{ckpt}", "--lengths", "32", "--max-tokens", "600", "--quiet"]
LONGEVAL = ["longeval", "{ckpt}", "--tasks", "single", "--lengths", "32", "--depths", "0.5", "--trials", "1", "--quiet"]
WRITERS = {
    "evaluate --csv": [*EVALUATE, "--csv"],
    "evaluate --plot": [*EVALUATE, "--plot"],
    "longeval --csv": [*LONGEVAL, "--csv"],
    "longeval --figure": [*LONGEVAL, "--figure"],
    "generate --attention-map": ["generate", "--checkpoint", "{ckpt}", "--max-new-tokens", "1", "--attention-map"],
    "positions plot --out": ["positions", "plot", "rope", "--out"],
    "positions layers --out": ["positions", "layers", "rope.yaml", "--out"],
}


@pytest.mark.parametrize("argv", WRITERS.values(), ids=WRITERS.keys())
def test_every_writer_keeps_the_users_earlier_file(checkpoints, tmp_path, capsys, argv):
    """Each command sets an earlier file at its output aside, the number before the suffix, says so in
    one stderr line, and writes its own whole under the name."""
    from minilm.__main__ import main

    suffix = ".csv" if argv[-1] == "--csv" else ".png"
    if suffix == ".png":
        pytest.importorskip("matplotlib")
    target = tmp_path / f"mine{suffix}"
    mine = b"the user's own file, not minilm's\n"
    target.write_bytes(mine)
    argv = [a.replace("{ckpt}", checkpoints[0]) for a in argv] + [str(target)]
    assert main(argv + (["hi"] if argv[0] == "generate" else [])) == 0
    kept = tmp_path / f"mine.1{suffix}"
    assert kept.read_bytes() == mine and target.read_bytes() != mine and target.stat().st_size > 0
    said = [line for line in capsys.readouterr().err.splitlines() if str(kept) in line]
    assert said == [f"kept the earlier mine{suffix} as {kept}"], said


def test_overwrite_sets_aside_a_ckpt_pt_that_is_no_checkpoint(tiny_corpus, tmp_path, capsys):
    """``train --overwrite`` replaces a run's checkpoint, never the user's own file of that name."""
    from minilm.__main__ import main

    out = tmp_path / "run"
    out.mkdir()
    mine = b"my notes, named ckpt.pt\n"
    (out / "ckpt.pt").write_bytes(mine)
    argv = tiny_overrides(tiny_corpus, out, "train.max_steps=1", "train.sample_tokens=0", "train.final_eval_tokens=0")
    assert main(["train", *argv, "--quiet"]) == 2  # without --overwrite: said as what it is, not a checkpoint
    assert "which is no minilm checkpoint: --overwrite keeps it aside" in capsys.readouterr().err
    assert main(["train", *argv, "--overwrite", "--quiet"]) == 0
    assert (out / "ckpt.1.pt").read_bytes() == mine
    assert checkpoint.load(str(out))["step"] == 1  # the run's own checkpoint took the name
    said = [line for line in capsys.readouterr().err.splitlines() if "ckpt.1.pt" in line]
    assert len(said) == 1 and "not a minilm checkpoint" in said[0], said
    assert main(["train", *argv, "--overwrite", "--quiet"]) == 0  # a run's checkpoint: replaced, as asked
    assert not (out / "ckpt.2.pt").exists() and (out / "ckpt.1.pt").read_bytes() == mine


@pytest.mark.slow
def test_two_evaluations_at_once_keep_both_tables(checkpoints, tmp_path):
    first, _ = checkpoints
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(
            pool.map(
                lambda _: run("evaluate", first, "--lengths", "32", "--max-tokens", "600", "--quiet", cwd=tmp_path),
                range(2),
            )
        )
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    tables = sorted(n for n in os.listdir(first) if n.startswith("eval-nonoverlapping.") and n.endswith(".csv"))
    assert len(tables) >= 2, tables


@pytest.mark.slow
def test_two_exports_into_one_directory_never_mix(checkpoints, tmp_path):
    pytest.importorskip("safetensors")
    first, second = checkpoints
    target = str(tmp_path / "hf")
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda ckpt: run("export", ckpt, target, cwd=tmp_path), (first, second)))
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 2], [r.stderr for r in results]
    loser = next(r for r in results if r.returncode == 2)
    assert len(loser.stderr.strip().splitlines()) == 1 and "hf" in loser.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(target))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".hf-")]  # no staging left behind


@pytest.mark.slow
def test_memory_takes_overrides_after_its_options(tmp_path):
    result = run("memory", "rope.yaml", "--ranks", "2", "model.block_size=1024", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "8 x 1024 tokens per process, 2 processes" in result.stdout


@pytest.mark.slow
def test_a_resumed_run_takes_the_checkpoints_settings_unless_given_again(tiny_corpus, tmp_path):
    """Started with train.max_steps=4, resumed from a config file that says 12: it stays at 4, so the
    finished run is refused, saying whose 4 it is, and nothing changes; given again on the command
    line, max_steps=8 is taken."""
    base = tiny_overrides(tiny_corpus, tmp_path / "run", "train.sample_tokens=0", "train.final_eval_tokens=0")
    config_file = tmp_path / "long.yaml"
    config_file.write_text("train:\n  max_steps: 12\n")
    first = run_python([os.path.join(REPO, "train.py"), *base, "train.max_steps=4"], cwd=tmp_path, env=ENV, timeout=300)
    assert first.returncode == 0, first.stderr
    overrides = [o for o in base if not o.startswith("train.max_steps=")]
    again = run_python(
        [os.path.join(REPO, "train.py"), "--config", str(config_file), *overrides, "--resume"],
        cwd=tmp_path,
        env=ENV,
        timeout=300,
    )
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "at step 4 (the run is finished) and train.max_steps=4 (the checkpoint's: on --resume" in again.stderr
    assert sum(json.loads(line)["event"] == "final" for line in open(tmp_path / "run" / "metrics.jsonl")) == 1
    longer = run_python(
        [os.path.join(REPO, "train.py"), "--config", str(config_file), *overrides, "train.max_steps=8", "--resume"],
        cwd=tmp_path,
        env=ENV,
        timeout=300,
    )
    assert longer.returncode == 0, longer.stderr
    assert "done: 8 steps" in longer.stdout and "train.max_steps=8 (was 4)" in longer.stderr
