"""``python -m minilm memory [CONFIG] [key=value ...]``: the memory of one training step per
process, for the config's model, under DDP and FSDP, with and without activation
checkpointing: weights, gradients, optimiser state, FSDP's gathered weights and activations,
counted from the shapes alone (``minilm.training.memory``; nothing is allocated)."""

from __future__ import annotations

import torch

from minilm.checkpoints.extension import scaled_length
from minilm.checkpoints.format import load, with_defaults
from minilm.cli import Parser, run_command
from minilm.common import MinilmError, markdown_table
from minilm.config import ConfigError, ModelConfig, resolve_config
from minilm.configfile import load_config, was_given
from minilm.data.corpus import configured_tokenizer
from minilm.hf.reading import is_hf_source, read_model_tree
from minilm.positions.layers import cache_slots, layer_types
from minilm.training.memory import ROWS, lora_counts, size_unit, step_memory

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def main(argv=None) -> int:
    parser = Parser(prog="minilm memory", description=__doc__.split("\n\n")[0].replace("``", "'"))
    parser.add_argument("config", nargs="?", default="rope.yaml", help="a config file (default: rope.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.block_size=1024")
    parser.add_argument("--ranks", type=int, default=8, help="processes the step is spread over (default: 8)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows of block_size tokens per process (default: the config's train.batch_size)",
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default="bfloat16",
        help="the compute dtype of weights and activations (default: bfloat16); the master weights, "
        "gradients and optimiser state are float32",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=None,
        help="also the KV cache of one sequence at this many tokens, per layer type (model.layers), "
        "beside the same model with every layer global (default: block_size)",
    )
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))


def run(args) -> int:
    if "=" in args.config:  # no config file, overrides only: they apply to the default
        args.overrides, args.config = [args.config, *args.overrides], "rope.yaml"
    config = load_config(args.config, args.overrides)
    if args.ranks < 1:
        raise ConfigError(f"--ranks {args.ranks} is invalid: expected a number of processes >= 1")
    if args.context is not None and args.context < 1:  # before anything is counted or printed
        raise ConfigError(f"--context {args.context} is invalid: expected a number of tokens >= 1")
    batch = args.batch_size if args.batch_size is not None else config.train.batch_size
    if batch < 1:
        raise ConfigError(f"--batch-size {batch} is invalid: expected rows per process >= 1")
    if not config.train.init_from:  # the vocabulary a run decides: data.tokenizer's, else data.vocab_size
        config = resolve_config(config, tokenizer=configured_tokenizer(config.data))
    model, source = counted_model(config)
    lora = config.train.lora
    rows = step_memory(model, batch, args.ranks, DTYPES[args.dtype], config.train.optimizer, lora=lora)
    unit, size = size_unit(max(r["total"] for r in rows))
    print(
        f"{args.config}: {model.n_layer} layers x d_model {model.d_model}, vocabulary {model.vocab_size:,}, "
        f"{batch} x {model.block_size} tokens per process, {args.ranks} processes, compute in {args.dtype}; "
        f"{unit} per process{source}"
    )
    print(
        markdown_table(
            ("parallel", "activation checkpointing", *ROWS, "total"),
            [
                (
                    r["parallel"],
                    "yes" if r["checkpointing"] else "no",
                    *(f"{r[k] / size:.2f}" for k in (*ROWS, "total")),
                )
                for r in rows
            ],
            align="ll" + "r" * 6,
        )
    )
    if lora.r:
        trained, frozen = lora_counts(model, lora)
        print(
            f"LoRA r={lora.r} on "
            f"{', '.join(lora.targets)}{' + ' + ', '.join(lora.also_train) if lora.also_train else ''}: "
            f"{trained:,} parameters trained (float32, with their gradients and AdamW's moments), {frozen:,} frozen "
            f"in {args.dtype}; ddp only (a LoRA run refuses fsdp)"
        )
    if config.train.optimizer == "muon":
        print("optimizer: Muon under ddp; fsdp refuses Muon, so its rows count AdamW")
    print_cache(model, args.context if args.context is not None else model.block_size, DTYPES[args.dtype])
    return 0


def print_cache(model: ModelConfig, context: int, dtype: torch.dtype) -> None:
    """The KV cache of one sequence of ``context`` tokens, by layer type: each layer keeps its window or
    chunk where that is shorter (``minilm.positions.layers.cache_slots``); float32 on the CPU for a
    bf16/fp16 model (``minilm.model.cache.cache_dtype``), counted here in ``dtype`` as on an accelerator."""
    types = layer_types(model.layers, model.position, model.n_layer)
    per_slot = 2 * (model.n_kv_head or model.n_head) * model.head_dim * dtype.itemsize  # a key and a value
    slots = cache_slots(types, context)
    rows = []
    for name in dict.fromkeys(t.name for t in types):
        held = [n for t, n in zip(types, slots) if t.name == name]
        rows.append((name, len(held), f"{held[0]:,}", f"{sum(held) * per_slot / 2**20:.2f}"))
    total, uniform = sum(slots) * per_slot, len(types) * context * per_slot
    print(f"KV cache of one sequence at a context of {context:,} tokens ({str(dtype).split('.')[-1]}), MiB:")
    print(markdown_table(("layer type", "layers", "key slots each", "MiB"), rows, align="lrrr"))
    print(
        f"total {total / 2**20:.2f} MiB against {uniform / 2**20:.2f} MiB with every layer global "
        f"({total / uniform:.3f} of it)"
    )


def counted_model(config) -> tuple:
    """(the model a run of ``config`` trains, how it was found): with ``train.init_from`` the source's
    architecture (a Hugging Face model's from config.json, no weights read; a minilm run's from its
    checkpoint) with the block_size and position keys the config sets, as ``train.init_from`` applies
    them (``minilm.training.source``); else the config's own. A source that cannot be read is an error."""
    path = config.train.init_from
    if not path:
        return config.model, ""
    try:
        tree = read_model_tree(path)[2] if is_hf_source(path) else with_defaults(load(path)["config"])["model"]
    except MinilmError as exc:
        raise ConfigError(
            f"train.init_from={path!r} cannot be read ({exc}); memory counts the model that run would train "
            f"(without train.init_from: the config's own)"
        ) from None
    scaled = scaled_length(config.model.position, tree) if was_given(config, "model.position") else None
    if was_given(config, "model.block_size"):
        tree["block_size"] = config.model.block_size
    elif scaled:
        tree["block_size"] = scaled
    if was_given(config, "model.position"):
        tree["position"] = {**tree["position"], **config.model.position}
    return ModelConfig(**tree), f" (the architecture of train.init_from={path})"
