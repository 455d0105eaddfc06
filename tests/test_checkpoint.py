"""Tests for minilm.checkpoints.format: atomic writes survive a crash mid-save; bad files give clear
errors; checkpoints written by earlier commits still load and generate the same tokens."""

import json
import os
import textwrap

import pytest
import torch

from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.format import CheckpointError
from minilm.checkpoints.loading import load_model
from minilm.common import WriteError
from minilm.generation.decode import Sampling, generate_ids
from minilm.training.resume import check_run_state
from minilm.training.saving import RECORD, RECORD_FORMAT, read_record
from tests.conftest import REPO
from tests.forkrun import run_python


def state(value: float) -> dict:
    return {
        "model": {"w": torch.full((4,), value)},
        "config": {"seed": 1, "model": {"position": {"kind": "rope"}}},
        "tokenizer": b"tok",
        "step": int(value),
    }


def test_save_then_load_roundtrip(tmp_path):
    path = checkpoint.save(state(3.0), str(tmp_path / "run"))
    assert path == str(tmp_path / "run" / "ckpt.pt")
    loaded = checkpoint.load(str(tmp_path / "run"))
    assert loaded["step"] == 3 and loaded["tokenizer"] == b"tok" and loaded["path"] == path
    torch.testing.assert_close(loaded["model"]["w"], torch.full((4,), 3.0))


def test_a_save_that_fails_midway_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    checkpoint.save(state(1.0), str(tmp_path))
    real_save = torch.save

    def half_then_crash(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(f.tell() // 2)
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", half_then_crash)
    with pytest.raises(WriteError, match="ckpt.pt.*disk full"):  # one line naming the file
        checkpoint.save(state(2.0), str(tmp_path))
    monkeypatch.undo()
    assert checkpoint.load(str(tmp_path))["step"] == 1
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # the temporary file is gone


@pytest.mark.slow
def test_a_process_killed_during_save_keeps_the_previous_checkpoint(tmp_path):
    checkpoint.save(state(1.0), str(tmp_path))
    script = textwrap.dedent(f"""
        import os, signal, torch
        from minilm.checkpoints import format as checkpoint
        real_save = torch.save
        def save_then_die(obj, f, *args, **kwargs):
            real_save(obj, f, *args, **kwargs)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # dies before the rename
        checkpoint.torch.save = save_then_die
        checkpoint.save({{"model": {{"w": torch.zeros(4)}}, "config": {{}}, "tokenizer": b"x", "step": 2}},
        {str(tmp_path)!r})
    """)
    result = run_python(["-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert result.returncode == -9, result.stderr
    assert any(name.endswith(".tmp") for name in os.listdir(tmp_path))  # the half-written temp file
    assert checkpoint.load(str(tmp_path))["step"] == 1


def test_missing_truncated_and_foreign_files_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(str(tmp_path / "nope.pt"))
    with pytest.raises(CheckpointError, match="no checkpoint in directory"):
        checkpoint.load(str(tmp_path))
    good = checkpoint.save(state(1.0), str(tmp_path / "good"))
    data = open(good, "rb").read()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or not a minilm checkpoint"):
        checkpoint.load(str(truncated))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"hello, not a checkpoint" * 10)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        checkpoint.load(str(garbage))
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    with pytest.raises(CheckpointError, match="is not a minilm checkpoint"):
        checkpoint.load(str(foreign))
    incomplete = checkpoint.save({"model": {}, "config": {}}, str(tmp_path / "incomplete.pt"))
    with pytest.raises(CheckpointError, match="lacks 'tokenizer'"):
        checkpoint.load(incomplete)


def test_load_refuses_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    path = tmp_path / "evil.pt"
    torch.save(
        {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "model": Evil(), "config": {}, "tokenizer": b""},
        path,
    )
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        checkpoint.load(str(path))


POSITION = {"kind": "rope"}


@pytest.mark.parametrize(
    "config, message",
    [
        ({"seed": 1, "model": {}}, "its config's model section lacks position (the position setting"),
        ({"model": {"position": "rope"}}, "its config's model.position is 'rope': expected a mapping with a kind"),
        ({"model": {"position": {"base": 1e4}}}, "model.position is {'base': 10000.0}: expected a mapping with a kind"),
        ({"model": {"position": POSITION}, "data": "shakespeare"}, "its config's data section is 'shakespeare'"),
        ({"model": {"position": POSITION}, "train": ["fast"]}, "its config's train section is ['fast']: expected a"),
    ],
)
def test_a_config_minilm_never_writes_is_refused_where_the_file_is_read(config, message, tmp_path):
    """A checkpoint that passes its CRC but whose config lacks the position setting, or holds a section
    that is no mapping, is one line naming it (issue 59), for a file and for a sharded checkpoint's
    record alike, never a traceback from whatever reads it first."""
    path = checkpoint.save({**state(1.0), "config": config}, str(tmp_path / "ckpt.pt"))
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    record = tmp_path / "ckpt.dcp"
    record.mkdir()
    (record / ".metadata").write_bytes(b"")
    torch.save({"format": RECORD_FORMAT, "version": checkpoint.VERSION, "config": config}, record / RECORD)
    with pytest.raises(CheckpointError) as info:
        read_record(str(record))
    assert message in str(info.value)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"step": "ten"}, "its step is 'ten': expected a count of steps >= 0"),
        ({"step": True}, "its step is True"),
        ({"rng": "x"}, "its rng is 'x': expected a mapping with the torch generator's state"),
        (
            {"rng": {"torch": torch.zeros(5056)}},
            "its rng.torch is a float32 tensor of 5,056 values: expected the state",
        ),
        ({"rng": {"torch": torch.zeros(7, dtype=torch.uint8)}}, "its rng.torch is a uint8 tensor of 7 values"),
        ({"data_state": None}, "its data_state is None: expected a mapping with the data generator's state"),
        ({"data_state": {"generator": [1, 2]}}, "its data_state.generator is [1, 2]: expected the state"),
    ],
)
def test_a_garbled_run_state_is_refused_before_anything_is_restored(change, message):
    """``--resume`` checks the step, the RNG states and the data generator's state of a checkpoint that
    passed its CRC before restoring any (issue 59): one line naming the part, the global RNG untouched."""
    good = {
        "step": 3,
        "rng": {"torch": torch.get_rng_state()},
        "data_state": {"generator": torch.Generator().get_state()},
    }
    check_run_state(good, "ckpt.pt", torch.device("cpu"))
    before = torch.get_rng_state()
    with pytest.raises(CheckpointError) as info:
        check_run_state({**good, **change}, "ckpt.pt", torch.device("cpu"))
    assert message in str(info.value) and "\n" not in str(info.value)
    assert torch.equal(torch.get_rng_state(), before)


FIXTURES = os.path.join(REPO, "tests", "fixtures", "main-7334668")


@pytest.mark.parametrize("kind", ["rope", "learned", "alibi"])
def test_a_checkpoint_written_before_the_subpackages_loads_and_generates_the_same_tokens(kind):
    """tests/fixtures/main-7334668 holds tiny checkpoints written by commit 7334668 (the flat
    package; 300 training steps on tests' tiny corpus, resume state dropped) and the tokens
    that commit generated from them: greedy, and sampled with seed 7, top-k 20."""
    with open(os.path.join(FIXTURES, "expected_tokens.json"), encoding="utf-8") as f:
        expected = json.load(f)[kind]
    model, tokenizer, _, _ = load_model(os.path.join(FIXTURES, f"{kind}.pt"))
    prompt = tokenizer.encode(expected["prompt"])
    greedy = [int(t) for t in generate_ids(model, prompt, max_new_tokens=40, sampling=Sampling(temperature=0))]
    sampled = [
        int(t)
        for t in generate_ids(model, prompt, max_new_tokens=40, seed=7, sampling=Sampling(temperature=1.0, top_k=20))
    ]
    assert greedy == expected["greedy"]
    assert sampled == expected["sampled_seed7_topk20"]
