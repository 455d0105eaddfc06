"""``MINILM_SMOKE=1``: every command that trains runs as a smoke test, in seconds. ``minilm train``
trains a model of one layer x 32 (from ``train.init_from``, the source's architecture, whatever the
config says) for 3 steps at 64 tokens on a 512-token vocabulary, and evaluates and samples briefly;
``minilm experiment`` runs its ``--quick`` plan; ``longeval`` and ``passkey eval`` ask 2 probes per
cell. Everything else (the corpus, the config's position scheme, out_dir, the other commands) is as
given, so a walk through the manual runs end to end quickly: tests/test_docs.py runs every command
of README.md and docs/ this way. The command says so on stderr; the results are a smoke test's,
not the config's."""

import os
import sys

import yaml

from minilm.checkpoints.loading import read_checkpoint
from minilm.config import ConfigError
from minilm.hf.reading import is_hf_source, read_model_tree
from minilm.training.extend import architecture_overrides
from minilm.yamlfile import parse_yaml

SWITCH = "MINILM_SMOKE"
STEPS = 3
PROBES = 2  # per cell of longeval and passkey eval
TRAINING = (
    f"train.max_steps={STEPS}",
    "train.warmup_steps=1",
    f"train.eval_interval={STEPS}",
    "train.eval_iters=1",
    f"train.checkpoint_interval={STEPS}",
    "train.final_eval_tokens=2000",
    "train.sample_tokens=16",
    "train.batch_size=2",
    "train.grad_accum=1",
    "train.snapshot_steps=[]",
)
SCRATCH = (  # only for a model built from scratch: an init_from source keeps its own
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "model.n_kv_head=null",
    "model.head_dim=null",
    "model.d_ff=64",
    "model.block_size=64",
    "data.vocab_size=512",
)


def active() -> bool:
    """The switch read as a config's boolean is (``minilm.yamlfile``: true/false, yes/no, on/off in
    any case), or 1 / 0; unset, empty or blank is off; anything else is refused in one line."""
    text = os.environ.get(SWITCH, "")
    try:
        value = parse_yaml(text) if text.strip() else False
    except yaml.YAMLError:
        value = None
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise ConfigError(
        f"{SWITCH}={text!r} is invalid: expected 1, true, yes or on (a smoke run), or 0, false, no, off or unset"
    )


def training_overrides(init_from) -> list:
    """The overrides a smoke run appends after the user's (empty unless the switch is on). From
    ``init_from`` the architecture is the source's, whatever the config file says of it."""
    if not active():
        return []
    print(
        f"[{SWITCH}] a smoke run: {STEPS} steps"
        + (f" from {init_from}" if init_from else ", a model of 1 layer x 32 at 64 tokens, vocabulary 512")
        + f"; unset {SWITCH} for the real job",
        file=sys.stderr,
    )
    return list(TRAINING) + (source_architecture(init_from) if init_from else list(SCRATCH))


def source_architecture(path: str) -> list:
    """Overrides that set each architecture key to what the model at ``path`` has."""
    tree = read_model_tree(path)[2] if is_hf_source(path) else read_checkpoint(path)["config"]["model"]
    return architecture_overrides(tree)


def quick(asked: bool) -> bool:
    """Whether an experiment runs its --quick plan: asked for, or a smoke run."""
    if active() and not asked:
        print(f"[{SWITCH}] a smoke run: the --quick plan; unset {SWITCH} for the real one", file=sys.stderr)
    return asked or active()


def trials(asked: int) -> int:
    """Probes per cell of a retrieval evaluation: as asked, or at most 2 in a smoke run."""
    if active() and asked > PROBES:
        print(f"[{SWITCH}] a smoke run: {PROBES} probes per cell; unset {SWITCH} for the real count", file=sys.stderr)
        return PROBES
    return asked
