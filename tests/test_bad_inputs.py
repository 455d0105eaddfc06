"""Bad input through the real command lines, each in its own process: exit status 2, at most
two lines on stderr, no traceback, and the bad value named. The processes run two at a time, each
forked from a process that imported torch once (``tests.forkrun``: a fresh interpreter spends most
of its time importing it); each case then checks its own result."""

import dataclasses
import json
import os
import random
import shutil
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from minilm.checkpoints import format as checkpoint
from minilm.checkpoints.loading import load_model
from minilm.config import resolve_config
from minilm.configfile import load_config
from minilm.hf.export import export_model
from minilm.model.gpt import GPT
from minilm.training.loop import train
from tests.conftest import REPO, tiny_overrides
from tests.forkrun import run_python

WORKERS = 2  # commands at a time: each a fork of a process that imported torch once (tests/forkrun.py)


# (name, argv, stdin bytes or None, what stderr must name)
CASES = [
    # --- issue 59: output paths
    (
        "run into its own base",
        ["train.py", "train.init_from={ckpt}", "out_dir={ckpt}", "--overwrite", "--quiet"],
        None,
        "run' is the directory of train.init_from=",
    ),
    (
        "lora run into its own base",
        ["train.py", "train.init_from={ckpt}/ckpt.pt", "out_dir={ckpt}", "train.lora.r=4", "--overwrite", "--quiet"],
        None,
        "/run/ckpt.pt'",
    ),
    (
        "figure format checked before a file is set aside",
        ["-m", "minilm", "positions", "plot", "rope", "--out", "{scratch}/mine/notes.txt"],
        None,
        "'txt'",
    ),
    # --- train.py: config values
    ("config missing", ["train.py", "--config", "nosuch.yaml", "--print-config"], None, "nosuch.yaml"),
    ("unknown key", ["train.py", "train.max_step=5", "--print-config"], None, "train.max_step"),
    ("unknown section", ["train.py", "trian.lr=1", "--print-config"], None, "trian"),
    ("lr nan", ["train.py", "train.lr=.nan", "--print-config"], None, "train.lr=nan"),
    ("lr inf", ["train.py", "train.lr=.inf", "--print-config"], None, "train.lr=inf"),
    ("compile not a choice", ["train.py", "train.compile=maybe", "--print-config"], None, "valid: false, true, auto"),
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
    (
        "yarn without factor",
        ["train.py", "model.position={kind: rope, scaling: {type: yarn}}", "--print-config"],
        None,
        "scaling.factor",
    ),
    (
        "learned table too short",
        ["train.py", "model.position={kind: learned, max_positions: 16}", "--print-config"],
        None,
        "model.block_size=256",
    ),
    ("vocab too small", ["train.py", "data.vocab_size=5", "--print-config"], None, "vocab_size=5"),
    ("override without value", ["train.py", "train.max_steps", "--print-config"], None, "train.max_steps"),
    (
        "duplicate section",
        ["train.py", "--config", "{scratch}/twice.yaml", "--print-config"],
        None,
        "'train' appears twice",
    ),
    ("yaml syntax", ["train.py", "--config", "{scratch}/broken.yaml", "--print-config"], None, "line 3, column"),
    ("unknown flag", ["train.py", "--bogus"], None, "--bogus"),
    # --- train.py: files, out_dir, resume, init_from
    ("out_dir is a file", ["train.py", "out_dir=/dev/null", "--quiet"], None, "out_dir='/dev/null'"),
    ("out_dir impossible", ["train.py", "out_dir=/proc/minilm/x", "--quiet"], None, "/proc/minilm/x"),
    (
        "data.dir impossible",
        ["train.py", "data.corpus={corpus}", "data.dir=/proc/minilm/d", "out_dir={scratch}/dd", "--quiet"],
        None,
        "data.dir='/proc/minilm/d'",
    ),
    (
        "corpus missing",
        ["train.py", "data.corpus=/nonexistent/texts", "out_dir={scratch}/cm", "--quiet"],
        None,
        "/nonexistent/texts",
    ),
    ("fresh run over a checkpoint", ["train.py", "out_dir={ckpt}", "--quiet"], None, "--resume"),
    ("resume without checkpoint", ["train.py", "out_dir={scratch}/none", "--resume", "--quiet"], None, "no checkpoint"),
    (
        "init_from missing",
        ["train.py", "train.init_from=/nonexistent/run", "out_dir={scratch}/im", "--quiet"],
        None,
        "/nonexistent/run",
    ),
    (
        "init_from other width",
        [
            "train.py",
            "train.init_from={ckpt}",
            "model.n_layer=2",
            "model.n_head=2",
            "model.d_model=64",
            "out_dir={scratch}/iw",
            "--quiet",
        ],
        None,
        "model.d_model=64",
    ),
    (
        "init_from other kind",
        [
            "train.py",
            "train.init_from={ckpt}",
            "model.n_layer=2",
            "model.n_head=2",
            "model.d_model=32",
            "model.position.kind=alibi",
            "out_dir={scratch}/ik",
            "--quiet",
        ],
        None,
        "'alibi'",
    ),
    # --- generate.py
    ("checkpoint missing", ["generate.py", "--checkpoint", "/nonexistent/ckpt.pt", "hi"], None, "/nonexistent/ckpt.pt"),
    ("checkpoint garbage", ["generate.py", "--checkpoint", "{scratch}/garbage.pt", "hi"], None, "garbage.pt"),
    ("checkpoint unsafe", ["generate.py", "--checkpoint", "{scratch}/unsafe.pt", "hi"], None, "posix.system"),
    ("temperature", ["generate.py", "--checkpoint", "{ckpt}", "--temperature", "-1", "hi"], None, "temperature=-1.0"),
    ("top_p", ["generate.py", "--checkpoint", "{ckpt}", "--top-p", "1.5", "hi"], None, "top_p=1.5"),
    ("top_k", ["generate.py", "--checkpoint", "{ckpt}", "--top-k", "-1", "hi"], None, "top_k=-1"),
    ("min_p", ["generate.py", "--checkpoint", "{ckpt}", "--min-p", "1.5", "hi"], None, "min_p=1.5"),
    (
        "repetition penalty",
        ["generate.py", "--checkpoint", "{ckpt}", "--repetition-penalty", "0", "hi"],
        None,
        "repetition_penalty=0.0",
    ),
    (
        "max new tokens",
        ["generate.py", "--checkpoint", "{ckpt}", "--max-new-tokens", "-1", "hi"],
        None,
        "--max-new-tokens=-1",
    ),
    ("num samples", ["generate.py", "--checkpoint", "{ckpt}", "--num-samples", "0", "hi"], None, "--num-samples=0"),
    ("max context 0", ["generate.py", "--checkpoint", "{ckpt}", "--max-context", "0", "hi"], None, "--max-context=0"),
    ("threads", ["generate.py", "--checkpoint", "{ckpt}", "--threads", "0", "hi"], None, "--threads 0"),
    ("sink tokens", ["generate.py", "--checkpoint", "{ckpt}", "--sink-tokens", "40", "hi"], None, "sink_tokens=40"),
    (
        "huge cache",
        [
            "generate.py",
            "--checkpoint",
            "{ckpt}",
            "--max-context",
            "1000000000",
            "--max-new-tokens",
            "1000000000",
            "hi",
        ],
        None,
        "1,000,000,000 tokens",
    ),
    (
        "prompt file missing",
        ["generate.py", "--checkpoint", "{ckpt}", "--prompt-file", "/nonexistent/p.txt"],
        None,
        "/nonexistent/p.txt",
    ),
    ("prompt argument not utf-8", ["generate.py", "--checkpoint", "{ckpt}", b"caf\xe9"], None, "0xe9"),
    ("prompt stdin not utf-8", ["generate.py", "--checkpoint", "{ckpt}"], b"caf\xe9", "0xe9"),
    (
        "set another kind",
        ["generate.py", "--checkpoint", "{ckpt}", "--set", "model.position.kind=bogus", "hi"],
        None,
        "'bogus'",
    ),
    (
        "set the width",
        ["generate.py", "--checkpoint", "{ckpt}", "--set", "model.d_model=3", "hi"],
        None,
        "model.d_model=3",
    ),
    ("generate device", ["generate.py", "--checkpoint", "{ckpt}", "--device", "tpu", "hi"], None, "'tpu'"),
    ("max new tokens text", ["generate.py", "--checkpoint", "{ckpt}", "--max-new-tokens", "ten", "hi"], None, "'ten'"),
    # --- evaluate.py
    ("stride 0", ["evaluate.py", "{ckpt}", "--mode", "sliding", "--stride", "0", "--quiet"], None, "stride=0"),
    ("stride without sliding", ["evaluate.py", "{ckpt}", "--stride", "4", "--quiet"], None, "stride=4"),
    ("batch tokens 0", ["evaluate.py", "{ckpt}", "--batch-tokens", "0", "--quiet"], None, "batch_tokens=0"),
    ("multiple under one token", ["evaluate.py", "{ckpt}", "--multiples", "0.001", "--quiet"], None, "0.001"),
    ("lengths 0", ["evaluate.py", "{ckpt}", "--lengths", "0", "--quiet"], None, "--lengths='0'"),
    (
        "lengths and multiples",
        ["evaluate.py", "{ckpt}", "--lengths", "16", "--multiples", "2", "--quiet"],
        None,
        "--lengths and --multiples both choose the lengths",
    ),
    ("evaluate mode", ["evaluate.py", "{ckpt}", "--mode", "bogus", "--quiet"], None, "'bogus'"),
    ("csv impossible", ["evaluate.py", "{ckpt}", "--csv", "/proc/minilm/y.csv", "--quiet"], None, "/proc/minilm"),
    ("max tokens negative", ["evaluate.py", "{ckpt}", "--max-tokens", "-5", "--quiet"], None, "max_tokens=-5"),
    ("evaluation override", ["evaluate.py", "{ckpt}", "--set", "model.n_layer=9", "--quiet"], None, "model.n_layer=9"),
    ("scaling type", ["evaluate.py", "{ckpt}", "--position.scaling.type=bogus", "--quiet"], None, "'bogus'"),
    ("too long", ["evaluate.py", "{ckpt}", "--lengths", "10000000", "--quiet"], None, "10000000"),
    # --- passkey
    ("passkey trials", ["-m", "minilm", "passkey", "eval", "{ckpt}", "--trials", "0"], None, "trials=0"),
    (
        "passkey depth",
        ["-m", "minilm", "passkey", "eval", "{ckpt}", "--depths", "2", "--lengths", "100"],
        None,
        "depth=2.0",
    ),
    ("passkey lengths", ["-m", "minilm", "passkey", "eval", "{ckpt}", "--lengths", "x"], None, "'x'"),
    ("passkey missing", ["-m", "minilm", "passkey", "eval", "/nonexistent/run"], None, "/nonexistent/run"),
    ("longeval task", ["-m", "minilm", "longeval", "{ckpt}", "--tasks", "single,needle"], None, "single,needle"),
    ("longeval depths", ["-m", "minilm", "longeval", "{ckpt}", "--depths", "2", "--lengths", "64"], None, "depth=2.0"),
    ("longeval lengths", ["-m", "minilm", "longeval", "{ckpt}", "--lengths", "x"], None, "'x'"),
    ("longeval empty length", ["-m", "minilm", "longeval", "{ckpt}", "--lengths", "32,,64"], None, "none empty"),
    (
        "passkey depth twice",
        ["-m", "minilm", "passkey", "eval", "{ckpt}", "--depths", "0.5,0,0.5"],
        None,
        "repeats 0.5",
    ),
    ("evaluate length twice", ["evaluate.py", "{ckpt}", "--lengths", "16,32,16", "--quiet"], None, "repeats 16"),
    ("stream stride 0", ["evaluate.py", "{ckpt}", "--stream", "--stride", "0", "--quiet"], None, "leave out --lengths"),
    ("stream tokens alone", ["evaluate.py", "{ckpt}", "--stream-tokens", "0", "--quiet"], None, "options of --stream"),
    (
        "longeval items",
        ["-m", "minilm", "longeval", "{ckpt}", "--tasks", "multiquery", "--items", "1"],
        None,
        "items=1",
    ),
    (
        "passkey too short",
        ["-m", "minilm", "passkey", "make-corpus", "{scratch}/pk", "--checkpoint", "{ckpt}", "--length", "5"],
        None,
        "length=5",
    ),
    (
        "passkey mix",
        [
            "-m",
            "minilm",
            "passkey",
            "make-corpus",
            "{scratch}/pk2",
            "--checkpoint",
            "{ckpt}",
            "--length",
            "120",
            "--mix",
            "1.0",
        ],
        None,
        "mix=1.0",
    ),
    # --- experiment, positions, the dispatcher
    (
        "experiment section",
        ["-m", "minilm", "experiment", "length-generalization", "--quick", "modle.d_model=3"],
        None,
        "'modle'",
    ),
    (
        "experiment heads",
        ["-m", "minilm", "experiment", "length-generalization", "--quick", "model.n_head=3"],
        None,
        "model.n_head=3",
    ),
    (
        "experiment lr",
        ["-m", "minilm", "experiment", "length-generalization", "--quick", "train.lr=.nan"],
        None,
        "train.lr=nan",
    ),
    ("experiment name", ["-m", "minilm", "experiment", "bogus"], None, "'bogus'"),
    ("positions kind", ["-m", "minilm", "positions", "plot", "ropee", "--out", "{scratch}/x.png"], None, "'ropee'"),
    (
        "positions option",
        ["-m", "minilm", "positions", "plot", "rope", "--base", "-1", "--out", "{scratch}/x.png"],
        None,
        "base=-1",
    ),
    ("positions command", ["-m", "minilm", "positions", "bogus"], None, "'bogus'"),
    ("command", ["-m", "minilm", "bogus"], None, "'bogus'"),
    # --- nothing silently wrong: a setting that contradicts the source, or cannot take effect
    (
        "init_from kind by config",
        [
            "train.py",
            "--config",
            "rope.yaml",
            "train.init_from={alibi}",
            "data.corpus={corpus}",
            "data.dir={scratch}/d1",
            "out_dir={scratch}/ik2",
        ],
        None,
        "'alibi' positions, not 'rope'",
    ),
    (
        "init_from layers",
        ["train.py", "train.init_from={ckpt}", "model.n_layer=3", "out_dir={scratch}/il"],
        None,
        "model.n_layer=3",
    ),
    (
        "init_from embedding scale",
        ["train.py", "train.init_from={ckpt}", "model.embedding_scale=2.0", "out_dir={scratch}/ie"],
        None,
        "model.embedding_scale=2.0",
    ),
    ("resume and overwrite", ["train.py", "out_dir={scratch}/ro", "--resume", "--overwrite"], None, "--resume"),
    (
        "evaluate factor without type",
        ["evaluate.py", "{ckpt}", "--position.scaling.factor=4", "--quiet"],
        None,
        "scaling.factor=4",
    ),
    (
        "generate factor without type",
        ["generate.py", "--checkpoint", "{ckpt}", "--set", "model.position.scaling.factor=4", "hi"],
        None,
        "scaling.factor=4",
    ),
    (
        "generate set without value",
        ["generate.py", "--checkpoint", "{ckpt}", "--set", "model.position.kind", "hi"],
        None,
        "model.position.kind=VALUE",
    ),
    (
        "evaluate set without value",
        ["evaluate.py", "{ckpt}", "--set", "model.block_size", "--quiet"],
        None,
        "model.block_size=VALUE",
    ),
    (
        "train override without value",
        ["train.py", "model.position.kind", "--print-config"],
        None,
        "model.position.kind=VALUE",
    ),
    # --- sizes checked against what they imply, before the work
    (
        "generate a hundred million samples",
        ["generate.py", "--checkpoint", "{ckpt}", "--num-samples", "100000000", "hi"],
        None,
        "100000000 sample(s)",
    ),
    (
        "passkey a hundred million tokens",
        ["-m", "minilm", "passkey", "eval", "{ckpt}", "--lengths", "100000000"],
        None,
        "100,000,000",
    ),
    (
        "make-corpus without end",
        [
            "-m",
            "minilm",
            "passkey",
            "make-corpus",
            "{scratch}/pk3",
            "--checkpoint",
            "{ckpt}",
            "--length",
            "120",
            "--n",
            "100000000000",
        ],
        None,
        "n=100,000,000,000",
    ),
    (
        "plot a huge block",
        ["-m", "minilm", "positions", "plot", "rope", "--block-size", "100000000", "--out", "{scratch}/b.png"],
        None,
        "--block-size='100000000'",
    ),
    (
        "plot a huge width",
        ["-m", "minilm", "positions", "plot", "rope", "--d-model", "10000000", "--out", "{scratch}/w.png"],
        None,
        "--d-model='10000000'",
    ),
    (
        "plot many heads",
        ["-m", "minilm", "positions", "plot", "alibi", "--n-head", "100000", "--out", "{scratch}/h.png"],
        None,
        "--n-head='100000'",
    ),
    # --- issue 59: values checked where they enter
    ("longeval seed past 64 bits", ["-m", "minilm", "longeval", "{ckpt}", "--seed", str(2**64)], None, "a seed"),
    ("threads past the CPUs", ["generate.py", "--checkpoint", "{ckpt}", "--threads", "10000000", "hi"], None, "1 to"),
    ("lora targets without r", ["train.py", "train.lora.targets=[q]", "--print-config"], None, "without adapters"),
    ("sinks without stream", ["evaluate.py", "{ckpt}", "--sink-tokens", "8"], None, "options of --stream"),
    ("memory of a missing source", ["-m", "minilm", "memory", "train.init_from={scratch}/gone"], None, "gone"),
    # --- tracebacks and misleading messages before
    (
        "generate seed of 31 digits",
        ["generate.py", "--checkpoint", "{ckpt}", "--seed", "1234567890123456789012345678901", "hi"],
        None,
        "'1234567890123456789012345678901' is invalid: expected a seed",
    ),
    (
        "train seed of 31 digits",
        ["train.py", "seed=1234567890123456789012345678901", "--print-config"],
        None,
        "seed=1234567890123456789012345678901",
    ),
    ("train seed negative", ["train.py", "seed=-1", "--print-config"], None, "seed=-1"),
    (
        "checkpoint random bytes",
        ["generate.py", "--checkpoint", "{scratch}/random.pt", "hi"],
        None,
        "not a file that torch.save wrote",
    ),
    ("checkpoint truncated", ["generate.py", "--checkpoint", "{scratch}/truncated.pt", "hi"], None, "truncated"),
    (
        "checkpoint bytes flipped",
        ["generate.py", "--checkpoint", "{scratch}/flipped.pt", "hi"],
        None,
        "fails its checksum",
    ),
    (
        "resume from flipped bytes",
        ["train.py", "out_dir={scratch}/flipped_run", "--resume", "--quiet"],
        None,
        "fails its checksum",
    ),
    ("checkpoint nan weights", ["generate.py", "--checkpoint", "{scratch}/nan.pt", "hi"], None, "NaN or infinite"),
    ("evaluate inf weight", ["evaluate.py", "{scratch}/inf.pt", "--quiet"], None, "NaN or infinite"),
    (
        "checkpoint int64 weights",
        ["generate.py", "--checkpoint", "{scratch}/int64.pt", "hi"],
        None,
        "as int64: expected floating point",
    ),
    (
        "checkpoint config a string",
        ["generate.py", "--checkpoint", "{scratch}/config_text.pt", "hi"],
        None,
        "its config holds no model section (got str)",
    ),
    (
        "checkpoint config without model",
        ["-m", "minilm", "export", "{scratch}/config_nomodel.pt", "{scratch}/ex3"],
        None,
        "its config holds no model section (got dict)",
    ),
    ("evaluate random bytes", ["evaluate.py", "{scratch}/random.pt", "--quiet"], None, "random.pt"),
    ("passkey truncated", ["-m", "minilm", "passkey", "eval", "{scratch}/truncated.pt"], None, "truncated.pt"),
    ("export truncated", ["-m", "minilm", "export", "{scratch}/truncated.pt", "{scratch}/ex1"], None, "truncated.pt"),
    (
        "hf weights truncated",
        ["generate.py", "--checkpoint", "{scratch}/hf_truncated", "hi"],
        None,
        "model.safetensors",
    ),
    ("hf vocab_size text", ["generate.py", "--checkpoint", "{scratch}/hf_lots", "hi"], None, "vocab_size='lots'"),
    ("hf layers missing", ["evaluate.py", "{scratch}/hf_nolayers", "--quiet"], None, "num_hidden_layers"),
    (
        "positions option then flag",
        ["-m", "minilm", "positions", "plot", "rope", "--base", "--out", "q.png"],
        None,
        "--base needs a value",
    ),
    ("moved corpus", ["evaluate.py", "{moved}", "--quiet"], None, "give its new place as data.corpus=NEW"),
    # --- nothing the user made is overwritten or half-written
    ("export into a used directory", ["-m", "minilm", "export", "{ckpt}", "{scratch}/mine"], None, "not empty"),
    (
        "make-corpus into a used directory",
        [
            "-m",
            "minilm",
            "passkey",
            "make-corpus",
            "{scratch}/mine",
            "--checkpoint",
            "{ckpt}",
            "--length",
            "120",
            "--n",
            "3",
        ],
        None,
        "--overwrite",
    ),
    (
        "make-corpus onto a file",
        [
            "-m",
            "minilm",
            "passkey",
            "make-corpus",
            "{scratch}/mine/notes.txt",
            "--checkpoint",
            "{ckpt}",
            "--length",
            "120",
            "--n",
            "3",
        ],
        None,
        "notes.txt",
    ),
    ("export under a file", ["-m", "minilm", "export", "{ckpt}", "{scratch}/mine/notes.txt/hf"], None, "notes.txt"),
    ("csv onto a directory", ["evaluate.py", "{ckpt}", "--csv", "{scratch}/mine", "--quiet"], None, "mine"),
    ("plot format", ["evaluate.py", "{ckpt}", "--plot", "{scratch}/p.bmpx", "--quiet"], None, "'bmpx'"),
    (
        "attention map impossible",
        [
            "generate.py",
            "--checkpoint",
            "{ckpt}",
            "--attention-map",
            "/proc/minilm/a.png",
            "--max-new-tokens",
            "2",
            "hi",
        ],
        None,
        "/proc/minilm",
    ),
    # --- config choices and bounds from the fields themselves
    ("norm choice", ["train.py", "model.norm=batchnorm", "--print-config"], None, "model.norm='batchnorm'"),
    ("mlp choice", ["train.py", "model.mlp=relu", "--print-config"], None, "model.mlp='relu'"),
    ("optimizer choice", ["train.py", "train.optimizer=sgd", "--print-config"], None, "train.optimizer='sgd'"),
    (
        "embedding scale negative",
        ["train.py", "model.embedding_scale=-1", "--print-config"],
        None,
        "model.embedding_scale=-1",
    ),
    ("kv heads not a divisor", ["train.py", "model.n_kv_head=3", "--print-config"], None, "model.n_kv_head=3"),
    ("muon scale zero", ["train.py", "train.muon_lr_scale=0", "--print-config"], None, "train.muon_lr_scale=0"),
    (
        "snapshot past the run",
        ["train.py", "train.snapshot_steps=[99999]", "--print-config"],
        None,
        "train.snapshot_steps=[99999]",
    ),
    ("vocab too large", ["train.py", "data.vocab_size=4294967297", "--print-config"], None, "vocab_size=4294967297"),
    (
        "overrides around a flag",
        ["train.py", "train.max_steps=5", "--print-config", "model.n_head=5"],
        None,
        "model.n_head=5",
    ),
    (
        "experiment over an earlier one",
        ["-m", "minilm", "experiment", "length-generalization", "--quick", "--out", "{scratch}/study"],
        None,
        "--overwrite",
    ),
    # --- hostile YAML: measured before it is built
    ("yaml alias bomb", ["train.py", "--config", "{scratch}/bomb.yaml", "--print-config"], None, "alias bomb"),
    (
        "yaml recursive alias",
        ["train.py", "model.position=&a {kind: rope, x: *a}", "--print-config"],
        None,
        "recursive alias",
    ),
    (
        "yaml nested 5000 deep",
        ["train.py", "--config", "{scratch}/deep.yaml", "--print-config"],
        None,
        "nested deeper than 100",
    ),
    (
        "yaml list of 50,000 loggers",
        ["train.py", "--config", "{scratch}/loggers.yaml", "--print-config"],
        None,
        "characters) is invalid",
    ),
    (
        "max_steps of 401 digits",
        ["train.py", "--config", "{scratch}/huge.yaml", "--print-config"],
        None,
        "(401 characters)",
    ),
    # --- sizes bounded before anything is allocated
    ("a million wide", ["train.py", "model.d_model=1000000", "--print-config"], None, "model.d_model=1000000"),
    ("a hundred thousand layers", ["train.py", "model.n_layer=100000", "--print-config"], None, "model.n_layer=100000"),
    (
        "memory of a hundred thousand layers",
        ["-m", "minilm", "memory", "rope.yaml", "model.n_layer=100000"],
        None,
        "model.n_layer=100000",
    ),
    (
        "memory of ALiBi at 16M tokens, too long to count",
        ["-m", "minilm", "memory", "alibi.yaml", "model.block_size=16777216"],
        None,
        "model.block_size=16777216",
    ),
    (
        "a batch of a hundred thousand rows",
        [
            "train.py",
            "data.corpus={corpus}",
            "data.vocab_size=400",
            "data.dir={data}",
            "train.batch_size=100000",
            "out_dir={scratch}/big-batch",
            "--quiet",
        ],
        None,
        "train.batch_size=100000",
    ),
    (
        "new tokens of 24 digits",
        ["generate.py", "--checkpoint", "{ckpt}", "--max-new-tokens", "100000000000000000000000", "hi"],
        None,
        "--max-new-tokens=100000000000000000000000",
    ),
    (
        "passkey ten million tokens",
        ["-m", "minilm", "passkey", "eval", "{ckpt}", "--lengths", "10000000"],
        None,
        "10,000,000",
    ),
    # --- nonsense and the edges of a float, refused where the scheme is built
    ("vocab size by hand", ["train.py", "model.vocab_size=10", "--print-config"], None, "model.vocab_size=10"),
    (
        "original length 0",
        [
            "train.py",
            "model.position={kind: rope, scaling: {type: yarn, factor: 2, original_max_positions: 0}}",
            "--print-config",
        ],
        None,
        "original_max_positions=0",
    ),
    (
        "randomized inside randomized",
        ["train.py", "model.position={kind: randomized, inner: {kind: randomized}}", "--print-config"],
        None,
        "inner={kind: randomized}",
    ),
    (
        "rope base 1e308",
        ["train.py", "model.position={kind: rope, base: 1.0e308}", "--print-config"],
        None,
        "base=1e+308",
    ),
    (
        "dynamic factor 1e300",
        ["train.py", "model.position={kind: rope, scaling: {type: dynamic, factor: 1.0e300}}", "--print-config"],
        None,
        "scaling.factor=1e+300",
    ),
    (
        "xpos gamma 1e30",
        ["train.py", "model.position={kind: xpos, gamma: 1.0e30}", "--print-config"],
        None,
        "gamma=1e+30",
    ),
    (
        "generate with a base of 1e308",
        ["generate.py", "--checkpoint", "{ckpt}", "--set", "model.position.base=1.0e308", "hi"],
        None,
        "base=1e+308",
    ),
    ("evaluate multiples nan", ["evaluate.py", "{ckpt}", "--multiples", "nan", "--quiet"], None, "--multiples='nan'"),
    ("evaluate multiples inf", ["evaluate.py", "{ckpt}", "--multiples", "inf", "--quiet"], None, "--multiples='inf'"),
    (
        "lengths with an empty item",
        ["evaluate.py", "{ckpt}", "--lengths", "32,,64", "--quiet"],
        None,
        "--lengths='32,,64'",
    ),
    ("an empty stop text", ["generate.py", "--checkpoint", "{ckpt}", "--stop", "", "hi"], None, "stop=['']"),
    ("export to an empty name", ["-m", "minilm", "export", "{ckpt}", ""], None, "directory=''"),
    # --- Hugging Face directories whose config and weights disagree
    ("hf yarn without a factor", ["generate.py", "--checkpoint", "{scratch}/hf_yarn", "hi"], None, "needs a factor"),
    (
        "hf heads do not divide the width",
        ["generate.py", "--checkpoint", "{scratch}/hf_heads", "hi"],
        None,
        "describes no model minilm can build",
    ),
    (
        "hf weight of another shape",
        ["generate.py", "--checkpoint", "{scratch}/hf_shape", "hi"],
        None,
        "the config and the weights disagree",
    ),
    ("hf config a list", ["generate.py", "--checkpoint", "{scratch}/hf_list", "hi"], None, "holds a list"),
    ("hf eos a text", ["generate.py", "--checkpoint", "{scratch}/hf_eos_text", "hi"], None, "eos_token_id='x'"),
    (
        "hf eos past the vocabulary",
        ["generate.py", "--checkpoint", "{scratch}/hf_eos_past", "hi"],
        None,
        "eos_token_id=1000000",
    ),
    (
        "hf architectures of another family",
        ["generate.py", "--checkpoint", "{scratch}/hf_arch", "hi"],
        None,
        "contradict model_type='gpt_neox'",
    ),
    # --- out_dir: a name the run writes, holding something else
    (
        "metrics.jsonl is the user's directory",
        [
            "train.py",
            "data.corpus={corpus}",
            "data.vocab_size=400",
            "data.dir={data}",
            "out_dir={scratch}/users",
            "--quiet",
        ],
        None,
        "'metrics.jsonl'",
    ),
    # --- issue 59: foreign and damaged weights
    (
        "hf nan weight",
        ["generate.py", "--checkpoint", "{scratch}/hf_nan", "hi"],
        None,
        "dense_4h_to_h.weight' with NaN",
    ),
    (
        "hf inf weight",
        ["evaluate.py", "{scratch}/hf_inf", "--quiet"],
        None,
        "dense_4h_to_h.weight' with NaN or infinite",
    ),
    (
        "hf int32 weight",
        ["-m", "minilm", "export", "{scratch}/hf_int32", "{scratch}/ex_int32"],
        None,
        "dense_4h_to_h.weight' as int32: expected floating point",
    ),
    (
        "hf index without weight_map",
        ["generate.py", "--checkpoint", "{scratch}/hf_nomap", "hi"],
        None,
        "lacks weight_map",
    ),
    (
        "hf index weight_map a list",
        ["generate.py", "--checkpoint", "{scratch}/hf_maplist", "hi"],
        None,
        "weight_map=['model.safetensors']",
    ),
    (
        "mpt attn_config a list",
        ["generate.py", "--checkpoint", "{scratch}/hf_mpt", "hi"],
        None,
        "attn_config=['alibi']",
    ),
    ("phi3 kv heads 0", ["generate.py", "--checkpoint", "{scratch}/hf_phi3", "hi"], None, "num_key_value_heads=0"),
    (
        "checkpoint without a position",
        ["generate.py", "--checkpoint", "{scratch}/noposition.pt", "hi"],
        None,
        "model section lacks position",
    ),
    ("checkpoint data a string", ["evaluate.py", "{scratch}/data_text.pt", "--quiet"], None, "data section is 'x'"),
    (
        "resume a garbled rng state",
        [
            "train.py",
            "data.corpus={corpus}",
            "data.vocab_size=400",
            "data.dir={data}",
            "out_dir={scratch}/rng_run",
            "--resume",
            "--quiet",
        ],
        None,
        "rng.torch is a uint8 tensor of 100 values",
    ),
    # --- training: a resumed run with no steps left; a layer pattern longer than the model
    (
        "resume a finished run",
        [
            "train.py",
            "data.corpus={corpus}",
            "data.vocab_size=400",
            "data.dir={data}",
            "model.n_layer=2",
            "model.n_head=2",
            "model.d_model=32",
            "model.block_size=32",
            "out_dir={ckpt}",
            "--resume",
            "--quiet",
        ],
        None,
        "at step 2 (the run is finished) and train.max_steps=2 (the checkpoint's: on --resume",
    ),
    (
        "layer pattern longer than the model",
        [
            "train.py",
            "model.n_layer=2",
            "model.layers={pattern: [local, local, local, global], local: {window: 8}, global: {}}",
            "--print-config",
        ],
        None,
        "no layer would be of type global: give model.n_layer >= 4",
    ),
]


def _poisoned_checkpoints(ckpt, scratch):
    """The run's checkpoint with 64 bytes flipped inside its largest weight (also as a run to
    resume), with NaN, inf or int64 weights, and with its config a string or without its model."""
    raw = bytearray((Path(ckpt) / "ckpt.pt").read_bytes())
    with zipfile.ZipFile(Path(ckpt) / "ckpt.pt") as archive:
        biggest = max(archive.infolist(), key=lambda info: info.file_size)
    start = biggest.header_offset + 30 + len(biggest.filename.encode()) + len(biggest.extra) + biggest.file_size // 2
    raw[start : start + 64] = bytes(b ^ 0xFF for b in raw[start : start + 64])
    (scratch / "flipped.pt").write_bytes(bytes(raw))
    shutil.copytree(ckpt, scratch / "flipped_run")
    (scratch / "flipped_run" / "ckpt.pt").write_bytes(bytes(raw))
    state = {k: v for k, v in checkpoint.load(ckpt).items() if k != "path"}
    first = next(iter(state["model"]))
    for name, change in (
        ("nan", lambda w: w * float("nan")),
        ("inf", lambda w: w.clone().index_fill_(0, torch.tensor([0]), float("inf"))),
        ("int64", lambda w: w.to(torch.int64)),
    ):
        torch.save({**state, "model": {**state["model"], first: change(state["model"][first])}}, scratch / f"{name}.pt")
    torch.save({**state, "config": "model: {n_layer: 2}"}, scratch / "config_text.pt")
    torch.save(
        {**state, "config": {k: v for k, v in state["config"].items() if k != "model"}}, scratch / "config_nomodel.pt"
    )
    # issue 59: a config without its position setting or with its data a string; a run whose RNG state is cut short
    model = {k: v for k, v in state["config"]["model"].items() if k != "position"}
    torch.save({**state, "config": {**state["config"], "model": model}}, scratch / "noposition.pt")
    torch.save({**state, "config": {**state["config"], "data": "x"}}, scratch / "data_text.pt")
    shutil.copytree(ckpt, scratch / "rng_run")
    torch.save({**state, "rng": {"torch": state["rng"]["torch"][:100]}}, scratch / "rng_run" / "ckpt.pt")


@pytest.fixture(scope="module")
def outcomes(tiny_corpus, tmp_path_factory):
    """Run every case (a few processes at a time); {name: CompletedProcess}."""
    scratch = tmp_path_factory.mktemp("bad_inputs")
    config = load_config(
        None,
        tiny_overrides(
            tiny_corpus, scratch / "run", "train.max_steps=2", "train.sample_tokens=0", "train.final_eval_tokens=200"
        ),
    )
    ckpt = os.path.dirname(train(resolve_config(config), quiet=True)["checkpoint"])
    (scratch / "twice.yaml").write_text("train:\n  lr: 1.0e-3\ntrain:\n  max_steps: 3\n")
    (scratch / "broken.yaml").write_text("model:\n  n_layer: 2\n   n_head: [\n")
    (scratch / "garbage.pt").write_bytes(b"not a checkpoint" * 10)
    (scratch / "random.pt").write_bytes(random.Random(0).randbytes(3000))
    (scratch / "truncated.pt").write_bytes((Path(ckpt) / "ckpt.pt").read_bytes()[:20000])
    _poisoned_checkpoints(ckpt, scratch)
    _hf_directories(ckpt, scratch)
    _hostile_yaml(scratch)
    (scratch / "users" / "metrics.jsonl").mkdir(parents=True)
    (scratch / "users" / "metrics.jsonl" / "keep.txt").write_text("the user's own\n")
    (scratch / "study").mkdir()
    (scratch / "study" / "study.json").write_text("{}")
    (scratch / "mine").mkdir()
    (scratch / "mine" / "notes.txt").write_text("my own notes\n")
    state = checkpoint.load(ckpt)
    state["config"]["data"]["corpus"] = str(scratch / "moved-away.txt")
    checkpoint.save({k: v for k, v in state.items() if k != "path"}, str(scratch / "moved"))

    class Unsafe:
        def __reduce__(self):
            return (os.system, ("true",))

    torch.save(
        {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "model": Unsafe(), "config": {}, "tokenizer": b""},
        scratch / "unsafe.pt",
    )
    fill = {
        "{ckpt}": ckpt,
        "{scratch}": str(scratch),
        "{corpus}": str(tiny_corpus / "corpus.txt"),
        "{alibi}": os.path.join(REPO, "tests", "fixtures", "main-7334668", "alibi.pt"),
        "{moved}": str(scratch / "moved"),
        "{data}": str(tiny_corpus / "data"),
    }

    def expand(arg):
        if isinstance(arg, bytes):
            return arg
        for key, value in fill.items():
            arg = arg.replace(key, value)
        return arg

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}

    def run(case):
        name, argv, stdin, _ = case
        return name, run_python(list(map(expand, argv)), cwd=REPO, env=env, input=stdin, timeout=300, text=False)

    before = tree_state(scratch)
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        results = dict(pool.map(run, CASES))
    return results, before, tree_state(scratch)


def tree_state(root) -> dict:
    """{path: (size, mtime)} of every file under ``root``, and the directories' names: what a user
    would find changed (a run's .lock, rewritten by each claim, is bookkeeping)."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else "dir"
        for p in Path(root).rglob("*")
        if p.name != ".lock"
    }


def _hf_directories(ckpt, scratch) -> None:
    """A Hugging Face directory exported from the run, and three damaged copies: its weights cut
    short, a vocab_size that is text, a config without its layer count."""
    pytest.importorskip("safetensors")
    model, tokenizer, config, _ = load_model(ckpt)
    export_model(model, tokenizer, config, str(scratch / "hf"))
    for name in (
        "hf_truncated",
        "hf_lots",
        "hf_nolayers",
        "hf_yarn",
        "hf_heads",
        "hf_shape",
        "hf_list",
        "hf_eos_text",
        "hf_eos_past",
        "hf_arch",
    ):
        shutil.copytree(scratch / "hf", scratch / name)
    weights = scratch / "hf_truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    for name, change in (
        ("hf_lots", {"vocab_size": "lots"}),
        ("hf_nolayers", {"num_hidden_layers": None}),
        ("hf_yarn", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}}),
        ("hf_heads", {"num_attention_heads": 3}),
        ("hf_shape", {"intermediate_size": 48}),
        ("hf_eos_text", {"eos_token_id": "x"}),
        ("hf_eos_past", {"eos_token_id": 10**6}),
        ("hf_arch", {"architectures": ["GPT2LMHeadModel"]}),
    ):
        path = scratch / name / "config.json"
        hf = {**json.loads(path.read_text()), **change}
        path.write_text(json.dumps({k: v for k, v in hf.items() if v is not None}))
    (scratch / "hf_list" / "config.json").write_text("[1, 2, 3]")
    _damaged_hf_weights(scratch, model, tokenizer, config)


def _damaged_hf_weights(scratch, model, tokenizer, config) -> None:
    """Issue 59: the exported directory with a NaN, an inf or an int32 weight, with a sharded index
    without its weight_map or with a list for it; a Phi-3 export with num_key_value_heads 0 and an MPT
    export with attn_config a list."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(scratch / "hf" / "model.safetensors")
    target = "gpt_neox.layers.0.mlp.dense_4h_to_h.weight"
    for name, change in (
        ("hf_nan", lambda w: w * float("nan")),
        ("hf_inf", lambda w: w.clone().index_fill_(0, torch.tensor([0]), float("inf"))),
        ("hf_int32", lambda w: (w * 100).to(torch.int32)),
    ):
        shutil.copytree(scratch / "hf", scratch / name)
        save_file({**tensors, target: change(tensors[target])}, scratch / name / "model.safetensors")
    for name, index in (("hf_nomap", {"metadata": {}}), ("hf_maplist", {"weight_map": ["model.safetensors"]})):
        shutil.copytree(scratch / "hf", scratch / name)
        (scratch / name / "model.safetensors.index.json").write_text(json.dumps(index))
    for name, family, settings, change in (
        ("hf_phi3", "phi3", dict(position={"kind": "rope"}, norm="rmsnorm", mlp="swiglu"), {"num_key_value_heads": 0}),
        ("hf_mpt", "mpt", dict(position={"kind": "alibi"}, mlp="gelu"), {"attn_config": ["alibi"]}),
    ):
        m = dataclasses.replace(config.model, bias=False, **settings)
        export_model(GPT(m), tokenizer, dataclasses.replace(config, model=m), str(scratch / name), family=family)
        path = scratch / name / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


def _hostile_yaml(scratch) -> None:
    """A billion-laughs file, 5,000 nested lists, a list of 50,000 names and a 401-digit count."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    (scratch / "bomb.yaml").write_text("\n".join(lines) + "\n")
    (scratch / "deep.yaml").write_text("train:\n  loggers: " + "[" * 5000 + "]" * 5000 + "\n")
    (scratch / "loggers.yaml").write_text("train:\n  loggers: [" + ", ".join(["jsonl"] * 50000) + "]\n")
    (scratch / "huge.yaml").write_text("train:\n  max_steps: 1" + "0" * 400 + "\n")


def test_there_are_at_least_a_hundred_and_twenty_cases():
    assert len(CASES) >= 120 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.slow
def test_a_refused_command_changes_nothing_on_disk(outcomes):
    _, before, after = outcomes
    assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("name, argv, stdin, named", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line(outcomes, name, argv, stdin, named):
    result = outcomes[0][name]
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, (result.returncode, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.split("\n") if line.strip()]
    assert 1 <= len(lines) <= 2, err
    assert named in err, err
