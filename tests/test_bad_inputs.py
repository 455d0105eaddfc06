"""Bad input through the real command lines, each in its own process: exit status 2, at most
two lines on stderr, no traceback, and the bad value named. The processes run a few at a time
(they spend most of their time importing torch); each case then checks its own result."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from minilm.checkpoints import format as checkpoint
from minilm.config import load_config, resolve_config
from minilm.training.loop import train
from tests.conftest import REPO, tiny_overrides

PY = sys.executable



# (name, argv, stdin bytes or None, what stderr must name)
CASES = [
    # --- train.py: config values
    ("config missing", ["train.py", "--config", "nosuch.yaml", "--print-config"], None, "nosuch.yaml"),
    ("unknown key", ["train.py", "train.max_step=5", "--print-config"], None, "train.max_step"),
    ("unknown section", ["train.py", "trian.lr=1", "--print-config"], None, "trian"),
    ("lr nan", ["train.py", "train.lr=.nan", "--print-config"], None, "train.lr=nan"),
    ("lr inf", ["train.py", "train.lr=.inf", "--print-config"], None, "train.lr=inf"),
    ("weight decay nan", ["train.py", "train.weight_decay=.nan", "--print-config"], None, "train.weight_decay=nan"),
    ("lr text", ["train.py", "train.lr=fast", "--print-config"], None, "train.lr='fast'"),
    ("max_steps text", ["train.py", "train.max_steps=abc", "--print-config"], None, "train.max_steps='abc'"),
    ("batch size 0", ["train.py", "train.batch_size=0", "--print-config"], None, "train.batch_size=0"),
    ("log interval 0", ["train.py", "train.log_interval=0", "--print-config"], None, "train.log_interval=0"),
    ("dtype", ["train.py", "train.dtype=fp16", "--print-config"], None, "train.dtype='fp16'"),
    ("train device", ["train.py", "train.device=tpu", "--print-config"], None, "train.device='tpu'"),
    ("beta2", ["train.py", "train.beta2=1.5", "--print-config"], None, "train.beta2=1.5"),
    ("min_lr above lr", ["train.py", "train.min_lr=1", "--print-config"], None, "train.min_lr=1.0"),
    ("heads", ["train.py", "model.n_head=5", "--print-config"], None, "model.n_head=5"),
    ("dropout", ["train.py", "model.dropout=1.5", "--print-config"], None, "model.dropout=1.5"),
    ("seed text", ["train.py", "seed=abc", "--print-config"], None, "seed='abc'"),
    ("position kind", ["train.py", "model.position.kind=rop", "--print-config"], None, "'rop'"),
    ("position option", ["train.py", "model.position.bsae=5", "--print-config"], None, "'bsae'"),
    ("yarn without factor", ["train.py", "model.position={kind: rope, scaling: {type: yarn}}", "--print-config"],
     None, "scaling.factor"),
    ("learned table too short", ["train.py", "model.position={kind: learned, max_positions: 16}", "--print-config"],
     None, "model.block_size=256"),
    ("vocab too small", ["train.py", "data.vocab_size=5", "--print-config"], None, "vocab_size=5"),
    ("override without value", ["train.py", "train.max_steps", "--print-config"], None, "train.max_steps"),
    ("duplicate section", ["train.py", "--config", "{scratch}/twice.yaml", "--print-config"], None,
     "'train' appears twice"),
    ("yaml syntax", ["train.py", "--config", "{scratch}/broken.yaml", "--print-config"], None, "line 3, column"),
    ("unknown flag", ["train.py", "--bogus"], None, "--bogus"),
    # --- train.py: files, out_dir, resume, init_from
    ("out_dir is a file", ["train.py", "out_dir=/dev/null", "--quiet"], None, "out_dir='/dev/null'"),
    ("out_dir impossible", ["train.py", "out_dir=/proc/minilm/x", "--quiet"], None, "/proc/minilm/x"),
    ("data.dir impossible", ["train.py", "data.corpus={corpus}", "data.dir=/proc/minilm/d",
                             "out_dir={scratch}/dd", "--quiet"], None, "data.dir='/proc/minilm/d'"),
    ("corpus missing", ["train.py", "data.corpus=/nonexistent/texts", "out_dir={scratch}/cm", "--quiet"], None,
     "/nonexistent/texts"),
    ("fresh run over a checkpoint", ["train.py", "out_dir={ckpt}", "--quiet"], None, "--resume"),
    ("resume without checkpoint", ["train.py", "out_dir={scratch}/none", "--resume", "--quiet"], None,
     "no checkpoint"),
    ("init_from missing", ["train.py", "train.init_from=/nonexistent/run", "out_dir={scratch}/im", "--quiet"],
     None, "/nonexistent/run"),
    ("init_from other width", ["train.py", "train.init_from={ckpt}", "model.n_layer=2", "model.n_head=2",
                               "model.d_model=64", "out_dir={scratch}/iw",
                               "--quiet"], None, "model.d_model=64"),
    ("init_from other kind", ["train.py", "train.init_from={ckpt}", "model.n_layer=2", "model.n_head=2",
                              "model.d_model=32", "model.position.kind=alibi", "out_dir={scratch}/ik", "--quiet"],
     None, "'alibi'"),
    # --- generate.py
    ("checkpoint missing", ["generate.py", "--checkpoint", "/nonexistent/ckpt.pt", "hi"], None,
     "/nonexistent/ckpt.pt"),
    ("checkpoint garbage", ["generate.py", "--checkpoint", "{scratch}/garbage.pt", "hi"], None, "garbage.pt"),
    ("checkpoint unsafe", ["generate.py", "--checkpoint", "{scratch}/unsafe.pt", "hi"], None, "posix.system"),
    ("temperature", ["generate.py", "--checkpoint", "{ckpt}", "--temperature", "-1", "hi"], None,
     "temperature=-1.0"),
    ("top_p", ["generate.py", "--checkpoint", "{ckpt}", "--top-p", "1.5", "hi"], None, "top_p=1.5"),
    ("top_k", ["generate.py", "--checkpoint", "{ckpt}", "--top-k", "0", "hi"], None, "top_k=0"),
    ("repetition penalty", ["generate.py", "--checkpoint", "{ckpt}", "--repetition-penalty", "0", "hi"], None,
     "repetition_penalty=0.0"),
    ("max new tokens", ["generate.py", "--checkpoint", "{ckpt}", "--max-new-tokens", "-1", "hi"], None,
     "--max-new-tokens=-1"),
    ("num samples", ["generate.py", "--checkpoint", "{ckpt}", "--num-samples", "0", "hi"], None,
     "--num-samples=0"),
    ("max context 0", ["generate.py", "--checkpoint", "{ckpt}", "--max-context", "0", "hi"], None,
     "--max-context=0"),
    ("threads", ["generate.py", "--checkpoint", "{ckpt}", "--threads", "0", "hi"], None, "--threads=0"),
    ("sink tokens", ["generate.py", "--checkpoint", "{ckpt}", "--sink-tokens", "40", "hi"], None, "sink_tokens=40"),
    ("huge cache", ["generate.py", "--checkpoint", "{ckpt}", "--max-context", "1000000000000", "--max-new-tokens",
                    "1000000000000", "hi"], None, "1,000,000,000,000 tokens"),
    ("prompt file missing", ["generate.py", "--checkpoint", "{ckpt}", "--prompt-file", "/nonexistent/p.txt"],
     None, "/nonexistent/p.txt"),
    ("prompt argument not utf-8", ["generate.py", "--checkpoint", "{ckpt}", b"caf\xe9"], None, "0xe9"),
    ("prompt stdin not utf-8", ["generate.py", "--checkpoint", "{ckpt}"], b"caf\xe9", "0xe9"),
    ("set another kind", ["generate.py", "--checkpoint", "{ckpt}", "--set", "model.position.kind=bogus", "hi"],
     None, "'bogus'"),
    ("set the width", ["generate.py", "--checkpoint", "{ckpt}", "--set", "model.d_model=3", "hi"], None,
     "model.d_model=3"),
    ("generate device", ["generate.py", "--checkpoint", "{ckpt}", "--device", "tpu", "hi"], None, "'tpu'"),
    ("max new tokens text", ["generate.py", "--checkpoint", "{ckpt}", "--max-new-tokens", "ten", "hi"], None,
     "'ten'"),
    # --- evaluate.py
    ("stride 0", ["evaluate.py", "{ckpt}", "--mode", "sliding", "--stride", "0", "--quiet"], None, "stride=0"),
    ("stride without sliding", ["evaluate.py", "{ckpt}", "--stride", "4", "--quiet"], None, "stride=4"),
    ("batch tokens 0", ["evaluate.py", "{ckpt}", "--batch-tokens", "0", "--quiet"], None, "batch_tokens=0"),
    ("multiple under one token", ["evaluate.py", "{ckpt}", "--multiples", "0.001", "--quiet"], None, "0.001"),
    ("lengths 0", ["evaluate.py", "{ckpt}", "--lengths", "0", "--quiet"], None, "--lengths='0'"),
    ("evaluate mode", ["evaluate.py", "{ckpt}", "--mode", "bogus", "--quiet"], None, "'bogus'"),
    ("csv impossible", ["evaluate.py", "{ckpt}", "--csv", "/proc/minilm/y.csv", "--quiet"], None, "/proc/minilm"),
    ("max tokens negative", ["evaluate.py", "{ckpt}", "--max-tokens", "-5", "--quiet"], None, "max_tokens=-5"),
    ("evaluation override", ["evaluate.py", "{ckpt}", "--set", "model.n_layer=9", "--quiet"], None,
     "model.n_layer=9"),
    ("scaling type", ["evaluate.py", "{ckpt}", "--position.scaling.type=bogus", "--quiet"], None, "'bogus'"),
    ("too long", ["evaluate.py", "{ckpt}", "--lengths", "10000000", "--quiet"], None, "10000000"),
    # --- passkey
    ("passkey trials", ["-m", "minilm", "passkey", "eval", "{ckpt}", "--trials", "0"], None, "trials=0"),
    ("passkey depth", ["-m", "minilm", "passkey", "eval", "{ckpt}", "--depths", "2", "--lengths", "100"], None,
     "depth=2.0"),
    ("passkey lengths", ["-m", "minilm", "passkey", "eval", "{ckpt}", "--lengths", "x"], None, "'x'"),
    ("passkey missing", ["-m", "minilm", "passkey", "eval", "/nonexistent/run"], None, "/nonexistent/run"),
    ("passkey too short", ["-m", "minilm", "passkey", "make-corpus", "{scratch}/pk", "--checkpoint", "{ckpt}",
                           "--length", "5"], None, "length=5"),
    ("passkey mix", ["-m", "minilm", "passkey", "make-corpus", "{scratch}/pk2", "--checkpoint", "{ckpt}",
                     "--length", "120", "--mix", "1.0"], None, "mix=1.0"),
    # --- experiment, positions, the dispatcher
    ("experiment section", ["-m", "minilm", "experiment", "length-generalization", "--quick", "modle.d_model=3"],
     None, "'modle'"),
    ("experiment heads", ["-m", "minilm", "experiment", "length-generalization", "--quick", "model.n_head=3"],
     None, "model.n_head=3"),
    ("experiment lr", ["-m", "minilm", "experiment", "length-generalization", "--quick", "train.lr=.nan"], None,
     "train.lr=nan"),
    ("experiment name", ["-m", "minilm", "experiment", "bogus"], None, "'bogus'"),
    ("positions kind", ["-m", "minilm", "positions", "plot", "ropee", "--out", "{scratch}/x.png"], None, "'ropee'"),
    ("positions option", ["-m", "minilm", "positions", "plot", "rope", "--base", "-1", "--out", "{scratch}/x.png"],
     None, "base=-1"),
    ("positions command", ["-m", "minilm", "positions", "bogus"], None, "'bogus'"),
    ("command", ["-m", "minilm", "bogus"], None, "'bogus'"),
]


@pytest.fixture(scope="module")
def outcomes(tiny_corpus, tmp_path_factory):
    """Run every case (a few processes at a time); {name: CompletedProcess}."""
    scratch = tmp_path_factory.mktemp("bad_inputs")
    config = load_config(None, tiny_overrides(tiny_corpus, scratch / "run", "train.max_steps=2",
                                              "train.sample_tokens=0", "train.final_eval_tokens=200"))
    ckpt = os.path.dirname(train(resolve_config(config), quiet=True)["checkpoint"])
    (scratch / "twice.yaml").write_text("train:\n  lr: 1.0e-3\ntrain:\n  max_steps: 3\n")
    (scratch / "broken.yaml").write_text("model:\n  n_layer: 2\n   n_head: [\n")
    (scratch / "garbage.pt").write_bytes(b"not a checkpoint" * 10)

    class Unsafe:
        def __reduce__(self):
            return (os.system, ("true",))
    torch.save({"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "model": Unsafe(), "config": {},
                "tokenizer": b""}, scratch / "unsafe.pt")
    fill = {"{ckpt}": ckpt, "{scratch}": str(scratch), "{corpus}": str(tiny_corpus / "corpus.txt")}

    def expand(arg):
        if isinstance(arg, bytes):
            return arg
        for key, value in fill.items():
            arg = arg.replace(key, value)
        return arg

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}

    def run(case):
        name, argv, stdin, _ = case
        return name, subprocess.run([PY, *map(expand, argv)], cwd=REPO, env=env, input=stdin or b"",
                                    capture_output=True, timeout=300)
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, CASES))


def test_there_are_at_least_fifty_cases():
    assert len(CASES) >= 50 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name, argv, stdin, named", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(outcomes, name, argv, stdin, named):
    result = outcomes[name]
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, (result.returncode, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.split("\n") if line.strip()]
    assert 1 <= len(lines) <= 2, err
    assert named in err, err
