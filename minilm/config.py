"""Configuration: dataclasses for model / data / train and their checks (``minilm.configfile``
reads them from YAML files and dotted overrides).

A run is one YAML file with the sections ``model`` (including ``model.position``), ``data`` and
``train`` plus the top-level ``out_dir``, ``seed`` and ``data_seed``. Overrides such as
``train.max_steps=200`` are applied on top, parsed as YAML. Every mistake is a one-line
``ConfigError`` that names the key and the closest valid names."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import yaml

from minilm.common import MinilmError, Range, check_number, shown, suggest
from minilm.data.tokenizer import TokenizerError, check_vocab_size
from minilm.positions import PositionError, canonical, validate
from minilm.positions.layers import check_types, layer_types

EMBEDDING_SCALE_NAMES = ("auto", "sqrt_d_model")  # model.embedding_scale, beside a number
LOGGERS = ("jsonl", "csv", "tensorboard", "wandb")  # train.loggers (minilm.training.loggers)


class ConfigError(MinilmError):
    """A bad configuration value; the message is one line meant for the user."""


ARCHITECTURE = "architecture"  # fixed by the weights: an extended model keeps the source's
AFTER_TRAINING = "after_training"  # may change when a trained model is loaded (evaluation, fine-tuning)
TRAJECTORY = "trajectory"  # changes what the remaining steps of a resumed run compute


def option(
    default=dataclasses.MISSING,
    *,
    factory=dataclasses.MISSING,
    role: Optional[str] = None,
    choices: tuple = (),
    help: str = "",
    valid: Optional[Range] = None,
):
    """A config field with what the code and its user need to know of it, kept beside its
    default: its ``role`` (ARCHITECTURE, AFTER_TRAINING, TRAJECTORY), its valid ``choices`` or, for
    a number, the ``Range`` it takes (``check_fields`` checks both), and a one-line ``help`` (what
    ``minilm train --help`` and the manual's config reference list: ``config_keys``)."""
    metadata = {"role": role, "choices": choices, "help": help, "valid": valid}
    return field(default=default, default_factory=factory, metadata=metadata)


def fields_with(cls, role: str) -> tuple:
    """The names of ``cls``'s fields that have ``role``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("role") == role)


def check_fields(obj, section: str) -> None:
    """A ConfigError for the first field of ``obj`` whose value is not among its ``choices`` or not
    in its ``Range`` (``option``), named ``section.field``."""
    for f in dataclasses.fields(obj):
        choices, value, valid = f.metadata.get("choices"), getattr(obj, f.name), f.metadata.get("valid")
        if choices and value not in choices and not (f.name == "device" and str(value).startswith("cuda:")):
            raise ConfigError(f"{section}.{f.name}={shown(value)} is invalid: valid: {', '.join(spelled(choices))}")
        if valid is not None:
            check_number(f"{section}.{f.name}" if section else f.name, value, valid, ConfigError)


def spelled(choices: tuple) -> tuple:
    """An option's ``choices`` as YAML writes them (true and false, not True and False)."""
    return tuple(str(choice).lower() if isinstance(choice, bool) else choice for choice in choices)


SEEDS = "an integer from 0 to 2**63 - 1"
RETRIEVAL_WEIGHT = "a number from 0 to 1e4, 0 without train.retrieval_share"
MIN_DOCUMENT_TOKENS = "0 (off) or a number of tokens, with data.end_of_text=true (documents must be marked)"
MAX_COUNT = 10**12  # steps, rows, tokens a train setting counts; below, each model size's largest (memory: at build)
MODEL_SIZES = {
    "vocab_size": 2**24,
    "n_layer": 1024,
    "n_head": 1024,
    "d_model": 65536,
    "block_size": 2**24,
    "d_ff": 2**20,
    "head_dim": 4096,
}


GATED_MLPS = ("swiglu", "geglu_tanh")  # model.mlp kinds whose first linear holds [gate; up]
SUBLAYER_NORMS = ("pre", "sandwich", "post")  # model.sublayer_norms: a norm before each sublayer, after it, or both


@dataclass
class ModelConfig:
    """The model's shape and layout (``model.*``): sizes, the position scheme (and per layer,
    ``layers``), norms, MLP, attention options. Each field's ``option`` says its role, its valid
    values and a line of help; ``__post_init__`` checks them and what they must agree on."""

    vocab_size: int = option(
        4096,
        help="set from the tokenizer (data.vocab_size); not given by hand",
        valid=Range(1, MODEL_SIZES["vocab_size"], integer=True),
    )
    n_layer: int = option(
        4, role=ARCHITECTURE, help="transformer blocks", valid=Range(1, MODEL_SIZES["n_layer"], integer=True)
    )
    n_head: int = option(
        4,
        role=ARCHITECTURE,
        help="attention heads (a divisor of d_model unless head_dim is given)",
        valid=Range(1, MODEL_SIZES["n_head"], integer=True),
    )
    d_model: int = option(
        256,
        role=ARCHITECTURE,
        help="width of the residual stream",
        valid=Range(1, MODEL_SIZES["d_model"], integer=True),
    )
    block_size: int = option(
        256,
        role=AFTER_TRAINING,
        help="the training length in tokens; extension changes it",
        valid=Range(1, MODEL_SIZES["block_size"], integer=True),
    )
    d_ff: Optional[int] = option(
        None, role=ARCHITECTURE, help="MLP width (null: 4 x d_model)", valid=Range(1, MODEL_SIZES["d_ff"], integer=True)
    )
    head_dim: Optional[int] = option(
        None,
        role=ARCHITECTURE,
        help="each attention head's width (null: d_model / n_head; Qwen3 sets it apart, e.g. 16 heads x 128 on 1024)",
        valid=Range(1, MODEL_SIZES["head_dim"], integer=True, optional=True),
    )
    dropout: float = option(
        0.0,
        role=AFTER_TRAINING,
        help="dropout on embeddings, attention and residuals",
        valid=Range(0, 1, high_open=True),
    )
    bias: bool = option(False, role=ARCHITECTURE, help="biases in every linear layer and LayerNorm")
    position: dict = option(
        factory=lambda: {"kind": "rope"},
        role=AFTER_TRAINING,
        help="the position scheme: {kind: ..., options} (minilm positions list); options given without a kind "
        "apply to this default (model.position.scaling.type=yarn: rope with yarn)",
    )
    layers: Optional[dict] = option(
        None,
        role=ARCHITECTURE,
        help="positions per layer: {pattern: [local, global], local: {window: 128}, global: {position: {kind: "
        "none}}}, the pattern repeated over n_layer; a type sets position, window, chunk, sinks: learned, softcap, "
        "query_scale {beta, floor, offset} (null: every layer model.position; docs/concepts/layers.md)",
    )
    embedding_scale: Union[float, str] = option(
        "auto",
        role=ARCHITECTURE,
        help="token embedding multiplier before positions are added: auto (sqrt(d_model) "
        "for sinusoidal, else 1), sqrt_d_model, or a number",
    )
    embedding_init_std: float = option(
        0.02,
        role=TRAJECTORY,
        help="std of the token embedding's initial weights (GPT-2: 0.02; fairseq, with "
        "embedding_scale sqrt_d_model: d_model^-0.5)",
        valid=Range(0, low_open=True),
    )
    concat_position_dims: int = option(
        0,
        role=ARCHITECTURE,
        help="0: positions added to the token embedding; N: an N-dim position encoding "
        "concatenated after a (d_model - N)-dim token embedding (same width)",
    )
    # architecture options (the defaults are the original minilm GPT; see minilm.model.gpt)
    parallel_residual: bool = option(False, role=ARCHITECTURE, help="x + attn(ln_1(x)) + mlp(ln_2(x)) (GPT-NeoX)")
    tie_embeddings: bool = option(True, role=ARCHITECTURE, help="the LM head is the token embedding (false: its own)")
    norm: str = option("layernorm", role=ARCHITECTURE, choices=("layernorm", "rmsnorm"), help="every norm's kind")
    norm_eps: float = option(
        1e-5, role=ARCHITECTURE, help="the norms' epsilon", valid=Range(0, 1, low_open=True, high_open=True)
    )
    mlp: str = option(
        "gelu",
        role=ARCHITECTURE,
        choices=("gelu", "gelu_tanh", "swiglu", "geglu_tanh", "relu2"),
        help="gelu_tanh is GPT-2's gelu_new; swiglu as Llama; geglu_tanh: gelu_tanh(gate) * up (Gemma); "
        "relu2: relu(x)^2 (Primer)",
    )
    n_kv_head: Optional[int] = option(
        None, role=ARCHITECTURE, help="key/value heads, grouped-query attention (null: n_head)"
    )
    qkv_bias: bool = option(False, role=ARCHITECTURE, help="a bias on the q/k/v projection only (Qwen2)")
    qk_norm: bool = option(False, role=ARCHITECTURE, help="RMSNorm on each head's q and k before positions (Qwen3)")
    qk_norm_span: str = option(
        "head",
        role=ARCHITECTURE,
        choices=("head", "projection"),
        help="what qk_norm normalises over: each head's dims (Qwen3, Gemma 3) or all heads' at once (OLMo 2/3)",
    )
    sublayer_norms: str = option(
        "pre",
        role=ARCHITECTURE,
        choices=SUBLAYER_NORMS,
        help="where each sublayer's norms sit: pre (on its input), sandwich (on its input and on its output "
        "before the residual add: Gemma 2/3), post (on its output only: OLMo 2, EXAONE 4)",
    )
    value_embeddings: bool = option(
        False,
        role=ARCHITECTURE,
        help="token embeddings added to every layer's "
        "values, a table per pair of layers j and n_layer-1-j (modded-nanogpt)",
    )
    logit_softcap: float = option(
        0.0,
        role=ARCHITECTURE,
        help="0: none; c > 0: logits c * tanh(z / c) (Gemma 2)",
        valid=Range(0, text="0 (no cap) or a number > 0"),
    )

    def __post_init__(self):
        if self.d_ff is None and isinstance(self.d_model, int):
            self.d_ff = 4 * self.d_model
        check_fields(self, "model")
        if self.head_dim is None and self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_head={self.n_head}: choose "
                f"n_head among {[h for h in range(1, self.d_model + 1) if self.d_model % h == 0][:12]} "
                f"or give model.head_dim"
            )
        self.head_dim = self.head_dim or self.d_model // self.n_head
        scale, named = self.embedding_scale, EMBEDDING_SCALE_NAMES
        if scale not in named and (isinstance(scale, str) or not scale > 0 or not math.isfinite(scale)):
            raise ConfigError(
                f"model.embedding_scale={shown(scale)} is invalid: expected {' or '.join(named)} or a number > 0"
            )
        concat = self.concat_position_dims
        if isinstance(concat, bool) or not isinstance(concat, int) or concat % 2 or not 0 <= concat < self.d_model:
            raise ConfigError(
                f"model.concat_position_dims={shown(concat)} is invalid: expected 0 (added) or an even "
                f"number of dimensions below d_model={self.d_model}"
            )
        if concat and self.tie_embeddings:
            raise ConfigError(
                f"model.concat_position_dims={concat} gives the token embedding d_model - {concat} "
                f"dimensions, which an LM head of d_model cannot share: set model.tie_embeddings false"
            )
        self._check_architecture()
        if not isinstance(self.position, dict) or "kind" not in self.position:
            raise ConfigError(f"model.position={shown(self.position)} is invalid: expected a mapping with a 'kind'")
        try:
            self.position = canonical(self.position)  # old option names (interpolated's base) -> current
        except ValueError as exc:
            raise ConfigError(f"model.position: {exc}") from None
        try:
            layer_types(self.layers, self.position, self.n_layer)
        except PositionError as exc:
            raise ConfigError(str(exc)) from None

    def _check_architecture(self):
        for name in ("parallel_residual", "tie_embeddings", "qkv_bias", "qk_norm", "value_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name}={shown(getattr(self, name))} is invalid: expected true or false")
        kv = self.n_kv_head
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.n_head % kv):
            raise ConfigError(
                f"model.n_kv_head={shown(kv)} is invalid: expected a divisor of model.n_head={self.n_head} "
                f"({', '.join(str(h) for h in range(1, self.n_head + 1) if self.n_head % h == 0)}) "
                f"or null (= n_head)"
            )


@dataclass
class DataConfig:
    """The corpus and its preparation (``data.*``): where the text is, the tokenizer's size, the
    documents' marking and the held-out text; checked as ``ModelConfig`` is."""

    corpus: str = option(
        "shakespeare",
        help="shakespeare (embedded), a .txt, .jsonl, .parquet or .arrow file, or a directory of them "
        "(a dataset that datasets saved with save_to_disk among them)",
    )
    vocab_size: int = option(4096, help="sentencepiece BPE vocabulary; model.vocab_size follows it")
    tokenizer: Optional[str] = option(
        None,
        help="a transformers tokenizer directory (tokenizer.json, as save_pretrained writes it) that encodes "
        "the corpus instead of a sentencepiece tokenizer trained on it; data.vocab_size follows it",
    )
    dir: str = option("data", help="where prepared corpora land")
    text_field: str = option("text", help="the field of a .jsonl line or a table's row that holds its document's text")
    end_of_text: bool = option(False, help="the tokenizer's eos id between documents, instead of two blank lines")
    holdout_tokens: int = option(
        0,
        help="the last N tokens of the train split, never sampled for training: text "
        "to choose settings on without the validation split (evaluate --split holdout)",
        valid=Range(0, MAX_COUNT, integer=True, text="0 (none) or a number of tokens"),
    )
    document_mask: str = option(
        "none",
        choices=("none", "mask", "restart"),
        help="mask: attention stops at each eos (needs end_of_text); restart: positions too",
    )
    min_document_tokens: int = option(
        0,
        help="N > 0: train on documents of at least N tokens, a row filled with as "
        "few documents as it can (needs end_of_text); 0: windows of the stream",
        valid=Range(0, MAX_COUNT, integer=True, text=MIN_DOCUMENT_TOKENS),
    )

    def __post_init__(self):
        check_fields(self, "data")
        if self.min_document_tokens and not self.end_of_text:
            raise ConfigError(
                f"data.min_document_tokens={self.min_document_tokens} is invalid: expected {MIN_DOCUMENT_TOKENS}"
            )
        if self.document_mask != "none" and not self.end_of_text:
            raise ConfigError(
                f"data.document_mask={self.document_mask!r} needs documents marked: set "
                f"data.end_of_text=true (or data.document_mask='none')"
            )


LORA_TARGETS = ("q", "k", "v", "o", "mlp")  # minilm.model.lora.adapted_rows maps them
LORA_ALSO_TRAIN = ("norms", "embeddings", "position", "head")  # minilm.model.lora.trainable_names


@dataclass
class LoRAConfig:
    """Low-rank adapters (``train.lora.*``): the rank (0: off), the scale, the adapted linears and
    what else trains beside them."""

    r: int = option(
        0,
        role=TRAJECTORY,
        help="low-rank adapters of this rank on the targets, everything else frozen "
        "but also_train (0: no LoRA, every weight trains); needs train.init_from",
        valid=Range(0, 65536, integer=True, text="an integer from 0 (off) to 65,536"),
    )
    alpha: float = option(
        16.0, role=TRAJECTORY, help="the adapters' output is scaled by alpha / r", valid=Range(0, low_open=True)
    )
    targets: list = option(
        factory=lambda: ["q", "k", "v", "o"],
        role=TRAJECTORY,
        help="the linears that get adapters, any of: q, k, v, o, mlp (every MLP linear)",
    )
    also_train: list = option(
        factory=list,
        role=TRAJECTORY,
        help="trained fully beside the adapters, any of: norms, "
        "embeddings, position, head (LongLoRA: norms, embeddings)",
    )

    def __post_init__(self):
        check_fields(self, "train.lora")
        for key, values, valid in (
            ("targets", self.targets, LORA_TARGETS),
            ("also_train", self.also_train, LORA_ALSO_TRAIN),
        ):
            if (
                not isinstance(values, list)
                or len(set(map(str, values))) != len(values)
                or any(v not in valid for v in values)
                or (key == "targets" and self.r and not values)
            ):
                raise ConfigError(
                    f"train.lora.{key}={shown(values)} is invalid: expected a list of distinct names "
                    f"among {', '.join(valid)}"
                )
        if not self.r:  # settings of adapters that are not there would silently make a full fine-tune
            for f in dataclasses.fields(self):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                if f.name != "r" and getattr(self, f.name) != default:
                    raise ConfigError(
                        f"train.lora.{f.name}={shown(getattr(self, f.name))} has no effect without adapters: "
                        f"set train.lora.r > 0 (a LoRA run), or leave it at {shown(default)} (every weight trains)"
                    )


@dataclass
class TrainConfig:
    """How a run trains (``train.*``): steps, batches, the optimiser and its schedule, evaluation,
    checkpoints, loggers, parallelism, the source to start from; checked as ``ModelConfig`` is."""

    batch_size: int = option(
        32,
        role=TRAJECTORY,
        help="sequences per step (per process under torchrun)",
        valid=Range(1, MAX_COUNT, integer=True),
    )
    grad_accum: int = option(
        1, role=TRAJECTORY, help="micro-batches summed into one step", valid=Range(1, MAX_COUNT, integer=True)
    )
    max_steps: int = option(
        2000, role=TRAJECTORY, help="optimizer steps; the schedule ends there", valid=Range(1, MAX_COUNT, integer=True)
    )
    lr: float = option(1e-3, role=TRAJECTORY, help="peak learning rate, after the warm-up")
    min_lr: float = option(1e-4, role=TRAJECTORY, help="learning rate at the end of the schedule")
    warmup_steps: int = option(
        100, role=TRAJECTORY, help="linear warm-up steps", valid=Range(0, MAX_COUNT, integer=True)
    )
    schedule: str = option(
        "cosine",
        role=TRAJECTORY,
        choices=("cosine", "wsd"),
        help="after the warm-up: cosine down to min_lr, or wsd: lr held, then linear down to min_lr",
    )
    cooldown: float = option(
        0.4,
        role=TRAJECTORY,
        help="with schedule wsd: the last fraction of max_steps, where lr falls",
        valid=Range(0, 1, low_open=True, text="a fraction of max_steps, 0 < cooldown <= 1"),
    )
    weight_decay: float = option(
        0.1,
        role=TRAJECTORY,
        help="decoupled weight decay on the weight matrices, AdamW and Muon (0 disables)",
        valid=Range(0, note=" (0 disables)"),
    )
    beta1: float = option(0.9, role=TRAJECTORY, help="AdamW beta1", valid=Range(0, 1, high_open=True))
    beta2: float = option(0.95, role=TRAJECTORY, help="AdamW beta2", valid=Range(0, 1, high_open=True))
    optimizer: str = option(
        "adamw",
        role=TRAJECTORY,
        choices=("adamw", "muon"),
        help="muon: Muon for the blocks' matrices, AdamW for the rest (minilm.training.optim)",
    )
    muon_lr_scale: float = option(
        1.0, role=TRAJECTORY, help="with muon: Muon's rate is this times the schedule's", valid=Range(0, low_open=True)
    )
    muon_split_qkv: bool = option(False, role=TRAJECTORY, help="with muon: q, k and v orthogonalised apart")
    position_lr_scale: float = option(
        1.0,
        role=TRAJECTORY,
        help="the position scheme's parameters (never "
        "weight-decayed) take this times the schedule's rate, e.g. T5's bias table",
        valid=Range(0, low_open=True),
    )
    grad_clip: float = option(
        1.0, role=TRAJECTORY, help="clip the gradient norm to this (0 disables)", valid=Range(0, note=" (0 disables)")
    )
    retrieval_share: float = option(
        0.0, role=TRAJECTORY, help="share of sequences that are retrieval sequences (minilm.data.retrieval)"
    )
    retrieval_weight: float = option(
        0.0,
        role=TRAJECTORY,
        help="w > 0: retrieval rows keep their text's loss, each "
        "answer counting w tokens (0: answers only, rows weighted alike); 0 without a share",
        valid=Range(0, 1e4, text=RETRIEVAL_WEIGHT),
    )
    retrieval_queries: int = option(
        3,
        role=TRAJECTORY,
        help="queries of the needle in each retrieval training row (minilm.data.retrieval; a probe asks once)",
        valid=Range(1, 1000, integer=True),
    )
    retrieval_spread: bool = option(
        False,
        role=TRAJECTORY,
        help="the first query of a retrieval row at a distance drawn uniformly over the row, the others after it "
        "(false: all on random slots, so each answer can be copied from a query a few tokens back)",
    )
    eval_interval: int = option(250, help="steps between held-out evaluations", valid=Range(1, MAX_COUNT, integer=True))
    eval_iters: int = option(20, help="held-out batches per evaluation", valid=Range(1, MAX_COUNT, integer=True))
    log_interval: int = option(10, help="steps between metrics.jsonl lines", valid=Range(1, MAX_COUNT, integer=True))
    checkpoint_interval: int = option(
        500, help="steps between checkpoints (written atomically)", valid=Range(1, MAX_COUNT, integer=True)
    )
    dtype: str = option(
        "auto",
        role=TRAJECTORY,
        choices=("auto", "float32", "bfloat16", "float16"),
        help="auto: bf16 autocast where the hardware has fast bf16, else float32",
    )
    device: str = option("auto", choices=("auto", "cpu", "cuda", "mps"), help="or cuda:N; auto: cuda, mps, cpu")
    compile: Union[bool, str] = option(
        False,
        choices=(False, True, "auto"),
        help="torch.compile the training passes (on the CPU with a C++ compiler); auto: on a CPU where one "
        "is found, on runs of 1000 steps or more in bf16 or float16 autocast (float32: no faster compiled), "
        "not under FSDP",
    )
    parallel: str = option(
        "ddp",
        choices=("ddp", "fsdp"),
        help="under torchrun: ddp (a whole copy per process) or fsdp (FSDP2: weights, gradients "
        "and optimiser state sharded per block)",
    )
    checkpoint_format: str = option(
        "file",
        choices=("file", "sharded"),
        help="file: one ckpt.pt; sharded: ckpt.dcp/, each process writes its own shards "
        "(torch.distributed.checkpoint; 'minilm unshard' makes a file of it)",
    )
    activation_checkpointing: bool = option(
        False,
        help="keep only each block's input and recompute the block in the "
        "backward pass: less activation memory, more time per step",
    )
    init_from: Optional[str] = option(None, help="checkpoint file, out_dir or Hugging Face directory to start from")
    sample_tokens: int = option(
        200, help="tokens of the sample printed at the end (0 skips it)", valid=Range(0, MAX_COUNT, integer=True)
    )
    final_eval_tokens: int = option(
        1_000_000,
        help="validation tokens of the final evaluation (0: eval_iters batches)",
        valid=Range(0, MAX_COUNT, integer=True),
    )
    snapshot_steps: list = option(factory=list, help="also keep the weights at these steps: snapshots/step-N.pt")
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # minilm.model.lora; a resumed run keeps the checkpoint's
    loggers: list = option(
        factory=lambda: ["jsonl"],
        help="where metrics go, any of: jsonl (metrics.jsonl), csv (metrics.csv), tensorboard, wandb",
    )

    def __post_init__(self):
        check_fields(self, "train")
        if not isinstance(self.snapshot_steps, list) or any(
            isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.max_steps for n in self.snapshot_steps
        ):
            raise ConfigError(
                f"train.snapshot_steps={shown(self.snapshot_steps)} is invalid: expected a list of steps "
                f"between 1 and train.max_steps={self.max_steps}"
            )
        if (
            not isinstance(self.loggers, list)
            or len(set(map(str, self.loggers))) != len(self.loggers)
            or any(name not in LOGGERS for name in self.loggers)
        ):
            raise ConfigError(
                f"train.loggers={shown(self.loggers)} is invalid: expected a list of distinct names among "
                f"{', '.join(LOGGERS)}"
            )
        if not (0 <= self.retrieval_share < 1 or (self.retrieval_weight and self.retrieval_share == 1)):
            raise ConfigError(
                f"train.retrieval_share={self.retrieval_share} is invalid: expected a fraction from 0 "
                f"(none) to below 1 (to 1 with train.retrieval_weight > 0)"
            )
        if self.retrieval_weight and not self.retrieval_share > 0:
            raise ConfigError(f"train.retrieval_weight={self.retrieval_weight} is invalid: expected {RETRIEVAL_WEIGHT}")
        if self.parallel == "fsdp" and self.optimizer == "muon":
            raise ConfigError(
                "train.optimizer='muon' with train.parallel='fsdp' is refused: Muon orthogonalises whole "
                "matrices and FSDP holds a shard of each; use train.optimizer=adamw or train.parallel=ddp"
            )
        if self.lora.r and (
            not self.init_from
            or self.optimizer == "muon"
            or self.checkpoint_format == "sharded"
            or self.parallel == "fsdp"
        ):
            raise ConfigError(
                f"train.lora.r={self.lora.r} needs train.init_from (the base the adapters train on), "
                f"train.optimizer=adamw, train.checkpoint_format=file and train.parallel=ddp"
            )
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(
                f"train.lr={self.lr}, train.min_lr={self.min_lr} are invalid: expected 0 <= min_lr <= lr, lr > 0"
            )
        peak = self.lr * (max(1.0, self.muon_lr_scale) if self.optimizer == "muon" else 1.0)
        if peak * self.weight_decay >= 1:  # decoupled decay multiplies each weight by 1 - rate x decay
            raise ConfigError(
                f"train.weight_decay={self.weight_decay:g} is invalid with a peak rate of {peak:g}: each step "
                f"multiplies a weight by 1 - {peak:g} x {self.weight_decay:g} <= 0; expected weight_decay below "
                f"{1 / peak:.4g}"
            )


@dataclass
class Config:
    """A whole run: ``model``, ``data``, ``train``, where it writes (``out_dir``) and its seeds.
    ``load_config`` (``minilm.configfile``) builds one from a YAML file and overrides."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out_dir: str = option("out/run", help="where checkpoints, metrics.jsonl and samples go")
    seed: int = option(
        1337,
        help="fixes the initialisation (and the batches, unless data_seed is given)",
        valid=Range(0, 2**63 - 1, integer=True, text=SEEDS),
    )
    data_seed: Optional[int] = option(
        None,
        help="fixes the batches' order apart from the initialisation (null: seed)",
        valid=Range(0, 2**63 - 1, integer=True, optional=True, text=SEEDS),
    )

    def __post_init__(self):
        check_fields(self, "")

    @property
    def batch_seed(self) -> int:  # the seed of the batches' generator
        return self.seed if self.data_seed is None else self.data_seed

    def to_dict(self) -> dict:
        """The config as plain data; a head width of d_model / n_head is written as null (derived)."""
        out = dataclasses.asdict(self)
        m = out["model"]
        m["head_dim"] = None if m["head_dim"] * m["n_head"] == m["d_model"] else m["head_dim"]
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --------------------------------------------------------------------------- building


def _type_ok(value: Any, annotation) -> bool:
    """Check a YAML value against a dataclass field annotation (int, float, str, bool, dict, Optional)."""
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(typing) | {"Optional": Optional})  # noqa: S307 - our own annotations
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _type_name(annotation) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


@functools.cache
def _type_hints(cls) -> dict:
    """``cls``'s field annotations resolved (read once per class: resolving them compiles each one)."""
    return typing.get_type_hints(cls)


def from_dict(cls, data: Any, prefix: str = ""):
    """Build dataclass ``cls`` from a plain mapping, recursing into nested dataclasses."""
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {shown(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"unknown key '{prefix}{key}': {suggest(str(key), fields)}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = from_dict(hint, value, f"{prefix}{key}.")
            continue
        if not _type_ok(value, hint):
            raise ConfigError(f"{prefix}{key}={shown(value)} has the wrong type: expected {_type_name(hint)}")
        if hint is float or hint == Optional[float]:
            value = float(value) if value is not None else None
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"{prefix}{key}={shown(value)} is invalid: expected a finite number")
        kwargs[key] = onto_default(fields[key], value)
    return cls(**kwargs)


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (a new one where a factory makes it; ``dataclasses.MISSING`` where it has none)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def onto_default(f: dataclasses.Field, value: Any) -> Any:
    """``value`` for field ``f``, a partial mapping merged onto the field's default mapping: a position
    setting given without a ``kind`` is the default's kind with the given options on top
    (``model.position.scaling.type=yarn`` alone: rope with yarn), any other mapping takes the default's
    keys it leaves out. A whole setting (with its own kind), or a field whose default is no mapping, is
    taken as given."""
    default = default_of(f)
    if not isinstance(default, dict) or not isinstance(value, dict) or ("kind" in default and "kind" in value):
        return value
    return merged(default, value)


def merged(base: dict, top: dict) -> dict:
    """``top`` over ``base``, mappings merged key by key at every depth (a new dict)."""
    out = dict(base)
    for key, value in top.items():
        out[key] = merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def build_config(tree: dict) -> Config:
    """Validate a nested dict as a Config; the position settings are checked by the registry."""
    try:
        config = from_dict(Config, tree)
    except TypeError as exc:  # a dataclass got an argument it cannot take
        raise ConfigError(str(exc)) from None
    try:  # the size of a sentencepiece tokenizer to train; a data.tokenizer decides its own
        if config.data.tokenizer is None:
            check_vocab_size(config.data.vocab_size)
    except TokenizerError as exc:
        raise ConfigError(f"data.{exc}") from None
    try:  # with init_from, what the source decides (interpolated's factor, ...) is filled in later
        validate(config.model.position, config.model, reach=not config.train.init_from)
    except ValueError as exc:
        hint = partial_position_hint(tree) if "unknown option" in str(exc) else ""
        raise ConfigError(f"model.position: {exc}{hint}") from None
    model = config.model
    try:
        check_types(layer_types(model.layers, model.position, model.n_layer), model, reach=not config.train.init_from)
    except PositionError as exc:
        raise ConfigError(str(exc) if str(exc).startswith("model.layers") else f"model.layers: {exc}") from None
    return config


def partial_position_hint(tree: dict) -> str:
    """What to add to an unknown option's error for a position setting the tree gives without a kind
    (``onto_default`` made it the default's kind): that it is the default's, and how to name another."""
    given = tree.get("model", {}).get("position") if isinstance(tree.get("model"), dict) else None
    if not isinstance(given, dict) or "kind" in given:
        return ""
    default = ModelConfig().position["kind"]
    return f" (model.position without a kind is the default kind {default} with these options: set model.position.kind)"


def resolve_config(config: Config, tokenizer=None) -> Config:
    """The config a run uses; the one place where the vocabulary size is decided: ``model.vocab_size``
    (and ``data.vocab_size``) follow ``tokenizer`` when one is given (a prepared corpus, or the source of
    ``train.init_from``), else ``data.vocab_size``, the size of the tokenizer to train."""
    vocab = config.data.vocab_size if tokenizer is None else tokenizer.vocab_size
    if "model.vocab_size" in (getattr(config, "given", None) or ()) and config.model.vocab_size != vocab:
        raise ConfigError(
            f"model.vocab_size={config.model.vocab_size} is invalid: it follows the tokenizer ({vocab:,} "
            f"tokens); leave it out (data.vocab_size sets the size of a tokenizer to train)"
        )
    resolved = dataclasses.replace(
        config,
        data=dataclasses.replace(config.data, vocab_size=vocab),
        model=dataclasses.replace(config.model, vocab_size=vocab),
    )
    resolved.given, resolved.overridden = getattr(config, "given", None), getattr(config, "overridden", None)
    return resolved


def config_keys() -> list:
    """Every config key as ``(key, default as YAML, choices, help)``, in declaration order, from the
    dataclasses' fields: the one source of ``minilm train --help``'s list and the manual's reference."""
    keys = []
    for section, cls in (
        ("model", ModelConfig),
        ("data", DataConfig),
        ("train", TrainConfig),
        ("train.lora", LoRAConfig),
    ):
        keys += _section_keys(section, cls)
    return keys + _section_keys(None, Config)


def _section_keys(section, cls) -> list:
    keys = []
    for f in dataclasses.fields(cls):
        if f.name in ("model", "data", "train", "lora"):
            continue
        default = default_of(f)
        shown_default = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        key = f"{section}.{f.name}" if section else f.name
        keys.append((key, shown_default, spelled(f.metadata.get("choices", ())), f.metadata.get("help", "")))
    return keys
