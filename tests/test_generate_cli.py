"""minilm generate (generate.py) end to end on tiny checkpoints: streaming, prompt sources, seeds, samples,
stop strings, runs far past the context, --set position overrides, stats and bad input."""

import io
import os
import select
import subprocess
import sys
import time

import pytest

from minilm.checkpoints import format as checkpoint
from minilm.cli import generate as generate_script
from minilm.config import Config
from tests.forkrun import run_python

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "generate.py")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, gen_tokenizer, random_gpt):
    """name -> out_dir of a tiny random-weight checkpoint (block_size 32) with the test tokenizer."""
    root = tmp_path_factory.mktemp("gen_ckpts")
    out = {}
    for name, position in {
        "rope": {"kind": "rope"},
        "learned": {"kind": "learned"},
        "alibi": {"kind": "alibi"},
    }.items():
        model = random_gpt(position, vocab_size=gen_tokenizer.vocab_size, block_size=32)
        checkpoint.save(
            {
                "model": model.state_dict(),
                "config": Config(model=model.config).to_dict(),
                "tokenizer": gen_tokenizer.to_bytes(),
                "step": 0,
            },
            str(root / name),
        )
        out[name] = str(root / name)
    return out


def run(capsys, *argv):
    """minilm generate in-process: (exit status, stdout, stderr)."""
    try:
        status = generate_script.main(list(argv))
    except SystemExit as exc:
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def greedy(ckpt, *extra):
    return ("--checkpoint", ckpt, "--temperature", "0", *extra)


@pytest.mark.slow
def test_streams_text_through_a_pipe_as_it_is_decoded(checkpoints):
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *greedy(checkpoints["rope"], "--no-echo", "--max-new-tokens", "400"), "ROMEO:"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    chunks = []
    deadline = time.time() + 120
    while time.time() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            data = os.read(proc.stdout.fileno(), 1 << 16)
            if not data:
                break
            chunks.append(data)
    proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0, err
    # unflushed output would reach the pipe in one block at exit; streamed text arrives piece by piece
    assert len(chunks) >= 3, chunks


def test_greedy_decoding_names_the_sampling_filters_it_does_not_read(checkpoints, capsys):
    """--temperature 0 takes the likeliest token, so --top-p, --min-p and --top-k choose nothing: said on
    stderr, and the tokens are greedy's; at their defaults nothing is said."""
    status, plain, quiet = run(capsys, *greedy(checkpoints["rope"], "--max-new-tokens", "8", "ROMEO:"))
    assert status == 0 and "do nothing" not in quiet
    filters = ("--top-p", "0.5", "--min-p", "0.1", "--top-k", "5")
    status, out, err = run(capsys, *greedy(checkpoints["rope"], "--max-new-tokens", "8", *filters, "ROMEO:"))
    assert status == 0 and out == plain
    assert "note: --top-k 5, --top-p 0.5, --min-p 0.1 do nothing with --temperature 0 (greedy)" in err


class Recorder(io.StringIO):
    def __init__(self):
        super().__init__()
        self.flushed = []  # text length at each flush

    def flush(self):
        self.flushed.append(len(self.getvalue()))


def test_every_piece_is_flushed_as_soon_as_it_is_decoded(checkpoints):
    from minilm.cli.generate import run_cli

    args = generate_script.parse_args(list(greedy(checkpoints["rope"], "--max-new-tokens", "60", "ROMEO:")))
    out, err = Recorder(), io.StringIO()
    run_cli(args, stdin=io.StringIO(), stdout=out, stderr=err)
    assert out.getvalue().startswith("ROMEO:")
    assert len(set(out.flushed)) > 20  # the prompt, then (almost) every token's text on its own


def test_prompt_from_argument_file_and_stdin_agree(checkpoints, capsys, tmp_path, monkeypatch):
    ckpt = checkpoints["alibi"]
    status, from_arg, _ = run(capsys, *greedy(ckpt, "--max-new-tokens", "20"), "JULIET:")
    assert status == 0 and from_arg.startswith("JULIET:")
    (tmp_path / "p.txt").write_text("JULIET:")
    assert run(capsys, *greedy(ckpt, "--max-new-tokens", "20", "--prompt-file", str(tmp_path / "p.txt")))[1] == from_arg
    monkeypatch.setattr(sys, "stdin", io.StringIO("JULIET:"))
    assert run(capsys, *greedy(ckpt, "--max-new-tokens", "20"), "-")[1] == from_arg
    monkeypatch.setattr(sys, "stdin", io.StringIO("JULIET:"))  # not a terminal: read without '-'
    assert run(capsys, *greedy(ckpt, "--max-new-tokens", "20"))[1] == from_arg
    status, no_echo, _ = run(capsys, *greedy(ckpt, "--max-new-tokens", "20", "--no-echo"), "JULIET:")
    assert "JULIET:" + no_echo == from_arg


def test_empty_prompt_starts_from_bos(checkpoints, capsys):
    status, out, err = run(capsys, *greedy(checkpoints["rope"], "--max-new-tokens", "10"), "")
    assert status == 0 and out.strip(), err


def test_seed_gives_reproducible_samples(checkpoints, capsys):
    argv = ("--checkpoint", checkpoints["rope"], "--max-new-tokens", "40", "--temperature", "1.0", "ROMEO:")
    a = run(capsys, *argv, "--seed", "11")[1]
    assert a == run(capsys, *argv, "--seed", "11")[1]
    assert a != run(capsys, *argv, "--seed", "12")[1]


def test_num_samples_prints_each_sample_after_the_other(checkpoints, capsys):
    status, out, _ = run(
        capsys,
        "--checkpoint",
        checkpoints["rope"],
        "--max-new-tokens",
        "30",
        "--seed",
        "0",
        "--temperature",
        "1.0",
        "--num-samples",
        "3",
        "KING:",
    )
    assert status == 0
    samples = out.split("---------------\n")
    assert len(samples) == 3 and all(s.startswith("KING:") and s.endswith("\n") for s in samples)
    assert len(set(samples)) == 3


def test_stop_string_ends_the_output_before_it(checkpoints, capsys):
    ckpt = checkpoints["rope"]
    full = run(capsys, *greedy(ckpt, "--max-new-tokens", "80", "--no-echo"), "ROMEO:")[1]
    stop = full[10:12]
    status, out, _ = run(
        capsys, *greedy(ckpt, "--max-new-tokens", "80", "--no-echo", "--stop", stop, "--stop", "never-there"), "ROMEO:"
    )
    assert status == 0 and out == full.split(stop)[0] + "\n"


def test_stop_strings_understand_newline_and_tab_escapes():
    from minilm.cli.generate import unescape

    assert unescape(r"\n\n") == "\n\n" and unescape(r"a\tb") == "a\tb"
    assert unescape(r"c:\\new") == r"c:\new" and unescape(r"\q é") == r"\q é"


@pytest.mark.parametrize("name", ["learned", "rope"])
def test_runs_far_past_the_context_and_no_cache_agrees(checkpoints, capsys, name):
    argv = greedy(checkpoints[name], "--max-new-tokens", "150", "--max-context", "24", "ROMEO:")
    status, cached, err = run(capsys, *argv)
    assert status == 0, err
    status, uncached, err = run(capsys, *argv, "--no-cache")
    assert status == 0 and cached == uncached


@pytest.mark.slow
def test_compile_gives_the_same_text_past_the_context(checkpoints, capsys):
    argv = greedy(checkpoints["rope"], "--max-new-tokens", "60", "--max-context", "24", "ROMEO:")
    status, eager, err = run(capsys, *argv)
    assert status == 0, err
    status, compiled, err = run(capsys, *argv, "--compile", "--stats")
    assert status == 0 and compiled == eager and "compiled step, static KV cache" in err, err
    assert "compiling the decode step" in err and "compile: the first decode step took" in err


def test_bfloat16_generation_keeps_the_weights_in_bf16(checkpoints, capsys):
    """--dtype bfloat16 decodes with bf16 weights (opt-in; float32 is the default and auto picks
    bf16 only where the CPU has native bf16 units), past the context too."""
    argv = greedy(checkpoints["rope"], "--max-new-tokens", "40", "--max-context", "24", "--stats", "--no-echo")
    status, out, err = run(capsys, *argv, "--dtype", "bfloat16", "ROMEO:")
    assert status == 0 and out.strip() and "cpu, bfloat16" in err and "decode: 39 tokens" in err, err
    status, out, err = run(capsys, *argv, "ROMEO:")
    assert status == 0 and "cpu, float32" in err, err


def test_learned_prompt_longer_than_the_context_is_cropped_with_a_warning(checkpoints, capsys):
    status, out, err = run(capsys, *greedy(checkpoints["learned"], "--max-new-tokens", "5"), "the king " * 30)
    assert status == 0
    assert err.startswith("warning: the prompt has") and "last 32 tokens" in err and "Traceback" not in err


def test_stats_go_to_stderr(checkpoints, capsys):
    status, out, err = run(capsys, *greedy(checkpoints["rope"], "--max-new-tokens", "12", "--stats"), "ROMEO:")
    assert status == 0 and "tokens/s" not in out
    assert "prefill: " in err and "decode: 11 tokens" in err and "tokens/s" in err and "peak memory" in err


def test_set_changes_the_position_scaling_at_generation_time(checkpoints, capsys):
    base = greedy(checkpoints["rope"], "--max-new-tokens", "60", "--max-context", "96", "--no-echo", "ROMEO:")
    plain = run(capsys, *base)[1]
    status, dynamic, err = run(
        capsys, *base, "--set", "model.position.scaling.type=dynamic", "--set", "model.position.scaling.factor=4"
    )
    assert status == 0, err
    assert dynamic != plain  # context 96 > trained 32: dynamic NTK changes the rotation
    status, _, err = run(capsys, *base, "--set", "model.n_layer=3")
    assert status == 2 and "only model.block_size, model.dropout, model.position, data.* can change" in err


@pytest.mark.slow
def test_attention_map(checkpoints, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "attn.png"
    status, _, err = run(
        capsys, *greedy(checkpoints["rope"], "--max-new-tokens", "8", "--attention-map", str(path)), "ROMEO:"
    )
    assert status == 0, err
    assert path.stat().st_size > 1000 and "attention map" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--checkpoint", "/nonexistent/ckpt.pt", "hi"), "does not exist"),
        (("--temperature", "-1", "hi"), "temperature=-1.0"),
        (("--top-p", "0", "hi"), "top_p=0.0"),
        (("--top-p", "1.5", "hi"), "top_p=1.5"),
        (("--top-k", "-1", "hi"), "top_k=-1"),
        (("--max-new-tokens", "-1", "hi"), "--max-new-tokens=-1"),
        (("--num-samples", "0", "hi"), "--num-samples=0"),
        (("--max-context", "33", "hi"), "at most 32 positions"),
        (("--prompt-file", "/nonexistent/prompt.txt"), "cannot read --prompt-file"),
        (("model.position.kind=bogus", "hi"), "bogus"),
        (("--device", "tpu", "hi"), "--device 'tpu'"),
        (("--max-new-tokens", "ten", "hi"), "invalid int value"),
        (("--compile", "--no-cache", "hi"), "it needs use_cache=True"),
        (("--dtype", "float16", "hi"), "--dtype 'float16' is unknown"),
        (("--threads", "1000000000", "hi"), "--threads 1000000000 is invalid: expected 1 to"),
        (("--seed", str(2**64), "hi"), "expected a seed, an integer from 0 to 2**63 - 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(checkpoints, capsys, argv, message):
    if "--checkpoint" not in argv:
        argv = ("--checkpoint", checkpoints["learned"], *argv)
    status, out, err = run(capsys, *argv)
    assert status == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert out == ""


@pytest.mark.slow
def test_unreadable_checkpoint_in_a_subprocess_has_no_traceback(tmp_path):
    bad = tmp_path / "ckpt.pt"
    bad.write_bytes(b"not a checkpoint")
    proc = run_python([SCRIPT, "--checkpoint", str(bad), "hi"], cwd=REPO, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
